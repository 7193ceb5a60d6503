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
            if let Err(error) = warren_agent::egress::spawn_egress(
                self.socket_dir(&identity.spec.sandbox),
                identity.spec.binding.network.clone(),
                tokio::runtime::Handle::current(),
            ) {
                tracing::error!(sandbox = %identity.spec.sandbox, %error, "cannot serve the container's egress");
            }
        }
        self.lock().insert(identity.spec.sandbox.clone(), identity);
    }

    async fn launch(&self, spec: &RuntimeSpec) -> Result<Identity, DockerError> {
        let image = spec.binding.image.clone().unwrap_or_default();
        if let Err(error) = self.docker.inspect_image(&image).await {
            return Err(if is_not_found(&error) {
                DockerError::ImageMissing { image }
            } else {
                engine("inspect the image")(error)
            });
        }
        self.teardown(&spec.sandbox).await?;
        let socket_dir = self.socket_dir(&spec.sandbox);
        let agent_uid = match spec.binding.isolation {
            IsolationTier::Kernel => warren_core::SANDBOX_UID,
            IsolationTier::Gvisor => 0,
        };
        make_socket_dir(&socket_dir, agent_uid).map_err(|source| DockerError::HostDir {
            what: "the sandbox's socket directory",
            source,
        })?;
        write_env(&self.state_file(&spec.sandbox), &spec.env).map_err(|source| {
            DockerError::HostDir {
                what: "the sandbox's state file",
                source,
            }
        })?;
        // A gVisor container has the Sentry's loopback only (runsc `--network=none`): its
        // agent relays the proxy port's connections to the provisioner (issue 19).
        let network_mode = if spec.binding.network.has_egress()
            && spec.binding.isolation == IsolationTier::Kernel
        {
            let name = self.container_name(&spec.sandbox);
            self.docker
                .create_network(NetworkCreateRequest {
                    name: name.clone(),
                    driver: Some("bridge".into()),
                    // No route off the bridge: egress goes through the agent's proxy, where
                    // the provisioner applies the policy. The host gets no address on it,
                    // so the container cannot reach the host's services either.
                    internal: Some(true),
                    options: Some(HashMap::from([(
                        "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                        "true".to_owned(),
                    )])),
                    labels: Some(identity::network_labels(&self.instance, &spec.sandbox)),
                    ..Default::default()
                })
                .await
                .map_err(engine("create the sandbox's network"))?;
            name
        } else {
            "none".to_owned()
        };
        let agent = AgentConfig {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            nofile: self.config.limits.nofile,
            egress: spec.binding.network.has_egress(),
            socket_dir: Some(PathBuf::from(SOCKET_MOUNT)),
            listen: None,
            // Only an ephemeral home is kept open for snapshots (I30).
            home: spec
                .binding
                .layout
                .layout()
                .home_is_ephemeral()
                .then(|| PathBuf::from(spec.binding.layout.layout().home)),
            gvisor: spec.binding.isolation == IsolationTier::Gvisor,
            max_processes: (spec.binding.isolation == IsolationTier::Gvisor)
                .then_some(self.config.limits.pids_max)
                .flatten()
                .map(sentry_limits::sandbox_processes),
            max_address_space: (spec.binding.isolation == IsolationTier::Gvisor)
                .then_some(self.config.limits.memory_bytes)
                .flatten()
                .map(sentry_limits::address_space),
        };
        let agent = serde_json::to_string(&agent).expect("the agent config serialises");
        let mounts = spec.mounts();
        let name = self.container_name(&spec.sandbox);
        // Dropped (staging mounts detached, directories removed) once the container runs,
        // and on every way out before that.
        let staged = match StagedBinds::stage(&self.binds_dir, &spec.sandbox, &mounts) {
            Ok(staged) => staged,
            Err(error) => {
                let _ = self.teardown(&spec.sandbox).await;
                return Err(DockerError::from_staging(error));
            }
        };
        let body = self.container_body(spec, &mounts, &staged, &image, &network_mode, agent);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(engine("create the container"))?;
        let started = self.docker.start_container(&name, None).await;
        // The container holds its own mounts now (or never will): the staging goes.
        drop(staged);
        if let Err(error) = started {
            let _ = self.teardown(&spec.sandbox).await;
            return Err(engine("start the container")(error));
        }
        if let Err(error) = self.wait_for_agent(spec, &socket_dir).await {
            let _ = self.teardown(&spec.sandbox).await;
            return Err(error);
        }
        // A gVisor container's PID 1 on the host is runsc's sandbox process, not the agent:
        // there is no agent process to check mounts through or to reach the home by (its
        // home moves through the agent instead: `archive_gvisor_home`, and the seed below).
        let agent = match spec.binding.isolation {
            IsolationTier::Kernel => self.agent_process(&name).await,
            IsolationTier::Gvisor => None,
        };
        if let Some((pid, _)) = agent {
            let check = tokio::task::spawn_blocking(move || verify_mounts(pid, &mounts))
                .await
                .map_err(|e| DockerError::AgentDidNotStart(e.to_string()))
                .and_then(|result| result);
            if let Err(error) = check {
                let _ = self.teardown(&spec.sandbox).await;
                return Err(error);
            }
        }
        let ephemeral_home = spec.binding.layout.layout().home_is_ephemeral();
        if let (Some(seed), IsolationTier::Gvisor, true) =
            (&spec.seed, spec.binding.isolation, ephemeral_home)
        {
            // The Sentry's home is reached through the agent, as a tar stream (I30).
            let (home, dir) = (seed.join("home"), socket_dir.clone());
            let limit = self.config.limits.home_bytes;
            let seeded = tokio::task::spawn_blocking(move || {
                client::restore_home(&dir, &home, limit).map_err(|e| match e {
                    RunError::Gone(e) | RunError::Io(e) => e,
                })
            })
            .await;
            if let Ok(Err(error)) | Err(error) = seeded.map_err(std::io::Error::other) {
                tracing::warn!(sandbox = %spec.sandbox, %error, "could not restore /home/gem from the snapshot; it starts empty");
            }
        }
        if let (Some(seed), Some((pid, _)), true) = (&spec.seed, &agent, ephemeral_home) {
            // Resuming a reaped runtime (I30): its /home/gem comes back before the first
            // command. A seed that cannot be copied leaves a fresh /home/gem, never a
            // failed start.
            let (home, pid) = (seed.join("home"), *pid);
            let layout = spec.binding.layout.layout();
            let seeded = tokio::task::spawn_blocking(move || seed_home(&home, pid, layout)).await;
            if let Ok(Err(error)) | Err(error) = seeded.map_err(std::io::Error::other) {
                tracing::warn!(sandbox = %spec.sandbox, %error, "could not restore /home/gem from the snapshot; it starts empty");
            }
        }
        Ok(Identity {
            spec: RuntimeSpec {
                seed: None,
                ..spec.clone()
            },
            running: true,
            agent,
        })
    }

    fn container_body(
        &self,
        spec: &RuntimeSpec,
        mounts: &[warren_backend::HostMount],
        staged: &StagedBinds,
        image: &str,
        network_mode: &str,
        agent: String,
    ) -> ContainerCreateBody {
        let layout = spec.binding.layout.layout();
        let limits = &self.config.limits;
        let bind = |source: &Path, target: &str, read_only: bool| Mount {
            target: Some(target.to_owned()),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(read_only),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                non_recursive: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mib = |bytes: u64| format!("{}m", bytes.div_ceil(1024 * 1024).max(1));
        let mut tmpfs = HashMap::from([
            (
                "/tmp".to_owned(),
                format!("size={},mode=1777,exec,nosuid,nodev", mib(limits.tmp_bytes)),
            ),
            (
                "/var/tmp".to_owned(),
                format!("size={},mode=1777,exec,nosuid,nodev", mib(limits.tmp_bytes)),
            ),
        ]);
        // An ephemeral home is a tmpfs; a home that is the workdir (E2B's) is its bind.
        if layout.home_is_ephemeral() {
            tmpfs.insert(
                layout.home.to_owned(),
                format!(
                    "size={},uid=1000,gid=1000,mode=0755,exec,nosuid,nodev",
                    mib(limits.home_bytes)
                ),
            );
        }
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let nofile = to_i64(limits.nofile);
        // The layout's persistent mounts, in its order: a tree of warren's by its path, a
        // directory beneath one by its staging mount (I2).
        let mut binds: Vec<Mount> = mounts
            .iter()
            .enumerate()
            .map(|(index, mount)| bind(staged.source(index), &mount.target, !mount.writable))
            .collect();
        binds.push(bind(self.bundle.dir(), AGENT_MOUNT, true));
        for (source, target) in accounts::binds(&self.accounts_dir, spec.binding.layout) {
            binds.push(bind(&source, target, true));
        }
        binds.push(bind(&self.socket_dir(&spec.sandbox), SOCKET_MOUNT, false));
        let host_config = HostConfig {
            mounts: Some(binds),
            tmpfs: Some(tmpfs),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            // Inside the Sentry only: the gVisor agent's root (see `gvisor`).
            cap_add: (spec.binding.isolation == IsolationTier::Gvisor).then(|| {
                gvisor::AGENT_CAPABILITIES
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect()
            }),
            runtime: (spec.binding.isolation == IsolationTier::Gvisor)
                .then(|| self.gvisor_runtime.clone()),
            // Docker's default seccomp profile stays on (no `seccomp=` option); the agent
            // adds warren's own to each command.
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            privileged: Some(false),
            network_mode: Some(network_mode.to_owned()),
            publish_all_ports: Some(false),
            ipc_mode: Some("private".into()),
            memory: limits.memory_bytes.map(to_i64),
            // Memory plus swap equal to memory: no swap.
            memory_swap: limits.memory_bytes.map(to_i64),
            pids_limit: limits
                .pids_max
                .map(|max| match spec.binding.isolation {
                    IsolationTier::Kernel => max,
                    IsolationTier::Gvisor => sentry_limits::host_tasks(max),
                })
                .map(to_i64),
            nano_cpus: limits.cpu_millis.map(|m| to_i64(m) * 1_000_000),
            shm_size: Some(to_i64(limits.shm_bytes)),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(nofile),
                hard: Some(nofile),
            }]),
            init: Some(false),
            auto_remove: Some(false),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(image.to_owned()),
            // The gVisor agent starts as the Sentry's root and makes each command 1000:1000.
            user: Some(
                match spec.binding.isolation {
                    IsolationTier::Kernel => "1000:1000",
                    IsolationTier::Gvisor => "0:0",
                }
                .into(),
            ),
            hostname: Some("warren".into()),
            working_dir: Some(layout.home.into()),
            env: Some(Vec::new()),
            // The loader runs warren's executable with its own libraries, whatever libc
            // the image has (or none); `--argv0` is what `ps` shows inside.
            entrypoint: Some(vec![
                format!("{AGENT_MOUNT}/{}", bundle::LOADER),
                "--argv0".into(),
                "warren-agent".into(),
                "--library-path".into(),
                format!("{AGENT_MOUNT}/lib"),
                format!("{AGENT_MOUNT}/{}", bundle::PROGRAM),
                warren_agent::CONTAINER_AGENT_ARG.into(),
                agent,
            ]),
            cmd: Some(Vec::new()),
            network_disabled: Some(network_mode == "none"),
            labels: Some(identity::container_labels(&self.instance, spec)),
            host_config: Some(host_config),
            ..Default::default()
        }
    }

    /// The host pid and birth of a running container's agent (its PID 1).
    async fn agent_process(&self, name: &str) -> Option<(i32, String)> {
        let inspected = self.docker.inspect_container(name, None).await.ok()?;
        let pid = i32::try_from(inspected.state?.pid?)
            .ok()
            .filter(|p| *p > 0)?;
        Some((pid, client::process_birth(pid)?))
    }

    async fn wait_for_agent(
        &self,
        spec: &RuntimeSpec,
        socket_dir: &Path,
    ) -> Result<(), DockerError> {
        let deadline = Instant::now() + AGENT_START_TIMEOUT;
        let name = self.container_name(&spec.sandbox);
        loop {
            let dir = socket_dir.to_owned();
            let answer = tokio::task::spawn_blocking(move || client::ping(&dir))
                .await
                .ok()
                .flatten();
            if answer.is_some_and(|(s, g)| s == spec.sandbox.as_str() && g == spec.generation) {
                return Ok(());
            }
            let state = self
                .docker
                .inspect_container(&name, None)
                .await
                .map_err(engine("inspect the container"))?
                .state;
            if !state.as_ref().and_then(|s| s.running).unwrap_or(false) {
                let code = state.and_then(|s| s.exit_code).unwrap_or_default();
                return Err(DockerError::AgentDidNotStart(format!(
                    "the container exited with status {code} before its agent answered (docker logs {name})"
                )));
            }
            if Instant::now() > deadline {
                return Err(DockerError::AgentDidNotStart(format!(
                    "no answer within {}s",
                    AGENT_START_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
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

    async fn processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        if !self.lock().contains_key(sandbox) {
            return Ok(None);
        }
        let dir = self.socket_dir(sandbox);
        let answer = tokio::task::spawn_blocking(move || client::ping_full(&dir))
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

/// A runtime's usage from one engine stats sample; `None` when the sample has no CPU or
/// memory figures (a container that is not running). `memory_limited`: whether the
/// sample's memory limit is one warren set (the engine reports the host's memory
/// otherwise). `cpu_limit_millis` is the `NanoCpus` limit warren created the container
/// with (I23): the engine's stats carry no quota.
fn usage_of(
    sample: &bollard::models::ContainerStatsResponse,
    memory_limited: bool,
    cpu_limit_millis: Option<u64>,
) -> Option<RuntimeUsage> {
    let cpu = sample.cpu_stats.as_ref()?.cpu_usage.as_ref()?.total_usage?;
    let memory = sample.memory_stats.as_ref()?;
    let current = memory.usage?;
    // cgroup v2 names the page cache `file`; v1 `total_cache` (the whole subtree) or
    // `cache`.
    let file = memory.stats.as_ref().and_then(|stats| {
        ["file", "total_cache", "cache"]
            .iter()
            .find_map(|key| stats.get(*key).copied())
    });
    Some(RuntimeUsage {
        // The engine reports nanoseconds on both cgroup versions.
        cpu_usage_usec: cpu / 1000,
        memory_current: current,
        memory_max: memory.limit.filter(|&limit| memory_limited && limit > 0),
        memory_file: file,
        cpu_limit_millis,
    })
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

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The sandbox's socket directory, owned by the sandbox user (its agent binds there), 0700.
///
/// The container can write into it, and it is on the host: as root it is a tmpfs of its
/// own, 64 KiB and 16 inodes, so a sandbox cannot fill the host's disk through it (its
/// other writable places are size-capped tmpfs inside the container). Without root the
/// engine's socket is root-equivalent anyway, but the directory is then not capped.
/// `owner` is the agent's uid: 1000 on the kernel tier, the Sentry's root on gVisor's,
/// where nothing of the sandbox user's may reach or replace the socket.
fn make_socket_dir(dir: &Path, owner: u32) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    if rustix::process::geteuid().is_root() {
        use rustix::mount::{mount, MountFlags};
        mount(
            "warren-agent-socket",
            dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            std::ffi::CString::new(format!(
                "size=64k,nr_inodes=16,mode=0700,uid={owner},gid={owner}"
            ))
            .expect("no NUL in the options")
            .as_c_str(),
        )?;
        return Ok(());
    }
    set_mode(dir, 0o700)
}

/// Removes a socket directory made by [`make_socket_dir`] (its tmpfs first), if any.
fn remove_socket_dir(dir: &Path) -> std::io::Result<()> {
    use rustix::io::Errno;
    match rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH) {
        // Not a mount point (made unprivileged, or already unmounted), or gone.
        Ok(()) | Err(Errno::INVAL) | Err(Errno::NOENT) | Err(Errno::PERM) => {}
        Err(error) => return Err(error.into()),
    }
    std::fs::remove_dir_all(dir)
}

/// Copies a snapshot's home (`seed`) into the running container's, reached through its
/// agent's descriptor. Both sides are walked and written by descriptor without following
/// anything (`warren-fs`); entries are the sandbox user's; the layout's persistent mount
/// points inside the home are never touched.
fn seed_home(seed: &Path, agent: i32, layout: &warren_core::Layout) -> std::io::Result<()> {
    use warren_fs::{Kind, WorkspaceRoot};
    let io = |e: warren_fs::FsError| std::io::Error::other(e.to_string());
    if !seed.is_dir() {
        return Ok(());
    }
    let source = WorkspaceRoot::open(seed).map_err(io)?.read_only();
    let home = PathBuf::from(format!(
        "/proc/{agent}/fd/{}/.",
        warren_agent::environment::HOME_FD
    ));
    let target = WorkspaceRoot::open(&home).map_err(io)?;
    let top = source.list("", 1, 100_000).map_err(io)?;
    let mount_points: Vec<&str> = layout
        .mounts_in_home()
        .into_iter()
        .filter_map(|name| name.split('/').next())
        .collect();
    for entry in top.entries {
        // By the exact bytes: a snapshot keeps names that are not UTF-8, so a resume must.
        let name = entry.os_path.as_os_str();
        if mount_points.iter().any(|m| name == *m) {
            continue;
        }
        match entry.kind {
            Kind::Dir => {
                target.copy_tree_from(&source, name, name).map_err(io)?;
            }
            Kind::File => {
                let mut input = source.open_file(name).map_err(io)?;
                let mut output = target.create_file(name, 0o600).map_err(io)?;
                std::io::copy(&mut input, &mut output)?;
                target
                    .set_attributes(name, Some(entry.mode & 0o777), entry.modified_unix_ms)
                    .map_err(io)?;
            }
            Kind::Symlink => target
                .create_symlink(name, entry.os_symlink_target.as_deref().unwrap_or_default())
                .map_err(io)?,
            Kind::Other => {}
        }
    }
    Ok(())
}

/// Checks that each staged mount of a started container is the directory warren opened
/// for it: the same device and inode at the mount's target, resolved in the container's
/// root without following its links. This is what proves a staged bind took effect; it
/// fails when dockerd runs in a mount namespace that does not see warren's staging
/// mounts (it would then have bound the empty staging directory). Direct binds of
/// warren's own trees are not checked: a skill sync may swap the projection's directory
/// in the meantime (`RENAME_EXCHANGE`), which is no fault.
fn verify_mounts(agent: i32, mounts: &[warren_backend::HostMount]) -> Result<(), DockerError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    if !mounts.iter().any(is_staged) {
        return Ok(());
    }
    let root = rustix::fs::open(
        format!("/proc/{agent}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| DockerError::AgentDidNotStart(format!("cannot reach its root: {e}")))?;
    for mount in mounts.iter().filter(|m| is_staged(m)) {
        let refused = |reason: String| DockerError::Mount {
            target: mount.target.clone(),
            reason,
        };
        let source = mount.open().map_err(|e| refused(e.to_string()))?;
        let expected = rustix::fs::fstat(&source).map_err(|e| refused(e.to_string()))?;
        let inside = match rustix::fs::openat2(
            &root,
            mount.target.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            // A kernel before openat2 (Linux 5.6): the staging alone has to do.
            Err(rustix::io::Errno::NOSYS) => return Ok(()),
            Err(e) => return Err(refused(format!("cannot find it in the container: {e}"))),
        };
        let actual = rustix::fs::fstat(&inside).map_err(|e| refused(e.to_string()))?;
        if (actual.st_dev, actual.st_ino) != (expected.st_dev, expected.st_ino) {
            return Err(refused(
                "the container shows another directory there than warren bound (does dockerd run in another mount namespace?)".into(),
            ));
        }
    }
    Ok(())
}

fn write_env(path: &Path, env: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let json = serde_json::to_vec(env).map_err(std::io::Error::other)?;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(&json)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod usage_tests {
    use std::collections::HashMap;

    use bollard::models::{
        ContainerCpuStats, ContainerCpuUsage, ContainerMemoryStats, ContainerStatsResponse,
    };

    use super::usage_of;

    fn sample(stats: &[(&str, u64)], limit: u64) -> ContainerStatsResponse {
        ContainerStatsResponse {
            cpu_stats: Some(ContainerCpuStats {
                cpu_usage: Some(ContainerCpuUsage {
                    total_usage: Some(2_500_000_000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(300 << 20),
                limit: Some(limit),
                stats: Some(
                    stats
                        .iter()
                        .map(|(key, value)| ((*key).to_owned(), *value))
                        .collect::<HashMap<_, _>>(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn engine_stats_become_the_runtimes_usage_on_either_cgroup_version() {
        let v2 = usage_of(&sample(&[("file", 100 << 20)], 2 << 30), true, Some(1000)).unwrap();
        assert_eq!(v2.cpu_usage_usec, 2_500_000);
        assert_eq!(v2.memory_current, 300 << 20);
        assert_eq!(v2.memory_file, Some(100 << 20));
        assert_eq!(v2.memory_used(), 200 << 20);
        assert_eq!(v2.memory_max, Some(2 << 30));
        assert_eq!(v2.cpu_limit_millis, Some(1000));
        let v1 = usage_of(
            &sample(&[("cache", 1), ("total_cache", 50 << 20)], 2 << 30),
            true,
            None,
        )
        .unwrap();
        assert_eq!(v1.memory_file, Some(50 << 20));
        assert_eq!(v1.cpu_limit_millis, None);
    }

    #[test]
    fn the_hosts_memory_is_no_limit_and_a_stopped_container_has_no_usage() {
        // Without a limit of warren's the engine reports the host's memory.
        let unlimited = usage_of(&sample(&[], 64 << 30), false, None).unwrap();
        assert_eq!(unlimited.memory_max, None);
        assert_eq!(unlimited.memory_file, None);
        // A container that is not running answers a sample without figures.
        assert_eq!(
            usage_of(&ContainerStatsResponse::default(), true, None),
            None
        );
    }
}
