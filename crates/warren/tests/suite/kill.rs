//! `POST /v1/sandboxes/{id}/kill` and `warren sandbox kill`: every process of a sandbox
//! killed, the sandbox kept. (What the kill does inside each backend is in the conformance
//! suite: `a_background_fork_bomb_is_killed_on_request_and_the_sandbox_works_again`.)

use reqwest::Method;
use warren_test_support::run_to_exit;

use super::{bin, server};

#[tokio::test]
async fn killing_the_processes_of_an_unknown_sandbox_is_404_and_of_a_terminated_one_409() {
    let server = server();
    let (status, body) = server
        .send_json(server.request(
            Method::POST,
            "/v1/sandboxes/sbx-000000000000000000000000/kill",
        ))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("sandbox_not_found")),
        "{body}"
    );

    let id = server.sandbox("alice", "t", "projects/a").await;
    // A sandbox whose runtime never started has nothing to kill.
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/kill")))
        .await;
    assert_eq!((status, body["killed"].as_u64()), (200, Some(0)), "{body}");

    server.terminate(&id).await;
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/kill")))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("sandbox_terminated")),
        "{body}"
    );

    let (status, body) = server
        .send_json(reqwest::Client::new().post(format!("{}/v1/sandboxes/{id}/kill", server.url)))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{body}"
    );
}

#[tokio::test]
async fn the_cli_kills_every_process_of_a_sandbox_and_it_runs_again() {
    let server = super::runtime::local();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let id = server.sandbox("alice", "t", "projects/a").await;
    let left = server
        .exec(&id, "for i in 1 2 3; do sleep 1000 & done; exit 0")
        .await;
    assert_eq!(left["exit_code"], 0, "{left}");
    let out = run_to_exit(bin(), &["sandbox", "kill", &id], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let killed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(killed["killed"], 3, "{killed}");
    let after = server.exec(&id, "pgrep -c sleep; echo ran").await;
    assert_eq!(after["stdout"], "0\nran\n", "{after}");
}
