//! [`WorkspaceRoot`]: the open workspace directory, its policies, and the read side of the API.
//!
//! Every method resolves its relative path beneath the root descriptor with the chosen
//! [`Resolver`] (I2); nothing here ever opens a host path other than the root itself.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{fchown, openat, Gid, Mode, OFlags, Uid, CWD};
use rustix::io::Errno;
use rustix::process::geteuid;

use crate::error::{FsError, Op};
use crate::etag::{Etag, EtagHasher};
use crate::path::RelPath;
use crate::resolve::{mount_id, Anchor, Meta, Resolver};
use crate::types::{ByteRange, Entry, Kind, ReadResult};

/// Chunk size for streaming reads and hashing.
pub(crate) const CHUNK: usize = 64 * 1024;

/// The user and group that own what this crate creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Owner {
    /// The in-sandbox user every workspace file belongs to (I11: 1000:1000).
    pub const WORKSPACE: Owner = Owner {
        uid: 1000,
        gid: 1000,
    };
}

/// One UserWorkspace, opened by descriptor. All paths given to its methods are relative to it.
///
/// `Send + Sync`: every method opens its own descriptors, so one value may serve many threads.
#[derive(Debug)]
pub struct WorkspaceRoot {
    fd: OwnedFd,
    pub(crate) anchor: Anchor,
    owner: Option<Owner>,
    read_only: bool,
}

impl WorkspaceRoot {
    /// Opens the trusted host directory `root` as a workspace, using `openat2` when the kernel
    /// has it (probed once per process) and the `O_NOFOLLOW` walk otherwise.
    pub fn open(root: &Path) -> Result<Self, FsError> {
        let fd = open_root_fd(root)?;
        let resolver = Resolver::detect(fd.as_fd());
        Self::from_fd(fd, resolver)
    }

    /// Opens `root` as a workspace with an explicit resolver.
    pub fn open_with(root: &Path, resolver: Resolver) -> Result<Self, FsError> {
        Self::from_fd(open_root_fd(root)?, resolver)
    }

    pub(crate) fn from_fd(fd: OwnedFd, resolver: Resolver) -> Result<Self, FsError> {
        let meta =
            Meta::of(fd.as_fd()).map_err(|e| FsError::RootUnavailable { errno: e.into() })?;
        let anchor = Anchor {
            resolver,
            dev: meta.dev,
            mnt_id: mount_id(fd.as_fd()),
        };
        // Only root can hand files to another uid; an unprivileged server keeps its own (I11).
        let owner = geteuid().is_root().then_some(Owner::WORKSPACE);
        Ok(Self {
            fd,
            anchor,
            owner,
            read_only: false,
        })
    }

    /// Sets who owns created files and directories; `None` leaves them to the server's user.
    pub fn with_owner(mut self, owner: Option<Owner>) -> Self {
        self.owner = owner;
        self
    }

    /// Makes every mutating operation fail with [`FsError::ReadOnly`].
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The resolver in use.
    pub fn resolver(&self) -> Resolver {
        self.anchor.resolver
    }

    /// Who created files and directories are handed to.
    pub fn owner(&self) -> Option<Owner> {
        self.owner
    }

    /// Whether the workspace was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Metadata of the object at `rel`; a symlink anywhere in the path (the last component
    /// included) is refused. Does not hash: see [`WorkspaceRoot::etag`].
    ///
    /// `rel` is a `&str` or, for names that are not UTF-8, any `OsStr` (its exact bytes);
    /// both are checked and resolved the same way. So are the other tree operations'.
    pub fn stat(&self, rel: &(impl AsRef<OsStr> + ?Sized)) -> Result<Entry, FsError> {
        let path = RelPath::parse(rel)?;
        let fd = self.resolve(&path, OFlags::PATH)?;
        let meta =
            Meta::of(fd.as_fd()).map_err(|e| FsError::from_errno(e, path.as_str(), Op::Stat))?;
        Ok(entry_from_meta(
            path.as_str().to_owned(),
            path.to_os_string(),
            &meta,
            None,
        ))
    }

    /// The ETag of the regular file at `rel`, hashed while streaming it.
    pub fn etag(&self, rel: &str) -> Result<Etag, FsError> {
        let path = RelPath::parse(rel)?;
        let (file, _) = self.open_regular(&path)?;
        Ok(hash_file(&file, path.as_str())?.0)
    }

