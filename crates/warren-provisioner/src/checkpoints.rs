//! Workdir checkpoints (I28): record a sandbox's workdir, list what changed since, put it
//! back. The engine is `warren-snapshot`; each uid has its own store under
//! `<data>/snapshots/<safe uid>`, so deduplication never crosses uids.
//!
//! A restore puts files back; it cannot undo what commands did outside the workdir (sent
//! mail, pushed commits, packages installed elsewhere): external side effects stay.

use warren_core::{SandboxId, Uid};
use warren_fs::WorkspaceRoot;
use warren_snapshot::{
    Diff, LocalStore, ObjectStore, RedisStore, S3Store, SnapshotError, SnapshotStats, SqlStore,
};
use warren_store::{Checkpoint, SandboxRecord};

use crate::{Provisioner, ProvisionerError, SnapshotStoreConfig};

impl Provisioner {
    /// The uid's snapshot store. Called from async code: an S3 store keeps the current
    /// runtime's handle to wait for its requests on the blocking threads the engine uses.
    pub(crate) fn snapshot_store(
        &self,
        uid: &Uid,
    ) -> Result<Box<dyn ObjectStore>, ProvisionerError> {
        let safe = uid.safe();
        match &self.config.snapshot_store {
            SnapshotStoreConfig::Local => {
                let dir = self.layout().local_snapshots(&safe);
                Ok(Box::new(
                    LocalStore::open(dir).map_err(ProvisionerError::Snapshot)?,
                ))
            }
            SnapshotStoreConfig::Redis { url } => Ok(Box::new(
                RedisStore::open(url, safe.as_str()).map_err(ProvisionerError::Snapshot)?,
            )),
            SnapshotStoreConfig::Sql => Ok(Box::new(SqlStore::new(
                self.store.clone(),
                safe.as_str(),
                tokio::runtime::Handle::current(),
            ))),
            SnapshotStoreConfig::S3(config) => Ok(Box::new(
                S3Store::open(
                    config,
                    &format!("snapshots/{}", safe.as_str()),
                    tokio::runtime::Handle::current(),
                )
                .map_err(ProvisionerError::Snapshot)?,
            )),
        }
    }

    /// The root the sandbox's workdir lives in (its UserWorkspace, or scratch).
    fn workspace_of(&self, record: &SandboxRecord) -> std::path::PathBuf {
        self.mounts(record).0
    }

    /// The tree a checkpoint of the sandbox records or compares: its workdir in its
    /// workspace, or the view of the branch it is bound to (I27).
    async fn checkpointed_tree(
        &self,
        record: &SandboxRecord,
    ) -> Result<(std::path::PathBuf, String), ProvisionerError> {
        match self.branch_view(record).await?.0 {
            Some(branch) => Ok((branch, String::new())),
            None => Ok((
                self.workspace_of(record),
                record.binding.workdir.as_str().to_owned(),
            )),
        }
    }

    /// Restores put a workdir back in one swap; a branch's view is a mount, which nothing
    /// swaps. A branch made from the checkpoint is what restores one.
    fn refuse_restore_into_branch(record: &SandboxRecord) -> Result<(), ProvisionerError> {
        match record.binding.branch {
            Some(_) => Err(ProvisionerError::BadRequest(
                "a sandbox bound to a branch is not restored in place: make a branch from the \
                 checkpoint (from_checkpoint) and bind a sandbox to it",
            )),
            None => Ok(()),
        }
    }

