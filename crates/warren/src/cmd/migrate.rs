//! `warren migrate`: imports an old deployment's files into warren's workspaces once
//! (`deerflow`), and shows the migration journal (`status`). Offline: it works on the data
//! directory and state store itself, and refuses while a server runs on them (I36).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use warren_core::Uid;
use warren_migrate::{MigrateError, MigrateOptions, MigrationOutcome, Migrator, WorkspaceHost};
use warren_provisioner::{ProvisionerConfig, Workspaces};
use warren_store::{PostgresStore, ServerLock, SqliteStore, StateStore};

use super::config::{ConfigFile, StateChoice};
use super::data_dir_lock::DataDirLock;
use super::output::outln;

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(subcommand)]
    command: MigrateCommand,
}

#[derive(Debug, Subcommand)]
enum MigrateCommand {
    /// Import a DeerFlow deployment's thread files and skills (`.deer-flow` or its
    /// `base_dir`): each thread becomes the workdir `threads/<thread_id>/user-data` of its
    /// user, as the DeerFlow drop-in binds it. Stop DeerFlow and warren first; the source
    /// is kept unless --clean-source is given. A killed run resumes when run again.
    Deerflow {
        /// DeerFlow's base directory (holding `users/`, `threads/` and `skills/`).
        #[arg(long)]
        source: PathBuf,
        /// The uid of threads from before DeerFlow had users (DeerFlow's own default
        /// user id is "default").
        #[arg(long, default_value = "default")]
        default_uid: String,
        /// Print the plan (items, files, bytes, conflicts) and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// After every item is committed, remove the migrated items from the source.
        #[arg(long)]
        clean_source: bool,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Show the migrations in the journal and where each stands.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
}

/// Which warren the migration fills: as `warren serve` would find it.
#[derive(Debug, Args)]
struct TargetArgs {
    /// The server's warren.toml (data directory, state store, skills, quotas).
    #[arg(long, env = "WARREN_CONFIG")]
    config: Option<PathBuf>,
    /// The server's data directory [default: as `warren serve`].
    #[arg(long, env = "WARREN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The directory replicas share, when apart from the data directory.
    #[arg(long, env = "WARREN_WORKSPACE_DIR")]
    workspace_dir: Option<PathBuf>,
    /// The server's state store, when it is PostgreSQL (`postgres://…`).
    #[arg(long, env = "WARREN_STATE")]
    state: Option<String>,
}

/// Everything a run holds: the store, the workspace rules that make UserWorkspaces, and
/// the locks that keep a server off the data directory and the database meanwhile.
struct Target {
    store: Arc<dyn StateStore>,
    workspaces: Arc<Workspaces>,
    /// The operator's shared skills directory, if any.
    shared_skills: Option<PathBuf>,
    /// Whether the store is shared by replicas (PostgreSQL).
    shared_store: bool,
    _data_dir_lock: DataDirLock,
    _server_lock: Option<ServerLock>,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        MigrateCommand::Deerflow {
            source,
            default_uid,
            dry_run,
            clean_source,
            json,
            target,
        } => {
            let default_uid = Uid::new(default_uid).context("--default-uid is not a usable uid")?;
            let target = open_target(&target).await?;
            let host = Arc::new(WorkspacesHost {
                workspaces: Arc::clone(&target.workspaces),
                shared_skills: target.shared_skills.clone(),
            });
            let migrator = Migrator::new(Arc::clone(&target.store), host)
                .with_crash_hook(warren_migrate::crash_hook_from_env());
            let options = MigrateOptions {
                source,
                default_uid,
                dry_run,
                clean_source,
                refuse_live_nodes: target.shared_store,
            };
            let outcome = migrator.migrate_deerflow(&options).await.map_err(explain)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                print_outcome(&outcome)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        MigrateCommand::Status { json, target } => {
            let target = open_target(&target).await?;
            let entries = warren_migrate::status(&*target.store).await?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "migrations": entries }))?
                );
            } else if entries.is_empty() {
                outln!("no migrations in the journal");
            } else {
                for entry in entries {
                    let items: Vec<String> = entry
                        .items
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|(state, n)| format!("{n} {state}"))
                        .collect();
                    outln!(
                        "{}  {}  {}  {}  items: {}  (updated {})",
                        entry.id,
                        entry.kind,
                        entry.state,
                        entry.source,
                        items.join(", "),
                        entry.updated_at.to_rfc3339()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A migration error in CLI terms.
fn explain(error: MigrateError) -> anyhow::Error {
    let hint = match &error {
        MigrateError::UnknownSchema { .. } => {
            "\nThe migrator imports DeerFlow's released layouts only; move what it names out \
             of the source if it is not DeerFlow's, or report the layout."
        }
        MigrateError::Journal(_) | MigrateError::VerifyFailed { .. } => {
            "\nThe source is untouched. `warren migrate status` shows the journal."
        }
        _ => "",
    };
    anyhow::anyhow!("{error}{hint}")
}

fn print_outcome(outcome: &MigrationOutcome) -> anyhow::Result<()> {
    let verb = if outcome.dry_run {
        "would migrate"
    } else {
        "migrated"
    };
    outln!(
        "{} {}: {} item(s), {} file(s), {} byte(s){}",
        outcome.migration_id,
        verb,
        outcome.items.len(),
        outcome.files,
        outcome.bytes,
        if outcome.resumed {
            " (resumed from the journal)"
        } else {
            ""
        }
    );
    for item in &outcome.items {
        let to = match &item.uid {
            Some(uid) => format!("uid {uid}: {}", item.target),
            None => format!("shared skills: {}", item.target),
        };
        outln!(
            "  {:<10} {} -> {}  ({} files, {} bytes)",
            item.state,
            item.source,
            to,
            item.files,
            item.bytes
        );
    }
    for path in &outcome.left_alone {
        outln!("  left alone (not workspace files): {path}");
    }
    for warning in &outcome.warnings {
        outln!("  warning: {warning}");
    }
    for conflict in &outcome.conflicts {
        outln!("  CONFLICT: {conflict}");
    }
    if !outcome.dry_run {
        outln!("state: {} in {} ms", outcome.state, outcome.elapsed_ms);
    }
    Ok(())
}

/// Opens the data directory (locked against servers), the state store and a provisioner
/// for its workspace rules.
async fn open_target(args: &TargetArgs) -> anyhow::Result<Target> {
    let file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let data_dir = match args.data_dir.clone().or(file.data_dir.clone()) {
        Some(dir) => dir,
        None => super::serve::default_data_dir()?,
    };
    let data_dir = super::serve::make_data_dir(&data_dir)?;
    // First: no server may run on the data directory while it is migrated into, and none
    // may start until the migration ends (the lock is the one `warren serve` takes).
    let data_dir_lock = DataDirLock::acquire(&data_dir, "nothing: warren migrate runs")
        .context("a warren server runs on this data directory: stop it before migrating")?;
    let workspace_dir = match args.workspace_dir.clone().or(file.workspace_dir.clone()) {
        Some(dir) => Some(dir.canonicalize().with_context(|| {
            format!("cannot resolve the workspace directory {}", dir.display())
        })?),
        None => None,
    };
    let mut server_lock = None;
    let default_db = warren_core::DataLayout::new(&data_dir).state_db();
    let store: Arc<dyn StateStore> = match args.state.as_deref().or(file.state.url.as_deref()) {
        Some(url) => match StateChoice::parse(url)? {
            StateChoice::Postgres(url) => {
                let store = PostgresStore::connect(&url, &Default::default())
                    .await
                    .context("cannot open the PostgreSQL state store")?;
                server_lock =
                    Some(PostgresStore::hold_server_lock(&url).await.context(
                        "a warren server runs on this database: stop it before migrating",
                    )?);
                Arc::new(store)
            }
            StateChoice::Sqlite(Some(path)) => Arc::new(open_sqlite(&path).await?),
            StateChoice::Sqlite(None) => Arc::new(open_sqlite(&default_db).await?),
        },
        None => Arc::new(open_sqlite(&default_db).await?),
    };
    let mut config = ProvisionerConfig::new(&data_dir);
    config.workspace_dir = workspace_dir;
    config.skill_sources.shared = match &file.skills.shared_dir {
        Some(dir) => Some(dir.canonicalize().with_context(|| {
            format!(
                "skills.shared_dir: {} is not a directory warren can read",
                dir.display()
            )
        })?),
        None => None,
    };
    config.quotas = file
        .quotas
        .settings(warren_provisioner::volumes_unsupported_reason)?;
    // Only the workspace rules (UserWorkspaces, volumes): no backend, no runtime (I20).
    let workspaces = Arc::new(Workspaces::new(&config));
    workspaces
        .prepare_volumes()
        .await
        .context("cannot mount the uids' workspace volumes")?;
    Ok(Target {
        shared_store: server_lock.is_some(),
        store,
        workspaces,
        shared_skills: config.skill_sources.shared.clone(),
        _data_dir_lock: data_dir_lock,
        _server_lock: server_lock,
    })
}

async fn open_sqlite(path: &Path) -> anyhow::Result<SqliteStore> {
    SqliteStore::open(path)
        .await
        .with_context(|| format!("cannot open the state store {}", path.display()))
}

/// The workspace rules, for the migrator.
struct WorkspacesHost {
    workspaces: Arc<Workspaces>,
    shared_skills: Option<PathBuf>,
}

#[async_trait::async_trait]
impl WorkspaceHost for WorkspacesHost {
    async fn prepare_user_workspace(&self, uid: &Uid) -> Result<PathBuf, MigrateError> {
        self.workspaces
            .prepare_user_workspace(uid)
            .await
            .map_err(|error| MigrateError::Workspace {
                uid: uid.to_string(),
                reason: error.to_string(),
            })
    }

    fn user_workspace_path(&self, uid: &Uid) -> PathBuf {
        self.workspaces.layout().user_workspace(&uid.safe())
    }

    fn shared_skills_dir(&self) -> Option<PathBuf> {
        self.shared_skills.clone()
    }
}
