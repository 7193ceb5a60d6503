//! The shim of a gVisor runtime: `warren __runtime-init gvisor-shim` (issue 19).
//!
//! `runsc create` leaves the sandbox's processes (the Sentry, the gofer, helpers of their
//! start) behind as orphans, and orphans go to the nearest subreaper: warren itself, which
//! is one for the local runtime's inits. Nothing in warren would reap them, and `runsc
//! delete` waits until the sandbox's process is gone, which a zombie never is. So the
//! sandbox is started by this small process instead, itself a subreaper: it runs `runsc
//! create` and `runsc start`, reports one JSON line (`{"ok":true}` or `{"error":"…"}`),
//! and then reaps every descendant until none is left, which is when the sandbox ended.
//! It holds nothing of the sandbox: killing it leaves the sandbox running (its processes
//! then go to the next subreaper up), and runsc alone stops it.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// The second argument of `warren __runtime-init` that makes it a gVisor shim.
pub(crate) const SHIM_ARG: &str = "gvisor-shim";

/// What the shim is told on its stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ShimRequest {
    /// The runsc executable.
    pub(crate) runsc: PathBuf,
    /// The global flags of every call ([`super::cli::Runsc::global_args`]).
    pub(crate) global: Vec<String>,
    /// The OCI bundle directory.
    pub(crate) bundle: PathBuf,
    /// The container id.
    pub(crate) id: String,
    /// Where runsc's own log and the agent's stdout and stderr go (a file: a pipe would be
    /// held open by the sandbox for its whole life).
    pub(crate) log: PathBuf,
}

/// Entry point of the shim. Never returns.
pub(crate) fn shim_main() -> ! {
    // Every orphan of the sandbox's start is this process's to reap, not warren's.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let line = match start() {
        Ok(()) => serde_json::json!({ "ok": true }),
        Err(error) => serde_json::json!({ "error": error }),
    };
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    // warren reads one line; nothing of the pipe is kept for the sandbox's life.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            // No child left: the sandbox ended (or never started).
            Err(_) => warren_agent::sys::exit_immediately(0),
        }
    }
}

fn start() -> Result<(), String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("read the shim request: {e}"))?;
    let request: ShimRequest =
        serde_json::from_str(&input).map_err(|e| format!("parse the shim request: {e}"))?;
    let log = |what: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&request.log)
            .map_err(|e| format!("open the runtime's log for {what}: {e}"))
    };
    let run = |args: &[&str]| -> Result<(), String> {
        let status = Command::new(&request.runsc)
            .args(&request.global)
            .arg(format!("--log={}", request.log.display()))
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(log("stdout")?)
            .stderr(log("stderr")?)
            .status()
            .map_err(|e| format!("run runsc: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "`runsc {}` failed ({status}): {}",
                args[0],
                super::cli::log_tail(&request.log)
            ))
        }
    };
    let bundle = request.bundle.to_string_lossy().into_owned();
    run(&["create", "--bundle", &bundle, &request.id])?;
    run(&["start", &request.id])
}
