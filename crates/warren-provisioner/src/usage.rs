//! What a sandbox consumes, for transports that report it (E2B's sandbox metrics): its
//! runtime's CPU and memory as the backend's kernel accounts them (I22), and the disk its
//! workspace lives on.
//!
//! Both are read where they are asked and only here: a runtime another node of a cluster
//! owns is not measured (`None`), as no peer link operation carries the figures yet
//! (`PeerLink` forwards only what changes a runtime).

use std::path::PathBuf;

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

impl Provisioner {
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
        let fallback = self.layout.workspace_dir().to_path_buf();
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

#[cfg(test)]
mod tests {
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
        use std::sync::Arc;

        use warren_backend::{Backend, MemoryBackend};
        use warren_core::{RuntimeScope, Uid};

        let data_dir = std::env::temp_dir().join(format!("warren-usage-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&data_dir).unwrap();
        let backend = Arc::new(MemoryBackend::new());
        let provisioner = Provisioner::new(
            crate::ProvisionerConfig::new(&data_dir),
            Arc::new(warren_store::SqliteStore::open_in_memory().await.unwrap()),
            backend.clone(),
        );
        let uid = Uid::plain("alice").unwrap();
        provisioner
            .create_workdir(&uid, Some("projects/a"))
            .await
            .unwrap();
        let (record, _) = provisioner
            .create_sandbox(crate::SandboxRequest {
                workdir: Some("projects/a".into()),
                ..crate::SandboxRequest::new(uid.clone(), RuntimeScope::new("t").unwrap())
            })
            .await
            .unwrap();
        let figures = RuntimeUsage {
            cpu_usage_usec: 5_000,
            memory_current: 64 << 20,
            memory_max: Some(2 << 30),
            memory_file: Some(1 << 20),
            cpu_limit_millis: Some(1000),
        };
        backend.set_usage(&record.id, figures);
        // Created, not started (I12): nothing runs to measure.
        assert_eq!(provisioner.runtime_usage(&record.id).await.unwrap(), None);
        // The memory backend runs nothing, so the provisioner starts no runtime on it: one
        // is made as a backend would on the first exec.
        backend
            .create(&warren_backend::RuntimeSpec {
                sandbox: record.id.clone(),
                backend: warren_backend::BackendKind::Memory,
                image: None,
                isolation: record.isolation,
                generation: record.generation,
                uid: uid.clone(),
                runtime_scope: record.runtime_scope.clone(),
                workdir: record.workdir.clone(),
                layout: record.layout,
                extra_mounts: Vec::new(),
                user_workspace: data_dir.join("ws"),
                skill_projection: data_dir.join("skills"),
                env: Default::default(),
                network: warren_core::NetworkPolicy::None,
                seed: None,
            })
            .await
            .unwrap();
        assert_eq!(
            provisioner.runtime_usage(&record.id).await.unwrap(),
            Some(figures)
        );
        let disk = provisioner.sandbox_disk(&record.id).await.unwrap().unwrap();
        assert!(disk.total_bytes > 0 && disk.used_bytes <= disk.total_bytes);
        let unknown = SandboxId::derive(&uid, &RuntimeScope::new("nobody").unwrap());
        assert!(matches!(
            provisioner.runtime_usage(&unknown).await,
            Err(ProvisionerError::SandboxNotFound(_))
        ));
        let _ = std::fs::remove_dir_all(&data_dir);
    }
}
