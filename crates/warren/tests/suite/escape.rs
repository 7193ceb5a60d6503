//! The escape suite: each test is a real attempt from inside a runtime, asserting that it
//! fails and that the server and the runtime survive (I7, I12, I13, I23).

use serde_json::json;

use super::output as out;
use super::runtime::local;

#[tokio::test]
async fn host_secrets_and_other_trees_are_not_there() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.sandbox("bob", "t", "projects/b").await;
    std::fs::write(
        server.workspace_of("bob").join("projects/b/secret.txt"),
        "BOB-SECRET",
    )
    .unwrap();
    let data = server.data_dir().to_string_lossy().into_owned();
    let attempts = [
        "cat /etc/shadow".to_owned(),
        "cat /etc/gshadow".to_owned(),
        format!("cat {data}/token"),
        format!("ls {data}"),
        format!("cat {data}/user-data/shared/bob/workspace/projects/b/secret.txt"),
        "cat /home/gem/user-data/../../../bob/workspace/projects/b/secret.txt".to_owned(),
        "ls -a /root".to_owned(),
        "ls /var/run/docker.sock /run/docker.sock".to_owned(),
        "grep -r BOB-SECRET /home /tmp 2>/dev/null".to_owned(),
    ];
    for attempt in attempts {
        let result = server.exec(&id, &attempt).await;
        let text = out(&result);
        assert!(
            !text.contains("BOB-SECRET") && !text.contains(&server.token),
            "{attempt}: {text}"
        );
        if attempt != "ls -a /root" {
            assert_ne!(result["exit_code"], 0, "{attempt} succeeded: {text}");
        } else {
            assert_eq!(result["stdout"], ".\n..\n", "/root is empty");
        }
    }
    let env = server.exec(&id, "env").await;
    assert!(
        !out(&env).contains(&server.token),
        "the token is in the environment (I13)"
    );
    assert!(!out(&env).contains("WARREN"), "{}", out(&env));
}

#[tokio::test]
async fn host_processes_are_invisible_and_untouchable() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let server_pid = server.pid();
    let ps = server.exec(&id, "ps -eo pid,args").await;
    assert!(!out(&ps).contains("warren serve"), "{}", out(&ps));
    assert!(
        !out(&ps).contains("runtime-init"),
        "init is hidden: {}",
        out(&ps)
    );
    for attempt in [
        format!("kill -9 {server_pid}"),
        "kill -9 1".to_owned(),
        format!("cat /proc/{server_pid}/environ"),
        "python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); r=l.ptrace(16, 1, 0, 0); print(r, ctypes.get_errno()); exit(0 if r == 0 else 1)'".to_owned(),
    ] {
        let result = server.exec(&id, &attempt).await;
        assert_ne!(result["exit_code"], 0, "{attempt}: {}", out(&result));
    }
    let (_, health) = server
        .send_json(server.anonymous(reqwest::Method::GET, "/health"))
        .await;
    assert_eq!(health["status"], "ok", "the server survived");
}

#[tokio::test]
async fn privileged_kernel_interfaces_are_refused() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let python = |code: &str| {
        format!("python3 -c \"import ctypes,os; l=ctypes.CDLL(None, use_errno=True); {code}\"")
    };
    let attempts = [
        (
            "mount",
            "mkdir -p /tmp/m && mount -t tmpfs x /tmp/m".to_owned(),
        ),
        ("user namespace", "unshare -Ur id".to_owned()),
        (
            "user namespace (raw)",
            python("r=l.unshare(0x10000000); os._exit(0 if r == 0 else 1)"),
        ),
        (
            "mount namespace",
            python("r=l.unshare(0x20000); os._exit(0 if r == 0 else 1)"),
        ),
        (
            "bpf",
            python("r=l.syscall(321, 5, 0, 0); os._exit(0 if r >= 0 else 1)"),
        ),
        (
            "keyctl",
            python("r=l.syscall(250, 0, 0, 0, 0, 0); os._exit(0 if r >= 0 else 1)"),
        ),
        (
            "io_uring",
            python("r=l.syscall(425, 1, 0); os._exit(0 if r >= 0 else 1)"),
        ),
        (
            "perf_event_open",
            python("r=l.syscall(298, 0, 0, -1, -1, 0); os._exit(0 if r >= 0 else 1)"),
        ),
        (
            "setuid root",
            python("r=l.setuid(0); os._exit(0 if r == 0 else 1)"),
        ),
        (
            "chroot",
            "mkdir -p /tmp/r && chroot /tmp/r /bin/true".to_owned(),
        ),
        ("write skills", "echo x > /home/gem/skills/evil".to_owned()),
        ("write /etc", "echo x >> /etc/passwd".to_owned()),
        ("write /usr/bin", "cp /bin/sh /usr/bin/evil".to_owned()),
        ("mknod", "mknod /tmp/sda b 8 0".to_owned()),
    ];
    for (what, attempt) in attempts {
        let result = server.exec(&id, &attempt).await;
        assert_ne!(result["exit_code"], 0, "{what} succeeded: {}", out(&result));
    }
}

