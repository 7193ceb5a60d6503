//! Twenty processes, each with its own pool, race to claim one identity on one PostgreSQL
//! database: exactly one sandbox is created (issue 13: atomic under several processes, not
//! only several tasks).
//!
//! A test binary without libtest: run plainly, it starts a PostgreSQL server, spawns
//! itself twenty times as workers (`worker <url>`), releases them at once and checks what
//! they answered and what the database holds.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use warren_core::{RuntimeScope, Uid, Workdir};
use warren_store::{NewSandbox, PostgresOptions, PostgresStore, SandboxClaim, StateStore};
use warren_test_support::PostgresServer;

const PROCESSES: usize = 20;
const CLAIMS_PER_PROCESS: usize = 8;

fn identity() -> NewSandbox {
    NewSandbox::new(
        Uid::new("alice").unwrap(),
        RuntimeScope::new("shared-thread").unwrap(),
        Workdir::new("projects/a").unwrap(),
        warren_core::BackendKind::Local,
    )
}

/// A worker: connects, says `ready`, waits for `go`, claims in parallel, prints one line
/// per answer (`created <generation>` or `existing <generation>`).
fn worker(url: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = PostgresStore::connect(url, &PostgresOptions::default())
            .await
            .expect("worker connects");
        println!("ready");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let claims: Vec<_> = (0..CLAIMS_PER_PROCESS)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { store.claim_sandbox(&identity()).await })
            })
            .collect();
        for claim in claims {
            match claim.await.unwrap().expect("claim") {
                SandboxClaim::Created(record) => println!("created {}", record.generation),
                SandboxClaim::Existing(record) => println!("existing {}", record.generation),
                other => println!("conflict {other:?}"),
            }
        }
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2]);
    }
    // libtest-style filters (`cargo test -p warren-store some_name`) that do not name
    // this binary's one check skip it, like any unmatched test.
    let name = "twenty_processes_claiming_one_identity_create_exactly_one_sandbox";
    if let Some(filter) = args.iter().skip(1).find(|arg| !arg.starts_with('-')) {
        if !name.contains(filter.as_str()) {
            println!("running 0 tests (filter {filter:?})");
            return;
        }
    }
    println!("running 1 test\ntest {name} ...");

    let server = PostgresServer::start();
    let url = server.fresh_database();
    let exe = std::env::current_exe().unwrap();
    let mut workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args(["worker", &url])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut outputs: Vec<_> = workers
        .iter_mut()
        .map(|worker| BufReader::new(worker.stdout.take().unwrap()))
        .collect();
    for output in &mut outputs {
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "a worker failed to connect");
    }
    // Every worker is connected and waiting: release them together.
    for worker in &mut workers {
        writeln!(worker.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let mut answers = Vec::new();
    for (worker, output) in workers.iter_mut().zip(outputs) {
        answers.extend(output.lines().map(Result::unwrap));
        assert!(worker.wait().unwrap().success(), "a worker failed");
    }

    assert_eq!(answers.len(), PROCESSES * CLAIMS_PER_PROCESS);
    let created = answers.iter().filter(|a| a.starts_with("created")).count();
    let existing = answers.iter().filter(|a| *a == "existing 1").count();
    assert_eq!(created, 1, "exactly one claim creates: {answers:?}");
    assert_eq!(existing, answers.len() - 1, "{answers:?}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sandboxes = runtime.block_on(async {
        let store = PostgresStore::connect(&url, &PostgresOptions::default())
            .await
            .unwrap();
        store.list_sandboxes(None).await.unwrap()
    });
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].generation, 1);
    println!("test {name} ... ok\n\ntest result: ok. 1 passed; 0 failed");
}
