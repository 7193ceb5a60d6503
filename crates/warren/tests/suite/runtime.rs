//! The native Linux runtime through the real server (issue 3): identity, persistence,
//! ownership, concurrency, timeouts, streaming and clean destruction (I6, I7, I11, I15, I24).

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::bin;

pub(crate) fn local() -> TestServer {
    TestServer::start_local(bin())
}

fn stdout(result: &serde_json::Value) -> &str {
    result["stdout"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn commands_run_as_1000_without_privileges_in_the_workdir() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (_, health) = server
        .send_json(server.anonymous(Method::GET, "/health"))
        .await;
    assert_eq!(
        (health["backend"].as_str(), health["isolation"].as_bool()),
        (Some("local"), Some(true))
    );
    let result = server
        .exec(&id, "id -u; id -g; pwd; echo $HOME; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")
        .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    let lines: Vec<&str> = stdout(&result).lines().collect();
    assert_eq!(
        &lines[..4],
        [
            "1000",
            "1000",
            "/home/gem/user-data/projects/a",
            "/home/gem"
        ]
    );
    let status = lines[4..].join("\n");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    let (_, sandbox) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!(sandbox["state"], "running");
}

#[tokio::test]
async fn the_view_from_inside_has_exactly_the_two_persistent_mounts() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server.exec(&id, "cat /proc/self/mounts; ls /").await;
    let text = stdout(&result);
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    assert!(
        !text.contains(&data_dir),
        "a host path of warren's leaked: {text}"
    );
    let binds: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("/home/gem/user-data") || l.contains("/home/gem/skills"))
        .collect();
    assert_eq!(binds.len(), 2, "{binds:?}");
    assert!(binds
        .iter()
        .any(|l| l.contains(" /home/gem/user-data ") && l.contains(" rw,")));
    assert!(binds
        .iter()
        .any(|l| l.contains(" /home/gem/skills ") && l.contains(" ro,")));
    assert!(
        text.lines().any(|l| l.starts_with("tmpfs /home/gem ")),
        "/home/gem is a tmpfs (I7)"
    );
}

#[tokio::test]
async fn state_persists_across_execs_of_one_runtime() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let setup = "echo kept > /tmp/state; echo 'echo from-cow-layer' > /usr/local/bin/mytool; chmod +x /usr/local/bin/mytool; echo home > ~/note";
    assert_eq!(server.exec(&id, setup).await["exit_code"], 0);
    let result = server.exec(&id, "cat /tmp/state; mytool; cat ~/note").await;
    assert_eq!(stdout(&result), "kept\nfrom-cow-layer\nhome\n", "{result}");
    // A background process started by one exec is visible to the next (I6).
    server.exec(&id, "nohup sleep 30 >/dev/null 2>&1 &").await;
    let ps = server.exec(&id, "ps -eo args").await;
    assert!(stdout(&ps).contains("sleep 30"), "{ps}");
    // The CoW layer lives in the runtime, not on the host.
    assert!(!std::path::Path::new("/usr/local/bin/mytool").exists());
}

#[tokio::test]
async fn workspace_files_cross_the_boundary_as_1000() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let host_dir = server.workspace_of("alice").join("projects/a");
    std::fs::write(host_dir.join("from-host.txt"), "hello from host").unwrap();
    let result = server
        .exec(
            &id,
            "cat from-host.txt; mkdir -p out && echo made > out/inside.txt",
        )
        .await;
    assert_eq!(stdout(&result), "hello from host");
    let made = host_dir.join("out/inside.txt");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "made\n");
    for path in [made.clone(), host_dir.join("out")] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{}", path.display());
    }
    // And through the file API, the same bytes.
    let response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=out/inside.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "made\n");
}

#[tokio::test]
async fn concurrent_execs_are_independent() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    let calls = (0..8).map(|i| {
        let server = &server;
        let id = &id;
        async move {
            let result = server
                .exec(
                    id,
                    &format!("sleep 0.$(({i} % 3)); echo out-{i}; echo err-{i} >&2; exit {i}"),
                )
                .await;
            (i, result)
        }
    });
    for (i, result) in futures::future::join_all(calls).await {
        assert_eq!(result["exit_code"], i, "{result}");
        assert_eq!(stdout(&result), format!("out-{i}\n"));
        assert_eq!(result["stderr"], format!("err-{i}\n"));
    }
}

