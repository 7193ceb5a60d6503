//! Files anywhere in the runtime (issue 42): a path outside the persistent mounts is the
//! runtime's own, served by its agent as the sandbox user, resolved beneath the runtime's
//! root. Each rule runs on every backend and tier that runs commands here, and checks the
//! API's answer against what a command in the same runtime sees.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::conformance::Host;
use super::output as out;
use super::watch_until;

/// A marker no runtime may ever show: it lives on the host only.
const HOST_SECRET: &str = "HOST-ONLY-SECRET";

/// `PUT /v1/sandboxes/{id}/files`: the status and the answer.
pub(super) async fn put(
    server: &TestServer,
    id: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path)])
                .body(body.to_owned()),
        )
        .await
}

/// `GET /v1/sandboxes/{id}/files`: the status and the body as text.
pub(super) async fn get(server: &TestServer, id: &str, path: &str) -> (u16, String) {
    let response = server
        .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", path)])
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn call(
    server: &TestServer,
    method: Method,
    id: &str,
    route: &str,
    query: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = server
        .request(method, &format!("/v1/sandboxes/{id}/files{route}"))
        .query(query);
    if let Some(body) = body {
        request = request.json(&body);
    }
    server.send_json(request).await
}

async fn files_under_tmp_are_written_read_listed_moved_and_removed_as_uid_1000(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // Written through the API, with its parents: a command sees it, owned by the sandbox
    // user, as if it had written it itself.
    let (status, written) = put(&server, &id, "/tmp/api/deep/a.txt", "from the api\n").await;
    assert_eq!(status, 201, "{host:?}: {written}");
    assert_eq!(
        written["path"], "/tmp/api/deep/a.txt",
        "{host:?}: {written}"
    );
    let seen = server
        .exec(
            &id,
            // `find`, not `stat`: Debian 12's runsc refuses coreutils 9's statx(2).
            "cat /tmp/api/deep/a.txt; \
             find /tmp/api/deep/a.txt /tmp/api -maxdepth 0 -printf '%U:%G %m\n'",
        )
        .await;
    assert_eq!(
        out(&seen),
        "from the api\n1000:1000 644\n1000:1000 755\n",
        "{host:?}: {seen}"
    );
    // Written by a command: the API reads exactly those bytes, with an ETag that a
    // conditional write honours.
    server
        .exec(&id, "printf 'by a command' > /tmp/api/cmd.txt")
        .await;
    let response = server
        .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", "/tmp/api/cmd.txt")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{host:?}");
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(response.text().await.unwrap(), "by a command", "{host:?}");
    let stale = server
        .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", "/tmp/api/cmd.txt")])
        .header("if-match", "\"b3-00000000000000000000000000000000\"")
        .body("lost")
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 412, "{host:?}: a stale If-Match is refused");
    let fresh = server
        .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", "/tmp/api/cmd.txt")])
        .header("if-match", etag)
        .body("replaced")
        .send()
        .await
        .unwrap();
    assert_eq!(fresh.status(), 200, "{host:?}");
    // Listed, described, edited, moved, removed: each the runtime's own view.
    let (status, listing) = call(
        &server,
        Method::GET,
        &id,
        "/list",
        &[("path", "/tmp/api"), ("depth", "2")],
        None,
    )
    .await;
    assert_eq!(status, 200, "{host:?}: {listing}");
    let paths: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["/tmp/api/cmd.txt", "/tmp/api/deep", "/tmp/api/deep/a.txt"],
        "{host:?}: {listing}"
    );
    let (status, edited) = call(
        &server,
        Method::POST,
        &id,
        "/edit",
        &[],
        Some(json!({"path": "/tmp/api/cmd.txt", "old": "replaced", "new": "edited"})),
    )
    .await;
    assert_eq!(status, 200, "{host:?}: {edited}");
    let (status, moved) = call(
        &server,
        Method::POST,
        &id,
        "/move",
        &[],
        Some(json!({"from": "/tmp/api/cmd.txt", "to": "/tmp/api/deep/moved.txt"})),
    )
    .await;
    assert_eq!(status, 200, "{host:?}: {moved}");
    let (status, made) = call(
        &server,
        Method::POST,
        &id,
        "/mkdir",
        &[],
        Some(json!({"path": "/tmp/api/made/here"})),
    )
    .await;
    assert!((200..300).contains(&status), "{host:?}: {made}");
    let seen = server
        .exec(
            &id,
            "cat /tmp/api/deep/moved.txt; echo; \
             find /tmp/api -mindepth 1 -maxdepth 1 -printf '%f\n' | sort",
        )
        .await;
    assert_eq!(out(&seen), "edited\ndeep\nmade\n", "{host:?}: {seen}");
    let (status, removed) = call(
        &server,
        Method::DELETE,
        &id,
        "",
        &[("path", "/tmp/api"), ("recursive", "true")],
        None,
    )
    .await;
    assert!((200..300).contains(&status), "{host:?}: {removed}");
    let seen = server.exec(&id, "find /tmp -mindepth 1 -maxdepth 1").await;
    assert!(!out(&seen).contains("api"), "{host:?}: {seen}");
    // A recursive removal of the home stops at the persistent mounts inside it: the
    // workspace is never reached through the runtime.
    let (status, _) = put(&server, &id, "kept.txt", "the user's").await;
    assert_eq!(status, 201, "{host:?}");
    let (status, refused) = call(
        &server,
        Method::DELETE,
        &id,
        "",
        &[("path", "/home/gem"), ("recursive", "true")],
        None,
    )
    .await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (403, &json!("mount_crossing_refused")),
        "{host:?}: {refused}"
    );
    let (status, kept) = get(&server, &id, "kept.txt").await;
    assert_eq!((status, kept.as_str()), (200, "the user's"), "{host:?}");
}

