//! Migrating a DeerFlow deployment: proving its source stopped, planning it, checking the
//! targets, journaling the plan, then driving every item and cleaning the source.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;
use std::time::Instant;

use warren_fs::{FsError, WorkspaceRoot};
use warren_store::{MigrationRecord, MigrationState, NewMigration, NewMigrationItem};

use super::{
    migration_id, occupancy, ExistingTargets, MigrateOptions, MigrationOutcome, Migrator,
    Occupancy, KIND_DEERFLOW,
};
use crate::manifest::manifest_of;
use crate::plan::{describe_target, plan_deerflow, Plan, PlanOptions};
use crate::{stopped, MigrateError};

impl Migrator {
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
}
