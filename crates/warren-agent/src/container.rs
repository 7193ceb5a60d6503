//! The agent: the in-runtime server ([`crate::server`]) as PID 1 of a container or a pod,
//! where the runtime was built by someone else (dockerd, the kubelet).
//!
//! Docker or Kubernetes builds the runtime (namespaces, root filesystem, mounts, cgroup
//! limits, dropped capabilities, its seccomp profile); the agent is started as the
//! sandbox user and serves the control protocol: on a Unix socket in a directory shared
//! with the provisioner (Docker), or on TCP through its gateway ([`crate::gateway`]) where
//! no directory is shared (a pod). A `docker exec` costs tens of milliseconds; a command
//! through the agent costs a fork.
//!
//! ```text
//! dockerd/kubelet ──▶ PID 1: warren-agent (1000:1000, no capabilities)
//!                       ├─fork─▶ gateway (TCP only: threads, the network side)
//!                       └─fork─▶ supervisor (subreaper) ─fork─▶ command (+ warren's seccomp)
//! ```

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::server::{Credentials, Server, ServerConfig};
use crate::sys::{self, Forked};
use crate::wire::{AgentKey, AGENT_KEY_ENV};

/// The argument `warren` recognises to become a container's agent.
pub const CONTAINER_AGENT_ARG: &str = "__container-agent";

/// What the agent is told on its command line (nothing secret: the sandbox's own id; the
/// key of a TCP agent comes in its environment).
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
    /// The directory (shared with the provisioner) to bind the control socket in (Docker).
    #[serde(default)]
    pub socket_dir: Option<PathBuf>,
    /// The address to serve TCP on (a pod), authenticated with the key in
    /// [`AGENT_KEY_ENV`].
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
    /// The layout's home when it is ephemeral (a tmpfs of the container's), kept open at
    /// [`crate::environment::HOME_FD`] for snapshots (I30). `None` for a layout whose home
    /// is the persistent workdir (E2B's): there is nothing of it to snapshot or seed.
    #[serde(default = "default_home")]
    pub home: Option<PathBuf>,
    /// The runtime is a gVisor sandbox (issue 19): the agent starts as the sandbox's root
    /// (root of runsc's Sentry, not of the host), keeps each command's tree in a cgroup of
    /// the Sentry's own (no subreaper exists there but PID 1's), and makes each command
    /// the sandbox user.
    #[serde(default)]
    pub gvisor: bool,
    /// The most processes the sandbox user may have at once (`RLIMIT_NPROC`), set where
    /// the runtime's own pids limit cannot be the bound: under gVisor the host's pids
    /// cgroup counts the Sentry's threads, not the sandbox's processes.
    #[serde(default)]
    pub max_processes: Option<u64>,
    /// The most address space one process may map (`RLIMIT_AS`), where a memory limit on
    /// the host would otherwise end the whole runtime: under gVisor the host's memory
    /// cgroup holds the Sentry, and one command's runaway would kill every process of the
    /// sandbox at once.
    #[serde(default)]
    pub max_address_space: Option<u64>,
}

/// Containers started before layouts existed keep their home where the default layout
/// has it.
fn default_home() -> Option<PathBuf> {
    Some(PathBuf::from(warren_core::Layout::ARS.home))
}

/// Entry point of `warren __container-agent <config>`. Never returns.
pub fn container_agent_main(config: &str) -> ! {
    let result = serde_json::from_str::<AgentConfig>(config)
        .map_err(|e| format!("parse the agent config: {e}"))
        .and_then(agent);
    // Only a failure gets here; Docker and the kubelet keep it in the runtime's log.
    let Err(error) = result;
    eprintln!("warren-agent: {error}");
    sys::exit_immediately(1)
}

