//! A Pod's identity: read back from its labels, annotations and spec, and the decision
//! `discover` takes about it after a restart (I16).
//!
//! [`read_pod`] refuses anything warren would not have made: another instance's, missing or
//! unparsable metadata, privileges (host namespaces, a service account token, a privileged
//! or root sandbox container, capabilities added: by the prepare container, any outside
//! [`PREPARE_CAPABILITIES`](crate::manifests::PREPARE_CAPABILITIES), a subset being accepted; a writable root, an `fsGroup`),
//! volumes other than the two claims and exactly its layout's `emptyDir`s (a `hostPath`
//! above all), and every mount view other than exactly its layout's own and persistent
//! mounts for its uid and workdir (legacy layouts: `/home/gem/projects`, nested user-data
//! mounts, writable skills). The E2B layout's pod (I7) is its own shape: no home
//! `emptyDir`, the workdir's subPath at `/home/user`, and warren's `/etc/passwd` and
//! `/etc/group` as read-only subPaths of the `accounts` `emptyDir`, which the prepare
//! container alone writes; a pod of another layout with any of that, or an E2B pod without
//! it, is refused.
//! [`decide`] then adopts only a pod equal to what the sandbox's record asks for
//! (uid, runtime scope, workdir, network, the mounts with their subPaths and modes, the
//! generation, the layout, the image, the claims) and removes the rest with the reason;
//! another instance's pods are left alone.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warren_core::{LayoutName, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

use crate::manifests::{PersistentMount, PodPlan};
use crate::names::*;
use crate::Error;

mod companions;
mod mounts;
mod privileges;
mod read;
#[cfg(test)]
mod tests;

pub use companions::{check_network_policy, check_service};
pub use read::read_pod;

/// What a pod is, as far as warren is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// The warren instance that made it.
    pub instance: String,
    /// The sandbox it serves.
    pub sandbox: SandboxId,
    /// The workspace owner.
    pub uid: Uid,
    /// The runtime scope.
    pub runtime_scope: RuntimeScope,
    /// The workdir.
    pub workdir: Workdir,
    /// Which start of the sandbox it is.
    pub generation: i64,
    /// Its layout.
    pub layout: LayoutName,
    /// Its network policy.
    pub network: NetworkPolicy,
    /// The image its sandbox container runs.
    pub image: String,
    /// Whether its commands get the global and agent environments (part of the binding).
    pub inherit_env: bool,
    /// Its persistent mounts, in the layout's order.
    pub mounts: Vec<PersistentMount>,
    /// The USER_DATA claim it mounts.
    pub user_data_claim: String,
    /// The SKILLS claim it mounts.
    pub skills_claim: String,
}

impl PodIdentity {
    /// The identity a pod built from `plan` carries.
    pub fn of_plan(plan: &PodPlan) -> Self {
        Self {
            instance: plan.instance.clone(),
            sandbox: plan.sandbox.clone(),
            uid: plan.uid.clone(),
            runtime_scope: plan.runtime_scope.clone(),
            workdir: plan.workdir.clone(),
            generation: plan.generation,
            layout: plan.layout,
            network: plan.network.clone(),
            image: plan.image.clone(),
            inherit_env: plan.inherit_env,
            mounts: plan.mounts.clone(),
            user_data_claim: plan.user_data_claim.clone(),
            skills_claim: plan.skills_claim.clone(),
        }
    }

