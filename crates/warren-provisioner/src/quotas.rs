//! Storage quotas on UserWorkspaces (I23): bytes and inodes, enforced by the kernel.
//!
//! With `[quotas]` configured, each uid's UserWorkspace is a filesystem of its own: an ext4
//! image `<data>/volumes/<safe_uid>.ext4`, made by `mkfs.ext4` with exactly the uid's byte
//! size and inode count, loop-mounted (`nosuid,nodev`) on `user-data/shared/<uid>/workspace`.
//! A full workspace is then full *for that uid only*: its runtimes' writes fail with ENOSPC
//! and the file API answers 507 `quota_exceeded`, while the data filesystem, and with it the
//! state store, snapshots, artifacts and every other uid, keeps its space.
//!
//! Why a filesystem per uid and not ext4/XFS project quotas on the data filesystem: project
//! quotas need the kernel's quota formats (`CONFIG_QFMT_V2` for ext4, `CONFIG_XFS_QUOTA`),
//! which kernels built for small VMs often lack, and they limit inodes on XFS only where the
//! data directory is XFS. A loop-mounted ext4 needs nothing but loop devices, limits bytes
//! and inodes on any host filesystem, and hides the data directory's host path from
//! `/proc/self/mountinfo` inside a runtime (the bind source is the root of the uid's own
//! filesystem). The image is allocated in full when it is made, so quotas never overcommit
//! the data filesystem and a volume never meets a full disk underneath.
//!
//! Limits take effect when a uid's volume is made (its first workdir); a changed limit
//! applies to uids whose volume is made after the change.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use std::os::unix::fs::OpenOptionsExt;

use warren_core::{DataLayout, Uid};

use crate::ProvisionerError;

/// Where the per-uid volume images live, relative to the data directory.
pub const VOLUMES_RELATIVE: &str = "volumes";

/// The smallest volume: ext4 needs room for its journal and metadata.
pub const MIN_QUOTA_BYTES: u64 = 16 * 1024 * 1024;

/// The fewest inodes a volume may have: the filesystem itself takes eleven.
pub const MIN_QUOTA_INODES: u64 = 64;

/// The limits of one uid's workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Size of the workspace filesystem in bytes (its metadata included).
    pub bytes: u64,
    /// Files, directories and links the workspace may hold; `None`: ext4's default of one
    /// inode per 16 KiB.
    pub inodes: Option<u64>,
}

/// How quotas are enforced on this server; chosen at start-up and reported by `warren
/// doctor`, `/health` and a log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QuotaEnforcement {
    /// No quota configured: workspaces share the data filesystem.
    #[default]
    Off,
    /// One loop-mounted ext4 filesystem per uid: bytes and inodes enforced by the kernel.
    Volumes,
    /// Quotas are configured but this host cannot enforce them, and the operator accepted
    /// that (`[quotas] unenforced = true`): limits are reported, nothing is enforced.
    Unenforced,
}

impl QuotaEnforcement {
    /// The name used in `/health`, usage answers and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Volumes => "volumes",
            Self::Unenforced => "unenforced",
        }
    }
}

/// The quota configuration of one provisioner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaSettings {
    /// How limits are enforced.
    pub enforcement: QuotaEnforcement,
    /// The limits of every uid without an override.
    pub default: Option<QuotaLimits>,
    /// Per-uid overrides.
    pub users: BTreeMap<Uid, QuotaLimits>,
}

impl QuotaSettings {
    /// The limits of `uid`, if quotas are configured.
    pub fn limits_of(&self, uid: &Uid) -> Option<QuotaLimits> {
        self.users.get(uid).copied().or(self.default)
    }

    /// Whether the kernel enforces the limits.
    pub fn enforced(&self) -> bool {
        self.enforcement == QuotaEnforcement::Volumes
    }
}