#[tokio::test]
async fn a_timeout_kills_the_whole_tree_including_setsid_grandchildren() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let started = Instant::now();
    let result = server
        .exec_with(&id, json!({"command": "setsid sh -c 'sleep 301' & sh -c 'sleep 302' & sleep 303", "timeout_s": 1}))
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(result["timed_out"], true, "{result}");
    assert_eq!(result["signal"], 9);
    let ps = server.exec(&id, "ps -eo args").await;
    for sleeper in ["sleep 301", "sleep 302", "sleep 303"] {
        assert!(!stdout(&ps).contains(sleeper), "{sleeper} survived: {ps}");
    }
}

#[tokio::test]
async fn exit_statuses_signals_and_missing_programs_are_reported() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(server.exec(&id, "exit 3").await["exit_code"], 3);
    let killed = server.exec(&id, "kill -9 $$").await;
    assert_eq!(
        (killed["exit_code"].clone(), killed["signal"].clone()),
        (json!(null), json!(9))
    );
    let missing = server
        .exec_with(&id, json!({"argv": ["no-such-program-xyz"]}))
        .await;
    assert_eq!(missing["exit_code"], 127, "{missing}");
    assert!(missing["stderr"]
        .as_str()
        .unwrap()
        .contains("no-such-program-xyz"));
    let argv = server
        .exec_with(&id, json!({"argv": ["printf", "%s|", "a b", "$HOME"]}))
        .await;
    assert_eq!(stdout(&argv), "a b|$HOME|", "argv is not shell-interpreted");
    let bash = server
        .exec_with(
            &id,
            json!({"command": "a=(1 2 3); echo ${#a[@]}", "shell": "bash"}),
        )
        .await;
    assert_eq!(stdout(&bash), "3\n", "{bash}");
    let sh = server.exec(&id, "a=(1 2 3); echo ${#a[@]}").await;
    assert_ne!(sh["exit_code"], 0, "arrays are bash syntax, not sh");
    let stdin = server
        .exec_with(&id, json!({"command": "tr a-z A-Z", "stdin": "shout"}))
        .await;
    assert_eq!(stdout(&stdin), "SHOUT");
    let env = server
        .exec_with(
            &id,
            json!({"command": "echo $GREETING", "env": {"GREETING": "hi"}}),
        )
        .await;
    assert_eq!(stdout(&env), "hi\n");
    let cwd = server
        .exec_with(&id, json!({"command": "pwd", "cwd": "/home/gem/skills"}))
        .await;
    assert_eq!(stdout(&cwd), "/home/gem/skills\n");
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&json!({"command": "pwd", "cwd": "nope"})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_cwd"))
    );
}

#[tokio::test]
async fn output_beyond_the_cap_is_cut_and_flagged() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server
        .exec(&id, "head -c 3000000 /dev/zero | tr '\\0' x")
        .await;
    assert_eq!(result["truncated"], true);
    assert_eq!(stdout(&result).len(), 1024 * 1024);
    assert_eq!(result["exit_code"], 0);
}

