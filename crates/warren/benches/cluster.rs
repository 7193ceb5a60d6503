//! Cluster mode's costs, measured in one run on this machine (issue 14). Not a test: it
//! asserts nothing, it prints.
//!
//! `cargo bench -p warren --bench cluster` (as root, for the runtimes; `-- --kills N`
//! changes the takeover rounds, default 10).
//!
//! 1. Warm exec p50 through a replica that does not own the runtime (forwarded over the
//!    node-to-node link) beside the same exec through the owner: the forwarding's cost.
//! 2. Takeover time after `kill -9` of the owner (its runtimes killed with it, as when a
//!    machine dies): from the kill to the first exec through another replica that
//!    succeeds, p50 and max over the rounds, beside the target of the node TTL + 2 s.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::latency::{ms, percentile, row};
use warren_test_support::{ClusterFiles, PostgresServer, TestServer};

const TTL_S: u64 = 3;
const KEY: &str = "bench-cluster-key-0123456789abcdef0123456789";

fn kills_from_args() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--kills")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(10)
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
    let kills = kills_from_args();
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
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