/// Why this host cannot make per-uid volumes, or `None` when it can: root (mounting), loop
/// devices, and `mkfs.ext4` and `mount` on the PATH.
pub fn volumes_unsupported_reason() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("mounting per-uid volumes needs root".to_owned());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices (/dev/loop-control is missing)".to_owned());
    }
    if !filesystem_supported("ext4") {
        return Some("the kernel has no ext4".to_owned());
    }
    for (tool, args) in [("mkfs.ext4", ["-V"]), ("mount", ["-V"])] {
        match Command::new(tool).args(args).output() {
            Ok(output) if output.status.success() => {}
            _ => return Some(format!("{tool} is missing (install e2fsprogs and mount)")),
        }
    }
    None
}

fn filesystem_supported(name: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems").is_ok_and(|list| {
        list.lines()
            .any(|line| line.split_whitespace().last() == Some(name))
    })
}

/// What a uid's workspace holds and may hold, from the kernel's accounting of its
/// filesystem (`statvfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceUsage {
    /// How limits are enforced on this server.
    pub enforcement: QuotaEnforcement,
    /// Bytes in use (metadata included), when the workspace is a volume.
    pub bytes_used: Option<u64>,
    /// The byte limit: the volume's usable size, or the configured one before the volume
    /// exists.
    pub bytes_limit: Option<u64>,
    /// Inodes in use, when the workspace is a volume.
    pub inodes_used: Option<u64>,
    /// The inode limit.
    pub inodes_limit: Option<u64>,
}

/// The image of the volume of the uid whose directory name is `safe`.
pub(crate) fn volume_image(layout: &DataLayout, safe: &str) -> PathBuf {
    layout
        .data_dir()
        .join(VOLUMES_RELATIVE)
        .join(format!("{safe}.ext4"))
}

/// The workspace directory of the uid whose directory name is `safe` (a volume's mount point).
pub(crate) fn workspace_dir(layout: &DataLayout, safe: &str) -> PathBuf {
    layout
        .workspace_dir()
        .join("user-data/shared")
        .join(safe)
        .join("workspace")
}

/// Whether `dir` is the root of a filesystem mounted on its parent.
pub(crate) fn is_mount_root(dir: &Path) -> std::io::Result<bool> {
    let own = std::fs::symlink_metadata(dir)?;
    let parent = std::fs::symlink_metadata(dir.join(".."))?;
    Ok(own.dev() != parent.dev() || own.ino() == parent.ino())
}

pub(crate) fn volume_error(
    uid: &str,
    step: &'static str,
    detail: impl std::fmt::Display,
) -> ProvisionerError {
    ProvisionerError::Volume {
        uid: uid.to_string(),
        step,
        detail: detail.to_string(),
    }
}

/// Makes `uid`'s volume image (sparse, `mkfs.ext4` with the limits) if there is none, and
/// mounts it on the workspace directory if it is not mounted. Blocking.
fn ensure_volume(
    layout: &DataLayout,
    uid: &str,
    limits: QuotaLimits,
) -> Result<(), ProvisionerError> {
    let workspace = workspace_dir(layout, uid);
    let image = volume_image(layout, uid);
    if workspace.exists() && is_mount_root(&workspace).map_err(|e| volume_error(uid, "stat", e))? {
        return Ok(());
    }
    let fresh = !image.exists();
    if fresh {
        // A workspace made before quotas were configured is not moved silently: the
        // operator decides (start-up refuses such a data directory, see `check_volumes`).
        if dir_has_entries(&workspace).map_err(|e| volume_error(uid, "list", e))? {
            return Err(volume_error(
                uid,
                "check",
                "the workspace was made before quotas were configured and is not on a volume",
            ));
        }
        make_image(&image, limits).map_err(|failure| match failure {
            ImageFailure::NoRoom => ProvisionerError::NoRoomForVolume {
                uid: uid.to_owned(),
                bytes: limits.bytes,
            },
            ImageFailure::Other(detail) => volume_error(uid, "mkfs", detail),
        })?;
    }
    std::fs::create_dir_all(&workspace).map_err(|e| volume_error(uid, "mkdir", e))?;
    mount_image(&image, &workspace).map_err(|e| volume_error(uid, "mount", e))?;
    if fresh {
        // mke2fs makes lost+found; a runtime would show it in /home/gem/user-data, and
        // e2fsck makes it again when it needs it.
        match std::fs::remove_dir(workspace.join("lost+found")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(volume_error(uid, "tidy", e)),
        }
    }
    Ok(())
}

