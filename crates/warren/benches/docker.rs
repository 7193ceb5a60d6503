//! The Docker backend's speed, measured in one run beside raw `docker run` / `docker exec`
//! on the same image and beside the local backend. Not a test: it asserts nothing, it prints.
//!
//! Run as root with dockerd running and the test image built (`scripts/docker-test-image`):
//! `cargo bench -p warren --bench docker` (`-- --iterations N`, default 30).
//!
//! Target (issue 6): warm exec through the API p50 ≤ 10 ms on the Docker backend.

use std::path::Path;

use warren_test_support::latency::{create_and_exec, row, sleeping_container, timed_docker};
use warren_test_support::{require_docker, TestServer, DOCKER_TEST_IMAGE};

#[tokio::main]
async fn main() {
    let iterations: usize = warren_test_support::latency::iterations(30);
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    let engine = warren_test_support::docker(&["version", "--format", "{{.Server.Version}}"]);
    println!(
        "warren Docker backend vs raw docker and the local backend (Docker {engine}, image {DOCKER_TEST_IMAGE}, {iterations} cold / {} warm iterations)\n",
        iterations * 10
    );

    let docker_server = TestServer::start_docker(bin);
    docker_server.workdir("bench", "projects/p").await;
    let (mut docker_create, mut docker_warm) =
        create_and_exec(&docker_server, iterations, iterations * 10).await;
    drop(docker_server);

    let local_server = TestServer::start_local(bin);
    local_server.workdir("bench", "projects/p").await;
    let (mut local_create, mut local_warm) =
        create_and_exec(&local_server, iterations, iterations * 10).await;
    drop(local_server);

    // The anchors, on the same image, with the docker client as operators use it.
    let mut raw_run = Vec::new();
    for _ in 0..iterations {
        raw_run.push(timed_docker(&[
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
    sleeping_container(&name);
    let mut raw_exec = Vec::new();
    for _ in 0..iterations * 3 {
        raw_exec.push(timed_docker(&["exec", &name, "true"]));
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
