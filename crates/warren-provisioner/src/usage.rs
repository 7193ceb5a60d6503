//! What a sandbox consumes, for transports that report it (E2B's sandbox metrics): its
//! runtime's CPU and memory as the backend's kernel accounts them (I22), and the disk its
//! workspace lives on.
//!
//! Both are read where they are asked and only here: a runtime another node of a cluster
//! owns is not measured (`None`), as no peer link operation carries the figures yet
//! (`PeerLink` forwards only what changes a runtime).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use warren_backend::RuntimeUsage;
use warren_core::SandboxId;

use crate::{Provisioner, ProvisionerError};

/// The filesystem a sandbox's workspace lives on, in bytes: what `df` shows inside the
/// runtime for its workdir. With storage quotas enforced that is the uid's own volume
/// (I23); otherwise the data filesystem every uid shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxDisk {
    /// Bytes in use (the filesystem's blocks less its free ones).
    pub used_bytes: u64,
    /// The filesystem's size.
    pub total_bytes: u64,
}

/// A runtime's figures, with the CPU time it used over a recent interval: what a rate
/// ("percent of a CPU now") is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageSample {
    /// The figures now.
    pub usage: RuntimeUsage,
    /// CPU time used over `interval`, microseconds.
    pub cpu_used_usec: u64,
    /// How long `cpu_used_usec` was used over.
    pub interval: Duration,
}

/// How far apart the two samples of a sandbox without a recent one are taken.
pub const FRESH_GAP: Duration = Duration::from_millis(100);

/// The oldest previous sample a CPU percentage is computed from: over a longer interval
/// the average says little about "now", so two fresh samples are taken instead.
const MAX_SAMPLE_AGE: Duration = Duration::from_secs(10);

/// How many sandboxes' previous samples are kept (the oldest go first).
const MAX_SAMPLES: usize = 4096;

impl Provisioner {
    /// [`Provisioner::runtime_usage`] with the CPU time used since the previous sample of
    /// the sandbox this node took, when it is recent; otherwise two samples
    /// [`FRESH_GAP`] apart are taken. `None` as for `runtime_usage`.
    pub async fn sample_usage(
        &self,
        id: &SandboxId,
    ) -> Result<Option<UsageSample>, ProvisionerError> {
        let Some(first) = self.runtime_usage(id).await? else {
            return Ok(None);
        };
        let taken = Instant::now();
        let previous = self.cpu_samples().swap(id, taken, first.cpu_usage_usec);
        if let Some((at, usec)) = previous {
            return Ok(Some(UsageSample {
                usage: first,
                cpu_used_usec: first.cpu_usage_usec.saturating_sub(usec),
                interval: taken - at,
            }));
        }
        // No recent sample: a second one a moment later gives the rate now.
        tokio::time::sleep(FRESH_GAP).await;
        let Some(second) = self.runtime_usage(id).await? else {
            return Ok(None);
        };
        let at = Instant::now();
        self.cpu_samples().swap(id, at, second.cpu_usage_usec);
        Ok(Some(UsageSample {
            usage: second,
            // A smaller figure is a new runtime: nothing to compare with.
            cpu_used_usec: second.cpu_usage_usec.saturating_sub(first.cpu_usage_usec),
            interval: at - taken,
        }))
    }

    fn cpu_samples(&self) -> std::sync::MutexGuard<'_, CpuSamples> {
        // Counters only: a panic elsewhere leaves nothing inconsistent.
        self.cpu_samples.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the sandbox's runtime consumes now, with the limits its backend enforces
    /// (I22, I23), from the backend hosting it ([`warren_backend::Backend::usage`]).
    /// `None` when no runtime of the sandbox runs (never started, reaped, terminated),
    /// when it runs on another node of a cluster (this is local-only, see the module),
    /// or when its backend cannot measure it. Reading starts nothing and counts as no
    /// activity: asking for figures never keeps a runtime from the reaper.
    pub async fn runtime_usage(
        &self,
        id: &SandboxId,
    ) -> Result<Option<RuntimeUsage>, ProvisionerError> {
        // An unknown sandbox is an error; whether a runtime runs is the backend's to say
        // (a record's state may lag a runtime that died), and it answers `None` cheaply.
        self.sandbox(id).await?;
        self.backend
            .usage(id)
            .await
            .map_err(ProvisionerError::Backend)
    }

