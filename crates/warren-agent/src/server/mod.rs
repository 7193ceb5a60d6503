//! The in-runtime server: the one process that runs a runtime's commands and answers the
//! control protocol ([`crate::protocol`]), whichever backend built the runtime.
//!
//! In the local runtime it is init (PID 1 of the runtime's namespaces, after
//! `warren-isolation` assembled the root); in a container or a pod it is the agent
//! ([`crate::container`]). It accepts connections on its Unix socket, or from its TCP
//! gateway ([`crate::gateway`]) as descriptors over a channel, forks each command (into a
//! cgroup of its own where the runtime has them, [`CommandGroups`]; under a subreaper
//! supervisor where it has none, `supervisor`), reports `Started`/`Exited` with rusage,
//! and kills a command's tree on `Kill` or when its connection closes (I24).
//!
//! The server never starts a thread: it forks.

pub(crate) mod child;
mod control;
mod exec;
mod forked_work;
mod pty;
mod relay;
pub mod sentry_groups;
pub(crate) mod supervisor;
pub mod sweep;

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;

use rustix::event::{PollFd, PollFlags};

pub use child::Credentials;

use crate::protocol::{self, Reply, Request};
use crate::seccomp::SeccompProgram;
use crate::sys;

/// The cgroups of one runtime, as the server uses them: a leaf per command, so a timeout
/// or kill reaches the command's whole tree. `warren-isolation` implements it; a runtime
/// without cgroups of its own (a container, a pod) has none and uses supervisors.
pub trait CommandGroups: Send {
    /// An empty group for the `n`-th command of this runtime.
    fn group(&self, n: u64) -> std::io::Result<Box<dyn CommandGroup>>;
}

/// One command's group (a cgroup leaf).
pub trait CommandGroup {
    /// Its name, as the lines of `/proc/<pid>/cgroup` end.
    fn name(&self) -> &str;
    /// The directory to spawn into with `CLONE_INTO_CGROUP`, when the kernel can.
    fn spawn_target(&self) -> Option<BorrowedFd<'_>>;
    /// Moves the calling process in (in the forked child, when it could not be spawned
    /// there).
    fn add_self(&self) -> Result<(), rustix::io::Errno>;
    /// Kills every process in it; how many there were.
    fn kill(&self) -> std::io::Result<u64>;
    /// Whether no process is left in it.
    fn is_empty(&self) -> bool;
    /// Removes it (it must be empty).
    fn remove(self: Box<Self>) -> std::io::Result<()>;
}

/// A failed setup step, reported by name.
#[derive(Debug)]
pub struct SetupError {
    /// What was being done.
    pub stage: &'static str,
    /// Why it failed.
    pub source: std::io::Error,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.source)
    }
}

/// `result` as the setup step `stage`.
pub fn step<T>(stage: &'static str, result: std::io::Result<T>) -> Result<T, SetupError> {
    result.map_err(|source| SetupError { stage, source })
}

/// What a server serves as and where its connections come from.
pub struct ServerConfig {
    /// Who this runtime is, for `Ping`.
    pub sandbox: String,
    /// Its generation, for `Ping`.
    pub generation: i64,
    /// Open files per command.
    pub nofile: u64,
    /// How commands become the sandbox user.
    pub credentials: Credentials,
    /// The control socket, where the provisioner connects on this host.
    pub listener: Option<UnixListener>,
    /// The channel the TCP gateway hands authenticated connections over, one descriptor
    /// per frame ([`crate::gateway`]). The server ends when it closes: a runtime nobody
    /// can reach any more must not run on.
    pub gateway: Option<OwnedFd>,
    /// The proxy port inside the runtime, for network `open` and `allowlist`.
    pub proxy: Option<std::net::TcpListener>,
    /// The runtime's cgroups, when it has them.
    pub groups: Option<Box<dyn CommandGroups>>,
    /// Processes `KillAll` never kills besides the server itself and PID 1 (the gateway).
    pub keep: Vec<i32>,
}

