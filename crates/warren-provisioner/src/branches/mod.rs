//! Branches of a workdir (I27): named, writable views over a read-only baseline, so
//! parallel executors each write their own; an explicit merger brings them back
//! (`merge.rs`).
//!
//! A branch is an overlay mount on warren's host, kept in the workspace directory under
//! `branches/<safe uid>/<id>/`: `upper/` holds what the branch changed, `work/` is
//! overlayfs's, `merged/` is the view. Its lower layer is the workdir itself (opened by
//! descriptor, never by a path a user could bend, I2), which is then read-only for
//! everyone while the branch exists: file writes into it are refused (409
//! `workdir_branched`) and runtimes started meanwhile see it read-only; a branch is made
//! only of a workdir no running runtime can write. A branch made from a checkpoint has that
//! checkpoint's tree, restored into `base/`, as its lower layer instead, and freezes nothing.
//! Creating one costs a few directories and a mount, whatever the workdir's size; it then
//! costs only what it changes (overlayfs copies a file up on its first write).
//!
//! A sandbox bound to a branch (`Binding::branch`) sees it where the workdir would be, in
//! its runtimes (the backend mounts `merged/` there) and in the file API
//! (`VirtualRoot::Branch`).
//!
//! Branches are this host's mounts: cluster mode (several replicas) does not serve them.

mod copy;
mod fork;
mod merge;

pub use fork::{Forked, MAX_FORKS};
pub use merge::{MergeOutcome, MergeRequest};

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use warren_core::{BranchName, Uid, Workdir};
use warren_fs::WorkspaceRoot;
use warren_store::{BranchRecord, SandboxRecord, SandboxState};

use crate::{Provisioner, ProvisionerError};

/// The directory of the workspace directory that holds every branch.
const BRANCHES_DIR: &str = "branches";

impl Provisioner {
    /// Where branch `id` of `uid` keeps its layers and its view.
    fn branch_home(&self, uid: &Uid, id: &str) -> PathBuf {
        self.layout()
            .workspace_dir()
            .join(BRANCHES_DIR)
            .join(uid.safe().as_str())
            .join(id)
    }

    fn refuse_unsupported(&self) -> Result<(), ProvisionerError> {
        let unsupported = |reason: &str| {
            Err(ProvisionerError::BranchesUnsupported {
                reason: reason.to_owned(),
            })
        };
        if !rustix::process::geteuid().is_root() {
            return unsupported("warren does not run as root, so it cannot mount overlays");
        }
        if self.config.workspace_dir.is_some() {
            return unsupported(
                "branches are mounts on one host; a server sharing its workspace directory \
                 with other replicas does not make them",
            );
        }
        Ok(())
    }

    /// Makes branch `name` of `uid`'s `workdir`: of the workdir as it is now (which is read-only
    /// from then on, while any such branch exists), or of one of its checkpoints.
    pub async fn create_branch(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: BranchName,
        checkpoint: Option<&str>,
    ) -> Result<BranchRecord, ProvisionerError> {
        self.create_branch_with(uid, workdir, name, checkpoint, None)
            .await
    }

    /// [`Self::create_branch`], its upper layer first filled with a copy of `changes_of`'s:
    /// a branch of the same workdir that starts with what that branch changed.
    async fn create_branch_with(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: BranchName,
        checkpoint: Option<&str>,
        changes_of: Option<&BranchRecord>,
    ) -> Result<BranchRecord, ProvisionerError> {
        self.refuse_unsupported()?;
        if self.quota_enforced_for(uid) {
            // A branch's layers live beside the uid's volume, not on it: its writes would
            // escape the uid's quota (I23).
            return Err(ProvisionerError::BranchesUnsupported {
                reason: "this uid's workspace is a quota volume, and a branch would be \
                         written outside it"
                    .to_owned(),
            });
        }
        self.check_workdir_exists(uid, workdir).await?;
        let manifest = match checkpoint {
            Some(checkpoint) => Some(self.workdir_checkpoint(uid, workdir, checkpoint).await?),
            None => None,
        };
        let record = BranchRecord {
            uid: uid.clone(),
            workdir: workdir.clone(),
            name,
            id: format!("br-{}", uuid::Uuid::new_v4().simple()),
            checkpoint: checkpoint.map(str::to_owned),
            created_at: chrono::Utc::now(),
            merged_at: None,
        };
        // Recorded first: a runtime that starts from here on sees the baseline read-only,
        // so the check for writers below misses none that started before.
        if !self.store.record_branch(&record).await? {
            return Err(ProvisionerError::BranchExists {
                workdir: workdir.to_string(),
                name: record.name.to_string(),
            });
        }
        let made = async {
            if manifest.is_none() {
                self.refuse_live_writers(uid, workdir).await?;
            }
            let seed = changes_of.map(|from| self.branch_home(&from.uid, &from.id).join("upper"));
            self.make_branch_tree(&record, manifest, seed).await
        }
        .await;
        if let Err(error) = made {
            let _ = self.remove_branch_tree(&record).await;
            self.store.forget_branch(uid, workdir, &record.name).await?;
            return Err(error);
        }
        tracing::info!(uid = %uid, workdir = %workdir, branch = %record.name, id = %record.id, "branch made");
        Ok(record)
    }

