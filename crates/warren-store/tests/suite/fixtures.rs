//! Short constructors for the values the tests pass around.

use warren_core::{RuntimeScope, SandboxId, Uid, Workdir};
use warren_store::{
    NewMigration, NewMigrationItem, NewRun, NewSandbox, RunKind, RunOutcome, RunQuery, RunRecord,
    RunScope, StateStore,
};

pub fn uid(uid: &str) -> Uid {
    Uid::new(uid).expect("valid uid")
}

pub fn workdir(path: &str) -> Workdir {
    Workdir::new(path).expect("valid workdir")
}

/// A claim for the sandbox of `(uid, scope)` on `workdir`, run by the "bwrap" backend.
pub fn claim(uid_: &str, scope: &str, workdir_: &str) -> NewSandbox {
    NewSandbox::new(
        uid(uid_),
        RuntimeScope::new(scope).expect("valid scope"),
        workdir(workdir_),
        warren_core::BackendKind::Local,
    )
}

pub fn run(id: &str, sandbox: &SandboxId, generation: i64) -> NewRun {
    NewRun {
        id: id.to_owned(),
        sandbox_id: sandbox.clone(),
        generation,
        command: r#"["echo","hello"]"#.to_owned(),
        cwd: "/home/gem/user-data/projects/a".to_owned(),
        requested_by: "agent-1".to_owned(),
        kind: RunKind::Exec,
        tag: None,
        pty: false,
        owner: None,
    }
}

/// The newest `limit` runs of a sandbox (all generations), newest first: the first page of
/// its listing.
pub async fn runs_of(store: &dyn StateStore, sandbox: &SandboxId, limit: u32) -> Vec<RunRecord> {
    store
        .query_runs(&RunQuery::new(RunScope::Sandbox(sandbox.clone()), limit))
        .await
        .expect("list runs")
        .runs
}

/// A command that ran and exited with `exit_code`.
pub fn exited(exit_code: i32) -> RunOutcome {
    RunOutcome {
        exit_code: Some(exit_code),
        duration_ms: 12,
        cpu_user_ms: Some(3),
        cpu_system_ms: Some(1),
        peak_memory_bytes: Some(4 << 20),
        ..RunOutcome::default()
    }
}

/// Waits long enough for the millisecond clock the store records to move on.
pub async fn next_millisecond() {
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
}

/// A migration of the DeerFlow kind, planned with `digest`.
pub fn migration(id: &str, digest: &str) -> NewMigration {
    NewMigration {
        id: id.to_owned(),
        kind: "deerflow".to_owned(),
        source: "/srv/deerflow/.deer-flow".to_owned(),
        plan_digest: digest.to_owned(),
        plan: format!(r#"{{"digest":"{digest}","items":[]}}"#),
    }
}

/// A migration item moving `key` of the source to the workdir `key` of `uid`, if any.
pub fn migration_item(key: &str, uid_: Option<&str>) -> NewMigrationItem {
    NewMigrationItem {
        key: key.to_owned(),
        kind: "workdir".to_owned(),
        source: format!("threads/{key}"),
        uid: uid_.map(uid),
        target: format!("projects/{key}"),
    }
}