/// Processes of the runtime's pid namespace other than init, the runtime's own machinery
/// and the trees of the `quiet` pids, from its own /proc.
fn processes_besides(keep: &[i32], quiet: &[i32]) -> u64 {
    if quiet.is_empty() {
        return std::fs::read_dir("/proc").map_or(0, |entries| {
            entries
                .flatten()
                .filter(|e| {
                    e.file_name().to_str().is_some_and(|n| {
                        n.bytes().all(|b| b.is_ascii_digit())
                            && n.parse::<i32>()
                                .is_ok_and(|pid| pid != 1 && !keep.contains(&pid))
                    })
                })
                .count() as u64
        });
    }
    let listed = sweep::processes();
    count_outside(&listed, keep, quiet)
}

/// How many of `listed` are neither init, nor in `keep`, nor in the tree of a `quiet` pid
/// (walking parents: a quiet process's children, and theirs, are quiet too).
fn count_outside(listed: &[sweep::Process], keep: &[i32], quiet: &[i32]) -> u64 {
    let parents: std::collections::HashMap<i32, i32> =
        listed.iter().map(|p| (p.pid, p.ppid)).collect();
    let in_quiet_tree = |mut pid: i32| {
        // Bounded by the listing's size: a parent loop (impossible in /proc) ends too.
        for _ in 0..=listed.len() {
            if quiet.contains(&pid) {
                return true;
            }
            match parents.get(&pid) {
                Some(&parent) if parent > 1 => pid = parent,
                _ => return false,
            }
        }
        false
    };
    listed
        .iter()
        .filter(|p| p.pid != 1 && !keep.contains(&p.pid) && !in_quiet_tree(p.pid))
        .count() as u64
}

/// How many empty exec cgroups the server keeps for reuse.
const SPARE_EXEC_CGROUPS: usize = 8;

/// A command started on one control connection.
struct RunningExec {
    connection: Option<OwnedFd>,
    pid: i32,
    cgroup: Option<Box<dyn CommandGroup>>,
    /// Without cgroups: the command's supervisor kills its whole tree when this closes
    /// (see `supervisor`).
    kill: Option<OwnedFd>,
    /// Its tree was killed; its cgroup is removed, never reused (a kill may still be
    /// settling in it).
    killed: bool,
    /// The master side of its terminal, kept to set the terminal's size (`pty`).
    terminal: Option<OwnedFd>,
}

/// What a server serves as: its identity and how its commands start.
struct Served {
    sandbox: String,
    generation: i64,
    nofile: u64,
    credentials: Credentials,
    /// Processes that are the runtime's own besides the server (the gateway).
    keep: Vec<i32>,
}

/// The server; [`Server::serve`] runs it.
pub struct Server {
    served: Served,
    groups: Option<Box<dyn CommandGroups>>,
    listener: Option<UnixListener>,
    gateway: Option<OwnedFd>,
    sigchld: OwnedFd,
    seccomp: SeccompProgram,
    running: HashMap<i32, RunningExec>,
    /// Exec cgroups whose command ended while background processes still ran in them.
    lingering: Vec<(Box<dyn CommandGroup>, bool)>,
    /// Children reaped while a kill settled, handled by the next [`Server::reap`].
    deferred: Vec<sys::Reaped>,
    /// Empty exec cgroups kept for the next commands: creating and removing a cgroup per
    /// command costs more than the command itself often does.
    spare: Vec<Box<dyn CommandGroup>>,
    next_exec: u64,
    /// The proxy port inside the runtime, for network `open` and `allowlist`.
    proxy: Option<std::net::TcpListener>,
    /// Where accepted proxy connections go: the provisioner's egress connection.
    egress: Option<OwnedFd>,
    /// Accepted proxy connections waiting for the provisioner's socket, where they cannot
    /// be handed over (gVisor: `relay`).
    waiting: relay::Waiting,
}

/// What one poll slot watches.
#[derive(Clone, Copy)]
enum Slot {
    Listener,
    Gateway,
    Child,
    Proxy,
    Egress,
    Exec(i32),
}