    /// Records the sandbox's workdir as a checkpoint.
    pub async fn create_checkpoint(
        &self,
        id: &SandboxId,
    ) -> Result<(Checkpoint, SnapshotStats), ProvisionerError> {
        let record = self.sandbox(id).await?;
        let store = self.snapshot_store(&record.uid)?;
        let (workspace, base) = self.checkpointed_tree(&record).await?;
        let workdir = record.binding.workdir.clone();
        // The latest checkpoint of the same workdir lets unchanged files go unread.
        let parent = self
            .store
            .list_checkpoints(id)
            .await?
            .into_iter()
            .rev()
            .find(|checkpoint| checkpoint.workdir == record.binding.workdir)
            .map(|checkpoint| checkpoint.manifest);
        let started = std::time::Instant::now();
        let limits = self.snapshot_limits(None);
        let (manifest, stats) = self
            .blocking(move || {
                let root = WorkspaceRoot::open(&workspace)
                    .map_err(|source| snapshot_file_error(&base, source))?;
                warren_snapshot::snapshot_with(
                    &root,
                    &base,
                    store.as_ref(),
                    parent.as_deref(),
                    &limits,
                )
                .map_err(|error| snapshot_error(&base, error))
            })
            .await?;
        let checkpoint = self
            .store
            .record_checkpoint(&Checkpoint {
                id: format!("ckpt-{}", uuid::Uuid::new_v4().simple()),
                sandbox_id: id.clone(),
                workdir,
                manifest,
                files: stats.files,
                bytes: stats.bytes_read,
                created_at: chrono::Utc::now(),
            })
            .await?;
        tracing::info!(sandbox = %id, checkpoint = %checkpoint.id, files = stats.files, bytes_read = stats.bytes_read, bytes_stored = stats.bytes_stored, elapsed_ms = started.elapsed().as_millis() as u64, "checkpoint recorded");
        self.apply_retention(id, &record.uid).await?;
        Ok((checkpoint, stats))
    }

    /// Keeps the newest `keep_checkpoints` of the sandbox; when older ones go, the uid's
    /// store is collected.
    async fn apply_retention(&self, id: &SandboxId, uid: &Uid) -> Result<(), ProvisionerError> {
        let all = self.store.list_checkpoints(id).await?;
        let excess = all.len().saturating_sub(self.config.keep_checkpoints);
        if excess == 0 {
            return Ok(());
        }
        for old in &all[..excess] {
            self.store.delete_checkpoint(&old.id).await?;
        }
        let stats = self.collect_snapshot_garbage(uid).await?;
        tracing::info!(sandbox = %id, dropped = excess, chunks_removed = stats.chunks_removed, "old checkpoints dropped");
        Ok(())
    }

    /// Mark and sweep over the uid's snapshot store: everything no recorded checkpoint
    /// needs goes, except objects younger than the grace period.
    pub async fn collect_snapshot_garbage(
        &self,
        uid: &Uid,
    ) -> Result<warren_snapshot::GcStats, ProvisionerError> {
        let live = self.store.checkpoint_manifests_of_uid(uid).await?;
        let store = self.snapshot_store(uid)?;
        let grace = self.config.gc_grace;
        self.blocking(move || {
            warren_snapshot::collect_garbage(store.as_ref(), &live, grace)
                .map_err(ProvisionerError::Snapshot)
        })
        .await
    }

