//! The Docker backend: one container per sandbox on a Docker Engine (I18), through the
//! Engine API (`bollard`), never the docker CLI.
//!
//! A sandbox's container runs the operator's image read-only, as 1000:1000 with every
//! capability dropped, `no-new-privileges`, Docker's default seccomp profile, memory, pids
//! and CPU limits, the layout's home (`/home/gem`), `/tmp` and `/var/tmp` on size-capped
//! tmpfs, and exactly the persistent binds of the sandbox's layout (I7): for the ARS
//! layout the uid's UserWorkspace at `/home/gem/user-data` (rw) and the skill projection
//! at `/home/gem/skills` (ro); for DeerFlow's the workdir at `/mnt/user-data` (rw), the
//! projection at `/mnt/skills/public` and the personal skills at `/mnt/skills/custom`
//! (ro). A bind of a directory beneath a tree the sandbox user writes to is staged by
//! descriptor first (`staging`), never handed to dockerd as a path it would walk.
//!
//! A container's PID 1 is warren's agent (this same executable with its loader and
//! libraries, mounted read-only at `/opt/warren-agent`), which serves commands over a Unix
//! socket in a per-sandbox directory (`/run/warren`) with the local runtime's control
//! protocol, and applies warren's own seccomp policy to each command on top of Docker's.
//! A command costs a fork, not a `docker exec`.
//!
//! Networking: `none` gets no network at all; a sandbox with egress gets a bridge network
//! of its own, internal (no route off the bridge) and never shared, and reaches the outside
//! only through the agent's proxy port, which hands each connection to the provisioner to
//! check against the sandbox's policy exactly as for the local backend (I23). No port is
//! published.
//!
//! Labels carry the identity (instance, sandbox, generation, uid, runtime scope, workdir,
//! layout, network, image and the host trees), so a restarted provisioner adopts exactly
//! matching containers and removes the rest, including legacy layouts (I16).
//!
//! **Invariant:** a container never gets the Docker socket, a host path beyond its
//! layout's persistent binds, the agent bundle and its socket directory, or a published
//! port; the backend never deletes UserWorkspace files (I15).

#![deny(missing_docs)]

mod accounts;
mod gvisor;
mod identity;
mod launch;
mod usage;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountBindOptions, MountBindOptionsPropagationEnum,
    MountType, NetworkCreateRequest, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use warren_agent::bundle::{self, AgentBundle};
use warren_agent::client::{self, RunError};
use warren_agent::{sentry_limits, AgentConfig};
use warren_backend::staging::{is_staged, StagedBinds};
use warren_backend::RuntimeLimits;
use warren_backend::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, EphemeralRoots,
    ProcessPressure, RuntimeSpec, RuntimeUsage,
};
use warren_core::{IsolationTier, SandboxId};

pub use identity::{LayoutProblem, LABEL_INSTANCE, LABEL_SANDBOX};

use crate::identity::Identity;
use crate::launch::*;
use crate::usage::usage_of;

/// Where the agent bundle is mounted in a container (read-only).
pub const AGENT_MOUNT: &str = "/opt/warren-agent";
/// Where the agent's socket directory is mounted in a container.
pub const SOCKET_MOUNT: &str = "/run/warren";

