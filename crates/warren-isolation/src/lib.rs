//! The native Linux runtime: warren's embedded, daemonless isolation backend.
//!
//! A runtime is one long-lived init process, PID 1 of its own pid, mount, ipc, uts, cgroup
//! and network namespaces, whose root is assembled from read-only system directories under
//! a copy-on-write layer (see `runtime::rootfs`). Commands run as 1000:1000 with no
//! capabilities, `no_new_privs`, a seccomp filter ([`seccomp`]) and Landlock rules, in a
//! cgroup per command inside the runtime's cgroup ([`cgroup`]), so limits hold for the whole
//! runtime and a timeout kills a command's whole tree.
//!
//! Init serves commands with `warren_agent`'s server, and every raw system call it needs
//! is `warren_agent::sys`'s: this crate holds no `unsafe` of its own.

mod backend;
pub mod cgroup;
pub mod config;
pub mod gvisor;
mod host;
mod launcher;
pub mod profile;
mod runsc;
mod runtime;

pub use backend::{LocalBackend, LocalBackendConfig};
pub use gvisor::{GvisorHost, GvisorPlatform};
pub use host::HostReport;
pub use runtime::{runtime_init_main, RUNTIME_INIT_ARG};

/// Why the local backend could not start or clean up.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// Neither root nor unprivileged user namespaces are available.
    #[error("the local backend needs root, or unprivileged user namespaces (this host disallows them: see /proc/sys/user/max_user_namespaces); use `--backend memory` for a workspace-only server")]
    NotRoot,
    /// A kernel feature the backend cannot do without.
    #[error("this kernel lacks {0}, which the local backend requires")]
    MissingFeature(&'static str),
    /// Overlay mount options cannot carry the data directory's path.
    #[error("the data directory path contains ',', ':' or '\\', which overlay mounts cannot express; choose another --data-dir")]
    UnusableDataDir,
    /// The runtimes directory could not be created.
    #[error("cannot create the runtimes directory")]
    RuntimesDir(#[source] std::io::Error),
    /// The host profile's /etc could not be built.
    #[error("cannot build the host profile's /etc")]
    HostProfile(#[source] std::io::Error),
    /// A cgroup operation failed.
    #[error("cgroup operation failed")]
    Cgroup(#[source] cgroup::CgroupError),
    /// Removing a runtime's leftovers failed.
    #[error("cannot remove a runtime's leftovers")]
    Teardown(#[source] std::io::Error),
    /// A host directory or file of a gVisor runtime could not be made (issue 19).
    #[error("cannot prepare {what}: {source}")]
    HostDir {
        /// Which directory or file.
        what: &'static str,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A persistent mount's source was refused (a link where the workdir should be) or
    /// could not be staged; nothing was handed to runsc (I2).
    #[error("cannot mount {target}: {reason}")]
    Mount {
        /// Where the mount would have gone inside the runtime.
        target: String,
        /// Why not, in terms of the paths inside the tree (never a host path, I1).
        reason: String,
    },
    /// runsc failed to start a gVisor runtime, or its agent never answered (issue 19).
    #[error("the gVisor runtime did not start: {0}")]
    Gvisor(String),
    /// The gVisor tier cannot run here; the reason is the probe's or the backend's.
    #[error("the local backend cannot run the gVisor tier: {0}")]
    GvisorUnavailable(String),
}

impl IsolationError {
    /// A staging failure (`warren_backend::staging`) as this crate's.
    pub(crate) fn from_staging(error: warren_backend::BackendError) -> Self {
        use warren_backend::BackendError;
        match error {
            BackendError::HostDir { what, source } => Self::HostDir { what, source },
            BackendError::MountRefused { target, reason } => Self::Mount { target, reason },
            other => Self::HostDir {
                what: "the sandbox's staging directory",
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}
