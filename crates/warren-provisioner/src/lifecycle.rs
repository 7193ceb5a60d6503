//! Leases and idle reaping (I25, I15, I17): a runtime lives while a run holds a lease on it,
//! a command runs in it, or a process it started still works; otherwise it is reclaimed
//! after the idle timeout, and always after its maximum lifetime. Reaping ends processes
//! and ephemeral state only; workspace files stay.

use std::sync::Arc;
use std::time::Duration;

use warren_core::SandboxId;
use warren_snapshot::SnapshotError;
use warren_store::{Lease, SandboxRecord, SandboxState};

use crate::metrics::{FailureCause, ReapReason};
use crate::transitions::LifeEvent;
use crate::{Provisioner, ProvisionerError};

/// Longest lease a holder may ask for at once; it renews for longer.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);

/// What one reaper pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Runtimes reclaimed because nobody used them for the idle timeout.
    pub idle: Vec<SandboxId>,
    /// Runtimes reclaimed because they reached their maximum lifetime.
    pub expired: Vec<SandboxId>,
}

impl Provisioner {
    /// Takes a lease for `holder` (a run id) on the sandbox's current generation.
    pub async fn acquire_lease(
        &self,
        id: &SandboxId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Lease, ProvisionerError> {
        check_lease_request(holder, ttl)?;
        let record = self.sandbox(id).await?;
        crate::transitions::refuse_unless_runnable(&record)?;
        Ok(self
            .store
            .create_lease(id, record.generation, holder, ttl)
            .await?)
    }

    /// Extends a live lease; an expired or unknown one is 404 (take a new one).
    pub async fn renew_lease(
        &self,
        id: &SandboxId,
        lease: &str,
        ttl: Duration,
    ) -> Result<Lease, ProvisionerError> {
        check_lease_request("renewal", ttl)?;
        let record = self.sandbox(id).await?;
        crate::transitions::refuse_unless_runnable(&record)?;
        self.store
            .renew_lease(id, lease, ttl)
            .await?
            .ok_or_else(|| ProvisionerError::LeaseNotFound {
                lease: lease.chars().take(100).collect(),
            })
    }

    /// Ends a lease.
    pub async fn release_lease(&self, id: &SandboxId, lease: &str) -> Result<(), ProvisionerError> {
        self.sandbox(id).await?;
        if self.store.release_lease(id, lease).await? {
            Ok(())
        } else {
            Err(ProvisionerError::LeaseNotFound {
                lease: lease.chars().take(100).collect(),
            })
        }
    }

    /// Starts the reaper: a pass every `interval`, each in a task of its own, so a pass
    /// still busy with a slow sandbox never holds the next one up (the sandbox itself is
    /// left to the pass that has it). Stops once the provisioner shuts down.
    pub fn spawn_reaper(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let provisioner = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if provisioner.is_shutting_down() {
                    return;
                }
                let pass = Arc::clone(&provisioner);
                tokio::spawn(async move {
                    if let Err(error) = pass.reap().await {
                        tracing::warn!(%error, "a reaper pass failed");
                    }
                });
            }
        })
    }

    /// One pass of the reaper over every running sandbox. Sandboxes are worked on
    /// concurrently, at most `reap_concurrency` at once across all passes, and one that
    /// another pass is still working on is skipped: one slow sandbox (a big snapshot)
    /// never delays another. A sandbox's snapshot gets `reap_deadline`; a snapshot that
    /// fails or runs out of time does not keep the runtime alive (see `reap_one`).
    pub async fn reap(&self) -> Result<ReapReport, ProvisionerError> {
        let mut report = ReapReport::default();
        if self.is_shutting_down() {
            return Ok(report);
        }
        let all = self.store.list_sandboxes(None).await?;
        // A pause whose pauser died (a replica gone mid-pause) is finished here: by the
        // node that owns its runtime, or by any node when nobody does.
        let stale_after = self
            .config
            .stale_pause_after
            .max(self.config.reap_deadline * 2);
        let now = chrono::Utc::now();
        for record in all
            .iter()
            .filter(|record| is_stale_pause(record, now, stale_after))
        {
            if let Err(error) = self.finish_stale_pause(record.clone()).await {
                tracing::warn!(sandbox = %record.id, %error, "could not finish a pause left behind");
            }
        }
        let running: Vec<SandboxRecord> = all
            .into_iter()
            .filter(|record| record.state == SandboxState::Running)
            // Each node reaps the runtimes it owns (issue 14).
            .filter(|record| self.owner_fence(&record.id).is_some())
            .collect();
        // What was remembered of runtimes that have ended since goes.
        let ids: std::collections::HashSet<&SandboxId> =
            running.iter().map(|record| &record.id).collect();
        self.fork_refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| ids.contains(id));
        let claimed: Vec<(SandboxRecord, ReapClaim<'_>)> = running
            .into_iter()
            .filter_map(|record| {
                let claim = self.claim_for_reaping(&record.id)?;
                Some((record, claim))
            })
            .collect();
        let outcomes = futures::future::join_all(
            claimed
                .into_iter()
                .map(|(record, claim)| self.reap_one(record, claim)),
        )
        .await;
        for outcome in outcomes {
            match outcome {
                Ok(Some((id, true))) => report.expired.push(id),
                Ok(Some((id, false))) => report.idle.push(id),
                Ok(None) => {}
                Err((id, error)) => {
                    tracing::warn!(sandbox = %id, %error, "the reaper could not finish with a sandbox");
                }
            }
        }
        Ok(report)
    }

    /// Marks the sandbox as being worked on by a reaper pass; `None` when one already is.
    fn claim_for_reaping(&self, id: &SandboxId) -> Option<ReapClaim<'_>> {
        let mut reaping = self.reaping.lock().unwrap_or_else(|e| e.into_inner());
        reaping.insert(id.clone()).then(|| ReapClaim {
            provisioner: self,
            sandbox: id.clone(),
        })
    }

    /// Decides whether one running sandbox's runtime is reclaimed, and reclaims it. Returns
    /// the sandbox and whether it had expired when it was reclaimed.
    ///
    /// Before a runtime is reclaimed it is snapshotted (I30), within `reap_deadline`. When
    /// the snapshot fails (over `[snapshots] max_bytes`, out of time, a store error) the
    /// runtime is reclaimed all the same: its workspace is kept as always (I15), but what
    /// changed in `/home/gem` and the copy-on-write layers since its latest snapshot is
    /// lost (the next runtime resumes from the latest snapshot that succeeded, or starts
    /// cold); a warning is logged and `warren_failures_total{cause="snapshot"}` counts it.
    /// Only a shutdown stops the reap: the runtime stays for the next server to adopt.
    async fn reap_one(
        &self,
        record: SandboxRecord,
        _claim: ReapClaim<'_>,
    ) -> Result<Option<(SandboxId, bool)>, (SandboxId, ProvisionerError)> {
        let id = record.id.clone();
        // The semaphore is never closed.
        let Ok(_slot) = self.reap_slots.acquire().await else {
            return Ok(None);
        };
        if self.is_shutting_down() {
            return Ok(None);
        }
        let deadline = std::time::Instant::now() + self.config.reap_deadline;
        let reclaimed = async {
            let now = chrono::Utc::now();
            let age = (now - record.created_at).to_std().unwrap_or_default();
            let expired = age > self.config.max_lifetime;
            if !expired && !self.is_idle(&record, now).await? {
                return Ok(None);
            }
            let reclaimed = if record.binding.ephemeral {
                // An ephemeral sandbox is a temporary scope: nothing of it is worth keeping
                // for a next use, so reaping ends it, scratch tree and all (I14).
                let after = self
                    .terminate(&record.id, Duration::ZERO, Some(record.generation))
                    .await?;
                after.state == SandboxState::Terminated && after.generation == record.generation
            } else {
                if self.config.snapshot_before_reap {
                    match self
                        .snapshot_runtime_within(&record.id, "reap", Some(deadline))
                        .await
                    {
                        Ok(_) => {}
                        // A backend without runtime snapshots (Docker): nothing to record.
                        Err(ProvisionerError::SnapshotUnsupported { .. }) => {}
                        Err(ProvisionerError::Snapshot(SnapshotError::Cancelled { .. }))
                            if self.is_shutting_down() =>
                        {
                            return Ok(None);
                        }
                        Err(error) => {
                            self.metrics.failed(FailureCause::Snapshot);
                            tracing::warn!(sandbox = %record.id, %error, "could not snapshot the runtime before reaping it; reaping it anyway: the workspace is kept, what changed in /home/gem and installed packages since its latest snapshot is not");
                        }
                    }
                }
                self.reclaim(&record.id, record.generation).await?
            };
            Ok::<_, ProvisionerError>(reclaimed.then_some(expired))
        }
        .await
        .map_err(|error| (id.clone(), error))?;
        let Some(expired) = reclaimed else {
            return Ok(None);
        };
        tracing::info!(sandbox = %id, expired, "reaped a runtime; workspace kept");
        self.metrics.reaped(if expired {
            ReapReason::MaxLifetime
        } else {
            ReapReason::Idle
        });
        Ok(Some((id, expired)))
    }

    /// Whether nothing keeps the runtime: no command, no live lease, no running process
    /// (an idle code kernel is none), and no API use for the idle timeout.
    async fn is_idle(
        &self,
        record: &SandboxRecord,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, ProvisionerError> {
        // Taken out: a check that does not look at the pids limit again forgets it, so a
        // count is only ever compared with the look just before.
        let refused_before = self.take_fork_refusals(record);
        if self.inflight(&record.id) > 0
            || self
                .store
                .live_leases(&record.id, record.generation)
                .await?
                > 0
        {
            return Ok(false);
        }
        // A process still running (a server, a build in the background) is activity,
        // whatever the API saw; but not a runtime pinned at its pids limit with no command
        // running: that is a fork bomb that outlived its command, which can start nothing
        // and would otherwise hold the runtime for its whole lifetime.
        // Idle kernels wait for work: their trees are no activity (an execution holds the
        // sandbox busy through `inflight` instead).
        let quiet = self.processes.quiet_pids(&record.id);
        let processes = self
            .backend
            .processes(&record.id, &quiet)
            .await
            .map_err(ProvisionerError::Backend)?;
        if processes.is_some_and(|n| n > 0)
            && !self.pinned_at_pids_limit(record, refused_before).await?
        {
            self.store.touch_sandbox(&record.id).await?;
            return Ok(false);
        }
        let idle = (now - record.last_active_at).to_std().unwrap_or_default();
        Ok(idle >= self.config.idle_timeout)
    }

    /// Ends the runtime of `generation` if the sandbox still runs it, under the lifecycle
    /// lock; the sandbox becomes `stopped` and its next exec starts a fresh runtime.
    async fn reclaim(&self, id: &SandboxId, generation: i64) -> Result<bool, ProvisionerError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let current = self.sandbox(id).await?;
        if current.state != SandboxState::Running || current.generation != generation {
            return Ok(false);
        }
        let Some(fence) = self.owner_fence(id) else {
            return Ok(false);
        };
        if let Err(error) = self.backend.destroy(id).await {
            self.metrics.failed(FailureCause::Destroy);
            return Err(ProvisionerError::Backend(error));
        }
        match self
            .advance(&current, LifeEvent::Reclaim, Some(&fence))
            .await
        {
            Ok(_) => self.release_runtime(id).await,
            Err(ProvisionerError::Store(warren_store::StoreError::NotOwner { .. })) => {
                self.ownership_lost(id)
            }
            Err(error) => return Err(error),
        }
        Ok(true)
    }
}

