//! A keystroke's round trip through a process's terminal (issue 32): one byte in through
//! the `/v1` WebSocket attach, its echo out, on the local and the Docker backend, beside the
//! floor (a host terminal's own echo: a byte written to a pty master and its echo read
//! back, no process in between) and `docker exec -i <container> cat` through dockerd (a
//! byte to its stdin, the byte back from cat). Not a test: it prints p50 and p99 and the
//! ratios, measured in one run; it fails loudly when something it measures cannot run.
//!
//! Run as root with dockerd running and the test image built (`scripts/test` does both):
//! `cargo bench -p warren --bench processes` (`-- --keystrokes N`, default 500).
//!
//! What a keystroke crosses in warren: the WebSocket, the API, the provisioner's stdin
//! writer, a pipe into the runtime, the agent's terminal relay, the pty's line discipline
//! (which echoes), the relay again, a pipe out, the provisioner's output log and its
//! follower, the WebSocket back.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warren_test_support::latency::{ms, percentile, terminal_keystrokes};
use warren_test_support::{require_docker, TestServer, DOCKER_TEST_IMAGE};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let keystrokes: usize = std::env::args()
        .skip_while(|a| a != "--keystrokes")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    println!(
        "a keystroke's round trip through a terminal: byte in, echo out ({keystrokes} keystrokes each)\n"
    );

    let mut floor = host_pty(keystrokes);
    let local = TestServer::start_local(bin);
    let mut warren_local = terminal_keystrokes(&local, &local, keystrokes).await;
    drop(local);
    let docker = TestServer::start_docker(bin);
    let mut warren_docker = terminal_keystrokes(&docker, &docker, keystrokes).await;
    drop(docker);
    let mut docker_exec = docker_exec_i(keystrokes);

    let floor_p50 = percentile(&mut floor, 0.5);
    println!(
        "{:<44} {:>10} {:>10} {:>14} {:>12}",
        "path", "p50", "p99", "p50 - floor", "p50 / floor"
    );
    for (name, samples) in [
        ("host pty echo (the floor)", &mut floor),
        ("warren local: /v1 WebSocket attach, pty", &mut warren_local),
        (
            "warren docker: /v1 WebSocket attach, pty",
            &mut warren_docker,
        ),
        ("docker exec -i <container> cat (dockerd)", &mut docker_exec),
    ] {
        let p50 = percentile(samples, 0.5);
        let p99 = percentile(samples, 0.99);
        println!(
            "{name:<44} {:>10} {:>10} {:>14} {:>11.1}x",
            ms(p50),
            ms(p99),
            ms(p50.saturating_sub(floor_p50)),
            p50.as_secs_f64() / floor_p50.as_secs_f64()
        );
    }
    let docker_p50 = percentile(&mut docker_exec, 0.5);
    for (name, samples) in [("local", &mut warren_local), ("docker", &mut warren_docker)] {
        println!(
            "warren {name} / docker exec -i at p50: {:.2}x",
            percentile(samples, 0.5).as_secs_f64() / docker_p50.as_secs_f64()
        );
    }
}

/// A host terminal's echo: a byte written to the master comes back echoed by the line
/// discipline (the slave is held open, nothing reads it).
fn host_pty(keystrokes: usize) -> Vec<Duration> {
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .expect("a host pty");
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
    let mut slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().unwrap())
        .unwrap();
    // Something reads the lines, as `cat` does in the runtime.
    std::thread::spawn(move || {
        let mut sink = [0u8; 4096];
        while matches!(slave.read(&mut sink), Ok(n) if n > 0) {}
    });
    let mut terminal = std::fs::File::from(master);
    let mut samples = Vec::with_capacity(keystrokes);
    let mut echo = [0u8; 64];
    for i in 0..keystrokes + 20 {
        let started = Instant::now();
        terminal.write_all(b"a").unwrap();
        let n = terminal.read(&mut echo).unwrap();
        assert_eq!(&echo[..n], b"a", "the echo");
        if i >= 20 {
            samples.push(started.elapsed());
        }
        // Lines stay short: the line discipline holds at most 4 KiB of one.
        if i % 64 == 63 {
            terminal.write_all(b"\n").unwrap();
            let mut got = Vec::new();
            while !got.contains(&b'\n') {
                let n = terminal.read(&mut echo).unwrap();
                got.extend_from_slice(&echo[..n]);
            }
        }
    }
    samples
}

/// `docker exec -i <container> cat`: a byte to its stdin through dockerd, the byte back.
fn docker_exec_i(keystrokes: usize) -> Vec<Duration> {
    let container = warren_test_support::docker(&[
        "run",
        "-d",
        "--rm",
        "--network=none",
        DOCKER_TEST_IMAGE,
        "sleep",
        "infinity",
    ]);
    assert!(!container.is_empty(), "docker run of the test image");
    let mut child = Command::new("docker")
        .args(["exec", "-i", &container, "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker exec");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut samples = Vec::with_capacity(keystrokes);
    let mut byte = [0u8; 16];
    for i in 0..keystrokes + 20 {
        let started = Instant::now();
        stdin.write_all(b"a").unwrap();
        stdin.flush().unwrap();
        let n = stdout.read(&mut byte).unwrap();
        assert_eq!(&byte[..n], b"a", "cat's answer");
        if i >= 20 {
            samples.push(started.elapsed());
        }
    }
    drop(stdin);
    let _ = child.wait();
    warren_test_support::docker(&["rm", "-f", &container]);
    samples
}
