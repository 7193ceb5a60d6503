//! Binding a directory a backend opened by descriptor onto a mount point.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::mount::MountFlags;

/// Binds a directory held open by `fd` (opened without following links) onto `target`,
/// nosuid and nodev, read-only when asked, keeping the flags the source mount has. The
/// Docker backend stages its binds beneath a user's tree with it too.
pub fn bind_fd(fd: &OwnedFd, target: &Path, read_only: bool) -> io::Result<()> {
    // Binding through /proc/self/fd uses the directory already opened no-follow, so a
    // symlink swapped into the host path after the check cannot redirect the mount.
    rustix::mount::mount_bind(format!("/proc/self/fd/{}", fd.as_raw_fd()), target)?;
    let mut flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
    if read_only {
        flags |= MountFlags::RDONLY;
    }
    // Flags the source mount already has must be kept: in a user namespace they are locked
    // (dropping noexec or noatime is EPERM), and as root dropping them would widen access.
    let source = rustix::fs::fstatvfs(fd)?.f_flag;
    for (has, keep) in [
        (rustix::fs::StatVfsMountFlags::RDONLY, MountFlags::RDONLY),
        (rustix::fs::StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (rustix::fs::StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (
            rustix::fs::StatVfsMountFlags::NODIRATIME,
            MountFlags::NODIRATIME,
        ),
        (
            rustix::fs::StatVfsMountFlags::RELATIME,
            MountFlags::RELATIME,
        ),
    ] {
        if source.contains(has) {
            flags |= keep;
        }
    }
    rustix::mount::mount_remount(target, flags, "")?;
    Ok(())
}