/// How long a started container may take until its agent answers.
const AGENT_START_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the Docker backend could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The engine does not answer.
    #[error("cannot reach the Docker engine at {socket} ({source}); start dockerd, or point --docker-socket at it")]
    Unreachable {
        /// The socket tried.
        socket: String,
        /// What failed.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine refused or failed a call.
    #[error("the Docker engine failed to {operation}: {source}")]
    Engine {
        /// What was being done.
        operation: &'static str,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// The image is not on the Docker host (warren never pulls).
    #[error("image {image:?} is not on the Docker host; build or pull it there first (warren never pulls)")]
    ImageMissing {
        /// The image.
        image: String,
    },
    /// The agent bundle (warren's executable and its libraries) could not be prepared.
    #[error("cannot prepare the agent bundle for containers: {0}")]
    Bundle(#[source] std::io::Error),
    /// Host directories of the backend could not be made.
    #[error("cannot prepare {what}: {source}")]
    HostDir {
        /// Which directory.
        what: &'static str,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The container started but its agent never answered.
    #[error("the container's agent did not start: {0}")]
    AgentDidNotStart(String),
    /// A persistent mount's source was refused (a link where the workdir should be) or
    /// could not be staged; nothing was handed to the engine.
    #[error("cannot mount {target}: {reason}")]
    Mount {
        /// Where the mount would have gone inside the container.
        target: String,
        /// Why not, in terms of the paths inside the tree (never a host path).
        reason: String,
    },
}

impl DockerError {
    /// A staging failure (`warren_backend::staging`) as this backend's.
    fn from_staging(error: BackendError) -> Self {
        match error {
            BackendError::HostDir { what, source } => Self::HostDir { what, source },
            BackendError::MountRefused { target, reason } => Self::Mount { target, reason },
            other => Self::HostDir {
                what: "the sandbox's staging directory",
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

/// Configuration of the Docker backend.
#[derive(Debug, Clone)]
pub struct DockerBackendConfig {
    /// warren's data directory.
    pub data_dir: PathBuf,
    /// warren's own executable: run in containers as the agent.
    pub agent_program: PathBuf,
    /// The engine's Unix socket (default `/var/run/docker.sock`).
    pub socket: Option<String>,
    /// Limits of every container.
    pub limits: RuntimeLimits,
    /// The name dockerd registered runsc under, for the gVisor tier (issue 19); `None`
    /// is `runsc`.
    pub gvisor_runtime: Option<String>,
}

/// Runtimes as Docker containers.
pub struct DockerBackend {
    docker: Docker,
    /// What containers' egress proxies ask for secrets, authority and the audit (issue 38).
    egress_broker: std::sync::OnceLock<warren_backend::SharedBroker>,
    config: DockerBackendConfig,
    /// Distinguishes this warren's containers from another's on the same engine.
    instance: String,
    /// Per-sandbox socket directories, mounted into containers.
    sockets_dir: PathBuf,
    /// Per-sandbox records the containers must not see (the runtime environment).
    state_dir: PathBuf,
    /// Per-sandbox staging directories of binds beneath a user's tree (`staging`).
    binds_dir: PathBuf,
    /// An empty directory: the copy-on-write layers of a read-only image root.
    no_cow: PathBuf,
    /// Per-sandbox staging of gVisor homes for runtime snapshots (I30).
    snapshots_dir: PathBuf,
    /// `/etc/passwd` and `/etc/group` of layouts whose user images do not name
    /// ([`accounts`]).
    accounts_dir: PathBuf,
    bundle: AgentBundle,
    engine_version: String,
    /// What the engine cannot enforce, reported at start-up and in `/health`.
    warnings: Vec<String>,
    /// The engine enforces memory and process limits.
    limits_enforced: bool,
    /// The runtime name of the gVisor tier, and why the engine cannot serve it, if not.
    gvisor_runtime: String,
    gvisor_problem: Option<String>,
    live: Mutex<HashMap<SandboxId, Identity>>,
}

fn engine(operation: &'static str) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    move |source| DockerError::Engine { operation, source }
}

fn is_not_found(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

impl DockerBackend {
    /// Connects to the engine, checks it answers, and prepares the agent bundle and the
    /// backend's host directories under `<data>/docker`.
    pub async fn new(config: DockerBackendConfig) -> Result<Self, DockerError> {
        let socket = config
            .socket
            .clone()
            .unwrap_or_else(|| "/var/run/docker.sock".to_owned());
        let unreachable = |source| DockerError::Unreachable {
            socket: socket.clone(),
            source,
        };
        let docker = Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION)
            .map_err(unreachable)?
            .negotiate_version()
            .await
            .map_err(unreachable)?;
        let version = docker.version().await.map_err(unreachable)?;
        let info = docker
            .info()
            .await
            .map_err(engine("read the engine's information"))?;
        let mut warnings = Vec::new();
        let gvisor_runtime = config
            .gvisor_runtime
            .clone()
            .unwrap_or_else(|| "runsc".to_owned());
        let gvisor_problem = gvisor::runtime_problem(info.runtimes.as_ref(), &gvisor_runtime);
        let limits_enforced = info.memory_limit != Some(false) && info.pids_limit != Some(false);
        for (enforced, what) in [
            (
                info.memory_limit,
                "memory limits are not enforced: the Docker engine has no memory cgroup",
            ),
            (
                info.swap_limit,
                "swap is not limited: the Docker engine cannot limit swap",
            ),
            (
                info.pids_limit,
                "process limits are not enforced: the Docker engine has no pids cgroup",
            ),
            (
                info.cpu_cfs_quota,
                "CPU quotas are not enforced: the Docker engine has no CFS quota",
            ),
        ] {
            if enforced == Some(false) {
                warnings.push(what.to_owned());
            }
        }
        if !info
            .security_options
            .unwrap_or_default()
            .iter()
            .any(|o| o.contains("seccomp"))
        {
            warnings.push(
                "the Docker engine applies no seccomp profile; only warren's own filters each command".to_owned(),
            );
        }
        let root = config.data_dir.join("docker");
        let sockets_dir = root.join("sockets");
        let state_dir = root.join("state");
        let binds_dir = root.join("binds");
        let no_cow = root.join("no-cow");
        let snapshots_dir = root.join("snapshots");
        let accounts_dir = root.join("accounts");
        for (dir, what) in [
            (&root, "the docker directory"),
            (&sockets_dir, "the socket directories"),
            (&state_dir, "the state directory"),
            (&binds_dir, "the staging directories"),
            (&no_cow, "the empty copy-on-write directory"),
            (&snapshots_dir, "the snapshot staging directory"),
        ] {
            std::fs::create_dir_all(dir).map_err(|source| DockerError::HostDir { what, source })?;
        }
        // Only warren (and dockerd, as root) ever walks to a staged bind.
        set_mode(&binds_dir, 0o700).map_err(|source| DockerError::HostDir {
            what: "the staging directories",
            source,
        })?;
        // A crash between staging a bind and starting its container leaves the staging
        // mount; every container that used one holds its own copy already.
        warren_backend::staging::remove_all(&binds_dir).map_err(|source| DockerError::HostDir {
            what: "the staging directories",
            source,
        })?;
        // A container reaches its own socket directory through its bind mount, never
        // through these host directories.
        set_mode(&sockets_dir, 0o700).map_err(|source| DockerError::HostDir {
            what: "the socket directories",
            source,
        })?;
        set_mode(&state_dir, 0o700).map_err(|source| DockerError::HostDir {
            what: "the state directory",
            source,
        })?;
        accounts::write_all(&accounts_dir).map_err(|source| DockerError::HostDir {
            what: "the accounts files",
            source,
        })?;
        let bundle =
            AgentBundle::prepare(&config.agent_program, &root).map_err(DockerError::Bundle)?;
        let instance =
            blake3::hash(config.data_dir.as_os_str().as_encoded_bytes()).to_hex()[..8].to_owned();
        Ok(Self {
            docker,
            config,
            instance,
            sockets_dir,
            state_dir,
            binds_dir,
            no_cow,
            snapshots_dir,
            accounts_dir,
            bundle,
            engine_version: version.version.unwrap_or_default(),
            warnings,
            limits_enforced,
            gvisor_runtime,
            gvisor_problem,
            live: Mutex::new(HashMap::new()),
            egress_broker: std::sync::OnceLock::new(),
        })
    }

    /// The engine's version, logged at start-up.
    pub fn engine_version(&self) -> &str {
        &self.engine_version
    }

    /// Whether `image` is on the Docker host (warren never pulls, I18).
    pub async fn has_image(&self, image: &str) -> Result<bool, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(error) if is_not_found(&error) => Ok(false),
            Err(error) => Err(engine("inspect the image")(error)),
        }
    }

    fn container_name(&self, sandbox: &SandboxId) -> String {
        format!("warren-{}-{}", self.instance, sandbox)
    }

    fn socket_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.sockets_dir.join(sandbox.as_str())
    }

    fn state_file(&self, sandbox: &SandboxId) -> PathBuf {
        self.state_dir.join(format!("{sandbox}.json"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Identity>> {
        // A cache of what the labels and state files say; poisoning loses nothing.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live runtime of `sandbox`: known to this process, or a container of this
    /// instance whose labels and mounts match its record and whose agent answers.
    async fn find(&self, sandbox: &SandboxId) -> Option<Identity> {
        if let Some(identity) = self.lock().get(sandbox).cloned() {
            return Some(identity);
        }
        let found = self.inspect_identity(sandbox).await.ok()?;
        self.adopt(found.clone());
        Some(found)
    }

    /// Takes a runtime into this provisioner's care; serves its egress if it has any.
    fn adopt(&self, identity: Identity) {
        if identity.spec.binding.network.has_egress() {
            let egress = warren_agent::egress::RuntimeEgress::new(
                identity.spec.sandbox.clone(),
                identity.spec.binding.network.clone(),
                self.egress_broker.get().cloned(),
            );
            if let Err(error) = warren_agent::egress::spawn_egress(
                self.socket_dir(&identity.spec.sandbox),
                egress,
                tokio::runtime::Handle::current(),
            ) {
                tracing::error!(sandbox = %identity.spec.sandbox, %error, "cannot serve the container's egress");
            }
        }
        self.lock().insert(identity.spec.sandbox.clone(), identity);
    }

    /// Removes the container (killing everything in it), its network, socket directory and
    /// state file. Safe to repeat; UserWorkspace files are never touched (I15).
    async fn teardown(&self, sandbox: &SandboxId) -> Result<(), DockerError> {
        self.lock().remove(sandbox);
        let name = self.container_name(sandbox);
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(&name, Some(options)).await {
            Err(error) if !is_not_found(&error) => {
                return Err(engine("remove the container")(error))
            }
            _ => {}
        }
        match self.docker.remove_network(&name).await {
            Err(error) if !is_not_found(&error) => {
                return Err(engine("remove the sandbox's network")(error))
            }
            _ => {}
        }
        for result in [
            remove_socket_dir(&self.socket_dir(sandbox)),
            std::fs::remove_file(self.state_file(sandbox)),
            warren_backend::staging::remove(&self.binds_dir.join(sandbox.as_str())),
            // warren's own copy of a gVisor home (links are removed, never followed).
            std::fs::remove_dir_all(self.snapshots_dir.join(sandbox.as_str())),
        ] {
            if let Err(error) = result {
                if error.kind() != std::io::ErrorKind::NotFound {
                    return Err(DockerError::HostDir {
                        what: "the sandbox's host files",
                        source: error,
                    });
                }
            }
        }
        Ok(())
    }

    fn labelled(&self) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_INSTANCE}={}", self.instance)],
        )])
    }
}

#[async_trait]
impl Backend for DockerBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    fn attach_egress(&self, broker: warren_backend::SharedBroker) {
        let _ = self.egress_broker.set(broker);
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exec: true,
            isolation: true,
            survives_restart: true,
            resource_limits: self.limits_enforced,
            gvisor: self.gvisor_problem.is_none(),
            host_mounts: true,
        }
    }

    fn gvisor_unavailable(&self, kind: BackendKind) -> Option<String> {
        if kind != BackendKind::Docker {
            return Some(format!(
                "the {} backend is not enabled on this server",
                kind.as_str()
            ));
        }
        self.gvisor_problem.clone()
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        if let Some(identity) = self.find(&spec.sandbox).await {
            if identity.matches(spec) {
                return Ok(DiscoveredRuntime { spec: spec.clone() });
            }
        }
        if spec.binding.isolation == IsolationTier::Gvisor {
            if let Some(problem) = self.gvisor_unavailable(BackendKind::Docker) {
                return Err(BackendError::Create {
                    sandbox: spec.sandbox.clone(),
                    source: std::io::Error::other(problem),
                });
            }
        }
        let identity = self.launch(spec).await.map_err(|error| match error {
            DockerError::ImageMissing { image } => BackendError::ImageNotFound {
                sandbox: spec.sandbox.clone(),
                image,
            },
            error => BackendError::Create {
                sandbox: spec.sandbox.clone(),
                source: std::io::Error::other(error.to_string()),
            },
        })?;
        self.adopt(identity);
        Ok(DiscoveredRuntime { spec: spec.clone() })
    }

    async fn check_image(
        &self,
        sandbox: &SandboxId,
        _kind: BackendKind,
        image: &str,
    ) -> Result<(), BackendError> {
        match self.has_image(image).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(BackendError::ImageNotFound {
                sandbox: sandbox.clone(),
                image: image.to_owned(),
            }),
            Err(error) => Err(BackendError::Create {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(error.to_string()),
            }),
        }
    }

    /// Lists this instance's containers, adopting those whose labels, mounts and agent
    /// match, and removing the rest: stopped containers, foreign or legacy layouts (I16),
    /// and networks whose container is gone.
    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError> {
        let failed = |error: DockerError| BackendError::Discover {
            source: std::io::Error::other(error.to_string()),
        };
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&self.labelled())
            .build();
        let containers = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| failed(engine("list containers")(e)))?;
        let mut found = Vec::new();
        let mut kept = std::collections::HashSet::new();
        for summary in containers {
            let labels = summary.labels.unwrap_or_default();
            let sandbox = labels
                .get(LABEL_SANDBOX)
                .and_then(|s| SandboxId::parse(s).ok());
            let named = |sandbox: &SandboxId| {
                let expected = format!("/{}", self.container_name(sandbox));
                summary
                    .names
                    .as_ref()
                    .is_some_and(|names| names.contains(&expected))
            };
            let Some(sandbox) = sandbox.filter(named) else {
                // Labelled as this instance's, but not a container warren made: nothing may
                // adopt it, and nothing else will clean it up.
                let id = summary.id.unwrap_or_default();
                tracing::warn!(container = %id, "removing a container with this instance's label that warren did not make");
                let options = RemoveContainerOptionsBuilder::default().force(true).build();
                if let Err(error) = self.docker.remove_container(&id, Some(options)).await {
                    tracing::error!(container = %id, %error, "could not remove the container");
                }
                continue;
            };
            match self.inspect_identity(&sandbox).await {
                Ok(identity) => {
                    kept.insert(self.container_name(&sandbox));
                    found.push(DiscoveredRuntime {
                        spec: identity.spec.clone(),
                    });
                    if !self.lock().contains_key(&sandbox) {
                        self.adopt(identity);
                    }
                }
                Err(reason) => {
                    tracing::warn!(%sandbox, %reason, "removing a container that cannot be reused");
                    if let Err(error) = self.teardown(&sandbox).await {
                        tracing::error!(%sandbox, %error, "could not remove the container");
                    }
                }
            }
        }
        let options = ListNetworksOptionsBuilder::default()
            .filters(&self.labelled())
            .build();
        if let Ok(networks) = self.docker.list_networks(Some(options)).await {
            for network in networks {
                let Some(name) = network.name else { continue };
                if !kept.contains(&name) {
                    let _ = self.docker.remove_network(&name).await;
                }
            }
        }
        Ok(found)
    }

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &warren_backend::ProcessRequest,
    ) -> Result<warren_backend::ProcessStart, BackendError> {
        let identity = self
            .find(sandbox)
            .await
            .ok_or_else(|| BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            })?;
        let spec = warren_agent::client::process_spec(
            request,
            identity.spec.binding.layout.layout(),
            &identity.spec.binding.network,
            &identity.spec.env,
        );
        let started =
            warren_agent::client::start_process(&self.socket_dir(sandbox), spec, sandbox).await;
        started.map_err(|error| {
            if error.is_gone() {
                self.lock().remove(sandbox);
            }
            error.into_backend(sandbox)
        })
    }

    async fn processes(
        &self,
        sandbox: &SandboxId,
        quiet: &[i32],
    ) -> Result<Option<u64>, BackendError> {
        if !self.lock().contains_key(sandbox) {
            return Ok(None);
        }
        let dir = self.socket_dir(sandbox);
        let quiet = quiet.to_vec();
        let answer = tokio::task::spawn_blocking(move || client::activity(&dir, &quiet))
            .await
            .ok()
            .flatten();
        Ok(answer.map(|(_, _, processes)| processes))
    }

    /// Every process of the container but the agent (PID 1), stopped then killed by the
    /// agent through the container's /proc (there is no cgroup of warren's in a container).
    async fn runtime_file(
        &self,
        sandbox: &SandboxId,
        op: &warren_backend::FileOp,
        data: Vec<u8>,
    ) -> Result<warren_backend::FileReply, BackendError> {
        if self.find(sandbox).await.is_none() {
            return Err(BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            });
        }
        let reply = client::runtime_file(self.socket_dir(sandbox), sandbox, op, data).await;
        if let Err(BackendError::RuntimeNotFound { .. }) = reply {
            self.lock().remove(sandbox);
        }
        reply
    }

    async fn kill_processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        if self.find(sandbox).await.is_none() {
            return Ok(None);
        }
        let killed = client::kill_all_processes(self.socket_dir(sandbox), sandbox).await?;
        if killed.is_none() {
            self.lock().remove(sandbox);
        }
        Ok(killed)
    }

    /// The container's `pids_stats` from the engine (one sample, no streaming).
    async fn process_pressure(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<ProcessPressure>, BackendError> {
        use futures::StreamExt;
        if !self.lock().contains_key(sandbox) {
            return Ok(None);
        }
        let options = bollard::query_parameters::StatsOptionsBuilder::new()
            .stream(false)
            .one_shot(true)
            .build();
        let name = self.container_name(sandbox);
        let mut stats = self.docker.stats(&name, Some(options));
        let Some(Ok(sample)) = stats.next().await else {
            return Ok(None);
        };
        // The host's count of a gVisor container is mostly the Sentry's threads: it says
        // nothing of the sandbox's processes, whose bound is the agent's RLIMIT_NPROC.
        if self
            .lock()
            .get(sandbox)
            .is_some_and(|identity| identity.spec.binding.isolation == IsolationTier::Gvisor)
        {
            return Ok(None);
        }
        Ok(sample.pids_stats.and_then(|pids| {
            Some(ProcessPressure {
                current: pids.current?,
                // The engine reports "no limit" as 0.
                max: pids.limit.filter(|&limit| limit > 0),
                // Nor does it report the forks the limit refused.
                refused: None,
            })
        }))
    }

    /// The container's cgroup figures as the engine reads them (one sample, no streaming):
    /// the whole container, agent and commands, as the kernel accounts it (I22).
    async fn usage(&self, sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        use futures::StreamExt;
        if self.find(sandbox).await.is_none() {
            return Ok(None);
        }
        let options = bollard::query_parameters::StatsOptionsBuilder::new()
            .stream(false)
            .one_shot(true)
            .build();
        let name = self.container_name(sandbox);
        let mut stats = self.docker.stats(&name, Some(options));
        let Some(Ok(sample)) = stats.next().await else {
            return Ok(None);
        };
        // The engine reports the host's memory as the limit of a container without one,
        // so its figure is a limit only where warren set one and the engine enforces it.
        let limited = self.limits_enforced && self.config.limits.memory_bytes.is_some();
        Ok(usage_of(&sample, limited, self.config.limits.cpu_millis))
    }

    /// The container's `/home/gem` through the agent's descriptor of it (the root is the
    /// read-only image: no copy-on-write layer to record, so `cow` is an empty directory).
    /// A home that is the persistent workdir (E2B's) is not recorded (I30).
    async fn ephemeral_roots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<EphemeralRoots>, BackendError> {
        let Some(identity) = self.find(sandbox).await else {
            return Ok(None);
        };
        let ephemeral_home = identity.spec.binding.layout.layout().home_is_ephemeral();
        if identity.spec.binding.isolation == IsolationTier::Gvisor {
            return self.archive_gvisor_home(sandbox, ephemeral_home).await;
        }
        let Some((pid, birth)) = identity.agent else {
            return Ok(None);
        };
        // The pid must still be this container's agent: a reused pid would be another
        // process's descriptors.
        if client::process_birth(pid).as_deref() != Some(birth.as_str()) {
            self.lock().remove(sandbox);
            return Ok(None);
        }
        Ok(Some(EphemeralRoots {
            cow: self.no_cow.clone(),
            home: ephemeral_home.then(|| {
                PathBuf::from(format!(
                    "/proc/{pid}/fd/{}/.",
                    warren_agent::environment::HOME_FD
                ))
            }),
        }))
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        self.teardown(sandbox)
            .await
            .map_err(|error| BackendError::Destroy {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(error.to_string()),
            })
    }
}

