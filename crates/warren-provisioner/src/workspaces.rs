//! The workspace rules that need no backend: each uid's UserWorkspace and skill projection
//! directories, their volumes and quotas (I1, I2, I23). The provisioner holds one and
//! adds the runtimes; `warren migrate` uses one alone, with no backend at all (I20).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use warren_core::{DataLayout, Uid, Workdir};
use warren_fs::{FsError, Kind, WorkspaceRoot};

use crate::quotas::{
    dir_has_entries, is_mount_root, mount_image, volume_error, volume_image, workspace_dir,
    QuotaSettings, VolumeJob, WorkspaceUsage,
};
use crate::{ProvisionerConfig, ProvisionerError};

/// Where the uids' workspaces are, and how they are bounded.
pub struct Workspaces {
    layout: DataLayout,
    quotas: QuotaSettings,
    /// Serialises making and mounting workspace volumes (rare: a uid's first workdir).
    volume_lock: Arc<Mutex<()>>,
}

impl Workspaces {
    /// The workspaces of `config`'s data and workspace directories, under its quotas.
    pub fn new(config: &ProvisionerConfig) -> Self {
        Self {
            layout: match &config.workspace_dir {
                Some(shared) => DataLayout::new(config.data_dir.clone()).with_workspace_dir(shared),
                None => DataLayout::new(config.data_dir.clone()),
            },
            quotas: config.quotas.clone(),
            volume_lock: Arc::default(),
        }
    }

    /// Where things live in the data and workspace directories.
    pub fn layout(&self) -> &DataLayout {
        &self.layout
    }

