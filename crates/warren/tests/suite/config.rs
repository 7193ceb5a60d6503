//! `warren.toml`: settings from a file, overridden by flags, checked at start-up.

use std::time::{Duration, Instant};

use reqwest::Method;
use warren_test_support::{run_to_exit, TestServer};

use super::{bin, write_config};

#[test]
fn a_mistake_in_the_configuration_stops_warren_with_the_line_it_is_on() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    for (text, expected) in [
        ("[lifecycle]\nidle_timeot_s = 5\n", "idle_timeot_s"),
        ("[lifecycle]\nidle_timeot_s = 5\n", "line 2"),
        (
            "backend = \"docker-ish\"\n",
            "use \"local\", \"docker\", \"kubernetes\" or \"memory\"",
        ),
        (
            "[docker]\nenabled = true\nsocket = \"/nonexistent/docker.sock\"\n",
            "cannot reach the Docker engine at /nonexistent/docker.sock",
        ),
        ("[docker]\nimage_name = \"x\"\n", "image_name"),
        ("[lifecycle]\nidle_timeout_s = 0\n", "at least 1 second"),
        ("[limits]\nmemory_bytes = 0\n", "limits.memory_bytes"),
        (
            "[exec]\ndefault_timeout_s = 100\nmax_timeout_s = 10\n",
            "above exec.max_timeout_s",
        ),
        ("rootfs = \"/x\"\nimage = \"y\"\n", "keep one"),
        (
            "[network]\ndefault = { mode = \"allowlist\", allow = [] }\n",
            "network.default",
        ),
    ] {
        let config = write_config(text);
        let out = run_to_exit(
            bin(),
            &[
                "serve",
                "--config",
                config.path().to_str().unwrap(),
                "--data-dir",
                data_dir,
                "--listen",
                "127.0.0.1:0",
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: started anyway");
        assert!(stderr.contains(expected), "{text}: {stderr}");
    }
}

#[tokio::test]
async fn the_configuration_sets_the_lifecycle_limits_and_sandbox_environment() {
    let config = write_config(
        "[lifecycle]\nidle_timeout_s = 1\nreap_interval_s = 1\n\
         [limits]\nnofile = 321\n\
         [sandbox_env]\nGREETING = \"from warren.toml\"\n",
    );
    let server = TestServer::start_with(bin(), &["--config", config.path().to_str().unwrap()]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server.exec(&id, "echo \"$GREETING\"; ulimit -n").await;
    assert_eq!(result["stdout"], "from warren.toml\n321\n", "{result}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.sandbox_state(&id).await != "stopped" {
        assert!(
            Instant::now() < deadline,
            "the file's idle timeout was not applied"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_configuration_sets_the_default_network_of_sandboxes_that_name_none() {
    let config = write_config("[network]\ndefault = { mode = \"open\" }\n");
    let server = TestServer::start_with(bin(), &["--config", config.path().to_str().unwrap()]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, info) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["network"]["mode"], "open", "{info}");
    // A request naming a policy keeps it, and naming none again joins the default.
    server.workdir("alice", "projects/b").await;
    let (status, named) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .json(&serde_json::json!({
                    "uid": "alice", "runtime_scope_id": "u", "workdir": "projects/b",
                    "network": {"mode": "none"},
                })),
        )
        .await;
    assert_eq!(
        (status, &named["network"]["mode"]),
        (201, &"none".into()),
        "{named}"
    );
    let (status, again) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .json(&serde_json::json!({
                    "uid": "alice", "runtime_scope_id": "t", "workdir": "projects/a",
                })),
        )
        .await;
    assert_eq!(status, 200, "{again}");
}

#[tokio::test]
async fn a_flag_wins_over_the_configuration() {
    let config = write_config("[lifecycle]\nidle_timeout_s = 1\nreap_interval_s = 1\n");
    let server = TestServer::start_with(
        bin(),
        &[
            "--config",
            config.path().to_str().unwrap(),
            "--idle-timeout",
            "3600",
        ],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        server.sandbox_state(&id).await,
        "running",
        "the file's idle timeout beat the flag"
    );
}
