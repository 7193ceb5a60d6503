//! `warren serve`: resolve the settings, open the data directory, the state store and the
//! backends, start the provisioner, then serve until a signal.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rand::Rng;
use warren_api::{ApiState, ProvisionerToken};
use warren_backend::Backend;
use warren_provisioner::{Provisioner, ProvisionerConfig};
use warren_store::{PostgresOptions, PostgresStore, SqliteStore, StateStore};

use super::config::{ConfigFile, StateChoice};
use super::data_dir_lock::DataDirLock;
pub use crate::settings::ServeArgs;
use crate::settings::{LogFormat, Resolved, ServeSettings, Sources};

/// The settings from the flags, the environment and the file `--config` names.
fn settings(args: &ServeArgs) -> anyhow::Result<(ServeSettings, ConfigFile, Vec<String>)> {
    let env = |name: &str| std::env::var(name).ok();
    let empty = toml::Table::new();
    let sources = |file| Sources {
        flags: args.flags.clone(),
        env: &env,
        file,
    };
    let file = match Resolved::resolve(&sources(&empty))?.path("config") {
        Some(path) => ConfigFile::load(&path)?,
        None => ConfigFile::default(),
    };
    let resolved = Resolved::resolve(&sources(file.table()))?;
    let settings = ServeSettings::new(&resolved)?;
    Ok((settings, file, resolved.notices))
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
    let (settings, file, notices) = settings(&args)?;
    init_logging(settings.log_format, &settings.log_filter);
    for notice in notices {
        tracing::warn!("{notice}");
    }
    let data_dir = make_data_dir(&match settings.data_dir.clone() {
        Some(dir) => dir,
        None => default_data_dir()?,
    })?;
    let workspace_dir = workspace_dir(settings.workspace_dir.as_deref(), &data_dir)?;
    // Before anything else touches the directory: one data directory, one server.
    let mut data_dir_lock = DataDirLock::acquire(&data_dir, &settings.listen.to_string())?;
    // And the port next, so a server that cannot serve fails before it reconciles (and
    // perhaps adopts or destroys) anything. Connections wait in the backlog until the
    // server is ready.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let address = listener.local_addr()?;
    data_dir_lock.record(&address.to_string())?;
    let e2b_listener = match settings.e2b_listen {
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
    let token = load_token(
        settings.token.as_deref(),
        settings.token_file.as_deref(),
        &data_dir,
    )?;
    let (backend, gvisor) = super::serve_backends::build(
        &settings,
        &file,
        &token,
        &data_dir,
        workspace_dir.as_deref(),
    )
    .await?;
    // A cluster key makes this node one replica of several (issue 14); without one, one
    // PostgreSQL database serves one server, held by its lock until the server ends.
    let cluster_key = match &settings.cluster_key_file {
        Some(path) => Some(read_cluster_key(path)?),
        None => None,
    };
    let (store, server_lock) = open_store(&settings, cluster_key.is_some(), &data_dir).await?;
    let mut config = provisioner_config(&settings, &file, &token, &data_dir, address)?;
    config.workspace_dir = workspace_dir.clone();
    let deerflow = file.deerflow.config(
        settings.deerflow_api_key.as_ref(),
        &token,
        &file
            .sandbox_env
            .values()
            .chain(file.sandbox_secrets.values())
            .collect::<Vec<_>>(),
    )?;
    let provisioner = start_provisioner(config, store, backend, settings.reap_interval).await?;
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
    let e2b = match e2b_listener {
        Some((e2b_listener, e2b_tls)) => {
            let config = file
                .e2b
                .config(&token, settings.e2b_timeouts)?
                .with_reported_limits(reported_cpus(&settings), reported_memory_mb(&settings));
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
    let mut api = ApiState::new(provisioner.clone(), token)
        .with_viewer_key(viewer_key)
        .with_gvisor(super::doctor::gvisor_health(&gvisor));
    if let Some(deerflow) = deerflow {
        tracing::info!(
            "DeerFlow's provisioner API is served under /deerflow; its sandbox URLs are bearer \
             capabilities and belong on an internal network"
        );
        api = api.with_deerflow(deerflow);
    }
    let clustered = cluster_key.is_some();
    if let Some(key) = cluster_key {
        tracing::info!("cluster mode: runtime operations for runtimes other replicas own are forwarded to them, and /internal/v1 serves theirs");
        api = api.with_cluster_key(key);
    }
    serve_until_stopped(listener, api, &provisioner, settings.shutdown_grace).await?;
    stop(&provisioner, clustered, e2b).await;
    // Held to the very end: nothing of this server touches the directory (or the
    // database) after this.
    drop(server_lock);
    drop(data_dir_lock);
    tracing::info!("warren stopped");
    Ok(ExitCode::SUCCESS)
}

/// What the E2B API reports as a sandbox's CPUs (`cpuCount`).
fn reported_cpus(settings: &ServeSettings) -> u32 {
    settings
        .limits
        .cpu_millis
        .map(|millis| millis.div_ceil(1000) as u32)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
}

/// What the E2B API reports as a sandbox's memory (`memoryMB`).
fn reported_memory_mb(settings: &ServeSettings) -> u64 {
    settings
        .limits
        .memory_bytes
        .map_or(1024, |bytes| bytes / (1024 * 1024))
}

/// The shared directory, when there is one apart from the data directory: made private
/// like it, and checked once (the one that holds the UserWorkspaces, either way) for what
/// the file layer needs of it.
fn workspace_dir(dir: Option<&Path>, data_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let workspace_dir = match dir {
        Some(dir) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| {
                    format!("cannot create the workspace directory {}", dir.display())
                })?;
            let dir = dir.canonicalize().with_context(|| {
                format!("cannot resolve the workspace directory {}", dir.display())
            })?;
            if dir.starts_with(data_dir) || data_dir.starts_with(&dir) {
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
    let checked = workspace_dir.as_deref().unwrap_or(data_dir);
    warren_provisioner::check_workspace_dir(checked).with_context(|| {
        format!(
            "{} cannot hold the UserWorkspaces (see \"Running several replicas\" in docs/cluster.md \
             for what the filesystem must support)",
            checked.display()
        )
    })?;
    Ok(workspace_dir)
}

/// The state store, and the lock a lone server holds on a PostgreSQL database.
async fn open_store(
    settings: &ServeSettings,
    clustered: bool,
    data_dir: &Path,
) -> anyhow::Result<(Arc<dyn StateStore>, Option<warren_store::ServerLock>)> {
    let state = &settings.state;
    let mut server_lock = None;
    let store: Arc<dyn StateStore> = match state {
        StateChoice::Sqlite(path) => {
            let path = path
                .clone()
                .unwrap_or_else(|| warren_core::DataLayout::new(data_dir).state_db());
            Arc::new(
                SqliteStore::open(&path)
                    .await
                    .with_context(|| format!("cannot open the state store {}", path.display()))?,
            )
        }
        StateChoice::Postgres(url) => {
            let options = PostgresOptions {
                max_connections: settings.max_connections,
            };
            let store = PostgresStore::connect(url, &options)
                .await
                .with_context(|| {
                    format!(
                        "cannot open the state store {} (is the PostgreSQL server running \
                         and the database created?)",
                        state.describe()
                    )
                })?;
            if !clustered {
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
    Ok((store, server_lock))
}

/// The provisioner's configuration: the settings, and the file's sections (environment,
/// skills, workdir sources, quotas) checked against the token and each other.
fn provisioner_config(
    settings: &ServeSettings,
    file: &ConfigFile,
    token: &ProvisionerToken,
    data_dir: &Path,
    address: SocketAddr,
) -> anyhow::Result<ProvisionerConfig> {
    let mut config = ProvisionerConfig::new(data_dir);
    settings.apply(&mut config);
    config.token_finder = Some(token.finder());
    if let Some(name) = file
        .sandbox_env
        .iter()
        .chain(&file.sandbox_secrets)
        .find_map(|(name, value)| token.finder().is_in(value.as_bytes()).then_some(name))
    {
        bail!("the value of {name:?} in the configuration contains the provisioner token, which must never enter a sandbox (I13)");
    }
    config.node = warren_provisioner::NodeIdentity::new(
        settings.node_id.clone().unwrap_or_else(default_node_id),
        settings
            .advertise
            .clone()
            .unwrap_or_else(|| format!("http://{address}")),
        settings.node_ttl,
    )
    .map_err(|error| anyhow::anyhow!("{error} (--node-id, --advertise, [cluster])"))?;
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
    config.default_network = file.network.default_policy()?;
    if let Some(path) = &file.network.upstream_ca {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("network.upstream_ca: cannot read {}", path.display()))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            bail!(
                "network.upstream_ca: {} holds no PEM certificate",
                path.display()
            );
        }
        config.egress_upstream_roots = Some(pem);
    }
    for (name, source) in &file.network.secret_sources {
        warren_core::check_source_name(name)
            .map_err(|e| anyhow::anyhow!("network.secret_sources.{name}: {e}"))?;
        let Some(program) = source.command.first() else {
            bail!("network.secret_sources.{name}: command names no program");
        };
        if !std::path::Path::new(program).is_absolute() {
            bail!("network.secret_sources.{name}: the program {program:?} is not an absolute path");
        }
        if source.timeout_s == 0 || source.timeout_s > 300 {
            bail!("network.secret_sources.{name}: timeout_s is 1 to 300");
        }
    }
    config.secret_sources = file.network.secret_sources.clone();
    config.sandbox_env = file.sandbox_env.clone();
    config.sandbox_secrets = file.sandbox_secrets.clone();
    config.quotas = file
        .quotas
        .settings(warren_provisioner::volumes_unsupported_reason)?;
    Ok(config)
}

/// The provisioner, its volumes prepared, this node registered, the state reconciled with
/// the backend and its background tasks running.
async fn start_provisioner(
    config: ProvisionerConfig,
    store: Arc<dyn StateStore>,
    backend: Arc<dyn Backend>,
    reap_interval: Duration,
) -> anyhow::Result<Arc<Provisioner>> {
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
    Ok(provisioner)
}

/// Serves until SIGTERM/SIGINT: then no new connections, snapshots in flight cancelled
/// (their blocking threads stop at the next chunk), and requests still running after the
/// grace are left behind, so stopping takes bounded time whatever a sandbox holds.
async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    api: ApiState,
    provisioner: &Arc<Provisioner>,
    shutdown_grace: Duration,
) -> anyhow::Result<()> {
    let stopping = provisioner.clone();
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
    Ok(())
}

/// After serving: one replica of several hands its runtimes back before it goes (issue
/// 14): the next request on any replica resumes each from the snapshot taken now. A lone
/// server leaves them running for the next server on this data directory to adopt (I16).
async fn stop(
    provisioner: &Arc<Provisioner>,
    clustered: bool,
    e2b: Option<tokio::task::JoinHandle<()>>,
) {
    if clustered {
        let drained = provisioner.drain(provisioner.config().reap_deadline).await;
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
    match provisioner.leave_cluster().await {
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "could not record this node leaving the cluster"),
    }
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

fn init_logging(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
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
fn load_token(
    token: Option<&str>,
    token_file: Option<&Path>,
    data_dir: &Path,
) -> anyhow::Result<ProvisionerToken> {
    if let Some(value) = token {
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