impl Server {
    /// Blocks SIGCHLD (into a signalfd), compiles the commands' seccomp filter and makes
    /// the sockets non-blocking for the event loop. Call it in the process that will
    /// serve, single-threaded.
    pub fn new(config: ServerConfig) -> Result<Self, SetupError> {
        let sigchld = step("block SIGCHLD", sys::sigchld_fd())?;
        let seccomp = SeccompProgram::runtime_policy().map_err(|e| SetupError {
            stage: "compile the seccomp policy",
            source: std::io::Error::other(e.to_string()),
        })?;
        if let Some(listener) = &config.listener {
            step(
                "make the control socket non-blocking",
                listener.set_nonblocking(true),
            )?;
        }
        if let Some(proxy) = &config.proxy {
            step(
                "make the proxy port non-blocking",
                proxy.set_nonblocking(true),
            )?;
        }
        Ok(Self {
            served: Served {
                sandbox: config.sandbox,
                generation: config.generation,
                nofile: config.nofile,
                credentials: config.credentials,
                keep: config.keep,
            },
            groups: config.groups,
            listener: config.listener,
            gateway: config.gateway,
            sigchld,
            seccomp,
            running: HashMap::new(),
            lingering: Vec::new(),
            deferred: Vec::new(),
            spare: Vec::new(),
            proxy: config.proxy,
            egress: None,
            waiting: relay::Waiting::default(),
            next_exec: 0,
        })
    }

