//! Cluster membership (issue 14, first part): each server registers its node in the state
//! store with a lease it renews, a restart takes a new epoch, a clean stop is recorded as
//! leaving, and `GET /v1/cluster` lists them all by the store's clock.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;
use warren_test_support::TestServer;

use super::bin;

async fn cluster(server: &TestServer) -> Value {
    let (status, body) = server
        .send_json(server.request(Method::GET, "/v1/cluster"))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn node<'a>(cluster: &'a Value, id: &str) -> &'a Value {
    cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["node_id"] == id)
        .unwrap_or_else(|| panic!("{id} is not listed: {cluster}"))
}

/// `warren serve --backend memory` on `data` with `extra` flags, for a start that is
/// expected to fail: its exit status and output.
fn serve_until_it_exits(data: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "serve",
        "--backend",
        "memory",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    warren_test_support::run_to_exit(
        bin(),
        &args,
        &[("WARREN_TOKEN", warren_test_support::TEST_TOKEN)],
    )
}

#[tokio::test]
async fn a_server_registers_its_node_and_a_restart_takes_a_new_epoch() {
    let mut server = TestServer::start_with(
        bin(),
        &[
            "--backend",
            "memory",
            "--node-id",
            "warren-a",
            "--advertise",
            "http://10.9.0.1:7878",
        ],
    );
    let first = cluster(&server).await;
    assert_eq!(first["node_id"], "warren-a", "{first}");
    let me = node(&first, "warren-a");
    assert_eq!(
        (&me["state"], &me["epoch"], &me["advertise"]),
        (
            &Value::from("live"),
            &Value::from(1),
            &Value::from("http://10.9.0.1:7878")
        ),
        "{first}"
    );
    assert!(me["left_at"].is_null(), "{first}");
    // Killed without leaving: the next process of the same node takes epoch 2, which
    // supersedes the first (whose lease could no longer be renewed).
    server.restart_after_kill();
    let again = cluster(&server).await;
    assert_eq!(node(&again, "warren-a")["epoch"], 2, "{again}");
    assert_eq!(node(&again, "warren-a")["state"], "live", "{again}");
}

#[tokio::test]
async fn the_lease_is_renewed_every_third_of_its_ttl() {
    let config = super::write_config("[cluster]\nnode_id = \"renewing\"\nnode_ttl_s = 3\n");
    let server = TestServer::start_with(
        bin(),
        &[
            "--backend",
            "memory",
            "--config",
            config.path().to_str().unwrap(),
        ],
    );
    let before = cluster(&server).await;
    let renewed_at = node(&before, "renewing")["renewed_at"].clone();
    // Renewed after ~1 s; 2.5 s leaves room for a slow tick, and stays inside the TTL.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = cluster(&server).await;
    let me = node(&after, "renewing");
    assert_eq!(me["state"], "live", "{after}");
    assert_eq!(me["epoch"], 1, "renewed, not registered again: {after}");
    assert_ne!(
        me["renewed_at"], renewed_at,
        "the lease was not renewed: {after}"
    );
    assert!(
        me["expires_at"].as_str().unwrap() > me["renewed_at"].as_str().unwrap(),
        "{after}"
    );
}

