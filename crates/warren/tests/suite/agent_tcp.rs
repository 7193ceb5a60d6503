//! The agent over TCP (issue 15): the real `warren __container-agent` listening on a TCP
//! port with its key, as in a pod, driven by warren's own client (`RemoteAgent`), and
//! attacked: connections without the key, replayed connections, oversized frames, idle
//! unauthenticated connections, and a sandbox process going after its own agent.
//!
//! The agent runs as PID 1 of a pid and mount namespace of its own (`unshare --pid --fork
//! --mount-proc`) as the sandbox user 1000:1000 (`setpriv`), as it does in a pod: its
//! `KillAll` sweeps that namespace's `/proc`, never the host's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warren_agent::protocol::ExecSpec;
use warren_agent::remote::RemoteAgent;
use warren_agent::wire::{AgentKey, AGENT_KEY_ENV};
use warren_backend::{ExecOutcome, ExecRequest};

/// One agent process, killed (with its namespace) when dropped.
struct TcpAgent {
    child: Child,
    address: SocketAddr,
    key: AgentKey,
    home: tempfile::TempDir,
}

impl Drop for TcpAgent {
    fn drop(&mut self) {
        // The agent (PID 1 of its namespace: killing it ends the namespace) is unshare's
        // child; `--kill-child` does not reach it, since setpriv's change of credentials
        // clears the parent-death signal.
        let pid = self.child.id();
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
            for child in children.split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", child]).status();
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TcpAgent {
    fn start() -> Self {
        assert!(
            super::running_as_root(),
            "the TCP agent tests need root: the agent runs in a pid namespace of its own"
        );
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        rustix::fs::chown(
            home.path(),
            Some(rustix::process::Uid::from_raw(1000)),
            Some(rustix::process::Gid::from_raw(1000)),
        )
        .unwrap();
        let key = AgentKey::generate().unwrap();
        let config = serde_json::json!({
            "sandbox": "sbx-tcp-test",
            "generation": 7,
            "nofile": 1024,
            "egress": false,
            "listen": "127.0.0.1:0",
            "home": home.path(),
        });
        let mut child = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .args(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups"])
            .arg(super::bin())
            .arg(warren_agent::CONTAINER_AGENT_ARG)
            .arg(config.to_string())
            .env_clear()
            .env(AGENT_KEY_ENV, key.to_hex())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run unshare (util-linux) and setpriv");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let said: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|_| panic!("the agent did not say where it listens: {line:?}"));
        let address = said["listening"].as_str().unwrap().parse().unwrap();
        Self {
            child,
            address,
            key,
            home,
        }
    }

    fn client(&self) -> RemoteAgent {
        RemoteAgent {
            address: self.address,
            key: self.key.clone(),
        }
    }

    fn run(&self, script: &str, timeout: Duration) -> ExecOutcome {
        self.run_with(&self.client(), script, timeout)
            .unwrap_or_else(|e| panic!("run {script:?}: {e}"))
    }

    fn run_with(
        &self,
        client: &RemoteAgent,
        script: &str,
        timeout: Duration,
    ) -> Result<ExecOutcome, String> {
        let request = request(script, timeout);
        let spec = ExecSpec {
            argv: request.argv.clone(),
            cwd: self.home.path().display().to_string(),
            env: warren_agent::environment::base_environment(&warren_core::Layout::ARS),
            pty: None,
        };
        runtime().block_on(run(client, spec, &request, None))
    }

    /// Threads of the agent's gateway (its accept loop is one).
    fn gateway_threads(&self) -> usize {
        let children = |pid: u32| -> Vec<u32> {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        };
        // unshare → the agent (PID 1 of its namespace) → its gateway, its only child left.
        let agent = children(self.child.id())[0];
        let gateway = children(agent)[0];
        std::fs::read_dir(format!("/proc/{gateway}/task"))
            .unwrap()
            .count()
    }

    fn processes(&self) -> u64 {
        runtime()
            .block_on(self.client().ping())
            .expect("the agent answers")
            .2
    }
}

fn request(script: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd: String::new(),
        env: BTreeMap::new(),
        stdin: Vec::new(),
        timeout,
        output_cap: 1 << 20,
    }
}

/// A runtime whose tasks run on while the test waits outside it, as the server's do: a
/// process handle's connection is held by tasks of its own.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until `done` holds, for at most ten seconds.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_command_runs_over_tcp_with_its_stdin_output_exit_code_and_usage() {
    let agent = TcpAgent::start();
    let ping = runtime().block_on(agent.client().ping()).unwrap();
    assert_eq!((ping.0.as_str(), ping.1), ("sbx-tcp-test", 7));

    let mut request = request(
        "cat; echo out; echo err >&2; id -u; exit 3",
        Duration::from_secs(30),
    );
    request.stdin = b"from stdin\n".repeat(20_000);
    let spec = ExecSpec {
        argv: request.argv.clone(),
        cwd: agent.home.path().display().to_string(),
        env: warren_agent::environment::base_environment(&warren_core::Layout::ARS),
        pty: None,
    };
    let outcome = runtime()
        .block_on(run(&agent.client(), spec, &request, None))
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8(outcome.stdout.clone()).unwrap();
    assert_eq!(outcome.exit_code, Some(3), "{outcome:?}");
    assert!(
        stdout.starts_with("from stdin\nfrom stdin\n"),
        "{stdout:.100}"
    );
    assert!(
        stdout.ends_with("out\n1000\n"),
        "{}",
        &stdout[stdout.len() - 40..]
    );
    assert_eq!(stdout.matches("from stdin").count(), 20_000);
    assert_eq!(outcome.stderr, b"err\n");
    assert!(!outcome.truncated);
    assert!(outcome.usage.peak_memory_bytes.unwrap() > 0);

    let failed = agent.run("exec /nonexistent", Duration::from_secs(30));
    assert_eq!(failed.exit_code, Some(127), "{failed:?}");
}

#[test]
fn output_over_the_cap_is_cut_and_streamed_whole_to_the_sink() {
    let agent = TcpAgent::start();
    let mut request = request("head -c 3000000 /dev/zero", Duration::from_secs(30));
    request.output_cap = 1000;
    let spec = ExecSpec {
        argv: request.argv.clone(),
        cwd: "/".into(),
        env: warren_agent::environment::base_environment(&warren_core::Layout::ARS),
        pty: None,
    };
    let (sink, mut chunks) = tokio::sync::mpsc::channel(16);
    let rt = runtime();
    let streamed = rt.spawn(async move {
        let mut total = 0;
        while let Some(chunk) = chunks.recv().await {
            let chunk: warren_backend::OutputChunk = chunk;
            total += chunk.bytes.len();
        }
        total
    });
    let outcome = rt
        .block_on(run(&agent.client(), spec, &request, Some(sink)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.stdout.len(), 1000);
    assert!(outcome.truncated);
    assert_eq!(rt.block_on(streamed).unwrap(), 3_000_000);
}

#[test]
fn a_timeout_kills_the_commands_whole_tree_over_tcp() {
    let agent = TcpAgent::start();
    let started = Instant::now();
    let outcome = agent.run(
        "setsid sleep 300 & (sleep 301 &) ; sleep 302",
        Duration::from_millis(500),
    );
    assert!(outcome.timed_out, "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Nothing of the tree is left: not the command, not what it put in the background.
    eventually("the killed tree is gone", || agent.processes() == 0);
}

#[test]
fn a_client_that_goes_away_gets_its_command_killed() {
    let agent = TcpAgent::start();
    let request = request("sleep 303 & sleep 304", Duration::from_secs(600));
    let spec = ExecSpec {
        argv: request.argv.clone(),
        cwd: "/".into(),
        env: warren_agent::environment::base_environment(&warren_core::Layout::ARS),
        pty: None,
    };
    let rt = runtime();
    let client = agent.client();
    // The client stops waiting after a moment and drops the connection.
    let left = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(500),
            run(&client, spec, &request, None),
        )
        .await
    });
    assert!(left.is_err(), "the command ended on its own: {left:?}");
    eventually("the abandoned command's tree is gone", || {
        agent.processes() == 0
    });
}