    /// The sandbox's checkpoints, oldest first.
    pub async fn list_checkpoints(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<Checkpoint>, ProvisionerError> {
        self.sandbox(id).await?;
        Ok(self.store.list_checkpoints(id).await?)
    }

    async fn checkpoint(
        &self,
        id: &SandboxId,
        checkpoint: &str,
    ) -> Result<(SandboxRecord, Checkpoint), ProvisionerError> {
        let record = self.sandbox(id).await?;
        let found = self
            .store
            .list_checkpoints(id)
            .await?
            .into_iter()
            .find(|c| c.id == checkpoint)
            .ok_or_else(|| ProvisionerError::CheckpointNotFound {
                checkpoint: checkpoint.chars().take(100).collect(),
            })?;
        Ok((record, found))
    }

    /// What changed in the workdir since the checkpoint.
    pub async fn checkpoint_diff(
        &self,
        id: &SandboxId,
        checkpoint: &str,
    ) -> Result<Diff, ProvisionerError> {
        let (record, checkpoint) = self.checkpoint(id, checkpoint).await?;
        let store = self.snapshot_store(&record.uid)?;
        let (workspace, base) = match record.binding.branch {
            Some(_) => self.checkpointed_tree(&record).await?,
            None => (
                self.workspace_of(&record),
                checkpoint.workdir.as_str().to_owned(),
            ),
        };
        let limits = self.snapshot_limits(None);
        self.blocking(move || {
            let root = WorkspaceRoot::open(&workspace)
                .map_err(|source| snapshot_file_error(&base, source))?;
            warren_snapshot::diff_with(&root, &base, store.as_ref(), &checkpoint.manifest, &limits)
                .map_err(|error| snapshot_error(&base, error))
        })
        .await
    }

    /// Puts the workdir back as the checkpoint recorded it, in one atomic swap. Refused
    /// (409 `sandbox_busy`) while a command runs in the sandbox: it would see its files
    /// change under it.
    pub async fn restore_checkpoint(
        &self,
        id: &SandboxId,
        checkpoint: &str,
    ) -> Result<Checkpoint, ProvisionerError> {
        let (record, checkpoint) = self.checkpoint(id, checkpoint).await?;
        Self::refuse_restore_into_branch(&record)?;
        self.refuse_frozen_workdir(&record.uid, &checkpoint.workdir)
            .await?;
        // Under the lifecycle lock no runtime starts or ends meanwhile.
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let running = self.inflight(id);
        if running > 0 {
            return Err(ProvisionerError::SandboxBusy {
                sandbox: id.clone(),
                commands: running,
            });
        }
        let base = checkpoint.workdir.as_str().to_owned();
        self.restore_manifest(&record, base, checkpoint.manifest.clone())
            .await?;
        tracing::info!(sandbox = %id, checkpoint = %checkpoint.id, "workdir restored from a checkpoint");
        Ok(checkpoint)
    }

    /// Fills the new sandbox `target`'s workdir from `source`'s checkpoint: a sandbox
    /// started from another's recorded state (E2B's snapshots). Both must be of the same
    /// uid (another uid's checkpoint is not found, exactly like one that does not exist),
    /// and the target's workdir must be empty: this seeds a new workdir, it never replaces
    /// files (that is [`Provisioner::restore_checkpoint`]). Refused while a command runs in
    /// the target.
    pub async fn restore_checkpoint_into(
        &self,
        target: &SandboxId,
        source: &SandboxId,
        checkpoint: &str,
    ) -> Result<Checkpoint, ProvisionerError> {
        let not_found = || ProvisionerError::CheckpointNotFound {
            checkpoint: checkpoint.chars().take(100).collect(),
        };
        let record = self.sandbox(target).await?;
        let source_record = self
            .store
            .get_sandbox(source)
            .await?
            .ok_or_else(not_found)?;
        if source_record.uid != record.uid {
            return Err(not_found());
        }
        let found = self
            .store
            .list_checkpoints(source)
            .await?
            .into_iter()
            .find(|c| c.id == checkpoint)
            .ok_or_else(not_found)?;
        Self::refuse_restore_into_branch(&record)?;
        self.refuse_frozen_workdir(&record.uid, &record.binding.workdir)
            .await?;
        let lock = self.lifecycle_lock(target);
        let _guard = lock.lock().await;
        let running = self.inflight(target);
        if running > 0 {
            return Err(ProvisionerError::SandboxBusy {
                sandbox: target.clone(),
                commands: running,
            });
        }
        let workspace = self.workspace_of(&record);
        let base = record.binding.workdir.as_str().to_owned();
        let probe = base.clone();
        let empty = self
            .blocking(move || {
                let root = WorkspaceRoot::open(&workspace)
                    .map_err(|source| snapshot_file_error(&probe, source))?;
                let listing = root
                    .list(probe.as_str(), 1, 1)
                    .map_err(|source| snapshot_file_error(&probe, source))?;
                Ok::<_, ProvisionerError>(listing.entries.is_empty())
            })
            .await?;
        if !empty {
            return Err(ProvisionerError::BadRequest(
                "a checkpoint of another sandbox is restored only into an empty, new workdir",
            ));
        }
        self.restore_manifest(&record, base, found.manifest.clone())
            .await?;
        tracing::info!(sandbox = %target, source = %source, checkpoint = %found.id, "new workdir filled from another sandbox's checkpoint");
        Ok(found)
    }

    /// Puts the tree `base` of the sandbox's workspace back as `manifest` recorded it.
    async fn restore_manifest(
        &self,
        record: &SandboxRecord,
        base: String,
        manifest: String,
    ) -> Result<(), ProvisionerError> {
        let store = self.snapshot_store(&record.uid)?;
        let workspace = self.workspace_of(record);
        let limits = self.snapshot_limits(None);
        self.blocking(move || {
            let root = WorkspaceRoot::open(&workspace)
                .map_err(|source| snapshot_file_error(&base, source))?;
            warren_snapshot::restore_with(&root, &base, store.as_ref(), &manifest, &limits)
                .map_err(|error| snapshot_error(&base, error))
        })
        .await
    }
}

fn snapshot_file_error(workdir: &str, source: warren_fs::FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: format!("workdir {workdir}"),
        source,
    }
}

