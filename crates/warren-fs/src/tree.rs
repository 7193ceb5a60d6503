//! Primitives for copying whole trees in and out of a workspace (checkpoints and snapshots):
//! streaming reads and creates, symlinks and hardlinks made as themselves, attributes set
//! without following anything, and the atomic exchange of two directories.
//!
//! Like every mutation here, each call resolves the *parent* by descriptor (I2) and names
//! the last component only through `*at` calls, so a link planted anywhere is refused or
//! acted on as a link, never followed.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{
    fchmod, linkat, renameat_with, symlinkat, utimensat, AtFlags, Mode, OFlags, RenameFlags,
    Timespec, Timestamps, UTIME_OMIT,
};

use crate::error::{FsError, Op};
use crate::path::{join_os, RelPath};
use crate::resolve::Meta;
use crate::root::WorkspaceRoot;

impl WorkspaceRoot {
    /// Opens the regular file at `rel` for reading as a stream (for files too large to read
    /// whole). A link, a directory or a device is refused.
    pub fn open_file(&self, rel: &(impl AsRef<OsStr> + ?Sized)) -> Result<File, FsError> {
        let path = RelPath::parse(rel)?;
        Ok(self.open_regular(&path)?.0)
    }

    /// The parent of `path` as a descriptor, and its last component.
    fn parent_of<'p>(&self, path: &'p RelPath<'p>) -> Result<(OwnedFd, &'p OsStr), FsError> {
        let (parents, leaf) = path
            .split_leaf()
            .ok_or(FsError::RootRefused { action: "replace" })?;
        Ok((self.resolve_dir(parents, path.as_str())?, leaf))
    }

    /// Creates the regular file `rel`, which must not exist (`O_EXCL`), in an existing
    /// parent, and returns it open for writing. Owned by the workspace owner (I11).
    pub fn create_file(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
        mode: u32,
    ) -> Result<File, FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        let (parent, leaf) = self.parent_of(&path)?;
        let fd = self
            .anchor
            .open_beneath(
                parent.as_fd(),
                &[leaf],
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                Mode::from_raw_mode(mode & 0o777),
            )
            .map_err(|e| FsError::from_errno(e, path.as_str(), Op::Create))?;
        self.chown_new(fd.as_fd(), path.as_str())?;
        fchmod(fd.as_fd(), Mode::from_raw_mode(mode & 0o777))
            .map_err(|e| FsError::from_errno(e, path.as_str(), Op::SetAttributes))?;
        Ok(File::from(fd))
    }

    /// Creates the symbolic link `rel` with `target` stored as is, byte for byte (never
    /// resolved; only a NUL, which no target can hold, is refused).
    pub fn create_symlink(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
        target: &(impl AsRef<OsStr> + ?Sized),
    ) -> Result<(), FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        let (parent, leaf) = self.parent_of(&path)?;
        symlinkat(target.as_ref(), parent.as_fd(), leaf)
            .map_err(|e| FsError::from_errno(e, path.as_str(), Op::Create))?;
        if let Some(owner) = self.owner() {
            rustix::fs::chownat(
                parent.as_fd(),
                leaf,
                Some(rustix::fs::Uid::from_raw(owner.uid)),
                Some(rustix::fs::Gid::from_raw(owner.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| FsError::from_errno(e, path.as_str(), Op::SetAttributes))?;
        }
        Ok(())
    }

    /// Makes `new` a hard link to the existing regular file `existing` (both beneath the
    /// root; a link is never followed, so only a file the root holds can be linked).
    pub fn create_hardlink(
        &self,
        existing: &(impl AsRef<OsStr> + ?Sized),
        new: &(impl AsRef<OsStr> + ?Sized),
    ) -> Result<(), FsError> {
        self.ensure_writable(new)?;
        let from = RelPath::parse(existing)?;
        let to = RelPath::parse(new)?;
        let (from_parent, from_leaf) = self.parent_of(&from)?;
        let (to_parent, to_leaf) = self.parent_of(&to)?;
        let meta = rustix::fs::statat(from_parent.as_fd(), from_leaf, AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| Meta::from_stat(&st))
            .map_err(|e| FsError::from_errno(e, from.as_str(), Op::Stat))?;
        if !meta.is_file() {
            return Err(FsError::NotAFile {
                path: from.as_str().to_owned(),
            });
        }
        linkat(
            from_parent.as_fd(),
            from_leaf,
            to_parent.as_fd(),
            to_leaf,
            AtFlags::empty(),
        )
        .map_err(|e| FsError::from_errno(e, to.as_str(), Op::Create))
    }

    /// Sets the permission bits (not for symlinks, which have none) and the modification
    /// time (milliseconds since the epoch) of `rel`, without following it.
    pub fn set_attributes(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
        mode: Option<u32>,
        modified_unix_ms: i64,
    ) -> Result<(), FsError> {
        let modified_unix_ns = modified_unix_ms
            .div_euclid(1000)
            .saturating_mul(1_000_000_000)
            .saturating_add(modified_unix_ms.rem_euclid(1000) * 1_000_000);
        self.set_attributes_ns(rel, mode, modified_unix_ns)
    }

    /// [`WorkspaceRoot::set_attributes`] with the modification time to the nanosecond
    /// (nanoseconds since the epoch, negative before 1970), as `cp -a` keeps it.
    pub fn set_attributes_ns(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
        mode: Option<u32>,
        modified_unix_ns: i64,
    ) -> Result<(), FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        let (parent, leaf) = self.parent_of(&path)?;
        if let Some(mode) = mode {
            // Through a descriptor of the entry itself: fchmodat cannot refuse links.
            let fd = self
                .anchor
                .open_beneath(parent.as_fd(), &[leaf], OFlags::PATH, Mode::empty())
                .map_err(|e| FsError::from_errno(e, path.as_str(), Op::Open))?;
            let meta = Meta::of(fd.as_fd())
                .map_err(|e| FsError::from_errno(e, path.as_str(), Op::Stat))?;
            if !meta.is_symlink() {
                // An O_PATH descriptor cannot be fchmod'ed; /proc/self/fd can, without
                // resolving anything the workspace controls.
                let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
                rustix::fs::chmod(proc_path.as_str(), Mode::from_raw_mode(mode & 0o7777))
                    .map_err(|e| FsError::from_errno(e, path.as_str(), Op::SetAttributes))?;
            }
        }
        let modified = Timespec {
            tv_sec: modified_unix_ns.div_euclid(1_000_000_000),
            tv_nsec: modified_unix_ns.rem_euclid(1_000_000_000),
        };
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
            last_modification: modified,
        };
        utimensat(parent.as_fd(), leaf, &times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| FsError::from_errno(e, path.as_str(), Op::SetAttributes))
    }

    /// Makes everything written beneath the root durable (`syncfs`): one call after a whole
    /// tree is written instead of one `fsync` per file.
    pub fn sync_filesystem(&self) -> Result<(), FsError> {
        rustix::fs::syncfs(self.root_fd()).map_err(|e| FsError::from_errno(e, "", Op::Write))
    }

    /// Swaps the directories (or files) `a` and `b` in one atomic step
    /// (`renameat2(RENAME_EXCHANGE)`): a reader sees one or the other, never a mix.
    pub fn exchange(
        &self,
        a: &(impl AsRef<OsStr> + ?Sized),
        b: &(impl AsRef<OsStr> + ?Sized),
    ) -> Result<(), FsError> {
        self.ensure_writable(a)?;
        let first = RelPath::parse(a)?;
        let second = RelPath::parse(b)?;
        let (first_parent, first_leaf) = self.parent_of(&first)?;
        let (second_parent, second_leaf) = self.parent_of(&second)?;
        renameat_with(
            first_parent.as_fd(),
            first_leaf,
            second_parent.as_fd(),
            second_leaf,
            RenameFlags::EXCHANGE,
        )
        .map_err(|e| FsError::from_errno(e, first.as_str(), Op::Remove))
    }
}

