//! The one-time ownership migration of a uid's subtree: every entry becomes the sandbox
//! user's (I11: 1000:1000) and loses the mode bits no sandbox file needs.
//!
//! One routine, run by the Kubernetes backend's root init container (`warren __k8s-prepare`,
//! on the uid's subtree of the USER_DATA claim) and by the storage migrator, so that both
//! leave exactly the same tree behind. The design seed: the migrator fixes old ownership
//! once, so runtimes never need world-writable modes.
//!
//! The walk resolves nothing by path string (I2): it holds a descriptor per directory level,
//! opens each name with `O_NOFOLLOW` beneath its parent's descriptor and changes the entry
//! through the descriptor it opened, so a name swapped for a link mid-walk changes the link,
//! never what it points at (the one path string it hands the kernel is `/proc/self/fd/<n>`
//! of a descriptor it holds, to change a regular file's mode). Nothing on another mount (device and mount id compared with the
//! subtree root's: a bind mount of the same filesystem has the same device but another
//! mount id) is entered or changed. A non-directory with other hard links is left alone
//! unless it already is the sandbox user's: its other names may lie outside the subtree,
//! and changing the inode would change them too.
//!
//! Besides the owner, directories and regular files lose the world-write bit and the
//! setuid/setgid bits (`0o6002`); the sticky bit is kept. Symlinks, FIFOs, sockets
//! and devices keep their modes: a symlink's mode means nothing, and a special file is never
//! opened for I/O here.
//!
//! Changing a mode needs `CAP_FOWNER` once the entry is the sandbox user's (chown comes
//! first), unless the chown already cleared the bits (the kernel drops setuid, and setgid
//! with group-execute, on a regular file whose owner changes). The mode is only changed when
//! a stripped bit is actually set, so a clean tree needs no more than `CAP_CHOWN`.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{
    chownat, fchmod, fstat, openat, statat, statx, AtFlags, Dir, FileType, Gid, Mode, OFlags, Stat,
    StatxFlags, Uid,
};
use rustix::io::Errno;

use crate::error::FsError;
use crate::path::join;
use crate::types::MAX_WALK_DEPTH;

/// The marker file in a uid subtree saying its ownership was migrated.
///
/// It lives in the subtree's root, outside `workspace/`, so that no sandbox (which sees only
/// its UserWorkspace) can forge or remove it.
pub const OWNERSHIP_MARKER: &str = ".warren-owner-1000";

/// The sandbox user and group (I11).
pub const SANDBOX_ID: u32 = 1000;

/// The mode bits the migration takes away from directories and regular files: world-write
/// (`0o002`), setuid and setgid (`0o6000`). The sticky bit (`0o1000`) stays: it only ever
/// restricts who may remove a name.
const STRIPPED_BITS: u32 = 0o6002;

/// What one migration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipReport {
    /// The walk ran (no marker was there).
    pub migrated: bool,
    /// Entries whose owner or mode changed (each counted once).
    pub changed: u64,
    /// Entries left alone, relative to the subtree root, each with why
    /// (`"a/b: a mount point"`).
    pub skipped: Vec<String>,
}

/// Once per subtree: if [`OWNERSHIP_MARKER`] is absent from `root`, gives `root` and
/// everything beneath it to 1000:1000, stripping world-write and setuid/setgid bits from
/// directories and regular files ([`give_tree`]), then writes the marker (`O_EXCL |
/// O_NOFOLLOW`, synced), so later runs leave owners alone: what the sandbox user changes
/// afterwards is its own business. `migrated` says whether the walk ran.
///
/// `root` is a directory descriptor (opened `O_PATH` or not) of a subtree no sandbox can
/// write the root of (the marker's directory). A failure leaves no marker, so the next run
/// walks again; the walk is idempotent. Two runs racing on one subtree both walk; the first
/// to create the marker wins, the other finds it there and is done.
pub fn migrate_subtree_once(root: BorrowedFd<'_>) -> Result<OwnershipReport, FsError> {
    let mut report = OwnershipReport::default();
    match statat(root, OWNERSHIP_MARKER, AtFlags::SYMLINK_NOFOLLOW) {
        // Only a regular file counts: anything else at that name was not written here.
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
            return Ok(report);
        }
        Ok(_) | Err(Errno::NOENT) => {}
        Err(errno) => return Err(io_error("stat", OWNERSHIP_MARKER, errno)),
    }
    report.migrated = true;
    give_tree(root, &mut report)?;
    write_marker(root)?;
    Ok(report)
}