/// Starts an exec whose answer streams in the `accept` format.
async fn exec_streaming(
    server: &TestServer,
    id: &str,
    accept: &str,
    command: &str,
) -> reqwest::Response {
    server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .header("accept", accept)
        .json(&json!({ "command": command }))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn streaming_exec_delivers_output_as_it_comes_then_the_exit() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mut response = exec_streaming(
        &server,
        &id,
        "application/x-ndjson",
        "echo one; sleep 1; printf '\\377\\000bin' >&2; echo two",
    )
    .await;
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let started = Instant::now();
    let mut text = String::new();
    let mut first_at = None;
    while let Some(chunk) = response.chunk().await.unwrap() {
        first_at.get_or_insert(started.elapsed());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        first_at.unwrap() < Duration::from_millis(800),
        "the first output waited for the end"
    );
    assert_eq!(events[0], json!({"type": "stdout", "data": "b25lCg=="}));
    use base64::Engine;
    let stderr: Vec<u8> = events
        .iter()
        .filter(|e| e["type"] == "stderr")
        .flat_map(|e| {
            base64::engine::general_purpose::STANDARD
                .decode(e["data"].as_str().unwrap())
                .unwrap()
        })
        .collect();
    assert_eq!(stderr, b"\xff\x00bin", "binary-safe");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "exit");
    assert_eq!(last["result"]["exit_code"], 0);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_leaves_no_process() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mut response =
        exec_streaming(&server, &id, "text/event-stream", "echo started; sleep 304").await;
    let first = response.chunk().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first)
        .unwrap()
        .starts_with("event: stdout"));
    drop(response);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ps = server.exec(&id, "ps -eo args").await;
        if !stdout(&ps).contains("sleep 304") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the command outlived its client: {ps}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn destroy_leaves_no_process_mount_or_cgroup_and_keeps_the_workspace() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(
            &id,
            "echo keep > kept.txt; nohup sleep 305 >/dev/null 2>&1 &",
        )
        .await;
    let runtime_dir = server.data_dir().join("runtimes").join(&id);
    let identity: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runtime_dir.join("runtime.json")).unwrap()).unwrap();
    let init_pid = identity["pid"].as_i64().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{init_pid}")).exists());
    server.terminate(&id).await;
    assert!(
        !std::path::Path::new(&format!("/proc/{init_pid}")).exists(),
        "init survived"
    );
    let sleepers = std::process::Command::new("pgrep")
        .args(["-f", "sleep 305"])
        .output()
        .unwrap();
    assert!(sleepers.stdout.is_empty(), "a runtime process survived");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "a mount survived");
    let cgroup = identity["cgroup"].as_str().unwrap();
    assert!(cgroup.ends_with(&id));
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let dir = hierarchy.path().join("warren").join(cgroup);
        assert!(!dir.exists(), "cgroup {} survived", dir.display());
    }
    assert!(!runtime_dir.exists(), "the runtime directory survived");
    let kept = server.workspace_of("alice").join("projects/a/kept.txt");
    assert_eq!(
        std::fs::read_to_string(kept).unwrap(),
        "keep\n",
        "I15: workspace files stay"
    );
}

#[tokio::test]
async fn runs_are_recorded_with_status_and_resource_use() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server
        .exec(
            &id,
            "python3 -c 'b = bytearray(64 * 1024 * 1024); sum(range(3_000_000))'",
        )
        .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    let run_id = result["run_id"].as_str().unwrap();
    let db = server.data_dir().join("warren.db");
    let row = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select status, exit_code, cpu_user_ms, peak_memory_bytes, cwd from runs where id=?', (sys.argv[2],)).fetchone())",
            db.to_str().unwrap(),
            run_id,
        ])
        .output()
        .unwrap();
    let row = String::from_utf8_lossy(&row.stdout);
    assert!(row.starts_with("('finished', 0, "), "{row}");
    let fields: Vec<&str> = row
        .trim_matches(|c| c == '(' || c == ')' || c == '\n')
        .split(", ")
        .collect();
    let peak: i64 = fields[3].parse().unwrap();
    assert!(
        peak >= 64 * 1024 * 1024,
        "peak memory {peak} below the 64 MiB allocated"
    );
    assert!(fields[4].contains("/home/gem/user-data/projects/a"));
}