    /// The uid's branches of `workdir` (or of all its workdirs), oldest first.
    pub async fn list_branches(
        &self,
        uid: &Uid,
        workdir: Option<&Workdir>,
    ) -> Result<Vec<BranchRecord>, ProvisionerError> {
        Ok(self.store.list_branches(uid, workdir).await?)
    }

    /// Branch `name` of `uid`'s `workdir`.
    pub async fn branch(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &BranchName,
    ) -> Result<BranchRecord, ProvisionerError> {
        self.store
            .list_branches(uid, Some(workdir))
            .await?
            .into_iter()
            .find(|branch| branch.name == *name)
            .ok_or_else(|| ProvisionerError::BranchNotFound {
                workdir: workdir.to_string(),
                name: name.to_string(),
            })
    }

    /// Deletes a branch and everything it changed. Refused while a sandbox that is not
    /// terminated is bound to it.
    pub async fn delete_branch(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &BranchName,
    ) -> Result<(), ProvisionerError> {
        let record = self.branch(uid, workdir, name).await?;
        let bound: Vec<String> = self
            .store
            .list_sandboxes(Some(uid))
            .await?
            .into_iter()
            .filter(|sandbox| {
                sandbox.state != SandboxState::Terminated
                    && sandbox.binding.workdir == *workdir
                    && sandbox.binding.branch.as_ref() == Some(name)
            })
            .map(|sandbox| sandbox.id.to_string())
            .collect();
        if !bound.is_empty() {
            return Err(ProvisionerError::BranchInUse {
                name: name.to_string(),
                sandboxes: bound.join(", "),
            });
        }
        self.store.forget_branch(uid, workdir, name).await?;
        self.remove_branch_tree(&record).await?;
        tracing::info!(uid = %uid, workdir = %workdir, branch = %name, "branch deleted");
        Ok(())
    }

    /// What the branch changed against its baseline, by path.
    pub async fn branch_diff(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &BranchName,
    ) -> Result<Vec<warren_merge::Change>, ProvisionerError> {
        let record = self.branch(uid, workdir, name).await?;
        let trees = self.branch_trees(&record).await?;
        self.blocking(move || {
            let (base, upper, merged) = trees.open()?;
            warren_merge::branch_changes(&base, &upper, &merged).map_err(ProvisionerError::Merge)
        })
        .await
    }

    /// The view of a branch, mounted if it is not (after a reboot).
    pub(crate) async fn branch_tree(
        &self,
        record: &BranchRecord,
    ) -> Result<PathBuf, ProvisionerError> {
        Ok(self.branch_trees(record).await?.merged)
    }

    /// The branch's three trees, its view mounted.
    async fn branch_trees(&self, record: &BranchRecord) -> Result<BranchTrees, ProvisionerError> {
        let home = self.branch_home(&record.uid, &record.id);
        let trees = BranchTrees {
            lower: match record.checkpoint {
                Some(_) => Lower::Base(home.join("base")),
                None => Lower::Workdir {
                    workspace: self.layout().user_workspace(&record.uid.safe()),
                    workdir: record.workdir.clone(),
                },
            },
            upper: home.join("upper"),
            work: home.join("work"),
            merged: home.join("merged"),
        };
        let mut mounted = self.branch_mounts.lock().await;
        if !mounted.contains(&record.id) {
            let job = trees.clone();
            self.blocking(move || job.mount()).await?;
            mounted.insert(record.id.clone());
        }
        Ok(trees)
    }