    /// Serves until killed (or, with a gateway, until the gateway's channel closes).
    pub fn serve(mut self) -> ! {
        loop {
            let mut watched: Vec<(Slot, BorrowedFd<'_>)> = Vec::new();
            if let Some(listener) = &self.listener {
                watched.push((Slot::Listener, listener.as_fd()));
            }
            if let Some(gateway) = &self.gateway {
                watched.push((Slot::Gateway, gateway.as_fd()));
            }
            watched.push((Slot::Child, self.sigchld.as_fd()));
            if let Some(proxy) = &self.proxy {
                watched.push((Slot::Proxy, proxy.as_fd()));
            }
            if let Some(egress) = &self.egress {
                watched.push((Slot::Egress, egress.as_fd()));
            }
            for (pid, exec) in &self.running {
                if let Some(connection) = &exec.connection {
                    watched.push((Slot::Exec(*pid), connection.as_fd()));
                }
            }
            let mut fds: Vec<PollFd<'_>> = watched
                .iter()
                .map(|(_, fd)| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
                .collect();
            if rustix::event::poll(&mut fds, None).is_err() {
                continue;
            }
            let ready: Vec<Slot> = watched
                .iter()
                .zip(&fds)
                .filter(|(_, fd)| !fd.revents().is_empty())
                .map(|((slot, _), _)| *slot)
                .collect();
            drop(fds);
            drop(watched);
            // Handled in this order: a closed egress connection before new proxy
            // connections are handed to it, reaping before a hung-up command is killed,
            // and new connections last.
            let has = |wanted: fn(&Slot) -> bool| ready.iter().any(wanted);
            if has(|s| matches!(s, Slot::Egress)) {
                // The provisioner only ever reads from it: input means it went away.
                self.egress = None;
                self.waiting.clear();
            }
            if has(|s| matches!(s, Slot::Proxy)) {
                self.on_proxy_connections();
            }
            if has(|s| matches!(s, Slot::Child)) {
                sys::drain_signalfd(self.sigchld.as_fd());
                self.reap();
            }
            for slot in &ready {
                if let Slot::Exec(pid) = slot {
                    self.on_connection_input(*pid);
                }
            }
            if has(|s| matches!(s, Slot::Listener)) {
                let accepted: Vec<OwnedFd> = match &self.listener {
                    Some(listener) => std::iter::from_fn(|| listener.accept().ok())
                        .map(|(stream, _)| OwnedFd::from(stream))
                        .collect(),
                    None => Vec::new(),
                };
                for connection in accepted {
                    self.on_connection(connection);
                }
            }
            if has(|s| matches!(s, Slot::Gateway)) {
                self.on_gateway();
            }
        }
    }

    /// The gateway handed over a connection it authenticated (one descriptor per frame),
    /// or closed its channel: then nobody can reach this runtime any more, and it ends.
    fn on_gateway(&mut self) {
        let Some(gateway) = &self.gateway else { return };
        match protocol::recv_frame::<protocol::Handoff>(gateway.as_fd()) {
            Ok(Some((_, mut fds))) if fds.len() == 1 => {
                let connection = fds.pop().expect("one descriptor");
                self.on_connection(connection);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                eprintln!("warren-agent: the TCP gateway is gone; the runtime ends");
                sys::exit_immediately(1)
            }
        }
    }

    fn on_connection(&mut self, connection: OwnedFd) {
        // The provisioner writes a whole request at once; a stalled peer cannot hold init.
        let _ = rustix::net::sockopt::set_socket_timeout(
            &connection,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_secs(5)),
        );
        let _ = rustix::io::ioctl_fionbio(&connection, false);
        let (request, fds) = match protocol::recv_frame::<Request>(connection.as_fd()) {
            Ok(Some(received)) => received,
            _ => return,
        };
        match request {
            Request::Ping | Request::Activity { .. } => {
                let quiet = match &request {
                    Request::Activity { quiet } => quiet.as_slice(),
                    _ => &[],
                };
                let _ = protocol::send_frame(
                    connection.as_fd(),
                    &Reply::Pong {
                        sandbox: self.served.sandbox.clone(),
                        generation: self.served.generation,
                        processes: processes_besides(&self.served.keep, quiet),
                    },
                    &[],
                );
            }
            Request::Exec(spec) => self.start(connection, spec, fds),
            Request::Egress => {
                self.egress = Some(connection);
            }
            Request::KillAll => {
                let processes = self.kill_all_commands();
                let _ =
                    protocol::send_frame(connection.as_fd(), &Reply::KilledAll { processes }, &[]);
            }
            Request::ArchiveHome { limit } => self.move_home(connection, fds, limit, true),
            Request::RestoreHome { limit } => self.move_home(connection, fds, limit, false),
            Request::Relay { id } => self.start_relay(id, fds),
            Request::File(op) => self.file(connection, fds, op),
            Request::Kill
            | Request::Signal { .. }
            | Request::Resize(_)
            | Request::KillStartedAfter { .. } => {
                let _ = protocol::send_frame(
                    connection.as_fd(),
                    &Reply::Refused {
                        reason: "kill, signal, resize and kill_started_after are only valid on \
                                 an exec connection"
                            .into(),
                    },
                    &[],
                );
            }
        }
    }

    /// In a process the server forked for work of its own (a relay, a home move): lets go
    /// of every command's connection, kill pipe and terminal, and of the server's own
    /// channels, so that their closing still means what it means to the server and the
    /// provisioner.
    fn forget_commands(&mut self) {
        for exec in self.running.values_mut() {
            exec.kill = None;
            exec.connection = None;
            exec.terminal = None;
        }
        self.listener = None;
        self.gateway = None;
        self.egress = None;
        self.proxy = None;
    }
}

#[cfg(test)]
mod tests {
    use super::sweep::Process;

    #[test]
    fn quiet_trees_and_the_runtime_s_own_are_not_counted() {
        let p = |pid, ppid| Process {
            pid,
            ppid,
            start_time: 0,
            zombie: false,
        };
        // 1 init; 7 the agent's server (kept); 10 a kernel driver (quiet) with its kernel
        // 11 and the kernel's child 12; 20 a build with its child 21.
        let listed = [
            p(1, 0),
            p(7, 1),
            p(10, 1),
            p(11, 10),
            p(12, 11),
            p(20, 1),
            p(21, 20),
        ];
        assert_eq!(super::count_outside(&listed, &[7], &[10]), 2);
        assert_eq!(super::count_outside(&listed, &[7], &[]), 5);
        assert_eq!(super::count_outside(&listed, &[7], &[10, 20]), 0);
    }
}
