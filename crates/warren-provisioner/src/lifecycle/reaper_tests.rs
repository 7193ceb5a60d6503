//! The idle reaper over the scripted backend (I25): what keeps a runtime, and what a stop
//! the backend fails leaves for the next pass.

use std::time::Duration;

use warren_backend::BackendError;
use warren_core::SandboxId;
use warren_store::SandboxState;

use crate::testing::{shell, Fixture, Op};

/// A provisioner whose runtimes are idle as soon as nothing keeps them, with the running
/// runtime of one sandbox.
async fn running() -> (Fixture, SandboxId) {
    let f = Fixture::builder()
        .configure(|config| config.idle_timeout = Duration::ZERO)
        .build()
        .await;
    f.provisioner.join_cluster().await.unwrap();
    let id = f.sandbox("alice", "t", "projects/a").await.id;
    f.provisioner.start_runtime(&id).await.unwrap();
    (f, id)
}

async fn state(f: &Fixture, id: &SandboxId) -> SandboxState {
    f.provisioner.sandbox(id).await.unwrap().state
}

#[tokio::test]
async fn the_reaper_stops_an_idle_runtime_and_not_one_running_a_command() {
    let (f, id) = running().await;
    let mut command = f.backend.block_next(Op::Exec);
    let exec = {
        let (provisioner, id) = (f.provisioner.clone(), id.clone());
        tokio::spawn(async move { provisioner.exec(&id, shell("sleep 1"), None).await })
    };
    command.reached().await;
    let report = f.provisioner.reap().await.unwrap();
    assert!(report.idle.is_empty(), "{report:?}");
    assert_eq!(f.backend.count(Op::Destroy), 0);
    assert_eq!(state(&f, &id).await, SandboxState::Running);

    command.release();
    exec.await.unwrap().unwrap();
    let report = f.provisioner.reap().await.unwrap();
    assert_eq!(report.idle, vec![id.clone()]);
    assert_eq!(state(&f, &id).await, SandboxState::Stopped);
    assert_eq!(f.backend.runtime_of(&id).await, None);
}

#[tokio::test]
async fn a_runtime_whose_processes_still_run_is_not_idle() {
    let (f, id) = running().await;
    f.backend.set_processes(&id, 1);
    let report = f.provisioner.reap().await.unwrap();
    assert!(report.idle.is_empty(), "{report:?}");
    assert_eq!(state(&f, &id).await, SandboxState::Running);

    f.backend.set_processes(&id, 0);
    let report = f.provisioner.reap().await.unwrap();
    assert_eq!(report.idle, vec![id.clone()]);
}

#[tokio::test]
async fn a_runtime_the_backend_fails_to_stop_stays_running_for_the_next_pass() {
    let (f, id) = running().await;
    f.backend.fail_next(
        Op::Destroy,
        BackendError::Destroy {
            sandbox: id.clone(),
            source: std::io::Error::other("the engine is busy"),
        },
    );
    let report = f.provisioner.reap().await.unwrap();
    assert!(report.idle.is_empty(), "{report:?}");
    assert_eq!(state(&f, &id).await, SandboxState::Running);
    assert!(f.backend.runtime_of(&id).await.is_some());

    let report = f.provisioner.reap().await.unwrap();
    assert_eq!(report.idle, vec![id.clone()]);
    assert_eq!(state(&f, &id).await, SandboxState::Stopped);
    assert_eq!(f.backend.count(Op::Destroy), 2);
}
