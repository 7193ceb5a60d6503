//! The journal driver: takes each planned item through copy, verify, switch, read-back and
//! commit, writing every step to the state store's migration journal before the next one
//! starts, so a migrator killed anywhere resumes where the journal says (I36).

mod clean;
mod deerflow;
mod items;
mod journal;
mod status;

pub use status::status;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use warren_core::Uid;
use warren_fs::{FsError, Owner, WorkspaceRoot};
use warren_store::{MigrationItem, StateStore};

use crate::plan::ItemKind;
use crate::MigrateError;

/// The kind of migration the journal records for DeerFlow.
const KIND_DEERFLOW: &str = "deerflow";

/// What the migrator needs of warren's workspaces: the provisioner makes a uid's
/// UserWorkspace exactly as it does for a sandbox (the uid's volume mounted when quotas
/// are on, I23), and knows the operator's skill directories.
#[async_trait::async_trait]
pub trait WorkspaceHost: Send + Sync {
    /// Makes (or confirms) `uid`'s UserWorkspace and returns its host path.
    async fn prepare_user_workspace(&self, uid: &Uid) -> Result<PathBuf, MigrateError>;
    /// Where `uid`'s UserWorkspace is, without making anything (for dry runs).
    fn user_workspace_path(&self, uid: &Uid) -> PathBuf;
    /// The operator's shared skill directory (`[skills] shared_dir`), if there is one.
    fn shared_skills_dir(&self) -> Option<PathBuf>;
}

/// What to migrate, and how.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// The old deployment's base directory.
    pub source: PathBuf,
    /// The uid of threads from before DeerFlow had users.
    pub default_uid: Uid,
    /// Print the plan; change nothing.
    pub dry_run: bool,
    /// After commit, remove the migrated items from the source.
    pub clean_source: bool,
    /// Refuse while any warren node holds a live lease in the store: for a shared store
    /// (PostgreSQL), where replicas of a cluster run elsewhere. On one machine the data
    /// directory's lock is the proof, and a server stopped by force would otherwise keep
    /// the migration out until its lease lapsed.
    pub refuse_live_nodes: bool,
}

/// One item as the outcome reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutcomeItem {
    /// Its journal key.
    pub key: String,
    /// What it is.
    pub kind: ItemKind,
    /// Its directory relative to the source.
    pub source: String,
    /// The receiving uid (`None`: shared skills).
    pub uid: Option<String>,
    /// The target directory.
    pub target: String,
    /// Its journal state.
    pub state: String,
    /// Regular files.
    pub files: u64,
    /// Bytes of content.
    pub bytes: u64,
}

/// What a run did (or, dry, would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MigrationOutcome {
    /// The migration's id (the same for every run on the same source).
    pub migration_id: String,
    /// `committed`, `cleaned`, or `dry_run`.
    pub state: String,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Whether an earlier, interrupted or finished run was found in the journal.
    pub resumed: bool,
    /// Every item.
    pub items: Vec<OutcomeItem>,
    /// Files of every item.
    pub files: u64,
    /// Bytes of every item.
    pub bytes: u64,
    /// What the source holds that is not workspace files, left where it is.
    pub left_alone: Vec<String>,
    /// What the operator should know: links pointing outside, skipped special files,
    /// targets that exist already.
    pub warnings: Vec<String>,
    /// Targets that already hold other content (a dry run lists them; a run refuses with
    /// the first before it writes anything).
    pub conflicts: Vec<String>,
    /// How long the run took.
    pub elapsed_ms: u64,
}

/// The test-only crash hook: `WARREN_MIGRATE_CRASH_AFTER=<step>[:<n>]` kills the migrator
/// with SIGKILL right after the journal write of the n-th occurrence of the step, so tests
/// can prove that a rerun resumes from every step.
#[derive(Debug)]
pub struct CrashHook {
    step: String,
    nth: u32,
    seen: AtomicU32,
}

