//! `warren serve`: open the data directory, the state store and the backend, then serve.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use rand::Rng;
use warren_api::{ApiState, ProvisionerToken};
use warren_backend::{Backend, BackendSet};
use warren_core::IsolationTier;
use warren_docker::{DockerBackend, DockerBackendConfig};
use warren_isolation::{LocalBackend, LocalBackendConfig};
use warren_provisioner::{Provisioner, ProvisionerConfig};
use warren_store::{PostgresOptions, PostgresStore, SqliteStore, StateStore};

use super::config::{seconds, ConfigFile, StateChoice};
use super::data_dir_lock::DataDirLock;

/// Every flag also reads a `WARREN_*` variable and a key of `warren.toml` (`--config`); the
/// flag wins over the variable, the variable over the file, the file over the default.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A warren.toml with any of the settings below and more (limits, exec timeouts,
    /// sandbox environment); warren.example.toml documents every key.
    #[arg(long, env = "WARREN_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory: workspaces, skill projections, state store, generated token.
    /// Default: /var/lib/warren as root, else ~/.local/share/warren.
    #[arg(long, env = "WARREN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Where the UserWorkspaces, skill projections, artifacts and local snapshots live: a
    /// directory every replica shares (NFSv4, CephFS, EFS). Default: the data directory,
    /// which then keeps only this node's own state.
    #[arg(long, env = "WARREN_WORKSPACE_DIR")]
    workspace_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7878]. Never all interfaces unless you
    /// say so.
    #[arg(long, env = "WARREN_LISTEN")]
    listen: Option<SocketAddr>,
    /// Serve E2B's API (control plane and every sandbox's envd) on this address too, so
    /// the official E2B SDKs work with `E2B_API_URL` and `E2B_SANDBOX_URL` set to it
    /// (`[e2b]` in warren.toml holds the keys and templates).
    #[arg(long, env = "WARREN_E2B_LISTEN")]
    e2b_listen: Option<SocketAddr>,
    /// File holding the provisioner token (at least 32 characters). `WARREN_TOKEN` wins
    /// over it; with neither, a token is generated into <data-dir>/token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Which backend hosts runtimes [default: local].
    #[arg(long, value_enum, env = "WARREN_BACKEND")]
    backend: Option<BackendChoice>,
    /// The isolation tier of sandboxes that name none [default: kernel]. With `gvisor` the
    /// default backend must be able to run gVisor on this host, or warren does not start.
    #[arg(long, value_enum, env = "WARREN_ISOLATION")]
    isolation: Option<IsolationChoice>,
    /// A root filesystem directory for runtimes instead of the host profile (local backend).
    #[arg(long, conflicts_with = "image", env = "WARREN_ROOTFS")]
    rootfs: Option<PathBuf>,
    /// The runtimes' image: for the local backend, one imported with `warren image
    /// import` as their root filesystem; with `--backend docker`, the Docker image of
    /// sandboxes that name none (it must be on the Docker host; warren never pulls).
    #[arg(long, env = "WARREN_IMAGE")]
    image: Option<String>,
    /// Also offer the Docker backend next to the default one, for sandboxes created with
    /// `"backend":"docker"`.
    #[arg(long, env = "WARREN_DOCKER")]
    docker: bool,
    /// The Docker image of sandboxes that name none, when the default backend is another
    /// (implies --docker).
    #[arg(long, env = "WARREN_DOCKER_IMAGE")]
    docker_image: Option<String>,
    /// The Docker engine's Unix socket [default: /var/run/docker.sock].
    #[arg(long, env = "WARREN_DOCKER_SOCKET")]
    docker_socket: Option<String>,
    /// Seconds a runtime may sit unused (no lease, no command, no running process) before
    /// it is reclaimed [default: 900]. Its workspace files stay.
    #[arg(long, env = "WARREN_IDLE_TIMEOUT")]
    idle_timeout: Option<u64>,
    /// Seconds after which a runtime is reclaimed whatever holds it [default: 86400].
    #[arg(long, env = "WARREN_MAX_LIFETIME")]
    max_lifetime: Option<u64>,
    /// Seconds between two passes of the reaper [default: 10].
    #[arg(long, env = "WARREN_REAP_INTERVAL")]
    reap_interval: Option<u64>,
    /// The state store: `postgres://user:password@host:port/database` to keep it in a
    /// PostgreSQL database, or `sqlite:<path>` [default: <data-dir>/state.db].
    #[arg(long, env = "WARREN_STATE")]
    state: Option<String>,
    /// This node's name among the replicas sharing a state store [default: the host name].
    #[arg(long, env = "WARREN_NODE_ID")]
    node_id: Option<String>,
    /// The internal URL other replicas reach this node at [default: the listen address].
    #[arg(long, env = "WARREN_ADVERTISE")]
    advertise: Option<String>,
    /// A file holding the cluster key (32+ characters) the replicas authenticate each other
    /// with; given, this node runs as one replica of several on a PostgreSQL state store.
    #[arg(long, env = "WARREN_CLUSTER_KEY_FILE")]
    cluster_key_file: Option<PathBuf>,
    /// Log lines as `text` [default] or `json` (one object per line, with the request id and
    /// sandbox id of the request each line belongs to).
    #[arg(long, value_enum, env = "WARREN_LOG_FORMAT")]
    log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// `--isolation`: the tiers of `warren_core::IsolationTier`, with their help.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum IsolationChoice {
    /// Namespaces, cgroups, seccomp and Landlock on the host kernel. The default.
    Kernel,
    /// gVisor: every system call of a sandbox is served by runsc's user-space kernel.
    Gvisor,
}

