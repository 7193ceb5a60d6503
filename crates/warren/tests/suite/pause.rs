//! The sandbox's life beyond commands (issue 33), on the real binary: pause and resume,
//! deadlines that terminate or pause, labels that filter listings, and directory watches,
//! through `/v1`, MCP and the CLI, on the native runtime and on Docker; and a deadline
//! seen by two replicas that fires once.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::{run_to_exit, McpSession, TestServer};

use super::metrics::{scrape, value};
use super::replicas::Cluster;
use super::{bin, watch_until};

async fn call(
    server: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = server.request(method, path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    server.send_json(request).await
}

async fn create(server: &TestServer, uid: &str, scope: &str, extra: Value) -> Value {
    server.workdir(uid, &format!("projects/{scope}")).await;
    let mut body =
        json!({"uid": uid, "runtime_scope_id": scope, "workdir": format!("projects/{scope}")});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let (status, info) = call(server, Method::POST, "/v1/sandboxes", Some(body)).await;
    assert!(status == 201 || status == 200, "{status} {info}");
    info
}

/// Pauses, resumes and runs in a sandbox of `server`: what a pause keeps and ends.
async fn pause_and_resume_keep_the_files_and_end_the_processes(server: &TestServer) {
    let info = create(server, "alice", "paused", json!({})).await;
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let setup = server
        .exec(
            &id,
            "echo installed > \"$HOME/.installed\" && echo scratch > /tmp/scratch \
             && echo kept > kept.txt && echo ok",
        )
        .await;
    assert_eq!(setup["stdout"], "ok\n", "{setup}");
    let (status, process) = call(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(json!({"command": "sleep 600", "tag": "sleeper"})),
    )
    .await;
    assert_eq!(status, 201, "{process}");

    let (status, paused) = call(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/pause"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["sandbox"]["state"], "paused", "{paused}");
    assert_eq!(paused["processes_ended"], true, "{paused}");

    // Nothing runs in a paused sandbox, and it says how to go on.
    let (status, refused) = call(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "true"})),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("sandbox_paused")),
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resume"),
        "{refused}"
    );
    // A second pause is refused; the workspace stays readable.
    let (status, again) = call(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/pause"),
        None,
    )
    .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("sandbox_state_conflict")),
        "{again}"
    );
    let (status, _) = call(
        server,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(status, 200);

    let (status, resumed) = call(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["state"], "running", "{resumed}");
    let (status, again) = call(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("sandbox_state_conflict")),
        "{again}"
    );

    let after = server
        .exec(
            &id,
            "cat kept.txt; cat \"$HOME/.installed\" 2>/dev/null || echo lost; \
             cat /tmp/scratch 2>/dev/null || echo fresh-tmp; \
             cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -q 'slee[p] 600' \
             && echo alive || echo ended",
        )
        .await;
    let lines: Vec<&str> = after["stdout"].as_str().unwrap().lines().collect();
    // The workspace is kept, and the home by the runtime snapshot (installed packages
    // with it); the runtime's scratch and its processes are not.
    assert_eq!(
        lines,
        ["kept", "installed", "fresh-tmp", "ended"],
        "{after}"
    );
}

#[tokio::test]
async fn a_paused_sandbox_runs_nothing_and_resumes_with_its_files_and_installs() {
    let server = TestServer::start_local(bin());
    pause_and_resume_keep_the_files_and_end_the_processes(&server).await;
}

#[tokio::test]
async fn a_paused_docker_sandbox_resumes_with_its_workspace() {
    let server = TestServer::start_docker(bin());
    // Docker's snapshot keeps the home too (its image root is read-only).
    pause_and_resume_keep_the_files_and_end_the_processes(&server).await;
}

