//! Discovery after a restart: each pod found is adopted when exactly what warren would
//! make for its identity, beside its own policy and Service and with its agent answering;
//! anything else of this instance's is removed.

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;
use kube::api::ListParams;
use warren_agent::remote::RemoteAgent;
use warren_backend::DiscoveredRuntime;
use warren_core::SandboxId;

use super::ready::{self, Progress};
use super::{Known, KubernetesBackend};
use crate::identity::{self, Decision};
use crate::names;

impl KubernetesBackend {
    /// Considers one pod found at start-up: adopted when exactly what warren would make for
    /// its identity, with its policy and Service, and its agent answering; else removed.
    pub(super) async fn consider(&self, pod: &Pod) -> Option<DiscoveredRuntime> {
        let sandbox = identity::sandbox_of(&pod.metadata, &self.config.instance)?;
        let identity = match identity::read_pod(pod, &self.config.instance) {
            Ok(identity) => identity,
            Err(crate::Error::ForeignInstance { .. }) => return None,
            Err(reason) => return self.remove(&sandbox, &reason.to_string()).await,
        };
        let Some(spec) = self.spec_of(&identity) else {
            return self
                .remove(&sandbox, "its runtime environment is not kept on this node")
                .await;
        };
        let plan = match self.plan(&spec) {
            Ok(plan) => plan,
            Err(error) => return self.remove(&sandbox, &error.to_string()).await,
        };
        match identity::decide(pod, &plan) {
            Decision::Adopt { .. } => {}
            Decision::Remove { reason } => return self.remove(&sandbox, &reason).await,
            Decision::Ignore { .. } => return None,
        }
        let name = plan.name();
        let policy = self
            .api::<K8sNetworkPolicy>()
            .get_opt(&name)
            .await
            .ok()
            .flatten();
        let service = self.api::<Service>().get_opt(&name).await.ok().flatten();
        if let Err(reason) = identity::check_network_policy(policy.as_ref(), &plan)
            .and_then(|()| identity::check_service(service.as_ref(), &plan))
        {
            return self.remove(&sandbox, &reason.to_string()).await;
        }
        let Progress::Ready { pod_ip, host_ip } = ready::progress(pod) else {
            return self.remove(&sandbox, "it is not ready").await;
        };
        let address = match self
            .agent_address(&sandbox, &name, &pod_ip, host_ip.as_deref())
            .await
        {
            Ok(address) => address,
            Err(error) => return self.remove(&sandbox, &error.to_string()).await,
        };
        let agent = RemoteAgent {
            address,
            key: self.key(&sandbox, spec.generation),
        };
        if let Err(reason) = self.verify(&spec, &agent).await {
            return self.remove(&sandbox, &reason).await;
        }
        self.lock().insert(
            sandbox,
            Known::new(
                spec.clone(),
                agent,
                &pod_ip,
                host_ip.as_deref(),
                self.egress_broker.get().cloned(),
            ),
        );
        Some(DiscoveredRuntime { spec })
    }

    pub(super) async fn remove(
        &self,
        sandbox: &SandboxId,
        reason: &str,
    ) -> Option<DiscoveredRuntime> {
        tracing::warn!(%sandbox, %reason, "removing a pod that cannot be reused");
        if let Err(error) = self.teardown(sandbox).await {
            tracing::error!(%sandbox, %error, "could not remove the pod");
        }
        let _ = std::fs::remove_file(self.env_path(sandbox));
        None
    }

    pub(super) fn instance_selector(&self) -> ListParams {
        ListParams::default().labels(&format!(
            "{}={},{}={}",
            names::LABEL_MANAGED_BY,
            names::MANAGED_BY,
            names::LABEL_INSTANCE,
            self.config.instance
        ))
    }
}
