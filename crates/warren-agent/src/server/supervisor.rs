//! The supervisor of one command where the runtime has no cgroups (a container, a pod).
//!
//! Without cgroups of its own, a command's tree is held by a *supervisor*: a process that
//! is the command's subreaper, so nothing the command starts (a `setsid`, a double fork)
//! can leave its subtree while it runs. Told to kill (its pipe closes), the supervisor
//! stops, then kills, every descendant, round after round until none is left (`sweep`),
//! then ends by SIGKILL.

use std::os::fd::{AsFd, OwnedFd};

use rustix::event::{PollFd, PollFlags};

use crate::protocol::ExecSpec;
use crate::seccomp::SeccompProgram;
use crate::server::child::{self, Credentials};
use crate::sys::{self, Forked};

/// The highest signal number Linux knows (`SIGRTMAX`).
pub(crate) const MAX_SIGNAL: u8 = 64;

/// Set in a signal byte on the kill pipe: the signal goes to the command's process group.
pub(crate) const GROUP_BIT: u8 = 0x80;

/// Sends signal `number` to `pid`, or to its process group.
pub(crate) fn deliver(pid: i32, number: u8, group: bool) -> std::io::Result<()> {
    sys::send_signal(pid, i32::from(number), group)
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
            if !fds[1].revents().is_empty() {
                killing = forward_signals(&kill, command, ended.is_some());
            }
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

/// Reads the kill pipe: signal bytes go to the command (not once it has ended: its pid
/// may be anyone's by then); `true` when the pipe closed, which means kill.
fn forward_signals(kill: &OwnedFd, command: i32, ended: bool) -> bool {
    let mut bytes = [0u8; 64];
    match rustix::io::read(kill, &mut bytes) {
        Ok(0) => true,
        Ok(n) => {
            for byte in &bytes[..n] {
                let number = byte & !GROUP_BIT;
                if !ended && (1..=MAX_SIGNAL).contains(&number) {
                    let _ = deliver(command, number, byte & GROUP_BIT != 0);
                }
            }
            false
        }
        Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => false,
        Err(_) => true,
    }
}

/// Stops, then kills, every descendant of this process, found through the pid namespace's
/// /proc (the container's: small), until none is left (see `sweep`). A child forked during
/// a round is a descendant of a process being killed; as subreaper this process inherits
/// it, and the next round finds it.
fn kill_subtree() {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    crate::server::sweep::stop_and_kill(
        crate::server::sweep::Stopping::First,
        |processes| crate::server::sweep::descendants(processes, me),
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
