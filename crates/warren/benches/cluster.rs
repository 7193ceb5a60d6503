//! Cluster mode's costs, measured in one run on this machine (issue 14). Not a test: it
//! asserts nothing, it prints.
//!
//! `cargo bench -p warren --bench cluster` (as root, for the runtimes; `-- --kills N`
//! changes the takeover rounds, default 10; `-- --snapshots-only` prints rows 3 and 4
//! alone).
//!
//! 1. Warm exec p50 through a replica that does not own the runtime (forwarded over the
//!    node-to-node link) beside the same exec through the owner: the forwarding's cost.
//!    Then a keystroke's round trip through a process's terminal (`/v1` WebSocket attach,
//!    byte in, echo out) attached through the non-owner beside through the owner: each
//!    keystroke crosses the link as a streamed stdin, its echo as the forwarded follow.
//! 2. Takeover time after `kill -9` of the owner (its runtimes killed with it, as when a
//!    machine dies): from the kill to the first exec through another replica that
//!    succeeds, p50 and max over the rounds, beside the target of the node TTL + 2 s.
//! 3. A full snapshot of a generated workspace (`--snapshot-mib`, default 1024) into the
//!    local store beside `tar | zstd -1` of the same tree (target: at most 1.25x).
//! 4. A resume's restore of a generated environment (`--resume-mib`, default 200) from
//!    an S3 server (a real `s3s-fs` on loopback), the way another node resumes a sandbox,
//!    beside one GET of an object as large as everything the restore read, through the
//!    same client from the same server (target: at most 1.5x). Median of three each.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_fs::WorkspaceRoot;
use warren_snapshot::{LocalStore, ObjectStore, S3Config, S3Store, SnapshotLimits};
use warren_test_support::latency::{ms, percentile, row, terminal_keystrokes};
use warren_test_support::workload::{generate_workspace, sh, tar_zstd, Noise};
use warren_test_support::{ClusterFiles, PostgresServer, S3Server, TestServer};

const TTL_S: u64 = 3;
const KEY: &str = "bench-cluster-key-0123456789abcdef0123456789";

/// The number after `flag` on the command line, or `default`.
fn arg(flag: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

async fn warm_execs(server: &TestServer, sandbox: &str, count: usize) -> Vec<Duration> {
    let mut times = Vec::new();
    for i in 0..count + 5 {
        let started = Instant::now();
        let result = server.exec_with(sandbox, json!({"argv": ["true"]})).await;
        assert_eq!(result["exit_code"], 0, "{result}");
        if i >= 5 {
            times.push(started.elapsed());
        }
    }
    times
}

async fn exec_status(server: &TestServer, sandbox: &str) -> u16 {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
                .json(&json!({"argv": ["true"]})),
        )
        .await
        .0
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if !std::env::args().any(|a| a == "--snapshots-only") {
        replicas_rows(&runtime);
    }
    full_snapshot_row(arg("--snapshot-mib", 1024));
    resume_from_s3_row(arg("--resume-mib", 200), &runtime);
}

