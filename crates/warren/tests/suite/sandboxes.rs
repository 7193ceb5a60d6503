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
    create_scoped(server, body).await
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
    assert_eq!(status, 400, "{body}");
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
    server.terminate(&id).await;
    let kept = server.workspace_of("alice").join("projects/a/keep.txt");
    assert_eq!(std::fs::read_to_string(kept).unwrap(), "precious");
    // Delete is idempotent.
    server.terminate(&id).await;
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

/// `POST /v1/sandboxes` with any body.
async fn create_scoped(
    server: &warren_test_support::TestServer,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
        .await
}

#[tokio::test]
async fn isolation_scopes_derive_who_shares_a_sandbox() {
    let server = server();
    // (request, derived uid, derived runtime scope)
    let cases = [
        (
            json!({"scope":"user","user_id":"alice","session_id":"s-1"}),
            "alice",
            "user",
        ),
        (
            json!({"scope":"user","session_id":"s-1"}),
            "session:s-1",
            "session",
        ),
        (
            json!({"scope":"user","user_id":"","session_id":"s-1"}),
            "session:s-1",
            "session",
        ),
        (
            json!({"scope":"session","user_id":"alice","session_id":"s-1"}),
            "session:s-1",
            "session",
        ),
        (
            json!({"scope":"agent","user_id":"alice","agent_id":"coder"}),
            "agent:coder",
            "agent",
        ),
        (json!({"scope":"global"}), "global:shared", "global"),
    ];
    for (body, uid, runtime_scope) in cases {
        let (status, info) = create_scoped(&server, body.clone()).await;
        assert!(status == 201 || status == 200, "{body}: {status} {info}");
        assert_eq!(
            (info["uid"].as_str(), info["runtime_scope_id"].as_str()),
            (Some(uid), Some(runtime_scope)),
            "{body}"
        );
    }
    let id = |body: serde_json::Value| {
        let server = &server;
        async move {
            let (status, info) = create_scoped(server, body.clone()).await;
            assert!(status == 201 || status == 200, "{body}: {status} {info}");
            info["sandbox_id"].as_str().unwrap().to_owned()
        }
    };
    // USER: two sessions of one user share; two users do not.
    let alice_1 = id(json!({"scope":"user","user_id":"alice","session_id":"s-1"})).await;
    let alice_2 = id(json!({"scope":"user","user_id":"alice","session_id":"s-2"})).await;
    let bob = id(json!({"scope":"user","user_id":"bob","session_id":"s-1"})).await;
    assert_eq!(alice_1, alice_2);
    assert_ne!(alice_1, bob);
    // SESSION: one per session, whoever the user.
    let s1 = id(json!({"scope":"session","user_id":"alice","session_id":"s-1"})).await;
    let s1_bob = id(json!({"scope":"session","user_id":"bob","session_id":"s-1"})).await;
    let s2 = id(json!({"scope":"session","user_id":"alice","session_id":"s-2"})).await;
    assert_eq!(s1, s1_bob);
    assert_ne!(s1, s2);
    assert_ne!(s1, alice_1);
    // AGENT: every user of the agent shares; another agent does not.
    let coder_alice = id(json!({"scope":"agent","user_id":"alice","agent_id":"coder"})).await;
    let coder_bob = id(json!({"scope":"agent","user_id":"bob","agent_id":"coder"})).await;
    let writer = id(json!({"scope":"agent","user_id":"alice","agent_id":"writer"})).await;
    assert_eq!(coder_alice, coder_bob);
    assert_ne!(coder_alice, writer);
    // The scope form and the explicit form name the same identity.
    let (_, explicit) = create(&server, "alice", "user", None).await;
    assert_eq!(explicit["sandbox_id"].as_str(), Some(alice_1.as_str()));
}

