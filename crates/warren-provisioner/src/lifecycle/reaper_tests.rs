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

/// A listing of a runtime path that must not start the runtime (a watch's), asked now.
async fn refused_listing(
    provisioner: &crate::Provisioner,
    id: &SandboxId,
) -> Result<(), crate::ProvisionerError> {
    let record = provisioner.sandbox(id).await.unwrap();
    let path = provisioner
        .roots_of(&record)
        .await
        .unwrap()
        .resolve_anywhere("/tmp")
        .unwrap();
    let op = warren_backend::FileOp::List {
        path: "/tmp".into(),
        depth: 1,
        limit: 10,
    };
    provisioner
        .listed_in_runtime(id, path, op, crate::files::IfStopped::Refuse)
        .await
        .map(drop)
}

fn cut_off(id: &SandboxId) -> BackendError {
    BackendError::Exec {
        sandbox: id.clone(),
        source: std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the runtime ended the file operation without an answer",
        ),
    }
}

#[tokio::test]
async fn a_watch_listing_cut_off_by_the_reaper_ends_with_runtime_stopped() {
    let (f, id) = running().await;
    let mut stop = f.backend.block_next(Op::Destroy);
    let reap = {
        let provisioner = f.provisioner.clone();
        tokio::spawn(async move { provisioner.reap().await })
    };
    stop.reached().await;
    // The reaper is stopping the runtime: the listing in flight loses its answer.
    f.backend.fail_next(Op::File, cut_off(&id));
    let listing = {
        let (provisioner, id) = (f.provisioner.clone(), id.clone());
        tokio::spawn(async move { refused_listing(&provisioner, &id).await })
    };
    while f.backend.count(Op::File) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.release();
    let err = listing.await.unwrap().unwrap_err();
    assert!(
        matches!(err, crate::ProvisionerError::RuntimeStopped { .. }),
        "{err:?}"
    );
    reap.await.unwrap().unwrap();
    assert_eq!(state(&f, &id).await, SandboxState::Stopped);
}

#[tokio::test]
async fn a_failed_listing_of_a_runtime_that_still_runs_is_the_backends_error() {
    let (f, id) = running().await;
    f.backend.fail_next(Op::File, cut_off(&id));
    let err = refused_listing(&f.provisioner, &id).await.unwrap_err();
    assert!(
        matches!(
            err,
            crate::ProvisionerError::Backend(BackendError::Exec { .. })
        ),
        "{err:?}"
    );
    assert_eq!(state(&f, &id).await, SandboxState::Running);
}