async fn the_image_tree_is_readable_and_refuses_what_uid_1000_may_not_do(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // What a command reads, the API reads.
    let inside = server.exec(&id, "cat /etc/passwd").await;
    let (status, body) = get(&server, &id, "/etc/passwd").await;
    assert_eq!(status, 200, "{host:?}: {body}");
    assert_eq!(body, out(&inside), "{host:?}");
    // Links of the image are followed inside it (`/bin` may be `usr/bin`).
    let (status, listing) = call(
        &server,
        Method::GET,
        &id,
        "/list",
        &[("path", "/bin")],
        None,
    )
    .await;
    assert_eq!(status, 200, "{host:?}: {listing}");
    assert!(
        listing["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == "/bin/sh"),
        "{host:?}: {listing}"
    );
    let (status, described) =
        call(&server, Method::GET, &id, "/stat", &[("path", "/")], None).await;
    assert_eq!(
        (status, &described["kind"]),
        (200, &json!("dir")),
        "{host:?}: {described}"
    );
    // The runtime's own permissions decide, as for a command: refused (by the file's
    // mode, or by a read-only image tree), and nothing changed.
    let denied = |refused: &serde_json::Value| {
        refused["error"]["code"] == "permission_denied" || refused["error"]["code"] == "read_only"
    };
    let before = server.exec(&id, "md5sum /etc/passwd").await;
    let (status, refused) = put(&server, &id, "/etc/passwd", "root::0:0::/:/bin/sh\n").await;
    assert!(status == 403 && denied(&refused), "{host:?}: {refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("/etc/passwd: "),
        "{host:?}: {refused}"
    );
    for (method, route, query, body) in [
        (Method::DELETE, "", vec![("path", "/etc/passwd")], None),
        (
            Method::POST,
            "/mkdir",
            vec![],
            Some(json!({"path": "/etc/warren-was-here"})),
        ),
        (
            Method::POST,
            "/move",
            vec![],
            Some(json!({"from": "/etc/passwd", "to": "/etc/passwd.old"})),
        ),
    ] {
        let (status, refused) = call(&server, method, &id, route, &query, body).await;
        assert!(
            status == 403 && denied(&refused),
            "{host:?}: {route} {refused}"
        );
    }
    let after = server
        .exec(
            &id,
            "md5sum /etc/passwd; test -e /etc/warren-was-here || echo No such file",
        )
        .await;
    assert!(
        out(&after).starts_with(&out(&before)) && out(&after).contains("No such file"),
        "{host:?}: {after}"
    );
    // Procfs is never served: the process serving a file is of the runtime's machinery.
    for path in [
        "/proc/self/environ",
        "/proc/self/mem",
        "/proc/1/environ",
        "/dev/fd/0",
    ] {
        let (status, body) = get(&server, &id, path).await;
        assert!(
            (400..=404).contains(&status) && !body.contains("WARREN"),
            "{host:?}: {path} answered {status}: {body}"
        );
    }
    // A directory only root may enter stays closed.
    server.exec(&id, "true").await;
    let (status, body) = get(&server, &id, "/root/.profile").await;
    assert!(
        status == 403 || status == 404,
        "{host:?}: /root answered {status}: {body}"
    );
    // The runtime's root itself is never removed or moved.
    let (status, refused) = call(
        &server,
        Method::DELETE,
        &id,
        "",
        &[("path", "/"), ("recursive", "true")],
        None,
    )
    .await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (403, &json!("root_refused")),
        "{host:?}: {refused}"
    );
}