#[tokio::test]
async fn bad_isolation_scope_requests_are_refused_with_stable_codes() {
    let server = server();
    let cases = [
        (json!({"scope":"team","user_id":"alice"}), "invalid_scope"),
        (json!({"scope":"user"}), "invalid_scope"),
        (
            json!({"scope":"session","user_id":"alice"}),
            "invalid_scope",
        ),
        (json!({"scope":"agent","user_id":"alice"}), "invalid_scope"),
        (
            json!({"scope":"user","user_id":"session:s-1"}),
            "invalid_scope",
        ),
        (
            json!({"scope":"user","user_id":"alice","uid":"alice"}),
            "invalid_request",
        ),
        (
            json!({"uid":"alice","runtime_scope_id":"t","session_id":"s-1"}),
            "invalid_request",
        ),
        (json!({"uid":"alice"}), "invalid_request"),
        (json!({}), "invalid_request"),
    ];
    for (body, code) in cases {
        let (status, answer) = create_scoped(&server, body.clone()).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some(code)),
            "{body}: {answer}"
        );
    }
    let (_, list) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(
        list["sandboxes"],
        json!([]),
        "a refused create made a sandbox"
    );
}

#[tokio::test]
async fn a_plain_uid_with_a_reserved_prefix_is_refused_everywhere_a_client_names_a_uid() {
    let server = server();
    // The derived owner exists: session s-9 has its sandbox.
    let (status, derived) =
        create_scoped(&server, json!({"scope":"session","session_id":"s-9"})).await;
    assert_eq!(status, 201, "{derived}");
    assert_eq!(derived["uid"], "session:s-9");
    // The explicit form may not name it, nor any other derived owner.
    for uid in ["session:s-9", "agent:coder", "global:shared"] {
        let (status, answer) = create(&server, uid, "session", None).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("reserved_uid")),
            "{uid}: {answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("reserved")),
            "{answer}"
        );
    }
    // Every other place a client names a uid.
    let uid = "session:s-9";
    let requests = [
        server.request(Method::GET, "/v1/sandboxes?uid=session:s-9"),
        server
            .request(Method::POST, &format!("/v1/users/{uid}/workdirs"))
            .json(&json!({"path": "projects/x"})),
        server.request(Method::GET, &format!("/v1/users/{uid}/workdirs")),
        server.request(Method::GET, &format!("/v1/users/{uid}/env")),
        server
            .request(Method::PUT, &format!("/v1/users/{uid}/env"))
            .json(&json!({"env": {}})),
        server.request(Method::DELETE, &format!("/v1/users/{uid}/env")),
        server
            .request(Method::PUT, &format!("/v1/users/{uid}/env/A"))
            .json(&json!({"value": "x", "secret": false})),
        server.request(Method::DELETE, &format!("/v1/users/{uid}/env/A")),
        server.request(Method::GET, &format!("/v1/users/{uid}/skills")),
        server.request(Method::POST, &format!("/v1/users/{uid}/skills/sync")),
        server.request(Method::PUT, &format!("/v1/users/{uid}/skills/s")),
        server.request(Method::DELETE, &format!("/v1/users/{uid}/skills/s")),
        server.request(Method::POST, &format!("/v1/users/{uid}/snapshots/gc")),
        server
            .request(Method::POST, "/v1/viewer-links")
            .json(&json!({"uid": uid, "workdir": "projects/x"})),
    ];
    for request in requests {
        let described = format!("{request:?}");
        let (status, answer) = server.send_json(request).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("reserved_uid")),
            "{described}: {answer}"
        );
    }
    // The derived sandbox is untouched, and a uid merely resembling a prefix is fine.
    let (status, again) =
        create_scoped(&server, json!({"scope":"session","session_id":"s-9"})).await;
    assert_eq!(
        (status, &again["sandbox_id"]),
        (200, &derived["sandbox_id"])
    );
    let (status, answer) = create(&server, "sessions-of-bob", "session", None).await;
    assert_eq!(status, 201, "{answer}");
}

