//! Starting a runtime: its objects, policy first, the pod's readiness, its agent reached
//! and verified, and a resumed home restored; and whether a known pod still serves.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{Pod, Service};
use warren_agent::remote::RemoteAgent;
use warren_backend::{BackendError, RuntimeSpec};
use warren_core::SandboxId;

use super::ready::{self, Progress};
use super::{cluster, Known, KubernetesBackend};
use crate::identity::{self, Decision};
use crate::manifests::{self, ServiceType};
use crate::names;

impl KubernetesBackend {
    /// Where the agent of a ready pod answers.
    pub(super) async fn agent_address(
        &self,
        sandbox: &SandboxId,
        name: &str,
        pod_ip: &str,
        host_ip: Option<&str>,
    ) -> Result<SocketAddr, BackendError> {
        let bad = |what: &str| BackendError::NotReady {
            sandbox: sandbox.clone(),
            reason: format!("the pod reports {what}"),
        };
        match self.config.service_type {
            ServiceType::ClusterIp => {
                let ip = pod_ip
                    .parse()
                    .map_err(|_| bad("an IP that does not parse"))?;
                Ok(SocketAddr::new(ip, self.config.agent_port))
            }
            ServiceType::NodePort => {
                let ip = host_ip
                    .and_then(|ip| ip.parse().ok())
                    .ok_or_else(|| bad("no node IP"))?;
                let services = self.api::<Service>();
                let service = cluster::with_retries(|| services.get(name))
                    .await
                    .map_err(|e| cluster::failure(Some(sandbox), "read the service", e))?;
                let port = service
                    .spec
                    .and_then(|spec| spec.ports)
                    .into_iter()
                    .flatten()
                    .find_map(|port| port.node_port)
                    .ok_or_else(|| bad("a service without a node port"))?;
                Ok(SocketAddr::new(ip, port as u16))
            }
        }
    }

    /// Checks that the agent at `agent` is the runtime `spec` describes.
    pub(super) async fn verify(
        &self,
        spec: &RuntimeSpec,
        agent: &RemoteAgent,
    ) -> Result<(), String> {
        match agent.ping().await {
            Some((sandbox, generation, _))
                if sandbox == spec.sandbox.as_str() && generation == spec.generation =>
            {
                Ok(())
            }
            Some((sandbox, generation, _)) => Err(format!(
                "its agent answers as {sandbox} generation {generation}"
            )),
            None => Err("its agent does not answer with the key".into()),
        }
    }

    /// Whether the cluster still holds a ready pod for `sandbox` at the address warren
    /// dials. A pod deleted or replaced behind warren's back (evicted, drained, `kubectl
    /// delete`) leaves nothing at its address: connecting there times out rather than
    /// being refused, so the agent's client cannot tell it from a slow pod; the cluster
    /// can. A cluster that does not answer is no answer: the runtime is kept.
    pub(super) async fn still_serves(&self, sandbox: &SandboxId, known: &Known) -> bool {
        let name = names::object_name(&self.config.instance, sandbox);
        let pod = match self.api::<Pod>().get_opt(&name).await {
            Ok(Some(pod)) => pod,
            Ok(None) => return false,
            Err(_) => return true,
        };
        let Progress::Ready { pod_ip, host_ip } = ready::progress(&pod) else {
            return false;
        };
        self.agent_address(sandbox, &name, &pod_ip, host_ip.as_deref())
            .await
            .map_or(true, |address| address == known.agent.address)
    }

    pub(super) async fn start(&self, spec: &RuntimeSpec) -> Result<Known, BackendError> {
        let plan = self.plan(spec)?;
        let objects = manifests::build(&plan).map_err(|error| BackendError::Create {
            sandbox: spec.sandbox.clone(),
            source: std::io::Error::other(error.to_string()),
        })?;
        let sandbox = &spec.sandbox;
        self.save_env(spec).map_err(|source| BackendError::Create {
            sandbox: sandbox.clone(),
            source,
        })?;
        // The policy before the pod: the pod never runs unconfined.
        self.ensure(
            sandbox,
            "network policy",
            &objects.network_policy,
            |found| identity::check_network_policy(Some(found), &plan),
        )
        .await?;
        self.ensure(sandbox, "service", &objects.service, |found| {
            identity::check_service(Some(found), &plan)
        })
        .await?;
        self.ensure(
            sandbox,
            "pod",
            &objects.pod,
            |found| match identity::decide(found, &plan) {
                Decision::Adopt { .. } => Ok(()),
                Decision::Remove { reason } | Decision::Ignore { reason } => {
                    Err(crate::Error::Mismatch(reason))
                }
            },
        )
        .await?;
        let name = plan.name();
        let progress = ready::wait(&self.api::<Pod>(), &name, self.config.ready_timeout)
            .await
            .map_err(|reason| BackendError::NotReady {
                sandbox: sandbox.clone(),
                reason,
            })?;
        let (pod_ip, host_ip) = match progress {
            Progress::Ready { pod_ip, host_ip } => (pod_ip, host_ip),
            Progress::Stuck(reason) => {
                // A pod that will not start holds its node's resources for nothing.
                if let Err(error) = self.teardown(sandbox).await {
                    tracing::warn!(%sandbox, %error, "could not remove a pod that will not start");
                }
                return Err(BackendError::NotReady {
                    sandbox: sandbox.clone(),
                    reason,
                });
            }
            Progress::Waiting => unreachable!("the wait returns a final state"),
        };
        let address = self
            .agent_address(sandbox, &name, &pod_ip, host_ip.as_deref())
            .await?;
        let agent = RemoteAgent {
            address,
            key: self.key(sandbox, spec.generation),
        };
        self.verify(spec, &agent)
            .await
            .map_err(|reason| BackendError::NotReady {
                sandbox: sandbox.clone(),
                reason,
            })?;
        let ephemeral_home = spec.binding.layout.layout().home_is_ephemeral();
        if let (Some(seed), true) = (&spec.seed, ephemeral_home) {
            // Resuming a reaped runtime (I30): its /home/gem comes back through the agent
            // before the first command. A seed that cannot be copied leaves the home as
            // far as it got, never a failed start (as on Docker). A home that is the
            // workdir (E2B's) is persistent: nothing of it is in a seed.
            match agent
                .restore_home(seed.join("home"), self.config.limits.home_bytes)
                .await
            {
                Ok(moved) => {
                    tracing::debug!(%sandbox, entries = moved.entries, bytes = moved.bytes, "restored /home/gem")
                }
                Err(error) => {
                    tracing::warn!(%sandbox, %error, "could not restore /home/gem from the snapshot")
                }
            }
        }
        Ok(Known::new(
            RuntimeSpec {
                seed: None,
                ..spec.clone()
            },
            agent,
            &pod_ip,
            host_ip.as_deref(),
            self.egress_broker.get().cloned(),
        ))
    }
}