/// What [`WorkspaceRoot::copy_tree_from`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links (copied as links, never followed).
    pub symlinks: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Entries that are neither (sockets, fifos, devices), skipped.
    pub skipped: u64,
}

impl WorkspaceRoot {
    /// Copies the tree `from` beneath `source` into `to` beneath this root, which must not
    /// exist yet or be an empty directory: directories, files (streamed, with their
    /// permission bits and times) and symlinks (as links). Both sides are walked and
    /// written by descriptor; nothing on either side is followed, and nothing existing is
    /// overwritten. Created entries belong to this root's owner (I11).
    pub fn copy_tree_from(
        &self,
        source: &WorkspaceRoot,
        from: &(impl AsRef<OsStr> + ?Sized),
        to: &(impl AsRef<OsStr> + ?Sized),
    ) -> Result<CopyStats, FsError> {
        self.ensure_writable(to)?;
        let (from, to) = (from.as_ref(), to.as_ref());
        let mut stats = CopyStats::default();
        self.mkdir_p(to)?;
        const MAX_COPY_ENTRIES: usize = 5_000_000;
        let listing = source.list(from, crate::MAX_WALK_DEPTH, MAX_COPY_ENTRIES)?;
        // Copy all or nothing: a cut listing would be a silently partial copy.
        if listing.truncated {
            return Err(FsError::TooManyEntries {
                path: from.to_string_lossy().into_owned(),
                limit: MAX_COPY_ENTRIES,
            });
        }
        // Listed paths are the normalised form of `from` and the names beneath it, as
        // bytes: names that are not UTF-8 are copied as they are.
        let from = RelPath::parse(from)?.to_os_string();
        let to = RelPath::parse(to)?.to_os_string();
        let target = |path: &OsStr| -> OsString {
            let relative = path
                .as_bytes()
                .strip_prefix(from.as_bytes())
                .map(|rest| rest.strip_prefix(b"/").unwrap_or(rest))
                .unwrap_or(path.as_bytes());
            join_os(&to, OsStr::from_bytes(relative))
        };
        let mut attributes = Vec::new();
        for entry in &listing.entries {
            let dest = target(&entry.os_path);
            match entry.kind {
                crate::Kind::Dir => {
                    self.mkdir_p(&dest)?;
                    stats.dirs += 1;
                    attributes.push((dest, Some(entry.mode), entry.modified_unix_ns));
                }
                crate::Kind::Symlink => {
                    self.create_symlink(
                        &dest,
                        entry.os_symlink_target.as_deref().unwrap_or_default(),
                    )?;
                    stats.symlinks += 1;
                    attributes.push((dest, None, entry.modified_unix_ns));
                }
                crate::Kind::File => {
                    let mut input = source.open_file(&entry.os_path)?;
                    let mut output = self.create_file(&dest, 0o600)?;
                    let copied = std::io::copy(&mut input, &mut output).map_err(|e| {
                        FsError::from_errno(
                            rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
                            &dest.to_string_lossy(),
                            Op::Write,
                        )
                    })?;
                    stats.files += 1;
                    stats.bytes += copied;
                    attributes.push((dest, Some(entry.mode & 0o777), entry.modified_unix_ns));
                }
                crate::Kind::Other => stats.skipped += 1,
            }
        }
        // Children before parents, so a read-only directory is sealed last.
        for (path, mode, modified) in attributes.into_iter().rev() {
            self.set_attributes_ns(&path, mode, modified)?;
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, MetadataExt};

    use crate::{Resolver, WorkspaceRoot};

    #[test]
    fn a_nanosecond_modification_time_is_set_and_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        symlink("file", dir.path().join("link")).unwrap();
        for resolver in Resolver::ALL {
            let root = WorkspaceRoot::open_with(dir.path(), resolver).unwrap();
            // After 1970, and before it (a negative time whose nanoseconds still count up).
            for (ns, secs, nanos) in [
                (1_700_000_000_123_456_789, 1_700_000_000, 123_456_789),
                (-1_500_000_001, -2, 499_999_999),
            ] {
                root.set_attributes_ns("file", Some(0o640), ns).unwrap();
                root.set_attributes_ns("link", None, ns).unwrap();
                // `stat` refuses a link; a listing shows it as itself.
                let listing = root.list("", 1, 10).unwrap();
                let listed = |name: &str| {
                    let entry = listing.entries.iter().find(|e| e.path == name);
                    entry.unwrap().clone()
                };
                assert_eq!(root.stat("file").unwrap(), listed("file"));
                for name in ["file", "link"] {
                    let entry = listed(name);
                    assert_eq!(entry.modified_unix_ns, ns, "{name} {resolver:?}");
                    assert_eq!(
                        entry.modified_unix_ms,
                        ns.div_euclid(1_000_000),
                        "{name} {resolver:?}"
                    );
                    let host = std::fs::symlink_metadata(dir.path().join(name)).unwrap();
                    assert_eq!((host.mtime(), host.mtime_nsec()), (secs, nanos), "{name}");
                }
                assert_eq!(listed("file").mode, 0o640);
                assert_eq!(listed("link").symlink_target.as_deref(), Some("file"));
            }
            // Milliseconds are the same time with no nanoseconds beyond them.
            root.set_attributes("file", None, -1_001).unwrap();
            assert_eq!(root.stat("file").unwrap().modified_unix_ns, -1_001_000_000);
        }
    }
}