    /// Makes the branch's directories (and its checkpoint's tree) and mounts its view.
    async fn make_branch_tree(
        &self,
        record: &BranchRecord,
        manifest: Option<String>,
        upper_from: Option<PathBuf>,
    ) -> Result<(), ProvisionerError> {
        let home = self.branch_home(&record.uid, &record.id);
        let store = match manifest {
            Some(_) => Some(self.snapshot_store(&record.uid)?),
            None => None,
        };
        let limits = self.snapshot_limits(None);
        let layers = home.clone();
        self.blocking(move || {
            let failed = |source: std::io::Error| ProvisionerError::BranchesUnsupported {
                reason: format!("the branch's directories could not be made: {source}"),
            };
            std::fs::create_dir_all(layers.parent().expect("a branch home has a parent"))
                .map_err(failed)?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&layers)
                .map_err(failed)?;
            for dir in ["upper", "work", "merged"] {
                std::fs::create_dir(layers.join(dir)).map_err(failed)?;
            }
            if let (Some(manifest), Some(store)) = (manifest, store) {
                std::fs::create_dir(layers.join("base")).map_err(failed)?;
                let root = WorkspaceRoot::open(&layers).map_err(branch_file_error)?;
                warren_snapshot::restore_with(&root, "base", store.as_ref(), &manifest, &limits)
                    .map_err(ProvisionerError::Snapshot)?;
            }
            if let Some(from) = upper_from {
                let source = WorkspaceRoot::open(&from).map_err(branch_file_error)?;
                let target =
                    WorkspaceRoot::open(&layers.join("upper")).map_err(branch_file_error)?;
                copy::copy_upper(source.into_fd().as_fd(), target.into_fd().as_fd()).map_err(
                    |source| ProvisionerError::BranchesUnsupported {
                        reason: format!("the branch's changes could not be copied: {source}"),
                    },
                )?;
            }
            Ok(())
        })
        .await?;
        self.branch_trees(record).await.map(drop)
    }

    /// Unmounts a branch's view and removes its layers.
    async fn remove_branch_tree(&self, record: &BranchRecord) -> Result<(), ProvisionerError> {
        let home = self.branch_home(&record.uid, &record.id);
        let mut mounted = self.branch_mounts.lock().await;
        mounted.remove(&record.id);
        self.blocking(move || {
            let merged = home.join("merged");
            while is_mount_point(&merged) {
                if let Err(error) =
                    rustix::mount::unmount(&merged, rustix::mount::UnmountFlags::DETACH)
                {
                    return Err(ProvisionerError::BranchesUnsupported {
                        reason: format!("the branch's view could not be unmounted: {error}"),
                    });
                }
            }
            match std::fs::remove_dir_all(&home) {
                Ok(()) => Ok(()),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(ProvisionerError::BranchesUnsupported {
                    reason: format!("the branch's layers could not be removed: {error}"),
                }),
            }
        })
        .await
    }

    /// A checkpoint of `workdir` recorded by any sandbox of `uid`: its manifest.
    async fn workdir_checkpoint(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        checkpoint: &str,
    ) -> Result<String, ProvisionerError> {
        for sandbox in self.store.list_sandboxes(Some(uid)).await? {
            if let Some(found) = self
                .store
                .list_checkpoints(&sandbox.id)
                .await?
                .into_iter()
                .find(|c| c.id == checkpoint && c.workdir == *workdir)
            {
                return Ok(found.manifest);
            }
        }
        Err(ProvisionerError::CheckpointNotFound {
            checkpoint: checkpoint.chars().take(100).collect(),
        })
    }

    /// Refuses (409 `workdir_in_use`) while a runtime of `uid` that can write `workdir`
    /// runs: one that shows the whole workspace, or a workdir holding it or inside it, and
    /// is not bound to a branch of it.
    async fn refuse_live_writers(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<(), ProvisionerError> {
        let writers: Vec<String> = self
            .store
            .list_sandboxes(Some(uid))
            .await?
            .into_iter()
            .filter(|sandbox| can_write(sandbox, workdir))
            .map(|sandbox| sandbox.id.to_string())
            .collect();
        if writers.is_empty() {
            Ok(())
        } else {
            Err(ProvisionerError::WorkdirInUse {
                workdir: workdir.to_string(),
                sandboxes: writers.join(", "),
            })
        }
    }

    /// The workdirs of `uid` that are read-only baselines now: those with a branch made
    /// of the workdir itself.
    pub(crate) async fn frozen_workdirs(
        &self,
        uid: &Uid,
    ) -> Result<Vec<Workdir>, ProvisionerError> {
        Ok(frozen_of(self.store.list_branches(uid, None).await?))
    }

    /// Refuses (409 `workdir_branched`) a change of `workdir` while it, a directory holding
    /// it or one inside it is a read-only baseline (a restore would change it whole).
    pub(crate) async fn refuse_frozen_workdir(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<(), ProvisionerError> {
        match self
            .frozen_workdirs(uid)
            .await?
            .into_iter()
            .find(|frozen| frozen.overlaps(workdir))
        {
            Some(frozen) => Err(ProvisionerError::WorkdirBranched {
                path: format!("workdir {workdir}"),
                workdir: frozen.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses a runtime on `backend` that would show one of the `frozen` baselines
    /// writable: a Kubernetes pod mounts claims, never warren's overlays or read-only
    /// binds of them (I27).
    pub(crate) fn refuse_writable_baseline(
        &self,
        uid: &Uid,
        backend: warren_core::BackendKind,
        layout: warren_core::LayoutName,
        workdir: &Workdir,
        frozen: &[Workdir],
    ) -> Result<(), ProvisionerError> {
        if backend != warren_core::BackendKind::Kubernetes {
            return Ok(());
        }
        match frozen
            .iter()
            .find(|frozen| shows_writable(layout, workdir, frozen))
        {
            Some(frozen) => Err(ProvisionerError::BranchesUnsupported {
                reason: format!(
                    "workdir {frozen} of {uid} has branches, and a kubernetes pod cannot show \
                     it read-only"
                ),
            }),
            None => Ok(()),
        }
    }

    /// What a runtime or the file API of `record` shows beyond its layout: the branch it is
    /// bound to (mounted) and the read-only baselines.
    pub(crate) async fn branch_view(
        &self,
        record: &SandboxRecord,
    ) -> Result<(Option<PathBuf>, Vec<Workdir>), ProvisionerError> {
        if record.binding.ephemeral {
            return Ok((None, Vec::new()));
        }
        // One read of the uid's branches tells both.
        let branches = self.store.list_branches(&record.uid, None).await?;
        let branch = match &record.binding.branch {
            Some(name) => {
                let branch = branches
                    .iter()
                    .find(|b| b.workdir == record.binding.workdir && b.name == *name)
                    .ok_or_else(|| ProvisionerError::BranchNotFound {
                        workdir: record.binding.workdir.to_string(),
                        name: name.to_string(),
                    })?;
                Some(self.branch_tree(branch).await?)
            }
            None => None,
        };
        Ok((branch, frozen_of(branches)))
    }
}

/// The read-only baselines among `branches`: the workdirs of those made of a workdir as it
/// was (not of a checkpoint), sorted, each once (a holding one before those inside it).
fn frozen_of(branches: Vec<BranchRecord>) -> Vec<Workdir> {
    let mut frozen: Vec<Workdir> = branches
        .into_iter()
        .filter(|branch| branch.checkpoint.is_none())
        .map(|branch| branch.workdir)
        .collect();
    frozen.sort();
    frozen.dedup();
    frozen
}

/// Whether the running runtime of `sandbox` can write `workdir`.
fn can_write(sandbox: &SandboxRecord, workdir: &Workdir) -> bool {
    let running = matches!(sandbox.state, SandboxState::Running | SandboxState::Pausing);
    if !running || sandbox.binding.ephemeral {
        return false;
    }
    if sandbox.binding.branch.is_some() && sandbox.binding.workdir == *workdir {
        return false;
    }
    shows_writable(sandbox.binding.layout, &sandbox.binding.workdir, workdir)
}

/// Whether a runtime of `layout` bound to `bound` itself shows the directory `dir` of the
/// workspace writable: the whole workspace, or a workdir holding it or inside it.
pub(crate) fn shows_writable(
    layout: warren_core::LayoutName,
    bound: &Workdir,
    dir: &Workdir,
) -> bool {
    if layout
        .layout()
        .mounts
        .iter()
        .any(|mount| mount.writable && mount.source == warren_core::MountSource::UserWorkspace)
    {
        return true;
    }
    bound.overlaps(dir)
}

/// Where a branch's lower layer is.
#[derive(Debug, Clone)]
enum Lower {
    /// The workdir itself, opened beneath the workspace by descriptor.
    Workdir {
        workspace: PathBuf,
        workdir: Workdir,
    },
    /// A checkpoint's tree, restored into the branch's own `base/`.
    Base(PathBuf),
}

#[derive(Debug, Clone)]
struct BranchTrees {
    lower: Lower,
    upper: PathBuf,
    work: PathBuf,
    merged: PathBuf,
}

impl BranchTrees {
    fn open_lower(&self) -> Result<WorkspaceRoot, ProvisionerError> {
        match &self.lower {
            Lower::Workdir { workspace, workdir } => WorkspaceRoot::open(workspace)
                .and_then(|root| root.subroot(workdir.as_str()))
                .map_err(|source| crate::sandboxes::workdir_error(workdir.as_str(), source)),
            Lower::Base(base) => WorkspaceRoot::open(base).map_err(branch_file_error),
        }
    }

    /// The baseline, the branch's own changes and its view, each opened by descriptor.
    fn open(&self) -> Result<(WorkspaceRoot, WorkspaceRoot, WorkspaceRoot), ProvisionerError> {
        Ok((
            self.open_lower()?,
            WorkspaceRoot::open(&self.upper).map_err(branch_file_error)?,
            WorkspaceRoot::open(&self.merged).map_err(branch_file_error)?,
        ))
    }

    /// Mounts the view unless it is mounted. The lower layer is named to overlayfs as
    /// `/proc/self/fd/<n>` of a descriptor opened with no link followed, so a workdir
    /// whose components a user swapped for links is refused, never followed (I2).
    fn mount(&self) -> Result<(), ProvisionerError> {
        if is_mount_point(&self.merged) {
            return Ok(());
        }
        let lower: OwnedFd = self.open_lower()?.into_fd();
        let failed = |step: &str, error: rustix::io::Errno| ProvisionerError::BranchesUnsupported {
            reason: format!("overlayfs refused to {step}: {error}"),
        };
        // The upper layer's root is the view's root: it looks as the baseline's does.
        let stat = rustix::fs::fstat(&lower).map_err(|e| failed("read the baseline", e))?;
        rustix::fs::chown(
            &self.upper,
            Some(rustix::fs::Uid::from_raw(stat.st_uid)),
            Some(rustix::fs::Gid::from_raw(stat.st_gid)),
        )
        .map_err(|e| failed("own the upper layer", e))?;
        rustix::fs::chmod(
            &self.upper,
            rustix::fs::Mode::from_raw_mode(stat.st_mode & 0o7777),
        )
        .map_err(|e| failed("set the upper layer's mode", e))?;
        use rustix::mount::{
            fsconfig_create, fsconfig_set_string, fsmount, fsopen, move_mount, FsMountFlags,
            FsOpenFlags, MountAttrFlags, MoveMountFlags,
        };
        let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)
            .map_err(|e| failed("open an overlay (is overlayfs available?)", e))?;
        let lower_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&lower));
        fsconfig_set_string(fs.as_fd(), "lowerdir", lower_path.as_str())
            .map_err(|e| failed("take the baseline", e))?;
        fsconfig_set_string(fs.as_fd(), "upperdir", self.upper.as_path())
            .map_err(|e| failed("take the upper layer", e))?;
        fsconfig_set_string(fs.as_fd(), "workdir", self.work.as_path())
            .map_err(|e| failed("take the work directory", e))?;
        fsconfig_create(fs.as_fd()).map_err(|e| failed("create the view", e))?;
        let mount = fsmount(
            fs.as_fd(),
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
        )
        .map_err(|e| failed("make the view", e))?;
        move_mount(
            mount.as_fd(),
            "",
            rustix::fs::CWD,
            self.merged.as_path(),
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|e| failed("attach the view", e))?;
        Ok(())
    }
}

/// Unmounts every branch view under the workspace directory `workspace_dir` (lazily: a
/// runtime still showing one keeps it). Branches stay mounted across restarts of warren
/// by design; this is for the end of a data directory (the tests' fixtures), not for
/// shutdown.
pub fn unmount_branches(workspace_dir: &Path) {
    let root = workspace_dir.join(BRANCHES_DIR);
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|point| point.starts_with(&root))
        .collect();
    // The deepest first, and each once.
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    points.dedup();
    for point in points {
        let _ = rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH);
    }
}

/// A mount point as /proc/self/mountinfo writes it: space, tab, newline and backslash as
/// octal escapes.
fn unescape_mountinfo(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match octal {
            Some(digits) => {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |n, d| n.wrapping_mul(8) + (d - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// Whether `path` is the root of a mount (`quotas::is_mount_root`); a path that cannot be
/// read is none.
fn is_mount_point(path: &Path) -> bool {
    crate::quotas::is_mount_root(path).unwrap_or(false)
}

pub(super) fn branch_file_error(source: warren_fs::FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: "the branch".to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests;