/// The walk without the marker: gives the directory `dir` itself and everything beneath it
/// to 1000:1000 (I11) and strips world-write and setuid/setgid bits (`0o6002`) from
/// directories and regular files, depth first, names in byte order. Paths in
/// `report.skipped` and in errors are relative to `dir` (`.` for `dir` itself).
///
/// Refuses a tree deeper than [`crate::MAX_WALK_DEPTH`] levels ([`FsError::TooDeep`]):
/// one descriptor is held per level. Every other failure is [`FsError::Io`], naming the
/// system call and the entry; what was changed before it stays changed.
pub fn give_tree(dir: BorrowedFd<'_>, report: &mut OwnershipReport) -> Result<(), FsError> {
    // A descriptor of our own, opened for reading: `dir` may be `O_PATH`, on which `fchmod`
    // fails, and "." names exactly the directory `dir` refers to.
    let own = openat(dir, ".", dir_flags(), Mode::empty()).map_err(|e| io_error("open", ".", e))?;
    let home = place(own.as_fd(), ".")?;
    give(own.as_fd(), ".", report)?;
    walk(own.as_fd(), "", home, 0, report)
}

fn io_error(op: &'static str, path: &str, errno: Errno) -> FsError {
    FsError::Io {
        op,
        path: path.to_owned(),
        errno: io::Error::from(errno),
    }
}

/// How a directory is opened: readable (so `fchmod` works and it can be listed), never
/// through a link (I2), and never blocking on a FIFO swapped in under the name.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK
}

/// Where an open file lies: its device, and its mount when the kernel says (5.8+). Two
/// entries in different places are on different mounts (a bind mount of the same
/// filesystem has the same device but another mount id). The Kubernetes init step compares
/// places too, for the directories it must find on the subtree's own mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountPlace {
    /// The device.
    pub dev: u64,
    /// The mount id, when the kernel reports one.
    pub mount: Option<u64>,
}

impl MountPlace {
    /// The place of the open file `fd`.
    pub fn of(fd: BorrowedFd<'_>) -> Result<Self, rustix::io::Errno> {
        let st = fstat(fd)?;
        let mount = statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
            .ok()
            .filter(|stx| stx.stx_mask & StatxFlags::MNT_ID.bits() != 0)
            .map(|stx| stx.stx_mnt_id);
        Ok(Self {
            dev: st.st_dev,
            mount,
        })
    }
}

fn place(fd: BorrowedFd<'_>, path: &str) -> Result<MountPlace, FsError> {
    MountPlace::of(fd).map_err(|e| io_error("stat", path, e))
}

fn is_sandbox_users(st: &Stat) -> bool {
    st.st_uid == SANDBOX_ID && st.st_gid == SANDBOX_ID
}

/// The mode `mode` should have, when it has a bit to strip.
fn tightened(mode: u32) -> Option<Mode> {
    let permissions = mode & 0o7777;
    (permissions & STRIPPED_BITS != 0).then(|| Mode::from_raw_mode(permissions & !STRIPPED_BITS))
}

/// Gives an open file to the sandbox user unless it is already (I11), then strips
/// [`STRIPPED_BITS`] from a directory or regular file. `fd` is a directory opened with
/// [`dir_flags`] or a non-directory opened `O_PATH | O_NOFOLLOW`: the file itself, found
/// without following anything (I2).
fn give(fd: BorrowedFd<'_>, path: &str, report: &mut OwnershipReport) -> Result<(), FsError> {
    let shown = if path.is_empty() { "." } else { path };
    let mut st = fstat(fd).map_err(|e| io_error("stat", shown, e))?;
    let mut changed = false;
    if !is_sandbox_users(&st) {
        let (uid, gid) = (Uid::from_raw(SANDBOX_ID), Gid::from_raw(SANDBOX_ID));
        // By descriptor, with an empty path: this changes exactly the opened file (for an
        // `O_PATH` descriptor of a symlink, the link itself, never its target).
        chownat(fd, "", Some(uid), Some(gid), AtFlags::EMPTY_PATH)
            .map_err(|e| io_error("chown", shown, e))?;
        changed = true;
        // The chown may have cleared setuid/setgid already: read the mode again, so the
        // chmod below runs only when a bit is still there.
        st = fstat(fd).map_err(|e| io_error("stat", shown, e))?;
    }
    if let Some(mode) = tightened(st.st_mode) {
        match FileType::from_raw_mode(st.st_mode) {
            // Opened for reading by `dir_flags`: a real open file description.
            FileType::Directory => fchmod(fd, mode).map_err(|e| io_error("chmod", shown, e))?,
            // An `O_PATH` descriptor, on which `fchmod` fails (EBADF). Its `/proc/self/fd`
            // entry is a magic link to exactly this inode: `chmod` through it changes the
            // file that was opened without following anything, whatever its name points
            // at now. Only ever for a regular file, checked just above by `fstat`.
            FileType::RegularFile => {
                rustix::fs::chmod(format!("/proc/self/fd/{}", fd.as_raw_fd()), mode)
                    .map_err(|e| io_error("chmod", shown, e))?;
            }
            // A symlink's mode means nothing; a FIFO, socket or device keeps its own.
            _ => {}
        }
        changed = true;
    }
    if changed {
        report.changed += 1;
    }
    Ok(())
}

