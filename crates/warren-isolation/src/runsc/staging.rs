//! Bind sources beneath a user's tree, staged by descriptor for runsc (I2, issue 19).
//!
//! runsc's gofer takes a bind's source as a host path string and resolves it itself,
//! following symlinks. warren's own trees (the UserWorkspace, the skill projection, an
//! extra mount's root) are reached by paths no user controls and are handed over as they
//! are. A mount that shows a directory *beneath* such a tree (DeerFlow's workdir at
//! `/mnt/user-data`, the personal skills at `/mnt/skills/custom`) is named by components
//! the sandbox user can rename and replace with links (`mv threads threads.real; ln -s
//! /etc threads`), and the gofer would bind whatever the link names on the host.
//!
//! So such a source is opened here by descriptor ([`warren_backend::HostMount::open`]: no
//! link followed, no `..`, no mount crossed), bound from `/proc/self/fd/<n>` onto a fresh
//! directory of warren's, `<data>/runsc-binds/<sandbox>/<index>` (every parent root-owned
//! and 0700), and runsc gets that path: a mount that already is the directory, not a path
//! to walk. The gofer copies it into its own mount namespace when the sandbox is created,
//! so the staging mount is detached as soon as the sandbox runs, on every failure path (a
//! guard that cleans up when dropped), at teardown, and at start-up for whatever a crash
//! left behind. Staging directories are only ever removed with `rmdir` after their mounts
//! are detached, never recursively: a staging mount still attached is a user's workdir
//! (I15).
//!
//! This is warren-docker's `staging.rs` with the error type of this crate; the two are to
//! be merged into one shared module.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use warren_backend::HostMount;
use warren_core::SandboxId;

use crate::IsolationError;

/// Whether a mount is staged: it shows a directory beneath its tree, not the tree itself.
pub(crate) fn is_staged(mount: &HostMount) -> bool {
    !mount.beneath.is_empty()
}

/// The bind sources of a sandbox's persistent mounts while its sandbox is created and
/// started; the staging mounts go when this is dropped.
#[derive(Debug)]
pub(crate) struct StagedBinds {
    dir: PathBuf,
    /// One per mount, in the view's order: the tree's path, or the staging directory.
    sources: Vec<PathBuf>,
}

impl StagedBinds {
    /// Stages every mount of `mounts` that shows a directory beneath its tree. A source
    /// that cannot be opened without following a link (or crossing a mount) is refused
    /// with the reason, before anything is handed to runsc.
    pub(crate) fn stage(
        binds: &Path,
        sandbox: &SandboxId,
        mounts: &[HostMount],
    ) -> Result<Self, IsolationError> {
        let dir = binds.join(sandbox.as_str());
        let host_dir = |what: &'static str| move |source| IsolationError::HostDir { what, source };
        // Leftovers of a crash between staging and start: never reused, removed first.
        remove(&dir).map_err(host_dir("a leftover staging directory"))?;
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
            .map_err(host_dir("the sandbox's staging directory"))?;
        for (index, mount) in mounts.iter().enumerate() {
            if !is_staged(mount) {
                staged.sources.push(mount.tree.clone());
                continue;
            }
            let refused = |reason: String| IsolationError::Mount {
                target: mount.target.clone(),
                reason,
            };
            // The message names the path inside the tree, never a host path (I1).
            let fd = mount.open().map_err(|error| refused(error.to_string()))?;
            let path = staged.dir.join(index.to_string());
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(host_dir("a staging directory"))?;
            warren_backend::bind_fd(&fd, &path, !mount.writable)
                .map_err(|error| refused(format!("cannot stage its bind: {error}")))?;
            staged.sources.push(path);
        }
        Ok(staged)
    }

    /// The bind source of the mount at `index` of the view.
    pub(crate) fn source(&self, index: usize) -> &Path {
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
pub(crate) fn remove(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let path = entry?.path();
        detach(&path)?;
        // rmdir, never a recursive removal: were the mount still there, this fails
        // (the directory is not empty) instead of deleting a user's files (I15).
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
/// between staging and start left behind (a started sandbox holds its own mounts).
pub(crate) fn remove_all(binds: &Path) -> io::Result<()> {
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
        let path = binds.path().join(sandbox.as_str()).join("0");
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