#[tokio::test]
async fn deadlines_terminate_or_pause_and_a_patch_moves_them() {
    let server = TestServer::start_local(bin());
    let ends = create(&server, "alice", "ends", json!({"timeout_s": 1})).await;
    let sleeps = create(
        &server,
        "alice",
        "sleeps",
        json!({"timeout_s": 1, "on_deadline": "pause"}),
    )
    .await;
    // Its deadline is far enough that the PATCH below always comes first.
    let stays = create(&server, "alice", "stays", json!({"timeout_s": 600})).await;
    assert_eq!(sleeps["on_deadline"], "pause");
    assert!(ends["deadline"].is_string(), "{ends}");
    let id = |info: &Value| info["sandbox_id"].as_str().unwrap().to_owned();
    // Moved an hour on, and then removed: it outlives the others.
    let (status, moved) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{}", id(&stays)),
        Some(json!({"timeout_s": 3600})),
    )
    .await;
    assert_eq!(status, 200, "{moved}");
    let (status, cleared) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{}", id(&stays)),
        Some(json!({"timeout_s": null})),
    )
    .await;
    assert_eq!(status, 200, "{cleared}");
    assert!(cleared.get("deadline").is_none(), "{cleared}");

    assert!(
        server
            .reaches_state(&id(&ends), "terminated", Duration::from_secs(10))
            .await
    );
    assert!(
        server
            .reaches_state(&id(&sleeps), "paused", Duration::from_secs(10))
            .await
    );
    assert_eq!(server.sandbox_state(&id(&stays)).await, "created");
    let samples = scrape(&server).await;
    assert_eq!(
        value(&samples, "warren_deadlines_total{action=terminate}"),
        1.0
    );
    assert_eq!(value(&samples, "warren_deadlines_total{action=pause}"), 1.0);

    // A sandbox paused by its deadline resumes; the deadline that passed goes with it.
    let (status, resumed) = call(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{}/resume", id(&sleeps)),
        None,
    )
    .await;
    assert_eq!(status, 200, "{resumed}");
    assert!(resumed.get("deadline").is_none(), "{resumed}");
    assert_eq!(server.exec(&id(&sleeps), "echo up").await["stdout"], "up\n");

    // Out of bounds, or for a sandbox that ended: refused, nothing changed.
    let (status, refused) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{}", id(&stays)),
        Some(json!({"timeout_s": 31_536_001u64})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let (status, refused) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{}", id(&ends)),
        Some(json!({"timeout_s": 60})),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("sandbox_terminated")),
        "{refused}"
    );
}

