//! Controlling running commands and ending them: signals, resizes and kills on a command's
//! connection, killing every command, and reaping (each command's `Exited`, its cgroup kept
//! for reuse or removed).

use std::os::fd::AsFd;

use super::{pty, supervisor, sweep, RunningExec, Server, SPARE_EXEC_CGROUPS};
use crate::protocol::{self, Reply, Request};
use crate::sys;

/// Tells the provisioner a control of this command was applied ([`Reply::Applied`]), so
/// what it does next (input after a resize) comes after it.
fn applied(exec: &RunningExec) {
    if let Some(connection) = &exec.connection {
        let _ = protocol::send_frame(connection.as_fd(), &Reply::Applied, &[]);
    }
}

/// Sends `signal` to a running command, or to its process group (the command is the
/// leader of a session of its own). A command under a supervisor is reached through it:
/// the supervisor is the server's child, the command its own, so the signal's number
/// travels down the supervisor's kill pipe (`supervisor`). A command already reaped is
/// no longer in the table, so a reused pid is never signalled.
fn signal_command(exec: &RunningExec, signal: i32, group: bool) {
    let Some(number) = u8::try_from(signal)
        .ok()
        .filter(|n| (1..=supervisor::MAX_SIGNAL).contains(n))
    else {
        return;
    };
    if let Some(kill) = &exec.kill {
        let byte = if group {
            number | supervisor::GROUP_BIT
        } else {
            number
        };
        let _ = rustix::io::write(kill, &[byte]);
        return;
    }
    if exec.killed {
        return;
    }
    let _ = supervisor::deliver(exec.pid, number, group);
}

/// Kills what in the command's tree began after the runtime's clock read
/// `uptime_centis` with `last_pid` the newest pid (`sweep::Since`): one command of
/// a long-lived shell, whose shell and earlier jobs began before. The tree is the
/// command's cgroup leaf where it has one, else the subtree of its supervisor (the
/// subreaper of everything it started) or of the command itself; a process that left
/// by a double fork or `setsid` is still in it. Zombies are left to their parents.
fn kill_started_after(exec: &RunningExec, uptime_centis: u64, last_pid: Option<i32>) {
    if exec.killed {
        return;
    }
    let ticks = rustix::param::clock_ticks_per_second();
    let since = sweep::Since::new(uptime_centis, last_pid, ticks);
    let leaf = exec
        .cgroup
        .as_ref()
        .map(|cgroup| format!("/{}", cgroup.name()));
    let root = exec.pid;
    // Nothing is stopped: the shell that stays is of the same process group.
    sweep::stop_and_kill(
        sweep::Stopping::Never,
        |processes| {
            let tree = match &leaf {
                Some(leaf) => processes
                    .iter()
                    .filter(|p| in_leaf(p.pid, leaf))
                    .map(|p| p.pid)
                    .collect(),
                None => sweep::descendants(processes, root),
            };
            processes
                .iter()
                .filter(|p| !p.zombie && tree.contains(&p.pid) && since.precedes(p))
                .map(|p| p.pid)
                .collect()
        },
        || {},
    );
}

/// Whether `/proc/<pid>/cgroup` names the exec leaf `suffix` (`/<leaf name>`): true from
/// the process's joining it until it is reaped, exiting included.
fn in_leaf(pid: i32, suffix: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|text| text.lines().any(|line| line.ends_with(suffix)))
}

impl Server {
    /// The provisioner sent `Kill`, or closed the connection (it gave up on the command,
    /// or died): either way the command's whole tree is killed (I24).
    pub(super) fn on_connection_input(&mut self, pid: i32) {
        let Some(exec) = self.running.get_mut(&pid) else {
            return;
        };
        let Some(connection) = &exec.connection else {
            return;
        };
        let keep = match protocol::recv_frame::<Request>(connection.as_fd()) {
            Ok(Some((Request::Signal { signal, group }, _))) => {
                signal_command(exec, signal, group);
                applied(exec);
                return;
            }
            Ok(Some((Request::Resize(size), _))) => {
                if let Some(master) = &exec.terminal {
                    let _ = pty::resize(master, size);
                }
                applied(exec);
                return;
            }
            Ok(Some((
                Request::KillStartedAfter {
                    uptime_centis,
                    last_pid,
                },
                _,
            ))) => {
                kill_started_after(exec, uptime_centis, last_pid);
                applied(exec);
                return;
            }
            Ok(Some((Request::Kill, _))) => true,
            // Gone, or sent what it must not: the tree is killed either way (I24).
            _ => false,
        };
        if !keep {
            exec.connection = None;
        }
        exec.killed = true;
        match &exec.cgroup {
            Some(cgroup) => {
                let _ = cgroup.kill();
                let leaf = cgroup.name().to_owned();
                // The command ends only when its whole tree has: not merely gone from the
                // leaf's listing, but exited and reaped (a dying process still holds its
                // pids charge, and `ps` shows it). Its `Exited` goes out after that.
                self.settle(&leaf);
                self.reap();
            }
            // Closing the pipe tells the command's supervisor to kill its tree.
            None if exec.kill.is_some() => exec.kill = None,
            None => {
                let _ = rustix::process::kill_process_group(
                    rustix::process::Pid::from_raw(exec.pid).expect("pids are positive"),
                    rustix::process::Signal::KILL,
                );
            }
        }
    }