fn agent(config: AgentConfig) -> Result<std::convert::Infallible, String> {
    // Nothing of the sandbox user's may read the agent's memory, its environment (the
    // key) or trace it: it is the same uid, so only this keeps ptrace, /proc/1/mem and
    // /proc/1/environ away. Forked children (the gateway, supervisors) inherit it; a
    // command's exec replaces the memory that held the key.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("become non-dumpable: {e}"))?;
    let key = take_key()?;
    // The ephemeral home, resolved here in the runtime, kept where the provisioner finds
    // it (I30). A persistent home (the workdir) is never snapshot: nothing is kept.
    if let Some(home_path) = &config.home {
        let home = rustix::fs::open(
            home_path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("open {}: {e}", home_path.display()))?;
        let kept = rustix::io::fcntl_dupfd_cloexec(&home, crate::environment::HOME_FD)
            .map_err(|e| format!("keep {} open: {e}", home_path.display()))?;
        if std::os::fd::AsRawFd::as_raw_fd(&kept) != crate::environment::HOME_FD {
            return Err(format!(
                "descriptor 201 is taken; cannot keep {} open",
                home_path.display()
            ));
        }
        drop(home);
        // Held for the agent's whole life (the server never returns).
        std::mem::forget(kept);
    }
    let proxy = if config.egress {
        Some(
            std::net::TcpListener::bind((
                std::net::Ipv4Addr::LOCALHOST,
                crate::environment::PROXY_PORT,
            ))
            .map_err(|e| format!("bind the proxy port: {e}"))?,
        )
    } else {
        None
    };
    let (credentials, groups) = if config.gvisor {
        let groups = sentry_setup(config.max_processes, config.max_address_space)?;
        (Credentials::SentryRoot, Some(groups))
    } else {
        (Credentials::AlreadySandboxUser, None)
    };
    let mut server = ServerConfig {
        sandbox: config.sandbox,
        generation: config.generation,
        nofile: config.nofile,
        credentials,
        listener: None,
        gateway: None,
        proxy,
        groups,
        keep: Vec::new(),
    };
    match (&config.socket_dir, config.listen, key) {
        (Some(dir), None, None) => {
            let socket_path = dir.join(crate::client::SOCKET_NAME);
            let _ = std::fs::remove_file(&socket_path);
            let listener = UnixListener::bind(&socket_path)
                .map_err(|e| format!("bind the control socket: {e}"))?;
            // In a gVisor sandbox the socket is the host's (runsc `--host-uds=create`), and
            // the Sentry may not change a host file's mode: there the directory guards it
            // (root's, 0700, so the sandbox user cannot reach or replace it).
            if !config.gvisor {
                std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| format!("restrict the control socket: {e}"))?;
            }
            server.listener = Some(listener);
        }
        (None, Some(address), Some(key)) => {
            let listener = std::net::TcpListener::bind(address)
                .map_err(|e| format!("listen on {address}: {e}"))?;
            let bound = listener
                .local_addr()
                .map_err(|e| format!("read the bound address: {e}"))?;
            let (channel, gateway_end) = rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )
            .map_err(|e| format!("make the gateway's channel: {e}"))?;
            // Forked while single-threaded; the gateway may start threads, the server
            // never does.
            match sys::fork_single_threaded().map_err(|e| format!("fork the gateway: {e}"))? {
                Forked::Child => {
                    drop(channel);
                    crate::gateway::serve(listener, key, gateway_end)
                }
                Forked::Parent(pid) => {
                    drop((listener, gateway_end, key));
                    server.gateway = Some(channel);
                    server.keep.push(pid);
                }
            }
            // What a kubelet's log shows, and how a test learns an ephemeral port.
            println!("{}", serde_json::json!({ "listening": bound.to_string() }));
        }
        (Some(_), Some(_), _) => return Err("socket_dir and listen are exclusive".into()),
        (None, None, _) => return Err("neither socket_dir nor listen is set".into()),
        (Some(_), None, Some(_)) => {
            return Err(format!(
                "{AGENT_KEY_ENV} is set, but the agent serves a Unix socket"
            ))
        }
        (None, Some(_), None) => {
            return Err(format!(
                "listening on TCP needs the agent key in {AGENT_KEY_ENV}"
            ))
        }
    }
    let server = Server::new(server).map_err(|e| e.to_string())?;
    server.serve()
}

/// The agent as root of a gVisor sandbox (issue 19): the Sentry's cgroups to hold each
/// command's tree, the sandbox user's process limit, and no capability beyond what
/// serving needs (making commands the sandbox user, signalling them). Root here is the
/// Sentry's: the host sees runsc's unprivileged sandbox process.
fn sentry_setup(
    max_processes: Option<u64>,
    max_address_space: Option<u64>,
) -> Result<Box<dyn crate::server::CommandGroups>, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("the agent of a gVisor sandbox must start as the sandbox's root".into());
    }
    let groups = crate::server::sentry_groups::SentryGroups::mount(std::path::Path::new("/tmp"))
        .map_err(|e| format!("mount the sandbox's cgroups: {e}"))?;
    // Root is not held to RLIMIT_NPROC; every command is the sandbox user, and the limit
    // counts all of that user's processes in the sandbox. RLIMIT_AS holds each process,
    // the agent's included (it maps little): inherited by every command.
    for (limit, resource, what) in [
        (
            max_processes,
            rustix::process::Resource::Nproc,
            "the sandbox user's processes",
        ),
        (
            max_address_space,
            rustix::process::Resource::As,
            "each process's address space",
        ),
    ] {
        if let Some(limit) = limit {
            let limit = rustix::process::Rlimit {
                current: Some(limit),
                maximum: Some(limit),
            };
            rustix::process::setrlimit(resource, limit)
                .map_err(|e| format!("limit {what}: {e}"))?;
        }
    }
    // An empty bounding set, inherited by every command, so none can regain a
    // capability by any exec (the agent keeps what it holds: the bounding set limits
    // only what an exec grants). Capabilities this Sentry does not know are EINVAL.
    for capability in rustix::thread::CapabilitySet::all().iter() {
        match rustix::thread::remove_capability_from_bounding_set(capability) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(format!("empty the bounding set: {e}")),
        }
    }
    // Mounting is done: nothing the agent does later needs CAP_SYS_ADMIN or CAP_SETPCAP.
    let mut sets = rustix::thread::capabilities(None)
        .map_err(|e| format!("read the agent's capabilities: {e}"))?;
    let done = rustix::thread::CapabilitySet::SYS_ADMIN | rustix::thread::CapabilitySet::SETPCAP;
    sets.effective.remove(done);
    sets.permitted.remove(done);
    sets.inheritable.remove(done);
    rustix::thread::set_capabilities(None, sets)
        .map_err(|e| format!("drop CAP_SYS_ADMIN and CAP_SETPCAP: {e}"))?;
    Ok(Box::new(groups))
}

/// Takes the agent key from the environment and removes it there, so nothing started
/// later inherits it (commands get an environment of warren's making anyway).
fn take_key() -> Result<Option<AgentKey>, String> {
    let Some(value) = std::env::var_os(AGENT_KEY_ENV) else {
        return Ok(None);
    };
    // Single-threaded here: nothing else reads the environment meanwhile.
    std::env::remove_var(AGENT_KEY_ENV);
    let key = value
        .to_str()
        .and_then(AgentKey::from_hex)
        .ok_or_else(|| format!("{AGENT_KEY_ENV} is not 64 hex digits"))?;
    Ok(Some(key))
}
