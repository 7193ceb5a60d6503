//! What a workspace directory must do to be shared by several warren nodes (issue 14),
//! checked at start-up by doing each once in a scratch directory inside it.
//!
//! The file layer relies on four things of the filesystem under the UserWorkspaces:
//! - an atomic rename over an existing file (every write lands whole or not at all, I27);
//! - `RENAME_EXCHANGE` (checkpoint restores and skill projections are swapped in whole);
//! - `flock` on a directory (conditional writes hold it from the `If-Match` check to the
//!   rename, and across nodes only a filesystem that shares the lock makes that hold);
//! - `chown` to the sandbox user when the server runs as root (I11; `root_squash` NFS
//!   exports refuse it).
//!
//! Local filesystems (ext4, XFS, btrfs, tmpfs) have all four; NFSv4 has no
//! `RENAME_EXCHANGE`, which this check reports rather than letting the first restore fail.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{
    fchown, flock, fstat, mkdirat, openat, renameat, renameat_with, FlockOperation, Gid, Mode,
    OFlags, RenameFlags, Uid,
};

use crate::{FsError, Owner};

/// Checks that `dir` (an existing directory) gives the file layer what it needs, in a
/// scratch directory removed afterwards; `owner` is who created files are handed to
/// (`None` when the server is not root). The error names the first missing semantic.
pub fn check_shared_dir(dir: &Path, owner: Option<Owner>) -> Result<(), FsError> {
    let fail = |semantic: &'static str| {
        move |e: rustix::io::Errno| FsError::SharedDirUnsupported {
            semantic,
            errno: io::Error::from(e),
        }
    };
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail("open the directory"))?;
    let name = format!(
        ".warren-check-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    mkdirat(&root, name.as_str(), Mode::from_raw_mode(0o700))
        .map_err(fail("create a directory"))?;
    let outcome = (|| {
        let scratch = openat(
            &root,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail("open a directory"))?;
        let create = |leaf: &str, text: &[u8]| -> Result<(), FsError> {
            let file = openat(
                &scratch,
                leaf,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(fail("create a file"))?;
            rustix::io::write(&file, text).map_err(fail("write a file"))?;
            rustix::fs::fsync(&file).map_err(fail("fsync a file"))?;
            Ok(())
        };
        create("new", b"new")?;
        create("old", b"old")?;
        renameat(&scratch, "new", &scratch, "old")
            .map_err(fail("rename a file over another (atomic replace)"))?;
        let replaced = openat(
            &scratch,
            "old",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail("open a replaced file"))?;
        let mut buf = [0u8; 8];
        let n = rustix::io::read(&replaced, &mut buf).map_err(fail("read a replaced file"))?;
        if &buf[..n] != b"new" {
            return Err(FsError::SharedDirUnsupported {
                semantic: "rename a file over another (atomic replace)",
                errno: io::Error::other("the file kept its old content"),
            });
        }
        for leaf in ["a", "b"] {
            mkdirat(&scratch, leaf, Mode::from_raw_mode(0o700))
                .map_err(fail("create a directory"))?;
        }
        renameat_with(&scratch, "a", &scratch, "b", RenameFlags::EXCHANGE)
            .map_err(fail("swap two directories (renameat2 RENAME_EXCHANGE)"))?;
        flock(&scratch, FlockOperation::NonBlockingLockExclusive)
            .map_err(fail("lock a directory (flock)"))?;
        flock(&scratch, FlockOperation::Unlock).map_err(fail("unlock a directory (flock)"))?;
        if let Some(owner) = owner {
            let (uid, gid) = (Uid::from_raw(owner.uid), Gid::from_raw(owner.gid));
            fchown(replaced.as_fd(), Some(uid), Some(gid)).map_err(fail(
                "hand a file to the sandbox user (chown; root_squash refuses it)",
            ))?;
            let stat = fstat(&replaced).map_err(fail("stat a file"))?;
            if (stat.st_uid, stat.st_gid) != (owner.uid, owner.gid) {
                return Err(FsError::SharedDirUnsupported {
                    semantic: "hand a file to the sandbox user (chown)",
                    errno: io::Error::other(format!(
                        "the file is owned by {}:{} after chown",
                        stat.st_uid, stat.st_gid
                    )),
                });
            }
        }
        Ok(())
    })();
    // The scratch directory goes whatever happened; a leftover is harmless and named.
    let _ = std::fs::remove_dir_all(dir.join(&name));
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_has_every_semantic_a_shared_workspace_needs() {
        let dir = tempfile::tempdir().unwrap();
        let owner = rustix::process::geteuid()
            .is_root()
            .then_some(Owner::WORKSPACE);
        check_shared_dir(dir.path(), owner).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the scratch directory is removed"
        );
    }

    #[test]
    fn a_missing_directory_is_named() {
        let err = check_shared_dir(Path::new("/nonexistent/warren"), None).unwrap_err();
        assert!(err.to_string().contains("open the directory"), "{err}");
    }
}
