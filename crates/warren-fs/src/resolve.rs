//! The two kernel-side resolvers that open a path beneath a directory descriptor (I2).
//!
//! Both open root to leaf without following any link and without leaving the root's mount,
//! and both report a refusal as an `errno` the rest of the crate maps in one place:
//! `ELOOP` for a symlink or magic link in any component (the last one included), `EXDEV` for a
//! mount crossing, `ENOTDIR` for a non-directory used as one.
//!
//! * [`Resolver::Openat2`]: one `openat2(2)` call with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
//!   | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`; the kernel does the whole walk atomically with
//!   respect to renames of the components.
//! * [`Resolver::NoFollowWalk`]: for kernels without `openat2`, one `openat` per component
//!   relative to the previous component's descriptor, each with `O_NOFOLLOW`; every opened
//!   component is `fstat`ed through its descriptor (so what is checked is what is used) and a
//!   symlink or a change of device / mount id is refused.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use rustix::fs::{
    fstat, openat, openat2, statx, AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat, StatxFlags,
};
use rustix::io::Errno;

/// How paths are resolved beneath the workspace root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolver {
    /// `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
    /// RESOLVE_NO_XDEV` (Linux 5.6+). Falls back to the walk if the kernel answers `ENOSYS`.
    Openat2,
    /// A component-by-component `openat(O_NOFOLLOW)` walk that checks every component's type
    /// and mount through its descriptor. Works on any Linux.
    NoFollowWalk,
}

impl Resolver {
    /// Both resolvers, for tests that must hold under each.
    pub const ALL: [Resolver; 2] = [Resolver::Openat2, Resolver::NoFollowWalk];

    /// The best resolver this kernel offers: `Openat2` when it is usable, probed once per
    /// process (using `dir` as the probe's starting point) and cached.
    pub(crate) fn detect(dir: BorrowedFd<'_>) -> Self {
        static OPENAT2_USABLE: OnceLock<bool> = OnceLock::new();
        let usable = *OPENAT2_USABLE.get_or_init(|| {
            let probe = openat2(
                dir,
                ".",
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                resolve_flags(),
            );
            // ENOSYS: no such syscall; EPERM: a seccomp filter that predates openat2 and
            // denies what it does not know; EINVAL: a kernel that lacks one of the flags.
            !matches!(probe, Err(Errno::NOSYS | Errno::PERM | Errno::INVAL))
        });
        if usable {
            Self::Openat2
        } else {
            Self::NoFollowWalk
        }
    }
}

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

/// The parts of a `Stat` this crate uses, converted once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) file_type: FileType,
    pub(crate) dev: u64,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) size: u64,
    pub(crate) modified_unix_ms: i64,
    pub(crate) modified_unix_ns: i64,
    pub(crate) inode: u64,
    pub(crate) links: u64,
    pub(crate) changed_unix_ns: i64,
}

impl Meta {
    // The field types of `Stat` differ between architectures (`c_ulong`, `u64`, `c_long`...);
    // these conversions are lossless on every 64-bit Linux and saturate elsewhere.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    pub(crate) fn from_stat(st: &Stat) -> Self {
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let secs = i64::try_from(st.st_mtime).unwrap_or(i64::MAX);
        let nanos = i64::try_from(st.st_mtime_nsec).unwrap_or(0);
        Self {
            file_type: FileType::from_raw_mode(st.st_mode as u32),
            dev: st.st_dev as u64,
            mode: (st.st_mode as u32) & 0o7777,
            uid: st.st_uid as u32,
            gid: st.st_gid as u32,
            size,
            modified_unix_ms: secs.saturating_mul(1000).saturating_add(nanos / 1_000_000),
            modified_unix_ns: secs.saturating_mul(1_000_000_000).saturating_add(nanos),
            inode: st.st_ino as u64,
            links: st.st_nlink as u64,
            changed_unix_ns: i64::try_from(st.st_ctime)
                .unwrap_or(i64::MAX)
                .saturating_mul(1_000_000_000)
                .saturating_add(i64::try_from(st.st_ctime_nsec).unwrap_or(0)),
        }
    }

    pub(crate) fn of(fd: BorrowedFd<'_>) -> Result<Self, Errno> {
        fstat(fd).map(|st| Self::from_stat(&st))
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.file_type == FileType::Directory
    }

    pub(crate) fn is_file(&self) -> bool {
        self.file_type == FileType::RegularFile
    }

    pub(crate) fn is_symlink(&self) -> bool {
        self.file_type == FileType::Symlink
    }
}

/// The mount id of `fd`, when the kernel reports one (`STATX_MNT_ID`, Linux 5.8+).
pub(crate) fn mount_id(fd: BorrowedFd<'_>) -> Option<u64> {
    let stx = statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID).ok()?;
    (stx.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(stx.stx_mnt_id)
}

/// Where resolution is anchored: the chosen resolver and the root's mount, which no opened
/// component may leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anchor {
    pub(crate) resolver: Resolver,
    pub(crate) dev: u64,
    pub(crate) mnt_id: Option<u64>,
}

