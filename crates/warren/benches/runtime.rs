//! The local runtime's speed and memory, measured beside bubblewrap (and Docker when a
//! daemon runs), in one run on this machine. Not a test: it asserts nothing, it prints.
//!
//! Run as root: `cargo bench -p warren --bench runtime` (`-- --idle N` to change how many
//! idle runtimes are created; default 1000).
//!
//! Targets (issue 3): create-and-first-exec p50 ≤ 10 ms; warm exec through the API
//! p50 ≤ 2 ms; ≤ 2 MiB host memory per idle runtime; 1,000 idle runtimes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::latency::{create_and_exec, row};
use warren_test_support::TestServer;

/// A field of /proc/meminfo, in KiB.
fn meminfo_kib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find(|l| l.split(':').next() == Some(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn mem_available_kib() -> u64 {
    meminfo_kib("MemAvailable")
}

fn bwrap_command(workspace: &Path, program: &[&str]) -> Command {
    let mut command = Command::new("bwrap");
    command.args(["--ro-bind", "/usr", "/usr"]);
    for dir in ["bin", "lib", "lib64", "sbin"] {
        let host = Path::new("/").join(dir);
        match std::fs::read_link(&host) {
            Ok(target) => command.args([
                "--symlink",
                target.to_str().unwrap(),
                host.to_str().unwrap(),
            ]),
            Err(_) if host.is_dir() => {
                command.args(["--ro-bind", host.to_str().unwrap(), host.to_str().unwrap()])
            }
            Err(_) => &mut command,
        };
    }
    command
        .args([
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
        ])
        .args(["--tmpfs", "/home/gem", "--bind"])
        .arg(workspace)
        .args(["/home/gem/user-data", "--unshare-all", "--die-with-parent"])
        .args([
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--chdir",
            "/home/gem/user-data",
        ])
        .args(program)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// A local image for the docker anchor: the host's `true`, `sleep` and `sh` with their
/// libraries, imported with `docker import` (no registry is reachable here).
const DOCKER_IMAGE: &str = "warren-bench-rootfs:latest";

fn import_docker_image() {
    let rootfs = warren_test_support::minimal_rootfs_tar(&[]);
    let mut import = Command::new("docker")
        .args(["import", "-", DOCKER_IMAGE])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut import.stdin.take().unwrap(), &rootfs).unwrap();
    assert!(import.wait().unwrap().success(), "docker import failed");
}

fn docker_available() -> bool {
    Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::main]
async fn main() {
    let idle_target: usize = std::env::args()
        .skip_while(|a| a != "--idle")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let iterations = 100;
    let server = TestServer::start_local(Path::new(env!("CARGO_BIN_EXE_warren")));
    server.workdir("bench", "projects/p").await;
    let workspace = server.workspace_of("bench");

    println!("warren local runtime vs anchors ({iterations} iterations each, this machine)\n");

    let (mut create, mut warm) = create_and_exec(&server, iterations, iterations * 3).await;
    // Both sides get the same untimed warm-up.
    let warm_up = 5;

    // bubblewrap: a fresh sandbox per command is all it offers; that is its create-and-exec
    // and also its only way to run a second command.
    let bwrap = Command::new("bwrap").arg("--version").output().is_ok();
    let mut bwrap_runs = Vec::new();
    if bwrap {
        for i in 0..iterations + warm_up {
            let started = Instant::now();
            let status = bwrap_command(&workspace, &["/bin/true"]).status().unwrap();
            if i >= warm_up {
                bwrap_runs.push(started.elapsed());
            }
            assert!(status.success(), "bwrap failed");
        }
    }
    let docker = docker_available();
    let (mut docker_run, mut docker_exec) = (Vec::new(), Vec::new());
    if docker {
        import_docker_image();
        for _ in 0..20 {
            let started = Instant::now();
            Command::new("docker")
                .args(["run", "--rm", "--network", "none", DOCKER_IMAGE, "true"])
                .status()
                .unwrap();
            docker_run.push(started.elapsed());
        }
        Command::new("docker")
            .args([
                "run",
                "-d",
                "--name",
                "warren-bench",
                DOCKER_IMAGE,
                "sleep",
                "infinity",
            ])
            .status()
            .unwrap();
        for _ in 0..50 {
            let started = Instant::now();
            Command::new("docker")
                .args(["exec", "warren-bench", "true"])
                .status()
                .unwrap();
            docker_exec.push(started.elapsed());
        }
        Command::new("docker")
            .args(["rm", "-f", "warren-bench"])
            .status()
            .unwrap();
    }

    row(
        "create + first exec (API)",
        &mut create,
        &mut bwrap_runs.clone(),
        "bwrap run",
    );
    row(
        "warm exec round trip (API)",
        &mut warm,
        &mut bwrap_runs.clone(),
        "bwrap run",
    );
    if docker {
        row(
            "create + first exec (API)",
            &mut create,
            &mut docker_run,
            "docker run",
        );
        row(
            "warm exec round trip (API)",
            &mut warm,
            &mut docker_exec,
            "docker exec",
        );
    } else {
        println!("docker: no daemon answers `docker info`; docker run/exec not measured");
    }

    // Idle runtimes: create many, each started by one exec, then measure the host.
    println!();
    let before = mem_available_kib();
    let started = Instant::now();
    let mut created = 0;
    for i in 0..idle_target {
        let (status, body) = server
            .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                "uid": "bench", "runtime_scope_id": format!("idle-{i}"), "workdir": "projects/p"
            })))
            .await;
        if status != 201 {
            println!("stopped creating at {i}: {body}");
            break;
        }
        let (status, result) = server
            .send_json(
                server
                    .request(
                        Method::POST,
                        &format!(
                            "/v1/sandboxes/{}/exec",
                            body["sandbox_id"].as_str().unwrap()
                        ),
                    )
                    .json(&json!({"argv": ["true"]})),
            )
            .await;
        if status != 200 {
            println!("runtime {i} failed to start: {result}");
            break;
        }
        created += 1;
    }
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = mem_available_kib();
    let per_runtime_kib = before.saturating_sub(after) as f64 / created.max(1) as f64;
    let mut pss_kib = 0u64;
    for entry in std::fs::read_dir(server.data_dir().join("runtimes"))
        .unwrap()
        .flatten()
    {
        let identity: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.path().join("runtime.json")).unwrap())
                .unwrap();
        let pid = identity["pid"].as_i64().unwrap();
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
            pss_kib += text
                .lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    let total_kib = meminfo_kib("MemTotal");
    println!(
        "idle runtimes created               {created} in {:.1} s ({:.1} ms each, sequential)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / created.max(1) as f64
    );
    println!(
        "host memory per idle runtime        {:.2} MiB (MemAvailable drop / runtimes); init PSS {:.2} MiB",
        per_runtime_kib / 1024.0,
        pss_kib as f64 / 1024.0 / created.max(1) as f64
    );
    println!(
        "idle runtimes that fit in RAM       ~{} (MemTotal / per-runtime)",
        (total_kib as f64 / per_runtime_kib.max(1.0)) as u64
    );
    if bwrap {
        let count = 100;
        let before = mem_available_kib();
        let mut children: Vec<_> = (0..count)
            .map(|_| {
                bwrap_command(&workspace, &["/bin/sleep", "300"])
                    .spawn()
                    .unwrap()
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = mem_available_kib();
        println!(
            "bwrap idle sandbox (sleep), memory  {:.2} MiB each ({count} sandboxes); warren/bwrap ratio {:.2}x",
            before.saturating_sub(after) as f64 / 1024.0 / count as f64,
            per_runtime_kib / (before.saturating_sub(after) as f64 / count as f64).max(1.0)
        );
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
