//! The launcher and the init process of a runtime.
//!
//! The launcher is `warren __runtime-init`, started by the provisioner with a
//! [`RuntimeConfig`] on stdin. It joins the sandbox's cgroup, opens the two persistent
//! directories without following links, binds the control socket, unshares every namespace
//! but the user namespace, and forks init. Init (PID 1 of the new pid namespace) assembles
//! the root filesystem and serves the control socket until it is killed. The launcher prints
//! one JSON line — `{"pid":N}` or `{"error":"…"}` — and exits.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

use rustix::event::{PollFd, PollFlags};
use rustix::thread::UnshareFlags;

use crate::cgroup::{CgroupSupport, ExecCgroup, Limits, SandboxCgroup};
use crate::config::RuntimeConfig;
use crate::control::{self, ExecSpec, Reply, Request};
use crate::runtime::child::{self, Credentials};
use crate::runtime::{rootfs, SetupError};
use crate::seccomp::SeccompProgram;
use crate::sys::{self, Forked};

/// Entry point of `warren __runtime-init`. Never returns.
pub fn runtime_init_main() -> ! {
    let code = match launch() {
        Ok(pid) => {
            println!("{{\"pid\":{pid}}}");
            0
        }
        Err(message) => {
            let line = serde_json::json!({ "error": message });
            println!("{line}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    sys::exit_immediately(code)
}

fn launch() -> Result<i32, String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("read the runtime config: {e}"))?;
    let config: RuntimeConfig =
        serde_json::from_str(&input).map_err(|e| format!("parse the runtime config: {e}"))?;

    let cgroup = if config.cgroups {
        let support = CgroupSupport::detect().map_err(|e| format!("detect cgroups: {e}"))?;
        let limits = Limits {
            memory_bytes: config.limits.memory_bytes,
            pids_max: config.limits.pids_max,
            cpu_millis: config.limits.cpu_millis,
        };
        let (cgroup, _not_enforced) = SandboxCgroup::create(&support, &config.cgroup_name, &limits)
            .map_err(|e| format!("create the sandbox cgroup: {e}"))?;
        Some(cgroup)
    } else {
        None
    };

    // The OOM killer should pick a runaway command, never init: losing init loses the
    // runtime. Best effort: without CAP_SYS_RESOURCE the score cannot go below zero, and
    // init's few hundred KiB still make it the last candidate. Commands reset their own
    // score (see `child`).
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");

    let socket_path = config.runtime_dir.join("control.sock");
    let _ = std::fs::remove_file(&socket_path);
    let listener =
        UnixListener::bind(&socket_path).map_err(|e| format!("bind the control socket: {e}"))?;
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("restrict the control socket: {e}"))?;

    if let Some(map) = config.user_namespace {
        enter_user_namespace(map)?;
    }
    sys::unshare(
        UnshareFlags::NEWNS
            | UnshareFlags::NEWUTS
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWNET
            | UnshareFlags::NEWPID,
    )
    .map_err(|e| format!("create namespaces: {e}"))?;

    let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("create the ready pipe: {e}"))?;
    match sys::fork_single_threaded().map_err(|e| format!("fork init: {e}"))? {
        Forked::Child => {
            drop(ready_read);
            // Nothing of the provisioner's stdio is kept: the launcher's answer must reach
            // EOF when the launcher exits, and a provisioner that died cannot hurt init.
            if let Err(error) = detach_stdio() {
                let mut ready = std::fs::File::from(ready_write);
                let _ = write!(ready, "detach stdio: {error}");
                sys::exit_immediately(1);
            }
            let result = Init::setup(config, cgroup, listener);
            let mut ready = std::fs::File::from(ready_write);
            match result {
                Ok(init) => {
                    let _ = ready.write_all(b"ok");
                    drop(ready);
                    init.serve()
                }
                Err(error) => {
                    let _ = ready.write_all(error.to_string().as_bytes());
                    sys::exit_immediately(1)
                }
            }
        }
        Forked::Parent(pid) => {
            drop(ready_write);
            // Moving a process into a v1 cgroup waits for an RCU grace period (~10 ms
            // here); done now, it overlaps with init assembling the root. Init starts no
            // command before it reports ready, and the launcher reports only after both.
            let joined = cgroup.as_ref().map_or(Ok(()), |c| c.add_init(pid));
            let mut answer = String::new();
            let _ = std::fs::File::from(ready_read).read_to_string(&mut answer);
            if let Err(error) = joined {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid).ok_or("init has no pid")?,
                    rustix::process::Signal::KILL,
                );
                return Err(format!("move init into the sandbox cgroup: {error}"));
            }
            if answer == "ok" {
                Ok(pid)
            } else {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid).ok_or("init has no pid")?,
                    rustix::process::Signal::KILL,
                );
                Err(if answer.is_empty() {
                    "init died during setup".to_owned()
                } else {
                    answer
                })
            }
        }
    }
}