#[tokio::test]
async fn a_session_scoped_sandbox_runs_in_the_derived_owners_workspace() {
    let server = warren_test_support::TestServer::start_with(super::bin(), &[]);
    let (status, info) = create_scoped(
        &server,
        json!({"scope":"user","session_id":"s-1","workdir":null}),
    )
    .await;
    assert_eq!(status, 201, "{info}");
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let result = server
        .exec(&id, "echo from-session > note.txt && pwd && id -u")
        .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    let stdout = result["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("/home/gem/user-data/projects/"),
        "{stdout}"
    );
    // The next call of the same session finds the same sandbox and the file.
    let (status, again) =
        create_scoped(&server, json!({"scope":"session","session_id":"s-1"})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["sandbox_id"].as_str(), Some(id.as_str()));
    assert_eq!(
        server.exec(&id, "cat note.txt").await["stdout"],
        "from-session\n"
    );
    // Another session sees none of it.
    let (_, other) = create_scoped(&server, json!({"scope":"session","session_id":"s-2"})).await;
    let other_id = other["sandbox_id"].as_str().unwrap();
    assert_ne!(other_id, id);
    let peek = server
        .exec(other_id, "find /home/gem/user-data -name note.txt")
        .await;
    assert_eq!(
        (peek["exit_code"].as_i64(), peek["stdout"].as_str()),
        (Some(0), Some("")),
        "another session sees the file: {peek}"
    );
}

#[tokio::test]
async fn a_deerflow_layout_sandbox_shows_its_workdir_at_mnt_user_data_with_read_only_skills() {
    let server = server();
    server.workdir("alice", "threads/t1/user-data").await;
    let (status, info) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t1", "workdir": "threads/t1/user-data",
               "layout": "deerflow"}),
    )
    .await;
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["layout"], "deerflow");
    assert_eq!(info["workdir_path"], "/mnt/user-data");
    let workspace = server.workspace_of("alice");
    for dir in ["workspace", "uploads", "outputs"] {
        assert!(
            workspace.join("threads/t1/user-data").join(dir).is_dir(),
            "the layout's skeleton has {dir}/"
        );
    }
    assert!(workspace.join("agents/skills").is_dir());
    let id = info["sandbox_id"].as_str().unwrap();
    let files = format!("/v1/sandboxes/{id}/files");
    let write = |path: &str| {
        server
            .request(Method::PUT, &files)
            .query(&[("path", path)])
            .body("hello")
    };
    let (status, body) = server
        .send_json(write("/mnt/user-data/workspace/a.txt"))
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    assert_eq!(body["path"], "/mnt/user-data/workspace/a.txt");
    assert_eq!(
        std::fs::read_to_string(workspace.join("threads/t1/user-data/workspace/a.txt")).unwrap(),
        "hello"
    );
    let (status, listing) = server
        .send_json(
            server
                .request(Method::GET, &format!("{files}/list"))
                .query(&[("path", "workspace")]),
        )
        .await;
    assert_eq!(status, 200, "{listing}");
    assert_eq!(
        listing["entries"][0]["path"], "/mnt/user-data/workspace/a.txt",
        "{listing}"
    );
    for read_only in ["/mnt/skills/custom/mine/SKILL.md", "/mnt/skills/public/x"] {
        let (status, body) = server.send_json(write(read_only)).await;
        assert_eq!(status, 403, "{read_only}: {body}");
        assert_eq!(body["error"]["code"], "read_only", "{body}");
    }
    // Another thread's files are outside this view: `..` is refused, naming the mounts.
    server.workdir("alice", "threads/t2/user-data").await;
    for outside in ["../../t2/user-data", "/mnt/user-data/../../t2"] {
        let (status, body) = server.send_json(write(outside)).await;
        assert_eq!(status, 400, "{outside}: {body}");
        assert_eq!(body["error"]["code"], "invalid_path", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("/mnt/user-data"), "{message}");
    }
    // The default layout's mount points are no mounts here: such a path is the runtime's
    // own (issue 42), which this backend has none of; the workspace is never reached.
    for outside in [
        "/home/gem/user-data/threads/t2/user-data/x",
        "/mnt/skills/x",
    ] {
        let (status, body) = server.send_json(write(outside)).await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (501, &json!("exec_not_supported")),
            "{outside}: {body}"
        );
    }
    assert!(!workspace.join("threads/t2/user-data/x").exists());
    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t1", "workdir": "threads/t1/user-data",
               "layout": "ars"}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "layout_conflict");
    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t1", "workdir": "threads/t1/user-data"}),
    )
    .await;
    assert_eq!(
        (status, &body["layout"]),
        (200, &json!("deerflow")),
        "no layout keeps the live one's"
    );
    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t9", "layout": "e2b-desktop"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ars") && message.contains("deerflow") && message.contains("e2b"),
        "an unknown layout names the known ones: {body}"
    );
}

