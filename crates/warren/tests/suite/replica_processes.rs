//! Processes in a cluster (issue 32): a process lives on the node that owns its runtime,
//! and every call on it through any other replica is forwarded there: start, stdin, the
//! output followed and resumed, a terminal's resize, the WebSocket attach, kill and the
//! listing. Two replicas on one PostgreSQL store, real processes with the native runtime.

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use warren_test_support::TestServer;

use super::processes::{bytes_of, follow, output_until, pid_of, post, start, stdin};
use super::replicas::{exec, processes_with, Cluster};
use super::watch_until;

async fn get(server: &TestServer, path: &str) -> (u16, Value) {
    server.send_json(server.request(Method::GET, path)).await
}

/// Reads an NDJSON output stream until its bytes hold `needle`; the bytes.
async fn stream_until(response: &mut reqwest::Response, needle: &str) -> Vec<u8> {
    let mut text = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&bytes_of(&events(&text))).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            String::from_utf8_lossy(&text)
        );
        let chunk = tokio::time::timeout(Duration::from_secs(30), response.chunk())
            .await
            .expect("output within the wait")
            .unwrap()
            .expect("the stream goes on");
        text.extend_from_slice(&chunk);
    }
    bytes_of(&events(&text))
}

/// A sandbox of alice's whose runtime the first replica owns: its first command ran there.
async fn owned_by_the_first(cluster: &Cluster) -> String {
    let first = &cluster.nodes[0];
    let sandbox = first.sandbox("alice", "one", "projects/one").await;
    let (status, _) = exec(first, &sandbox, "true").await;
    assert_eq!(status, 200);
    assert_eq!(cluster.owner(&sandbox), "node-0 1");
    sandbox
}

