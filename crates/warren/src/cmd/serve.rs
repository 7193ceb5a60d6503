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
use warren_backend::{Backend, MemoryBackend};
use warren_isolation::config::RuntimeLimits;
use warren_isolation::{LocalBackend, LocalBackendConfig};
use warren_provisioner::{Provisioner, ProvisionerConfig};
use warren_store::SqliteStore;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Data directory: workspaces, skill projections, state store, generated token.
    /// Default: /var/lib/warren as root, else ~/.local/share/warren.
    #[arg(long, env = "WARREN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address to listen on. Never all interfaces unless you say so.
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// File holding the provisioner token (at least 32 characters). `WARREN_TOKEN` wins
    /// over it; with neither, a token is generated into <data-dir>/token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Which backend hosts runtimes.
    #[arg(long, value_enum, default_value = "local")]
    backend: BackendChoice,
    /// A root filesystem directory for runtimes instead of the host profile (local backend).
    #[arg(long, conflicts_with = "image")]
    rootfs: Option<PathBuf>,
    /// An image imported with `warren image import` as the runtimes' root filesystem.
    #[arg(long)]
    image: Option<String>,
    /// Seconds a runtime may sit unused (no lease, no command, no running process) before
    /// it is reclaimed. Its workspace files stay.
    #[arg(long, default_value_t = 900)]
    idle_timeout: u64,
    /// Seconds after which a runtime is reclaimed whatever holds it.
    #[arg(long, default_value_t = 86_400)]
    max_lifetime: u64,
    /// Seconds between two passes of the reaper.
    #[arg(long, default_value_t = 10)]
    reap_interval: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendChoice {
    /// The native Linux runtime: namespaces, cgroups, seccomp, Landlock. The default.
    Local,
    /// Records and isolates nothing, runs no command: for tests only.
    Memory,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let data_dir = match args.data_dir {
        Some(dir) => dir,
        None => default_data_dir()?,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let data_dir = data_dir
        .canonicalize()
        .with_context(|| format!("cannot resolve the data directory {}", data_dir.display()))?;
    // Private whatever it was created with: it holds every tenant's files and the token.
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
    let token = load_token(args.token_file.as_deref(), &data_dir)?;
    let backend: Arc<dyn Backend> = match args.backend {
        BackendChoice::Local => {
            let backend = LocalBackend::new(LocalBackendConfig {
                data_dir: data_dir.clone(),
                init_program: std::env::current_exe().context("cannot find warren's own executable")?,
                limits: RuntimeLimits::default(),
                rootfs: match (&args.rootfs, &args.image) {
                    (Some(dir), _) => Some(dir.clone()),
                    (None, Some(name)) => Some(super::image::rootfs_of(&data_dir, name)?),
                    (None, None) => None,
                },
            })
            .context("cannot start the local isolation backend (`warren doctor` shows what this host supports)")?;
            Arc::new(backend)
        }
        BackendChoice::Memory => {
            tracing::warn!(
                "USING THE MEMORY BACKEND: it isolates nothing and refuses to run commands; \
                 it exists for tests and must never serve real agents (I20)"
            );
            Arc::new(MemoryBackend::new())
        }
    };
    for warning in backend.warnings() {
        tracing::warn!(backend = backend.kind().as_str(), "{warning}");
    }
    let layout = warren_core::DataLayout::new(&data_dir);
    let store = SqliteStore::open(&layout.state_db())
        .await
        .context("cannot open the state store")?;
    let mut config = ProvisionerConfig::new(&data_dir);
    config.idle_timeout = std::time::Duration::from_secs(args.idle_timeout);
    config.max_lifetime = std::time::Duration::from_secs(args.max_lifetime);
    let provisioner = Arc::new(Provisioner::new(config, Arc::new(store), backend));
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
        cleanup_failures = recovered.cleanup_failures,
        "reconciled state with the backend"
    );
    let reaper = provisioner.clone();
    let interval = std::time::Duration::from_secs(args.reap_interval.max(1));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(error) = reaper.reap().await {
                tracing::warn!(error = %error, "a reaper pass failed");
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, data_dir = %data_dir.display(), "warren is serving");
    // A machine-readable line for supervisors and tests that asked for port 0.
    println!("warren listening on http://{address}");
    warren_api::serve(
        listener,
        ApiState::new(provisioner, token),
        shutdown_signal(),
    )
    .await
    .context("the HTTP server failed")?;
    tracing::info!("warren stopped");
    Ok(ExitCode::SUCCESS)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
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