    /// Reads `range` of the regular file at `rel`, refusing a span longer than `cap` bytes.
    ///
    /// The whole file is streamed once: every chunk feeds the ETag and the chunks that overlap
    /// the range are kept.
    pub fn read(&self, rel: &str, range: ByteRange, cap: u64) -> Result<ReadResult, FsError> {
        let path = RelPath::parse(rel)?;
        let (file, meta) = self.open_regular(&path)?;
        read_open(&file, &meta, path.as_str(), range, cap)
    }

    /// A writable root on a directory descriptor its caller resolved (a runtime's agent,
    /// [`crate::walk_in_root`]): every path beneath it is resolved as any root's (I2), and
    /// what it creates stays the caller's own.
    pub fn at_dir(fd: OwnedFd) -> Result<Self, FsError> {
        let resolver = Resolver::detect(fd.as_fd());
        Ok(Self::from_fd(fd, resolver)?.with_owner(None))
    }

    // ----- helpers shared by the other modules -----

    pub(crate) fn root_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn ensure_writable(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
    ) -> Result<(), FsError> {
        if self.read_only {
            return Err(FsError::ReadOnly {
                path: crate::error::shorten(&rel.as_ref().to_string_lossy()),
            });
        }
        Ok(())
    }

    /// The directory `rel` beneath this root, as a root of its own with the same owner and
    /// access. It is resolved by descriptor like every path (no symlink, no `..`, no mount
    /// crossing), and every later operation stays beneath the descriptor it got: renaming
    /// or swapping `rel`'s components for links afterwards cannot widen it. This is how a
    /// view narrowed to one workdir (the Viewer) is made.
    pub fn subroot(&self, rel: &(impl AsRef<OsStr> + ?Sized)) -> Result<Self, FsError> {
        let path = RelPath::parse(rel)?;
        let fd = self.resolve_dir(path.comps(), path.as_str())?;
        Ok(Self {
            fd,
            anchor: self.anchor,
            owner: self.owner,
            read_only: self.read_only,
        })
    }

    /// The root's directory descriptor, for a caller that hands the directory on whole: a
    /// backend bind-mounts it from `/proc/self/fd/<n>`, which names exactly this directory
    /// whatever its path has become since.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Opens `path` beneath the root (I2) and maps a refusal to its variant.
    pub(crate) fn resolve(&self, path: &RelPath<'_>, flags: OFlags) -> Result<OwnedFd, FsError> {
        self.resolve_comps(path.comps(), path.as_str(), flags)
    }

    /// Opens the directory made of `comps` (the parents of some path) for `*at` calls and
    /// `flock`. Not `O_PATH`: `flock` and `getdents` need a real open file description.
    pub(crate) fn resolve_dir(&self, comps: &[&OsStr], path: &str) -> Result<OwnedFd, FsError> {
        self.resolve_comps(comps, path, OFlags::RDONLY | OFlags::DIRECTORY)
    }

    fn resolve_comps(
        &self,
        comps: &[&OsStr],
        path: &str,
        flags: OFlags,
    ) -> Result<OwnedFd, FsError> {
        self.anchor
            .open_beneath(self.root_fd(), comps, flags, Mode::empty())
            .map_err(|e| FsError::from_errno(e, path, Op::Open))
    }

    /// Opens a regular file for reading. `O_NONBLOCK` keeps a fifo planted in the workspace
    /// from blocking the open; the type is then checked on the descriptor itself.
    pub(crate) fn open_regular(&self, path: &RelPath<'_>) -> Result<(File, Meta), FsError> {
        let fd = self.resolve(path, read_flags())?;
        let meta =
            Meta::of(fd.as_fd()).map_err(|e| FsError::from_errno(e, path.as_str(), Op::Stat))?;
        check_regular(&meta, path.as_str())?;
        Ok((File::from(fd), meta))
    }

    /// Hands a freshly created file or directory to the workspace owner (I11).
    pub(crate) fn chown_new(&self, fd: BorrowedFd<'_>, path: &str) -> Result<(), FsError> {
        if let Some(owner) = self.owner {
            fchown(
                fd,
                Some(Uid::from_raw(owner.uid)),
                Some(Gid::from_raw(owner.gid)),
            )
            .map_err(|e| FsError::from_errno(e, path, Op::SetAttributes))?;
        }
        Ok(())
    }
}