impl From<IsolationChoice> for IsolationTier {
    fn from(choice: IsolationChoice) -> Self {
        match choice {
            IsolationChoice::Kernel => Self::Kernel,
            IsolationChoice::Gvisor => Self::Gvisor,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendChoice {
    /// The native Linux runtime: namespaces, cgroups, seccomp, Landlock. The default.
    Local,
    /// One container per sandbox on a Docker engine, from `--image`.
    Docker,
    /// One pod per sandbox on a Kubernetes cluster (the `[kubernetes]` section of
    /// warren.toml), from `--image`.
    Kubernetes,
    /// Records and isolates nothing, runs no command: for tests only.
    Memory,
}

/// Makes the data directory (and its parents) if it is missing, private (0700) whatever it
/// was created with, since it holds every tenant's files and the token, and answers it
/// resolved. Every command that writes a data directory makes it this way.
pub(crate) fn make_data_dir(data_dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let data_dir = data_dir
        .canonicalize()
        .with_context(|| format!("cannot resolve the data directory {}", data_dir.display()))?;
    std::fs::set_permissions(
        &data_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .with_context(|| {
        format!(
            "cannot make the data directory {} private",
            data_dir.display()
        )
    })?;
    Ok(data_dir)
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let log_format = match (args.log_format, &file.log_format) {
        (Some(format), _) => format,
        (None, Some(name)) => LogFormat::from_str(name, true).map_err(|_| {
            anyhow::anyhow!("log_format = {name:?} in the configuration: use \"text\" or \"json\"")
        })?,
        (None, None) => LogFormat::Text,
    };
    init_logging(log_format);
    let backend_choice = match (args.backend, &file.backend) {
        (Some(choice), _) => choice,
        (None, Some(name)) => BackendChoice::from_str(name, true).map_err(|_| {
            anyhow::anyhow!(
                "backend = {name:?} in the configuration: use \"local\", \"docker\", \"kubernetes\" or \"memory\""
            )
        })?,
        (None, None) => BackendChoice::Local,
    };
    // The backend that isolates nothing is never a production option (I20): only a build
    // for warren's own tests has it, and any other refuses it before touching anything.
    if matches!(backend_choice, BackendChoice::Memory) && !cfg!(feature = "memory-backend") {
        bail!(
            "the memory backend isolates nothing and is only in builds for warren's own tests \
             (the `memory-backend` feature, I20); choose --backend local, docker or kubernetes"
        );
    }
    let default_isolation = args
        .isolation
        .map(IsolationTier::from)
        .or(file.isolation)
        .unwrap_or_default();
    let rootfs = args.rootfs.clone().or(file.rootfs.clone());
    let mut image = args.image.clone().or(file.image.clone());
    let docker_image = match backend_choice {
        // With Docker or Kubernetes the default backend, `image` names the sandbox image.
        BackendChoice::Docker | BackendChoice::Kubernetes => image
            .take()
            .or(args.docker_image.clone())
            .or(file.docker.image.clone()),
        _ => args.docker_image.clone().or(file.docker.image.clone()),
    };
    let docker_enabled = matches!(backend_choice, BackendChoice::Docker)
        || args.docker
        || args.docker_image.is_some()
        || file.docker.enabled.unwrap_or(false);
    if rootfs.is_some() && image.is_some() {
        bail!("both a rootfs and an image are set (flags, environment or configuration); keep one");
    }
    let idle_timeout = seconds(
        "lifecycle.idle_timeout_s (--idle-timeout)",
        args.idle_timeout
            .or(file.lifecycle.idle_timeout_s)
            .unwrap_or(900),
    )?;
    let max_lifetime = seconds(
        "lifecycle.max_lifetime_s (--max-lifetime)",
        args.max_lifetime
            .or(file.lifecycle.max_lifetime_s)
            .unwrap_or(86_400),
    )?;
    let reap_interval = seconds(
        "lifecycle.reap_interval_s (--reap-interval)",
        args.reap_interval
            .or(file.lifecycle.reap_interval_s)
            .unwrap_or(10),
    )?;
    let limits = file.limits()?;
    // What the E2B API reports as a sandbox's size (`cpuCount`, `memoryMB`).
    let limits_cpus = limits
        .cpu_millis
        .map(|millis| millis.div_ceil(1000) as u32)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    let limits_memory_mb = limits
        .memory_bytes
        .map_or(1024, |bytes| bytes / (1024 * 1024));
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7878)));
    let data_dir = match args.data_dir.clone().or(file.data_dir.clone()) {
        Some(dir) => dir,
        None => default_data_dir()?,
    };
    let data_dir = make_data_dir(&data_dir)?;
    // The shared directory, when there is one apart from the data directory: made
    // private like it, and checked once for what the file layer needs of it.
    let workspace_dir = match args.workspace_dir.clone().or(file.workspace_dir.clone()) {
        Some(dir) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .with_context(|| {
                    format!("cannot create the workspace directory {}", dir.display())
                })?;
            let dir = dir.canonicalize().with_context(|| {
                format!("cannot resolve the workspace directory {}", dir.display())
            })?;
            if dir.starts_with(&data_dir) || data_dir.starts_with(&dir) {
                bail!(
                    "the workspace directory {} and the data directory {} must not contain \
                     each other: the first is shared by every replica, the second is this \
                     node's own",
                    dir.display(),
                    data_dir.display()
                );
            }
            Some(dir)
        }
        None => None,
    };
    let checked = workspace_dir.as_deref().unwrap_or(&data_dir);
    warren_provisioner::check_workspace_dir(checked).with_context(|| {
        format!(
            "{} cannot hold the UserWorkspaces (see \"Running several replicas\" in docs/cluster.md \
             for what the filesystem must support)",
            checked.display()
        )
    })?;
    // Before anything else touches the directory: one data directory, one server.
    let mut data_dir_lock = DataDirLock::acquire(&data_dir, &listen.to_string())?;
    // And the port next, so a server that cannot serve fails before it reconciles (and
    // perhaps adopts or destroys) anything. Connections wait in the backlog until the
    // server is ready.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let address = listener.local_addr()?;
    data_dir_lock.record(&address.to_string())?;
    let e2b_listener = match args.e2b_listen.or(file.e2b.listen) {
        Some(e2b_listen) => {
            // The certificate is read with the port, so a bad file fails start-up as early.
            let tls = file.e2b.tls()?;
            let listener = tokio::net::TcpListener::bind(e2b_listen)
                .await
                .with_context(|| format!("cannot listen on {e2b_listen} for the E2B API"))?;
            Some((listener, tls))
        }
        None => None,
    };
    let token_file = args.token_file.clone().or(file.token_file.clone());
    let token = load_token(token_file.as_deref(), &data_dir)?;
    // The gVisor tier's probe (issue 19): once, here, before the backends that run the
    // tier are built. It starts sandboxes (0.2 s on ptrace, up to 5 s more where kvm
    // hangs), so off the async threads, and never again: `/health` reports this result.
    // A server whose backends have no gVisor tier (memory, Kubernetes) skips it.
    let gvisor = if docker_enabled || matches!(backend_choice, BackendChoice::Local) {
        tokio::task::spawn_blocking(|| warren_isolation::gvisor::probe(None))
            .await
            .context("the gVisor probe failed")?
    } else {
        let backend = match backend_choice {
            BackendChoice::Kubernetes => "kubernetes",
            _ => "memory",
        };
        warren_isolation::GvisorHost::not_probed(format!(
            "the {backend} backend has no gVisor tier: gVisor was not probed"
        ))
    };
    let docker: Option<Arc<dyn Backend>> = if docker_enabled {
        if rootfs.is_some() && matches!(backend_choice, BackendChoice::Docker) {
            bail!("--rootfs is for the local backend; the Docker backend runs images (--image)");
        }
        let backend = DockerBackend::new(DockerBackendConfig {
            data_dir: data_dir.clone(),
            agent_program: std::env::current_exe()
                .context("cannot find warren's own executable")?,
            socket: args.docker_socket.clone().or(file.docker.socket.clone()),
            limits: limits.clone(),
            gvisor_runtime: None,
        })
        .await
        .context("cannot start the Docker backend")?;
        tracing::info!(engine = backend.engine_version(), "Docker backend ready");
        // Sandboxes that name no image get this one: say now if the host lacks it, rather
        // than let every such sandbox be refused later with no hint at start-up.
        if let Some(image) = &docker_image {
            match backend.has_image(image).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    image = %image,
                    "the default Docker image is not on the Docker host, and warren never \
                     pulls: Docker sandboxes that name no image are refused (422 \
                     image_not_found) until it is built or pulled there"
                ),
                Err(error) => {
                    tracing::warn!(image = %image, %error, "cannot check the default Docker image")
                }
            }
        }
        Some(Arc::new(backend))
    } else {
        None
    };
    let default: Arc<dyn Backend> = match backend_choice {
        BackendChoice::Docker => docker.clone().expect("enabled with --backend docker"),
        BackendChoice::Kubernetes => {
            let settings = file.kubernetes.clone().context(
                "--backend kubernetes needs the [kubernetes] section of warren.toml (`warren k8s \
                 manifests` writes one)",
            )?;
            let image = docker_image.clone().context(
                "--backend kubernetes needs the image of sandboxes that name none (--image)",
            )?;
            super::kubernetes::backend(
                settings,
                image,
                &token,
                &data_dir,
                workspace_dir.as_deref().unwrap_or(&data_dir),
                limits.clone(),
            )
            .await?
        }
        BackendChoice::Local => {
            let backend = LocalBackend::new(LocalBackendConfig {
                data_dir: data_dir.clone(),
                init_program: std::env::current_exe().context("cannot find warren's own executable")?,
                limits,
                rootfs: match (&rootfs, &image) {
                    (Some(dir), _) => Some(dir.clone()),
                    (None, Some(name)) => Some(super::image::rootfs_of(&data_dir, name)?),
                    (None, None) => None,
                },
            })
            .context("cannot start the local isolation backend (`warren doctor` shows what this host supports)")?
            .with_gvisor(&gvisor);
            Arc::new(backend)
        }
        #[cfg(feature = "memory-backend")]
        BackendChoice::Memory => {
            tracing::warn!(
                "USING THE MEMORY BACKEND: it isolates nothing and refuses to run commands; \
                 it exists for tests and must never serve real agents (I20)"
            );
            Arc::new(warren_backend::MemoryBackend::new())
        }
        // Refused above in any other build.
        #[cfg(not(feature = "memory-backend"))]
        BackendChoice::Memory => unreachable!("refused before anything was made"),
    };
    let backend: Arc<dyn Backend> =
        Arc::new(BackendSet::new(default, docker.into_iter().collect()));
    for warning in backend.warnings() {
        tracing::warn!(backend = backend.kind().as_str(), "{warning}");
    }
    // A default tier the default backend cannot run would refuse every sandbox that names
    // none: the server refuses to start instead, saying why (issue 19).
    match warren_provisioner::check_isolation(backend.as_ref(), backend.kind(), default_isolation) {
        Ok(()) => {}
        Err(warren_provisioner::ProvisionerError::IsolationUnavailable { backend, reason }) => {
            bail!(
                "the default isolation tier is {default_isolation} (--isolation, \
                 WARREN_ISOLATION or isolation in the configuration), but the {backend} \
                 backend cannot run it on this host: {reason}; set gVisor up for it, or \
                 start with --isolation kernel"
            )
        }
        Err(error) => return Err(error.into()),
    }
    let layout = warren_core::DataLayout::new(&data_dir);
    let state = match args.state.as_deref().or(file.state.url.as_deref()) {
        Some(url) => StateChoice::parse(url)?,
        None => StateChoice::Sqlite(None),
    };
    // A cluster key makes this node one replica of several (issue 14); without one, one
    // PostgreSQL database serves one server, held by its lock until the server ends.
    let cluster_key = match args
        .cluster_key_file
        .as_deref()
        .or(file.cluster.key_file.as_deref())
    {
        Some(path) => Some(read_cluster_key(path)?),
        None => None,
    };
    if cluster_key.is_some() && matches!(state, StateChoice::Sqlite(_)) {
        bail!(
            "a cluster key makes this node one replica of several, which needs a state store \
             they share: give --state postgres://… (a SQLite file belongs to one server)"
        );
    }
    let mut server_lock = None;
    let store: Arc<dyn StateStore> = match &state {
        StateChoice::Sqlite(path) => {
            let path = path.clone().unwrap_or_else(|| layout.state_db());
            Arc::new(
                SqliteStore::open(&path)
                    .await
                    .with_context(|| format!("cannot open the state store {}", path.display()))?,
            )
        }
        StateChoice::Postgres(url) => {
            let mut options = PostgresOptions::default();
            if let Some(max) = file.state.max_connections {
                if max == 0 {
                    bail!("state.max_connections must be at least 1");
                }
                options.max_connections = max;
            }
            let store = PostgresStore::connect(url, &options)
                .await
                .with_context(|| {
                    format!(
                        "cannot open the state store {} (is the PostgreSQL server running \
                         and the database created?)",
                        state.describe()
                    )
                })?;
            if cluster_key.is_none() {
                server_lock = Some(
                    PostgresStore::hold_server_lock(url)
                        .await
                        .with_context(|| format!("cannot serve on {}", state.describe()))?,
                );
            }
            Arc::new(store)
        }
    };
    tracing::info!(state = %state.describe(), "state store opened");
    let mut config = ProvisionerConfig::new(&data_dir);
    config.workspace_dir = workspace_dir.clone();
    config.token_finder = Some(token.finder());
    config.idle_timeout = idle_timeout;
    config.max_lifetime = max_lifetime;
    if let Some(default) = file.exec.default_timeout_s {
        config.default_exec_timeout = seconds("exec.default_timeout_s", default)?;
    }
    if let Some(max) = file.exec.max_timeout_s {
        config.max_exec_timeout = seconds("exec.max_timeout_s", max)?;
    }
    if config.default_exec_timeout > config.max_exec_timeout {
        bail!("exec.default_timeout_s is above exec.max_timeout_s in the configuration");
    }
    if let Some(cap) = file.exec.output_cap_bytes {
        if cap == 0 {
            bail!("exec.output_cap_bytes must be at least 1");
        }
        config.output_cap = cap;
    }
    if let Some(name) = file
        .sandbox_env
        .iter()
        .chain(&file.sandbox_secrets)
        .find_map(|(name, value)| token.finder().is_in(value.as_bytes()).then_some(name))
    {
        bail!("the value of {name:?} in the configuration contains the provisioner token, which must never enter a sandbox (I13)");
    }
    if let Some(keep) = file.snapshots.keep_checkpoints {
        if keep == 0 {
            bail!("snapshots.keep_checkpoints must be at least 1");
        }
        config.keep_checkpoints = keep;
    }
    if let Some(grace) = file.snapshots.gc_grace_s {
        config.gc_grace = seconds("snapshots.gc_grace_s", grace)?;
    }
    config.snapshot_store = file.snapshots.store()?;
    config.node = warren_provisioner::NodeIdentity::new(
        args.node_id
            .clone()
            .or(file.cluster.node_id.clone())
            .unwrap_or_else(default_node_id),
        args.advertise
            .clone()
            .or(file.cluster.advertise.clone())
            .unwrap_or_else(|| format!("http://{address}")),
        seconds("cluster.node_ttl_s", file.cluster.node_ttl_s.unwrap_or(15))?,
    )
    .map_err(|error| anyhow::anyhow!("{error} (--node-id, --advertise, [cluster])"))?;
    if let Some(before_reap) = file.snapshots.before_reap {
        config.snapshot_before_reap = before_reap;
    }
    if let Some(resume) = file.snapshots.resume {
        config.resume_from_snapshots = resume;
    }
    if let Some(max) = file.snapshots.max_bytes {
        if max == 0 {
            bail!("snapshots.max_bytes must be at least 1");
        }
        config.snapshot_max_bytes = max;
    }
    if let Some(concurrency) = file.lifecycle.reap_concurrency {
        if concurrency == 0 {
            bail!("lifecycle.reap_concurrency must be at least 1");
        }
        config.reap_concurrency = concurrency;
    }
    if let Some(deadline) = file.lifecycle.reap_deadline_s {
        config.reap_deadline = seconds("lifecycle.reap_deadline_s", deadline)?;
    }
    let shutdown_grace = seconds(
        "lifecycle.shutdown_grace_s",
        file.lifecycle.shutdown_grace_s.unwrap_or(10),
    )?;
    let skill_dir = |key: &str, dir: &Option<PathBuf>| -> anyhow::Result<Option<PathBuf>> {
        dir.as_ref()
            .map(|dir| {
                dir.canonicalize().with_context(|| {
                    format!(
                        "skills.{key}: {} is not a directory warren can read",
                        dir.display()
                    )
                })
            })
            .transpose()
    };
    config.skill_sources = warren_provisioner::SkillSources {
        builtin: skill_dir("builtin_dir", &file.skills.builtin_dir)?,
        shared: skill_dir("shared_dir", &file.skills.shared_dir)?,
        catalog: skill_dir("catalog_dir", &file.skills.catalog_dir)?,
    };
    for (name, dir) in &file.init.host_dirs {
        let canonical = dir.canonicalize().with_context(|| {
            format!(
                "init.host_dirs.{name}: {} is not a directory warren can read",
                dir.display()
            )
        })?;
        config.init_host_dirs.insert(name.clone(), canonical);
    }
    // A template's home is one of those directories, named: checked now, not at the
    // first create.
    for (template, home) in warren_e2b::TemplateTarget::homes(&file.e2b.templates) {
        if !config.init_host_dirs.contains_key(home) {
            bail!(
                "e2b.templates.{template}.home: {home:?} is not a name in [init.host_dirs]; \
                 name the directory there and use that name"
            );
        }
    }
    let deerflow = file.deerflow.config(
        &token,
        &file
            .sandbox_env
            .values()
            .chain(file.sandbox_secrets.values())
            .collect::<Vec<_>>(),
    )?;
    config.default_image = docker_image;
    config.default_isolation = default_isolation;
    config.sandbox_env = file.sandbox_env.clone();
    config.sandbox_secrets = file.sandbox_secrets.clone();
    config.quotas = file
        .quotas
        .settings(warren_provisioner::volumes_unsupported_reason)?;
    let quota_enforcement = config.quotas.enforcement;
    let provisioner = Arc::new(Provisioner::new(config, store, backend));
    // Before reconciling: a runtime adopted below must find its uid's volume mounted.
    let volumes = provisioner
        .prepare_volumes()
        .await
        .context("cannot prepare the workspace volumes")?;
    match quota_enforcement {
        warren_provisioner::QuotaEnforcement::Off => {
            tracing::info!(quotas = "off", "storage quotas: none configured; workspaces share the data filesystem")
        }
        warren_provisioner::QuotaEnforcement::Volumes => tracing::info!(
            quotas = "volumes",
            volumes,
            "storage quotas: a loop-mounted ext4 filesystem per uid, bytes and inodes enforced by the kernel"
        ),
        warren_provisioner::QuotaEnforcement::Unenforced => tracing::warn!(
            quotas = "unenforced",
            reason = warren_provisioner::volumes_unsupported_reason().unwrap_or_default(),
            "STORAGE QUOTAS ARE NOT ENFORCED on this host ([quotas] unenforced = true): one workspace can fill the data filesystem"
        ),
    }
    provisioner
        .join_cluster()
        .await
        .context("cannot register this node in the state store")?;
    // Reconciliation is this node's, at its new epoch: it adopts only what it still owns.
    let recovered = provisioner
        .recover()
        .await
        .context("cannot reconcile the state store with the backend")?;
    tracing::info!(
        runs_failed = recovered.runs_failed,
        runtimes_adopted = recovered.runtimes_adopted,
        runtimes_destroyed = recovered.runtimes_destroyed,
        sandboxes_stopped = recovered.sandboxes_stopped,
        terminations_finished = recovered.terminations_finished,
        pauses_finished = recovered.pauses_finished,
        scratch_removed = recovered.scratch_removed,
        cleanup_failures = recovered.cleanup_failures,
        "reconciled state with the backend"
    );
    provisioner.spawn_membership();
    provisioner.spawn_reaper(reap_interval);
    provisioner.spawn_deadlines();
    tracing::info!(%address, data_dir = %data_dir.display(), "warren is serving");
    // A machine-readable line for supervisors and tests that asked for port 0.
    println!("warren listening on http://{address}");
    // Viewer links outlive a restart: their key is kept (0600) next to the state store.
    // In the shared directory: a link one replica signs opens on every other.
    let key_dir = workspace_dir.as_deref().unwrap_or(&data_dir);
    let viewer_key = warren_api::ViewerKey::load_or_create(key_dir).with_context(|| {
        format!(
            "cannot read or create the Viewer's signing key ({}/viewer.key)",
            key_dir.display()
        )
    })?;
    // On SIGTERM/SIGINT: no new connections, snapshots in flight cancelled (their blocking
    // threads stop at the next chunk), and requests still running after the grace are
    // left behind, so stopping takes bounded time whatever a sandbox holds.
    let stopping = provisioner.clone();
    let membership_store = provisioner.clone();
    let clustered = cluster_key.is_some();
    let reap_deadline = provisioner.config().reap_deadline;
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown_signal().await;
        tracing::info!("stopping: no new requests; snapshots in flight are cancelled");
        stopping.shut_down();
        let _ = signalled.send(());
    };
    let grace_over = async move {
        match on_signal.await {
            Ok(()) => tokio::time::sleep(shutdown_grace).await,
            Err(_) => std::future::pending().await,
        }
    };
    let e2b = match e2b_listener {
        Some((e2b_listener, e2b_tls)) => {
            let reported_memory_mb = limits_memory_mb;
            let config = file
                .e2b
                .config(&token)?
                .with_reported_limits(limits_cpus, reported_memory_mb);
            let e2b = warren_e2b::E2b::new(provisioner.clone(), config, &token.secret_digest());
            let e2b_address = e2b_listener.local_addr()?;
            let router = e2b.router();
            let scheme = if e2b_tls.is_some() { "https" } else { "http" };
            // HTTP/1.1 and HTTP/2 (h2c, or h2 by ALPN over TLS) on the one listener.
            let served = tokio::spawn(warren_e2b::serve(e2b_listener, router, e2b_tls));
            tracing::info!(address = %e2b_address, scheme, "the E2B API is served");
            println!("warren E2B API listening on {scheme}://{e2b_address}");
            Some(served)
        }
        None => None,
    };
    let mut api = ApiState::new(provisioner, token)
        .with_viewer_key(viewer_key)
        .with_gvisor(super::doctor::gvisor_health(&gvisor));
    if let Some(deerflow) = deerflow {
        tracing::info!(
            "DeerFlow's provisioner API is served under /deerflow; its sandbox URLs are bearer \
             capabilities and belong on an internal network"
        );
        api = api.with_deerflow(deerflow);
    }
    if let Some(key) = cluster_key {
        tracing::info!("cluster mode: runtime operations for runtimes other replicas own are forwarded to them, and /internal/v1 serves theirs");
        api = api.with_cluster_key(key);
    }
    tokio::select! {
        served = warren_api::serve(
            listener,
            api,
            shutdown,
        ) => served.context("the HTTP server failed")?,
        () = grace_over => {
            tracing::warn!(grace_s = shutdown_grace.as_secs(), "requests still in flight after the shutdown grace; stopping without them");
        }
    }
    // One replica of several hands its runtimes back before it goes (issue 14): the next
    // request on any replica resumes each from the snapshot taken now. A lone server
    // leaves them running for the next server on this data directory to adopt (I16).
    if clustered {
        let drained = membership_store.drain(reap_deadline).await;
        tracing::info!(
            handed_back = drained.handed_back,
            without_snapshot = drained.without_snapshot,
            failed = drained.failed,
            "drained: every runtime this node owned is handed back"
        );
    }
    if let Some(served) = e2b {
        served.abort();
    }
    // The node's lease ends now rather than lapsing: the others see it left.
    match membership_store.leave_cluster().await {
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "could not record this node leaving the cluster"),
    }
    // Held to the very end: nothing of this server touches the directory (or the
    // database) after this.
    drop(server_lock);
    drop(data_dir_lock);
    tracing::info!("warren stopped");
    Ok(ExitCode::SUCCESS)
}

