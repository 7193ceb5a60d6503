//! The runtime's own processes: the launcher that `warren` re-executes itself as, and the
//! init process (PID 1 of the runtime) that it leaves behind.
//!
//! ```text
//! warren serve ──spawn──▶ warren __runtime-init   (launcher: joins the cgroup, unshares)
//!                               └─fork─▶ init (PID 1): assembles /, serves control.sock
//!                                             └─fork─▶ command (1000:1000, seccomp, ...)
//! ```
//!
//! The launcher exits as soon as init reports ready, so the runtime belongs to no
//! provisioner process and survives a provisioner restart.

pub(crate) mod agent;
pub(crate) mod child;
pub(crate) mod confine;
pub(crate) mod init;
pub(crate) mod rootfs;
pub(crate) mod sweep;

use std::io;

pub use agent::{container_agent_main, AgentConfig, CONTAINER_AGENT_ARG};
pub use init::runtime_init_main;

/// The argument `warren` recognises to become a runtime launcher.
pub const RUNTIME_INIT_ARG: &str = "__runtime-init";

/// A failed setup step, reported to the provisioner by name.
#[derive(Debug)]
pub(crate) struct SetupError {
    pub stage: &'static str,
    pub source: io::Error,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.source)
    }
}