/// Rows 1 and 2: two replicas on PostgreSQL.
fn replicas_rows(runtime: &tokio::runtime::Runtime) {
    let kills = arg("--kills", 10) as usize;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_warren"));
    let postgres = PostgresServer::start();
    let database = postgres.fresh_database();
    let shared = tempfile::tempdir().unwrap();
    let files = ClusterFiles::new(KEY, TTL_S);
    let start = |node: usize| {
        TestServer::start_with(
            bin,
            &[
                "--backend",
                "local",
                "--state",
                &database,
                "--workspace-dir",
                shared.path().to_str().unwrap(),
                "--node-id",
                &format!("bench-{node}"),
                "--config",
                files.config_arg(),
            ],
        )
    };
    let mut nodes = [start(0), start(1)];
    println!("cluster mode on this machine: two replicas, PostgreSQL, one shared directory, node TTL {TTL_S} s");
    let (mut forwarded, mut direct) = runtime.block_on(async {
        nodes[0].workdir("bench", "projects/p").await;
        let sandbox = nodes[0].sandbox("bench", "warm", "projects/p").await;
        let _ = warm_execs(&nodes[0], &sandbox, 1).await;
        let direct = warm_execs(&nodes[0], &sandbox, 300).await;
        let forwarded = warm_execs(&nodes[1], &sandbox, 300).await;
        (forwarded, direct)
    });
    row(
        "warm exec through a non-owner replica",
        &mut forwarded,
        &mut direct,
        "through the owner",
    );
    println!(
        "  forwarding adds {} at p50 (target: at most 1 ms)",
        ms(percentile(&mut forwarded, 0.5).saturating_sub(percentile(&mut direct, 0.5)))
    );
    let (mut keys_forwarded, mut keys_direct) = runtime.block_on(async {
        let direct = terminal_keystrokes(&nodes[0], &nodes[0], 300).await;
        let forwarded = terminal_keystrokes(&nodes[0], &nodes[1], 300).await;
        (forwarded, direct)
    });
    row(
        "a keystroke's echo, attached through a non-owner",
        &mut keys_forwarded,
        &mut keys_direct,
        "attached through the owner",
    );

    let mut takeovers = Vec::new();
    for round in 0..kills {
        let (owner, other) = (round % 2, (round + 1) % 2);
        let elapsed = runtime.block_on(async {
            let sandbox = nodes[owner]
                .sandbox("bench", &format!("takeover-{round}"), "projects/p")
                .await;
            assert_eq!(exec_status(&nodes[owner], &sandbox).await, 200);
            nodes[owner].kill();
            warren_test_support::reap_runtimes(&nodes[owner].data_dir());
            let killed = Instant::now();
            while exec_status(&nodes[other], &sandbox).await != 200 {
                assert!(killed.elapsed() < Duration::from_secs(60), "no takeover");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            killed.elapsed()
        });
        takeovers.push(elapsed);
        nodes[owner].start_again();
    }
    let target = Duration::from_secs(TTL_S + 2);
    let max = takeovers.iter().max().copied().unwrap_or_default();
    println!(
        "{:<40} p50 {:>10}  max {:>10}   target (TTL + 2 s)     {:>10}   ratio max {:.2}x  ({} kills)",
        "takeover after kill -9 of the owner",
        ms(percentile(&mut takeovers, 0.5)),
        ms(max),
        ms(target),
        max.as_secs_f64() / target.as_secs_f64(),
        kills
    );
}

/// Row 3: a full snapshot into the local store beside `tar | zstd -1`, median of three
/// rounds each (this machine's disk times writes very unevenly).
fn full_snapshot_row(size_mib: u64) {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let tree = root.join("w");
    std::fs::create_dir_all(&tree).unwrap();
    let files = generate_workspace(&tree, size_mib << 20);
    let (store_dir, archive) = (work.path().join("store"), work.path().join("full.tar.zst"));
    let (mut ours, mut anchor, mut stored) = (Vec::new(), Vec::new(), 0);
    for _ in 0..3 {
        let _ = std::fs::remove_dir_all(&store_dir);
        let _ = std::fs::remove_file(&archive);
        sh("sync");
        anchor.push(tar_zstd(&tree, &archive));
        let store = LocalStore::open(&store_dir).unwrap();
        let started = Instant::now();
        let (_, stats) =
            warren_snapshot::snapshot(&WorkspaceRoot::open(&root).unwrap(), "w", &store, None)
                .unwrap();
        ours.push(started.elapsed());
        stored = stats.bytes_stored;
    }
    let (ours, anchor) = (median(ours), median(anchor));
    println!(
        "{:<40} warren {:>10}  tar|zstd -1 {:>10}   ratio {:.2}x  (target 1.25x; {} files, {size_mib} MiB, {} MiB stored)",
        "full snapshot (local store)",
        ms(ours),
        ms(anchor),
        ours.as_secs_f64() / anchor.as_secs_f64(),
        files.len(),
        stored >> 20,
    );
}

fn median(mut times: Vec<Duration>) -> Duration {
    percentile(&mut times, 0.5)
}

/// Row 4: a resume's restore from S3 beside one GET of as many bytes.
fn resume_from_s3_row(size_mib: u64, runtime: &tokio::runtime::Runtime) {
    let server = S3Server::start();
    let config = S3Config {
        endpoint: server.endpoint.clone(),
        bucket: server.bucket.clone(),
        region: "us-east-1".into(),
        access_key_id: server.access_key.clone(),
        secret_access_key: server.secret_key.clone(),
    };
    let store = S3Store::open(&config, "snapshots/bench", runtime.handle().clone()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("source");
    std::fs::create_dir_all(source.join("env")).unwrap();
    let files = generate_workspace(&source.join("env"), size_mib << 20);
    let (manifest, _) =
        warren_snapshot::snapshot(&WorkspaceRoot::open(&source).unwrap(), "env", &store, None)
            .unwrap();
    // Everything a restore reads: the manifest, the index and the packs.
    let stored: u64 = ["manifests/", "indexes/", "packs/"]
        .iter()
        .flat_map(|kind| store.list(kind).unwrap())
        .map(|key| store.get(&key).unwrap().unwrap().len() as u64)
        .sum();
    let mut restores = Vec::new();
    for round in 0..3 {
        let target = work.path().join(format!("seed-{round}"));
        std::fs::create_dir_all(&target).unwrap();
        let root = WorkspaceRoot::open(&target).unwrap();
        let started = Instant::now();
        warren_snapshot::restore_transient_with(
            &root,
            "env",
            &store,
            &manifest,
            &SnapshotLimits::default(),
        )
        .unwrap();
        restores.push(started.elapsed());
        std::fs::remove_dir_all(&target).unwrap();
    }
    let mut blob = vec![0u8; stored as usize];
    Noise(0x5eed).fill(&mut blob);
    let key = format!("packs/{}", "0f".repeat(32));
    store.put(&key, &blob).unwrap();
    let mut gets = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let bytes = store.get(&key).unwrap().unwrap();
        gets.push(started.elapsed());
        assert_eq!(bytes.len() as u64, stored);
    }
    let (ours, anchor) = (median(restores), median(gets));
    println!(
        "{:<40} warren {:>10}  one GET {:>10}       ratio {:.2}x  (target 1.5x; {} files, {size_mib} MiB, {} MiB read)",
        "resume's restore from S3 (s3s-fs)",
        ms(ours),
        ms(anchor),
        ours.as_secs_f64() / anchor.as_secs_f64(),
        files.len(),
        stored >> 20,
    );
}