fn events(ndjson: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(ndjson)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reached_through_any_replica_lives_at_its_runtimes_owner() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let sandbox = owned_by_the_first(&cluster).await;

    // Started through node-1, the process runs at node-0, which owns the runtime.
    let cat = start(
        b,
        &sandbox,
        json!({"argv": ["cat"], "stdin": true, "tag": "echo"}),
    )
    .await;
    let pid = pid_of(&cat);
    assert_eq!(cluster.owner(&sandbox), "node-0 1");
    let (status, at_owner) = get(a, &format!("/v1/sandboxes/{sandbox}/processes/{pid}")).await;
    assert_eq!(status, 200, "{at_owner}");
    assert_eq!(at_owner["tag"], "echo");

    // Stdin and output through node-1; a reader that leaves comes back with nothing lost
    // or repeated.
    let (status, written) = stdin(b, &sandbox, pid, "one\n").await;
    assert_eq!((status, written["written"].as_u64()), (200, Some(4)));
    let mut reader = b
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{sandbox}/processes/{pid}/output?from=0"),
        )
        .header("accept", "application/x-ndjson")
        .send()
        .await
        .unwrap();
    assert_eq!(reader.status(), 200);
    let first = stream_until(&mut reader, "one\n").await;
    assert_eq!(first, b"one\n");
    drop(reader);
    assert_eq!(stdin(a, &sandbox, pid, "two\n").await.0, 200);
    assert_eq!(
        post(b, &sandbox, pid, "stdin/close", json!({})).await,
        204,
        "closing stdin through node-1"
    );
    let rest = follow(b, &sandbox, pid, first.len() as u64).await;
    assert_eq!(bytes_of(&rest), b"two\n");
    let end = rest.last().unwrap();
    assert_eq!(end["type"], "end", "{rest:?}");
    assert_eq!(end["process"]["exit_code"], 0, "{end}");

    // A terminal through node-1: resized, and attached over a WebSocket.
    let shell = start(
        b,
        &sandbox,
        json!({"command": "exec sh -i", "pty": {"cols": 80, "rows": 24}, "stdin": true}),
    )
    .await;
    let shell = pid_of(&shell);
    assert_eq!(
        post(b, &sandbox, shell, "resize", json!({"cols": 61, "rows": 7})).await,
        204
    );
    let mut request = format!(
        "{}/v1/sandboxes/{sandbox}/processes/{shell}/attach",
        b.url.replacen("http://", "ws://", 1)
    )
    .into_client_request()
    .unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", b.token).parse().unwrap(),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("attached through node-1");
    socket
        .send(Message::Binary(
            b"stty size; echo x-$((2+3))\n".to_vec().into(),
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("x-5\r\n") {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("output within the wait")
            .unwrap()
            .unwrap();
        if let Message::Binary(bytes) = message {
            seen.extend_from_slice(&bytes);
        }
    }
    assert!(
        String::from_utf8_lossy(&seen).contains("7 61\r\n"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
    socket.close(None).await.unwrap();
    output_until(a, &sandbox, shell, "x-5\r\n").await;

    // Killed through node-1: its tree is gone at the owner.
    let marker = "3917.5";
    let sleeper = start(
        b,
        &sandbox,
        json!({"command": format!("sleep {marker} & sleep {marker}")}),
    )
    .await;
    let sleeper = pid_of(&sleeper);
    let (status, killed) = b
        .send_json(b.request(
            Method::POST,
            &format!("/v1/sandboxes/{sandbox}/processes/{sleeper}/kill"),
        ))
        .await;
    assert_eq!(status, 200, "{killed}");
    assert_eq!(killed["signal"], 9, "{killed}");
    assert!(processes_with(&format!("sleep {marker}")).is_empty());

    // Listed alike through both replicas; one run record per process, at the owner.
    let mut expected = vec![pid, shell, sleeper];
    expected.sort_unstable();
    for server in [a, b] {
        let (status, list) = get(server, &format!("/v1/sandboxes/{sandbox}/processes")).await;
        assert_eq!(status, 200, "{list}");
        let mut pids: Vec<i64> = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(pid_of)
            .collect();
        pids.sort_unstable();
        assert_eq!(pids, expected);
    }
    let runs = cluster.runs(&sandbox);
    let cats: Vec<&String> = runs
        .iter()
        .filter(|r| r.starts_with("[\"cat\"]|"))
        .collect();
    assert_eq!(cats.len(), 1, "{runs:?}");
    assert!(cats[0].ends_with("|finished||node-0"), "{runs:?}");

    // A pid the owner does not hold is not found through either replica.
    let (status, missing) = get(b, &format!("/v1/sandboxes/{sandbox}/processes/999999")).await;
    assert_eq!(
        (status, missing["error"]["code"].as_str()),
        (404, Some("process_not_found"))
    );
}

#[tokio::test]
async fn the_process_routes_between_replicas_need_the_cluster_key_and_never_forward_again() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let sandbox = owned_by_the_first(&cluster).await;
    let cat = start(a, &sandbox, json!({"argv": ["cat"], "stdin": true})).await;
    let pid = pid_of(&cat);
    let http = reqwest::Client::new();
    let internal = |node: &TestServer, what: &str| {
        format!(
            "{}/internal/v1/sandboxes/{sandbox}/processes/{what}",
            node.url
        )
    };
    let calls = |node: &TestServer, auth: Option<&str>| {
        let with = |request: reqwest::RequestBuilder| match auth {
            Some(auth) => request.bearer_auth(auth),
            None => request,
        };
        [
            with(
                http.post(internal(node, "call"))
                    .json(&json!({"call": "kill", "pid": pid})),
            ),
            with(http.get(internal(node, &format!("{pid}/follow?from=0")))),
            with(
                http.post(internal(node, &format!("{pid}/stdin?close=true")))
                    .body("x"),
            ),
        ]
    };
    // Neither no key nor the provisioner token opens them.
    for auth in [None, Some(warren_test_support::TEST_TOKEN)] {
        for request in calls(a, auth) {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "{auth:?}");
        }
    }
    assert_eq!(
        stdin(a, &sandbox, pid, "still open\n").await.0,
        200,
        "nothing reached the process"
    );
    // With the key, a replica that does not own the runtime refuses rather than forward
    // again: the caller asks the store.
    for request in calls(b, Some(super::replicas::CLUSTER_KEY)) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let refused = status == 409 || text.contains("\"not_owner\"");
        assert!(refused, "{status} {text}");
    }
    let (status, info) = get(a, &format!("/v1/sandboxes/{sandbox}/processes/{pid}")).await;
    assert_eq!(
        (status, info["status"].as_str()),
        (200, Some("running")),
        "{info}"
    );
}

