//! Pause and resume through the API, and how late a deadline fires, measured in one run
//! beside their nearest Docker anchors. Not a test: it asserts nothing, it prints.
//!
//! warren's pause ends the runtime's processes and keeps its files and installed packages
//! (a runtime snapshot); the nearest Docker operation is `docker stop` + `docker start` of
//! a container (processes end, its filesystem stays). `docker pause`/`unpause` freezes
//! memory instead, which warren's pause does not keep: shown as the lower bound.
//!
//! Run as root with dockerd running and the test image built (`scripts/docker-test-image`):
//! `cargo bench -p warren --bench lifecycle` (`-- --iterations N`, default 20).

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::latency::{row, sleeping_container, timed_docker};
use warren_test_support::{require_docker, TestServer};

async fn post(server: &TestServer, path: &str) -> Duration {
    let started = Instant::now();
    let (status, body) = server.send_json(server.request(Method::POST, path)).await;
    assert_eq!(status, 200, "{path}: {body}");
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let iterations: usize = warren_test_support::latency::iterations(20);
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    println!("pause and resume, and deadlines ({iterations} iterations)\n");

    // warren, local backend: a runtime with a file in its home and a process running.
    let server = TestServer::start_local(bin);
    let id = server.sandbox("bench", "paused", "projects/p").await;
    server
        .exec(&id, "head -c 1048576 /dev/urandom > /home/gem/state.bin")
        .await;
    let (mut pauses, mut resumes, mut cycles) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        let (status, _) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/processes"))
                    .json(&json!({"command": "sleep 600"})),
            )
            .await;
        assert_eq!(status, 201);
        let pause = post(&server, &format!("/v1/sandboxes/{id}/pause")).await;
        let resume = post(&server, &format!("/v1/sandboxes/{id}/resume")).await;
        let first = Instant::now();
        let result = server
            .exec(&id, "test -s /home/gem/state.bin && echo kept")
            .await;
        assert_eq!(result["stdout"], "kept\n");
        pauses.push(pause);
        resumes.push(resume);
        cycles.push(pause + resume + first.elapsed());
    }

    // How late a deadline fires: sandboxes with `timeout_s: 1`, polled until terminated.
    // Each is created at another phase of the 500 ms deadline tick (a loop that waited for
    // the previous one would otherwise always start just after a tick).
    let mut late = Vec::new();
    for n in 0..iterations.min(10) {
        tokio::time::sleep(Duration::from_millis((n as u64 * 53) % 500)).await;
        let scope = format!("deadline-{n}");
        server.workdir("bench", &format!("projects/{scope}")).await;
        let (status, info) = server
            .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                "uid": "bench", "runtime_scope_id": scope,
                "workdir": format!("projects/{scope}"), "timeout_s": 1,
            })))
            .await;
        assert_eq!(status, 201, "{info}");
        let id = info["sandbox_id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(1);
        while server.sandbox_state(&id).await != "terminated" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        late.push(Instant::now().saturating_duration_since(deadline));
    }
    drop(server);

    // The anchors: a container with a process, stopped and started again.
    let name = format!("warren-bench-{}", std::process::id());
    sleeping_container(&name);
    let (mut stops, mut starts, mut freezes, mut thaws) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        stops.push(timed_docker(&["stop", "--time", "0", &name]));
        starts.push(timed_docker(&["start", &name]));
        freezes.push(timed_docker(&["pause", &name]));
        thaws.push(timed_docker(&["unpause", &name]));
    }
    warren_test_support::docker(&["rm", "-f", &name]);

    row("pause (API, local)", &mut pauses, &mut stops, "docker stop");
    row(
        "resume (API, local)",
        &mut resumes,
        &mut starts,
        "docker start",
    );
    row(
        "pause (API, local)",
        &mut pauses,
        &mut freezes,
        "docker pause (memory)",
    );
    row(
        "resume (API, local)",
        &mut resumes,
        &mut thaws,
        "docker unpause",
    );
    let mut docker_cycles: Vec<Duration> =
        stops.iter().zip(&starts).map(|(a, b)| *a + *b).collect();
    row(
        "pause + resume + first exec",
        &mut cycles,
        &mut docker_cycles,
        "docker stop + start",
    );
    row(
        "deadline fired late by",
        &mut late,
        &mut Vec::new(),
        "no anchor",
    );
}