impl Provisioner {
    /// Whether the runtime's tasks are pinned at its pids limit (see [`pinned`]), given how
    /// many forks the limit had refused at the previous look (`before`). A few samples are
    /// taken, up to the first at the limit; the count the last one shows is remembered for
    /// the next look.
    async fn pinned_at_pids_limit(
        &self,
        record: &SandboxRecord,
        before: Option<u64>,
    ) -> Result<bool, ProvisionerError> {
        let mut samples = Vec::with_capacity(PIDS_SAMPLES);
        for sample in 0..PIDS_SAMPLES {
            if sample > 0 {
                tokio::time::sleep(PIDS_SAMPLE_GAP).await;
            }
            match self
                .backend
                .process_pressure(&record.id)
                .await
                .map_err(ProvisionerError::Backend)?
            {
                Some(pressure) => {
                    samples.push(pressure);
                    if pressure.at_limit() {
                        break;
                    }
                }
                // The backend cannot tell: nothing to go on.
                None => return Ok(false),
            }
        }
        if let Some(count) = samples.last().and_then(|pressure| pressure.refused) {
            self.fork_refusals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(record.id.clone(), (record.generation, count));
        }
        Ok(pinned(&samples, before))
    }

    /// Takes what the previous look saw of the forks the runtime's pids limit refused.
    fn take_fork_refusals(&self, record: &SandboxRecord) -> Option<u64> {
        self.fork_refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&record.id)
            // A count of an earlier runtime of the sandbox says nothing about this one.
            .filter(|(generation, _)| *generation == record.generation)
            .map(|(_, count)| count)
    }
}

