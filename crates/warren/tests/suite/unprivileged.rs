//! The local runtime run by an unprivileged user: a user namespace maps the sandbox user
//! 1000:1000 to warren's own ids; no cgroups, and /health says so.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::{bin, output as out};

const NOBODY: u32 = 65534;

#[tokio::test]
async fn an_unprivileged_warren_runs_isolated_commands_and_says_what_it_cannot_enforce() {
    let server = TestServer::start_unprivileged(bin(), NOBODY, NOBODY);
    let (_, health) = server
        .send_json(server.anonymous(Method::GET, "/health"))
        .await;
    let warnings = health["warnings"].to_string();
    assert!(warnings.contains("unprivileged mode"), "{health}");
    assert!(
        warnings.contains("memory limits are not enforced"),
        "{health}"
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server
        .exec(&id, "id -u; id -g; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; echo made > made.txt")
        .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    let text = out(&result);
    assert!(text.starts_with("1000\n1000\n"), "{text}");
    assert!(
        text.contains("CapEff:\t0000000000000000") && text.contains("CapBnd:\t0000000000000000"),
        "{text}"
    );
    assert!(
        text.contains("NoNewPrivs:\t1") && text.contains("Seccomp:\t2"),
        "{text}"
    );
    let made = server.workspace_of("alice").join("projects/a/made.txt");
    let meta = std::fs::metadata(&made).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (NOBODY, NOBODY),
        "1000 inside is warren's own user outside"
    );

    for attempt in [
        "cat /etc/shadow",
        "mkdir -p /tmp/m && mount -t tmpfs x /tmp/m",
        "unshare -Ur id",
        "python3 -c 'import socket; socket.create_connection((\"10.0.0.1\", 80), timeout=2)'",
    ] {
        let result = server.exec(&id, attempt).await;
        assert_ne!(result["exit_code"], 0, "{attempt}: {}", out(&result));
    }
    server.exec(&id, "echo kept > /tmp/state").await;
    assert_eq!(server.exec(&id, "cat /tmp/state").await["stdout"], "kept\n");

    let started = Instant::now();
    let timed = server
        .exec_with(&id, json!({"command": "sleep 300", "timeout_s": 1}))
        .await;
    assert_eq!(timed["timed_out"], true, "{timed}");
    assert!(started.elapsed() < Duration::from_secs(10));

    server.terminate(&id).await;
    assert!(!server.data_dir().join("runtimes").join(&id).exists());
    assert!(made.exists(), "workspace files stay (I15)");
}