/// Unprivileged mode: a user namespace where this process is the sandbox user 1000:1000
/// (its own ids outside) and holds the capabilities it needs to build the runtime. It
/// gains nothing outside: the namespace maps no other id.
fn enter_user_namespace(map: crate::config::IdMap) -> Result<(), String> {
    sys::unshare(UnshareFlags::NEWUSER).map_err(|e| format!("create a user namespace: {e}"))?;
    let write = |file: &str, content: String| {
        std::fs::write(format!("/proc/self/{file}"), content)
            .map_err(|e| format!("write /proc/self/{file}: {e}"))
    };
    // Required before an unprivileged gid_map; it also keeps anyone inside from dropping a
    // supplementary group to get past a "deny this group" permission.
    write("setgroups", "deny".into())?;
    write(
        "uid_map",
        format!("{} {} 1", crate::config::SANDBOX_UID, map.outside_uid),
    )?;
    write(
        "gid_map",
        format!("{} {} 1", crate::config::SANDBOX_GID, map.outside_gid),
    )?;
    Ok(())
}

fn detach_stdio() -> std::io::Result<()> {
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    Ok(())
}

/// Processes of the runtime's pid namespace other than init, from its own /proc.
fn processes_besides_init() -> u64 {
    std::fs::read_dir("/proc").map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()) && n != "1")
            })
            .count() as u64
    })
}

/// How many empty exec cgroups init keeps for reuse.
const SPARE_EXEC_CGROUPS: usize = 8;

/// A command started on one control connection.
struct RunningExec {
    connection: Option<OwnedFd>,
    pid: i32,
    cgroup: Option<ExecCgroup>,
    /// In a container: the command's supervisor kills its whole tree when this closes
    /// (see `agent`).
    kill: Option<OwnedFd>,
    /// Its tree was killed; its cgroup is removed, never reused (a kill may still be
    /// settling in it).
    killed: bool,
}

/// What an init serves as: its identity and how its commands start.
struct Served {
    /// Who this runtime is, for `Ping`.
    sandbox: String,
    generation: i64,
    /// Open files per command.
    nofile: u64,
    /// How commands become the sandbox user.
    credentials: Credentials,
}

fn step<T>(stage: &'static str, result: std::io::Result<T>) -> Result<T, SetupError> {
    result.map_err(|source| SetupError { stage, source })
}

pub(crate) struct Init {
    served: Served,
    cgroup: Option<SandboxCgroup>,
    listener: UnixListener,
    sigchld: OwnedFd,
    seccomp: SeccompProgram,
    running: HashMap<i32, RunningExec>,
    /// Exec cgroups whose command ended while background processes still ran in them.
    lingering: Vec<(ExecCgroup, bool)>,
    /// Children reaped while a kill settled, handled by the next [`Init::reap`].
    deferred: Vec<sys::Reaped>,
    /// Empty exec cgroups kept for the next commands: creating and removing a cgroup per
    /// command costs more than the command itself often does.
    spare: Vec<ExecCgroup>,
    next_exec: u64,
    /// The proxy port inside the runtime, for network `open` and `allowlist`.
    proxy: Option<std::net::TcpListener>,
    /// Where accepted proxy connections go: the provisioner's egress connection.
    egress: Option<OwnedFd>,
}

