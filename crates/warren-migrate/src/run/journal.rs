//! The journal's writes (an item's state moved by compare-and-set) and the outcome a run
//! reports from the journal or, for a dry run, from the plan.

use std::time::Instant;

use warren_core::{Uid, Workdir};
use warren_store::{ItemState, ItemUpdate, MigrationItem, MigrationRecord};

use super::{ExistingTargets, MigrationOutcome, Migrator, OutcomeItem};
use crate::plan::{ItemKind, Plan};
use crate::MigrateError;

impl Migrator {
    pub(super) async fn reload(&self, item: &MigrationItem) -> Result<MigrationItem, MigrateError> {
        self.store
            .migration_items(&item.migration_id)
            .await?
            .into_iter()
            .find(|found| found.key == item.key)
            .ok_or_else(|| MigrateError::Journal(format!("item {} vanished", item.key)))
    }

    pub(super) async fn advance(
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

    pub(super) async fn advance_to(
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

    pub(super) async fn dry_outcome(
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

    pub(super) async fn outcome(
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
