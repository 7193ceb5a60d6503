//! Leases and idle reaping (I25, I15, I17): a runtime lives while a run holds a lease on it,
//! a command runs in it, or a process it started still works; otherwise it is reclaimed
//! after the idle timeout, and always after its maximum lifetime. Reaping ends processes
//! and ephemeral state only; workspace files stay.

use std::time::Duration;

use warren_core::SandboxId;
use warren_store::{Lease, SandboxState};

use crate::metrics::{FailureCause, ReapReason};
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
        crate::exec::refuse_fenced(&record)?;
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
        crate::exec::refuse_fenced(&record)?;
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

    /// One pass of the reaper over every running sandbox.
    pub async fn reap(&self) -> Result<ReapReport, ProvisionerError> {
        let mut report = ReapReport::default();
        let now = chrono::Utc::now();
        for record in self.store.list_sandboxes(None).await? {
            if record.state != SandboxState::Running {
                continue;
            }
            let age = (now - record.created_at).to_std().unwrap_or_default();
            let expired = age > self.config.max_lifetime;
            if !expired {
                if self.inflight(&record.id) > 0
                    || self
                        .store
                        .live_leases(&record.id, record.generation)
                        .await?
                        > 0
                {
                    continue;
                }
                // A process still running (a server, a build in the background) is
                // activity, whatever the API saw.
                let processes = self
                    .backend
                    .processes(&record.id)
                    .await
                    .map_err(ProvisionerError::Backend)?;
                if processes.is_some_and(|n| n > 0) {
                    self.store.touch_sandbox(&record.id).await?;
                    continue;
                }
                let idle = (now - record.last_active_at).to_std().unwrap_or_default();
                if idle < self.config.idle_timeout {
                    continue;
                }
            }
            let reclaimed = if record.ephemeral {
                // An ephemeral sandbox is a temporary scope: nothing of it is worth keeping
                // for a next use, so reaping ends it, scratch tree and all (I14).
                let after = self
                    .terminate(&record.id, Duration::ZERO, Some(record.generation))
                    .await?;
                after.state == SandboxState::Terminated && after.generation == record.generation
            } else {
                if self.config.snapshot_before_reap {
                    // Best effort: a runtime that cannot be recorded is still reclaimed.
                    match self.snapshot_runtime(&record.id, "reap").await {
                        Ok(_) => {}
                        // A backend without runtime snapshots (Docker): nothing to record.
                        Err(ProvisionerError::SnapshotUnsupported { .. }) => {}
                        Err(error) => {
                            tracing::warn!(sandbox = %record.id, %error, "could not snapshot the runtime before reaping it");
                        }
                    }
                }
                self.reclaim(&record.id, record.generation).await?
            };
            if reclaimed {
                tracing::info!(sandbox = %record.id, expired, "reaped a runtime; workspace kept");
                self.metrics.reaped(if expired {
                    ReapReason::MaxLifetime
                } else {
                    ReapReason::Idle
                });
                if expired {
                    report.expired.push(record.id);
                } else {
                    report.idle.push(record.id);
                }
            }
        }
        Ok(report)
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
        if let Err(error) = self.backend.destroy(id).await {
            self.metrics.failed(FailureCause::Destroy);
            return Err(ProvisionerError::Backend(error));
        }
        self.store
            .set_sandbox_state(id, generation, SandboxState::Stopped)
            .await?;
        Ok(true)
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
