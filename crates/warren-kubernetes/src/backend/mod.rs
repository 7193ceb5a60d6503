//! The Kubernetes backend (`"backend":"kubernetes"`, issue 15): one Pod, Service and
//! NetworkPolicy per sandbox on the Kubernetes API, through `kube`, with warren's agent in
//! the pod reached over its authenticated TCP transport (`warren_agent::remote`).
//!
//! ```text
//! provisioner ─▶ KubernetesBackend ──kube::Client──▶ kube-apiserver ─▶ kubelet
//!                      │                                                │ init: prepare (root, one uid's subtree)
//!                      │                                                │ init: agent-bundle (warren's image)
//!                      └──TCP (key, sealed frames)──▶ pod: warren-agent (1000:1000) ─fork▶ command
//! ```
//!
//! The NetworkPolicy is created first, so the pod never runs without it; then the Service,
//! then the Pod, whose readiness is awaited through a watch ([`ready`]). warren dials the
//! pod's IP (the NetworkPolicy admits only warren's pods there) for a ClusterIP Service, and
//! the node's IP and the NodePort when warren runs outside the cluster. Every pod's agent
//! key is derived from a secret of warren's, the sandbox id and the generation, so every
//! replica holding the secret reaches every agent and a new generation has a new key.
//!
//! A runtime snapshot's `/home/gem` streams through the agent (no host path to it exists):
//! received into a directory of warren's for the snapshot engine, and sent back into a
//! resumed pod before its first command. The E2B layout's home is the workdir (I7): its pod
//! has no home `emptyDir`, its user comes from warren's accounts files
//! ([`crate::accounts`]), and snapshots skip its home (I30).
//!
//! Network `open`/`allowlist`: a pod has no proxy port of its own; its NetworkPolicy lets
//! it reach warren's egress proxy port and nothing else, its commands' proxy variables
//! name warren's address, and warren serves a connection only from the address of a pod
//! it runs with egress, under that sandbox's policy (the checks of `warren_agent::egress`,
//! as on every backend). Source addresses must reach warren unmasqueraded (the default
//! for pod-to-pod and pod-to-Service traffic).
//!
//! Not done here: operators' extra mounts (host directories no pod can mount), refused
//! with a clear error.

mod cluster;
mod discover;
mod objects;
mod plan;
mod proxy;
mod ready;
mod start;
mod state;

pub use cluster::client_config;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use warren_agent::client::RunError;
use warren_agent::remote::RemoteAgent;
use warren_agent::AgentKey;
use warren_backend::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, EphemeralRoots,
    RuntimeLimits, RuntimeSpec, RuntimeUsage,
};
use warren_core::SandboxId;

use crate::identity;
use crate::manifests::{Peer, ServiceType};
use crate::names;
use proxy::serve_proxy;

/// How the Kubernetes backend makes and reaches sandbox pods.
#[derive(Clone)]
pub struct KubernetesConfig {
    /// The namespace of sandbox pods (and of the claims).
    pub namespace: String,
    /// This warren's instance name: owner of its objects.
    pub instance: String,
    /// The image of sandboxes that name none.
    pub image: String,
    /// warren's own image: the init containers run it.
    pub warren_image: String,
    /// warren's executable in that image.
    pub warren_binary: String,
    /// The agent's TCP port in the pod.
    pub agent_port: u16,
    /// How warren reaches sandbox pods.
    pub service_type: ServiceType,
    /// The USER_DATA claim.
    pub user_data_claim: String,
    /// The SKILLS claim.
    pub skills_claim: String,
    /// Who may connect to the agent port: warren's pods, or its address outside.
    pub agent_clients: Peer,
    /// Where warren serves its egress proxy to pods (`0.0.0.0:3128`; port 0: any), when
    /// sandboxes here may have network `open` or `allowlist`.
    pub proxy_listen: Option<SocketAddr>,
    /// The host pods dial the proxy at (warren's Service name); `node` for the pod's node
    /// address (warren on the node's network).
    pub proxy_host: Option<String>,
    /// Resources of each pod.
    pub limits: RuntimeLimits,
    /// The secret every agent key is derived from (every replica holds the same).
    pub agent_secret: Vec<u8>,
    /// How long a pod may take to be ready.
    pub ready_timeout: Duration,
    /// Where each runtime's environment is kept (0600): never in the pod's spec, which
    /// anyone allowed to read pods could read.
    pub state_dir: PathBuf,
    /// The directory the UserWorkspaces and projections are under on warren's side: the
    /// claims, as warren mounts them (what `RuntimeSpec`'s host paths are made of).
    pub workspace_dir: PathBuf,
}

impl std::fmt::Debug for KubernetesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesConfig")
            .field("namespace", &self.namespace)
            .field("instance", &self.instance)
            .field("image", &self.image)
            .field("warren_image", &self.warren_image)
            .field("service_type", &self.service_type)
            .field("agent_secret", &"[redacted]")
            .finish_non_exhaustive()
    }
}

