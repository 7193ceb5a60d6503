//! Leases and idle reaping (I25, I15): a runtime lives while a run holds a lease, a
//! command runs, or a process it started works; then it is reclaimed, files kept.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::bin;

fn fast_reaper(extra: &[&str]) -> TestServer {
    let mut args = vec!["--idle-timeout", "1", "--reap-interval", "1"];
    args.extend_from_slice(extra);
    TestServer::start_with(bin(), &args)
}

async fn lease(server: &TestServer, id: &str, holder: &str, ttl_s: u64) -> String {
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/leases"))
                .json(&json!({"holder": holder, "ttl_s": ttl_s})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body["lease_id"].as_str().unwrap().to_owned()
}

async fn release(server: &TestServer, id: &str, lease: &str) -> u16 {
    server
        .send_json(server.request(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/leases/{lease}"),
        ))
        .await
        .0
}

#[tokio::test]
async fn a_runtime_lives_while_any_lease_does_and_is_reaped_after_the_last() {
    let server = fast_reaper(&[]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(&id, "echo state > /tmp/s; echo kept > kept.txt")
        .await;
    let root_run = lease(&server, &id, "run-root", 60).await;
    let child_run = lease(&server, &id, "run-child", 60).await;
    assert!(
        !server
            .reaches_state(&id, "stopped", Duration::from_secs(3))
            .await,
        "reaped under two leases"
    );
    assert_eq!(release(&server, &id, &root_run).await, 204);
    assert!(
        !server
            .reaches_state(&id, "stopped", Duration::from_secs(3))
            .await,
        "reaped under the child's lease"
    );
    assert_eq!(server.exec(&id, "cat /tmp/s").await["stdout"], "state\n");
    assert_eq!(release(&server, &id, &child_run).await, 204);
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(8))
            .await,
        "not reaped after the last lease"
    );
    let kept = server.workspace_of("alice").join("projects/a/kept.txt");
    assert_eq!(
        std::fs::read_to_string(kept).unwrap(),
        "kept\n",
        "I15: reaping keeps files"
    );
    // The next use starts a fresh runtime.
    let fresh = server
        .exec(&id, "cat /tmp/s 2>/dev/null || echo fresh")
        .await;
    assert_eq!(fresh["stdout"], "fresh\n");
    assert_eq!(
        release(&server, &id, &child_run).await,
        404,
        "a released lease is gone"
    );
}

#[tokio::test]
async fn an_unrenewed_lease_expires_and_the_runtime_is_reaped() {
    let server = fast_reaper(&[]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    let lease_id = lease(&server, &id, "crashing-run", 1).await;
    let (status, body) = server
        .send_json(
            server
                .request(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/leases/{lease_id}/renew"),
                )
                .json(&json!({"ttl_s": 2})),
        )
        .await;
    assert_eq!(status, 200, "a live lease renews: {body}");
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(10))
            .await,
        "the expired lease kept it"
    );
    let (status, body) = server
        .send_json(server.request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/leases/{lease_id}/renew"),
        ))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("lease_not_found"))
    );
}

#[tokio::test]
async fn a_runtime_whose_processes_still_run_is_not_reaped_as_idle() {
    let server = fast_reaper(&[]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(
            &id,
            "echo state > /tmp/s; nohup sleep 300 >/dev/null 2>&1 &",
        )
        .await;
    assert!(
        !server
            .reaches_state(&id, "stopped", Duration::from_secs(4))
            .await,
        "reaped with sleep running"
    );
    assert_eq!(server.exec(&id, "cat /tmp/s").await["stdout"], "state\n");
    server.exec(&id, "pkill sleep; true").await;
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(8))
            .await,
        "idle once the process ended"
    );
}

#[tokio::test]
async fn the_maximum_lifetime_ends_a_runtime_even_under_a_lease() {
    let server = fast_reaper(&["--max-lifetime", "2"]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    lease(&server, &id, "long-run", 3600).await;
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(10))
            .await
    );
}

#[tokio::test]
async fn leases_are_refused_on_a_terminated_sandbox_and_checked() {
    let server = fast_reaper(&[]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    for body in [
        json!({"holder": "r", "ttl_s": 0}),
        json!({"holder": "", "ttl_s": 5}),
        json!({"holder": "r", "ttl_s": 99999}),
    ] {
        let (status, answer) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/leases"))
                    .json(&body),
            )
            .await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    server.terminate(&id).await;
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/leases"))
                .json(&json!({"holder": "late-run", "ttl_s": 5})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("sandbox_terminated")),
        "{body}"
    );
}

async fn terminate(
    server: &TestServer,
    id: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/terminate"))
                .json(&body),
        )
        .await
}

