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
mod ready;

pub use cluster::client_config;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use warren_agent::client::RunError;
use warren_agent::remote::RemoteAgent;
use warren_agent::{AgentConfig, AgentKey};
use warren_backend::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, EphemeralRoots,
    RuntimeLimits, RuntimeSpec, RuntimeUsage,
};
use warren_core::{DataLayout, SandboxId};

use crate::identity::{self, Decision};
use crate::manifests::{
    self, AgentPlan, Endpoint, Limits, Peer, PersistentMount, PodPlan, ServiceType,
};
use crate::names::{self, AGENT_MOUNT};
use ready::Progress;

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
    /// Its proxy connections' cap.
    permits: Arc<tokio::sync::Semaphore>,
}

impl Known {
    fn new(spec: RuntimeSpec, agent: RemoteAgent, pod_ip: &str, host_ip: Option<&str>) -> Self {
        Self {
            spec,
            agent,
            pod_ip: pod_ip
                .parse()
                .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
            host_ip: host_ip.and_then(|ip| ip.parse().ok()),
            permits: warren_agent::egress::runtime_permits(),
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

    /// The objects warren makes for `spec`, as a plan.
    fn plan(&self, spec: &RuntimeSpec) -> Result<PodPlan, BackendError> {
        let refuse = |reason: String| BackendError::Create {
            sandbox: spec.sandbox.clone(),
            source: std::io::Error::other(reason),
        };
        if !spec.binding.extra_mounts.is_empty() {
            return Err(refuse(
                "extra mounts are directories of warren's host, which no pod can mount; the \
                 kubernetes backend takes none"
                    .into(),
            ));
        }
        if spec.binding.ephemeral {
            // An ephemeral sandbox's trees are scratch directories beneath warren's own
            // data; a pod mounts the uid's claims by subPath, which would put the uid's
            // persistent workspace in front of a sandbox promised none of it (I14).
            return Err(refuse(
                "an ephemeral sandbox's scratch tree is on warren's host, which no pod can                  mount, and a pod would see the uid's persistent workspace instead; the                  kubernetes backend takes no ephemeral sandbox"
                    .into(),
            ));
        }
        if spec.binding.network.has_egress() && self.proxy_port.is_none() {
            return Err(refuse(
                "network \"open\" and \"allowlist\" need warren's egress proxy for pods, which \
                 this server does not serve (set [kubernetes] proxy_port and proxy_host); use \
                 network \"none\""
                    .into(),
            ));
        }
        let key = self.key(&spec.sandbox, spec.generation);
        let layout = spec.binding.layout.layout();
        let agent = AgentConfig {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            nofile: self.config.limits.nofile,
            // A pod's egress goes to warren's proxy over the network, as its policy allows.
            egress: false,
            socket_dir: None,
            listen: Some(SocketAddr::from(([0, 0, 0, 0], self.config.agent_port))),
            // Only an ephemeral home is kept open for snapshots (I30): E2B's home is the
            // workdir, persistent already, and the agent gets `HOME`, `USER` and `LOGNAME`
            // from the layout warren sends with each command, not from this.
            home: layout
                .home_is_ephemeral()
                .then(|| PathBuf::from(layout.home)),
            gvisor: false,
            max_processes: None,
            max_address_space: None,
        };
        let agent = serde_json::to_string(&agent).expect("the agent config serialises");
        let limits = &self.config.limits;
        const MIB: u64 = 1024 * 1024;
        Ok(PodPlan {
            instance: self.config.instance.clone(),
            namespace: self.config.namespace.clone(),
            sandbox: spec.sandbox.clone(),
            uid: spec.uid.clone(),
            runtime_scope: spec.runtime_scope.clone(),
            workdir: spec.binding.workdir.clone(),
            generation: spec.generation,
            layout: spec.binding.layout,
            network: spec.binding.network.clone(),
            image: spec
                .binding
                .image
                .clone()
                .unwrap_or_else(|| self.config.image.clone()),
            inherit_env: spec.binding.inherit_env,
            mounts: PersistentMount::for_layout(
                spec.binding.layout,
                &spec.uid.safe(),
                &spec.binding.workdir,
            ),
            user_data_claim: self.config.user_data_claim.clone(),
            skills_claim: self.config.skills_claim.clone(),
            limits: Limits {
                cpu_millis: limits.cpu_millis.unwrap_or(1000),
                memory_bytes: limits.memory_bytes.unwrap_or(2048 * MIB),
                // The home's emptyDir counts only where there is one (not E2B's, I30).
                ephemeral_storage_bytes: limits.cow_bytes
                    + if layout.home_is_ephemeral() {
                        limits.home_bytes
                    } else {
                        0
                    }
                    + limits.tmp_bytes,
                home_bytes: limits.home_bytes,
                tmp_bytes: limits.tmp_bytes,
            },
            agent: AgentPlan {
                image: self.config.warren_image.clone(),
                bundle_command: vec![
                    self.config.warren_binary.clone(),
                    AGENT_BUNDLE_ARG.to_owned(),
                    AGENT_MOUNT.to_owned(),
                ],
                prepare_command: vec![self.config.warren_binary.clone(), PREPARE_ARG.to_owned()],
                command: vec![
                    format!("{AGENT_MOUNT}/{}", warren_agent::bundle::LOADER),
                    "--argv0".into(),
                    "warren-agent".into(),
                    "--library-path".into(),
                    format!("{AGENT_MOUNT}/lib"),
                    format!("{AGENT_MOUNT}/{}", warren_agent::bundle::PROGRAM),
                    warren_agent::CONTAINER_AGENT_ARG.into(),
                    agent,
                ],
                port: self.config.agent_port,
                key: key.to_hex(),
                bundle_bytes: 256 * MIB,
            },
            service_type: self.config.service_type,
            // Pods with egress may reach warren's proxy (where warren's pods, or its
            // address, are), and nothing else.
            proxy: self.proxy_port.map(|port| Endpoint {
                peer: self.config.agent_clients.clone(),
                port,
            }),
            agent_clients: self.config.agent_clients.clone(),
        })
    }

    /// The spec of a pod warren reads back, with the runtime environment kept for it.
    fn spec_of(&self, identity: &identity::PodIdentity) -> Option<RuntimeSpec> {
        let env = self.load_env(&identity.sandbox)?;
        let safe = identity.uid.safe();
        Some(RuntimeSpec {
            sandbox: identity.sandbox.clone(),
            generation: identity.generation,
            uid: identity.uid.clone(),
            runtime_scope: identity.runtime_scope.clone(),
            user_workspace: self
                .config
                .workspace_dir
                .join(DataLayout::user_workspace_relative(&safe)),
            skill_projection: self
                .config
                .workspace_dir
                .join(DataLayout::skill_projection_relative(&safe)),
            env,
            seed: None,
            binding: warren_core::Binding {
                workdir: identity.workdir.clone(),
                network: identity.network.clone(),
                backend: BackendKind::Kubernetes,
                image: Some(identity.image.clone()),
                inherit_env: identity.inherit_env,
                ephemeral: false,
                layout: identity.layout,
                extra_mounts: Vec::new(),
                isolation: warren_core::IsolationTier::Kernel,
            },
        })
    }

    /// Where a snapshot of the runtime's home is received.
    fn snapshot_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.state_dir.join(format!("{sandbox}.home"))
    }

    fn env_path(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.state_dir.join(format!("{sandbox}.json"))
    }

    fn save_env(&self, spec: &RuntimeSpec) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.env_path(&spec.sandbox);
        let staging = path.with_extension("json.new");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&staging)?;
        file.write_all(&serde_json::to_vec(&spec.env).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(staging, path)
    }