/// A persistent shell lives in the process of the node that owns the runtime: the AIO
/// shell through another replica is refused with 503 `runtime_elsewhere` (retry on the
/// owner), the same status class as on `/v1`, never the caller's mistake (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aio_shell_through_a_replica_that_does_not_own_the_runtime_is_unavailable() {
    const KEY: &str = "deerflow-key-0123456789abcdef0123456789abcdef";
    let cluster = Cluster::start_configured(2, &format!("[deerflow]\napi_key = \"{KEY}\"\n"));
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let http = reqwest::Client::new();
    let (status, created) = a
        .send_json(
            http.post(format!("{}/deerflow/api/sandboxes", a.url))
                .header("X-API-Key", KEY)
                .json(&json!({"sandbox_id": "5e55101d", "thread_id": "t", "user_id": "alice"})),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let at_a = created["sandbox_url"].as_str().unwrap().to_owned();
    let at_b = at_a.replacen(&a.url, &b.url, 1);
    assert_ne!(at_a, at_b, "{at_a}");
    // The first shell command starts the runtime at node-0.
    let (status, ran) = a
        .send_json(
            http.post(format!("{at_a}/v1/shell/exec"))
                .json(&json!({"command": "echo here"})),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    let (status, refused) = b
        .send_json(
            http.post(format!("{at_b}/v1/shell/exec"))
                .json(&json!({"command": "echo there"})),
        )
        .await;
    assert_eq!(status, 503, "{refused}");
    assert!(refused.to_string().contains("node-0"), "{refused}");
}

/// A runtime's own files (issue 42) live where its runtime runs: through any replica, a
/// file under `/tmp` is written, read, listed and removed at the owner's runtime, what a
/// command there sees; a refusal inside comes back as the same error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_files_through_a_replica_that_does_not_own_the_runtime_are_served_at_its_owner() {
    let cluster = Cluster::start(2);
    let sandbox = owned_by_the_first(&cluster).await;
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let files = format!("/v1/sandboxes/{sandbox}/files");
    let (status, written) = b
        .send_json(
            b.request(Method::PUT, &files)
                .query(&[("path", "/tmp/through-b/x.txt")])
                .body("written through node-1"),
        )
        .await;
    assert_eq!(status, 201, "{written}");
    let (status, ran) = exec(a, &sandbox, "cat /tmp/through-b/x.txt").await;
    assert_eq!(
        (status, ran["stdout"].as_str()),
        (200, Some("written through node-1")),
        "{ran}"
    );
    let read = b
        .request(Method::GET, &files)
        .query(&[("path", "/tmp/through-b/x.txt")])
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    assert_eq!(read.text().await.unwrap(), "written through node-1");
    let (status, listed) = get(b, &format!("{files}/list?path=/tmp/through-b")).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["entries"][0]["path"], "/tmp/through-b/x.txt",
        "{listed}"
    );
    // A watch through node-1 lists the owner's runtime: a command there shows.
    let mut watch = b
        .request(Method::GET, &format!("/v1/sandboxes/{sandbox}/watch"))
        .query(&[("path", "/tmp/through-b")])
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    watch_until(&mut watch, |e| e["type"] == "start").await;
    exec(a, &sandbox, "echo y > /tmp/through-b/y.txt").await;
    watch_until(&mut watch, |e| {
        e["type"] == "create" && e["name"] == "y.txt"
    })
    .await;
    drop(watch);
    let (status, refused) = b
        .send_json(
            b.request(Method::PUT, &files)
                .query(&[("path", "/etc/passwd")])
                .body("x"),
        )
        .await;
    assert_eq!(status, 403, "{refused}");
    let (status, _) = b
        .send_json(
            b.request(Method::DELETE, &files)
                .query(&[("path", "/tmp/through-b"), ("recursive", "true")]),
        )
        .await;
    assert_eq!(status, 204);
    let (_, ran) = exec(a, &sandbox, "test -e /tmp/through-b || echo gone").await;
    assert_eq!(ran["stdout"], "gone\n", "{ran}");
    // The runtime stayed at its owner.
    assert_eq!(cluster.owner(&sandbox), "node-0 1");
}
