//! The Kubernetes backend's objects (issue 15): everything about them that needs no running
//! cluster.
//!
//! - [`manifests`]: a sandbox's Pod, Service and NetworkPolicy, built from a [`PodPlan`].
//! - [`identity`]: a Pod read back into the identity it carries, and the decision `discover`
//!   takes after a restart: adopt an exact match (beside its own Service and
//!   NetworkPolicy), remove anything else, leave another instance's alone (I16).
//! - [`prepare`](mod@prepare): what the pod's root init container runs (`warren __k8s-prepare <json>`):
//!   the one-time ownership migration of one uid's subtree, by descriptor.
//! - [`accounts`]: `/etc/passwd` and `/etc/group` for a layout whose user images do not
//!   name (E2B's `user`), written by the prepare container, mounted read-only by subPath.
//! - [`deploy`]: the manifests that run warren itself in a cluster.
//! - [`KubernetesBackend`]: the backend itself, on `kube` (create, discover, exec over the
//!   agent's TCP transport, destroy).
//!
//! Object names, labels and annotations are written in one place ([`names`]) and read back
//! from it, as warren-docker's `identity.rs` does for containers.

pub mod accounts;
mod backend;
pub mod deploy;
mod error;
pub mod identity;
pub mod manifests;
pub mod names;
pub mod prepare;

pub use backend::{
    client_config, KubernetesBackend, KubernetesConfig, AGENT_BUNDLE_ARG, PREPARE_ARG,
};
pub use deploy::{deployment_manifests, DeployOptions, KubernetesSettings, S3Options, SecretKey};
pub use error::Error;
pub use identity::{
    agent_key, check_network_policy, check_service, decide, read_pod, sandbox_of, AgentKey,
    Decision, PodIdentity,
};
pub use manifests::{
    build, AgentPlan, Claim, Endpoint, Limits, Peer, PersistentMount, PodPlan, SandboxObjects,
    ServiceType,
};
pub use prepare::{prepare, prepare_main, AccountsTask, PrepareConfig, PrepareReport};
