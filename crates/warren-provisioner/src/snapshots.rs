//! Runtime snapshots and resume (I30): a runtime's ephemeral state (the copy-on-write
//! layers over the root, and the layout's home, `/home/gem`, outside the persistent
//! mounts) recorded with the same engine as checkpoints, so a reaped runtime comes back
//! with its installed dependencies and files. `/tmp` is not kept. A layout whose home is
//! the persistent workdir (E2B's `/home/user`) has no ephemeral home: its snapshots
//! record an empty home, and its seeds put nothing there.
//!
//! The next use of a sandbox whose runtime was reaped (not terminated) starts the new
//! runtime from the latest snapshot of the same generation: the snapshot is restored into
//! a seed directory of the provisioner's, which the runtime's init copies into its fresh
//! layers before anything runs.
//!
//! Known limits: overlay whiteouts (files deleted from the image's or host's layer) and
//! opaque directories are not recorded, so such deletions come back after a resume.

use std::path::PathBuf;

use warren_core::SandboxId;
use warren_fs::WorkspaceRoot;
use warren_store::{RuntimeSnapshot, SandboxRecord, SandboxState};

use crate::exec::Route;
use crate::{Provisioner, ProvisionerError};

/// Runtime snapshots kept per sandbox: resume needs the latest; a few more allow a
/// `from_snapshot` of recent states. Older ones go, with their unshared chunks.
const KEEP_RUNTIME_SNAPSHOTS: usize = 5;

impl Provisioner {
    /// Records the running runtime's ephemeral state. `reason` says why (`api`, `reap`).
    /// Holes of sparse files are recorded, not read; more file data than
    /// `snapshot_max_bytes` fails with `snapshot_too_large`.
    ///
    /// The runtime's owner takes it (issue 14): asked of another replica, the snapshot is
    /// forwarded there and its record read back from the shared store.
    pub async fn snapshot_runtime(
        &self,
        id: &SandboxId,
        reason: &str,
    ) -> Result<RuntimeSnapshot, ProvisionerError> {
        self.snapshot_routed(id, reason, Route::ToOwner).await
    }

    /// [`Provisioner::snapshot_runtime`] forwarded here by another node: only here.
    pub async fn snapshot_runtime_as_owner(
        &self,
        id: &SandboxId,
        reason: &str,
    ) -> Result<RuntimeSnapshot, ProvisionerError> {
        self.snapshot_routed(id, reason, Route::HereOnly).await
    }

    async fn snapshot_routed(
        &self,
        id: &SandboxId,
        reason: &str,
        route: Route,
    ) -> Result<RuntimeSnapshot, ProvisionerError> {
        let record = self.sandbox(id).await?;
        // A pause snapshots the runtime it is about to end.
        if !matches!(record.state, SandboxState::Running | SandboxState::Pausing) {
            return Err(ProvisionerError::RuntimeNotRunning {
                sandbox: id.clone(),
            });
        }
        match self.place_for(id, route).await? {
            Ok(_) => self.snapshot_runtime_within(id, reason, None).await,
            Err(owner) => {
                self.metrics.forwarded();
                let taken = self.peer_link()?.snapshot_runtime(&owner, id, reason).await;
                let snapshot_id = self.after_forward(id, taken)?;
                self.store.get_runtime_snapshot(&snapshot_id).await?.ok_or(
                    ProvisionerError::SnapshotNotFound {
                        snapshot: snapshot_id,
                    },
                )
            }
        }
    }

    /// [`Provisioner::snapshot_runtime`] that stops (`snapshot_cancelled`) once `deadline`
    /// passes: the reaper's bound per sandbox.
    pub(crate) async fn snapshot_runtime_within(
        &self,
        id: &SandboxId,
        reason: &str,
        deadline: Option<std::time::Instant>,
    ) -> Result<RuntimeSnapshot, ProvisionerError> {
        self.snapshot_runtime_with(id, reason, self.snapshot_limits(deadline))
            .await
    }