/// Reads `range` of an open regular `file` (its `meta`, its path as shown), refusing a span
/// longer than `cap` bytes: [`WorkspaceRoot::read`] once the file is open, and a runtime's
/// agent's read of a file it resolved itself. The whole file is streamed once: every chunk
/// feeds the ETag and the chunks that overlap the range are kept.
pub fn read_file(
    file: &File,
    shown: &str,
    range: ByteRange,
    cap: u64,
) -> Result<ReadResult, FsError> {
    let meta = Meta::of(file.as_fd()).map_err(|e| FsError::from_errno(e, shown, Op::Stat))?;
    check_regular(&meta, shown)?;
    read_open(file, &meta, shown, range, cap)
}

fn read_open(
    file: &File,
    meta: &Meta,
    shown: &str,
    range: ByteRange,
    cap: u64,
) -> Result<ReadResult, FsError> {
    let (start, len) = span(range, meta.size).ok_or_else(|| FsError::RangeNotSatisfiable {
        path: shown.to_owned(),
        size: meta.size,
    })?;
    if len > cap {
        return Err(FsError::TooLarge {
            path: shown.to_owned(),
            size: len,
            cap,
        });
    }

    let end = start.saturating_add(len);
    // `len <= cap` was checked, but cap is caller-chosen; don't trust it for allocation.
    let mut bytes = Vec::with_capacity(usize::try_from(len.min(CHUNK as u64)).unwrap_or(0));
    let version = crate::etag::FileVersion::of(file);
    if let Some(etag) = version.and_then(crate::etag::known) {
        // This version was hashed before: read only the range.
        let mut buf = vec![0u8; CHUNK];
        let mut offset = start;
        while offset < end {
            let want = usize::try_from((end - offset).min(CHUNK as u64)).unwrap_or(CHUNK);
            let n = read_chunk(file, &mut buf[..want], offset, shown)?;
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
            offset += n as u64;
        }
        return Ok(ReadResult {
            bytes,
            total_size: meta.size,
            etag,
            range_start: start,
        });
    }
    let mut hasher = EtagHasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = read_chunk(file, &mut buf, offset, shown)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        hasher.update(chunk);
        let chunk_end = offset + n as u64;
        let from = start.max(offset);
        let to = end.min(chunk_end);
        if from < to {
            // Both bounds lie within this chunk, so the differences fit in usize.
            bytes.extend_from_slice(&chunk[(from - offset) as usize..(to - offset) as usize]);
        }
        offset = chunk_end;
    }
    let etag = hasher.finish();
    // Remembered only if the file did not change while it was read.
    if let Some(version) = version.filter(|v| crate::etag::FileVersion::of(file) == Some(*v)) {
        crate::etag::remember(version, &etag);
    }
    Ok(ReadResult {
        bytes,
        total_size: offset,
        etag,
        range_start: start,
    })
}

/// The root itself is trusted host configuration: only its last component is opened with
/// `O_NOFOLLOW`, so a root that is a symlink is refused rather than silently redirected.
fn open_root_fd(root: &Path) -> Result<OwnedFd, FsError> {
    openat(
        CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::RootUnavailable { errno: e.into() })
}

pub(crate) fn read_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY
}

