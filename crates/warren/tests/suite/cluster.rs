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
        let out = warren_test_support::run_to_exit(
            bin(),
            &[
                "serve",
                "--backend",
                "memory",
                "--data-dir",
                data.path().to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                flag,
                value,
            ],
            &[("WARREN_TOKEN", warren_test_support::TEST_TOKEN)],
        );
        assert!(!out.status.success(), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(words) && stderr.contains("--node-id, --advertise, [cluster]"),
            "{flag}: {stderr}"
        );
    }
}