/// Whether a runtime whose process pressure was sampled as `samples`, one after another, is
/// pinned at its pids limit: it can start nothing, so its processes are no activity.
///
/// One sample at the limit is enough. But a fork bomb's processes die and are replaced all
/// the time (a dash process exits when its fork is refused), so the count dips below the
/// limit and climbs back; on a loaded machine the climb may outlast every sample, and a
/// pass that took the bomb for work would start the idle timeout again. So forks the limit
/// refused count too: any since `before` (what the previous look saw) or, without it,
/// during the samples, mean the limit was hit again in between.
fn pinned(samples: &[warren_backend::ProcessPressure], before: Option<u64>) -> bool {
    if samples
        .iter()
        .any(warren_backend::ProcessPressure::at_limit)
    {
        return true;
    }
    let first = before.or_else(|| samples.first().and_then(|pressure| pressure.refused));
    let last = samples.last().and_then(|pressure| pressure.refused);
    matches!((first, last), (Some(first), Some(last)) if last > first)
}

/// Whether `record` has been `pausing` for longer than `after`: its pauser died.
fn is_stale_pause(
    record: &SandboxRecord,
    now: chrono::DateTime<chrono::Utc>,
    after: Duration,
) -> bool {
    let after = chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
    record.state == SandboxState::Pausing && now - record.updated_at > after
}