    fn load_env(&self, sandbox: &SandboxId) -> Option<BTreeMap<String, String>> {
        let bytes = std::fs::read(self.env_path(sandbox)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Creates `object` unless it exists; an existing one is kept when `keep` accepts it,
    /// else replaced.
    async fn ensure<K>(
        &self,
        sandbox: &SandboxId,
        what: &str,
        object: &K,
        keep: impl Fn(&K) -> Result<(), crate::Error>,
    ) -> Result<(), BackendError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        let api = self.api::<K>();
        let name = object.meta().name.clone().unwrap_or_default();
        for _ in 0..2 {
            let created = cluster::with_retries(|| async {
                api.create(&PostParams::default(), object).await
            })
            .await;
            match created {
                Ok(_) => return Ok(()),
                Err(error) if cluster::is_already_exists(&error) => {
                    let found =
                        cluster::with_retries(|| api.get_opt(&name))
                            .await
                            .map_err(|e| {
                                cluster::failure(Some(sandbox), format!("read the {what}"), e)
                            })?;
                    match found.as_ref().map(&keep) {
                        Some(Ok(())) => return Ok(()),
                        Some(Err(reason)) => {
                            tracing::warn!(%sandbox, %reason, "replacing the sandbox's {what}");
                            let is_pod = what == "pod";
                            self.delete::<K>(sandbox, what, &name, is_pod).await?;
                        }
                        // Gone meanwhile: create it again.
                        None => {}
                    }
                }
                Err(error) => {
                    return Err(cluster::failure(
                        Some(sandbox),
                        format!("create the {what}"),
                        error,
                    ))
                }
            }
        }
        Err(BackendError::Create {
            sandbox: sandbox.clone(),
            source: std::io::Error::other(format!("the {what} keeps being replaced")),
        })
    }

    /// Deletes one object now (no grace: the runtime is being destroyed) and, for a pod,
    /// waits through a watch until it is gone (`until_gone`), so a new generation's pod of
    /// the same name can be created. Services and NetworkPolicies go at once (no graceful
    /// deletion, no finalizer of warren's), and the Role grants no `watch` on them.
    async fn delete<K>(
        &self,
        sandbox: &SandboxId,
        what: &str,
        name: &str,
        until_gone: bool,
    ) -> Result<(), BackendError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        let api = self.api::<K>();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::background()
        };
        let deleted = cluster::with_retries(|| api.delete(name, &params)).await;
        let uid = match deleted {
            Ok(either) => either.left().and_then(|object| object.meta().uid.clone()),
            Err(error) if cluster::is_not_found(&error) => return Ok(()),
            Err(error) => {
                return Err(cluster::failure(
                    Some(sandbox),
                    format!("delete the {what}"),
                    error,
                ))
            }
        };
        if !until_gone {
            return Ok(());
        }
        let uid = uid.unwrap_or_default();
        let gone = kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(DELETE_TIMEOUT, gone)
            .await
            .map_err(|_| BackendError::Destroy {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(format!("the {what} {name} is still there")),
            })?
            .map_err(|error| BackendError::Destroy {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(error.to_string()),
            })?;
        Ok(())
    }

    /// Removes everything of a sandbox's runtime from the cluster (its files stay, I15).
    async fn teardown(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        let name = names::object_name(&self.config.instance, sandbox);
        // The pod first: nothing may run without its policy.
        self.delete::<Pod>(sandbox, "pod", &name, true).await?;
        self.delete::<Service>(sandbox, "service", &name, false)
            .await?;
        self.delete::<K8sNetworkPolicy>(sandbox, "network policy", &name, false)
            .await?;
        Ok(())
    }

    /// Where the agent of a ready pod answers.
    async fn agent_address(
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
    async fn verify(&self, spec: &RuntimeSpec, agent: &RemoteAgent) -> Result<(), String> {
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

    /// A command with egress uses warren's proxy, not the runtime's loopback (a pod has no
    /// proxy port of its own).
    fn point_at_proxy(&self, known: &Known, spec: &mut warren_agent::protocol::ExecSpec) {
        if known.spec.binding.network.has_egress() {
            // Not the runtime's loopback (a pod has no proxy port of its own): warren's.
            let host = match self.config.proxy_host.as_deref() {
                Some("node") | None => known.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
                Some(host) => host.to_owned(),
            };
            let port = self.proxy_port.unwrap_or(0);
            let url = match host.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("http://[{host}]:{port}"),
                Err(_) => format!("http://{host}:{port}"),
            };
            // In place of the loopback proxy only: a value the runtime's or the call's own
            // environment set still wins (I14).
            let loopback = format!("http://127.0.0.1:{}", warren_agent::environment::PROXY_PORT);
            for (name, value) in warren_agent::client::proxy_environment_at(&url) {
                if spec.env.get(&name) == Some(&loopback) {
                    spec.env.insert(name, value);
                }
            }
        }
    }

    /// Whether the cluster still holds a ready pod for `sandbox` at the address warren
    /// dials. A pod deleted or replaced behind warren's back (evicted, drained, `kubectl
    /// delete`) leaves nothing at its address: connecting there times out rather than
    /// being refused, so the agent's client cannot tell it from a slow pod; the cluster
    /// can. A cluster that does not answer is no answer: the runtime is kept.
    async fn still_serves(&self, sandbox: &SandboxId, known: &Known) -> bool {
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

    async fn start(&self, spec: &RuntimeSpec) -> Result<Known, BackendError> {
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
        ))
    }

    fn find(&self, sandbox: &SandboxId) -> Result<Known, BackendError> {
        self.lock()
            .get(sandbox)
            .cloned()
            .ok_or_else(|| BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            })
    }

    /// Considers one pod found at start-up: adopted when exactly what warren would make for
    /// its identity, with its policy and Service, and its agent answering; else removed.
    async fn consider(&self, pod: &Pod) -> Option<DiscoveredRuntime> {
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
            Known::new(spec.clone(), agent, &pod_ip, host_ip.as_deref()),
        );
        Some(DiscoveredRuntime { spec })
    }

    async fn remove(&self, sandbox: &SandboxId, reason: &str) -> Option<DiscoveredRuntime> {
        tracing::warn!(%sandbox, %reason, "removing a pod that cannot be reused");
        if let Err(error) = self.teardown(sandbox).await {
            tracing::error!(%sandbox, %error, "could not remove the pod");
        }
        let _ = std::fs::remove_file(self.env_path(sandbox));
        None
    }

    fn instance_selector(&self) -> ListParams {
        ListParams::default().labels(&format!(
            "{}={},{}={}",
            names::LABEL_MANAGED_BY,
            names::MANAGED_BY,
            names::LABEL_INSTANCE,
            self.config.instance
        ))
    }
}

