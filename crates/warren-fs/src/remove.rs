//! Renaming and removal, acting on the last component by name relative to its resolved
//! parent (I2), so a symlink is renamed or unlinked as itself and never followed.
//!
//! Recursive removal descends by descriptor: each subdirectory is opened with `O_NOFOLLOW`
//! relative to its parent's descriptor and checked to be on the root's mount, so a symlink or a
//! mount point inside the tree can never lead the removal outside the workspace.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{renameat_with, statat, unlinkat, AtFlags, Dir, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::error::{FsError, Op};
use crate::path::{join, RelPath};
use crate::resolve::Meta;
use crate::root::{lock_exclusive, WorkspaceRoot};
use crate::types::MAX_WALK_DEPTH;

impl WorkspaceRoot {
    /// Renames `from` to `to`; refuses to replace an existing `to` unless `overwrite`
    /// (`RENAME_NOREPLACE`). Both parents are resolved safely; the names themselves are not
    /// followed, so a symlink is moved as a link.
    pub fn rename(
        &self,
        from: &(impl AsRef<OsStr> + ?Sized),
        to: &(impl AsRef<OsStr> + ?Sized),
        overwrite: bool,
    ) -> Result<(), FsError> {
        self.ensure_writable(from)?;
        let from_path = RelPath::parse(from)?;
        let to_path = RelPath::parse(to)?;
        let (from_parents, from_leaf) = from_path
            .split_leaf()
            .ok_or(FsError::RootRefused { action: "rename" })?;
        let (to_parents, to_leaf) = to_path
            .split_leaf()
            .ok_or(FsError::RootRefused { action: "replace" })?;
        let from_dir = self.resolve_dir(from_parents, from_path.as_str())?;
        let to_dir = self.resolve_dir(to_parents, to_path.as_str())?;
        rename_between(
            from_dir.as_fd(),
            from_leaf,
            to_dir.as_fd(),
            to_leaf,
            overwrite,
            (from_path.as_str(), to_path.as_str()),
        )
    }

    /// Removes the file, symlink (the link itself) or directory at `rel`. A non-empty
    /// directory needs `recursive`; the root itself is never removed.
    pub fn remove(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
        recursive: bool,
    ) -> Result<(), FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        let p = path.as_str();
        let (parents, leaf) = path
            .split_leaf()
            .ok_or(FsError::RootRefused { action: "remove" })?;
        let dir = self.resolve_dir(parents, p)?;
        let st = statat(dir.as_fd(), leaf, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| FsError::from_errno(e, p, Op::Stat))?;
        if Meta::from_stat(&st).is_dir() {
            if recursive {
                let child = self
                    .anchor
                    .open_beneath(
                        dir.as_fd(),
                        &[leaf],
                        OFlags::RDONLY | OFlags::DIRECTORY,
                        Mode::empty(),
                    )
                    .map_err(|e| FsError::from_errno(e, p, Op::Open))?;
                self.remove_contents(child, p, 1)?;
            }
            unlinkat(dir.as_fd(), leaf, AtFlags::REMOVEDIR).map_err(|e| match e {
                // Some filesystems say EEXIST for a non-empty directory.
                Errno::EXIST | Errno::NOTEMPTY => FsError::DirectoryNotEmpty { path: p.to_owned() },
                e => FsError::from_errno(e, p, Op::Remove),
            })
        } else {
            unlinkat(dir.as_fd(), leaf, AtFlags::empty())
                .map_err(|e| FsError::from_errno(e, p, Op::Remove))
        }
    }

    /// Empties the directory `dir` (at root-relative `path`), depth first, by descriptor.
    fn remove_contents(&self, dir: OwnedFd, path: &str, depth: u32) -> Result<(), FsError> {
        if depth > MAX_WALK_DEPTH {
            return Err(FsError::TooDeep {
                path: path.to_owned(),
                limit: MAX_WALK_DEPTH,
            });
        }
        let (dir, names) = read_names(dir, path)?;
        let dir_fd = dir
            .fd()
            .map_err(|e| FsError::from_errno(e, path, Op::List))?;
        for name in names {
            let child_path = join(path, &name.to_string_lossy());
            let st = match statat(dir_fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue, // removed concurrently: nothing to do
                Err(e) => return Err(FsError::from_errno(e, &child_path, Op::Stat)),
            };
            if Meta::from_stat(&st).is_dir() {
                match self.anchor.open_beneath(
                    dir_fd,
                    &[name.as_os_str()],
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    Mode::empty(),
                ) {
                    Ok(child) => self.remove_contents(child, &child_path, depth + 1)?,
                    Err(Errno::NOENT) => continue,
                    // Replaced by a symlink since the statat: unlink the link itself below.
                    Err(Errno::LOOP) => {}
                    // A mount point (EXDEV) or anything else: stop rather than reach into it.
                    Err(e) => return Err(FsError::from_errno(e, &child_path, Op::Open)),
                }
                match unlinkat(dir_fd, &name, AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(Errno::NOTDIR) => remove_name(dir_fd, &name, &child_path)?,
                    Err(e) => return Err(FsError::from_errno(e, &child_path, Op::Remove)),
                }
            } else {
                remove_name(dir_fd, &name, &child_path)?;
            }
        }
        Ok(())
    }
}