#[tokio::test]
async fn a_node_that_stops_cleanly_is_listed_as_left_by_the_next_server_on_the_database() {
    let postgres = super::state_postgres::shared_postgres();
    let url = postgres.fresh_database();
    let first = TestServer::start_with(
        bin(),
        &["--backend", "memory", "--state", &url, "--node-id", "first"],
    );
    assert_eq!(node(&cluster(&first).await, "first")["state"], "live");
    let pid = first.pid();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopped = Instant::now();
    while !super::reaper::has_exited(pid) {
        assert!(
            stopped.elapsed() < Duration::from_secs(15),
            "the server did not stop after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = TestServer::start_with(
        bin(),
        &[
            "--backend",
            "memory",
            "--state",
            &url,
            "--node-id",
            "second",
        ],
    );
    let listed = cluster(&second).await;
    assert_eq!(listed["node_id"], "second");
    let gone = node(&listed, "first");
    assert_eq!(gone["state"], "left", "{listed}");
    assert!(gone["left_at"].is_string(), "{listed}");
    assert_eq!(node(&listed, "second")["state"], "live", "{listed}");
    drop(first);
}

#[test]
fn a_bad_node_id_or_advertise_url_stops_the_server_with_a_message_naming_the_setting() {
    for (flag, value, words) in [
        ("--node-id", "not a node", "node id"),
        ("--advertise", "10.0.0.1:7878", "advertise URL"),
    ] {
        let data = tempfile::tempdir().unwrap();
        let out = serve_until_it_exits(data.path(), &[flag, value]);
        assert!(!out.status.success(), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(words) && stderr.contains("--node-id, --advertise, [cluster]"),
            "{flag}: {stderr}"
        );
    }
}

/// `--workspace-dir` (issue 14): the shared trees (UserWorkspaces, skill projections,
/// artifacts, local snapshots, the Viewer's key) live there and nothing of them in the data
/// directory, so another node with its own data directory on the same state store serves
/// the same files and starts the sandbox's next runtime over them.
#[tokio::test]
async fn a_separate_workspace_directory_holds_the_shared_trees_and_another_node_serves_them() {
    let postgres = super::state_postgres::shared_postgres();
    let url = postgres.fresh_database();
    let shared = tempfile::tempdir().unwrap();
    let shared_dir = shared.path().to_str().unwrap().to_owned();
    let args = |node: &'static str| {
        vec![
            "--backend".to_owned(),
            "local".to_owned(),
            "--state".to_owned(),
            url.clone(),
            "--workspace-dir".to_owned(),
            shared_dir.clone(),
            "--node-id".to_owned(),
            node.to_owned(),
        ]
    };
    let start = |node| {
        let args = args(node);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        TestServer::start_with(bin(), &args)
    };
    let mut first = start("first");
    let id = first.sandbox("alice", "s", "projects/p").await;
    let made = first
        .exec(&id, "echo from-the-runtime > made.txt && cat made.txt")
        .await;
    assert_eq!(made["stdout"], "from-the-runtime\n", "{made}");
    let (status, body) = first
        .send_json(
            first
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path=api.txt"),
                )
                .body("from-the-api\n"),
        )
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let workspace = shared
        .path()
        .join("user-data/shared/alice/workspace/projects/p");
    assert_eq!(
        std::fs::read_to_string(workspace.join("made.txt")).unwrap(),
        "from-the-runtime\n"
    );
    assert!(
        shared.path().join("viewer.key").is_file(),
        "the Viewer key is shared"
    );
    for node_only in [
        "user-data",
        "skill-projections",
        "artifacts",
        "snapshots",
        "viewer.key",
    ] {
        assert!(
            !first.data_dir().join(node_only).exists(),
            "{node_only} is in the node's data directory"
        );
    }
    first.kill();

    // Another node, its own data directory, the same database and workspace directory.
    let second = start("second");
    let (status, read) = second
        .send_json(second.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=made.txt"),
        ))
        .await;
    assert_eq!(status, 200, "{read}");
    let again = second.exec(&id, "cat made.txt api.txt").await;
    assert_eq!(
        again["stdout"], "from-the-runtime\nfrom-the-api\n",
        "the next runtime, on another node, sees every file: {again}"
    );
    assert_ne!(first.data_dir(), second.data_dir());
}

#[test]
fn a_workspace_directory_inside_the_data_directory_or_with_volume_quotas_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let inside = data.path().join("shared");
    let quotas = super::write_config("[quotas]\nbytes = 1073741824\n");
    let outside = tempfile::tempdir().unwrap();
    for (extra, words) in [
        (
            vec!["--workspace-dir", inside.to_str().unwrap()],
            "must not contain each other",
        ),
        (
            vec![
                "--workspace-dir",
                outside.path().to_str().unwrap(),
                "--config",
                quotas.path().to_str().unwrap(),
            ],
            "cannot be used with a separate workspace directory",
        ),
    ] {
        let out = serve_until_it_exits(data.path(), &extra);
        assert!(!out.status.success(), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(words), "{extra:?}: {stderr}");
    }
}
