//! Sandbox identity and lifecycle (I5, I6, I12, I15, I20).

use reqwest::Method;
use serde_json::json;

use super::server;

async fn create(
    server: &warren_test_support::TestServer,
    uid: &str,
    scope: &str,
    workdir: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut body = json!({ "uid": uid, "runtime_scope_id": scope });
    if let Some(workdir) = workdir {
        body["workdir"] = json!(workdir);
    }
    server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
        .await
}

#[tokio::test]
async fn the_same_identity_gets_the_same_sandbox() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    let (status, first) = create(&server, "alice", "thread-1", Some("projects/a")).await;
    assert_eq!(status, 201, "{first}");
    assert!(first["sandbox_id"].as_str().unwrap().starts_with("sbx-"));
    assert_eq!(
        first["state"], "created",
        "creating a sandbox starts no runtime (I12)"
    );
    assert_eq!(first["workdir_path"], "/home/gem/user-data/projects/a");
    assert_eq!(first["generation"], 1);
    let (status, second) = create(&server, "alice", "thread-1", Some("projects/a")).await;
    assert_eq!(status, 200);
    assert_eq!(second["sandbox_id"], first["sandbox_id"]);
    let (status, without_workdir) = create(&server, "alice", "thread-1", None).await;
    assert_eq!(status, 200);
    assert_eq!(without_workdir["workdir"], "projects/a");
}

#[tokio::test]
async fn rebinding_a_live_sandbox_to_another_workdir_is_a_conflict() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    server.workdir("alice", "projects/b").await;
    create(&server, "alice", "thread-1", Some("projects/a")).await;
    let (status, body) = create(&server, "alice", "thread-1", Some("projects/b")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "workdir_conflict");
}

#[tokio::test]
async fn two_scopes_on_one_workdir_get_two_sandboxes() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    let (_, one) = create(&server, "alice", "thread-1", Some("projects/a")).await;
    let (_, two) = create(&server, "alice", "thread-2", Some("projects/a")).await;
    assert_ne!(one["sandbox_id"], two["sandbox_id"]);
    let (_, other_user) = create(&server, "bob", "thread-1", None).await;
    assert_ne!(one["sandbox_id"], other_user["sandbox_id"]);
    let (status, list) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes?uid=alice"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn a_missing_or_invalid_workdir_is_refused() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    let (status, body) = create(&server, "alice", "t", Some("projects/missing")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("workdir_not_found"))
    );
    let (status, body) = create(&server, "alice", "t", Some("../x")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_workdir"))
    );
    let (status, body) = create(&server, "alice", "t", Some("agents/skills")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_workdir"))
    );
    std::fs::write(server.workspace_of("alice").join("projects/file"), "x").unwrap();
    let (status, body) = create(&server, "alice", "t", Some("projects/file")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("workdir_not_a_directory"))
    );
    // Another user's workdir does not exist in this user's workspace.
    let (status, _) = create(&server, "bob", "t", Some("projects/a")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn invalid_identities_and_bodies_are_refused_with_stable_codes() {
    let server = server();
    let (status, body) = create(&server, "", "t", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_uid"))
    );
    let (status, body) = create(&server, "alice", "", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_runtime_scope"))
    );
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .body("{not json")
                .header("content-type", "application/json"),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_json"))
    );
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .json(&json!({"uid":"a","runtime_scope_id":"b","surprise":1})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_json");
    let (status, body) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes/not-an-id"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_sandbox_id"))
    );
    let (status, body) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes/sbx-0123456789abcdef01234567"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("sandbox_not_found"))
    );
    let (status, body) = server
        .send_json(server.request(Method::GET, "/v1/nowhere"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("route_not_found"))
    );
    let (status, body) = server
        .send_json(server.request(Method::PATCH, "/v1/sandboxes"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
}

#[tokio::test]
async fn deleting_a_sandbox_keeps_workspace_files_and_the_identity_starts_a_new_generation() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, _) = server
        .send_json(
            server
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path=keep.txt"),
                )
                .body("precious"),
        )
        .await;
    assert_eq!(status, 201);
    let (status, body) = server
        .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!((status, body["state"].as_str()), (200, Some("terminated")));
    let kept = server.workspace_of("alice").join("projects/a/keep.txt");
    assert_eq!(std::fs::read_to_string(kept).unwrap(), "precious");
    // A terminated sandbox refuses execs with a clear code.
    let (status, body) = server
        .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("terminated")),
        "delete is idempotent"
    );
    server.workdir("alice", "projects/b").await;
    let (status, body) = create(&server, "alice", "t", Some("projects/b")).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["sandbox_id"], id.as_str());
    assert_eq!(body["generation"], 2);
    assert_eq!(body["workdir"], "projects/b");
}

#[tokio::test]
async fn the_memory_backend_refuses_to_execute() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&json!({"command": "echo hi"})),
        )
        .await;
    assert_eq!(status, 501, "{body}");
    assert_eq!(body["error"]["code"], "exec_not_supported");
    let (_, sandbox) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!(
        sandbox["state"], "created",
        "a refused exec starts no runtime"
    );
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&json!({"command": "x", "argv": ["y"]})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
}

#[tokio::test]
async fn parallel_creates_of_one_identity_make_one_sandbox() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    let calls = (0..24).map(|_| create(&server, "alice", "busy", Some("projects/a")));
    let results = futures::future::join_all(calls).await;
    let created = results.iter().filter(|(s, _)| *s == 201).count();
    let existing = results.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!((created, existing), (1, 23), "{results:?}");
    let ids: std::collections::BTreeSet<_> = results
        .iter()
        .map(|(_, b)| b["sandbox_id"].to_string())
        .collect();
    assert_eq!(ids.len(), 1);
}

#[tokio::test]
async fn a_json_body_is_accepted_whatever_its_content_type_says() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    // What `curl -d` sends: JSON labelled as a form.
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(r#"{"uid":"alice","runtime_scope_id":"t","workdir":"projects/a"}"#),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}
