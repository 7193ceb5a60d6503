//! The agent: init's control loop inside a container (the Docker backend).
//!
//! Docker builds the runtime (namespaces, root filesystem, mounts, cgroup limits, dropped
//! capabilities, its seccomp profile); the agent is the container's PID 1, started as the
//! sandbox user, and serves the same control protocol as the local runtime's init on a
//! socket in a directory shared with the provisioner. A `docker exec` costs tens of
//! milliseconds; a command through the agent costs a fork.
//!
//! ```text
//! dockerd ──▶ container PID 1: warren-agent (1000:1000, no capabilities)
//!                 └─fork─▶ supervisor (subreaper) ─fork─▶ command (+ warren's seccomp)
//! ```
//!
//! Without cgroups of its own, a command's tree is held by a *supervisor*: a process that
//! is the command's subreaper, so nothing the command starts (a `setsid`, a double fork)
//! can leave its subtree while it runs. Told to kill (its pipe closes), the supervisor
//! stops, then kills, every descendant, round after round until none is left (`sweep`),
//! then ends by SIGKILL.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use rustix::event::{PollFd, PollFlags};
use serde::{Deserialize, Serialize};

use crate::control::ExecSpec;
use crate::runtime::child::{self, Credentials};
use crate::runtime::init::Init;
use crate::seccomp::SeccompProgram;
use crate::sys::{self, Forked};

/// The argument `warren` recognises to become a container's agent.
pub const CONTAINER_AGENT_ARG: &str = "__container-agent";

/// What the agent is told on its command line (nothing secret: the sandbox's own id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConfig {
    /// The sandbox id, answered to `Ping`.
    pub sandbox: String,
    /// The generation, answered to `Ping`.
    pub generation: i64,
    /// Open files per command.
    pub nofile: u64,
    /// Serve the egress proxy port on the container's loopback.
    pub egress: bool,
    /// The directory (shared with the provisioner) to bind the control socket in.
    pub socket_dir: PathBuf,
    /// The layout's home (a tmpfs of the container's), kept open at
    /// [`crate::config::HOME_FD`] for snapshots.
    #[serde(default = "default_home")]
    pub home: PathBuf,
}

/// Containers started before layouts existed keep their home where every layout has it.
fn default_home() -> PathBuf {
    PathBuf::from(crate::config::sandbox_user().1)
}

/// Entry point of `warren __container-agent <config>`. Never returns.
pub fn container_agent_main(config: &str) -> ! {
    let result = serde_json::from_str::<AgentConfig>(config)
        .map_err(|e| format!("parse the agent config: {e}"))
        .and_then(agent);
    // Only a failure gets here; Docker keeps it in the container's log.
    let Err(error) = result;
    eprintln!("warren-agent: {error}");
    sys::exit_immediately(1)
}

fn agent(config: AgentConfig) -> Result<std::convert::Infallible, String> {
    // Nothing of the sandbox user's may read the agent's memory or trace it: it is the
    // same uid, so only this keeps ptrace and /proc/1/mem away.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("become non-dumpable: {e}"))?;
    // The home, resolved here in the container, kept where the provisioner finds it.
    let home = rustix::fs::open(
        &config.home,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("open {}: {e}", config.home.display()))?;
    let kept = rustix::io::fcntl_dupfd_cloexec(&home, crate::config::HOME_FD)
        .map_err(|e| format!("keep /home/gem open: {e}"))?;
    if std::os::fd::AsRawFd::as_raw_fd(&kept) != crate::config::HOME_FD {
        return Err("descriptor 201 is taken; cannot keep /home/gem open".into());
    }
    drop(home);
    // Held for the agent's whole life (init never returns).
    std::mem::forget(kept);
    let socket_path = config.socket_dir.join(crate::client::SOCKET_NAME);
    let _ = std::fs::remove_file(&socket_path);
    let listener =
        UnixListener::bind(&socket_path).map_err(|e| format!("bind the control socket: {e}"))?;
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("restrict the control socket: {e}"))?;
    let proxy = if config.egress {
        Some(
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, crate::config::PROXY_PORT))
                .map_err(|e| format!("bind the proxy port: {e}"))?,
        )
    } else {
        None
    };
    let init = Init::in_container(
        config.sandbox,
        config.generation,
        config.nofile,
        listener,
        proxy,
    )
    .map_err(|e| e.to_string())?;
    init.serve()
}

