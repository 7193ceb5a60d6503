//! One data directory, one server: a second `warren serve` on a taken data directory or a
//! taken port fails before it reconciles, adopts or destroys anything.

use warren_test_support::{run_to_exit, TestServer, TEST_TOKEN};

use super::{bin, output};

/// The names in a directory, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_second_server_on_the_same_data_directory_is_refused_naming_the_first_and_touches_nothing(
) {
    let server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    // State only the live runtime has: a second server that destroyed or replaced the
    // runtime would lose it.
    let first = server.exec(&id, "echo alive > /tmp/marker").await;
    assert_eq!(first["exit_code"], 0, "{first}");
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    let second = run_to_exit(
        bin(),
        &[
            "serve",
            "--backend",
            "local",
            "--data-dir",
            &data_dir,
            "--listen",
            "127.0.0.1:0",
        ],
        &[("WARREN_TOKEN", TEST_TOKEN), ("WARREN_LOG", "info")],
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second server ran: {stderr}");
    assert!(
        stderr.contains("is in use by warren serve")
            && stderr.contains(&format!("pid {}", server.pid()))
            && stderr.contains(server.url.trim_start_matches("http://")),
        "the refusal does not name the holder: {stderr}"
    );
    assert!(
        !stderr.contains("reconciled"),
        "the second server reconciled before it was refused: {stderr}"
    );
    let again = server.exec(&id, "cat /tmp/marker").await;
    assert_eq!(output(&again).trim(), "alive", "{again}");
}

#[tokio::test]
async fn a_server_on_a_taken_port_fails_before_it_touches_its_data_directory() {
    let server = TestServer::start(bin());
    let taken = server.url.trim_start_matches("http://").to_owned();
    let fresh = tempfile::tempdir().unwrap();
    let data_dir = fresh.path().join("data");
    let second = run_to_exit(
        bin(),
        &[
            "serve",
            "--backend",
            "memory",
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--listen",
            &taken,
        ],
        &[("WARREN_LOG", "info")],
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success(),
        "it served on a taken port: {stderr}"
    );
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    // No token generated, no state store opened, nothing reconciled: only the lock file.
    assert_eq!(names(&data_dir), ["serve.lock"], "{stderr}");
}

#[tokio::test]
async fn a_killed_server_leaves_no_lock_behind_and_its_successor_adopts_the_runtime() {
    let mut server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo alive > /tmp/marker").await;
    // SIGKILL: no chance to unlock. The kernel drops the lock with the process, and the
    // runtime (which outlives the server) must not have inherited it.
    server.restart_after_kill();
    let again = server.exec(&id, "cat /tmp/marker").await;
    assert_eq!(output(&again).trim(), "alive", "{again}");
}