/// The cluster key, from a file only the server reads (it is a secret of the replicas).
fn read_cluster_key(path: &std::path::Path) -> anyhow::Result<warren_api::ClusterKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the cluster key file {}", path.display()))?;
    warren_api::ClusterKey::new(text.trim())
        .map_err(|error| anyhow::anyhow!("{error} (in {})", path.display()))
}

/// The host name, when it is a usable node id; else `local`.
fn default_node_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| {
            warren_provisioner::NodeIdentity::new(
                name.as_str(),
                "http://x",
                std::time::Duration::from_secs(15),
            )
            .is_ok()
        })
        .unwrap_or_else(|| "local".to_owned())
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        // Each line carries the fields of every span it happened in: a request's
        // `request_id` and, on sandbox routes, its `sandbox`.
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .init(),
    }
}

pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/warren"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/warren")),
        None => bail!("HOME is not set; pass --data-dir"),
    }
}

/// The token, from `WARREN_TOKEN`, `--token-file`, or `<data>/token` (generated with mode
/// 0600 when missing). Its value is never logged (I13).
fn load_token(token_file: Option<&Path>, data_dir: &Path) -> anyhow::Result<ProvisionerToken> {
    if let Ok(value) = std::env::var("WARREN_TOKEN") {
        return ProvisionerToken::new(value.trim()).context("WARREN_TOKEN is not usable");
    }
    if let Some(path) = token_file {
        let value = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        return ProvisionerToken::new(value.trim())
            .with_context(|| format!("the token in {} is not usable", path.display()));
    }
    let path = warren_core::DataLayout::new(data_dir).token_file();
    if !path.exists() {
        let value: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(48)
            .map(char::from)
            .collect();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot create the token file {}", path.display()))?;
        std::io::Write::write_all(&mut file, value.as_bytes())?;
        tracing::info!(path = %path.display(), "generated a provisioner token; clients read it from this file");
    } else {
        tracing::info!(path = %path.display(), "using the provisioner token in this file");
    }
    let value = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    ProvisionerToken::new(value.trim())
        .with_context(|| format!("the token in {} is not usable", path.display()))
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = terminate => {},
    }
}
