//! Starting a runtime on the first exec (I12), over the scripted backend: a start that
//! fails, concurrent first execs, and a runtime that vanished.

use warren_backend::BackendError;
use warren_store::SandboxState;

use crate::testing::{shell, Call, Fixture, Op};
use crate::ProvisionerError;

fn sh(line: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), line.into()]
}

#[tokio::test]
async fn a_runtime_start_that_fails_leaves_the_sandbox_not_running_and_the_next_exec_starts_it() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let id = f.sandbox("alice", "t", "projects/a").await.id;
    f.backend.fail_next(
        Op::Create,
        BackendError::Create {
            sandbox: id.clone(),
            source: std::io::Error::other("no room on the host"),
        },
    );

    let failed = f.provisioner.exec(&id, shell("true"), None).await;
    assert!(
        matches!(
            failed,
            Err(ProvisionerError::Backend(BackendError::Create { .. }))
        ),
        "{failed:?}"
    );
    assert_eq!(
        f.provisioner.sandbox(&id).await.unwrap().state,
        SandboxState::Created
    );
    assert_eq!(f.backend.runtime_of(&id).await, None);

    let report = f.provisioner.exec(&id, shell("true"), None).await.unwrap();
    assert_eq!(report.outcome.exit_code, Some(0));
    assert_eq!(
        f.provisioner.sandbox(&id).await.unwrap().state,
        SandboxState::Running
    );
    assert_eq!(
        f.backend.calls(),
        [
            Call::Create(id.clone()),
            Call::Create(id.clone()),
            Call::Exec(id.clone(), sh("true")),
        ]
    );
}

#[tokio::test]
async fn concurrent_first_execs_start_one_runtime() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let id = f.sandbox("alice", "t", "projects/a").await.id;
    let mut start = f.backend.block_next(Op::Create);
    let execs: Vec<_> = (0..2)
        .map(|_| {
            let (provisioner, id) = (f.provisioner.clone(), id.clone());
            tokio::spawn(async move { provisioner.exec(&id, shell("true"), None).await })
        })
        .collect();
    start.reached().await;
    start.release();
    for exec in execs {
        assert_eq!(exec.await.unwrap().unwrap().outcome.exit_code, Some(0));
    }
    assert_eq!(f.backend.count(Op::Create), 1);
    assert_eq!(f.backend.count(Op::Exec), 2);
}

#[tokio::test]
async fn a_runtime_that_vanished_is_replaced_and_the_command_runs_in_the_new_one() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let id = f.sandbox("alice", "t", "projects/a").await.id;
    f.provisioner.exec(&id, shell("true"), None).await.unwrap();

    f.backend.lose_runtime(&id).await;
    let report = f.provisioner.exec(&id, shell("date"), None).await.unwrap();
    assert_eq!(report.outcome.exit_code, Some(0));
    assert_eq!(
        f.backend.calls(),
        [
            Call::Create(id.clone()),
            Call::Exec(id.clone(), sh("true")),
            Call::Exec(id.clone(), sh("date")),
            Call::Create(id.clone()),
            Call::Exec(id.clone(), sh("date")),
        ]
    );
    assert!(f.backend.runtime_of(&id).await.is_some());
    assert_eq!(
        f.provisioner.sandbox(&id).await.unwrap().state,
        SandboxState::Running
    );
}
