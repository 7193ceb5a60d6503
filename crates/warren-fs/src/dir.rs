//! Directories handed out by descriptor, for callers that keep one open and work beneath it
//! later (a directory watch: inotify on `/proc/self/fd/<n>`, a listing by descriptor).
//!
//! Every directory here is opened the way the rest of the crate resolves paths (I2): the
//! path beneath the root through the chosen [`crate::Resolver`], a child by one
//! `O_NOFOLLOW` name relative to its parent's descriptor. A symlink in any component, the
//! last one included, `..`, and a mount crossing are refused by the kernel, so what the
//! caller holds is always a directory inside the root's tree, whatever its path becomes.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{openat, statat, AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{shorten, FsError, InvalidPathReason, Op};
use crate::path::RelPath;
use crate::resolve::{mount_id, Anchor, Meta, Resolver};
use crate::root::WorkspaceRoot;

/// How a directory is opened here: a real open file description (not `O_PATH`), so the
/// holder can also list it (`getdents`) and `inotify_add_watch` its `/proc/self/fd` link.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY
}

impl WorkspaceRoot {
    /// Opens the directory `rel` beneath the root and hands its descriptor out
    /// (`O_RDONLY | O_DIRECTORY | O_CLOEXEC`).
    ///
    /// Resolved like every path of the crate (I2): `..`, a symlink in any component (the last
    /// one included: a link to a directory is refused, not followed) and a mount crossing
    /// fail, and a file is [`FsError::NotADirectory`]. The descriptor names that very
    /// directory for as long as it is held, whatever is renamed or swapped afterwards.
    pub fn open_dir(&self, rel: &(impl AsRef<OsStr> + ?Sized)) -> Result<OwnedFd, FsError> {
        let path = RelPath::parse(rel)?;
        self.resolve_dir(path.comps(), path.as_str())
    }

    /// A read-only root on a directory descriptor that [`WorkspaceRoot::open_dir`] or
    /// [`open_child_dir`] handed out: its stat, list, glob and grep work beneath that
    /// directory, resolved from it like any root's (I2), and it never writes.
    ///
    /// The anchor (resolver, device, mount) is the directory's own, which is the mount of
    /// the root it was opened beneath, since opening it refused any crossing.
    pub fn from_dir_fd(fd: OwnedFd) -> Result<Self, FsError> {
        let meta =
            Meta::of(fd.as_fd()).map_err(|e| FsError::RootUnavailable { errno: e.into() })?;
        if !meta.is_dir() {
            return Err(FsError::RootUnavailable {
                errno: Errno::NOTDIR.into(),
            });
        }
        let resolver = Resolver::detect(fd.as_fd());
        Ok(Self::from_fd(fd, resolver)?.read_only())
    }
}

/// Opens the directory `name` inside the directory `dir` (a descriptor from
/// [`WorkspaceRoot::open_dir`] or from this function), refusing a symlink
/// ([`FsError::SymlinkRefused`]), a non-directory ([`FsError::NotADirectory`]) and a mount
/// point ([`FsError::MountCrossingRefused`]) (I2).
///
/// `name` is one directory entry: a name with `/`, an empty name, `.` and `..` are refused
/// before any syscall. This is how a recursive watch descends, one name at a time from the
/// parent's descriptor, never by a path string.
pub fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, FsError> {
    let path = RelPath::parse(name)?;
    let [leaf] = path.comps() else {
        return Err(FsError::InvalidPath {
            path: shorten(&name.to_string_lossy()),
            reason: InvalidPathReason::NotOneName,
        });
    };
    let parent = Meta::of(dir).map_err(|e| FsError::from_errno(e, path.as_str(), Op::Open))?;
    if !parent.is_dir() {
        return Err(FsError::NotADirectory {
            path: path.as_str().to_owned(),
        });
    }
    // The parent's own device and mount are the ones the child may not leave: the parent was
    // itself opened without crossing one, so this is the root's mount.
    let anchor = Anchor {
        resolver: Resolver::detect(dir),
        dev: parent.dev,
        mnt_id: mount_id(dir),
    };
    anchor
        .open_beneath(dir, &[leaf], dir_flags(), Mode::empty())
        .map_err(|e| FsError::from_errno(e, path.as_str(), Op::Open))
}

