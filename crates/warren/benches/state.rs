//! The state store's speed on SQLite and on PostgreSQL, measured in one run on this
//! machine (issue 13). Not a test: it asserts nothing, it prints.
//!
//! `cargo bench -p warren --bench state` (as root, for the API part's runtimes; `-- --ops N`
//! changes the operations per measurement, default 2000).
//!
//! 1. Store operations per second, straight on each store: claiming a new sandbox,
//!    starting and finishing a run, acquiring (and releasing) and renewing a guard; one
//!    caller at a time (latency-bound) and 16 at once (throughput). SQLite is a file with
//!    warren's settings (WAL, synchronous=NORMAL); PostgreSQL a cluster of its own with its
//!    durable defaults (fsync on, synchronous_commit on), over loopback TCP.
//! 2. The API's warm exec p50 with each store: `warren serve --backend local`, one command
//!    in a running runtime, through HTTP (each exec starts and finishes a run record).

use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_core::{RuntimeScope, SandboxId, Uid, Workdir};
use warren_store::{
    NewRun, NewSandbox, PostgresOptions, PostgresStore, RunKind, RunOutcome, SqliteStore,
    StateStore,
};
use warren_test_support::latency::{create_and_exec, row};
use warren_test_support::{PostgresServer, TestServer};

const CONCURRENCY: usize = 16;

fn claim(scope: &str) -> NewSandbox {
    NewSandbox::new(
        Uid::new("bench").unwrap(),
        RuntimeScope::new(scope).unwrap(),
        Workdir::new("projects/p").unwrap(),
        warren_core::BackendKind::Local,
    )
}

fn finished() -> RunOutcome {
    RunOutcome {
        exit_code: Some(0),
        duration_ms: 1,
        ..RunOutcome::default()
    }
}

#[derive(Clone, Copy)]
enum Op {
    Claim,
    Run,
    GuardAcquire,
    GuardRenew,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Claim => "claim a new sandbox",
            Op::Run => "start + finish a run",
            Op::GuardAcquire => "guard acquire + release",
            Op::GuardRenew => "guard renew",
        }
    }
}

/// Runs `ops` operations of one kind from `callers` concurrent tasks; operations per second.
async fn measure(
    store: Arc<dyn StateStore>,
    op: Op,
    ops: usize,
    callers: usize,
    round: &str,
) -> f64 {
    // One sandbox per caller for the run and guard operations.
    let mut sandboxes = Vec::new();
    for caller in 0..callers {
        let new = claim(&format!("{round}-base-{caller}"));
        store.claim_sandbox(&new).await.unwrap();
        sandboxes.push(new.id);
    }
    let per_caller = ops / callers;
    let started = Instant::now();
    let tasks: Vec<_> = sandboxes
        .into_iter()
        .enumerate()
        .map(|(caller, sandbox): (usize, SandboxId)| {
            let store = Arc::clone(&store);
            let round = round.to_owned();
            tokio::spawn(async move {
                let ttl = Duration::from_secs(60);
                let guard = match op {
                    Op::GuardRenew => match store.acquire_guard(&sandbox, "bench", ttl).await {
                        Ok(warren_store::GuardAcquire::Acquired(guard)) => Some(guard.token),
                        other => panic!("{other:?}"),
                    },
                    _ => None,
                };
                for i in 0..per_caller {
                    match op {
                        Op::Claim => {
                            store
                                .claim_sandbox(&claim(&format!("{round}-{caller}-{i}")))
                                .await
                                .unwrap();
                        }
                        Op::Run => {
                            let id = format!("run-{round}-{caller}-{i}");
                            store
                                .start_run(&NewRun {
                                    id: id.clone(),
                                    sandbox_id: sandbox.clone(),
                                    generation: 1,
                                    command: "[\"true\"]".to_owned(),
                                    cwd: "/home/gem".to_owned(),
                                    requested_by: "bench".to_owned(),
                                    kind: RunKind::Exec,
                                    tag: None,
                                    pty: false,
                                    owner: None,
                                })
                                .await
                                .unwrap();
                            store.finish_run(&id, &finished()).await.unwrap();
                        }
                        Op::GuardAcquire => {
                            let warren_store::GuardAcquire::Acquired(guard) =
                                store.acquire_guard(&sandbox, "bench", ttl).await.unwrap()
                            else {
                                panic!("the guard is held");
                            };
                            store.release_guard(&sandbox, guard.token).await.unwrap();
                        }
                        Op::GuardRenew => {
                            store
                                .renew_guard(&sandbox, guard.unwrap(), Some(ttl))
                                .await
                                .unwrap()
                                .expect("a live guard renews");
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (per_caller * callers) as f64 / started.elapsed().as_secs_f64()
}

fn ops_from_args() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--ops")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000)
}

fn main() {
    let ops = ops_from_args();
    let postgres = PostgresServer::start_durable();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    println!("state store operations per second ({ops} per measurement; this machine, one run)");
    println!(
        "{:<28} {:>8} {:>14} {:>14} {:>8}",
        "operation", "callers", "sqlite", "postgres", "pg/sqlite"
    );
    runtime.block_on(async {
        let sqlite: Arc<dyn StateStore> = Arc::new(
            SqliteStore::open(&dir.path().join("state.db"))
                .await
                .unwrap(),
        );
        let pg: Arc<dyn StateStore> = Arc::new(
            PostgresStore::connect(
                &postgres.fresh_database(),
                &PostgresOptions {
                    max_connections: CONCURRENCY as u32,
                },
            )
            .await
            .unwrap(),
        );
        let mut round = 0;
        for op in [Op::Claim, Op::Run, Op::GuardAcquire, Op::GuardRenew] {
            for callers in [1, CONCURRENCY] {
                round += 1;
                let name = format!("r{round}");
                let a = measure(Arc::clone(&sqlite), op, ops, callers, &name).await;
                let b = measure(Arc::clone(&pg), op, ops, callers, &name).await;
                println!(
                    "{:<28} {:>8} {:>12.0}/s {:>12.0}/s {:>7.2}x",
                    op.name(),
                    callers,
                    a,
                    b,
                    b / a
                );
            }
        }
    });

    // The API's warm exec with each store.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_warren"));
    let url = postgres.fresh_database();
    let (mut on_sqlite, mut on_pg) = runtime.block_on(async {
        let sqlite = TestServer::start_with(bin, &["--backend", "local"]);
        sqlite.workdir("bench", "projects/p").await;
        let (_, warm_sqlite) = create_and_exec(&sqlite, 0, 300).await;
        drop(sqlite);
        let pg = TestServer::start_with(bin, &["--backend", "local", "--state", &url]);
        pg.workdir("bench", "projects/p").await;
        let (_, warm_pg) = create_and_exec(&pg, 0, 300).await;
        (warm_sqlite, warm_pg)
    });
    println!();
    row(
        "warm exec through the API, postgres",
        &mut on_pg,
        &mut on_sqlite,
        "on sqlite",
    );
}