#[test]
fn kill_all_over_tcp_kills_every_process_but_the_agents_own() {
    let agent = TcpAgent::start();
    let outcome = agent.run(
        "setsid sleep 305 > /dev/null 2>&1 < /dev/null &",
        Duration::from_secs(30),
    );
    assert_eq!(outcome.exit_code, Some(0));
    // The agent's own processes (itself, its gateway) are never counted.
    assert_eq!(agent.processes(), 1, "the background sleep");
    let killed = runtime().block_on(agent.client().kill_all()).unwrap();
    assert_eq!(killed, 1);
    assert_eq!(agent.processes(), 0);
    // The agent still serves.
    assert_eq!(
        agent.run("echo still", Duration::from_secs(30)).stdout,
        b"still\n"
    );
}

#[test]
fn a_peer_without_the_key_runs_nothing_and_learns_nothing() {
    let agent = TcpAgent::start();
    let marker = agent.home.path().join("marker");
    let stranger = RemoteAgent {
        address: agent.address,
        key: AgentKey::generate().unwrap(),
    };
    let script = format!("touch {}", marker.display());
    let refused = agent.run_with(&stranger, &script, Duration::from_secs(30));
    assert!(refused.is_err(), "ran without the key: {refused:?}");
    assert!(runtime().block_on(stranger.ping()).is_none());
    assert!(!marker.exists(), "a command ran without the key");
    // Raw bytes that are not the protocol at all get nothing either.
    let mut raw = TcpStream::connect(agent.address).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 40];
    raw.read_exact(&mut hello).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    raw.write_all(&[0u8; 64]).unwrap();
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the agent answered a stranger: {rest:?}");
    assert!(!marker.exists());
    // The real key still works.
    agent.run(&script, Duration::from_secs(30));
    assert!(marker.exists());
}