impl Init {
    fn setup(
        config: RuntimeConfig,
        cgroup: Option<SandboxCgroup>,
        listener: UnixListener,
    ) -> Result<Self, SetupError> {
        let sigchld = step("block SIGCHLD", sys::sigchld_fd())?;
        let hostname = "warren".to_owned();
        rootfs::assemble(&config, &hostname)?;
        // Init never execs, so emptying its bounding set costs it nothing, and every command
        // inherits the empty set: nothing it runs can regain a capability (file caps too).
        step("drop the capability bounding set", sys::drop_bounding_set())?;
        // Bound inside the runtime's network namespace, on its loopback only.
        let proxy = if config.egress {
            Some(step(
                "bind the proxy port",
                std::net::TcpListener::bind((
                    std::net::Ipv4Addr::LOCALHOST,
                    crate::config::PROXY_PORT,
                )),
            )?)
        } else {
            None
        };
        let cgroup_dirs = cgroup.iter().flat_map(SandboxCgroup::directories);
        let writable =
            crate::runtime::confine::writable(config.layout.layout(), &config.extra_mounts);
        crate::runtime::confine::confine(&writable, cgroup_dirs).map_err(|e| SetupError {
            stage: "apply Landlock",
            source: std::io::Error::other(e.to_string()),
        })?;
        let credentials = if config.user_namespace.is_some() {
            Credentials::UserNamespace
        } else {
            Credentials::Root
        };
        Self::serving(
            Served {
                sandbox: config.sandbox,
                generation: config.generation,
                nofile: config.limits.nofile,
                credentials,
            },
            sigchld,
            cgroup,
            listener,
            proxy,
        )
    }

    /// Init inside a container (the Docker agent): no root to build, no cgroups; Docker
    /// made the namespaces and dropped every capability.
    pub(crate) fn in_container(
        sandbox: String,
        generation: i64,
        nofile: u64,
        listener: UnixListener,
        proxy: Option<std::net::TcpListener>,
    ) -> Result<Self, SetupError> {
        let sigchld = step("block SIGCHLD", sys::sigchld_fd())?;
        Self::serving(
            Served {
                sandbox,
                generation,
                nofile,
                credentials: Credentials::AlreadySandboxUser,
            },
            sigchld,
            None,
            listener,
            proxy,
        )
    }

    /// What both kinds of init do last: compile the commands' seccomp filter, make the
    /// sockets non-blocking for the event loop, and hold it all.
    fn serving(
        served: Served,
        sigchld: OwnedFd,
        cgroup: Option<SandboxCgroup>,
        listener: UnixListener,
        proxy: Option<std::net::TcpListener>,
    ) -> Result<Self, SetupError> {
        let seccomp = SeccompProgram::runtime_policy().map_err(|e| SetupError {
            stage: "compile the seccomp policy",
            source: std::io::Error::other(e.to_string()),
        })?;
        step(
            "make the control socket non-blocking",
            listener.set_nonblocking(true),
        )?;
        if let Some(proxy) = &proxy {
            step(
                "make the proxy port non-blocking",
                proxy.set_nonblocking(true),
            )?;
        }
        Ok(Self {
            served,
            cgroup,
            listener,
            sigchld,
            seccomp,
            running: HashMap::new(),
            lingering: Vec::new(),
            deferred: Vec::new(),
            spare: Vec::new(),
            proxy,
            egress: None,
            next_exec: 0,
        })
    }