async fn links_inside_the_runtime_never_leave_its_root(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // A secret on the host, at a path the runtime does not have.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("dir")).unwrap();
    std::fs::write(outside.path().join("dir/secret.txt"), HOST_SECRET).unwrap();
    let host_dir = outside.path().join("dir").display().to_string();
    let data_dir = server.data_dir().display().to_string();
    let made = server
        .exec(
            &id,
            &format!(
                "mkdir -p /tmp/l && cd /tmp/l && ln -s / root && ln -s /proc/1/root proc1 && \
                 ln -s /proc/self/root self && ln -s ../../../../../.. up && \
                 ln -s {host_dir} host && ln -s {data_dir} data && ln -s loop2 loop1 && \
                 ln -s loop1 loop2 && echo inside > /tmp/l/mine && echo ok"
            ),
        )
        .await;
    assert_eq!(out(&made), "ok\n", "{host:?}: {made}");
    let paths = [
        "/tmp/l/host/secret.txt",
        "/tmp/l/root/tmp/l/host/secret.txt",
        "/tmp/l/up/tmp/l/host/secret.txt",
        "/tmp/l/proc1/tmp/l/host/secret.txt",
        "/tmp/l/proc1/etc/hostname",
        "/tmp/l/self/tmp/l/host/secret.txt",
        "/tmp/l/data/runtimes",
        "/tmp/l/loop1",
        &format!("/proc/1/root{host_dir}/secret.txt"),
        &format!("{host_dir}/secret.txt"),
    ];
    for path in paths {
        for (method, route, query, body) in [
            (Method::GET, "", vec![("path", path)], None),
            (Method::GET, "/stat", vec![("path", path)], None),
            (
                Method::GET,
                "/list",
                vec![("path", path), ("depth", "3")],
                None,
            ),
            (
                Method::POST,
                "/grep",
                vec![],
                Some(json!({"path": path, "pattern": "SECRET"})),
            ),
            (Method::PUT, "", vec![("path", path)], None),
            (
                Method::DELETE,
                "",
                vec![("path", path), ("recursive", "true")],
                None,
            ),
        ] {
            let (status, answer) = call(&server, method.clone(), &id, route, &query, body).await;
            let text = answer.to_string();
            assert!(
                !text.contains(HOST_SECRET) && !text.contains(&data_dir),
                "{host:?}: {method} {route} {path} reached the host: {text}"
            );
            // Refused, or done inside the runtime (a write through a link to a path the
            // runtime lacks makes that path in the runtime, as `mkdir -p` and a
            // redirection would): never a server error.
            assert!(
                status < 500,
                "{host:?}: {method} {route} {path}: {status} {text}"
            );
        }
        // Whatever the API sees there, a command sees.
        let (status, body) = get(&server, &id, path).await;
        let inside = server.exec_with(&id, json!({"argv": ["cat", path]})).await;
        assert_eq!(
            status == 200,
            inside["exit_code"] == 0,
            "{host:?}: {path}: the API answered {status} {body}, a command {inside}"
        );
        if status == 200 {
            assert_eq!(body, out(&inside), "{host:?}: {path}");
        }
    }
    // Nothing on the host changed, and the links themselves are what a delete removed.
    assert_eq!(
        std::fs::read_to_string(outside.path().join("dir/secret.txt")).unwrap(),
        HOST_SECRET
    );
    // Links that stay inside resolve inside: `..` past the root and `/proc/self/root` are
    // the runtime's own root, as for a command.
    for path in ["/tmp/l/up/etc/hostname", "/tmp/l/self/etc/hostname"] {
        let (status, body) = get(&server, &id, path).await;
        let inside = server.exec(&id, "cat /etc/hostname").await;
        assert_eq!((status, body), (200, out(&inside)), "{host:?}: {path}");
    }
}