/// How many times, and how far apart, [`Provisioner::pinned_at_pids_limit`] looks.
const PIDS_SAMPLES: usize = 5;
const PIDS_SAMPLE_GAP: Duration = Duration::from_millis(20);

/// See [`Provisioner::claim_for_reaping`]: releases the sandbox when dropped.
struct ReapClaim<'a> {
    provisioner: &'a Provisioner,
    sandbox: SandboxId,
}

impl Drop for ReapClaim<'_> {
    fn drop(&mut self) {
        let mut reaping = self
            .provisioner
            .reaping
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        reaping.remove(&self.sandbox);
    }
}

fn check_lease_request(holder: &str, ttl: Duration) -> Result<(), ProvisionerError> {
    if holder.is_empty() || holder.len() > 256 || holder.chars().any(char::is_control) {
        return Err(ProvisionerError::BadRequest(
            "holder must be 1 to 256 printable characters (a run id)",
        ));
    }
    if ttl.is_zero() || ttl > MAX_LEASE_TTL {
        return Err(ProvisionerError::BadRequest(
            "ttl_s must be between 1 and 3600 seconds; renew for longer",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use warren_backend::ProcessPressure;

    use super::pinned;

    fn sample(current: u64, refused: Option<u64>) -> ProcessPressure {
        ProcessPressure {
            current,
            max: Some(64),
            refused,
        }
    }

    #[test]
    fn one_sample_at_the_limit_is_pinned() {
        assert!(pinned(&[sample(40, None), sample(64, None)], None));
        assert!(pinned(&[sample(64, Some(9))], Some(9)));
    }

    #[test]
    fn a_bomb_climbing_back_through_every_sample_is_pinned_by_the_forks_refused_meanwhile() {
        // A reaper pass that found a bomb below its limit of 64 at every sample, on a
        // loaded machine: it had been refused forks since the pass before.
        let climbing = [43, 48, 51, 55, 58].map(|n| sample(n, Some(4146)));
        assert!(pinned(&climbing, Some(3947)));
        // Without a pass before: refused during the samples.
        assert!(pinned(&[sample(58, Some(10)), sample(61, Some(12))], None));
        assert!(!pinned(&climbing, None));
    }

    #[test]
    fn processes_below_the_limit_refused_nothing_are_not_pinned() {
        let busy = [sample(12, Some(5)), sample(13, Some(5))];
        assert!(!pinned(&busy, Some(5)));
        assert!(!pinned(&busy, None));
        // A backend that does not count refusals.
        assert!(!pinned(&[sample(63, None)], Some(3)));
        // Fewer than before: a leaf that counted some was removed.
        assert!(!pinned(&[sample(10, Some(2))], Some(7)));
        let unlimited = ProcessPressure {
            current: 1000,
            max: None,
            refused: Some(0),
        };
        assert!(!pinned(&[unlimited], Some(0)));
    }
}

#[cfg(test)]
mod reaper_tests;