/// The names in the directory `dir`, sorted, without `.` and `..`.
fn names(dir: BorrowedFd<'_>, path: &str) -> Result<Vec<OsString>, FsError> {
    let shown = if path.is_empty() { "." } else { path };
    // A descriptor of its own for the listing (a `Dir` consumes it), so `dir` stays usable
    // for the `*at` calls.
    let listing =
        openat(dir, ".", dir_flags(), Mode::empty()).map_err(|e| io_error("open", shown, e))?;
    let mut names = Vec::new();
    for entry in Dir::new(listing).map_err(|e| io_error("list", shown, e))? {
        let entry = entry.map_err(|e| io_error("list", shown, e))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

/// Gives everything beneath the directory `dir` (at `path` relative to the walk's root, the
/// empty string for the root) to the sandbox user, depth first.
fn walk(
    dir: BorrowedFd<'_>,
    path: &str,
    home: MountPlace,
    depth: u32,
    report: &mut OwnershipReport,
) -> Result<(), FsError> {
    if depth >= MAX_WALK_DEPTH {
        return Err(FsError::TooDeep {
            path: path.to_owned(),
            limit: MAX_WALK_DEPTH,
        });
    }
    for name in names(dir, path)? {
        let child = join(path, &name.to_string_lossy());
        match openat(dir, &name, dir_flags(), Mode::empty()) {
            Ok(sub) => {
                if place(sub.as_fd(), &child)? != home {
                    report.skipped.push(format!("{child}: a mount point"));
                    continue;
                }
                give(sub.as_fd(), &child, report)?;
                walk(sub.as_fd(), &child, home, depth + 1, report)?;
            }
            // Not a directory (or a symlink, which `O_NOFOLLOW` never follows): the entry
            // itself.
            Err(Errno::LOOP | Errno::NOTDIR) => leaf(dir, &name, &child, home, report)?,
            Err(Errno::NOENT) => {} // removed meanwhile
            Err(errno) => return Err(io_error("open", &child, errno)),
        }
    }
    Ok(())
}

/// A non-directory entry: opened as itself (`O_PATH | O_NOFOLLOW`: a symlink is the link, a
/// FIFO is not opened for I/O), checked, and changed by that descriptor.
fn leaf(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &str,
    home: MountPlace,
    report: &mut OwnershipReport,
) -> Result<(), FsError> {
    let fd: OwnedFd = match openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(errno) => return Err(io_error("open", path, errno)),
    };
    let st = fstat(&fd).map_err(|e| io_error("stat", path, e))?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        // Swapped for a directory since it was listed: the next run's business.
        report.skipped.push(format!("{path}: changed while walked"));
        return Ok(());
    }
    if place(fd.as_fd(), path)? != home {
        report.skipped.push(format!("{path}: a mount point"));
        return Ok(());
    }
    // Neither owner nor mode of a shared inode changes unless it is already the sandbox
    // user's: its other names may lie outside the subtree. One that is already 1000's only
    // loses bits, and its other names are sandbox files too (I11).
    if !is_sandbox_users(&st) && st.st_nlink > 1 {
        report.skipped.push(format!(
            "{path}: has other hard links, which may lie outside"
        ));
        return Ok(());
    }
    give(fd.as_fd(), path, report)
}