/// A runtime warren made or adopted: what it is and where its agent answers.
#[derive(Clone)]
struct Known {
    spec: RuntimeSpec,
    agent: RemoteAgent,
    /// The pod's address: its proxy connections come from it.
    pod_ip: std::net::IpAddr,
    /// Its node's address.
    host_ip: Option<std::net::IpAddr>,
    /// Its egress through warren's proxy port: policy, caps, secrets and audit.
    egress: Arc<warren_agent::egress::RuntimeEgress>,
}

impl Known {
    fn new(
        spec: RuntimeSpec,
        agent: RemoteAgent,
        pod_ip: &str,
        host_ip: Option<&str>,
        broker: Option<warren_backend::SharedBroker>,
    ) -> Self {
        let egress = warren_agent::egress::RuntimeEgress::new(
            spec.sandbox.clone(),
            spec.binding.network.clone(),
            broker,
        );
        Self {
            spec,
            agent,
            pod_ip: pod_ip
                .parse()
                .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
            host_ip: host_ip.and_then(|ip| ip.parse().ok()),
            egress,
        }
    }
}

type Runtimes = Arc<Mutex<HashMap<SandboxId, Known>>>;

/// The Kubernetes backend.
pub struct KubernetesBackend {
    client: Client,
    config: KubernetesConfig,
    runtimes: Runtimes,
    /// The port warren's egress proxy for pods listens on, when it serves one.
    proxy_port: Option<u16>,
    /// One create at a time per sandbox (the provisioner serialises them already; this
    /// keeps the backend sound on its own).
    creating: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// What pods' egress asks for secrets, authority and the audit (issue 38).
    egress_broker: std::sync::OnceLock<warren_backend::SharedBroker>,
}

impl KubernetesBackend {
    /// A backend on `client` (which names the cluster and its credentials).
    pub fn new(client: Client, config: KubernetesConfig) -> std::io::Result<Self> {
        names::check_instance(&config.instance).map_err(std::io::Error::other)?;
        std::fs::create_dir_all(&config.state_dir)?;
        std::fs::set_permissions(
            &config.state_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )?;
        let runtimes: Runtimes = Arc::new(Mutex::new(HashMap::new()));
        let proxy_port = match config.proxy_listen {
            Some(address) => Some(serve_proxy(address, runtimes.clone())?),
            None => None,
        };
        Ok(Self {
            client,
            config,
            runtimes,
            proxy_port,
            creating: Mutex::new(HashMap::new()),
            egress_broker: std::sync::OnceLock::new(),
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Known>> {
        self.runtimes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, sandbox: &SandboxId, generation: i64) -> AgentKey {
        AgentKey::derive(&self.config.agent_secret, sandbox.as_str(), generation)
    }

    fn find(&self, sandbox: &SandboxId) -> Result<Known, BackendError> {
        self.lock()
            .get(sandbox)
            .cloned()
            .ok_or_else(|| BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            })
    }
}

/// The argument `warren` recognises to write the agent bundle into a directory (the
/// pod's agent-bundle init container).
pub const AGENT_BUNDLE_ARG: &str = "__agent-bundle";
/// The argument `warren` recognises to run a pod's root init step ([`mod@crate::prepare`]).
pub const PREPARE_ARG: &str = "__k8s-prepare";

#[async_trait]
impl Backend for KubernetesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Kubernetes
    }