fn sqlite_row(server: &TestServer, sql: &str, param: &str) -> String {
    let db = server.data_dir().join("warren.db");
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute(sys.argv[2], (sys.argv[3],)).fetchone())",
            db.to_str().unwrap(),
            sql,
            param,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_survives_a_killed_server_and_is_adopted_after_restart() {
    let mut server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo kept > /tmp/state").await;
    let identity: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            server
                .data_dir()
                .join("runtimes")
                .join(&id)
                .join("runtime.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let init_pid = identity["pid"].as_i64().unwrap();
    // A command in flight when the server dies.
    let in_flight = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .json(&json!({"command": "sleep 306", "timeout_s": 600}))
        .send();
    let in_flight = tokio::spawn(in_flight);
    tokio::time::sleep(Duration::from_millis(500)).await;

    server.restart_after_kill();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the in-flight request died with the server"
    );

    let after = server.exec(&id, "cat /tmp/state; ps -eo args").await;
    assert!(
        stdout(&after).starts_with("kept\n"),
        "the runtime was adopted: {after}"
    );
    assert!(
        !stdout(&after).contains("sleep 306"),
        "the orphaned command was killed: {after}"
    );
    let identity: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            server
                .data_dir()
                .join("runtimes")
                .join(&id)
                .join("runtime.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        identity["pid"].as_i64(),
        Some(init_pid),
        "the same init serves"
    );
    let run = sqlite_row(
        &server,
        "select status, failure_reason from runs where command = ?",
        "sleep 306",
    );
    assert_eq!(run, "('failed', 'provisioner_restarted')");
}

#[tokio::test]
async fn a_runtime_that_died_with_the_host_is_cleaned_up_and_replaced() {
    let mut server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo lost > /tmp/state").await;
    let runtime_dir = server.data_dir().join("runtimes").join(&id);
    let identity: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runtime_dir.join("runtime.json")).unwrap()).unwrap();
    server.kill();
    // The machine "rebooted": the runtime is gone, its directory and record are not.
    let pid = identity["pid"].as_i64().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    server.restart_after_kill();

    let (_, sandbox) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!(sandbox["state"], "stopped", "{sandbox}");
    let cgroup = identity["cgroup"].as_str().unwrap();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let dir = hierarchy.path().join("warren").join(cgroup);
        let leftover = std::process::Command::new("find")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            !dir.exists(),
            "stale cgroup kept: {}",
            String::from_utf8_lossy(&leftover.stdout)
        );
    }
    let fresh = server
        .exec(&id, "cat /tmp/state 2>/dev/null || echo fresh")
        .await;
    assert_eq!(stdout(&fresh), "fresh\n", "a new runtime started: {fresh}");
    let kept = server.workspace_of("alice").join("projects/a");
    assert!(kept.is_dir(), "the workspace stays (I15)");
}

#[tokio::test]
async fn a_stale_runtime_record_never_kills_the_process_that_now_has_its_pid() {
    let mut server = local();
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let dir = server
        .data_dir()
        .join("runtimes/sbx-0123456789abcdef01234567");
    std::fs::create_dir_all(&dir).unwrap();
    // What a runtime leaves after a reboot: its record, naming a pid now reused.
    let record = json!({
        "sandbox": "sbx-0123456789abcdef01234567", "generation": 1, "uid": "ghost",
        "runtime_scope": "t", "workdir": "projects/a", "user_workspace": "/nonexistent",
        "skill_projection": "/nonexistent", "env": {}, "cgroup": "stale-sbx-0123456789abcdef01234567",
        "pid": victim.id(), "init_birth": "another-boot:12345",
    });
    std::fs::write(dir.join("runtime.json"), record.to_string()).unwrap();
    server.restart_after_kill();
    assert!(
        victim.try_wait().unwrap().is_none(),
        "warren killed an unrelated process"
    );
    assert!(!dir.exists(), "the stale runtime directory was cleaned up");
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[tokio::test]
async fn a_lock_held_inside_a_runtime_cannot_park_file_writes() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(
            &id,
            "nohup flock /home/gem/user-data/projects/a sleep 60 >/dev/null 2>&1 &",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (status, body) = server
        .send_json(
            server
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path=blocked.txt"),
                )
                .body("x"),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("file_busy")),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the writer waited too long"
    );
    server.exec(&id, "pkill -f 'sleep 60'; true").await;
    let (status, _) = server
        .send_json(
            server
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path=blocked.txt"),
                )
                .body("x"),
        )
        .await;
    assert_eq!(status, 201, "writes work again once the lock is gone");
}