    /// The filesystem the sandbox's workspace lives on ([`SandboxDisk`]), read with
    /// `statvfs`: constant time, whatever the workspace holds. Before the uid's workspace
    /// exists, the data directory's filesystem, where it will be made. `None` when
    /// neither can be read (logged).
    pub async fn sandbox_disk(
        &self,
        id: &SandboxId,
    ) -> Result<Option<SandboxDisk>, ProvisionerError> {
        let record = self.sandbox(id).await?;
        let (workspace, _) = self.mounts(&record);
        let fallback = self.layout().workspace_dir().to_path_buf();
        self.blocking(move || Ok(disk_of([workspace, fallback])))
            .await
    }
}

/// `statvfs` of the first of `candidates` that can be opened. The paths are warren's own
/// trees, never one a sandbox user names; only the directory itself is opened.
fn disk_of(candidates: [PathBuf; 2]) -> Option<SandboxDisk> {
    let mut last_error = None;
    for path in candidates {
        let stats = std::fs::File::open(&path)
            .and_then(|dir| rustix::fs::fstatvfs(&dir).map_err(std::io::Error::from));
        match stats {
            Ok(stats) => return Some(disk_from(stats.f_blocks, stats.f_bfree, stats.f_frsize)),
            Err(error) => last_error = Some((path, error)),
        }
    }
    if let Some((path, error)) = last_error {
        tracing::warn!(path = %path.display(), %error, "cannot read the size of a workspace's filesystem");
    }
    None
}

/// A filesystem's figures from `statvfs`: `blocks` of `fragment` bytes, `free` of them
/// free (root's reserve included, as `df`'s used column counts it).
fn disk_from(blocks: u64, free: u64, fragment: u64) -> SandboxDisk {
    SandboxDisk {
        used_bytes: blocks.saturating_sub(free).saturating_mul(fragment),
        total_bytes: blocks.saturating_mul(fragment),
    }
}

/// The previous CPU sample of each sandbox, bounded.
#[derive(Debug)]
pub(crate) struct CpuSamples {
    by_sandbox: BTreeMap<SandboxId, (Instant, u64)>,
}

impl CpuSamples {
    pub(crate) const fn new() -> Self {
        Self {
            by_sandbox: BTreeMap::new(),
        }
    }

    /// Records `usec` taken at `at` as the sandbox's latest sample and returns the
    /// previous one when a rate can be computed from it: at least [`FRESH_GAP`] and at
    /// most [`MAX_SAMPLE_AGE`] old, with a figure no larger (a larger one was another
    /// runtime's, whose counter started again).
    fn swap(&mut self, id: &SandboxId, at: Instant, usec: u64) -> Option<(Instant, u64)> {
        let previous = self.by_sandbox.insert(id.clone(), (at, usec));
        if self.by_sandbox.len() > MAX_SAMPLES {
            self.prune(at);
        }
        previous.filter(|&(then, before)| {
            let age = at.saturating_duration_since(then);
            (FRESH_GAP..=MAX_SAMPLE_AGE).contains(&age) && before <= usec
        })
    }