impl Anchor {
    /// Opens `comps` beneath `base` with `flags` on the last component (`O_NOFOLLOW` and
    /// `O_CLOEXEC` are always added). An empty `comps` reopens `base` itself.
    ///
    /// `base` must be the workspace root or a directory opened beneath it by this function.
    pub(crate) fn open_beneath(
        &self,
        base: BorrowedFd<'_>,
        comps: &[&OsStr],
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if !flags.contains(OFlags::DIRECTORY) || flags.contains(OFlags::PATH) {
            return self.open_raw(base, comps, flags, mode);
        }
        // A directory is opened in two steps: resolve it as an O_PATH handle and check its
        // type on that very handle, then reopen it through `.` relative to itself. Opening
        // with O_DIRECTORY directly would report a trailing symlink as ENOTDIR, and telling
        // the two apart by looking again would race with a concurrent swap.
        let handle = self.open_raw(
            base,
            comps,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let meta = Meta::of(handle.as_fd())?;
        if meta.is_symlink() {
            return Err(Errno::LOOP);
        }
        if !meta.is_dir() {
            return Err(Errno::NOTDIR);
        }
        // `.` names the directory itself: nothing is resolved or followed here.
        openat(handle.as_fd(), ".", flags, mode)
    }

    fn open_raw(
        &self,
        base: BorrowedFd<'_>,
        comps: &[&OsStr],
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        match self.resolver {
            Resolver::Openat2 => match self.openat2(base, comps, flags, mode) {
                Err(Errno::NOSYS) => self.walk(base, comps, flags, mode),
                other => other,
            },
            Resolver::NoFollowWalk => self.walk(base, comps, flags, mode),
        }
    }

    fn openat2(
        &self,
        base: BorrowedFd<'_>,
        comps: &[&OsStr],
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        let mut path = OsString::new();
        for (i, comp) in comps.iter().enumerate() {
            if i > 0 {
                path.push("/");
            }
            path.push(comp);
        }
        if path.is_empty() {
            path.push(".");
        }
        // EAGAIN means the kernel saw a concurrent rename and could not prove a `..` stayed
        // beneath; we never pass `..`, but retrying a bounded number of times is harmless.
        let mut tries = 0;
        let fd = loop {
            match openat2(base, &path, flags, mode, resolve_flags()) {
                Err(Errno::AGAIN | Errno::INTR) if tries < 16 => tries += 1,
                other => break other?,
            }
        };
        // With O_PATH|O_NOFOLLOW, RESOLVE_NO_SYMLINKS still hands back a trailing symlink
        // itself (documented in openat2(2)); it must not be used as the named file.
        if flags.contains(OFlags::PATH) && Meta::of(fd.as_fd())?.is_symlink() {
            return Err(Errno::LOOP);
        }
        Ok(fd)
    }

    fn walk(
        &self,
        base: BorrowedFd<'_>,
        comps: &[&OsStr],
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        let Some((leaf, parents)) = comps.split_last() else {
            let fd = openat(base, ".", flags, mode)?;
            self.check_component(fd.as_fd(), true)?;
            return Ok(fd);
        };
        let mut current: Option<OwnedFd> = None;
        for comp in parents {
            let dir = current.as_ref().map_or(base, |fd| fd.as_fd());
            // O_PATH|O_NOFOLLOW opens a symlink as itself instead of following it, so the
            // fstat below sees exactly the object the next openat will be relative to.
            let fd = openat(
                dir,
                *comp,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            self.check_component(fd.as_fd(), true)?;
            current = Some(fd);
        }
        let dir = current.as_ref().map_or(base, |fd| fd.as_fd());
        let fd = openat(dir, *leaf, flags, mode)?;
        self.check_component(fd.as_fd(), false)?;
        Ok(fd)
    }

    /// Refuses a symlink (`ELOOP`), a component on another mount (`EXDEV`) and, for
    /// intermediate components, a non-directory (`ENOTDIR`).
    fn check_component(&self, fd: BorrowedFd<'_>, must_be_dir: bool) -> Result<(), Errno> {
        let meta = Meta::of(fd)?;
        if meta.is_symlink() {
            return Err(Errno::LOOP);
        }
        self.check_mount(fd, &meta)?;
        if must_be_dir && !meta.is_dir() {
            return Err(Errno::NOTDIR);
        }
        Ok(())
    }

    /// A different device is another mount; the same device can still be a bind mount, which
    /// only the mount id tells apart (when the kernel reports it).
    pub(crate) fn check_mount(&self, fd: BorrowedFd<'_>, meta: &Meta) -> Result<(), Errno> {
        if meta.dev != self.dev {
            return Err(Errno::XDEV);
        }
        if let Some(root_mnt) = self.mnt_id {
            if mount_id(fd).is_some_and(|id| id != root_mnt) {
                return Err(Errno::XDEV);
            }
        }
        Ok(())
    }
}
