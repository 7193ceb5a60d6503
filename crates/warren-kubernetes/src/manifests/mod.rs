//! A sandbox's objects: one Pod, one Service and one NetworkPolicy, built from a plain
//! [`PodPlan`] (issue 15, "The Kubernetes backend").
//!
//! The Pod is what a Docker container is on the Docker backend (I16, I18):
//!
//! ```text
//! init  prepare       warren's image, root with CHOWN + DAC_OVERRIDE + FOWNER only: the uid's
//!                     subtree of USER_DATA (shared/<safe_uid>) at /warren/user-data; the
//!                     one-time 1000:1000 migration (which also strips world-write and
//!                     setuid/setgid bits), workspace/ made, the workdir verified
//!                     (crate::prepare);
//!                     E2B: also the `accounts` emptyDir at /warren/accounts, written into
//! init  agent-bundle  warren's image, 1000:1000: copies the agent into the `agent` emptyDir
//! main  sandbox       the user's image, 1000:1000, read-only root, no capabilities, the agent
//!                     from /opt/warren-agent (read-only) listening on the agent port;
//!                     the home (/home/gem) and /tmp size-limited emptyDirs; exactly the
//!                     layout's persistent mounts, by subPath of the two claims
//! ```
//!
//! The E2B layout (I7) has no home emptyDir: its home `/home/user` *is* the workdir's subPath
//! mount, writable; and its user `user` is named by warren's `/etc/passwd` and `/etc/group`,
//! each a read-only subPath of the `accounts` emptyDir ([`crate::accounts`]).
//!
//! No `fsGroup`: the kubelet would re-own the claims' files recursively for it, every uid's
//! at once. Ownership is the prepare container's job, for one uid's subtree only. The
//! per-sandbox agent key is the main container's environment (`WARREN_AGENT_KEY`), which
//! the agent reads and scrubs before anything of the sandbox runs; no service account
//! token is mounted, so nothing in the pod can read the pod's spec back.
//!
//! Labels (instance, sandbox) are what the Service and the NetworkPolicy select and what
//! `discover` lists; the identity proper is in annotations ([`crate::names`]).

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::Error;

mod check;
mod network_policy;
mod plan;
mod pod;
mod service;

pub(crate) use check::{check_label, check_object_name, path_problem, within};
#[cfg(test)]
pub(crate) use plan::example_plan;
pub(crate) use plan::{empty_dirs, own_mounts};
pub use plan::{
    sandbox_labels, AgentPlan, Claim, Endpoint, Limits, Peer, PersistentMount, PodPlan, ServiceType,
};
pub(crate) use pod::unprivileged;
pub use pod::PREPARE_CAPABILITIES;

use check::check;
use network_policy::network_policy;
use pod::pod;
use service::service;

/// The sandbox user and group (I11).
pub const SANDBOX_ID: i64 = 1000;

/// A sandbox's three objects.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxObjects {
    /// The pod.
    pub pod: Pod,
    /// The Service warren reaches the agent through.
    pub service: Service,
    /// The NetworkPolicy selecting exactly the pod.
    pub network_policy: K8sNetworkPolicy,
}

/// Builds a sandbox's Pod, Service and NetworkPolicy, refusing a plan Kubernetes would
/// refuse or warren must not run (names, mounts, limits, egress without a proxy).
pub fn build(plan: &PodPlan) -> Result<SandboxObjects, Error> {
    check(plan)?;
    Ok(SandboxObjects {
        pod: pod(plan),
        service: service(plan),
        network_policy: network_policy(plan)?,
    })
}

fn meta(plan: &PodPlan) -> ObjectMeta {
    ObjectMeta {
        name: Some(plan.name()),
        namespace: Some(plan.namespace.clone()),
        labels: Some(plan.labels()),
        ..ObjectMeta::default()
    }
}
