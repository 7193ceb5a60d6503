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
mod pty;
mod relay;
pub mod sentry_groups;
pub(crate) mod supervisor;
pub mod sweep;

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;

use rustix::event::{PollFd, PollFlags};

pub use child::Credentials;

use crate::protocol::{self, ExecSpec, Reply, Request};
use crate::seccomp::SeccompProgram;
use crate::sys::{self, Forked};

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

/// Processes of the runtime's pid namespace other than init and the runtime's own
/// machinery, from its own /proc.
fn processes_besides(keep: &[i32]) -> u64 {
    std::fs::read_dir("/proc").map_or(0, |entries| {
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
    })
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
            Request::Ping => {
                let _ = protocol::send_frame(
                    connection.as_fd(),
                    &Reply::Pong {
                        sandbox: self.served.sandbox.clone(),
                        generation: self.served.generation,
                        processes: processes_besides(&self.served.keep),
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

    fn start(&mut self, connection: OwnedFd, spec: ExecSpec, stdio: Vec<OwnedFd>) {
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

    /// Hands each process that connected to the proxy port to the provisioner, which
    /// applies the sandbox's network policy; without a provisioner the connection closes.
    /// In a gVisor sandbox no descriptor leaves the runtime: the connection waits here for
    /// the provisioner's socket instead (`relay`).
    fn on_proxy_connections(&mut self) {
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
    fn start_relay(&mut self, id: u64, mut fds: Vec<OwnedFd>) {
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
    fn move_home(&mut self, connection: OwnedFd, mut fds: Vec<OwnedFd>, limit: u64, archive: bool) {
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
    fn file(&mut self, connection: OwnedFd, mut fds: Vec<OwnedFd>, op: warren_backend::FileOp) {
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

    /// The provisioner sent `Kill`, or closed the connection (it gave up on the command,
    /// or died): either way the command's whole tree is killed (I24).
    fn on_connection_input(&mut self, pid: i32) {
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
    fn kill_all_commands(&mut self) -> u64 {
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

    fn reap(&mut self) {
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