impl DockerBackend {
    /// Reads the container of `sandbox` back into an identity, or says why it cannot be
    /// reused: it must exist, run, have exactly warren's layout (I16), and its agent must
    /// answer with the generation its labels say.
    /// A gVisor container's home as a runtime snapshot's (I30): the Sentry's descriptors
    /// are not the host's, so the agent sends it as a tar stream into a staging directory
    /// of warren's, `<data>/docker/snapshots/<sbx>` (the root is the read-only image: `cow`
    /// stays empty).
    async fn archive_gvisor_home(
        &self,
        sandbox: &SandboxId,
        ephemeral_home: bool,
    ) -> Result<Option<EphemeralRoots>, BackendError> {
        let staging = self.snapshots_dir.join(sandbox.as_str());
        let failed = |source: std::io::Error| BackendError::Exec {
            sandbox: sandbox.clone(),
            source,
        };
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(staging.join("cow")).map_err(failed)?;
        set_mode(&staging, 0o700).map_err(failed)?;
        if !ephemeral_home {
            // The home is the persistent workdir (E2B's): nothing of it is ephemeral state.
            return Ok(Some(EphemeralRoots {
                cow: staging.join("cow"),
                home: None,
            }));
        }
        let home = staging.join("home");
        std::fs::create_dir(&home).map_err(failed)?;
        // The home is a tmpfs of `home_bytes`: more than that cannot be there.
        let limit = self.config.limits.home_bytes.saturating_mul(2);
        let (dir, into) = (self.socket_dir(sandbox), home.clone());
        let archived =
            tokio::task::spawn_blocking(move || client::archive_home(&dir, &into, limit))
                .await
                .map_err(|e| failed(std::io::Error::other(e)))?;
        match archived {
            Ok(_) => Ok(Some(EphemeralRoots {
                cow: staging.join("cow"),
                home: Some(home),
            })),
            Err(RunError::Gone(_)) => Ok(None),
            Err(RunError::Io(source)) => Err(failed(source)),
        }
    }