pub(crate) fn check_regular(meta: &Meta, path: &str) -> Result<(), FsError> {
    if meta.is_dir() {
        return Err(FsError::IsADirectory {
            path: path.to_owned(),
        });
    }
    if !meta.is_file() {
        return Err(FsError::NotAFile {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// `pread` one chunk at `offset`, retrying on `EINTR`.
pub(crate) fn read_chunk(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    path: &str,
) -> Result<usize, FsError> {
    loop {
        match file.read_at(buf, offset) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FsError::from_io(&e, path, Op::Read)),
        }
    }
}

/// The ETag and length of a file's whole content, streamed from offset 0.
pub(crate) fn hash_file(file: &File, path: &str) -> Result<(Etag, u64), FsError> {
    let mut hasher = EtagHasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = read_chunk(file, &mut buf, offset, path)?;
        if n == 0 {
            return Ok((hasher.finish(), offset));
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
}

/// Reads a whole file, refusing one that grows past `cap` bytes.
pub(crate) fn read_all_capped(file: &File, cap: u64, path: &str) -> Result<Vec<u8>, FsError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = read_chunk(file, &mut buf, out.len() as u64, path)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() as u64 > cap {
            return Err(FsError::TooLarge {
                path: path.to_owned(),
                size: out.len() as u64,
                cap,
            });
        }
    }
}

/// Turns a range into `(start, len)` for a file of `size` bytes, HTTP-style: the end is
/// clamped to the file, a start at or past the end is unsatisfiable (except `0` on an empty
/// file, which reads nothing).
fn span(range: ByteRange, size: u64) -> Option<(u64, u64)> {
    match range {
        ByteRange::Span {
            start,
            end_inclusive,
        } => {
            if size == 0 {
                return (start == 0).then_some((0, 0));
            }
            if start >= size {
                return None;
            }
            let end = end_inclusive.unwrap_or(u64::MAX).min(size - 1);
            (end >= start).then(|| (start, end - start + 1))
        }
        ByteRange::Suffix { len } => {
            let len = len.min(size);
            Some((size - len, len))
        }
    }
}

pub(crate) fn kind_of(meta: &Meta) -> Kind {
    use rustix::fs::FileType;
    match meta.file_type {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

pub(crate) fn entry_from_meta(
    path: String,
    os_path: OsString,
    meta: &Meta,
    os_symlink_target: Option<OsString>,
) -> Entry {
    Entry {
        path,
        os_path,
        kind: kind_of(meta),
        size: meta.size,
        mode: meta.mode,
        modified_unix_ms: meta.modified_unix_ms,
        modified_unix_ns: meta.modified_unix_ns,
        uid: meta.uid,
        gid: meta.gid,
        symlink_target: os_symlink_target
            .as_ref()
            .map(|target| target.to_string_lossy().into_owned()),
        os_symlink_target,
        inode: meta.inode,
        links: meta.links,
        changed_unix_ns: meta.changed_unix_ns,
    }
}

/// How long a writer waits for the directory lock before giving up with
/// [`FsError::Busy`].
pub(crate) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Takes the directory's exclusive lock, waiting at most [`LOCK_WAIT`]: a process inside
/// a runtime can hold a lock on its own directory forever, and must not be able to park
/// the provisioner's threads (each blocked writer holds one).
pub(crate) fn lock_exclusive(dir: BorrowedFd<'_>, path: &str) -> Result<(), FsError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match rustix::fs::flock(dir, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(Errno::WOULDBLOCK) => {
                return Err(FsError::Busy {
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(FsError::from_errno(e, path, Op::Lock)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (description, range, file size, expected `(start, len)`).
    type SpanCase = (&'static str, ByteRange, u64, Option<(u64, u64)>);

    #[test]
    fn spans_follow_http_range_rules() {
        let full = ByteRange::FULL;
        let span_of = |start, end| ByteRange::Span {
            start,
            end_inclusive: end,
        };
        let table: &[SpanCase] = &[
            ("full file", full, 10, Some((0, 10))),
            ("full empty file", full, 0, Some((0, 0))),
            ("open-ended", span_of(4, None), 10, Some((4, 6))),
            ("closed", span_of(2, Some(5)), 10, Some((2, 4))),
            ("end clamped", span_of(8, Some(100)), 10, Some((8, 2))),
            ("start at size", span_of(10, None), 10, None),
            ("start past size", span_of(11, Some(20)), 10, None),
            ("end before start", span_of(5, Some(4)), 10, None),
            ("nonzero start on empty", span_of(1, None), 0, None),
            ("suffix", ByteRange::Suffix { len: 3 }, 10, Some((7, 3))),
            (
                "long suffix",
                ByteRange::Suffix { len: 30 },
                10,
                Some((0, 10)),
            ),
            (
                "suffix of empty",
                ByteRange::Suffix { len: 3 },
                0,
                Some((0, 0)),
            ),
        ];
        for (what, range, size, want) in table {
            assert_eq!(span(*range, *size), *want, "{what}");
        }
    }
}
