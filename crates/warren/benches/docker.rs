//! The Docker backend's speed, measured in one run beside raw `docker run` / `docker exec`
//! on the same image and beside the local backend. Not a test: it asserts nothing, it prints.
//!
//! Run as root with dockerd running and the test image built (`scripts/docker-test-image`):
//! `cargo bench -p warren --bench docker` (`-- --iterations N`, default 30).
//!
//! Target (issue 6): warm exec through the API p50 ≤ 10 ms on the Docker backend.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::latency::row;
use warren_test_support::{require_docker, TestServer, DOCKER_TEST_IMAGE};

/// Create-and-first-exec and warm exec through the API of `server`.
async fn measure(server: &TestServer, iterations: usize) -> (Vec<Duration>, Vec<Duration>) {
    let mut create = Vec::new();
    let mut ids = Vec::new();
    let warm_up = 3;
    for i in 0..iterations + warm_up {
        let started = Instant::now();
        let (status, body) = server
            .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                "uid": "bench", "runtime_scope_id": format!("cold-{i}"), "workdir": "projects/p"
            })))
            .await;
        assert_eq!(status, 201, "{body}");
        let id = body["sandbox_id"].as_str().unwrap().to_owned();
        let result = server.exec_with(&id, json!({"argv": ["true"]})).await;
        assert_eq!(result["exit_code"], 0, "{result}");
        if i >= warm_up {
            create.push(started.elapsed());
        }
        ids.push(id);
    }
    let id = ids.pop().unwrap();
    for other in ids {
        server.terminate(&other).await;
    }
    let mut warm = Vec::new();
    for i in 0..iterations * 10 + warm_up {
        let started = Instant::now();
        let result = server.exec_with(&id, json!({"argv": ["true"]})).await;
        assert_eq!(result["exit_code"], 0, "{result}");
        if i >= warm_up {
            warm.push(started.elapsed());
        }
    }
    (create, warm)
}

fn timed(args: &[&str]) -> Duration {
    let started = Instant::now();
    let status = Command::new("docker")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "docker {args:?} failed");
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let iterations: usize = std::env::args()
        .skip_while(|a| a != "--iterations")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    let engine = warren_test_support::docker(&["version", "--format", "{{.Server.Version}}"]);
    println!(
        "warren Docker backend vs raw docker and the local backend (Docker {engine}, image {DOCKER_TEST_IMAGE}, {iterations} cold / {} warm iterations)\n",
        iterations * 10
    );

    let docker_server = TestServer::start_docker(bin);
    docker_server.workdir("bench", "projects/p").await;
    let (mut docker_create, mut docker_warm) = measure(&docker_server, iterations).await;
    drop(docker_server);

    let local_server = TestServer::start_local(bin);
    local_server.workdir("bench", "projects/p").await;
    let (mut local_create, mut local_warm) = measure(&local_server, iterations).await;
    drop(local_server);

    // The anchors, on the same image, with the docker client as operators use it.
    let mut raw_run = Vec::new();
    for _ in 0..iterations {
        raw_run.push(timed(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "1000:1000",
            DOCKER_TEST_IMAGE,
            "true",
        ]));
    }
    let name = format!("warren-bench-{}", std::process::id());
    timed(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "none",
        "--user",
        "1000:1000",
        DOCKER_TEST_IMAGE,
        "sleep",
        "infinity",
    ]);
    let mut raw_exec = Vec::new();
    for _ in 0..iterations * 3 {
        raw_exec.push(timed(&["exec", &name, "true"]));
    }
    warren_test_support::docker(&["rm", "-f", &name]);

    row(
        "docker backend: create + first exec",
        &mut docker_create,
        &mut raw_run,
        "docker run --rm",
    );
    row(
        "docker backend: warm exec (API)",
        &mut docker_warm,
        &mut raw_exec,
        "docker exec",
    );
    row(
        "docker backend: create + first exec",
        &mut docker_create,
        &mut local_create,
        "local backend",
    );
    row(
        "docker backend: warm exec (API)",
        &mut docker_warm,
        &mut local_warm,
        "local backend",
    );
}