/// Unlinks a non-directory entry (a symlink is removed as itself).
fn remove_name(dir: BorrowedFd<'_>, name: &OsStr, path: &str) -> Result<(), FsError> {
    match unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(FsError::from_errno(e, path, Op::Remove)),
    }
}

/// Reads every entry name of `dir` (without `.` and `..`), sorted bytewise.
///
/// Names are collected before anything is acted on, so removals and opens never interleave
/// with the directory stream.
pub(crate) fn read_names(dir: OwnedFd, path: &str) -> Result<(Dir, Vec<OsString>), FsError> {
    let mut stream = Dir::new(dir).map_err(|e| FsError::from_errno(e, path, Op::List))?;
    let mut names = Vec::new();
    for entry in stream.by_ref() {
        let entry = entry.map_err(|e| FsError::from_errno(e, path, Op::List))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok((stream, names))
}

/// Renames `from_leaf` in `from_dir` to `to_leaf` in `to_dir` (real descriptors: the
/// destination's is locked), refusing to replace an existing destination unless
/// `overwrite`; `shown` names both in errors. [`WorkspaceRoot::rename`] once both parents
/// are resolved, and a runtime's agent's rename of paths it resolved itself.
pub fn rename_between(
    from_dir: BorrowedFd<'_>,
    from_leaf: &OsStr,
    to_dir: BorrowedFd<'_>,
    to_leaf: &OsStr,
    overwrite: bool,
    shown: (&str, &str),
) -> Result<(), FsError> {
    // Replacing the destination is a write to it: serialise with conditional writers
    // there (I27). Only one lock is taken, so two renames can never deadlock.
    lock_exclusive(to_dir, shown.1)?;
    let flags = if overwrite {
        RenameFlags::empty()
    } else {
        RenameFlags::NOREPLACE
    };
    let renamed = match renameat_with(from_dir, from_leaf, to_dir, to_leaf, flags) {
        // A file system without `RENAME_NOREPLACE` (gVisor's gofer-backed tree): checked,
        // then renamed, under the destination directory's lock taken above.
        Err(Errno::INVAL) if !overwrite => {
            match statat(to_dir, to_leaf, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(_) => Err(Errno::EXIST),
                Err(Errno::NOENT) => {
                    renameat_with(from_dir, from_leaf, to_dir, to_leaf, RenameFlags::empty())
                }
                Err(other) => Err(other),
            }
        }
        other => other,
    };
    renamed.map_err(|e| {
        let (f, t) = shown;
        match e {
            Errno::NOENT => FsError::NotFound { path: f.to_owned() },
            Errno::EXIST => FsError::AlreadyExists { path: t.to_owned() },
            Errno::NOTEMPTY => FsError::DirectoryNotEmpty { path: t.to_owned() },
            Errno::ISDIR => FsError::IsADirectory { path: t.to_owned() },
            Errno::NOTDIR => FsError::NotADirectory { path: t.to_owned() },
            Errno::XDEV => FsError::MountCrossingRefused { path: t.to_owned() },
            Errno::ACCESS | Errno::PERM => FsError::PermissionDenied { path: f.to_owned() },
            Errno::ROFS => FsError::ReadOnly { path: f.to_owned() },
            other => FsError::Rename {
                from: f.to_owned(),
                to: t.to_owned(),
                errno: other.into(),
            },
        }
    })
}
