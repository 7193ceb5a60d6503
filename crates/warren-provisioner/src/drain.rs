//! Draining a node (issue 14): before a replica stops, every runtime it owns is
//! snapshotted to the shared store (I30), destroyed, marked stopped and given back, so
//! the next request on any replica resumes it there with its installed packages and
//! `/home/gem`. A rolling restart of every replica loses no runtime state that way; the
//! workspace is on the shared filesystem and was never at stake (I15).

use std::time::{Duration, Instant};

use futures::StreamExt;
use warren_core::SandboxId;
use warren_store::SandboxState;

use crate::transitions::LifeEvent;
use crate::{Provisioner, ProvisionerError};

/// What a drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Runtimes snapshotted and handed back.
    pub handed_back: usize,
    /// Runtimes handed back without a snapshot (it failed or ran out of time; logged):
    /// their workspace is kept, their `/home/gem` since the latest snapshot is not.
    pub without_snapshot: usize,
    /// Runtimes that could not be handed back (logged); their lease lapses and another
    /// node takes them over from their latest snapshot.
    pub failed: usize,
}

impl Provisioner {
    /// Hands back every runtime this node owns, `reap_concurrency` at a time, each
    /// snapshot bounded by `per_runtime`.
    pub async fn drain(&self, per_runtime: Duration) -> DrainReport {
        let owned = self.ownership.owned_ids();
        tracing::info!(
            runtimes = owned.len(),
            "draining: snapshotting and handing back every runtime this node owns"
        );
        let outcomes: Vec<_> = futures::stream::iter(owned)
            .map(|id| async move {
                let outcome = self.drain_one(&id, Instant::now() + per_runtime).await;
                (id, outcome)
            })
            .buffer_unordered(self.config.reap_concurrency.max(1))
            .collect()
            .await;
        let mut report = DrainReport::default();
        for (id, outcome) in outcomes {
            match outcome {
                Ok(true) => report.handed_back += 1,
                Ok(false) => report.without_snapshot += 1,
                Err(error) => {
                    tracing::error!(sandbox = %id, %error, "could not hand a runtime back; its lease will lapse and another node takes it over");
                    report.failed += 1;
                }
            }
        }
        report
    }

    /// Snapshots, destroys and gives back one runtime; whether the snapshot was taken.
    async fn drain_one(&self, id: &SandboxId, deadline: Instant) -> Result<bool, ProvisionerError> {
        let record = self.sandbox(id).await?;
        let mut snapshotted = false;
        if record.state == SandboxState::Running {
            let limits = warren_snapshot::SnapshotLimits {
                max_bytes: self.config.snapshot_max_bytes,
                cancel: None,
                deadline: Some(deadline),
            };
            match self.snapshot_runtime_with(id, "drain", limits).await {
                Ok(_) => snapshotted = true,
                Err(ProvisionerError::SnapshotUnsupported { .. }) => snapshotted = true,
                Err(error) => {
                    tracing::warn!(sandbox = %id, %error, "could not snapshot a runtime while draining; handing it back without: what changed in /home/gem since its latest snapshot is lost");
                }
            }
        }
        let lock = self.lifecycle_lock(id);
        let _held = lock.lock().await;
        let Some(fence) = self.owner_fence(id) else {
            return Ok(snapshotted);
        };
        self.backend
            .destroy(id)
            .await
            .map_err(ProvisionerError::Backend)?;
        // Read again under the lock: a pause or termination may have moved it since.
        let current = self.sandbox(id).await?;
        let moved =
            if current.generation == record.generation && current.state == SandboxState::Running {
                self.advance(&current, LifeEvent::Reclaim, Some(&fence))
                    .await
            } else {
                Ok(None)
            };
        match moved {
            Ok(_) => self.release_runtime(id).await,
            Err(ProvisionerError::Store(warren_store::StoreError::NotOwner { .. })) => {
                self.ownership_lost(id)
            }
            Err(error) => return Err(error),
        }
        Ok(snapshotted)
    }
}