#[tokio::test]
async fn setuid_binaries_grant_nothing() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // A root-owned setuid copy of `id`, planted by the host in the workspace.
    let planted = server.workspace_of("alice").join("projects/a/suid-id");
    std::fs::copy("/usr/bin/id", &planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(
        &planted,
        std::os::unix::fs::PermissionsExt::from_mode(0o4755),
    )
    .unwrap();
    let result = server
        .exec(&id, "./suid-id -u; su -c 'id -u' root </dev/null; true")
        .await;
    assert!(out(&result).starts_with("1000\n"), "{}", out(&result));
    assert!(
        !out(&result).lines().any(|l| l.trim() == "0"),
        "{}",
        out(&result)
    );
}

#[tokio::test]
async fn the_network_is_loopback_only() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    let connect = |host: &str, port: &str| {
        format!("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('{host}', {port})); print('CONNECTED')\"")
    };
    for (host, port) in [
        ("127.0.0.1", port.as_str()),
        ("10.0.0.1", "80"),
        ("1.1.1.1", "443"),
    ] {
        let result = server.exec(&id, &connect(host, port)).await;
        assert!(!out(&result).contains("CONNECTED"), "reached {host}:{port}");
        assert_ne!(result["exit_code"], 0);
    }
    let lo = server
        .exec(&id, "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c=socket.create_connection(s.getsockname()); print('LOOPBACK-OK')\"")
        .await;
    assert!(
        out(&lo).contains("LOOPBACK-OK"),
        "loopback works inside: {}",
        out(&lo)
    );
    let interfaces = server
        .exec(&id, "ls /sys/class/net 2>/dev/null || cat /proc/net/dev")
        .await;
    assert!(!out(&interfaces).contains("eth"), "{}", out(&interfaces));
}

#[tokio::test]
async fn a_fork_bomb_is_bounded_and_everything_survives() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let bomb = server
        .exec_with(
            &id,
            json!({"command": "bomb() { bomb | bomb & }; bomb; sleep 5", "timeout_s": 4}),
        )
        .await;
    assert!(
        bomb["timed_out"] == true || bomb["exit_code"] != 0,
        "{bomb}"
    );
    let after = server.exec(&id, "echo alive; ps -e | wc -l").await;
    assert!(out(&after).starts_with("alive"), "{after}");
    let count: usize = out(&after).lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(
        count < 20,
        "the bomb's processes survived the timeout: {count}"
    );
}

#[tokio::test]
async fn a_memory_bomb_is_killed_and_the_runtime_survives() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo before > /tmp/marker").await;
    let bomb = server
        .exec_with(&id, json!({"command": "python3 -c 'x = bytearray(4 * 1024 * 1024 * 1024)'", "timeout_s": 60}))
        .await;
    assert_ne!(bomb["exit_code"], 0, "{bomb}");
    let after = server.exec(&id, "cat /tmp/marker").await;
    assert_eq!(
        after["stdout"], "before\n",
        "the runtime (and its /tmp) survived"
    );
}

#[tokio::test]
async fn filling_ephemeral_disk_is_bounded() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    for target in [
        "/tmp/fill",
        "/home/gem/fill",
        "/dev/shm/fill",
        "/usr/local/fill",
    ] {
        let result = server
            .exec_with(&id, json!({"command": format!("head -c 1200000000 /dev/zero > {target}"), "timeout_s": 60}))
            .await;
        assert_ne!(result["exit_code"], 0, "{target}: {result}");
        assert!(
            out(&result).contains("No space left"),
            "{target}: {}",
            out(&result)
        );
        server.exec(&id, &format!("rm -f {target}")).await;
    }
}

#[tokio::test]
async fn exhausting_file_descriptors_is_bounded() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server
        .exec(&id, "python3 -c \"import os\nfds=[]\ntry:\n  while True: fds.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e: print('STOPPED', len(fds), e.errno)\"")
        .await;
    let text = out(&result);
    assert!(text.contains("STOPPED"), "{text}");
    let opened: usize = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(opened < 1100, "opened {opened} descriptors");
    assert_eq!(server.exec(&id, "echo ok").await["stdout"], "ok\n");
}
