//! Resolution of an absolute path inside a *runtime*, as a process rooted there sees it:
//! what [`crate::WorkspaceRoot`] refuses (links, mount crossings) is followed here, but
//! never out of the root (`RESOLVE_IN_ROOT` semantics, done by hand so it works on every
//! kernel and inside gVisor).
//!
//! [`walk_in_root`] opens one component at a time with `O_PATH | O_NOFOLLOW` relative to
//! the previous directory's descriptor. A symlink met on the way is read
//! (`readlinkat`) and its target spliced into the components still to walk: an absolute
//! target starts again from the root descriptor, `..` never climbs above it. A magic link
//! (`/proc/<pid>/root`, `/proc/self/fd/<n>`) is never opened through: its text is resolved
//! like any link's, inside the root, so it can only name what the root already holds. At
//! most [`MAX_LINKS`] links are followed (the kernel's own bound), then `ELOOP`.
//!
//! The caller is the runtime's own agent, as the sandbox user, with the runtime's root as
//! its root: every permission check is the kernel's, for that user, exactly as for a
//! command.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{openat, readlinkat, Mode, OFlags};
use rustix::io::Errno;

use crate::resolve::Meta;

/// The most symlinks one resolution follows (Linux's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// Where a walk inside a runtime ended.
#[derive(Debug)]
pub struct InRoot {
    /// The deepest directory reached (an `O_PATH` descriptor).
    pub dir: OwnedFd,
    /// The components not walked: empty when the path is `dir` itself; one name when the
    /// last component is not a directory (or was not to be followed, or does not exist);
    /// more when a parent is missing (the first of them is the missing one).
    pub rest: Vec<OsString>,
}

impl InRoot {
    /// The one name left, when exactly one is.
    pub fn leaf(&self) -> Option<&OsStr> {
        match self.rest.as_slice() {
            [leaf] => Some(leaf),
            _ => None,
        }
    }

    /// The directory reached, opened again as a real descriptor (for `getdents`, `flock`
    /// and the `*at` calls a [`crate::WorkspaceRoot`] makes).
    pub fn open_dir(&self) -> Result<OwnedFd, Errno> {
        // `.` names the directory itself: nothing is resolved or followed.
        openat(
            self.dir.as_fd(),
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    }
}

/// Walks `path` (absolute or not, it is taken from `root` either way) beneath `root`,
/// following links inside it; the last component is followed too when `follow_last`.
/// Stops at the first component that does not exist. Errors: `ENOTDIR` for a file used as a
/// directory, `ELOOP` past [`MAX_LINKS`] links, and what the kernel says (`EACCES` for a
/// directory the caller may not search).
pub fn walk_in_root(
    root: BorrowedFd<'_>,
    path: &OsStr,
    follow_last: bool,
) -> Result<InRoot, Errno> {
    let root_dir = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    // The directories from the root down to where the walk is, so `..` can climb back.
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut pending: Vec<OsString> = components(path.as_bytes());
    pending.reverse();
    let mut links = 0usize;
    while let Some(name) = pending.pop() {
        if name == ".." {
            stack.pop();
            continue;
        }
        let last = pending.is_empty();
        if last && !follow_last {
            pending.push(name);
            break;
        }
        let here = stack.last().map_or(root_dir.as_fd(), |fd| fd.as_fd());
        let fd = match openat(
            here,
            &name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                pending.push(name);
                break;
            }
            Err(error) => return Err(error),
        };
        let meta = Meta::of(fd.as_fd())?;
        if meta.is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::LOOP);
            }
            let target = readlinkat(here, &name, Vec::new())?;
            let target = target.as_bytes();
            if target.first() == Some(&b'/') {
                stack.clear();
            }
            // The target's components go first, the rest of the path after them.
            pending.extend(components(target).into_iter().rev());
            continue;
        }
        if meta.is_dir() {
            stack.push(fd);
            continue;
        }
        if !last {
            return Err(Errno::NOTDIR);
        }
        pending.push(name);
        break;
    }
    pending.reverse();
    let dir = match stack.pop() {
        Some(dir) => dir,
        None => root_dir,
    };
    Ok(InRoot { dir, rest: pending })
}

/// The non-empty, non-`.` components of `path`.
fn components(path: &[u8]) -> Vec<OsString> {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(|c| OsStr::from_bytes(c).to_os_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn open(path: &std::path::Path) -> OwnedFd {
        openat(
            rustix::fs::CWD,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    fn inode(fd: BorrowedFd<'_>) -> u64 {
        Meta::of(fd).unwrap().inode
    }

    #[test]
    fn links_are_followed_but_never_out_of_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        std::fs::write(root.path().join("usr/bin/tool"), b"x").unwrap();
        symlink("usr/bin", root.path().join("bin")).unwrap();
        symlink("/", root.path().join("to-root")).unwrap();
        symlink("../../../../..", root.path().join("usr/up")).unwrap();
        symlink(outside.path(), root.path().join("host")).unwrap();
        std::fs::create_dir(outside.path().join("secret")).unwrap();
        let fd = open(root.path());
        let root_inode = inode(fd.as_fd());

        let tool = walk_in_root(fd.as_fd(), OsStr::new("/bin/tool"), true).unwrap();
        assert_eq!(tool.leaf(), Some(OsStr::new("tool")));
        let bin = open(&root.path().join("usr/bin"));
        assert_eq!(inode(tool.dir.as_fd()), inode(bin.as_fd()));

        for escape in [
            "/to-root",
            "/usr/up",
            "/usr/up/..",
            "/../../..",
            "/to-root/..",
        ] {
            let found = walk_in_root(fd.as_fd(), OsStr::new(escape), true).unwrap();
            assert!(found.rest.is_empty(), "{escape}");
            assert_eq!(inode(found.dir.as_fd()), root_inode, "{escape}");
        }
        // A host path in a link is read inside the root, where it does not exist.
        let host = walk_in_root(fd.as_fd(), OsStr::new("/host/secret"), true).unwrap();
        assert_eq!(inode(host.dir.as_fd()), root_inode);
        assert_eq!(
            host.rest.first().map(|c| c.as_os_str()),
            Some(OsStr::new("tmp"))
        );
    }

    #[test]
    fn the_last_link_is_left_alone_unless_followed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("dir")).unwrap();
        symlink("dir", root.path().join("link")).unwrap();
        let fd = open(root.path());
        let kept = walk_in_root(fd.as_fd(), OsStr::new("link"), false).unwrap();
        assert_eq!(kept.leaf(), Some(OsStr::new("link")));
        let followed = walk_in_root(fd.as_fd(), OsStr::new("link"), true).unwrap();
        assert!(followed.rest.is_empty());
    }

    #[test]
    fn a_missing_parent_is_named_and_a_loop_ends() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("file"), b"x").unwrap();
        symlink("b", root.path().join("a")).unwrap();
        symlink("a", root.path().join("b")).unwrap();
        let fd = open(root.path());
        let missing = walk_in_root(fd.as_fd(), OsStr::new("/no/such/thing"), true).unwrap();
        assert_eq!(missing.rest, ["no", "such", "thing"]);
        assert_eq!(
            walk_in_root(fd.as_fd(), OsStr::new("/file/x"), true).unwrap_err(),
            Errno::NOTDIR
        );
        assert_eq!(
            walk_in_root(fd.as_fd(), OsStr::new("/a/x"), true).unwrap_err(),
            Errno::LOOP
        );
    }
}