/// The argument `warren` recognises to write the agent bundle into a directory (the
/// pod's agent-bundle init container).
pub const AGENT_BUNDLE_ARG: &str = "__agent-bundle";
/// The argument `warren` recognises to run a pod's root init step ([`mod@crate::prepare`]).
pub const PREPARE_ARG: &str = "__k8s-prepare";
/// How long a deleted pod may take to be gone.
const DELETE_TIMEOUT: Duration = Duration::from_secs(60);

#[async_trait]
impl Backend for KubernetesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Kubernetes
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

    async fn processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        let Ok(known) = self.find(sandbox) else {
            return Ok(None);
        };
        Ok(known.agent.ping().await.map(|(_, _, processes)| processes))
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

/// Serves warren's egress proxy to pods on `address`: a connection is a runtime's when it
/// comes from the address of a pod warren runs with network `open` or `allowlist`, and is
/// then checked against that runtime's policy (`warren_agent::egress`); any other is closed
/// at once. Returns the port it listens on.
fn serve_proxy(address: SocketAddr, runtimes: Runtimes) -> std::io::Result<u16> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| std::io::Error::other("the egress proxy needs a tokio runtime"))?;
    let listener = std::net::TcpListener::bind(address)?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = handle.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let runtime = handle.clone();
    handle.spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "the egress proxy for pods could not accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let found = runtimes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .find(|known| known.pod_ip == peer.ip() && known.spec.binding.network.has_egress())
                .map(|known| (known.spec.binding.network.clone(), known.permits.clone()));
            let Some((policy, permits)) = found else {
                tracing::debug!(%peer, "an egress connection from no sandbox with egress");
                continue;
            };
            let Ok(stream) = stream.into_std() else {
                continue;
            };
            warren_agent::egress::spawn_connection(stream, policy, &permits, &runtime);
        }
    });
    Ok(port)
}
