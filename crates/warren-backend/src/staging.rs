//! Binds of directories beneath a user's tree, staged by descriptor for a runtime manager
//! that takes bind sources as paths (I2): dockerd, and runsc's gofer (issue 19).
//!
//! dockerd and runsc take a bind's source as a host path string and resolve it themselves,
//! following symlinks. warren's own trees (the UserWorkspace, the skill projection) are reached by
//! paths no user controls and are handed to it as they are. A mount that shows a
//! directory *beneath* such a tree is another matter: DeerFlow's workdir at
//! `/mnt/user-data` or the personal skills at `/mnt/skills/custom` are named by components
//! the sandbox user can rename and replace with links (from an ARS runtime of the same
//! uid: `mv threads threads.real; ln -s /etc threads`), and dockerd would bind whatever
//! the link names on the host (runsc's gofer likewise).
//!
//! So such a source is opened here by descriptor ([`warren_backend::HostMount::open`]: no
//! link followed, no `..`, no mount crossed), bound from `/proc/self/fd/<n>` onto a fresh
//! directory of warren's, `<binds>/<sandbox>/<index>` (every parent root-owned and 0700:
//! `<data>/docker/binds`, `<data>/runsc-binds`), and the manager gets that path: it names a
//! mount that already is the directory, not a path to walk. Once the container or sandbox
//! has started it holds its own copy of the mount,
//! and the staging mount is detached and its directory removed; on every failure path too
//! (a guard that cleans up when dropped), at teardown, and at start-up for whatever a
//! crash left behind. Staging directories are only ever removed with `rmdir` after their
//! mounts are detached, never recursively: a staging mount still attached is a user's
//! workdir, and nothing of it may be deleted.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use warren_core::SandboxId;

use crate::{BackendError, HostMount};

/// The staging directory of one mount of a sandbox: the bind source a container's labels
/// and mounts record (warren-docker's `identity`).
pub fn staging_path(binds: &Path, sandbox: &SandboxId, index: usize) -> PathBuf {
    binds.join(sandbox.as_str()).join(index.to_string())
}

/// Whether a mount is staged: it shows a directory beneath its tree, not the tree itself.
pub fn is_staged(mount: &HostMount) -> bool {
    !mount.beneath.is_empty()
}

/// The bind sources of a sandbox's persistent mounts while its container is created and
/// started; the staging mounts go when this is dropped.
#[derive(Debug)]
pub struct StagedBinds {
    dir: PathBuf,
    /// One per mount, in the layout's order: the tree's path, or the staging directory.
    sources: Vec<PathBuf>,
}

impl StagedBinds {
    /// Stages every mount of `mounts` that shows a directory beneath its tree. A source
    /// that cannot be opened without following a link (or crossing a mount) is refused
    /// with the reason, before anything is handed to the manager.
    pub fn stage(
        binds: &Path,
        sandbox: &SandboxId,
        mounts: &[HostMount],
    ) -> Result<Self, BackendError> {
        let dir = binds.join(sandbox.as_str());
        // Leftovers of a crash between staging and start: never reused, removed first.
        remove(&dir).map_err(|source| BackendError::HostDir {
            what: "a leftover staging directory",
            source,
        })?;
        let mut staged = Self {
            dir,
            sources: Vec::new(),
        };
        if !mounts.iter().any(is_staged) {
            staged.sources = mounts.iter().map(|m| m.tree.clone()).collect();
            return Ok(staged);
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&staged.dir)
            .map_err(|source| BackendError::HostDir {
                what: "the sandbox's staging directory",
                source,
            })?;
        for (index, mount) in mounts.iter().enumerate() {
            if !is_staged(mount) {
                staged.sources.push(mount.tree.clone());
                continue;
            }
            let refused = |reason: String| BackendError::MountRefused {
                target: mount.target.clone(),
                reason,
            };
            // The message names the path inside the tree, never a host path (I1).
            let fd = mount.open().map_err(|error| refused(error.to_string()))?;
            let path = staging_path(binds, sandbox, index);
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(|source| BackendError::HostDir {
                    what: "a staging directory",
                    source,
                })?;
            crate::bind_fd(&fd, &path, !mount.writable).map_err(|error| {
                refused(
                    if error.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
                        format!("staging its bind needs root ({error})")
                    } else {
                        format!("cannot stage its bind: {error}")
                    },
                )
            })?;
            staged.sources.push(path);
        }
        Ok(staged)
    }

    /// The bind source of the mount at `index` of the layout.
    pub fn source(&self, index: usize) -> &Path {
        &self.sources[index]
    }
}

impl Drop for StagedBinds {
    fn drop(&mut self) {
        if let Err(error) = remove(&self.dir) {
            tracing::error!(dir = %self.dir.display(), %error, "could not remove a staging directory");
        }
    }
}

/// Detaches every staging mount of one sandbox's directory and removes it. Safe to
/// repeat; a directory that is gone already is fine.
pub fn remove(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let path = entry?.path();
        detach(&path)?;
        // rmdir, never a recursive removal: were the mount still there, this fails
        // (the directory is not empty) instead of deleting a user's files.
        match std::fs::remove_dir(&path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    match std::fs::remove_dir(dir) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Removes every sandbox's staging directory under `binds`: at start-up, what a crash
/// between staging and start left behind.
pub fn remove_all(binds: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(binds) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        remove(&entry?.path())?;
    }
    Ok(())
}

/// Detaches whatever is mounted on `path` (a crash may have left more than one).
fn detach(path: &Path) -> io::Result<()> {
    use rustix::io::Errno;
    loop {
        match rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH) {
            Ok(()) => continue,
            // Not a mount point (any more), or gone.
            Err(Errno::INVAL) | Err(Errno::NOENT) => return Ok(()),
            // Without root nothing was ever staged (binding needs it), so nothing is
            // mounted here for this process to detach.
            Err(Errno::PERM) if !rustix::process::geteuid().is_root() => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_directory_still_holding_files_is_never_removed_with_them() {
        // Stands for a staging mount that could not be detached: its files are a user's.
        let binds = tempfile::tempdir().unwrap();
        let sandbox = SandboxId::parse("sbx-0123456789abcdef01234567").unwrap();
        let path = staging_path(binds.path(), &sandbox, 0);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("precious"), "user data").unwrap();
        assert!(remove_all(binds.path()).is_err());
        assert_eq!(
            std::fs::read_to_string(path.join("precious")).unwrap(),
            "user data"
        );
        std::fs::remove_file(path.join("precious")).unwrap();
        remove_all(binds.path()).unwrap();
        assert!(!binds.path().join(sandbox.as_str()).exists());
    }
}
