//! What only the native Linux runtime does, through the real server: its copy-on-write
//! root, and recovery from runtimes that died with the host. The rules every backend keeps
//! are in `conformance`.

use std::time::Duration;

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
async fn installs_into_usr_local_persist_in_the_copy_on_write_layer() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let setup =
        "echo 'echo from-cow-layer' > /usr/local/bin/mytool; chmod +x /usr/local/bin/mytool";
    assert_eq!(server.exec(&id, setup).await["exit_code"], 0);
    let result = server.exec(&id, "mytool").await;
    assert_eq!(stdout(&result), "from-cow-layer\n", "{result}");
    // The CoW layer lives in the runtime, not on the host.
    assert!(!std::path::Path::new("/usr/local/bin/mytool").exists());
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

/// The children of every thread of `pid`: (pid, state, argv[0]).
fn children_of(pid: u32) -> Vec<(String, String, String)> {
    let mut children = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for child in list.split_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_owned();
            let argv0 = std::fs::read(format!("/proc/{child}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(c.split(|&b| b == 0).next().unwrap_or_default())
                        .into_owned()
                })
                .unwrap_or_default();
            children.push((child.to_owned(), state, argv0));
        }
    }
    children
}

#[tokio::test]
async fn a_terminated_runtime_leaves_the_server_no_launcher_and_no_zombie() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(server.exec(&id, "true").await["exit_code"], 0);
    server.terminate(&id).await;
    let leftovers = || {
        children_of(server.pid())
            .into_iter()
            .filter(|(_, state, argv0)| state == "Z" || argv0 == "warren-runtime-init")
            .collect::<Vec<_>>()
    };
    // Retired launchers exit as soon as their stdin closes; give them a moment to.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !leftovers().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        leftovers(),
        Vec::<(String, String, String)>::new(),
        "children of the server (pid, state, argv[0]) after its only runtime was terminated"
    );
}