/// Opens a `/v1` watch of `path` (recursive) and reads up to its `start` event.
async fn watch(server: &TestServer, id: &str, path: &str) -> reqwest::Response {
    let mut response = server
        .request(Method::GET, &format!("/v1/sandboxes/{id}/watch"))
        .query(&[("path", path), ("recursive", "true")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{path}");
    let started = watch_until(&mut response, |e| e["type"] == "start").await;
    assert_eq!(started[0]["path"], path, "{started:?}");
    response
}

async fn a_watch_of_tmp_sees_commands_and_the_api_and_ends_with_its_directory(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "mkdir -p /tmp/w/sub").await;
    let mut events = watch(&server, &id, "/tmp/w").await;
    // What a command does, in a subdirectory too.
    server.exec(&id, "echo x > /tmp/w/sub/made.txt").await;
    watch_until(&mut events, |e| {
        e["type"] == "create" && e["name"] == "sub/made.txt"
    })
    .await;
    // What the API writes shows as the file, never as the agent's temporary name.
    let (status, _) = put(&server, &id, "/tmp/w/api.txt", "y").await;
    assert_eq!(status, 201, "{host:?}");
    let seen = watch_until(&mut events, |e| {
        e["type"] == "write" && e["name"] == "api.txt"
    })
    .await;
    assert!(
        seen.iter()
            .all(|e| !e["name"].as_str().unwrap_or("").contains(".warren")),
        "{host:?}: {seen:?}"
    );
    // A move within the watch is the old name renamed and the new one made.
    server
        .exec(&id, "mv /tmp/w/api.txt /tmp/w/sub/moved.txt")
        .await;
    let seen = watch_until(&mut events, |e| {
        e["type"] == "create" && e["name"] == "sub/moved.txt"
    })
    .await;
    assert!(
        seen.iter()
            .any(|e| e["type"] == "rename" && e["name"] == "api.txt"),
        "{host:?}: {seen:?}"
    );
    // The directory going away ends the stream with why.
    server.exec(&id, "rm -r /tmp/w").await;
    let ended = watch_until(&mut events, |e| e["type"] == "error").await;
    assert_eq!(
        ended.last().unwrap()["error"]["code"],
        "watched_dir_gone",
        "{host:?}: {ended:?}"
    );
    // What uid 1000 may not list it may not watch; what is not there is not found;
    // procfs is never served.
    server
        .exec(&id, "mkdir /tmp/closed && chmod 0 /tmp/closed")
        .await;
    for (path, code) in [
        ("/tmp/closed", "permission_denied"),
        ("/tmp/none", "not_found"),
        ("/proc/self", "permission_denied"),
    ] {
        let response = server
            .request(Method::GET, &format!("/v1/sandboxes/{id}/watch"))
            .query(&[("path", path)])
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        assert_ne!(status, 200, "{host:?}: {path} is watched");
        let refused: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            (status, &refused["error"]["code"]),
            (if code == "not_found" { 404 } else { 403 }, &json!(code)),
            "{host:?}: {path}: {refused}"
        );
    }
}

