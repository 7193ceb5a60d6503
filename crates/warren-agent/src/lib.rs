//! The agent: everything between warren and the one process inside a runtime that runs its
//! commands, shared by every backend (local, Docker, Kubernetes).
//!
//! - [`protocol`]: the control protocol (length-prefixed JSON, stdio as descriptors);
//! - [`server`]: the in-runtime server that forks commands, with its subreaper
//!   supervisor where the runtime has no cgroups; [`container`]: the server as PID 1 of a
//!   container or pod (`warren __container-agent`); [`gateway`]: its TCP side;
//! - [`client`] (Unix socket) and [`remote`] (TCP, through [`wire`]): the host side;
//! - [`egress`]: the provisioner's side of a runtime's proxy port; [`files`]: file
//!   operations anywhere in the runtime, run as its user;
//! - [`seccomp`]: the filter every command runs under; [`bundle`]: the agent's executable
//!   with its loader and libraries, so it runs in any image.
//!
//! **Architecture invariant:** all `unsafe` of the crate is in [`sys`] (plus test code),
//! each block with a `// SAFETY:` comment. `warren-isolation` builds its runtimes on
//! these same primitives and holds none of its own.

pub mod bundle;
pub mod client;
pub mod container;
pub mod egress;
pub mod environment;
pub mod files;
pub mod gateway;
pub mod home;
pub mod protocol;
pub mod remote;
pub mod seccomp;
pub mod sentry_limits;
pub mod server;
pub mod sys;
pub mod wire;

pub use container::{container_agent_main, AgentConfig, CONTAINER_AGENT_ARG};
pub use wire::AgentKey;