/// A recording relay between the client and the agent: what the client sent on its first
/// connection is kept.
fn recording_relay(agent: SocketAddr) -> (SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let (recorded, recording) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut client, _) = listener.accept().unwrap();
        let mut upstream = TcpStream::connect(agent).unwrap();
        let mut back = upstream.try_clone().unwrap();
        let mut client_back = client.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut back, &mut client_back);
            let _ = client_back.shutdown(std::net::Shutdown::Both);
        });
        let mut seen = Vec::new();
        let mut buffer = [0u8; 65536];
        loop {
            match client.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    seen.extend_from_slice(&buffer[..n]);
                    if upstream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = upstream.shutdown(std::net::Shutdown::Both);
        let _ = recorded.send(seen);
    });
    (address, recording)
}

#[test]
fn a_replayed_connection_runs_nothing() {
    let agent = TcpAgent::start();
    let log = agent.home.path().join("runs");
    let script = format!("echo ran >> {}", log.display());
    let (relay, recording) = recording_relay(agent.address);
    let through_relay = RemoteAgent {
        address: relay,
        key: agent.key.clone(),
    };
    agent
        .run_with(&through_relay, &script, Duration::from_secs(30))
        .unwrap();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "ran\n");
    let recorded = recording.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        recorded.len() > 8 + 32 + 32,
        "the client's handshake and request were recorded"
    );

    // The same bytes again, on a new connection: the agent's nonce differs, so the proof
    // in them proves nothing.
    let mut replay = TcpStream::connect(agent.address).unwrap();
    replay
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut hello = [0u8; 40];
    replay.read_exact(&mut hello).unwrap();
    let _ = replay.write_all(&recorded);
    let mut answer = Vec::new();
    let _ = replay.read_to_end(&mut answer);
    assert!(answer.is_empty(), "the agent answered a replay: {answer:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "ran\n",
        "the replay ran the command"
    );
}

#[test]
fn an_oversized_frame_ends_its_connection_and_nothing_else() {
    let agent = TcpAgent::start();
    let rt = runtime();
    let key = agent.key.clone();
    let address = agent.address;
    let closed = rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        warren_agent::wire::connect(&mut stream, &key)
            .await
            .unwrap();
        // Authenticated, then a frame of 4 GiB announced.
        stream.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
            .await
            .map(|read| read.is_ok() && rest.is_empty())
    });
    assert_eq!(closed, Ok(true), "the agent kept the connection");
    assert_eq!(
        agent.run("echo fine", Duration::from_secs(30)).stdout,
        b"fine\n"
    );
}