    /// Runs blocking file work off the async threads.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, ProvisionerError> + Send + 'static,
    ) -> Result<T, ProvisionerError> {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(ProvisionerError::Interrupted)?
    }

    /// The workdir `workdir` of `uid` as a file root of its own (the Viewer's boundary),
    /// resolved by descriptor beneath the UserWorkspace: nothing above it is reachable
    /// through the root, whatever its components become later. Opening it does not start a
    /// runtime (I17).
    pub async fn workdir_root(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<WorkspaceRoot, ProvisionerError> {
        self.check_workdir_exists(uid, workdir).await?;
        let workspace = self.layout.user_workspace(&uid.safe());
        let relative = workdir.as_str().to_owned();
        self.blocking(move || {
            WorkspaceRoot::open(&workspace)
                .and_then(|root| root.subroot(&relative))
                .map_err(|source| crate::sandboxes::workdir_error(&relative, source))
        })
        .await
    }

    pub(crate) async fn check_workdir_exists(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<(), ProvisionerError> {
        let workspace = self.layout.user_workspace(&uid.safe());
        let relative = workdir.as_str().to_owned();
        let entry = self
            .blocking(move || {
                WorkspaceRoot::open(&workspace)
                    .and_then(|root| root.stat(&relative))
                    .map_err(|source| crate::sandboxes::workdir_error(&relative, source))
            })
            .await;
        match entry {
            Ok(entry) if entry.kind == Kind::Dir => Ok(()),
            Ok(_) => Err(ProvisionerError::WorkdirNotADirectory {
                workdir: workdir.to_string(),
            }),
            // A uid with no workspace yet has no workdir either.
            Err(ProvisionerError::File {
                source: FsError::NotFound { .. },
                ..
            })
            | Err(ProvisionerError::File {
                source: FsError::RootUnavailable { .. },
                ..
            }) => Err(ProvisionerError::WorkdirNotFound {
                uid: uid.to_string(),
                workdir: workdir.to_string(),
            }),
            Err(other) => Err(other),
        }
    }

    /// Makes (or confirms) the UserWorkspace of `uid` and its skill projection directory,
    /// and answers the UserWorkspace's host path. With quotas it is the root of the uid's
    /// own filesystem, mounted here when it is not yet (I23). What the storage migrator
    /// fills, so migrated files land exactly where sandboxes will see them.
    pub async fn prepare_user_workspace(&self, uid: &Uid) -> Result<PathBuf, ProvisionerError> {
        // The shared workspace directory (the data directory on one machine).
        let data_dir = self.layout.workspace_dir().to_owned();
        let safe = uid.safe();
        let volume = self.volume_job(uid);
        self.blocking(move || -> Result<PathBuf, ProvisionerError> {
            let workspace_relative = DataLayout::user_workspace_relative(&safe);
            let data_error = |source| crate::sandboxes::file_error("the data directory", source);
            // The workspace directory's own tree is the provisioner's (root-owned when run
            // as root); only the UserWorkspace and what is inside it belong to 1000:1000
            // (I11).
            let data = WorkspaceRoot::open(&data_dir)
                .map_err(data_error)?
                .with_owner(None);
            data.mkdir_p(&DataLayout::skill_projection_relative(&safe))
                .map_err(data_error)?;
            // The UserWorkspaces' tree, as a root of its own: it may be a mount (warren's
            // pod on Kubernetes has the USER_DATA claim there), which nothing resolved from
            // the workspace directory may cross.
            let user_data_dir = data_dir.join(DataLayout::USER_DATA_RELATIVE);
            let user_data = match WorkspaceRoot::open(&user_data_dir) {
                Ok(root) => root,
                Err(FsError::RootUnavailable { .. }) => {
                    data.mkdir_p(DataLayout::USER_DATA_RELATIVE)
                        .map_err(data_error)?;
                    WorkspaceRoot::open(&user_data_dir).map_err(data_error)?
                }
                Err(source) => return Err(data_error(source)),
            }
            .with_owner(None);
            user_data
                .mkdir_p(&DataLayout::user_dir_in_user_data(&safe))
                .map_err(data_error)?;
            let (parent, _) = workspace_relative
                .rsplit_once('/')
                .expect("the workspace path has a parent component");
            match volume {
                // With quotas the workspace is the root of the uid's own filesystem (I23).
                Some(volume) => volume.run()?,
                None => {
                    let owner_dir =
                        WorkspaceRoot::open(&data_dir.join(parent)).map_err(|source| {
                            crate::sandboxes::file_error("the user workspace", source)
                        })?;
                    owner_dir.mkdir_p("workspace").map_err(|source| {
                        crate::sandboxes::file_error("the user workspace", source)
                    })?;
                }
            }
            Ok(data_dir.join(&workspace_relative))
        })
        .await
        .map_err(|error| self.quota_error(uid, error))
    }

    /// The quota configuration in force.
    pub fn quotas(&self) -> &QuotaSettings {
        &self.quotas
    }

    /// Whether writes under `uid`'s workspace run against its own volume.
    pub fn quota_enforced_for(&self, uid: &Uid) -> bool {
        self.quotas.enforced() && self.quotas.limits_of(uid).is_some()
    }

    /// The work of making and mounting `uid`'s volume, when quotas are enforced: run it on
    /// a blocking thread before the workspace is first used.
    pub(crate) fn volume_job(&self, uid: &Uid) -> Option<VolumeJob> {
        if !self.quotas.enforced() {
            return None;
        }
        Some(VolumeJob {
            layout: self.layout.clone(),
            safe: uid.safe().as_str().to_owned(),
            limits: self.quotas.limits_of(uid)?,
            lock: self.volume_lock.clone(),
        })
    }

    /// A full filesystem under `uid`'s workspace is that uid's quota when it has a volume
    /// of its own: 507 `quota_exceeded` for it alone, never the server's disk (I23).
    pub fn quota_error(&self, uid: &Uid, error: ProvisionerError) -> ProvisionerError {
        match error {
            ProvisionerError::File { path, source }
                if crate::is_disk_full(&source) && self.quota_enforced_for(uid) =>
            {
                ProvisionerError::QuotaExceeded {
                    uid: uid.to_string(),
                    path,
                }
            }
            other => other,
        }
    }

    /// Mounts every volume image that is not mounted (after a reboot; also with quotas
    /// turned off since, as the uid's files live there), and, while quotas are enforced,
    /// refuses a data directory with workspaces of limited uids that are not on volumes:
    /// they would escape their limits. Returns the number of volumes. Called once at
    /// start-up, before anything serves.
    pub async fn prepare_volumes(&self) -> Result<usize, ProvisionerError> {
        let layout = self.layout.clone();
        let quotas = &self.quotas;
        // A volume is a filesystem image one node loop-mounts: on a directory several
        // nodes share, two of them would mount it at once and corrupt it.
        if quotas.enforced() && layout.is_split() {
            return Err(ProvisionerError::InvalidNode(
                "[quotas] with volumes cannot be used with a separate workspace directory \
                 (--workspace-dir): a volume is one node's loop-mounted filesystem; enforce \
                 quotas on the shared filesystem itself and remove [quotas] here"
                    .to_owned(),
            ));
        }
        // Which workspaces must be volumes: every uid's with default limits, else those
        // of the uids named in the overrides.
        let limited: Option<std::collections::BTreeSet<String>> = match quotas.default {
            _ if !quotas.enforced() => Some(Default::default()),
            Some(_) => None,
            None => Some(
                quotas
                    .users
                    .keys()
                    .map(|uid| uid.safe().as_str().to_owned())
                    .collect(),
            ),
        };
        self.blocking(move || {
            let shared = layout.workspace_dir().join("user-data/shared");
            let mut unquoted = Vec::new();
            let mut volumes = 0;
            let entries = match std::fs::read_dir(&shared) {
                Ok(entries) => entries.collect::<Result<Vec<_>, _>>(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(e),
            }
            .map_err(|e| volume_error("*", "list", e))?;
            for entry in entries {
                let name = entry.file_name().to_string_lossy().into_owned();
                let safe = name.as_str();
                let image = volume_image(&layout, safe);
                let workspace = workspace_dir(&layout, safe);
                if image.exists() {
                    if !is_mount_root(&workspace).map_err(|e| volume_error(safe, "stat", e))? {
                        mount_image(&image, &workspace)
                            .map_err(|e| volume_error(safe, "mount", e))?;
                    }
                    volumes += 1;
                } else if limited.as_ref().is_none_or(|names| names.contains(safe))
                    && dir_has_entries(&workspace).map_err(|e| volume_error(safe, "list", e))?
                {
                    unquoted.push(name);
                }
            }
            if !unquoted.is_empty() {
                return Err(ProvisionerError::WorkspacesWithoutVolumes { uids: unquoted });
            }
            Ok(volumes)
        })
        .await
    }

    /// What `uid`'s workspace holds and may hold.
    pub async fn workspace_usage(&self, uid: &Uid) -> Result<WorkspaceUsage, ProvisionerError> {
        let quotas = &self.quotas;
        let limits = quotas.limits_of(uid);
        let mut usage = WorkspaceUsage {
            enforcement: quotas.enforcement,
            bytes_used: None,
            bytes_limit: limits.map(|l| l.bytes),
            inodes_used: None,
            inodes_limit: limits.and_then(|l| l.inodes),
        };
        if !self.quota_enforced_for(uid) {
            return Ok(usage);
        }
        let workspace = self.layout.user_workspace(&uid.safe());
        let safe = uid.safe().as_str().to_owned();
        let stats = self
            .blocking(move || {
                if !workspace.exists()
                    || !is_mount_root(&workspace).map_err(|e| volume_error(&safe, "stat", e))?
                {
                    return Ok(None);
                }
                let dir =
                    std::fs::File::open(&workspace).map_err(|e| volume_error(&safe, "open", e))?;
                rustix::fs::fstatvfs(&dir)
                    .map(Some)
                    .map_err(|e| volume_error(&safe, "statvfs", e))
            })
            .await?;
        match stats {
            Some(stats) => {
                let block = stats.f_frsize;
                usage.bytes_limit = Some(stats.f_blocks * block);
                usage.bytes_used = Some((stats.f_blocks - stats.f_bfree) * block);
                usage.inodes_limit = Some(stats.f_files);
                usage.inodes_used = Some(stats.f_files - stats.f_ffree);
            }
            // No volume yet (no workdir): nothing used.
            None => {
                usage.bytes_used = Some(0);
                usage.inodes_used = Some(0);
            }
        }
        Ok(usage)
    }
}

impl crate::Provisioner {
    /// [`Workspaces::prepare_user_workspace`].
    pub async fn prepare_user_workspace(&self, uid: &Uid) -> Result<PathBuf, ProvisionerError> {
        self.workspaces().prepare_user_workspace(uid).await
    }

    /// [`Workspaces::prepare_volumes`]: called once at start-up, before anything serves.
    pub async fn prepare_volumes(&self) -> Result<usize, ProvisionerError> {
        self.workspaces().prepare_volumes().await
    }

    /// [`Workspaces::quotas`].
    pub fn quotas(&self) -> &QuotaSettings {
        self.workspaces().quotas()
    }

    /// [`Workspaces::workspace_usage`].
    pub async fn workspace_usage(&self, uid: &Uid) -> Result<WorkspaceUsage, ProvisionerError> {
        self.workspaces().workspace_usage(uid).await
    }

    pub(crate) fn quota_enforced_for(&self, uid: &Uid) -> bool {
        self.workspaces().quota_enforced_for(uid)
    }

    pub(crate) fn quota_error(&self, uid: &Uid, error: ProvisionerError) -> ProvisionerError {
        self.workspaces().quota_error(uid, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_user_workspace_is_made_and_confirmed_without_any_backend() {
        let dir = tempfile::tempdir().unwrap();
        let workspaces = Workspaces::new(&ProvisionerConfig::new(dir.path()));
        let alice = Uid::new("alice").unwrap();
        let made = workspaces.prepare_user_workspace(&alice).await.unwrap();
        assert_eq!(made, workspaces.layout().user_workspace(&alice.safe()));
        assert!(made.is_dir());
        assert!(workspaces.layout().skill_projection(&alice.safe()).is_dir());
        std::fs::write(made.join("kept"), b"x").unwrap();
        assert_eq!(
            workspaces.prepare_user_workspace(&alice).await.unwrap(),
            made
        );
        assert!(
            made.join("kept").exists(),
            "a second call keeps what is there"
        );
        // No quotas: no volumes, and nothing refused.
        assert_eq!(workspaces.prepare_volumes().await.unwrap(), 0);
        assert!(!workspaces.quota_enforced_for(&alice));
    }

    /// Unmounts what a test mounted, even when it fails.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[tokio::test]
    async fn a_user_workspace_is_made_on_a_user_data_tree_that_is_a_mount_of_its_own() {
        // As warren's pod on Kubernetes has it: the USER_DATA claim mounted at
        // `<workspace>/user-data`, inside the SKILLS claim at `<workspace>`.
        assert!(
            rustix::process::geteuid().is_root(),
            "this test mounts a tmpfs: run it as root (scripts/test does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let user_data = dir.path().join(DataLayout::USER_DATA_RELATIVE);
        std::fs::create_dir(&user_data).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "user-data"])
            .arg(&user_data)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs at {}", user_data.display());
        let _mounted = Mounted(user_data.clone());
        let workspaces = Workspaces::new(&ProvisionerConfig::new(dir.path()));
        let alice = Uid::new("alice").unwrap();
        let made = workspaces.prepare_user_workspace(&alice).await.unwrap();
        assert!(made.starts_with(&user_data) && made.is_dir());
        assert_eq!(
            workspaces.prepare_user_workspace(&alice).await.unwrap(),
            made,
            "and confirmed on the next call"
        );
        assert!(workspaces.layout().skill_projection(&alice.safe()).is_dir());
    }
}
