//! Work the server forks a child for besides commands: handing proxy connections to the
//! provisioner (or relaying them), moving the home, and file operations as the sandbox user.

use std::os::fd::{AsFd, OwnedFd};

use super::{child, relay, Credentials, Server};
use crate::protocol::{self, Reply};
use crate::sys::{self, Forked};

impl Server {
    /// Hands each process that connected to the proxy port to the provisioner, which
    /// applies the sandbox's network policy; without a provisioner the connection closes.
    /// In a gVisor sandbox no descriptor leaves the runtime: the connection waits here for
    /// the provisioner's socket instead (`relay`).
    pub(super) fn on_proxy_connections(&mut self) {
        let Some(proxy) = &self.proxy else { return };
        let relayed = self.served.credentials == Credentials::SentryRoot;
        while let Ok((stream, _)) = proxy.accept() {
            let Some(egress) = &self.egress else { continue };
            let sent = if relayed {
                let id = self.waiting.hold(OwnedFd::from(stream));
                protocol::send_frame(egress.as_fd(), &Reply::ConnectionWanted { id }, &[])
            } else {
                protocol::send_frame(egress.as_fd(), &Reply::Connection, &[stream.as_fd()])
            };
            if sent.is_err() {
                self.egress = None;
                self.waiting.clear();
            }
        }
    }

    /// The provisioner's end for waiting connection `id` arrived: a child relays between
    /// the two (as the sandbox user: it only moves bytes) until the connection is done;
    /// [`Server::reap`] collects it like any orphan.
    pub(super) fn start_relay(&mut self, id: u64, mut fds: Vec<OwnedFd>) {
        let (Some(provisioner), true) = (fds.pop(), fds.is_empty()) else {
            return;
        };
        let Some(stream) = self.waiting.take(id) else {
            return;
        };
        if let Ok(Forked::Child) = sys::fork_single_threaded() {
            self.forget_commands();
            if self.served.credentials == Credentials::SentryRoot
                && child::become_sandbox_user(self.served.credentials).is_err()
            {
                sys::exit_immediately(1)
            }
            relay::relay(stream, provisioner)
        }
    }

    /// Moves the runtime's home (I30) through the one pipe end attached: out as a tar
    /// stream (`archive`) or in from one. Where the host cannot reach the home by
    /// descriptor (a gVisor sandbox: the agent's descriptors live in the Sentry), this is
    /// the way. A child does the work and answers [`Reply::Moved`] on the connection, so the
    /// server never blocks on the pipe; [`Server::reap`] collects it like any orphan.
    pub(super) fn move_home(
        &mut self,
        connection: OwnedFd,
        mut fds: Vec<OwnedFd>,
        limit: u64,
        archive: bool,
    ) {
        let refuse = |reason: String| {
            let _ = protocol::send_frame(connection.as_fd(), &Reply::Refused { reason }, &[]);
        };
        let (Some(pipe), true) = (fds.pop(), fds.is_empty()) else {
            return refuse("a home move carries exactly one pipe".into());
        };
        // Only a server that is (or can become) exactly the sandbox user moves a home: the
        // local kernel tier's init is root of its runtime, and its host reads the home by
        // descriptor instead, as it always has.
        if !matches!(
            self.served.credentials,
            Credentials::AlreadySandboxUser | Credentials::SentryRoot
        ) {
            return refuse(
                "this runtime's home is read by descriptor on the host, not moved through it"
                    .into(),
            );
        }
        match sys::fork_single_threaded() {
            Ok(Forked::Child) => {
                // Commands' kill pipes must close when the server closes them.
                self.forget_commands();
                // What the sandbox user could read, written as the sandbox user: the
                // agent of a gVisor sandbox is the Sentry's root (issue 19).
                if self.served.credentials == Credentials::SentryRoot {
                    if let Err((stage, error)) = child::become_sandbox_user(self.served.credentials)
                    {
                        let reason = format!("become the sandbox user ({stage}): {error}");
                        let _ = protocol::send_frame(
                            connection.as_fd(),
                            &Reply::Refused { reason },
                            &[],
                        );
                        sys::exit_immediately(1)
                    }
                }
                let moved = crate::home::open_kept_home().and_then(|home| {
                    if archive {
                        crate::home::archive(home.as_fd(), std::fs::File::from(pipe), limit)
                    } else {
                        crate::home::restore(home.as_fd(), std::fs::File::from(pipe), limit)
                    }
                });
                let reply = match moved {
                    Ok(moved) => Reply::Moved {
                        entries: moved.entries,
                        bytes: moved.bytes,
                        skipped: moved.skipped,
                    },
                    Err(error) => Reply::Refused {
                        reason: error.to_string(),
                    },
                };
                let _ = protocol::send_frame(connection.as_fd(), &reply, &[]);
                sys::exit_immediately(0)
            }
            Ok(Forked::Parent(_)) => {}
            Err(error) => refuse(format!("fork: {error}")),
        }
    }

    /// Runs one file operation in a child that becomes the sandbox user first (I11), in
    /// the runtime's own mount namespace and root, so the answer is what a command of the
    /// sandbox would see; a write's bytes come through the one pipe attached, a read's go
    /// into it after [`Reply::File`]. [`Server::reap`] collects the child like any orphan.
    pub(super) fn file(
        &mut self,
        connection: OwnedFd,
        mut fds: Vec<OwnedFd>,
        op: warren_backend::FileOp,
    ) {
        let refuse = |reason: String| {
            let _ = protocol::send_frame(connection.as_fd(), &Reply::Refused { reason }, &[]);
        };
        let (Some(pipe), true) = (fds.pop(), fds.is_empty()) else {
            return refuse("a file operation carries exactly one pipe".into());
        };
        match sys::fork_single_threaded() {
            Ok(Forked::Child) => {
                self.forget_commands();
                if let Err((stage, error)) = child::become_sandbox_user(self.served.credentials) {
                    refuse(format!("become the sandbox user ({stage}): {error}"));
                    sys::exit_immediately(1)
                }
                // It holds a copy of the server's memory: no command of the sandbox user
                // may read it through /proc.
                let _ = rustix::process::set_dumpable_behavior(
                    rustix::process::DumpableBehavior::NotDumpable,
                );
                let pipe = std::fs::File::from(pipe);
                let (answer, data) = if op.sends_data() {
                    crate::files::serve(&op, &pipe)
                } else {
                    crate::files::serve(&op, std::io::empty())
                };
                let replied =
                    protocol::send_frame(connection.as_fd(), &Reply::File { answer }, &[]);
                if replied.is_ok() && !data.is_empty() {
                    use std::io::Write;
                    let _ = (&pipe).write_all(&data);
                }
                sys::exit_immediately(0)
            }
            Ok(Forked::Parent(_)) => {}
            Err(error) => refuse(format!("fork: {error}")),
        }
    }
}
