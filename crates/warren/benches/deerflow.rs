//! DeerFlow's sandbox lifecycle on warren, measured in one run beside the shape DeerFlow
//! has without warren: a plain Docker container started per sandbox (the AIO shape), made
//! ready and given its first command with the docker client. Not a test: it asserts
//! nothing beyond each answer being right, it prints.
//!
//! Run as root with dockerd running and the test image built (`scripts/docker-test-image`):
//! `cargo bench -p warren --bench deerflow` (`-- --iterations N`, default 20; warm rows
//! use ten times as many commands).
//!
//! Each cold iteration is what DeerFlow's remote backend does for a new thread:
//! `POST /deerflow/api/sandboxes`, poll `GET {sandbox_url}/v1/sandbox` until 200, then
//! `POST {sandbox_url}/v1/shell/exec`. The warm row is `shell/exec` on one session.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use warren_test_support::latency::{row, sleeping_container, timed_docker};
use warren_test_support::{require_docker, TestServer, DOCKER_TEST_IMAGE};

const API_KEY: &str = "bench-deerflow-api-key-0123456789abcdef";

/// A warren server on `backend` with the DeerFlow API enabled.
fn start(bin: &Path, config: &Path, backend: &[&str]) -> TestServer {
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend_from_slice(backend);
    TestServer::start_with(bin, &args)
}

async fn post(http: &reqwest::Client, url: &str, body: Value) -> Value {
    let response = http
        .post(url)
        .header("X-API-Key", API_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{url}: {status} {body}");
    body
}

/// DeerFlow's create + readiness + first command for `iterations` new threads, and warm
/// `shell/exec` on one session of the last.
async fn deerflow_lifecycle(
    server: &TestServer,
    iterations: usize,
    warm: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let http = reqwest::Client::new();
    let mut cold = Vec::with_capacity(iterations);
    let mut last_url = String::new();
    for i in 0..iterations {
        let started = Instant::now();
        let created = post(
            &http,
            &format!("{}/deerflow/api/sandboxes", server.url),
            json!({"sandbox_id": format!("{i:08x}"), "thread_id": format!("thread-{i}"),
                   "user_id": "bench"}),
        )
        .await;
        let url = created["sandbox_url"].as_str().unwrap().to_owned();
        loop {
            let ready = http.get(format!("{url}/v1/sandbox")).send().await.unwrap();
            if ready.status() == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ran = post(
            &http,
            &format!("{url}/v1/shell/exec"),
            json!({"command": "echo hi"}),
        )
        .await;
        assert_eq!(ran["data"]["output"], "hi\n", "{ran}");
        cold.push(started.elapsed());
        last_url = url;
    }
    let session = post(
        &http,
        &format!("{last_url}/v1/shell/sessions/create"),
        json!({}),
    )
    .await;
    let id = session["data"]["session_id"].as_str().unwrap().to_owned();
    let mut warm_times = Vec::with_capacity(warm);
    for _ in 0..warm {
        let started = Instant::now();
        let ran = post(
            &http,
            &format!("{last_url}/v1/shell/exec"),
            json!({"command": "echo hi", "id": id}),
        )
        .await;
        warm_times.push(started.elapsed());
        assert_eq!(ran["data"]["output"], "hi\n", "{ran}");
    }
    (cold, warm_times)
}

#[tokio::main]
async fn main() {
    let iterations: usize = warren_test_support::latency::iterations(20);
    let warm = iterations * 10;
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("warren.toml");
    std::fs::write(&config, format!("[deerflow]\napi_key = \"{API_KEY}\"\n")).unwrap();
    let engine = warren_test_support::docker(&["version", "--format", "{{.Server.Version}}"]);
    println!(
        "DeerFlow's sandbox lifecycle on warren vs a plain Docker container per sandbox \
         (Docker {engine}, image {DOCKER_TEST_IMAGE}, {iterations} cold / {warm} warm)\n"
    );

    let local = start(bin, &config, &["--backend", "local"]);
    let (mut local_cold, mut local_warm) = deerflow_lifecycle(&local, iterations, warm).await;
    drop(local);
    let docker = start(
        bin,
        &config,
        &["--backend", "docker", "--image", DOCKER_TEST_IMAGE],
    );
    let (mut docker_cold, mut docker_warm) = deerflow_lifecycle(&docker, iterations, warm).await;
    drop(docker);

    // The anchor: the AIO shape without warren. A container per sandbox, ready when it
    // takes a command, then the first command, all with the docker client.
    let mut plain_cold = Vec::with_capacity(iterations);
    let name = |i: usize| format!("warren-bench-aio-{}-{i}", std::process::id());
    for i in 0..iterations {
        let started = Instant::now();
        sleeping_container(&name(i));
        timed_docker(&["exec", &name(i), "true"]);
        let output = Command::new("docker")
            .args(["exec", &name(i), "sh", "-c", "echo hi"])
            .output()
            .unwrap();
        assert_eq!(output.stdout, b"hi\n");
        plain_cold.push(started.elapsed());
    }
    let mut plain_warm = Vec::with_capacity(warm);
    for _ in 0..warm {
        plain_warm.push(timed_docker(&[
            "exec",
            &name(iterations - 1),
            "sh",
            "-c",
            "echo hi",
        ]));
    }
    for i in 0..iterations {
        warren_test_support::docker(&["rm", "-f", &name(i)]);
    }

    let anchor = "plain container";
    row(
        "local: create + ready + first shell/exec",
        &mut local_cold,
        &mut plain_cold,
        anchor,
    );
    row(
        "docker: create + ready + first shell/exec",
        &mut docker_cold,
        &mut plain_cold,
        anchor,
    );
    row(
        "local: warm shell/exec",
        &mut local_warm,
        &mut plain_warm,
        "docker exec",
    );
    row(
        "docker: warm shell/exec",
        &mut docker_warm,
        &mut plain_warm,
        "docker exec",
    );
}