/// Writes the marker: created exclusively (a sibling run that finished first already wrote
/// it), never through a link, and synced, so the marker later runs trust is on disk rather
/// than only in the page cache.
fn write_marker(root: BorrowedFd<'_>) -> Result<(), FsError> {
    let fd = match openat(
        root,
        OWNERSHIP_MARKER,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    ) {
        Ok(fd) => fd,
        Err(Errno::EXIST) => return Ok(()), // a sibling run finished first
        Err(errno) => return Err(io_error("create", OWNERSHIP_MARKER, errno)),
    };
    let mut rest: &[u8] = b"warren: ownership migrated to 1000:1000\n";
    while !rest.is_empty() {
        let written =
            rustix::io::write(&fd, rest).map_err(|e| io_error("write", OWNERSHIP_MARKER, e))?;
        rest = &rest[written..];
    }
    rustix::fs::fsync(&fd).map_err(|e| io_error("sync", OWNERSHIP_MARKER, e))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
    use std::path::{Path, PathBuf};

    use super::*;

    /// Owner of everything before the migration: some other uid, as a tree written by an
    /// earlier warren or by hand would have.
    const LEGACY: u32 = 4242;

    /// Set by the mount test for the copy of this binary it runs in a private mount
    /// namespace.
    const MOUNT_NAMESPACE_ENV: &str = "WARREN_FS_OWNERSHIP_IN_MOUNT_NAMESPACE";

    fn require_root() {
        assert!(
            rustix::process::geteuid().is_root(),
            "the ownership tests change owners and must run as root (scripts/test does)"
        );
    }

    /// A temporary directory holding `tree/` (what is migrated) and `outside/` (what must
    /// never change), everything owned by [`LEGACY`].
    struct Fixture {
        _dir: tempfile::TempDir,
        tree: PathBuf,
        outside: PathBuf,
    }

    impl Fixture {
        fn new() -> Self {
            require_root();
            let dir = tempfile::tempdir().unwrap();
            let tree = dir.path().join("tree");
            let outside = dir.path().join("outside");
            fs::create_dir_all(tree.join("workspace/a")).unwrap();
            fs::write(tree.join("workspace/a/file"), "data").unwrap();
            fs::create_dir_all(&outside).unwrap();
            fs::write(outside.join("secret"), "secret").unwrap();
            chown_tree(dir.path(), LEGACY);
            Self {
                _dir: dir,
                tree,
                outside,
            }
        }

        fn open(&self) -> OwnedFd {
            openat(
                rustix::fs::CWD,
                &self.tree,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap()
        }
    }

    fn chown_tree(path: &Path, id: u32) {
        lchown(path, Some(id), Some(id)).unwrap();
        if fs::symlink_metadata(path).unwrap().is_dir() {
            for entry in fs::read_dir(path).unwrap() {
                chown_tree(&entry.unwrap().path(), id);
            }
        }
    }

    fn set_mode(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Owner and permission bits of an entry itself (a link is not followed).
    fn meta(path: &Path) -> (u32, u32, u32) {
        let meta = fs::symlink_metadata(path).unwrap();
        (meta.uid(), meta.gid(), meta.mode() & 0o7777)
    }

    fn owner(path: &Path) -> (u32, u32) {
        let (uid, gid, _) = meta(path);
        (uid, gid)
    }

    #[test]
    fn a_world_writable_file_and_directory_lose_world_write_and_set_id_bits() {
        let fx = Fixture::new();
        let a = fx.tree.join("workspace/a");
        let cases = [
            // (path, mode before, mode after)
            (a.clone(), 0o2777, 0o775),
            (fx.tree.join("workspace"), 0o1777, 0o1775), // the sticky bit stays
            (a.join("file"), 0o6777, 0o775),
            (a.join("setgid-no-exec"), 0o2666, 0o664), // chown does not clear this one
            (a.join("already-ours"), 0o4757, 0o755),   // no chown to clear it
            (a.join("clean"), 0o640, 0o640),
        ];
        for (path, before, _) in &cases {
            if !path.exists() {
                fs::write(path, "x").unwrap();
                lchown(path, Some(LEGACY), Some(LEGACY)).unwrap();
            }
            set_mode(path, *before);
        }
        lchown(a.join("already-ours"), Some(SANDBOX_ID), Some(SANDBOX_ID)).unwrap();
        set_mode(&a.join("already-ours"), 0o4757);
        let fifo = a.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o666),
            0,
        )
        .unwrap();
        set_mode(&fifo, 0o666);

        let report = migrate_subtree_once(fx.open().as_fd()).unwrap();
        assert!(report.migrated, "{report:?}");
        for (path, _, after) in &cases {
            assert_eq!(meta(path), (SANDBOX_ID, SANDBOX_ID, *after), "{path:?}");
        }
        assert_eq!(
            meta(&fifo),
            (SANDBOX_ID, SANDBOX_ID, 0o666),
            "a FIFO is chowned, never chmodded"
        );
        assert!(report.skipped.is_empty(), "{report:?}");
    }

    #[test]
    fn a_symlink_is_changed_as_itself_and_its_target_outside_the_tree_never() {
        let fx = Fixture::new();
        let secret = fx.outside.join("secret");
        set_mode(&secret, 0o6777);
        set_mode(&fx.outside, 0o777);
        let links = [
            (fx.tree.join("to-file"), secret.clone()),
            (fx.tree.join("workspace/a/to-dir"), fx.outside.clone()),
            (fx.tree.join("workspace/dangling"), "/nonexistent".into()),
        ];
        for (link, target) in &links {
            symlink(target, link).unwrap();
            lchown(link, Some(LEGACY), Some(LEGACY)).unwrap();
        }
        let mut report = OwnershipReport::default();
        give_tree(fx.open().as_fd(), &mut report).unwrap();
        for (link, _) in &links {
            assert_eq!(
                owner(link),
                (SANDBOX_ID, SANDBOX_ID),
                "the link itself: {link:?}"
            );
        }
        assert_eq!(meta(&secret), (LEGACY, LEGACY, 0o6777), "no target changed");
        assert_eq!(meta(&fx.outside), (LEGACY, LEGACY, 0o777));
        assert!(report.skipped.is_empty(), "{report:?}");
    }

    #[test]
    fn a_hard_linked_file_of_someone_else_is_skipped_and_named() {
        let fx = Fixture::new();
        let secret = fx.outside.join("secret");
        set_mode(&secret, 0o4777);
        let inside = fx.tree.join("workspace/a/linked");
        fs::hard_link(&secret, &inside).unwrap();
        // One already the sandbox user's, with another name: its owner is no news.
        let ours = fx.tree.join("workspace/ours");
        fs::write(&ours, "x").unwrap();
        lchown(&ours, Some(SANDBOX_ID), Some(SANDBOX_ID)).unwrap();
        set_mode(&ours, 0o666);
        fs::hard_link(&ours, fx.outside.join("ours-elsewhere")).unwrap();

        let mut report = OwnershipReport::default();
        give_tree(fx.open().as_fd(), &mut report).unwrap();
        assert_eq!(meta(&secret), (LEGACY, LEGACY, 0o4777));
        assert_eq!(
            report.skipped,
            ["workspace/a/linked: has other hard links, which may lie outside"]
        );
        assert_eq!(meta(&ours), (SANDBOX_ID, SANDBOX_ID, 0o664));
    }

    #[test]
    fn a_second_call_with_the_marker_present_changes_nothing() {
        let fx = Fixture::new();
        let first = migrate_subtree_once(fx.open().as_fd()).unwrap();
        assert!(first.migrated);
        assert!(first.changed > 0, "{first:?}");
        let marker = fx.tree.join(OWNERSHIP_MARKER);
        assert_eq!(meta(&marker), (0, 0, 0o644), "the marker is root's");
        assert_eq!(owner(&fx.tree), (SANDBOX_ID, SANDBOX_ID), "the root itself");

        // Changed after the migration: not the routine's business any more.
        let file = fx.tree.join("workspace/a/file");
        lchown(&file, Some(LEGACY), Some(LEGACY)).unwrap();
        set_mode(&file, 0o777);
        let second = migrate_subtree_once(fx.open().as_fd()).unwrap();
        assert_eq!(second, OwnershipReport::default());
        assert_eq!(meta(&file), (LEGACY, LEGACY, 0o777));
    }

    #[test]
    fn a_marker_that_is_not_a_regular_file_does_not_count() {
        let fx = Fixture::new();
        symlink(fx.outside.join("secret"), fx.tree.join(OWNERSHIP_MARKER)).unwrap();
        let report = migrate_subtree_once(fx.open().as_fd()).unwrap();
        assert!(report.migrated, "{report:?}");
        assert_eq!(
            owner(&fx.tree.join("workspace/a/file")),
            (SANDBOX_ID, SANDBOX_ID)
        );
        assert_eq!(owner(&fx.outside.join("secret")), (LEGACY, LEGACY));
    }

    #[test]
    fn a_tree_deeper_than_the_walk_goes_is_refused_naming_where_it_stopped() {
        let fx = Fixture::new();
        let mut dir = fx.tree.clone();
        for _ in 0..=MAX_WALK_DEPTH {
            dir.push("d");
        }
        fs::create_dir_all(&dir).unwrap();
        let mut report = OwnershipReport::default();
        match give_tree(fx.open().as_fd(), &mut report) {
            Err(FsError::TooDeep { path, limit }) => {
                assert_eq!(limit, MAX_WALK_DEPTH);
                assert_eq!(path.split('/').count(), MAX_WALK_DEPTH as usize);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_name_the_call_and_the_relative_path_only() {
        let error = io_error("chmod", "workspace/a/file", Errno::PERM);
        let message = error.to_string();
        assert!(
            message.starts_with("`workspace/a/file`: cannot chmod: "),
            "{message}"
        );
    }

    /// Runs in a copy of this test binary inside a private mount namespace (`unshare
    /// --mount`), where it may mount without touching the machine's mounts: a tmpfs (another
    /// device) and a bind mount of a directory of the same filesystem (same device, another
    /// mount id) inside the tree. Neither is entered nor changed.
    #[test]
    fn a_mount_point_inside_is_skipped() {
        if std::env::var_os(MOUNT_NAMESPACE_ENV).is_some() {
            mount_point_inside_is_skipped_in_namespace();
            return;
        }
        require_root();
        let output = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ownership::tests::a_mount_point_inside_is_skipped",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(MOUNT_NAMESPACE_ENV, "1")
            .output()
            .expect("run unshare(1) (util-linux)");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "in the mount namespace: {}\n{stdout}\n{stderr}",
            output.status
        );
        assert!(
            stdout.contains("mount points checked"),
            "the test ran in the namespace: {stdout}\n{stderr}"
        );
    }

    /// Unmounts its paths when dropped (ignoring those that were never mounted).
    struct Unmount(Vec<PathBuf>);

    impl Drop for Unmount {
        fn drop(&mut self) {
            for path in &self.0 {
                let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::empty());
            }
        }
    }

    fn mount_point_inside_is_skipped_in_namespace() {
        let fx = Fixture::new();
        let tmpfs = fx.tree.join("workspace/tmpfs");
        let bind = fx.tree.join("workspace/bind");
        fs::create_dir_all(&tmpfs).unwrap();
        fs::create_dir_all(&bind).unwrap();
        let file_mount = fx.tree.join("workspace/a/file");
        // Dropped before `fx`: the temporary directory is removed with nothing mounted in it.
        let _mounts = Unmount(vec![tmpfs.clone(), bind.clone(), file_mount.clone()]);
        rustix::mount::mount(
            "warren-test",
            &tmpfs,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();
        fs::write(tmpfs.join("inside"), "x").unwrap();
        lchown(&tmpfs, Some(LEGACY), Some(LEGACY)).unwrap();
        lchown(tmpfs.join("inside"), Some(LEGACY), Some(LEGACY)).unwrap();
        set_mode(&tmpfs, 0o777);
        // `outside/` shows up inside the tree, on the same device.
        rustix::mount::mount_bind(&fx.outside, &bind).unwrap();
        // A file bind-mounted over a name is a mount point too.
        rustix::mount::mount_bind(fx.outside.join("secret"), &file_mount).unwrap();
        set_mode(&fx.outside.join("secret"), 0o666);

        let report = migrate_subtree_once(fx.open().as_fd()).unwrap();
        assert_eq!(
            report.skipped,
            [
                "workspace/a/file: a mount point",
                "workspace/bind: a mount point",
                "workspace/tmpfs: a mount point",
            ]
        );
        assert_eq!(meta(&tmpfs), (LEGACY, LEGACY, 0o777));
        assert_eq!(owner(&tmpfs.join("inside")), (LEGACY, LEGACY));
        assert_eq!(owner(&fx.outside), (LEGACY, LEGACY));
        assert_eq!(meta(&fx.outside.join("secret")), (LEGACY, LEGACY, 0o666));
        assert_eq!(
            owner(&fx.tree.join("workspace/a")),
            (SANDBOX_ID, SANDBOX_ID)
        );
        println!("mount points checked");
    }
}