    async fn inspect_identity(&self, sandbox: &SandboxId) -> Result<Identity, String> {
        let name = self.container_name(sandbox);
        let inspected = self
            .docker
            .inspect_container(&name, None)
            .await
            .map_err(|e| format!("cannot inspect it: {e}"))?;
        let env = read_env(&self.state_file(sandbox));
        let mut identity = Identity::from_container(
            &inspected,
            &self.instance,
            env,
            &self.binds_dir,
            &self.accounts_dir,
            &self.gvisor_runtime,
        )
        .map_err(|problem| problem.to_string())?;
        identity.agent = inspected
            .state
            .filter(|_| identity.spec.binding.isolation == IsolationTier::Kernel)
            .as_ref()
            .and_then(|state| state.pid)
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|pid| *pid > 0)
            .and_then(|pid| Some((pid, client::process_birth(pid)?)));
        if !identity.running {
            return Err("it is not running".into());
        }
        let dir = self.socket_dir(sandbox);
        let answer = tokio::task::spawn_blocking(move || client::ping(&dir))
            .await
            .ok()
            .flatten();
        match answer {
            Some((s, g)) if s == sandbox.as_str() && g == identity.spec.generation => Ok(identity),
            Some(_) => Err("its agent answers with another identity".into()),
            None => Err("its agent does not answer".into()),
        }
    }
}