fn snapshot_error(workdir: &str, error: SnapshotError) -> ProvisionerError {
    match error {
        SnapshotError::File(source) => snapshot_file_error(workdir, source),
        other => ProvisionerError::Snapshot(other),
    }
}

#[cfg(test)]
mod tests {
    use warren_fs::{ByteRange, WriteOptions};

    use super::*;
    use crate::testing::Fixture;

    async fn sandbox_of(f: &Fixture, uid: &str, workdir: &str) -> SandboxId {
        f.sandbox(uid, &workdir.replace('/', "-"), workdir).await.id
    }

    async fn write(provisioner: &Provisioner, id: &SandboxId, path: &str, text: &str) {
        provisioner
            .write(
                id,
                path,
                text.as_bytes().to_vec(),
                WriteOptions::default(),
                false,
            )
            .await
            .unwrap();
    }

    async fn read(provisioner: &Provisioner, id: &SandboxId, path: &str) -> Option<String> {
        let read = provisioner.read(id, path, ByteRange::FULL).await.ok()?;
        Some(String::from_utf8(read.value.bytes).unwrap())
    }

    #[tokio::test]
    async fn a_checkpoint_fills_a_new_empty_workdir_of_the_same_uid_only() {
        let f = Fixture::new().await;
        let provisioner = &*f.provisioner;
        let source = sandbox_of(&f, "alice", "e2b/source").await;
        write(provisioner, &source, "a.txt", "from the source").await;
        let (checkpoint, _) = provisioner.create_checkpoint(&source).await.unwrap();

        let target = sandbox_of(&f, "alice", "e2b/target").await;
        let restored = provisioner
            .restore_checkpoint_into(&target, &source, &checkpoint.id)
            .await
            .unwrap();
        assert_eq!(restored.id, checkpoint.id);
        assert_eq!(
            read(provisioner, &target, "a.txt").await.as_deref(),
            Some("from the source")
        );
        // The source is untouched, and the target's workdir is its own from now on.
        write(provisioner, &target, "a.txt", "changed in the target").await;
        assert_eq!(
            read(provisioner, &source, "a.txt").await.as_deref(),
            Some("from the source")
        );

        // A workdir with files is never replaced this way.
        let refused = provisioner
            .restore_checkpoint_into(&target, &source, &checkpoint.id)
            .await;
        assert!(
            matches!(refused, Err(ProvisionerError::BadRequest(_))),
            "{refused:?}"
        );

        // Another uid's checkpoint is not found, like one that does not exist.
        let bob = sandbox_of(&f, "bob", "e2b/bob").await;
        let refused = provisioner
            .restore_checkpoint_into(&bob, &source, &checkpoint.id)
            .await;
        assert!(
            matches!(refused, Err(ProvisionerError::CheckpointNotFound { .. })),
            "{refused:?}"
        );
        assert_eq!(read(provisioner, &bob, "a.txt").await, None);
        let unknown = provisioner
            .restore_checkpoint_into(&target, &source, "ckpt-nope")
            .await;
        assert!(
            matches!(unknown, Err(ProvisionerError::CheckpointNotFound { .. })),
            "{unknown:?}"
        );
    }
}