#[test]
fn idle_unauthenticated_connections_neither_block_others_nor_stay() {
    let agent = TcpAgent::start();
    let idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(agent.address).unwrap())
        .collect();
    assert_eq!(
        agent.run("echo served", Duration::from_secs(30)).stdout,
        b"served\n"
    );
    // Each is closed once its handshake time is up.
    let started = Instant::now();
    for mut stream in idle {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).expect("closed by the agent");
        assert_eq!(all.len(), 40, "only the agent's hello");
    }
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_sandbox_process_cannot_reach_its_agents_key_or_command_it() {
    let agent = TcpAgent::start();
    let port = agent.address.port();
    // Everything a process of the sandbox user can try from inside: the agent's
    // environment and memory, its command line, its own environment, and the agent's port
    // without the key.
    let script = format!(
        r#"
cat /proc/1/environ > /dev/null 2>&1 && echo ENVIRON-READ
head -c 1 /proc/1/mem > /dev/null 2>&1 && echo MEM-READ
tr '\0' ' ' < /proc/1/cmdline | grep -q {key} && echo CMDLINE-HAS-KEY
env | grep -q {env_name} && echo ENV-HAS-KEY
grep -rqs {key} /proc/[0-9]*/environ && echo SOME-ENVIRON-HAS-KEY
python3 - <<'EOF'
import socket
s = socket.create_connection(("127.0.0.1", {port}))
s.settimeout(10)
hello = s.recv(40)
s.sendall(b"WRNAGT01" + b"\0" * 64)
print("ANSWERED" if s.recv(100) else "CLOSED")
EOF
"#,
        key = agent.key.to_hex(),
        env_name = AGENT_KEY_ENV,
    );
    let outcome = agent.run(&script, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    assert_eq!(
        stdout.trim(),
        "CLOSED",
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&outcome.stderr)
    );
}