/// The isolation tier is part of the binding (issue 19): `kernel` unless asked, `gvisor`
/// refused with 422 where the sandbox's backend cannot run it (the memory backend never
/// can) before anything is recorded, an unknown tier refused like any bad value, and
/// another tier for a live sandbox a conflict.
#[tokio::test]
async fn the_isolation_tier_is_kernel_by_default_and_gvisor_only_where_a_backend_runs_it() {
    let server = server();
    let (status, info) = create(&server, "alice", "t1", None).await;
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["isolation"], "kernel", "{info}");
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let (status, fetched) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!((status, &fetched["isolation"]), (200, &json!("kernel")));
    let workdirs = || async {
        let (status, body) = server
            .send_json(server.request(Method::GET, "/v1/users/alice/workdirs"))
            .await;
        assert_eq!(status, 200, "{body}");
        body["workdirs"].as_array().unwrap().len()
    };
    let workdirs_before = workdirs().await;

    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t2", "isolation": "gvisor"}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "isolation_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("memory") && message.contains("gvisor") && message.contains("kernel"),
        "the message names the backend, the tier and what to ask for instead: {message}"
    );
    let (status, list) = server
        .send_json(
            server
                .request(Method::GET, "/v1/sandboxes")
                .query(&[("uid", "alice")]),
        )
        .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list["sandboxes"].as_array().unwrap().len(),
        1,
        "no sandbox was recorded: {list}"
    );
    assert_eq!(workdirs().await, workdirs_before, "no workdir was made");

    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t3", "isolation": "bogus"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_json", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("kernel") && message.contains("gvisor"),
        "an unknown tier names the known ones: {message}"
    );

    // The live sandbox keeps its tier: naming it joins, naming another is a conflict
    // (the backend's ability does not matter to a sandbox already bound).
    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t1", "isolation": "kernel"}),
    )
    .await;
    assert_eq!((status, &body["sandbox_id"]), (200, &json!(id)), "{body}");
    let (status, body) = create_scoped(
        &server,
        json!({"uid": "alice", "runtime_scope_id": "t1", "isolation": "gvisor"}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "isolation_conflict", "{body}");

    // The document offers only what this server accepts.
    let (status, document) = server
        .send_json(server.request(Method::GET, "/v1/openapi.json"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        document["components"]["schemas"]["CreateSandbox"]["properties"]["isolation"]["enum"],
        json!(["kernel", null])
    );
}

/// A server whose default tier its default backend cannot run would refuse every sandbox
/// that names none: it does not start, and says why (issue 19).
#[test]
fn a_server_whose_backend_cannot_run_its_default_tier_does_not_start() {
    let data = tempfile::tempdir().unwrap();
    let config = super::write_config("isolation = \"gvisor\"\n");
    for how in [
        &["--isolation", "gvisor"][..],
        &["--config", config.path().to_str().unwrap()][..],
    ] {
        let mut args = vec![
            "serve",
            "--data-dir",
            data.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "memory",
        ];
        args.extend_from_slice(how);
        let out = warren_test_support::run_to_exit(super::bin(), &args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{how:?}: {stderr}");
        assert!(
            stderr.contains("gvisor")
                && stderr.contains("memory backend")
                && stderr.contains("--isolation kernel"),
            "{how:?}: {stderr}"
        );
    }
}