pub(crate) fn dir_has_entries(dir: &Path) -> std::io::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Why a volume image could not be made.
enum ImageFailure {
    /// The data filesystem has no room for the image's full allocation: the operator's
    /// disk is full (or over-promised), not the uid's quota.
    NoRoom,
    /// Anything else, said in words.
    Other(String),
}

impl From<String> for ImageFailure {
    fn from(detail: String) -> Self {
        Self::Other(detail)
    }
}

/// A sparse image of `limits.bytes` made into ext4 under a temporary name, then renamed into
/// place: an image under its final name is always a whole filesystem.
fn make_image(image: &Path, limits: QuotaLimits) -> Result<(), ImageFailure> {
    let dir = image
        .parent()
        .expect("a volume image has a parent directory");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let temp = image.with_extension("ext4.new");
    let _ = std::fs::remove_file(&temp);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(|e| e.to_string())?;
    // Allocated in full, not sparse: a volume's writes can then never fail on the data
    // filesystem underneath (which would be I/O errors inside the uid's filesystem), and the
    // sum of quotas can never overcommit the disk. `nodiscard` below keeps it allocated.
    if let Err(errno) =
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, limits.bytes)
    {
        drop(file);
        let _ = std::fs::remove_file(&temp);
        if errno == rustix::io::Errno::NOSPC {
            return Err(ImageFailure::NoRoom);
        }
        return Err(ImageFailure::Other(format!(
            "cannot allocate {} bytes for the volume: {errno}",
            limits.bytes
        )));
    }
    drop(file);
    let mut mkfs = Command::new("mkfs.ext4");
    // No blocks reserved for root: warren's file API runs as root and must stop at the
    // same limit as the sandbox user. The root directory belongs to the sandbox user (I11).
    mkfs.args([
        "-q",
        "-F",
        "-m",
        "0",
        "-b",
        "4096",
        "-L",
        "warren-workspace",
    ])
    .args(["-E", "root_owner=1000:1000,nodiscard"]);
    if let Some(inodes) = limits.inodes {
        mkfs.args(["-N", &inodes.to_string()]);
    }
    let output = mkfs
        .arg(&temp)
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&temp);
        return Err(ImageFailure::Other(format!(
            "mkfs.ext4 failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(std::fs::rename(&temp, image).map_err(|e| e.to_string())?)
}

/// Loop-mounts `image` on `target`. `mount -o loop` attaches the image with autoclear (the
/// loop device goes with the last unmount) and reuses the loop device already attached to
/// the same image, so an image is never mounted through two devices at once.
pub(crate) fn mount_image(image: &Path, target: &Path) -> Result<(), String> {
    let output = Command::new("mount")
        .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
        .arg(image)
        .arg(target)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// See [`crate::Workspaces::volume_job`].
pub(crate) struct VolumeJob {
    pub(crate) layout: DataLayout,
    pub(crate) safe: String,
    pub(crate) limits: QuotaLimits,
    pub(crate) lock: Arc<Mutex<()>>,
}

impl VolumeJob {
    /// Makes the image if there is none and mounts it if it is not mounted. Blocking.
    pub(crate) fn run(self) -> Result<(), ProvisionerError> {
        // One volume is made at a time: two first workdirs of one uid must not both run
        // mkfs or mount.
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        ensure_volume(&self.layout, &self.safe, self.limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_override_wins_over_the_default_limits() {
        let alice = Uid::new("alice").unwrap();
        let bob = Uid::new("bob").unwrap();
        let settings = QuotaSettings {
            enforcement: QuotaEnforcement::Volumes,
            default: Some(QuotaLimits {
                bytes: 1 << 30,
                inodes: None,
            }),
            users: BTreeMap::from([(
                alice.clone(),
                QuotaLimits {
                    bytes: 1 << 20,
                    inodes: Some(100),
                },
            )]),
        };
        assert_eq!(settings.limits_of(&alice).unwrap().bytes, 1 << 20);
        assert_eq!(settings.limits_of(&bob).unwrap().bytes, 1 << 30);
        assert!(QuotaSettings::default().limits_of(&bob).is_none());
    }
}
