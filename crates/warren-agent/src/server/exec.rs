//! Starting a command: its stdio (on a terminal, with its relay, or as sent), its cgroup
//! or supervisor, the fork and exec, and the answer that it started or why it did not.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};

use super::{child, pty, supervisor, Credentials, RunningExec, Server};
use crate::protocol::{self, ExecSpec, Reply};
use crate::sys::{self, Forked};

impl Server {
    pub(super) fn start(&mut self, connection: OwnedFd, spec: ExecSpec, stdio: Vec<OwnedFd>) {
        let Some((connection, stdio, terminal)) = self.command_stdio(connection, &spec, stdio)
        else {
            return;
        };
        let reply = |reply: &Reply| {
            let _ = protocol::send_frame(connection.as_fd(), reply, &[]);
        };
        // A runtime with cgroups runs no command outside one: its tree could not be
        // killed (I24).
        let cgroup = match (self.spare.pop(), &self.groups) {
            (Some(spare), _) => Some(spare),
            (None, None) => None,
            (None, Some(groups)) => {
                self.next_exec += 1;
                match groups.group(self.next_exec) {
                    Ok(group) => Some(group),
                    Err(error) => {
                        reply(&Reply::Failed {
                            stage: "cgroup".into(),
                            errno: error.raw_os_error().unwrap_or(libc::EIO),
                        });
                        return;
                    }
                }
            }
        };
        let Ok((error_read, error_write)) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        else {
            reply(&Reply::Failed {
                stage: "pipe".into(),
                errno: libc::EMFILE,
            });
            if let Some(cgroup) = cgroup {
                let _ = cgroup.remove();
            }
            return;
        };
        // In a container nothing can kill a tree as a cgroup does: each command gets a
        // supervisor that is its subreaper, and kills every descendant when told to.
        let kill_pipe = if self.served.credentials == Credentials::AlreadySandboxUser {
            match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
                Ok(pair) => Some(pair),
                Err(error) => {
                    reply(&Reply::Failed {
                        stage: "pipe".into(),
                        errno: error.raw_os_error(),
                    });
                    return;
                }
            }
        } else {
            None
        };
        let spawned = match cgroup.as_ref().and_then(|c| c.spawn_target()) {
            Some(target) => sys::fork_into_cgroup(target),
            None => sys::fork_single_threaded(),
        };
        let (kill_read, kill_write) = kill_pipe.map_or((None, None), |(r, w)| (Some(r), Some(w)));
        let child = match spawned {
            Ok(Forked::Child) => {
                drop(error_read);
                drop(kill_write);
                if let Some(kill_read) = kill_read {
                    // Other commands' kill pipes must close when the agent closes them.
                    self.forget_commands();
                    supervisor::supervise(
                        &spec,
                        stdio,
                        &self.seccomp,
                        self.served.nofile,
                        kill_read,
                        error_write,
                    )
                }
                child::exec_command(
                    &spec,
                    stdio,
                    cgroup.as_deref(),
                    &self.seccomp,
                    self.served.nofile,
                    self.served.credentials,
                    error_write,
                )
            }
            Ok(Forked::Parent(pid)) => pid,
            Err(error) => {
                reply(&Reply::Failed {
                    stage: "fork".into(),
                    errno: error.raw_os_error().unwrap_or(0),
                });
                if let Some(cgroup) = cgroup {
                    let _ = cgroup.remove();
                }
                return;
            }
        };
        drop(stdio);
        drop(error_write);
        drop(kill_read);
        // The child closes its end by exec (CLOEXEC) or writes why it failed.
        let mut failure = String::new();
        let _ = std::fs::File::from(error_read).read_to_string(&mut failure);
        if let Some((stage, errno)) = failure.rsplit_once(' ') {
            reply(&Reply::Failed {
                stage: stage.to_owned(),
                errno: errno.parse().unwrap_or(0),
            });
            // The child exits at once; reap() collects it with nobody left to tell.
            self.running.insert(
                child,
                RunningExec {
                    connection: None,
                    pid: child,
                    cgroup,
                    kill: kill_write,
                    killed: false,
                    terminal: None,
                },
            );
            return;
        }
        reply(&Reply::Started {
            pid: child,
            stdin_window: None,
        });
        self.running.insert(
            child,
            RunningExec {
                connection: Some(connection),
                pid: child,
                cgroup,
                kill: kill_write,
                killed: false,
                terminal,
            },
        );
    }

    /// The command's stdio from the three descriptors of its request: as they are, or on a
    /// terminal (`pty`) with its relay started and the server's copy of its master. `None`
    /// when the request was refused or failed (answered here).
    fn command_stdio(
        &mut self,
        connection: OwnedFd,
        spec: &ExecSpec,
        stdio: Vec<OwnedFd>,
    ) -> Option<(OwnedFd, [OwnedFd; 3], Option<OwnedFd>)> {
        let answer = |reply: &Reply| {
            let _ = protocol::send_frame(connection.as_fd(), reply, &[]);
        };
        let Ok(stdio) = <[OwnedFd; 3]>::try_from(stdio) else {
            answer(&Reply::Refused {
                reason: "an exec request carries exactly three descriptors".into(),
            });
            return None;
        };
        let Some(size) = spec.pty else {
            return Some((connection, stdio, None));
        };
        match self.start_terminal(size, stdio, connection) {
            Ok((connection, stdio, master)) => Some((connection, stdio, Some(master))),
            Err((error, connection)) => {
                let _ = protocol::send_frame(
                    connection.as_fd(),
                    &Reply::Failed {
                        stage: "pty".into(),
                        errno: error.raw_os_error().unwrap_or(libc::EIO),
                    },
                    &[],
                );
                None
            }
        }
    }

    /// Opens a terminal for a command and forks its relay between the provisioner's
    /// pipes (`provisioner`: input, output, and a third that closes at once) and the
    /// terminal. Returns the command's stdio (the terminal thrice) and the server's copy of
    /// the master, for resizes. The relay holds no copy of the slave side, so it ends once
    /// the command and whatever it left running closed the terminal.
    fn start_terminal(
        &mut self,
        size: protocol::PtySize,
        provisioner: [OwnedFd; 3],
        connection: OwnedFd,
    ) -> Result<(OwnedFd, [OwnedFd; 3], OwnedFd), (std::io::Error, OwnedFd)> {
        let opened = pty::open(size).and_then(|pty::Terminal { master, slave }| {
            let stdio = [slave.try_clone()?, slave.try_clone()?, slave];
            let relayed = master.try_clone()?;
            Ok((stdio, master, relayed))
        });
        let (stdio, master, relayed) = match opened {
            Ok(opened) => opened,
            Err(error) => return Err((error, connection)),
        };
        let [input, output, _closed] = provisioner;
        match sys::fork_single_threaded() {
            Ok(Forked::Child) => {
                self.forget_commands();
                drop((stdio, master, connection));
                // Only bytes pass through it: it needs nothing of root's.
                if matches!(
                    self.served.credentials,
                    Credentials::Root | Credentials::SentryRoot
                ) && child::become_sandbox_user(self.served.credentials).is_err()
                {
                    sys::exit_immediately(1)
                }
                pty::relay(input, output, relayed)
            }
            // Collected by `reap` like any orphan.
            Ok(Forked::Parent(_)) => Ok((connection, stdio, master)),
            Err(error) => Err((error, connection)),
        }
    }
}