    pub(crate) fn serve(mut self) -> ! {
        loop {
            let pids: Vec<i32> = self
                .running
                .iter()
                .filter(|(_, exec)| exec.connection.is_some())
                .map(|(pid, _)| *pid)
                .collect();
            let mut fds = vec![
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::new(&self.sigchld, PollFlags::IN),
            ];
            // Fixed slots 2 and 3 (a closed fd is skipped by poll when absent).
            let extra = [
                self.proxy.as_ref().map(AsFd::as_fd),
                self.egress.as_ref().map(AsFd::as_fd),
            ];
            let extra_fds: Vec<_> = extra.iter().flatten().collect();
            let proxy_slot = self.proxy.is_some().then_some(2);
            let egress_slot = self
                .egress
                .is_some()
                .then_some(2 + usize::from(self.proxy.is_some()));
            for fd in &extra_fds {
                fds.push(PollFd::new(*fd, PollFlags::IN));
            }
            let first_exec = fds.len();
            for pid in &pids {
                if let Some(connection) = &self.running[pid].connection {
                    fds.push(PollFd::new(connection, PollFlags::IN));
                }
            }
            if rustix::event::poll(&mut fds, None).is_err() {
                continue;
            }
            let listener_ready = !fds[0].revents().is_empty();
            let child_ready = !fds[1].revents().is_empty();
            let proxy_ready = proxy_slot.is_some_and(|i| !fds[i].revents().is_empty());
            let egress_closed = egress_slot.is_some_and(|i| !fds[i].revents().is_empty());
            let hung_up: Vec<i32> = pids
                .iter()
                .zip(&fds[first_exec..])
                .filter(|(_, fd)| !fd.revents().is_empty())
                .map(|(pid, _)| *pid)
                .collect();
            drop(fds);
            drop(extra_fds);
            if egress_closed {
                // The provisioner only ever reads from it: input means it went away.
                self.egress = None;
            }
            if proxy_ready {
                self.on_proxy_connections();
            }
            if child_ready {
                sys::drain_signalfd(self.sigchld.as_fd());
                self.reap();
            }
            for pid in hung_up {
                self.on_connection_input(pid);
            }
            if listener_ready {
                while let Ok((stream, _)) = self.listener.accept() {
                    self.on_connection(OwnedFd::from(stream));
                }
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
        let (request, fds) = match control::recv_frame::<Request>(connection.as_fd()) {
            Ok(Some(received)) => received,
            _ => return,
        };
        match request {
            Request::Ping => {
                let _ = control::send_frame(
                    connection.as_fd(),
                    &Reply::Pong {
                        sandbox: self.served.sandbox.clone(),
                        generation: self.served.generation,
                        processes: processes_besides_init(),
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
                    control::send_frame(connection.as_fd(), &Reply::KilledAll { processes }, &[]);
            }
            Request::Kill => {
                let _ = control::send_frame(
                    connection.as_fd(),
                    &Reply::Refused {
                        reason: "kill is only valid on an exec connection".into(),
                    },
                    &[],
                );
            }
        }
    }

    fn start(&mut self, connection: OwnedFd, spec: ExecSpec, stdio: Vec<OwnedFd>) {
        let reply = |reply: &Reply| {
            let _ = control::send_frame(connection.as_fd(), reply, &[]);
        };
        let Ok(stdio) = <[OwnedFd; 3]>::try_from(stdio) else {
            reply(&Reply::Refused {
                reason: "an exec request carries exactly three descriptors".into(),
            });
            return;
        };
        let cgroup = self.spare.pop().or_else(|| {
            self.next_exec += 1;
            self.cgroup.as_ref()?.exec_leaf(self.next_exec).ok()
        });
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
                    for exec in self.running.values_mut() {
                        exec.kill = None;
                        exec.connection = None;
                    }
                    crate::runtime::agent::supervise(
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
                    cgroup.as_ref(),
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
                },
            );
            return;
        }
        reply(&Reply::Started { pid: child });
        self.running.insert(
            child,
            RunningExec {
                connection: Some(connection),
                pid: child,
                cgroup,
                kill: kill_write,
                killed: false,
            },
        );
    }

    /// Hands each process that connected to the proxy port to the provisioner, which
    /// applies the sandbox's network policy; without a provisioner the connection closes.
    fn on_proxy_connections(&mut self) {
        let Some(proxy) = &self.proxy else { return };
        while let Ok((stream, _)) = proxy.accept() {
            let Some(egress) = &self.egress else { continue };
            if control::send_frame(egress.as_fd(), &Reply::Connection, &[stream.as_fd()]).is_err() {
                self.egress = None;
            }
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
        let keep = matches!(
            control::recv_frame::<Request>(connection.as_fd()),
            Ok(Some((Request::Kill, _)))
        );
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
        killed += crate::runtime::sweep::stop_and_kill(
            |processes| {
                processes
                    .iter()
                    .filter(|p| !p.zombie && p.pid != me && p.pid != 1)
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
    /// [`Init::reap`], so no `Exited` goes out before the tree is gone). The cgroup listing
    /// drops a process when it starts exiting; its `/proc/<pid>/cgroup` keeps naming the
    /// leaf until it is reaped.
    fn settle(&mut self, leaf: &str) {
        let suffix = format!("/{leaf}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            while let Ok(Some(reaped)) = sys::wait4_nohang(-1) {
                self.deferred.push(reaped);
            }
            let remaining = crate::runtime::sweep::processes().into_iter().any(|p| {
                p.pid != 1
                    && std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid))
                        .is_ok_and(|text| text.lines().any(|line| line.ends_with(&suffix)))
            });
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
                let _ = control::send_frame(
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