#[tokio::test]
async fn labels_are_set_at_create_replaced_by_a_patch_and_filter_the_listing() {
    let server = TestServer::start_local(bin());
    let a = create(
        &server,
        "alice",
        "a",
        json!({"labels": {"team": "red", "tier": "a b=c"}}),
    )
    .await;
    create(&server, "alice", "b", json!({"labels": {"team": "blue"}})).await;
    create(&server, "bob", "c", json!({"labels": {"team": "red"}})).await;
    let listed = |query: &str| {
        let server = &server;
        let query = query.to_owned();
        async move {
            let (status, list) =
                call(server, Method::GET, &format!("/v1/sandboxes?{query}"), None).await;
            assert_eq!(status, 200, "{list}");
            list["sandboxes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["runtime_scope_id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("label=team%3Dred").await, ["a", "c"]);
    assert_eq!(listed("label=team%3Dred&uid=alice").await, ["a"]);
    assert_eq!(
        listed("label=team%3Dred&label=tier%3Da%20b%3Dc").await,
        ["a"]
    );
    assert!(listed("label=team%3Dgreen").await.is_empty());
    let (status, refused) = call(&server, Method::GET, "/v1/sandboxes?label=novalue", None).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (400, Some("invalid_query")),
        "{refused}"
    );

    let id = a["sandbox_id"].as_str().unwrap();
    let (status, patched) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{id}"),
        Some(json!({"labels": {"team": "blue"}})),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["labels"], json!({"team": "blue"}));
    assert_eq!(listed("label=team%3Dblue").await, ["a", "b"]);
    // Labels a listing filter could not name are refused.
    let (status, refused) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{id}"),
        Some(json!({"labels": {"": "x"}})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let (status, _) = call(
        &server,
        Method::PATCH,
        &format!("/v1/sandboxes/{id}"),
        Some(json!({"labels": {"k": "a\nb"}})),
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn a_watch_streams_what_changes_and_refuses_links_and_escapes() {
    let server = TestServer::start_local(bin());
    let info = create(&server, "alice", "watched", json!({})).await;
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    server
        .exec(
            &id,
            "mkdir -p src/deep && ln -s /etc linked && ln -s src alias",
        )
        .await;
    let mut response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/watch?path=src&recursive=true"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let started = watch_until(&mut response, |e| e["type"] == "start").await;
    assert!(
        started[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("/projects/watched/src"),
        "{started:?}"
    );
    // A change made inside the runtime and one through the file API.
    server.exec(&id, "echo x > src/deep/made.txt").await;
    let seen = watch_until(&mut response, |e| {
        e["type"] == "create" && e["name"] == "deep/made.txt"
    })
    .await;
    assert!(seen.iter().all(|e| e["type"] != "error"), "{seen:?}");
    let (status, _) = server
        .send_json(
            server
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path=src/api.txt"),
                )
                .body("y"),
        )
        .await;
    assert_eq!(status, 201);
    watch_until(&mut response, |e| e["name"] == "api.txt").await;
    // The directory going away ends the stream with why.
    server.exec(&id, "rm -r src").await;
    let ended = watch_until(&mut response, |e| e["type"] == "error").await;
    assert_eq!(
        ended.last().unwrap()["error"]["code"],
        "watched_dir_gone",
        "{ended:?}"
    );

    // Links in any component, parents and other mounts are refused before anything is
    // watched, with no host path in the answer.
    for (path, code) in [
        ("linked", "symlink_refused"),
        ("alias", "symlink_refused"),
        ("alias/deep", "symlink_refused"),
        ("../other", "invalid_path"),
        ("/tmp/../etc", "invalid_path"),
    ] {
        let (status, refused) = call(
            &server,
            Method::GET,
            &format!("/v1/sandboxes/{id}/watch?path={path}"),
            None,
        )
        .await;
        assert!(
            status == 400 || status == 403 || status == 404,
            "{path}: {status} {refused}"
        );
        assert_eq!(refused["error"]["code"], code, "{path}: {refused}");
        let data_dir = server.data_dir();
        assert!(
            !refused.to_string().contains(data_dir.to_str().unwrap()),
            "{refused}"
        );
    }
    // Another user's sandbox id is just another sandbox: its own files only.
    let bob = create(&server, "bob", "watched", json!({})).await;
    let (status, _) = call(
        &server,
        Method::GET,
        &format!(
            "/v1/sandboxes/{}/watch?path=../../alice",
            bob["sandbox_id"].as_str().unwrap()
        ),
        None,
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_mcp_tools_pause_resume_set_a_deadline_and_wait_for_changes() {
    let server = TestServer::start_local(bin());
    let info = create(&server, "alice", "mcp", json!({})).await;
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let mut mcp = McpSession::open(&server, &id).await;
    let text = |answer: &Value| {
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let errored = |answer: &Value| answer["result"]["isError"] == true;

    let answer = mcp
        .call_tool(
            "set_deadline",
            json!({"timeout_s": 3600, "on_deadline": "pause", "labels": {"by": "mcp"}}),
        )
        .await;
    assert!(!errored(&answer), "{answer}");
    assert!(
        text(&answer).contains("then paused") && text(&answer).contains("by=mcp"),
        "{answer}"
    );
    let answer = mcp.call_tool("bash", json!({"command": "echo hi"})).await;
    assert!(!errored(&answer), "{answer}");

    let answer = mcp.call_tool("pause_sandbox", json!({})).await;
    assert!(!errored(&answer), "{answer}");
    assert!(text(&answer).contains("is paused"), "{answer}");
    let answer = mcp.call_tool("bash", json!({"command": "echo hi"})).await;
    assert!(
        errored(&answer) && text(&answer).contains("resume"),
        "{answer}"
    );
    let answer = mcp.call_tool("resume_sandbox", json!({})).await;
    assert!(
        !errored(&answer) && text(&answer).contains("is running"),
        "{answer}"
    );

    // The directory exists first, so what comes back are the files' own events.
    let answer = mcp
        .call_tool("bash", json!({"command": "mkdir -p notes"}))
        .await;
    assert!(!errored(&answer), "{answer}");
    // A change made meanwhile comes back from watch_files. When the watch is open is
    // not visible from here, so a file is written every 200 ms until the call returns:
    // whichever lands after the watch opened is the one it reports.
    let writer = super::WriteEvery::start(&server, &id, "notes");
    let answer = mcp.call_tool("watch_files", json!({"timeout_s": 20})).await;
    writer.stop().await;
    assert!(!errored(&answer), "{answer}");
    assert!(text(&answer).contains("notes/new-"), "{answer}");
    let answer = mcp
        .call_tool("watch_files", json!({"path": "../x", "timeout_s": 1}))
        .await;
    assert!(errored(&answer), "{answer}");
    let answer = mcp.call_tool("sandbox_status", json!({})).await;
    assert!(text(&answer).contains("is running"), "{answer}");
}

#[tokio::test]
async fn the_cli_pauses_resumes_sets_lists_by_label_and_watches() {
    let server = TestServer::start_local(bin());
    let info = create(&server, "alice", "cli", json!({"labels": {"via": "cli"}})).await;
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let run = |args: &[&str]| {
        let out = run_to_exit(bin(), args, &env);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let listed = run(&["sandbox", "list", "--label", "via=cli"]);
    assert_eq!(listed["sandboxes"][0]["sandbox_id"], id.as_str());
    assert!(run(&["sandbox", "list", "--label", "via=api"])["sandboxes"]
        .as_array()
        .unwrap()
        .is_empty());
    let set = run(&[
        "sandbox",
        "set",
        &id,
        "--timeout",
        "600",
        "--on-deadline",
        "pause",
        "--label",
        "via=set",
    ]);
    assert_eq!(
        (set["on_deadline"].as_str(), set["labels"]["via"].as_str()),
        (Some("pause"), Some("set"))
    );
    assert!(set["deadline"].is_string());
    let paused = run(&["sandbox", "pause", &id]);
    assert_eq!(paused["sandbox"]["state"], "paused");
    assert_eq!(
        run(&["sandbox", "list", "--state", "paused"])["sandboxes"][0]["sandbox_id"],
        id.as_str()
    );
    let resumed = run(&["sandbox", "resume", &id, "--timeout", "60"]);
    assert_eq!(resumed["state"], "running");
    let out = run_to_exit(bin(), &["sandbox", "pause", "0000"], &env);
    assert!(!out.status.success());

    let mut watch = std::process::Command::new(bin())
        .args(["sandbox", "watch", &id, ".", "--recursive"])
        .envs(env)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let start: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(start["type"], "start");
    server.exec(&id, "touch from-the-runtime").await;
    let event: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        (event["type"].as_str(), event["name"].as_str()),
        (Some("create"), Some("from-the-runtime")),
        "{event}"
    );
    watch.kill().unwrap();
    watch.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_seen_by_two_replicas_fires_once() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let mut ids = Vec::new();
    for scope in ["one", "two", "three"] {
        let info = create(a, "alice", scope, json!({})).await;
        let id = info["sandbox_id"].as_str().unwrap().to_owned();
        // A runtime runs for the first; the others have none.
        if scope == "one" {
            assert_eq!(a.exec(&id, "true").await["exit_code"], 0);
        }
        ids.push(id);
    }
    // The deadlines are set (through the other replica) once everything runs.
    for id in &ids {
        let (status, body) = call(
            b,
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(json!({"timeout_s": 1})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    for id in &ids {
        assert!(
            b.reaches_state(id, "terminated", Duration::from_secs(15))
                .await,
            "{id}"
        );
    }
    let fired: f64 = [scrape(a).await, scrape(b).await]
        .iter()
        .map(|samples| value(samples, "warren_deadlines_total{action=terminate}"))
        .sum();
    assert_eq!(fired, 3.0, "each deadline fired once across the replicas");
}