async fn a_runtime_path_starts_the_runtime_and_never_outlives_its_sandbox(host: Host) {
    let server = host.start_with(&["--idle-timeout", "1", "--reap-interval", "1"]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, _) = put(&server, &id, "/tmp/scratch", "gone with the runtime").await;
    assert_eq!(status, 201, "{host:?}");
    // A watch of the runtime's files lists them all along, yet neither keeps the runtime
    // up nor brings it back: it ends when the runtime is reaped.
    let mut events = watch(&server, &id, "/tmp").await;
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(20))
            .await,
        "{host:?}: an idle runtime was not reaped"
    );
    let ended = watch_until(&mut events, |e| e["type"] == "error").await;
    assert_eq!(
        ended.last().unwrap()["error"]["code"],
        "runtime_stopped",
        "{host:?}: {ended:?}"
    );
    assert_eq!(server.sandbox_state(&id).await, "stopped", "{host:?}");
    // A reaped runtime comes back for a runtime path (I12); its /tmp did not survive.
    let (status, body) = get(&server, &id, "/tmp/scratch").await;
    assert_eq!(status, 404, "{host:?}: {body}");
    assert_eq!(server.sandbox_state(&id).await, "running", "{host:?}");
    // A terminated sandbox's runtime paths are gone with it, and say so.
    server.terminate(&id).await;
    let (status, body) = get(&server, &id, "/tmp/scratch").await;
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("sandbox_terminated")),
        "{host:?}: {body}"
    );
}

on_every_host!(
    files_under_tmp_are_written_read_listed_moved_and_removed_as_uid_1000,
    a_watch_of_tmp_sees_commands_and_the_api_and_ends_with_its_directory,
    the_image_tree_is_readable_and_refuses_what_uid_1000_may_not_do,
    a_runtime_path_starts_the_runtime_and_never_outlives_its_sandbox,
);

/// The simulated kubelet runs a pod on the host's own root (no image of its own), so a
/// host path is there for a command too: the rule needs a runtime with a root of its own.
mod links {
    use super::*;

    rules_on!(
        local,
        Local,
        [links_inside_the_runtime_never_leave_its_root]
    );
    rules_on!(
        docker,
        Docker,
        [links_inside_the_runtime_never_leave_its_root]
    );
    rules_on!(
        local_gvisor,
        LocalGvisor,
        [links_inside_the_runtime_never_leave_its_root]
    );
    rules_on!(
        docker_gvisor,
        DockerGvisor,
        [links_inside_the_runtime_never_leave_its_root]
    );
}

/// MCP's file tools take the same paths (issue 42): `/tmp` is the runtime's own.
#[tokio::test]
async fn the_mcp_file_tools_read_and_write_the_runtime_s_tmp() {
    let server = Host::Local.start();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mut mcp = warren_test_support::McpSession::open(&server, &id).await;
    let written = mcp
        .call_tool(
            "write_file",
            json!({"path": "/tmp/mcp/note.txt", "content": "one\ntwo\n"}),
        )
        .await;
    assert_eq!(written["result"]["isError"], false, "{written}");
    let seen = server.exec(&id, "cat /tmp/mcp/note.txt").await;
    assert_eq!(out(&seen), "one\ntwo\n");
    let read = mcp
        .call_tool("read_file", json!({"path": "/tmp/mcp/note.txt"}))
        .await;
    let text = read["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("1\tone") && text.contains("2\ttwo"), "{read}");
    let listed = mcp.call_tool("ls", json!({"path": "/tmp/mcp"})).await;
    let text = listed["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("note.txt"), "{listed}");
    // watch_files waits for changes in the runtime's /tmp as well.
    let writer = super::WriteEvery::start(&server, &id, "/tmp/mcp");
    let watched = mcp
        .call_tool("watch_files", json!({"path": "/tmp/mcp", "timeout_s": 20}))
        .await;
    writer.stop().await;
    assert_eq!(watched["result"]["isError"], false, "{watched}");
    let text = watched["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("new-") && text.contains("/tmp/mcp"),
        "{watched}"
    );
}