    /// A runtime snapshot under explicit limits (a drain's are not cancelled by the
    /// shutdown that asked for it).
    pub(crate) async fn snapshot_runtime_with(
        &self,
        id: &SandboxId,
        reason: &str,
        limits: warren_snapshot::SnapshotLimits,
    ) -> Result<RuntimeSnapshot, ProvisionerError> {
        let record = self.sandbox(id).await?;
        // A pause snapshots the runtime it is about to end.
        if !matches!(record.state, SandboxState::Running | SandboxState::Pausing) {
            return Err(ProvisionerError::RuntimeNotRunning {
                sandbox: id.clone(),
            });
        }
        // Only the owner snapshots its runtime, and records it under its token (issue 14).
        let fence = self
            .owner_fence(id)
            .ok_or_else(|| ProvisionerError::NotOwnerHere {
                sandbox: id.clone(),
            })?;
        let roots = self
            .backend
            .ephemeral_roots(id)
            .await
            .map_err(ProvisionerError::Backend)?
            .ok_or(ProvisionerError::SnapshotUnsupported {
                backend: record.binding.backend.as_str(),
            })?;
        let parent = self
            .store
            .list_runtime_snapshots(id)
            .await?
            .pop()
            .filter(|snapshot| snapshot.generation == record.generation);
        let store = self.snapshot_store(&record.uid)?;
        let started = std::time::Instant::now();
        // A home that is the persistent workdir is not ephemeral state (I30): the snapshot
        // records an empty directory of warren's in its place, removed afterwards.
        let empty_home = match &roots.home {
            Some(_) => None,
            None => Some(
                self.layout()
                    .data_dir()
                    .join("seeds")
                    .join(format!(".empty-home-{}", uuid::Uuid::new_v4().simple())),
            ),
        };
        let home_path = roots
            .home
            .clone()
            .or_else(|| empty_home.clone())
            .expect("either the runtime's home or an empty one");
        let (cow, home, bytes) = self
            .blocking(move || {
                let open = |path: &PathBuf, what: &str| {
                    WorkspaceRoot::open(path)
                        .map(WorkspaceRoot::read_only)
                        .map_err(|source| ProvisionerError::File {
                            path: what.to_owned(),
                            source,
                        })
                };
                // One limit for both trees: the runtime's ephemeral state as a whole.
                let mut limits = limits;
                let mut snap = |root: &WorkspaceRoot, parent: Option<&str>| {
                    let (id, stats) =
                        warren_snapshot::snapshot_with(root, "", store.as_ref(), parent, &limits)
                            .map_err(ProvisionerError::Snapshot)?;
                    limits.max_bytes = limits.max_bytes.saturating_sub(stats.bytes_read);
                    Ok::<_, ProvisionerError>((id, stats))
                };
                let cow_root = open(&roots.cow, "the runtime's copy-on-write layer")?;
                if let Some(empty) = &empty_home {
                    std::fs::create_dir_all(empty).map_err(|source| ProvisionerError::File {
                        path: "an empty home".to_owned(),
                        source: warren_fs::FsError::RootUnavailable { errno: source },
                    })?;
                }
                let taken = (|| {
                    let home_root = open(&home_path, "the runtime's home")?;
                    let (cow, cow_stats) =
                        snap(&cow_root, parent.as_ref().map(|p| p.cow_manifest.as_str()))?;
                    let (home, home_stats) = snap(
                        &home_root,
                        parent.as_ref().map(|p| p.home_manifest.as_str()),
                    )?;
                    Ok((cow, home, cow_stats.bytes_read + home_stats.bytes_read))
                })();
                if let Some(empty) = &empty_home {
                    let _ = std::fs::remove_dir(empty);
                }
                taken
            })
            .await?;
        let snapshot = self
            .store
            .record_runtime_snapshot(
                &RuntimeSnapshot {
                    id: format!("snap-{}", uuid::Uuid::new_v4().simple()),
                    sandbox_id: id.clone(),
                    generation: record.generation,
                    cow_manifest: cow,
                    home_manifest: home,
                    bytes,
                    reason: reason.to_owned(),
                    created_at: chrono::Utc::now(),
                },
                Some(&fence),
            )
            .await?;
        tracing::info!(sandbox = %id, snapshot = %snapshot.id, %reason, bytes, elapsed_ms = started.elapsed().as_millis() as u64, "runtime snapshot recorded");
        let all = self.store.list_runtime_snapshots(id).await?;
        let excess = all.len().saturating_sub(KEEP_RUNTIME_SNAPSHOTS);
        if excess > 0 {
            for old in &all[..excess] {
                self.store.delete_runtime_snapshot(&old.id).await?;
            }
            self.collect_snapshot_garbage(&record.uid).await?;
        }
        Ok(snapshot)
    }

    /// The sandbox's runtime snapshots, oldest first.
    pub async fn list_runtime_snapshots(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<RuntimeSnapshot>, ProvisionerError> {
        self.sandbox(id).await?;
        Ok(self.store.list_runtime_snapshots(id).await?)
    }

    /// For a runtime about to start: the seed directory restored from the latest snapshot
    /// of this generation, when the sandbox's previous runtime was reaped (a terminated
    /// sandbox starts afresh). `None` when there is nothing to resume from.
    pub(crate) async fn resume_seed(
        &self,
        record: &SandboxRecord,
    ) -> Result<Option<PathBuf>, ProvisionerError> {
        if !self.config.resume_from_snapshots {
            return Ok(None);
        }
        let own = self
            .store
            .list_runtime_snapshots(&record.id)
            .await?
            .pop()
            .filter(|snapshot| snapshot.generation == record.generation);
        // Before its own first snapshot, a generation created "from_snapshot" starts there.
        let seeded = match (&own, &record.seed_snapshot) {
            (None, Some(id)) => self.store.get_runtime_snapshot(id).await?,
            _ => None,
        };
        let Some(snapshot) = own.or(seeded) else {
            return Ok(None);
        };
        let store = self.snapshot_store(&record.uid)?;
        let seeds = self.layout().data_dir().join("seeds");
        let name = format!("{}-{}", record.id, uuid::Uuid::new_v4().simple());
        let data_dir = self.layout().data_dir().to_owned();
        let seed = seeds.join(&name);
        let limits = self.snapshot_limits(None);
        self.blocking(move || {
            let data = WorkspaceRoot::open(&data_dir)
                .map_err(seed_error)?
                .with_owner(None);
            data.mkdir_p(&format!("seeds/{name}/cow"))
                .map_err(seed_error)?;
            // The seed keeps owners as the snapshot had them (the sandbox user's files),
            // which is what the restore gives files under a root-run provisioner.
            let root = WorkspaceRoot::open(&seeds.join(&name)).map_err(seed_error)?;
            for (tree, manifest) in [
                ("cow", &snapshot.cow_manifest),
                ("home", &snapshot.home_manifest),
            ] {
                if let Err(error) = warren_snapshot::restore_transient_with(
                    &root,
                    tree,
                    store.as_ref(),
                    manifest,
                    &limits,
                ) {
                    // A seed half restored is of no use (the runtime starts cold).
                    let _ = data.remove(&format!("seeds/{name}"), true);
                    return Err(ProvisionerError::Snapshot(error));
                }
            }
            Ok(())
        })
        .await?;
        tracing::info!(sandbox = %record.id, "resuming the runtime from its latest snapshot");
        Ok(Some(seed))
    }
}

fn seed_error(source: warren_fs::FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: "the runtime seed".to_owned(),
        source,
    }
}