    /// How this identity differs from `expected`, in words; `None` when they are equal.
    pub fn difference(&self, expected: &Self) -> Option<String> {
        fn differs<T: PartialEq + std::fmt::Debug>(
            out: &mut Vec<String>,
            what: &str,
            found: &T,
            expected: &T,
        ) {
            if found != expected {
                out.push(format!("{what} {found:?}, not {expected:?}"));
            }
        }
        let mut out = Vec::new();
        differs(&mut out, "instance", &self.instance, &expected.instance);
        differs(&mut out, "sandbox", &self.sandbox, &expected.sandbox);
        differs(&mut out, "uid", &self.uid, &expected.uid);
        differs(
            &mut out,
            "runtime scope",
            &self.runtime_scope,
            &expected.runtime_scope,
        );
        differs(&mut out, "workdir", &self.workdir, &expected.workdir);
        differs(
            &mut out,
            "generation",
            &self.generation,
            &expected.generation,
        );
        differs(&mut out, "layout", &self.layout, &expected.layout);
        differs(&mut out, "network", &self.network, &expected.network);
        differs(&mut out, "image", &self.image, &expected.image);
        differs(
            &mut out,
            "inherit_env",
            &self.inherit_env,
            &expected.inherit_env,
        );
        differs(&mut out, "mounts", &self.mounts, &expected.mounts);
        differs(
            &mut out,
            "USER_DATA claim",
            &self.user_data_claim,
            &expected.user_data_claim,
        );
        differs(
            &mut out,
            "SKILLS claim",
            &self.skills_claim,
            &expected.skills_claim,
        );
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// The per-sandbox agent key read back from a pod, for reaching an adopted pod's agent.
/// Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentKey(String);

impl AgentKey {
    /// The key itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey([redacted])")
    }
}

/// What `discover` does with a pod it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Exactly the runtime the sandbox's record asks for: keep it.
    Adopt {
        /// What it is.
        identity: Box<PodIdentity>,
        /// Its agent's key.
        agent_key: AgentKey,
    },
    /// Anything else of this instance's: delete it (its files stay, I15) and log why.
    Remove {
        /// Why, for the log.
        reason: String,
    },
    /// Another warren instance's pod: neither adopted nor touched.
    Ignore {
        /// Why, for the log.
        reason: String,
    },
}

/// Decides about a pod against the sandbox's record, as `expected` describes it.
pub fn decide(pod: &Pod, expected: &PodPlan) -> Decision {
    let remove = |error: Error| Decision::Remove {
        reason: error.to_string(),
    };
    let identity = match read_pod(pod, &expected.instance) {
        Ok(identity) => identity,
        Err(error @ Error::ForeignInstance { .. }) => {
            return Decision::Ignore {
                reason: error.to_string(),
            }
        }
        Err(error) => return remove(error),
    };
    if let Some(ended) = ended(pod) {
        return remove(Error::Ended(ended));
    }
    if let Some(difference) = identity.difference(&PodIdentity::of_plan(expected)) {
        return remove(Error::Mismatch(difference));
    }
    match agent_key(pod) {
        Ok(agent_key) => Decision::Adopt {
            identity: Box::new(identity),
            agent_key,
        },
        Err(error) => remove(error),
    }
}

/// Why a pod will never serve again, if it will not: its containers ended (restartPolicy
/// Never) or it is being deleted.
fn ended(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("it is being deleted".to_owned());
    }
    let phase = pod.status.as_ref()?.phase.as_deref()?;
    matches!(phase, "Succeeded" | "Failed").then(|| format!("phase {phase}"))
}

/// The sandbox an object (a Service, a NetworkPolicy, a Pod) of this instance serves, by its
/// labels; `None` for another instance's or an unlabelled object.
pub fn sandbox_of(meta: &ObjectMeta, instance: &str) -> Option<SandboxId> {
    let labels = meta.labels.as_ref()?;
    if labels.get(LABEL_INSTANCE).map(String::as_str) != Some(instance)
        || labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(MANAGED_BY)
    {
        return None;
    }
    SandboxId::parse(labels.get(LABEL_SANDBOX)?).ok()
}

/// The agent key the pod's sandbox container was given.
pub fn agent_key(pod: &Pod) -> Result<AgentKey, Error> {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.iter().find(|c| c.name == CONTAINER_SANDBOX))
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|var| var.name == AGENT_KEY_ENV))
        .and_then(|var| var.value.clone())
        .filter(|key| !key.is_empty())
        .map(AgentKey)
        .ok_or(Error::MissingAgentKey)
}