#[test]
fn a_hostile_home_reaches_warren_as_plain_files_and_links_only() {
    let agent = TcpAgent::start();
    // What a sandbox can leave in its home for the next snapshot: links to the host's
    // secrets and to the root, a FIFO, a set-user-ID file, names with newlines and `..`
    // look-alikes, a directory it cannot read.
    let home = agent.home.path().display().to_string();
    let outcome = agent.run(
        &(format!("cd {home} && ")
            + r#"ln -s /etc/shadow shadow && ln -s / root && mkfifo fifo &&
           printf x > suid && chmod 4755 suid && mkdir -p 'a/..b' && printf y > 'a/..b/new
line' && mkdir locked && printf z > locked/f && chmod 000 locked && echo done"#),
        Duration::from_secs(30),
    );
    assert_eq!(outcome.stdout, b"done\n", "{outcome:?}");
    let staging = tempfile::tempdir().unwrap();
    let into = staging.path().join("home");
    std::fs::create_dir(&into).unwrap();
    let moved = runtime()
        .block_on(agent.client().archive_home(into.clone(), 1 << 30))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(
        moved.skipped >= 2,
        "the FIFO and the unreadable directory are left out: {moved:?}"
    );
    let shadow = std::fs::symlink_metadata(into.join("shadow")).unwrap();
    assert!(shadow.file_type().is_symlink(), "a link stays a link");
    assert!(std::fs::symlink_metadata(into.join("root"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!into.join("fifo").exists());
    let suid = std::fs::metadata(into.join("suid")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&suid.permissions()) & 0o7000,
        0,
        "no set-user-ID bit reaches the host"
    );
    assert_eq!(std::fs::read(into.join("a/..b/new\nline")).unwrap(), b"y");
    // Nothing outside the staging directory.
    let names: Vec<_> = std::fs::read_dir(staging.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["home"]);

    // And back into a fresh home: the same tree.
    let agent = TcpAgent::start();
    runtime()
        .block_on(agent.client().restore_home(into, 1 << 30))
        .unwrap_or_else(|e| panic!("{e:?}"));
    let home = agent.home.path().display().to_string();
    let back = agent.run(
        &(format!("cd {home} && ")
            + r#"readlink shadow && cat 'a/..b/new
line' && stat -c %u suid && ls -d locked 2>&1 | wc -l"#),
        Duration::from_secs(30),
    );
    assert_eq!(
        String::from_utf8_lossy(&back.stdout),
        "/etc/shadow\ny1000\n1\n",
        "{back:?}"
    );
}

#[test]
fn a_home_larger_than_its_limit_is_refused_and_nothing_half_arrives_unnoticed() {
    let agent = TcpAgent::start();
    let home = agent.home.path().display().to_string();
    let outcome = agent.run(
        &format!("head -c 300000 /dev/zero > {home}/big"),
        Duration::from_secs(30),
    );
    assert_eq!(outcome.exit_code, Some(0));
    let staging = tempfile::tempdir().unwrap();
    let refused = runtime().block_on(
        agent
            .client()
            .archive_home(staging.path().to_owned(), 100_000),
    );
    assert!(
        refused.is_err(),
        "a home over its limit was taken: {refused:?}"
    );
    // The connection's end is clean: the agent still serves.
    assert_eq!(
        agent.run("echo fine", Duration::from_secs(30)).stdout,
        b"fine\n"
    );
}

#[test]
fn a_peer_trickling_its_handshake_is_cut_off_at_the_handshakes_bound() {
    let agent = TcpAgent::start();
    let mut slow = TcpStream::connect(agent.address).unwrap();
    let mut hello = [0u8; 40];
    slow.read_exact(&mut hello).unwrap();
    // One byte a second: each read alone is quick, the whole never ends.
    let started = Instant::now();
    let mut cut = None;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        if slow.write_all(b"W").is_err() {
            cut = Some(started.elapsed());
            break;
        }
        let mut probe = [0u8; 1];
        slow.set_nonblocking(true).unwrap();
        let closed = matches!(slow.read(&mut probe), Ok(0));
        slow.set_nonblocking(false).unwrap();
        if closed {
            cut = Some(started.elapsed());
            break;
        }
    }
    let cut = cut.expect("the agent kept a trickling peer for 30 s");
    assert!(cut < Duration::from_secs(10), "cut after {cut:?}");
    assert_eq!(
        agent.run("echo fine", Duration::from_secs(30)).stdout,
        b"fine\n"
    );
}

#[test]
fn stdin_a_background_process_holds_unread_does_not_hold_the_agent() {
    let agent = TcpAgent::start();
    // The command leaves at once; a background process keeps its stdin open and never
    // reads it, while 1 MiB of stdin is still queued for it.
    let mut request = request("sleep 300 & exit 0", Duration::from_secs(30));
    request.stdin = vec![b'x'; 1 << 20];
    let spec = ExecSpec {
        argv: request.argv.clone(),
        cwd: "/".into(),
        env: warren_agent::environment::base_environment(&warren_core::Layout::ARS),
        pty: None,
    };
    let started = Instant::now();
    let outcome = runtime()
        .block_on(run(&agent.client(), spec, &request, None))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(outcome.exit_code, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The connection's threads end: none is left writing that stdin (the main thread and
    // the reserve workers stay).
    eventually("the gateway's connection threads end", || {
        agent.gateway_threads() == 1 + warren_agent::gateway::RESERVE_WORKERS
    });
    assert_eq!(
        agent.run("echo next", Duration::from_secs(30)).stdout,
        b"next\n"
    );
}

/// Runs one command through the agent as every backend's exec does: a process followed
/// to its end.
async fn run(
    client: &RemoteAgent,
    spec: ExecSpec,
    request: &warren_backend::ExecRequest,
    sink: Option<warren_backend::OutputSink>,
) -> Result<ExecOutcome, String> {
    let began = Instant::now();
    let sandbox = warren_core::SandboxId::parse("sbx-000000000000000000000001").unwrap();
    let started = client
        .start_process(spec, &sandbox)
        .await
        .map_err(|e| e.to_string())?;
    warren_backend::run_to_completion(started, request, sink, began)
        .await
        .map_err(|e| e.to_string())
}
