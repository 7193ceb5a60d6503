//! The reaper and shutdown under hostile sandboxes (issue 20, items 2 and 3): a sandbox
//! holding a 1 PiB sparse file or more data than a snapshot may read never delays
//! reaping another uid's idle sandbox, SIGTERM stops the server in bounded time whatever
//! is in flight, and a fork bomb pinning the pids limit does not keep a runtime alive.

use std::time::{Duration, Instant};

use warren_test_support::TestServer;

use super::{bin, write_config};

/// Whether the process `pid` (a child of this test, so a zombie once it ends) has ended.
pub(super) fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => true,
    }
}

/// A log line without its terminal colours.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip to the end of the escape sequence (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test]
async fn a_huge_sparse_file_never_delays_reaping_another_uid_and_sigterm_still_stops_the_server() {
    // A stopping server waits 2 s at most for requests in flight; a snapshot reads at most
    // 50 MB of file data.
    let config =
        write_config("[lifecycle]\nshutdown_grace_s = 2\n[snapshots]\nmax_bytes = 50000000\n");
    let config_path = config.path().to_str().unwrap().to_owned();
    let mut server = TestServer::start_logging(
        bin(),
        &[
            "--backend",
            "local",
            "--idle-timeout",
            "4",
            "--reap-interval",
            "1",
            "--config",
            &config_path,
        ],
    );
    // Listed (and so visited by the reaper) before bob's: alice's 1 PiB sparse file, and
    // carol's /home/gem with more data than a snapshot may read.
    let sparse = server.sandbox("alice", "s", "projects/a").await;
    let slow = server.sandbox("carol", "s", "projects/c").await;
    // Erin's 10 GiB sparse file is forty times her /home/gem tmpfs: it comes back only as
    // sparse.
    let resumed = server.sandbox("erin", "s", "projects/e").await;
    let idle = server.sandbox("bob", "s", "projects/b").await;
    let made = server
        .exec(
            &sparse,
            "truncate -s 1P /home/gem/sparse && echo kept > /home/gem/note && stat -c %s /home/gem/sparse",
        )
        .await;
    assert_eq!(made["stdout"], "1125899906842624\n", "{made}");
    let made = server
        .exec(
            &slow,
            "head -c 60000000 /dev/urandom > /home/gem/dense && echo ok",
        )
        .await;
    assert_eq!(made["stdout"], "ok\n", "{made}");
    let made = server
        .exec(
            &resumed,
            "truncate -s 10G /home/gem/big && echo tail >> /home/gem/big && echo kept > /home/gem/note && echo ok",
        )
        .await;
    assert_eq!(made["stdout"], "ok\n", "{made}");
    assert_eq!(server.exec(&idle, "echo hi").await["stdout"], "hi\n");
    let idle_since = Instant::now();

    // idle_timeout 4 s + reap interval 1 s, and 6 s for bob's own snapshot (two durable
    // manifests on a shared machine), the kill and this poll. Before, it never came.
    let bound = Duration::from_secs(4 + 1 + 6);
    assert!(
        server.reaches_state(&idle, "stopped", bound).await,
        "bob's idle sandbox was not reaped within {bound:?} (state {})",
        server.sandbox_state(&idle).await
    );
    let took = idle_since.elapsed();
    assert!(
        server
            .reaches_state(&sparse, "stopped", Duration::from_secs(5))
            .await,
        "the sparse sandbox was not reaped"
    );
    // Carol's snapshot failed on the size limit; her runtime went all the same.
    assert!(
        server
            .reaches_state(&slow, "stopped", Duration::from_secs(10))
            .await,
        "the slow sandbox was not reaped"
    );
    assert!(
        server
            .reaches_state(&resumed, "stopped", Duration::from_secs(5))
            .await,
        "erin's sandbox was not reaped"
    );
    // Erin's next runtime resumes with the sparse file as it was, holes and all.
    let back = server
        .exec(
            &resumed,
            "stat -c '%s %b' /home/gem/big && tail -c 5 /home/gem/big && cat /home/gem/note",
        )
        .await;
    let stdout = back["stdout"].as_str().unwrap_or_default();
    let mut lines = stdout.lines();
    let (size, blocks) = lines
        .next()
        .and_then(|line| line.split_once(' '))
        .unwrap_or_else(|| panic!("{back}"));
    assert_eq!(size, "10737418245", "{back}");
    assert!(
        blocks.parse::<u64>().unwrap() < 1024,
        "resumed densely: {blocks} blocks"
    );
    assert_eq!(lines.collect::<Vec<_>>(), ["tail", "kept"], "{back}");
    // Alice's snapshot read no hole: it recorded a few bytes. Carol's failed on the size
    // limit, with a warning, and the reap went on.
    let log: Vec<String> = server.log_lines().iter().map(|l| plain(l)).collect();
    let about = |id: &str| -> Vec<&String> { log.iter().filter(|l| l.contains(id)).collect() };
    let sparse_lines = about(&sparse);
    let recorded = sparse_lines
        .iter()
        .find(|line| line.contains("runtime snapshot recorded"))
        .unwrap_or_else(|| panic!("no snapshot of the sparse sandbox:\n{sparse_lines:#?}"));
    let bytes: u64 = recorded
        .split_whitespace()
        .find_map(|field| field.strip_prefix("bytes="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{recorded}"));
    assert!(
        bytes < 1024 * 1024,
        "the sparse snapshot read {bytes} bytes"
    );
    eprintln!("the sparse sandbox's snapshot: {recorded}");
    let slow_lines = about(&slow);
    assert!(
        slow_lines
            .iter()
            .any(|line| line.contains("could not snapshot") && line.contains("max_bytes")),
        "no size-limit warning for the slow sandbox:\n{slow_lines:#?}"
    );
    eprintln!("bob's idle sandbox was reaped {took:?} after its last use");

    // SIGTERM while a command runs: the server stops within the grace and a margin.
    let running = server.sandbox("dave", "s", "projects/d").await;
    assert_eq!(server.exec(&running, "echo up").await["stdout"], "up\n");
    let request = server
        .request(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{running}/exec"),
        )
        .json(&serde_json::json!({"argv": ["sleep", "60"], "timeout_s": 120}))
        .send();
    let in_flight = tokio::spawn(request);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let pid = server.pid();
    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let bound = Duration::from_secs(2 + 4);
    while !has_exited(pid) && signalled.elapsed() < bound {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        has_exited(pid),
        "the server still runs {bound:?} after SIGTERM"
    );
    eprintln!("the server stopped {:?} after SIGTERM", signalled.elapsed());
    in_flight.abort();
    server.kill();
}

#[tokio::test]
async fn a_fork_bomb_pinning_the_pids_limit_with_no_command_running_is_reaped_and_files_survive() {
    // A small pids limit, so the bomb fills it at once.
    let config = write_config("[limits]\npids_max = 64\n");
    let config_path = config.path().to_str().unwrap().to_owned();
    let server = TestServer::start_with(
        bin(),
        &[
            "--backend",
            "local",
            "--idle-timeout",
            "3",
            "--reap-interval",
            "1",
            "--config",
            &config_path,
        ],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let started = server
        .exec(
            &id,
            // Every bomb process forks until a fork is refused, and then exits (sh is
            // dash); the others take its place at once. The bomb never dies out: it fills
            // the limit, dips below it and fills it again until something kills it.
            "echo kept > kept.txt; (bomb() { while :; do bomb & done; }; bomb) >/dev/null 2>&1 & exit 0",
        )
        .await;
    assert_eq!(started["exit_code"], 0, "{started}");
    let bombed = Instant::now();
    // The bomb's processes are processes, but no command runs and it can start nothing:
    // idle_timeout 3 s, reap interval 1 s, and 4 s for the pass, the kill and this poll.
    let bound = Duration::from_secs(3 + 1 + 4);
    assert!(
        server.reaches_state(&id, "stopped", bound).await,
        "the bomb kept its runtime alive for {bound:?} (state {})",
        server.sandbox_state(&id).await
    );
    eprintln!(
        "the bombed runtime was reaped {:?} after the bomb",
        bombed.elapsed()
    );
    // The workspace stays (I15), and the sandbox runs again in a fresh runtime.
    let after = server.exec(&id, "cat kept.txt; ps -e | wc -l").await;
    let stdout = after["stdout"].as_str().unwrap_or_default();
    assert!(stdout.starts_with("kept\n"), "{after}");
    let count: usize = stdout.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(count < 10, "the bomb survived the reap: {count} processes");
}

#[tokio::test]
async fn a_checkpoint_over_the_data_limit_is_refused_with_snapshot_too_large_and_a_sparse_one_is_not(
) {
    let config = write_config("[snapshots]\nmax_bytes = 1000000\n");
    let config_path = config.path().to_str().unwrap().to_owned();
    let server = TestServer::start_with(bin(), &["--backend", "local", "--config", &config_path]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let checkpoint = || {
        server.send_json(server.request(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/checkpoints"),
        ))
    };
    // 100 GiB of holes and a few bytes: far over the limit in size, not in data.
    server
        .exec(
            &id,
            "truncate -s 100G sparse.img && echo data >> sparse.img",
        )
        .await;
    let (status, body) = checkpoint().await;
    assert_eq!(status, 201, "{body}");
    server
        .exec(&id, "head -c 2000000 /dev/urandom > dense.bin")
        .await;
    let (status, body) = checkpoint().await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "snapshot_too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("dense.bin") && message.contains("max_bytes"),
        "{message}"
    );
    let (_, list) = server
        .send_json(server.request(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{id}/checkpoints"),
        ))
        .await;
    assert_eq!(
        list["checkpoints"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
}