    /// Drops samples too old to be used, then the oldest, down to [`MAX_SAMPLES`].
    fn prune(&mut self, now: Instant) {
        self.by_sandbox
            .retain(|_, (then, _)| now.saturating_duration_since(*then) <= MAX_SAMPLE_AGE);
        while self.by_sandbox.len() > MAX_SAMPLES {
            let oldest = self
                .by_sandbox
                .iter()
                .min_by_key(|(_, (then, _))| *then)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => self.by_sandbox.remove(&id),
                None => break,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use warren_core::{RuntimeScope, Uid};

    use super::*;

    #[test]
    fn disk_figures_are_the_filesystems_blocks_in_bytes() {
        assert_eq!(
            disk_from(1000, 250, 4096),
            SandboxDisk {
                used_bytes: 750 * 4096,
                total_bytes: 1000 * 4096,
            }
        );
        // Figures read a moment apart never wrap around.
        assert_eq!(disk_from(10, 11, 4096).used_bytes, 0);
    }

    #[test]
    fn a_missing_workspace_falls_back_to_the_next_candidate() {
        let dir = std::env::temp_dir();
        let missing = dir.join(format!("warren-usage-{}", uuid::Uuid::new_v4()));
        let disk = disk_of([missing.clone(), dir.clone()]).unwrap();
        assert!(disk.total_bytes > 0 && disk.used_bytes <= disk.total_bytes);
        assert_eq!(disk_of([missing.clone(), missing]), None);
    }

    /// The figures come from the backend hosting the runtime, only while one runs.
    #[tokio::test]
    async fn usage_is_the_running_runtimes_and_none_before_it_starts() {
        let f = crate::testing::Fixture::new().await;
        let record = f.sandbox("alice", "t", "projects/a").await;
        let figures = RuntimeUsage {
            cpu_usage_usec: 5_000,
            memory_current: 64 << 20,
            memory_max: Some(2 << 30),
            memory_file: Some(1 << 20),
            cpu_limit_millis: Some(1000),
        };
        f.backend.set_usage(&record.id, figures);
        // Created, not started (I12): nothing runs to measure.
        assert_eq!(f.provisioner.runtime_usage(&record.id).await.unwrap(), None);
        f.provisioner.join_cluster().await.unwrap();
        f.provisioner.start_runtime(&record.id).await.unwrap();
        assert_eq!(
            f.provisioner.runtime_usage(&record.id).await.unwrap(),
            Some(figures)
        );
        let disk = f
            .provisioner
            .sandbox_disk(&record.id)
            .await
            .unwrap()
            .unwrap();
        assert!(disk.total_bytes > 0 && disk.used_bytes <= disk.total_bytes);
        let unknown = SandboxId::derive(&record.uid, &RuntimeScope::new("nobody").unwrap());
        assert!(matches!(
            f.provisioner.runtime_usage(&unknown).await,
            Err(ProvisionerError::SandboxNotFound(_))
        ));
    }

    fn sandbox(scope: &str) -> SandboxId {
        SandboxId::derive(
            &Uid::new("alice").unwrap(),
            &RuntimeScope::new(scope).unwrap(),
        )
    }

    #[test]
    fn a_rate_needs_a_previous_sample_neither_too_fresh_nor_too_old() {
        let mut samples = CpuSamples::new();
        let id = sandbox("a");
        let start = Instant::now();
        assert_eq!(samples.swap(&id, start, 1_000), None);
        // Too fresh: the interval would be all noise.
        let soon = start + Duration::from_millis(10);
        assert_eq!(samples.swap(&id, soon, 1_100), None);
        let later = soon + Duration::from_secs(1);
        assert_eq!(samples.swap(&id, later, 400_000), Some((soon, 1_100)));
        // Too old: says nothing about now.
        let much_later = later + MAX_SAMPLE_AGE + Duration::from_secs(1);
        assert_eq!(samples.swap(&id, much_later, 500_000), None);
        // A smaller counter is a new runtime's.
        let next = much_later + Duration::from_secs(1);
        assert_eq!(samples.swap(&id, next, 10), None);
        assert_eq!(
            samples.swap(&id, next + Duration::from_secs(1), 20),
            Some((next, 10))
        );
    }

    #[test]
    fn the_samples_kept_are_bounded() {
        let mut samples = CpuSamples::new();
        let start = Instant::now();
        for n in 0..MAX_SAMPLES + 10 {
            let at = start + Duration::from_millis(n as u64);
            samples.swap(&sandbox(&format!("s{n}")), at, 1);
        }
        assert_eq!(samples.by_sandbox.len(), MAX_SAMPLES);
        // The oldest went first.
        assert!(!samples.by_sandbox.contains_key(&sandbox("s0")));
        assert!(samples
            .by_sandbox
            .contains_key(&sandbox(&format!("s{}", MAX_SAMPLES + 9))));
    }
}