    fn attach_egress(&self, broker: warren_backend::SharedBroker) {
        let _ = self.egress_broker.set(broker);
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exec: true,
            isolation: true,
            survives_restart: true,
            resource_limits: true,
            gvisor: false,
            host_mounts: false,
        }
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        let gate = self
            .creating
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(spec.sandbox.clone())
            .or_default()
            .clone();
        let _held = gate.lock().await;
        let known = self.lock().get(&spec.sandbox).cloned();
        let unseeded = RuntimeSpec {
            seed: None,
            ..spec.clone()
        };
        if let Some(known) = known {
            if known.spec == unseeded && self.verify(spec, &known.agent).await.is_ok() {
                return Ok(DiscoveredRuntime { spec: known.spec });
            }
        }
        let known = self.start(spec).await?;
        self.lock().insert(spec.sandbox.clone(), known);
        Ok(DiscoveredRuntime { spec: spec.clone() })
    }

    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError> {
        let api = self.api::<Pod>();
        let selector = self.instance_selector();
        let pods = cluster::with_retries(|| api.list(&selector))
            .await
            .map_err(|e| cluster::failure(None, "list the sandbox pods", e))?;
        let mut found = Vec::new();
        for pod in &pods.items {
            if let Some(runtime) = self.consider(pod).await {
                found.push(runtime);
            }
        }
        // Services and policies whose pod is gone (a crash between creating them and the
        // pod, or a pod deleted behind warren's back).
        let kept: std::collections::HashSet<SandboxId> = self.lock().keys().cloned().collect();
        let services = self.api::<Service>().list(&self.instance_selector()).await;
        let policies = self
            .api::<K8sNetworkPolicy>()
            .list(&self.instance_selector())
            .await;
        let mut orphans = std::collections::BTreeSet::new();
        for meta in services
            .into_iter()
            .flat_map(|l| l.items.into_iter().map(|s| s.metadata))
            .chain(
                policies
                    .into_iter()
                    .flat_map(|l| l.items.into_iter().map(|p| p.metadata)),
            )
        {
            if let Some(sandbox) = identity::sandbox_of(&meta, &self.config.instance) {
                if !kept.contains(&sandbox) {
                    orphans.insert(sandbox);
                }
            }
        }
        for sandbox in orphans {
            self.remove(&sandbox, "its pod is gone").await;
        }
        Ok(found)
    }

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &warren_backend::ProcessRequest,
    ) -> Result<warren_backend::ProcessStart, BackendError> {
        let known = self.find(sandbox)?;
        let mut spec = warren_agent::client::process_spec(
            request,
            known.spec.binding.layout.layout(),
            &known.spec.binding.network,
            &known.spec.env,
        );
        self.point_at_proxy(&known, &mut spec);
        match known.agent.start_process(spec, sandbox).await {
            Ok(started) => Ok(started),
            Err(error) => {
                // The pod is gone, or was replaced behind warren's back: forget it, so
                // the next use starts a fresh one.
                if error.is_gone() || !self.still_serves(sandbox, &known).await {
                    self.lock().remove(sandbox);
                }
                Err(error.into_backend(sandbox))
            }
        }
    }

    async fn processes(
        &self,
        sandbox: &SandboxId,
        quiet: &[i32],
    ) -> Result<Option<u64>, BackendError> {
        let Ok(known) = self.find(sandbox) else {
            return Ok(None);
        };
        Ok(known
            .agent
            .activity(quiet)
            .await
            .map(|(_, _, processes)| processes))
    }

    async fn runtime_file(
        &self,
        sandbox: &SandboxId,
        op: &warren_backend::FileOp,
        data: Vec<u8>,
    ) -> Result<warren_backend::FileReply, BackendError> {
        let known = self.find(sandbox)?;
        known
            .agent
            .file(op, &data)
            .await
            .map_err(|error| error.into_backend(sandbox))
    }

    async fn kill_processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        let Ok(known) = self.find(sandbox) else {
            return Ok(None);
        };
        match known.agent.kill_all().await {
            Ok(killed) => Ok(Some(killed)),
            Err(RunError::Gone(_)) => Ok(None),
            Err(RunError::Io(source)) => Err(BackendError::Kill {
                sandbox: sandbox.clone(),
                source,
            }),
        }
    }

    /// Not measured: a pod's cgroup lives on its node, out of warren's reach, and the
    /// figures Kubernetes offers come from the kubelet's resource metrics (a
    /// metrics-server's API), which warren does not depend on. The agent in the pod could
    /// read its container's cgroup, but the control protocol has no request for it yet;
    /// until then no figure is reported rather than a guess (I22).
    async fn usage(&self, _sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        Ok(None)
    }

    /// The runtime's `/home/gem`, received from its agent into a directory of warren's
    /// (no host path to a pod's home exists), for a snapshot (I30); the pod has no
    /// copy-on-write layer of warren's (its image's root is read-only), so that one is
    /// empty. The directory is replaced at the next snapshot and removed with the runtime.
    /// A home that is the persistent workdir (E2B's) is not recorded: `home` is `None` and
    /// nothing is asked of the agent.
    async fn ephemeral_roots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<EphemeralRoots>, BackendError> {
        let Ok(known) = self.find(sandbox) else {
            return Ok(None);
        };
        let staging = self.snapshot_dir(sandbox);
        let failed = |source: std::io::Error| BackendError::Exec {
            sandbox: sandbox.clone(),
            source,
        };
        let ephemeral_home = known.spec.binding.layout.layout().home_is_ephemeral();
        let _ = std::fs::remove_dir_all(&staging);
        let home = ephemeral_home.then(|| staging.join("home"));
        for dir in std::iter::once(staging.join("cow")).chain(home.clone()) {
            std::fs::create_dir_all(&dir).map_err(failed)?;
        }
        std::fs::set_permissions(
            &staging,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(failed)?;
        let Some(home) = home else {
            // The home is the persistent workdir (E2B's): nothing of it is ephemeral state.
            return Ok(Some(EphemeralRoots {
                cow: staging.join("cow"),
                home: None,
            }));
        };
        // The home is an emptyDir of `home_bytes`: more than that cannot be there.
        let limit = self.config.limits.home_bytes.saturating_mul(2);
        match known.agent.archive_home(home.clone(), limit).await {
            Ok(_) => Ok(Some(EphemeralRoots {
                cow: staging.join("cow"),
                home: Some(home),
            })),
            Err(RunError::Gone(_)) => Ok(None),
            Err(RunError::Io(source)) => Err(failed(source)),
        }
    }

    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        self.teardown(sandbox).await?;
        self.lock().remove(sandbox);
        let _ = std::fs::remove_file(self.env_path(sandbox));
        let _ = std::fs::remove_dir_all(self.snapshot_dir(sandbox));
        Ok(())
    }
}
