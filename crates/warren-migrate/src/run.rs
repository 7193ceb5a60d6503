//! The journal driver: takes each planned item through copy, verify, switch, read-back and
//! commit, writing every step to the state store's migration journal before the next one
//! starts, so a migrator killed anywhere resumes where the journal says (I36).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use warren_core::{Uid, Workdir};
use warren_fs::{FsError, Owner, WorkspaceRoot};
use warren_store::{
    ItemState, ItemUpdate, MigrationItem, MigrationRecord, MigrationState, NewMigration,
    NewMigrationItem, StateStore,
};

use crate::copy::copy_tree;
use crate::manifest::manifest_of;
use crate::plan::{describe_target, plan_deerflow, ItemKind, Plan, PlanOptions};
use crate::{stopped, MigrateError};

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

    /// Migrates a DeerFlow deployment's files (see the crate docs for the steps).
    pub async fn migrate_deerflow(
        &self,
        options: &MigrateOptions,
    ) -> Result<MigrationOutcome, MigrateError> {
        let started = Instant::now();
        let source = options
            .source
            .canonicalize()
            .map_err(|error| MigrateError::Source {
                path: options.source.clone(),
                reason: error.to_string(),
            })?;
        let id = migration_id(KIND_DEERFLOW, &source);
        self.prove_stopped(&source, options.refuse_live_nodes)
            .await?;
        let existing = self.store.get_migration(&id).await?;
        if let Some(record) = existing
            .as_ref()
            .filter(|r| r.state != MigrationState::Planned)
        {
            // Done before: only the cleaning may be left. A migration imports once: what
            // the source gained since is said, never silently imported or removed.
            let mut warnings = Vec::new();
            if record.state == MigrationState::Committed
                && self.planned_differently(&source, options, record)
            {
                warnings.push(format!(
                    "the source no longer plans as migration {id} did: what changed there \
                     since it was committed was not imported"
                ));
            }
            if options.clean_source && !options.dry_run && record.state == MigrationState::Committed
            {
                self.clean(&id, &source).await?;
            }
            let record = self
                .store
                .get_migration(&id)
                .await?
                .unwrap_or(record.clone());
            return self
                .outcome(&record, Vec::new(), warnings, true, started)
                .await;
        }

        let source_root = WorkspaceRoot::open(&source)
            .map_err(|error| MigrateError::Source {
                path: source.clone(),
                reason: error.to_string(),
            })?
            .read_only();
        let plan_options = PlanOptions {
            default_uid: options.default_uid.clone(),
            has_shared_skills: self.host.shared_skills_dir().is_some(),
        };
        let mut plan = tokio::task::block_in_place(|| plan_deerflow(&source_root, &plan_options))?;
        plan.source = source.clone();

        // Every target that already holds something is checked against its source before
        // anything is written, so a conflict stops the migration with nothing made.
        let existing_targets =
            tokio::task::block_in_place(|| self.check_existing_targets(&source_root, &plan))?;
        if options.dry_run {
            return self
                .dry_outcome(&id, &plan, existing_targets, existing.is_some(), started)
                .await;
        }
        if let Some(conflict) = existing_targets.conflicts.into_iter().next() {
            return Err(conflict);
        }
        let plan_json = serde_json::to_string(&plan).expect("a plan serialises");
        let items: Vec<NewMigrationItem> = plan
            .items
            .iter()
            .map(|item| NewMigrationItem {
                key: item.key.clone(),
                kind: item.kind.as_str().to_owned(),
                source: item.source.clone(),
                uid: item.uid.clone(),
                target: item.target.clone(),
            })
            .collect();
        let record = self
            .store
            .begin_migration(
                &NewMigration {
                    id: id.clone(),
                    kind: KIND_DEERFLOW.to_owned(),
                    source: source.display().to_string(),
                    plan_digest: plan.digest(),
                    plan: plan_json,
                },
                &items,
            )
            .await?;
        self.step("planned");

        let mut warnings = Vec::new();
        let mut owned_subtrees = HashSet::new();
        for item in self.store.migration_items(&id).await? {
            self.drive(&source_root, item, &mut warnings, &mut owned_subtrees)
                .await?;
        }
        if !self
            .store
            .set_migration_state(&id, MigrationState::Planned, MigrationState::Committed)
            .await?
        {
            return Err(MigrateError::Journal(format!(
                "migration {id} changed state under this run (another migrator on the same \
                 store?)"
            )));
        }
        self.step("migration_committed");
        if options.clean_source {
            self.clean(&id, &source).await?;
        }
        let record = self.store.get_migration(&id).await?.unwrap_or(record);
        self.outcome(
            &record,
            plan.left_alone,
            warnings,
            existing.is_some(),
            started,
        )
        .await
    }

    /// Whether the source, planned again, differs from what `record` planned.
    fn planned_differently(
        &self,
        source: &Path,
        options: &MigrateOptions,
        record: &MigrationRecord,
    ) -> bool {
        let Ok(root) = WorkspaceRoot::open(source) else {
            return true;
        };
        let plan_options = PlanOptions {
            default_uid: options.default_uid.clone(),
            has_shared_skills: self.host.shared_skills_dir().is_some(),
        };
        tokio::task::block_in_place(|| plan_deerflow(&root.read_only(), &plan_options))
            .map_or(true, |plan| plan.digest() != record.plan_digest)
    }

    /// Refuses while anything uses the source, or a warren server is live on the store.
    async fn prove_stopped(
        &self,
        source: &Path,
        refuse_live_nodes: bool,
    ) -> Result<(), MigrateError> {
        let source = source.to_owned();
        let users = tokio::task::spawn_blocking(move || stopped::processes_using(&source))
            .await
            .unwrap_or_default();
        let mut processes: Vec<String> = users.iter().map(ToString::to_string).collect();
        if refuse_live_nodes {
            for node in self.store.list_nodes().await? {
                if node.state == warren_store::NodeState::Live {
                    processes.push(format!(
                        "warren node {} ({}) holds a live lease on this state store until \
                         {} (a replica stopped by force keeps it until then)",
                        node.node_id,
                        node.advertise,
                        node.expires_at.to_rfc3339()
                    ));
                }
            }
        }
        if processes.is_empty() {
            Ok(())
        } else {
            Err(MigrateError::SourceInUse { processes })
        }
    }

    /// Looks at every planned target without making anything: one that holds anything
    /// must hold exactly its source (an earlier run of the same migration, or the same
    /// files put there by hand) and is otherwise a conflict.
    fn check_existing_targets(
        &self,
        source: &WorkspaceRoot,
        plan: &Plan,
    ) -> Result<ExistingTargets, MigrateError> {
        let mut found = ExistingTargets::default();
        for item in &plan.items {
            let root_dir = match &item.uid {
                Some(uid) => self.host.user_workspace_path(uid),
                None => match self.host.shared_skills_dir() {
                    Some(dir) => dir,
                    None => continue,
                },
            };
            let root = match WorkspaceRoot::open(&root_dir) {
                Ok(root) => root.read_only(),
                // No UserWorkspace yet: nothing of it can be in the way.
                Err(FsError::RootUnavailable { .. } | FsError::NotFound { .. }) => continue,
                Err(error) => {
                    return Err(MigrateError::fs(format!("open the target of {}", item.key))(error))
                }
            };
            let target = OsStr::new(&item.target);
            if !matches!(occupancy(&root, target)?, Occupancy::Occupied) {
                continue;
            }
            let shown = describe_target(item.uid.as_ref(), &item.target);
            let theirs = manifest_of(&root, target, None)?;
            let ours = manifest_of(source, OsStr::new(&item.source), None)?;
            if theirs.digest() == ours.digest() {
                found.identical.push(format!(
                    "{shown} already holds exactly {}; it is recorded without copying",
                    item.source
                ));
            } else {
                found.conflicts.push(MigrateError::TargetConflict {
                    target: shown,
                    source_item: item.source.clone(),
                    detail: ours.first_difference(&theirs).map_or_else(
                        || "the trees differ".to_owned(),
                        |d| d.replace("the copy", "the target"),
                    ),
                });
            }
        }
        Ok(found)
    }

    /// Opens the tree an item goes to.
    async fn target(&self, item: &MigrationItem) -> Result<Target, MigrateError> {
        let kind = ItemKind::parse(&item.kind).ok_or_else(|| {
            MigrateError::Journal(format!("item {} has kind {:?}", item.key, item.kind))
        })?;
        let (dir, owner, subtree) = match (&item.uid, kind) {
            (Some(uid), ItemKind::Thread | ItemKind::PersonalSkill) => {
                let workspace = self.host.prepare_user_workspace(uid).await?;
                let subtree = workspace.parent().map(Path::to_owned);
                (workspace, Owner::WORKSPACE, subtree)
            }
            (None, ItemKind::SharedSkill) => {
                let dir = self.host.shared_skills_dir().ok_or_else(|| {
                    MigrateError::Config(
                        "the journal has shared skills to migrate but warren.toml sets no \
                         [skills] shared_dir any more"
                            .to_owned(),
                    )
                })?;
                // The operator's directory: what lands there is the directory owner's.
                let meta = std::fs::metadata(&dir)
                    .map_err(MigrateError::io("the shared skill directory"))?;
                let owner = Owner {
                    uid: std::os::unix::fs::MetadataExt::uid(&meta),
                    gid: std::os::unix::fs::MetadataExt::gid(&meta),
                };
                (dir, owner, None)
            }
            _ => {
                return Err(MigrateError::Journal(format!(
                    "item {} of kind {} has no target owner",
                    item.key, item.kind
                )))
            }
        };
        let root = WorkspaceRoot::open(&dir)
            .map_err(MigrateError::fs(format!("open the target of {}", item.key)))?
            .with_owner(Some(owner));
        let (parent, leaf) = match item.target.rsplit_once('/') {
            Some((parent, leaf)) => (format!("{parent}/"), leaf),
            None => (String::new(), item.target.as_str()),
        };
        let tag = &item.migration_id[item.migration_id.len().saturating_sub(8)..];
        Ok(Target {
            root,
            owner,
            path: OsString::from(&item.target),
            staging: OsString::from(format!("{parent}.{leaf}.warren-migrate-{tag}")),
            subtree,
        })
    }

    /// Takes one item from wherever the journal left it to committed.
    async fn drive(
        &self,
        source: &WorkspaceRoot,
        mut item: MigrationItem,
        warnings: &mut Vec<String>,
        owned_subtrees: &mut HashSet<PathBuf>,
    ) -> Result<(), MigrateError> {
        if item.state >= ItemState::Committed {
            return Ok(());
        }
        let target = self.target(&item).await?;
        let shown = describe_target(item.uid.as_ref(), &item.target);
        let mut recopied = false;
        loop {
            match item.state {
                ItemState::Planned => {
                    let outcome = tokio::task::block_in_place(|| {
                        self.copy_item(source, &item, &target, &shown, warnings)
                    })?;
                    let (state, manifest, files, bytes) = outcome;
                    self.advance(&item, state, &manifest, files, bytes, None)
                        .await?;
                    self.step(if state == ItemState::Copied {
                        "copied"
                    } else {
                        "verified"
                    });
                    item = self.reload(&item).await?;
                }
                ItemState::Copied => {
                    let verified =
                        tokio::task::block_in_place(|| self.verify_staging(&item, &target))?;
                    if verified {
                        self.advance_to(&item, ItemState::Verified, None).await?;
                        self.step("verified");
                    } else if recopied {
                        let detail = tokio::task::block_in_place(|| {
                            first_difference(source, &item.source, &target.root, &target.staging)
                        });
                        return Err(MigrateError::VerifyFailed {
                            what: format!("the staged copy of {}", item.source),
                            detail,
                        });
                    } else {
                        // Torn by a crash, or changed: copy again from the untouched source.
                        recopied = true;
                        self.advance_to(&item, ItemState::Planned, None).await?;
                    }
                    item = self.reload(&item).await?;
                }
                ItemState::Verified => {
                    tokio::task::block_in_place(|| self.switch(&item, &target, &shown))?;
                    let workdir = match ItemKind::parse(&item.kind) {
                        Some(ItemKind::Thread) => {
                            Some(Workdir::new(item.target.clone()).map_err(|error| {
                                MigrateError::Journal(format!("target {}: {error}", item.target))
                            })?)
                        }
                        _ => None,
                    };
                    let uid = item.uid.clone();
                    let record = uid.as_ref().zip(workdir.as_ref());
                    self.advance_to(&item, ItemState::Switched, record).await?;
                    self.step("switched");
                    item = self.reload(&item).await?;
                }
                ItemState::Switched => {
                    if let Some(subtree) = &target.subtree {
                        if owned_subtrees.insert(subtree.clone()) {
                            tokio::task::block_in_place(|| migrate_ownership(subtree))?;
                        }
                    }
                    self.read_back(&item, &target).await?;
                    self.advance_to(&item, ItemState::Committed, None).await?;
                    self.step("committed");
                    return Ok(());
                }
                ItemState::Committed | ItemState::Cleaned => return Ok(()),
            }
        }
    }

    /// The planned step: a staging copy, or the recognition of a target that already
    /// holds exactly the source. Answers the state reached, the manifest digest, files and
    /// bytes.
    fn copy_item(
        &self,
        source: &WorkspaceRoot,
        item: &MigrationItem,
        target: &Target,
        shown: &str,
        warnings: &mut Vec<String>,
    ) -> Result<(ItemState, String, u64, u64), MigrateError> {
        if let Some((parent, _)) = item.target.rsplit_once('/') {
            target
                .root
                .mkdir_p(parent)
                .map_err(MigrateError::fs(format!("make {parent} for {shown}")))?;
        }
        remove_if_present(&target.root, &target.staging)?;
        match occupancy(&target.root, &target.path)? {
            Occupancy::Absent | Occupancy::EmptyDir => {}
            Occupancy::Occupied => {
                // Filled by an earlier migration of the same files, or by someone else.
                let theirs = manifest_of(&target.root, &target.path, None)?;
                let ours = manifest_of(source, OsStr::new(&item.source), None)?;
                if theirs.digest() != ours.digest() {
                    return Err(MigrateError::TargetConflict {
                        target: shown.to_owned(),
                        source_item: item.source.clone(),
                        detail: ours.first_difference(&theirs).map_or_else(
                            || "the trees differ".to_owned(),
                            |d| d.replace("the copy", "the target"),
                        ),
                    });
                }
                warnings.push(format!(
                    "{shown} already held exactly {}; recorded without copying",
                    item.source
                ));
                return Ok((ItemState::Verified, ours.digest(), ours.files, ours.bytes));
            }
        }
        let report = copy_tree(
            source,
            OsStr::new(&item.source),
            &target.root,
            &target.staging,
        )?;
        warnings.extend(
            report
                .warnings
                .iter()
                .map(|warning| format!("{}: {warning}", item.source)),
        );
        Ok((
            ItemState::Copied,
            report.manifest.digest(),
            report.manifest.files,
            report.manifest.bytes,
        ))
    }

    /// Whether the staging tree is exactly what the journal recorded of the source.
    fn verify_staging(&self, item: &MigrationItem, target: &Target) -> Result<bool, MigrateError> {
        let expected = journal_manifest(item)?;
        if let Occupancy::Absent = occupancy(&target.root, &target.staging)? {
            return Ok(false);
        }
        let staged = manifest_of(
            &target.root,
            &target.staging,
            Some((target.owner.uid, target.owner.gid)),
        );
        match staged {
            // `copy_tree` synced it: durable before the switch makes it the copy kept.
            Ok(staged) if staged.digest() == expected => Ok(true),
            Ok(_) | Err(MigrateError::VerifyFailed { .. }) => {
                remove_if_present(&target.root, &target.staging)?;
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Moves the staging tree into place in one rename. The kernel refuses to replace
    /// anything but an empty directory, so existing content is never overwritten.
    fn switch(
        &self,
        item: &MigrationItem,
        target: &Target,
        shown: &str,
    ) -> Result<(), MigrateError> {
        let expected = journal_manifest(item)?;
        match occupancy(&target.root, &target.staging)? {
            Occupancy::Absent => {
                // Renamed before a crash, or recognised in place: the target must be it.
                let found = manifest_of(&target.root, &target.path, None)?;
                if found.digest() != expected {
                    return Err(MigrateError::Journal(format!(
                        "{} is verified but its staging copy is gone and {shown} does not \
                         hold it",
                        item.source
                    )));
                }
                Ok(())
            }
            _ => match target.root.rename(&target.staging, &target.path, true) {
                // Durable before the journal says switched: a rerun after a power cut must
                // find the tree where the journal puts it.
                Ok(()) => target
                    .root
                    .sync_filesystem()
                    .map_err(MigrateError::fs(format!("sync {shown}"))),
                Err(FsError::DirectoryNotEmpty { .. } | FsError::NotADirectory { .. }) => {
                    Err(MigrateError::TargetConflict {
                        target: shown.to_owned(),
                        source_item: item.source.clone(),
                        detail: "it was filled while the copy was made".to_owned(),
                    })
                }
                Err(error) => Err(MigrateError::fs(format!("switch {shown}"))(error)),
            },
        }
    }

    /// Reads the journal and the workdir record back, and hashes the final tree.
    async fn read_back(&self, item: &MigrationItem, target: &Target) -> Result<(), MigrateError> {
        let stored = self.reload(item).await?;
        if stored.state != ItemState::Switched || stored.manifest != item.manifest {
            return Err(MigrateError::Journal(format!(
                "{} reads back as {:?} with manifest {:?}",
                item.key, stored.state, stored.manifest
            )));
        }
        if ItemKind::parse(&item.kind) == Some(ItemKind::Thread) {
            let uid = item.uid.as_ref().expect("a thread has a uid");
            let workdir = Workdir::new(item.target.clone())
                .map_err(|error| MigrateError::Journal(error.to_string()))?;
            if self.store.workdir(uid, &workdir).await?.is_none() {
                return Err(MigrateError::Journal(format!(
                    "the workdir {} of uid {uid} is not recorded after its switch",
                    item.target
                )));
            }
        }
        let expected = journal_manifest(item)?;
        let owner = (target.owner.uid, target.owner.gid);
        let found =
            tokio::task::block_in_place(|| manifest_of(&target.root, &target.path, Some(owner)))?;
        if found.digest() != expected {
            return Err(MigrateError::VerifyFailed {
                what: describe_target(item.uid.as_ref(), &item.target),
                detail: "its tree changed after the switch".to_owned(),
            });
        }
        Ok(())
    }

    /// Removes the committed items from the source, then marks the migration cleaned.
    async fn clean(&self, id: &str, source: &Path) -> Result<(), MigrateError> {
        let root = WorkspaceRoot::open(source).map_err(|error| MigrateError::Source {
            path: source.to_owned(),
            reason: error.to_string(),
        })?;
        let items = self.store.migration_items(id).await?;
        // Every item first: one written to since its migration keeps the whole source.
        tokio::task::block_in_place(|| {
            items
                .iter()
                .filter(|item| item.state == ItemState::Committed)
                .try_for_each(|item| check_unchanged(&root, item))
        })?;
        for item in items {
            if item.state == ItemState::Cleaned {
                continue;
            }
            if item.state != ItemState::Committed {
                return Err(MigrateError::Journal(format!(
                    "{} is {:?}, not committed: the source is kept",
                    item.key, item.state
                )));
            }
            tokio::task::block_in_place(|| remove_source_item(&root, &item))?;
            self.advance_to(&item, ItemState::Cleaned, None).await?;
            self.step("cleaned");
        }
        if !self
            .store
            .set_migration_state(id, MigrationState::Committed, MigrationState::Cleaned)
            .await?
        {
            return Err(MigrateError::Journal(format!(
                "migration {id} changed state under this run"
            )));
        }
        Ok(())
    }

    async fn reload(&self, item: &MigrationItem) -> Result<MigrationItem, MigrateError> {
        self.store
            .migration_items(&item.migration_id)
            .await?
            .into_iter()
            .find(|found| found.key == item.key)
            .ok_or_else(|| MigrateError::Journal(format!("item {} vanished", item.key)))
    }

    async fn advance(
        &self,
        item: &MigrationItem,
        to: ItemState,
        manifest: &str,
        files: u64,
        bytes: u64,
        workdir: Option<(&Uid, &Workdir)>,
    ) -> Result<(), MigrateError> {
        let update = ItemUpdate {
            manifest: Some(manifest),
            files: Some(files),
            bytes: Some(bytes),
            workdir,
        };
        self.cas(item, to, update).await
    }

    async fn advance_to(
        &self,
        item: &MigrationItem,
        to: ItemState,
        workdir: Option<(&Uid, &Workdir)>,
    ) -> Result<(), MigrateError> {
        let update = ItemUpdate {
            workdir,
            ..ItemUpdate::default()
        };
        self.cas(item, to, update).await
    }

    async fn cas(
        &self,
        item: &MigrationItem,
        to: ItemState,
        update: ItemUpdate<'_>,
    ) -> Result<(), MigrateError> {
        if self
            .store
            .advance_migration_item(&item.migration_id, &item.key, item.state, to, update)
            .await?
        {
            Ok(())
        } else {
            Err(MigrateError::Journal(format!(
                "{} was not {:?} when this run moved it to {to:?} (another migrator on the \
                 same store?)",
                item.key, item.state
            )))
        }
    }

    async fn dry_outcome(
        &self,
        id: &str,
        plan: &Plan,
        existing_targets: ExistingTargets,
        resumed: bool,
        started: Instant,
    ) -> Result<MigrationOutcome, MigrateError> {
        let warnings = existing_targets.identical;
        let conflicts = existing_targets
            .conflicts
            .iter()
            .map(ToString::to_string)
            .collect();
        Ok(MigrationOutcome {
            migration_id: id.to_owned(),
            state: "dry_run".to_owned(),
            dry_run: true,
            resumed,
            items: plan
                .items
                .iter()
                .map(|item| OutcomeItem {
                    key: item.key.clone(),
                    kind: item.kind,
                    source: item.source.clone(),
                    uid: item.uid.as_ref().map(ToString::to_string),
                    target: item.target.clone(),
                    state: "planned".to_owned(),
                    files: item.files,
                    bytes: item.bytes,
                })
                .collect(),
            files: plan.files(),
            bytes: plan.bytes(),
            left_alone: plan.left_alone.clone(),
            warnings,
            conflicts,
            elapsed_ms: started.elapsed().as_millis() as u64,
        })
    }

    async fn outcome(
        &self,
        record: &MigrationRecord,
        left_alone: Vec<String>,
        warnings: Vec<String>,
        resumed: bool,
        started: Instant,
    ) -> Result<MigrationOutcome, MigrateError> {
        let items: Vec<OutcomeItem> = self
            .store
            .migration_items(&record.id)
            .await?
            .into_iter()
            .map(|item| OutcomeItem {
                kind: ItemKind::parse(&item.kind).unwrap_or(ItemKind::Thread),
                key: item.key,
                source: item.source,
                uid: item.uid.map(|uid| uid.to_string()),
                target: item.target,
                state: item.state.as_str().to_owned(),
                files: item.files,
                bytes: item.bytes,
            })
            .collect();
        let left_alone = if left_alone.is_empty() {
            serde_json::from_str::<serde_json::Value>(&record.plan)
                .ok()
                .and_then(|plan| serde_json::from_value(plan["left_alone"].clone()).ok())
                .unwrap_or_default()
        } else {
            left_alone
        };
        Ok(MigrationOutcome {
            migration_id: record.id.clone(),
            state: record.state.as_str().to_owned(),
            dry_run: false,
            resumed,
            files: items.iter().map(|item| item.files).sum(),
            bytes: items.iter().map(|item| item.bytes).sum(),
            items,
            left_alone,
            warnings,
            conflicts: Vec::new(),
            elapsed_ms: started.elapsed().as_millis() as u64,
        })
    }
}

/// A committed item still in the source must be exactly what was migrated: whatever was
/// written into it since would be lost by the cleaning, so a changed item refuses it.
fn check_unchanged(root: &WorkspaceRoot, item: &MigrationItem) -> Result<(), MigrateError> {
    let source = OsStr::new(&item.source);
    if matches!(occupancy(root, source)?, Occupancy::Absent) {
        return Ok(());
    }
    let found = manifest_of(root, source, None)?;
    if found.digest() != journal_manifest(item)? {
        return Err(MigrateError::ChangedSinceMigration {
            path: item.source.clone(),
        });
    }
    Ok(())
}

/// Removes a committed, checked item from the source. It is renamed aside in one step
/// first, so a removal cut short by a crash never leaves a half-removed item that no longer
/// matches its manifest; the next run finishes removing what was set aside.
fn remove_source_item(root: &WorkspaceRoot, item: &MigrationItem) -> Result<(), MigrateError> {
    let (parent, leaf) = match item.source.rsplit_once('/') {
        Some((parent, leaf)) => (format!("{parent}/"), leaf),
        None => (String::new(), item.source.as_str()),
    };
    let aside = OsString::from(format!("{parent}.{leaf}.warren-migrate-removing"));
    let source = OsStr::new(&item.source);
    if !matches!(occupancy(root, source)?, Occupancy::Absent) {
        root.rename(source, &aside, false)
            .map_err(MigrateError::fs(format!("set {} aside", item.source)))?;
    }
    remove_if_present(root, &aside)?;
    // The thread's own directory, once empty: nothing of DeerFlow's is left of it.
    if ItemKind::parse(&item.kind) == Some(ItemKind::Thread) {
        if let Some((thread_dir, _)) = item.source.rsplit_once('/') {
            match root.remove(thread_dir, false) {
                Ok(()) | Err(FsError::NotFound { .. } | FsError::DirectoryNotEmpty { .. }) => {}
                Err(error) => return Err(MigrateError::fs(format!("remove {thread_dir}"))(error)),
            }
        }
    }
    Ok(())
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

fn first_difference(
    source: &WorkspaceRoot,
    from: &str,
    root: &WorkspaceRoot,
    at: &OsStr,
) -> String {
    match (
        manifest_of(source, OsStr::new(from), None),
        manifest_of(root, at, None),
    ) {
        (Ok(ours), Ok(theirs)) => ours
            .first_difference(&theirs)
            .unwrap_or_else(|| "the trees differ in ownership".to_owned()),
        (Err(error), _) | (_, Err(error)) => error.to_string(),
    }
}

/// The one ownership routine warren has (warren-fs; the Kubernetes init container runs it
/// too): the uid's subtree becomes 1000:1000 once, its marker written (I11).
fn migrate_ownership(subtree: &Path) -> Result<(), MigrateError> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    let dir = openat(
        CWD,
        subtree,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| MigrateError::io("open the uid's subtree")(errno.into()))?;
    warren_fs::migrate_subtree_once(dir.as_fd()).map_err(MigrateError::fs(
        "migrate the ownership of the uid's subtree",
    ))?;
    Ok(())
}

/// Every migration in the journal, for `warren migrate status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusEntry {
    /// Its id.
    pub id: String,
    /// Its kind (`deerflow`).
    pub kind: String,
    /// The source it imports.
    pub source: String,
    /// `planned` (unfinished: rerun it), `committed` or `cleaned`.
    pub state: String,
    /// When planned.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// Items per state.
    pub items: std::collections::BTreeMap<String, u64>,
}

/// The journal's migrations, oldest first.
pub async fn status(store: &dyn StateStore) -> Result<Vec<StatusEntry>, MigrateError> {
    let mut entries = Vec::new();
    for record in store.list_migrations().await? {
        let mut items: std::collections::BTreeMap<String, u64> = [
            ItemState::Planned,
            ItemState::Copied,
            ItemState::Verified,
            ItemState::Switched,
            ItemState::Committed,
            ItemState::Cleaned,
        ]
        .into_iter()
        .map(|state| (state.as_str().to_owned(), 0))
        .collect();
        for item in store.migration_items(&record.id).await? {
            *items.entry(item.state.as_str().to_owned()).or_default() += 1;
        }
        entries.push(StatusEntry {
            id: record.id,
            kind: record.kind,
            source: record.source,
            state: record.state.as_str().to_owned(),
            created_at: record.created_at,
            updated_at: record.updated_at,
            items,
        });
    }
    Ok(entries)
}