    /// Kills every process of the runtime but init: each running command's tree and every
    /// leaf where background processes linger (frozen, then killed: `cgroup`), then
    /// whatever no cgroup holds (no cgroups, or in a container: stopped, then killed,
    /// found through /proc). Reaps before answering, so each running command's caller gets
    /// its `Exited` and the pids are free for the next command. Returns how many
    /// processes were killed.
    pub(super) fn kill_all_commands(&mut self) -> u64 {
        let mut killed = 0;
        let mut leaves = Vec::new();
        for exec in self.running.values_mut() {
            exec.killed = true;
            if let Some(cgroup) = &exec.cgroup {
                killed += cgroup.kill().unwrap_or(0);
                leaves.push(cgroup.name().to_owned());
            }
        }
        for (cgroup, reusable) in &mut self.lingering {
            *reusable = false;
            killed += cgroup.kill().unwrap_or(0);
            leaves.push(cgroup.name().to_owned());
        }
        for leaf in &leaves {
            self.settle(leaf);
        }
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let keep = self.served.keep.clone();
        killed += sweep::stop_and_kill(
            sweep::Stopping::First,
            |processes| {
                processes
                    .iter()
                    .filter(|p| !p.zombie && p.pid != me && p.pid != 1 && !keep.contains(&p.pid))
                    .map(|p| p.pid)
                    .collect()
            },
            // Reaping waits until the sweep is done: `reap` reports each command's
            // `Exited` and recycles cgroups, and zombies are never picked meanwhile.
            || {},
        );
        self.reap();
        killed
    }

    /// Waits (up to 10 s) until no process of the exec leaf `leaf` exists any more, not even
    /// one still exiting or a zombie, reaping init's children meanwhile (handled by the next
    /// [`Server::reap`], so no `Exited` goes out before the tree is gone). The cgroup listing
    /// drops a process when it starts exiting; its `/proc/<pid>/cgroup` keeps naming the
    /// leaf until it is reaped.
    fn settle(&mut self, leaf: &str) {
        let suffix = format!("/{leaf}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            while let Ok(Some(reaped)) = sys::wait4_nohang(-1) {
                self.deferred.push(reaped);
            }
            let remaining = sweep::processes()
                .into_iter()
                .any(|p| p.pid != 1 && in_leaf(p.pid, &suffix));
            if !remaining || std::time::Instant::now() > deadline {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub(super) fn reap(&mut self) {
        let mut reaped_now = std::mem::take(&mut self.deferred);
        while let Ok(Some(reaped)) = sys::wait4_nohang(-1) {
            reaped_now.push(reaped);
        }
        for reaped in reaped_now {
            let Some(exec) = self.running.remove(&reaped.pid) else {
                continue; // an orphan re-parented to PID 1
            };
            if let Some(connection) = &exec.connection {
                let _ = protocol::send_frame(
                    connection.as_fd(),
                    &Reply::Exited {
                        exit_code: reaped.exit_code,
                        signal: reaped.signal,
                        user_us: reaped.user_us,
                        system_us: reaped.system_us,
                        max_rss_kib: reaped.max_rss_kib,
                    },
                    &[],
                );
            }
            if let Some(cgroup) = exec.cgroup {
                self.lingering.push((cgroup, !exec.killed));
            }
        }
        // Background processes may outlive their command (I6); their cgroup goes once empty.
        let lingering = std::mem::take(&mut self.lingering);
        for (cgroup, reusable) in lingering {
            if !cgroup.is_empty() {
                self.lingering.push((cgroup, reusable));
            } else if reusable && self.spare.len() < SPARE_EXEC_CGROUPS {
                self.spare.push(cgroup);
            } else {
                let _ = cgroup.remove();
            }
        }
    }
}
