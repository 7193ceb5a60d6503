//! Cleaning the source after a commit: every committed item, unchanged since it was
//! migrated, is set aside and removed.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use warren_fs::{FsError, WorkspaceRoot};
use warren_store::{ItemState, MigrationItem, MigrationState};

use super::{journal_manifest, occupancy, remove_if_present, Migrator, Occupancy};
use crate::manifest::manifest_of;
use crate::plan::ItemKind;
use crate::MigrateError;

impl Migrator {
    /// Removes the committed items from the source, then marks the migration cleaned.
    pub(super) async fn clean(&self, id: &str, source: &Path) -> Result<(), MigrateError> {
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