/// The supervisor of one command, in the process the agent forked; never returns.
///
/// It becomes the subreaper of everything the command starts, forks the command, and
/// waits. When the command ends it ends the same way (exit status or signal), leaving
/// background processes to the agent (I6). When `kill` closes first, it kills its whole
/// subtree, repeatedly until it has no child left, and ends by SIGKILL.
pub(crate) fn supervise(
    spec: &ExecSpec,
    stdio: [OwnedFd; 3],
    seccomp: &SeccompProgram,
    nofile: u64,
    kill: OwnedFd,
    error_pipe: OwnedFd,
) -> ! {
    let fail = |stage: &str, errno: i32| -> ! {
        let _ = rustix::io::write(&error_pipe, format!("{stage} {errno}").as_bytes());
        sys::exit_immediately(127)
    };
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        fail("subreaper", e.raw_os_error());
    }
    let sigchld = match sys::sigchld_fd() {
        Ok(fd) => fd,
        Err(e) => fail("signalfd", e.raw_os_error().unwrap_or(0)),
    };
    let command = match sys::fork_single_threaded() {
        Ok(Forked::Child) => {
            drop((kill, sigchld));
            child::exec_command(
                spec,
                stdio,
                None,
                seccomp,
                nofile,
                Credentials::AlreadySandboxUser,
                error_pipe,
            )
        }
        Ok(Forked::Parent(pid)) => pid,
        Err(e) => fail("fork", e.raw_os_error().unwrap_or(0)),
    };
    drop(stdio);
    drop(error_pipe);
    let mut killing = false;
    let mut ended = None;
    loop {
        if !killing {
            let mut fds = [
                PollFd::new(&sigchld, PollFlags::IN),
                PollFd::new(&kill, PollFlags::IN),
            ];
            if rustix::event::poll(&mut fds, None).is_err() {
                continue;
            }
            killing = !fds[1].revents().is_empty();
        }
        sys::drain_signalfd(sigchld.as_fd());
        while let Ok(Some(reaped)) = sys::wait4_nohang(-1) {
            if reaped.pid == command {
                ended = Some(reaped);
            }
        }
        if killing {
            kill_subtree();
            if has_no_children() {
                end_like(Some(libc::SIGKILL), None)
            }
            // Killed processes may still be settling before they can be reaped.
            std::thread::sleep(std::time::Duration::from_millis(1));
        } else if let Some(reaped) = &ended {
            end_like(reaped.signal, reaped.exit_code)
        }
    }
}

/// Stops, then kills, every descendant of this process, found through the pid namespace's
/// /proc (the container's: small), until none is left (see `sweep`). A child forked during
/// a round is a descendant of a process being killed; as subreaper this process inherits
/// it, and the next round finds it.
fn kill_subtree() {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    crate::runtime::sweep::stop_and_kill(
        |processes| crate::runtime::sweep::descendants(processes, me),
        || while let Ok(Some(_)) = sys::wait4_nohang(-1) {},
    );
}

/// Whether this process has no child left at all. (`wait`, the `-1` of `waitpid`: the
/// command and its tree run in sessions and process groups of their own.)
fn has_no_children() -> bool {
    matches!(
        rustix::process::wait(rustix::process::WaitOptions::NOHANG),
        Err(rustix::io::Errno::CHILD)
    )
}

/// Ends this process the way the command ended: the agent's `wait4` then reports the same
/// status, with the CPU and memory of the command and everything this process reaped.
fn end_like(signal: Option<i32>, exit_code: Option<i32>) -> ! {
    if let Some(signal) = signal {
        sys::die_by_signal(signal);
    }
    sys::exit_immediately(exit_code.unwrap_or(1))
}
