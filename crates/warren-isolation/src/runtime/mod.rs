//! The runtime's own processes: the launcher that `warren` re-executes itself as, and the
//! init process (PID 1 of the runtime) that it leaves behind.
//!
//! ```text
//! warren serve ──spawn──▶ warren __runtime-init   (launcher: joins the cgroup, unshares)
//!                               └─fork─▶ init (PID 1): assembles /, serves control.sock
//!                                             └─fork─▶ command (1000:1000, seccomp, ...)
//!
//! Init is `warren_agent`'s server (the same loop the Docker and Kubernetes agents run),
//! given this runtime's cgroups.
//! ```
//!
//! The launcher exits as soon as init reports ready, so the runtime belongs to no
//! provisioner process and survives a provisioner restart.

pub(crate) mod confine;
pub(crate) mod init;
pub(crate) mod rootfs;
#[cfg(test)]
mod sweep_tests;

pub use init::runtime_init_main;
pub(crate) use warren_agent::server::SetupError;

/// The argument `warren` recognises to become a runtime launcher.
pub const RUNTIME_INIT_ARG: &str = "__runtime-init";