/// The hook the environment asks for, if any.
pub fn crash_hook_from_env() -> Option<CrashHook> {
    let value = std::env::var("WARREN_MIGRATE_CRASH_AFTER").ok()?;
    let (step, nth) = match value.split_once(':') {
        Some((step, nth)) => (step.to_owned(), nth.parse().unwrap_or(1)),
        None => (value, 1),
    };
    Some(CrashHook {
        step,
        nth,
        seen: AtomicU32::new(0),
    })
}

impl CrashHook {
    fn after(&self, step: &str) {
        if self.step == step && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.nth {
            eprintln!(
                "warren migrate: crash hook: killed after {step} #{}",
                self.nth
            );
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            // SIGKILL is not delivered synchronously to ourselves in every case; never go on.
            loop {
                std::thread::park();
            }
        }
    }
}

/// The id of the migration of `source` (canonical): deterministic, so a rerun finds the
/// journal of the run it continues.
pub fn migration_id(kind: &str, source: &Path) -> String {
    let mut hasher = Sha256::new();
    hasher.update(kind.as_bytes());
    hasher.update([0]);
    hasher.update(std::os::unix::ffi::OsStrExt::as_bytes(source.as_os_str()));
    format!("mig-{}", &hex::encode(hasher.finalize())[..16])
}

/// The migrator: a state store for the journal, and warren's workspaces to fill.
pub struct Migrator {
    store: Arc<dyn StateStore>,
    host: Arc<dyn WorkspaceHost>,
    crash: Option<CrashHook>,
}

/// Where one item goes.
struct Target {
    /// The tree receiving it: a UserWorkspace or the shared skill directory.
    root: WorkspaceRoot,
    /// The owner everything in the target must have.
    owner: Owner,
    /// The target directory beneath `root`.
    path: OsString,
    /// The staging directory beside it.
    staging: OsString,
    /// The uid's subtree (`user-data/shared/<uid>`), whose ownership is migrated once.
    subtree: Option<PathBuf>,
}

/// Targets that exist before a run.
#[derive(Debug, Default)]
struct ExistingTargets {
    /// Those holding exactly their source, as warnings.
    identical: Vec<String>,
    /// Those holding something else.
    conflicts: Vec<MigrateError>,
}

/// What a target directory holds before the switch.
enum Occupancy {
    Absent,
    EmptyDir,
    Occupied,
}

impl Migrator {
    /// A migrator journaling to `store` and filling `host`'s workspaces.
    pub fn new(store: Arc<dyn StateStore>, host: Arc<dyn WorkspaceHost>) -> Self {
        Self {
            store,
            host,
            crash: None,
        }
    }

    /// With the test-only crash hook.
    pub fn with_crash_hook(mut self, hook: Option<CrashHook>) -> Self {
        self.crash = hook;
        self
    }

    fn step(&self, step: &str) {
        if let Some(hook) = &self.crash {
            hook.after(step);
        }
    }
}

/// The manifest digest the journal holds for an item past its copy.
fn journal_manifest(item: &MigrationItem) -> Result<String, MigrateError> {
    item.manifest.clone().ok_or_else(|| {
        MigrateError::Journal(format!(
            "{} is {:?} but has no manifest",
            item.key, item.state
        ))
    })
}

fn occupancy(root: &WorkspaceRoot, path: &OsStr) -> Result<Occupancy, MigrateError> {
    match root.list(path, 1, 1) {
        Ok(listing) if listing.entries.is_empty() => Ok(Occupancy::EmptyDir),
        Ok(_) => Ok(Occupancy::Occupied),
        Err(FsError::NotFound { .. }) => Ok(Occupancy::Absent),
        // A file, or a link, where a directory belongs: occupied, never replaced.
        Err(FsError::NotADirectory { .. } | FsError::SymlinkRefused { .. }) => {
            Ok(Occupancy::Occupied)
        }
        Err(error) => Err(MigrateError::fs(format!(
            "look at {}",
            path.to_string_lossy()
        ))(error)),
    }
}

fn remove_if_present(root: &WorkspaceRoot, path: &OsStr) -> Result<(), MigrateError> {
    match root.remove(path, true) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(error) => Err(MigrateError::fs(format!(
            "remove {}",
            path.to_string_lossy()
        ))(error)),
    }
}