#[tokio::test]
async fn terminate_lets_a_running_command_finish_within_the_grace_and_fences_new_work() {
    let server = TestServer::start_with(bin(), &[]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    let running = server.exec(&id, "sleep 2; echo finished > done.txt; echo finished");
    let ending = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let terminated = terminate(&server, &id, json!({"grace_s": 60}));
        let late_work = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let exec = server
                .send_json(
                    server
                        .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                        .json(&json!({"command": "echo sneaked > sneaked.txt"})),
                )
                .await;
            let lease = server
                .send_json(
                    server
                        .request(Method::POST, &format!("/v1/sandboxes/{id}/leases"))
                        .json(&json!({"holder": "late-run", "ttl_s": 5})),
                )
                .await;
            (exec, lease)
        };
        let (terminated, late) = tokio::join!(terminated, late_work);
        (terminated, late, started.elapsed())
    };
    let (result, ((status, body), ((exec_status, exec_body), (lease_status, lease_body)), took)) =
        tokio::join!(running, ending);
    assert_eq!(result["exit_code"], 0, "killed inside its grace: {result}");
    assert_eq!(result["stdout"], "finished\n");
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("terminated")),
        "{body}"
    );
    assert!(
        took < Duration::from_secs(20),
        "termination waited out the whole grace ({took:?}) after the command ended"
    );
    assert_eq!(
        (exec_status, exec_body["error"]["code"].as_str()),
        (409, Some("sandbox_terminating")),
        "I24: a new exec behind the fence: {exec_body}"
    );
    assert_eq!(
        (lease_status, lease_body["error"]["code"].as_str()),
        (409, Some("sandbox_terminating")),
        "I24: a new lease behind the fence: {lease_body}"
    );
    let workspace = server.workspace_of("alice").join("projects/a");
    assert_eq!(
        std::fs::read_to_string(workspace.join("done.txt")).unwrap(),
        "finished\n"
    );
    assert!(!workspace.join("sneaked.txt").exists(), "fenced exec ran");
}

#[tokio::test]
async fn terminate_kills_a_command_that_outlives_its_grace() {
    let server = TestServer::start_with(bin(), &[]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    let started = Instant::now();
    let running = server.send_json(
        server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .json(&json!({"command": "sleep 60; echo finished > late.txt"})),
    );
    let ending = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        terminate(&server, &id, json!({"grace_s": 1})).await
    };
    let ((_, result), (status, body)) = tokio::join!(running, ending);
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("terminated")),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the command outlived its grace: {result}"
    );
    assert_ne!(result["exit_code"], 0, "{result}");
    let late = server.workspace_of("alice").join("projects/a/late.txt");
    assert!(!late.exists(), "the command ran on after termination");
    // Workspace files stay and the same identity starts a new generation (I15, I24).
    let again = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(again, id);
    assert_eq!(server.exec(&id, "echo back").await["stdout"], "back\n");
}

#[tokio::test]
async fn a_command_running_when_its_sandbox_is_terminated_answers_sandbox_terminated() {
    let server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    let started_marker = server.workspace_of("alice").join("projects/a/started.txt");
    let running = server.send_json(
        server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .json(&json!({"command": "touch started.txt; sleep 30"})),
    );
    let ending = async {
        // Terminate only once the command is really running.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !started_marker.exists() {
            assert!(Instant::now() < deadline, "the command never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        terminate(&server, &id, json!({"grace_s": 0})).await
    };
    let started = Instant::now();
    let ((status, result), (terminated, body)) = tokio::join!(running, ending);
    assert_eq!(
        (terminated, body["state"].as_str()),
        (200, Some("terminated")),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the command was not ended by the termination: {result}"
    );
    // Either init reported the kill (a result with its signal) or the runtime went first:
    // never a server error.
    match status {
        200 => assert_eq!(result["signal"], 9, "{result}"),
        _ => assert_eq!(
            (status, result["error"]["code"].as_str()),
            (409, Some("sandbox_terminated")),
            "{result}"
        ),
    }
}

#[tokio::test]
async fn terminate_refuses_a_grace_out_of_range_and_unknown_fields() {
    let server = TestServer::start_with(bin(), &["--backend", "memory"]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    for (body, wanted) in [
        (json!({"grace_s": 301}), (400, "invalid_request")),
        (json!({"grace": 1}), (400, "invalid_json")),
    ] {
        let (status, answer) = terminate(&server, &id, body.clone()).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (wanted.0, Some(wanted.1)),
            "{body}: {answer}"
        );
    }
    assert_eq!(
        server.sandbox_state(&id).await,
        "created",
        "a refused terminate ended it"
    );
    // No body at all is the default grace.
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/terminate")))
        .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("terminated")),
        "{body}"
    );
}