/// The names of the directories directly inside `dir` (sorted bytewise), for a recursive
/// watch that adds one watch per subdirectory: symlinks, even to directories, are not
/// directories here (I2), and nothing else is listed, so a directory of many files costs
/// its names' memory only while it is read.
///
/// `dir` is read through a fresh open file description of itself (`.`), so the caller's
/// descriptor keeps its own offset. A name that vanishes while it is read is skipped.
pub fn child_dirs(dir: BorrowedFd<'_>) -> Result<Vec<OsString>, FsError> {
    // `.` names the directory itself: nothing is resolved or followed.
    let fd = openat(dir, ".", dir_flags() | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| FsError::from_errno(e, "", Op::List))?;
    let mut stream = Dir::new(fd).map_err(|e| FsError::from_errno(e, "", Op::List))?;
    let mut names = Vec::new();
    for entry in stream.by_ref() {
        let entry = entry.map_err(|e| FsError::from_errno(e, "", Op::List))?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            // Filesystems that do not fill `d_type` say Unknown: ask the inode, not following.
            FileType::Unknown => match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Meta::from_stat(&st).is_dir(),
                Err(Errno::NOENT) => false,
                Err(e) => return Err(FsError::from_errno(e, &name.to_string_lossy(), Op::Stat)),
            },
            _ => false,
        };
        if is_dir {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "warren-fs-dir-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/file"), b"x").unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        symlink(dir.join("outside"), dir.join("a/link")).unwrap();
        symlink("b", dir.join("a/rel_link")).unwrap();
        dir
    }

    #[test]
    fn a_directory_opens_by_descriptor_and_links_in_any_component_are_refused() {
        let dir = scratch();
        for resolver in Resolver::ALL {
            let root = WorkspaceRoot::open_with(&dir, resolver).unwrap();
            let fd = root.open_dir("a/b").unwrap();
            assert!(Meta::of(fd.as_fd()).unwrap().is_dir());
            assert!(root.open_dir("").is_ok(), "the root itself");
            for (path, what) in [
                ("a/link", "a trailing link"),
                ("a/rel_link", "a relative trailing link"),
                ("a/link/x", "a link in the middle"),
            ] {
                let error = root.open_dir(path).unwrap_err();
                assert!(
                    matches!(
                        error,
                        FsError::SymlinkRefused { .. } | FsError::NotFound { .. }
                    ),
                    "{what}: {error:?}"
                );
            }
            assert!(matches!(
                root.open_dir("a/link").unwrap_err(),
                FsError::SymlinkRefused { .. }
            ));
            assert!(matches!(
                root.open_dir("a/../outside").unwrap_err(),
                FsError::InvalidPath { .. }
            ));
            assert!(matches!(
                root.open_dir("a/file").unwrap_err(),
                FsError::NotADirectory { .. }
            ));
            assert!(matches!(
                root.open_dir("/etc").unwrap_err(),
                FsError::InvalidPath { .. }
            ));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_child_directory_opens_by_name_from_its_parent_only() {
        let dir = scratch();
        let root = WorkspaceRoot::open(&dir).unwrap();
        let a = root.open_dir("a").unwrap();
        let b = open_child_dir(a.as_fd(), OsStr::new("b")).unwrap();
        assert!(Meta::of(b.as_fd()).unwrap().is_dir());
        assert!(matches!(
            open_child_dir(a.as_fd(), OsStr::new("link")).unwrap_err(),
            FsError::SymlinkRefused { .. }
        ));
        assert!(matches!(
            open_child_dir(a.as_fd(), OsStr::new("file")).unwrap_err(),
            FsError::NotADirectory { .. }
        ));
        for bad in ["..", ".", "", "b/c", "/b"] {
            assert!(
                matches!(
                    open_child_dir(a.as_fd(), OsStr::new(bad)).unwrap_err(),
                    FsError::InvalidPath { .. }
                ),
                "{bad:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn child_directories_are_directories_never_links() {
        let dir = scratch();
        let root = WorkspaceRoot::open(&dir).unwrap();
        let a = root.open_dir("a").unwrap();
        assert_eq!(child_dirs(a.as_fd()).unwrap(), [OsString::from("b")]);
        // The caller's descriptor is not consumed or moved on: it lists again the same.
        assert_eq!(child_dirs(a.as_fd()).unwrap(), [OsString::from("b")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_root_from_a_directory_descriptor_reads_beneath_it_and_never_writes() {
        let dir = scratch();
        let root = WorkspaceRoot::open(&dir).unwrap();
        let a = WorkspaceRoot::from_dir_fd(root.open_dir("a").unwrap()).unwrap();
        assert!(a.is_read_only());
        assert_eq!(a.stat("file").unwrap().size, 1);
        let names: Vec<String> = a
            .list("", 1, 100)
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(names, ["b", "file", "link", "rel_link"]);
        assert!(matches!(
            a.stat("link/x").unwrap_err(),
            FsError::SymlinkRefused { .. }
        ));
        assert!(matches!(
            a.write("new", b"x", Default::default()).unwrap_err(),
            FsError::ReadOnly { .. }
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
