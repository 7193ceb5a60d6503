//! runsc's command line, as the local backend drives it (issue 19): every call names
//! warren's own state root (`--root <data>/runsc`), so warren never sees or touches
//! another runtime's sandboxes (Docker's runsc, a probe's), and each is bounded in time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;

/// How long `runsc state`, `list`, `kill` and `delete` may take (delete waits for the
/// sandbox's processes to be gone: a few hundred milliseconds).
const COMMAND_LIMIT: Duration = Duration::from_secs(20);

/// The runsc this backend runs sandboxes with, and the flags every call carries.
#[derive(Debug, Clone)]
pub(crate) struct Runsc {
    /// The runsc executable (the probe's).
    pub(crate) program: PathBuf,
    /// warren's own state root: `<data>/runsc`.
    pub(crate) root: PathBuf,
    /// `ptrace` or `kvm`, as the probe chose it.
    pub(crate) platform: &'static str,
}

/// What `runsc state` says of a container.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ContainerState {
    /// `created`, `running`, `stopped`, ...
    pub(crate) status: String,
    /// The host pid of the sandbox process (`runsc-sandbox`); -1 or 0 once stopped.
    #[serde(default)]
    pub(crate) pid: i32,
}

impl Runsc {
    /// The global flags of every call: the state root, the platform, no network (the
    /// runtime has loopback only; its agent relays egress to the provisioner), and host Unix
    /// sockets creatable, so the agent's control socket in `/run/warren` is the host's.
    pub(crate) fn global_args(&self) -> Vec<String> {
        vec![
            format!("--root={}", self.root.display()),
            format!("--platform={}", self.platform),
            "--network=none".to_owned(),
            "--host-uds=create".to_owned(),
        ]
    }

    async fn call(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(self.global_args())
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match tokio::time::timeout(COMMAND_LIMIT, command.output()).await {
            Ok(output) => output,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "`runsc {}` did not finish within {} s",
                    args.join(" "),
                    COMMAND_LIMIT.as_secs()
                ),
            )),
        }
    }

    /// The container's state, or `None` when runsc does not know it.
    pub(crate) async fn state(&self, id: &str) -> Option<ContainerState> {
        let output = self.call(&["state", id]).await.ok()?;
        if !output.status.success() {
            return None;
        }
        serde_json::from_slice(&output.stdout).ok()
    }

    /// The ids of every container under warren's state root.
    pub(crate) async fn list(&self) -> std::io::Result<Vec<String>> {
        let output = self.call(&["list", "-quiet"]).await?;
        if !output.status.success() {
            return Err(failed("list", &output));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect())
    }

    /// Kills the sandbox and removes the container's state. Idempotent: a container runsc
    /// does not know is fine.
    pub(crate) async fn destroy(&self, id: &str) -> std::io::Result<()> {
        if self.state(id).await.is_none() {
            return Ok(());
        }
        // `kill` fails on a container that stopped already; `delete --force` is what counts.
        let _ = self.call(&["kill", id, "KILL"]).await;
        let output = self.call(&["delete", "--force", id]).await?;
        if !output.status.success() && self.state(id).await.is_some() {
            return Err(failed("delete --force", &output));
        }
        Ok(())
    }
}

fn failed(what: &str, output: &std::process::Output) -> std::io::Error {
    std::io::Error::other(format!(
        "`runsc {what}` failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The last few lines of a runsc log, for an error message.
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let tail = lines[lines.len().saturating_sub(4)..].join(" / ");
    match tail.char_indices().nth_back(600) {
        Some((start, _)) => format!("…{}", &tail[start..]),
        None => tail,
    }
}
