//! Assembles the view from inside a runtime (I7, I8, I11), in the init process, inside its
//! fresh mount namespace, before `pivot_root`:
//!
//! ```text
//! /                 tmpfs, read-only after assembly (host profile), or an overlay (rootfs dir)
//! /usr /opt /lib*   overlay: host directory read-only below, per-runtime tmpfs above (CoW)
//! /etc              overlay over the provisioner's filtered copy of /etc (no secrets)
//! /home/gem         tmpfs, size-capped, owned by 1000:1000 (the layout's home); in E2B's
//!                   layout `/home/user` is no tmpfs but the workdir's bind (below)
//! <the layout's persistent mounts>, each a bind of a directory init opened by
//!                   descriptor, rw or ro as the layout says, nosuid, nodev; the ARS layout:
//!   /home/gem/user-data   this uid's UserWorkspace, rw
//!   /home/gem/skills      this uid's skill projection, ro
//!                   the DeerFlow layout (mount points made on the root before it is
//!                   made read-only):
//!   /mnt/user-data        the sandbox's workdir, rw
//!   /mnt/skills/public    this uid's skill projection, ro
//!   /mnt/skills/custom    this uid's personal skills, ro
//!                   the E2B layout (the home is the mount):
//!   /home/user            the sandbox's workdir, rw
//! /tmp /dev/shm     tmpfs, size-capped, 1777
//! /dev              tmpfs (ro) with null zero full random urandom tty bound from the host,
//!                   a private devpts instance, and the usual /proc/self/fd links
//! /proc             a fresh procfs of the runtime's pid namespace, with the dangerous
//!                   entries masked or read-only
//! ```
//!
//! Nothing else of the host is reachable: not other uids' workspaces, not the data dir,
//! not the token, not /root, not the Docker socket.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use crate::config::{RootSource, RuntimeConfig, SANDBOX_GID, SANDBOX_UID};
use crate::runtime::SetupError;
use warren_backend::bind_fd;
use warren_core::MountSource;

/// Host system directories of the host profile, each bound read-only under a CoW layer (or
/// recreated as the same symlink on merged-/usr systems).
pub(crate) const HOST_PROFILE_DIRS: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt",
];

/// Directories the sandbox user may write to in the CoW layer, so installs into the usual
/// prefixes (`pip install --prefix /usr/local`, tools under /opt) work as 1000:1000.
pub(crate) const USER_WRITABLE_PREFIXES: &[&str] = &["usr/local", "opt"];

/// Device nodes bound from the host into the runtime's /dev.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// /proc entries hidden behind /dev/null: kernel memory, keys, timing side channels.
const PROC_MASKED: &[&str] = &[
    "kcore",
    "keys",
    "timer_list",
    "sysrq-trigger",
    "kpagecount",
    "kpageflags",
];
/// /proc trees made read-only.
const PROC_READ_ONLY: &[&str] = &["sys", "bus", "fs", "irq"];

fn step<T>(stage: &'static str, result: io::Result<T>) -> Result<T, SetupError> {
    result.map_err(|source| SetupError { stage, source })
}

fn rustix_step<T>(stage: &'static str, result: rustix::io::Result<T>) -> Result<T, SetupError> {
    step(stage, result.map_err(io::Error::from))
}

fn mkdir(path: &Path, mode: u32) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn tmpfs(target: &Path, flags: MountFlags, options: &str) -> rustix::io::Result<()> {
    let options = std::ffi::CString::new(options).map_err(|_| rustix::io::Errno::INVAL)?;
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, options.as_c_str())
}

/// Mounts an overlay of `lower` with its writable layer in `<cow>/<name>`.
///
/// Options name the layers *relative to the CoW tmpfs* (the caller's cwd), because
/// /proc/mounts inside the runtime shows them verbatim and no host path of warren's may
/// appear there (I1). A lower layer outside the standard system directories is first bound
/// into the CoW tmpfs for the same reason.
fn overlay(
    lower: &Path,
    cow: &Path,
    name: &str,
    target: &Path,
    user_namespace: bool,
) -> io::Result<()> {
    let layer = cow.join(name);
    std::fs::create_dir_all(layer.join("upper"))?;
    std::fs::create_dir_all(layer.join("work"))?;
    let lower_option = if HOST_PROFILE_DIRS
        .iter()
        .any(|d| lower == Path::new("/").join(d))
    {
        lower.display().to_string()
    } else {
        let bound = layer.join("lower");
        std::fs::create_dir_all(&bound)?;
        rustix::mount::mount_bind(lower, &bound)?;
        format!("{name}/lower")
    };
    let mut options = format!("lowerdir={lower_option},upperdir={name}/upper,workdir={name}/work");
    if user_namespace {
        // overlayfs keeps its whiteouts in trusted.* xattrs, which a user namespace may not
        // write; user.* ones work there.
        options.push_str(",userxattr");
    }
    let options = std::ffi::CString::new(options).map_err(io::Error::other)?;
    rustix::mount::mount(
        "overlay",
        target,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        options.as_c_str(),
    )?;
    Ok(())
}

/// Builds the runtime's root under `<runtime_dir>/root` and pivots into it.
pub(crate) fn assemble(config: &RuntimeConfig, hostname: &str) -> Result<(), SetupError> {
    let root = config.runtime_dir.join("root");
    let cow = config.runtime_dir.join("cow");
    let limits = &config.limits;
    let userns = config.user_namespace.is_some();
    rustix_step(
        "make mounts private",
        rustix::mount::mount_change(
            "/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        ),
    )?;
    step(
        "create mount points",
        mkdir(&root, 0o755).and(mkdir(&cow, 0o700)),
    )?;
    rustix_step(
        "mount the copy-on-write layer",
        tmpfs(
            &cow,
            MountFlags::NOSUID | MountFlags::NODEV,
            &format!("size={},mode=0700", limits.cow_bytes),
        ),
    )?;
    rustix_step(
        "enter the copy-on-write layer",
        rustix::process::chdir(&cow),
    )?;
    if let Some(seed) = &config.seed {
        step(
            "seed the copy-on-write layer",
            seed_cow(&seed.join("cow"), &cow),
        )?;
    }
    keep_cow_open(&cow)?;
    let read_only_root = match &config.root {
        RootSource::HostProfile { etc } => {
            rustix_step(
                "mount the root tmpfs",
                tmpfs(
                    &root,
                    MountFlags::NOSUID | MountFlags::NODEV,
                    "size=1m,mode=0755",
                ),
            )?;
            for name in HOST_PROFILE_DIRS {
                let host = Path::new("/").join(name);
                let Ok(meta) = std::fs::symlink_metadata(&host) else {
                    continue;
                };
                let target = root.join(name);
                if meta.file_type().is_symlink() {
                    let link = step("read a host profile link", std::fs::read_link(&host))?;
                    step(
                        "recreate a host profile link",
                        std::os::unix::fs::symlink(link, &target),
                    )?;
                } else if meta.is_dir() {
                    step("create a host profile dir", mkdir(&target, 0o755))?;
                    step(
                        "overlay a host profile dir",
                        overlay(&host, &cow, name, &target, userns),
                    )?;
                }
            }
            step("create /etc", mkdir(&root.join("etc"), 0o755))?;
            step(
                "overlay /etc",
                overlay(etc, &cow, "etc", &root.join("etc"), userns),
            )?;
            for dir in ["var", "run", "home", "tmp", "proc", "dev", "root"] {
                step("create a root dir", mkdir(&root.join(dir), 0o755))?;
            }
            step(
                "link /var/tmp",
                std::os::unix::fs::symlink("/tmp", root.join("var/tmp")),
            )?;
            true
        }
        RootSource::Directory { path } => {
            step(
                "overlay the root directory",
                overlay(path, &cow, "root", &root, userns),
            )?;
            // An image is untrusted: a symlink where warren creates, mounts or chowns
            // would be followed on the host before pivot_root (`home -> /`). Refuse it.
            for path in IMAGE_PATHS_WARREN_USES {
                refuse_symlink(&root, path)?;
            }
            for dir in ["home", "tmp", "proc", "dev"] {
                step("create a root dir", mkdir(&root.join(dir), 0o755))?;
            }
            false
        }
    };
    for prefix in USER_WRITABLE_PREFIXES {
        let dir = root.join(prefix);
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            // A chown on the overlay copies only the directory up; the host is untouched.
            // In a user namespace root-owned host directories cannot change hands (their
            // owner is not mapped): installs there are then not possible, and that is all.
            let result = chown_tree_top(&dir);
            if !userns {
                step("hand install prefixes to the sandbox user", result)?;
            }
        }
    }
    // Opened here, inside the new mount namespace: a bind mount's source must belong to it.
    let mounts = open_mounts(config)?;
    home(config, &root, &mounts)?;
    rustix_step(
        "mount /tmp",
        tmpfs(
            &root.join("tmp"),
            MountFlags::NOSUID | MountFlags::NODEV,
            &format!("size={},mode=1777", limits.tmp_bytes),
        ),
    )?;
    dev(config, &root)?;
    proc(&root)?;
    rustix_step(
        "set the hostname",
        rustix::system::sethostname(hostname.as_bytes()),
    )?;
    step("bring loopback up", warren_agent::sys::loopback_up())?;
    pivot(&root)?;
    if read_only_root {
        rustix_step(
            "make / read-only",
            rustix::mount::mount_remount(
                "/",
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                "size=1m,mode=0755",
            ),
        )?;
    }
    Ok(())
}

/// Hands a directory and its subdirectories (one level) to the sandbox user, by file
/// descriptor and never through a symlink (the tree may come from an image).
fn chown_tree_top(dir: &Path) -> io::Result<()> {
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let uid = Some(rustix::fs::Uid::from_raw(SANDBOX_UID));
    let gid = Some(rustix::fs::Gid::from_raw(SANDBOX_GID));
    rustix::fs::fchown(&fd, uid, gid)?;
    for entry in rustix::fs::Dir::read_from(&fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if entry.file_type() == rustix::fs::FileType::Directory
            && name.to_bytes() != b"."
            && name.to_bytes() != b".."
        {
            rustix::fs::chownat(&fd, name, uid, gid, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        }
    }
    Ok(())
}

/// Paths inside an image root that warren creates, mounts on or chowns before pivot_root
/// (the layout's home and mount points are checked as they are made, [`mount_point`]).
const IMAGE_PATHS_WARREN_USES: &[&str] = &["home", "tmp", "proc", "dev", "usr", "usr/local", "opt"];

fn refuse_symlink(root: &Path, relative: &str) -> Result<(), SetupError> {
    let mut path = root.to_owned();
    let mut inside = String::new();
    for component in relative.split('/') {
        path.push(component);
        inside.push('/');
        inside.push_str(component);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(SetupError {
                    stage: "check the image root",
                    source: io::Error::other(format!(
                        "the image has a symlink at {inside}, where warren mounts or writes; refusing it"
                    )),
                })
            }
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// One persistent mount of the runtime's view, its source open.
struct OpenMount {
    /// Where it goes inside the runtime (one of the view's targets).
    target: String,
    /// The directory it shows, opened by descriptor.
    source: OwnedFd,
    writable: bool,
}

/// Opens the source of every persistent mount the config lists, each checked against the
/// runtime's view (its layout and extra mounts, [`warren_core::view_mounts`]): a target
/// the view does not have is refused, except one inside a mount of the user's data (a
/// workdir's branch or a read-only baseline over the workspace, I27); none is writable
/// where the view's is not. `beneath` is opened from the tree's descriptor with no symlink
/// followed, no `..` and no mount crossed ([`warren_backend::HostMount::open`]): a workdir
/// whose component a sandbox of the same uid swapped for a link to `/` or to another
/// uid's tree, or an extra mount's source someone replaced with a link, fails here, before
/// anything is mounted (I2).
fn open_mounts(config: &RuntimeConfig) -> Result<Vec<OpenMount>, SetupError> {
    let layout = config.layout.layout();
    let view = warren_core::view_mounts(layout, &config.extra_mounts);
    let inside = |outer: &str, inner: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
    };
    config
        .mounts
        .iter()
        .map(|mount| {
            let exact = view.iter().find(|m| m.target == mount.target);
            let over = view.iter().find(|m| {
                matches!(m.source, MountSource::UserWorkspace | MountSource::Workdir)
                    && inside(m.target, &mount.target)
            });
            let (source, view_writable) = match (exact, over) {
                (Some(expected), _) => (expected.source, expected.writable),
                (None, Some(outer)) => (MountSource::Workdir, outer.writable),
                (None, None) => {
                    return Err(SetupError {
                        stage: "check the persistent mounts",
                        source: io::Error::other(format!(
                            "{} is not a mount of this runtime's view ({} layout)",
                            mount.target, layout.name
                        )),
                    })
                }
            };
            let writable = view_writable && mount.writable;
            let host = warren_backend::HostMount {
                target: mount.target.clone(),
                source,
                tree: mount.tree.clone(),
                beneath: mount.beneath.clone(),
                writable,
            };
            // The message names the path inside the tree (the workdir, agents/skills),
            // never a host path of warren's (I1).
            let opened = host.open().map_err(|error| SetupError {
                stage: "open a persistent mount's source",
                source: io::Error::other(format!("for {}: {error}", mount.target)),
            })?;
            Ok(OpenMount {
                target: mount.target.clone(),
                source: opened,
                writable,
            })
        })
        .collect()
}

/// Creates the directory `target` (absolute, inside the runtime) under `root` to mount
/// on, one component at a time. A component that is a symlink is refused: the root may
/// be an image's (`mnt -> /` would put the bind on the host before `pivot_root`).
fn mount_point(root: &Path, target: &str) -> Result<std::path::PathBuf, SetupError> {
    let relative = target.trim_start_matches('/');
    refuse_symlink(root, relative)?;
    let mut path = root.to_owned();
    for component in relative.split('/') {
        path.push(component);
        step("create a mount point", mkdir(&path, 0o755))?;
    }
    Ok(path)
}

/// Mounts the home tmpfs, seeds it from a snapshot, and binds every persistent mount:
/// those inside the home get their mount points in the fresh tmpfs, the others on the
/// runtime's root (the host profile's tmpfs or the image's overlay), which is still
/// writable here and made read-only only after `pivot_root`.
///
/// A layout whose home is a persistent mount (E2B's workdir at `/home/user`) gets no
/// tmpfs and no seed there: the bind is the home, and it is persistent already (I30).
fn home(config: &RuntimeConfig, root: &Path, mounts: &[OpenMount]) -> Result<(), SetupError> {
    let layout = config.layout.layout();
    if layout.home_is_ephemeral() {
        let home = mount_point(root, layout.home)?;
        rustix_step(
            "mount the home",
            tmpfs(
                &home,
                MountFlags::NOSUID | MountFlags::NODEV,
                &format!(
                    "size={},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_GID}",
                    config.limits.home_bytes
                ),
            ),
        )?;
        if let Some(seed) = &config.seed {
            // The persistent mounts inside the home are not state: a snapshot never holds
            // them, and a seed never puts anything (a symlink least of all) where they go.
            let skip: Vec<&str> = layout
                .mounts_in_home()
                .into_iter()
                .filter_map(|name| name.split('/').next())
                .collect();
            step("seed the home", copy_seed(&seed.join("home"), &home, &skip))?;
        }
    }
    for mount in mounts {
        let target = mount_point(root, &mount.target)?;
        step(
            "bind a persistent mount",
            bind_fd(&mount.source, &target, !mount.writable),
        )?;
    }
    Ok(())
}

fn dev(config: &RuntimeConfig, root: &Path) -> Result<(), SetupError> {
    let dev = root.join("dev");
    rustix_step(
        "mount /dev",
        tmpfs(
            &dev,
            MountFlags::NOSUID | MountFlags::NOEXEC,
            "size=64k,mode=0755",
        ),
    )?;
    for name in DEVICES {
        let target = dev.join(name);
        step(
            "create a device mount point",
            std::fs::File::create(&target).map(drop),
        )?;
        rustix_step(
            "bind a device",
            rustix::mount::mount_bind(Path::new("/dev").join(name), &target),
        )?;
    }
    let pts = dev.join("pts");
    step("create /dev/pts", mkdir(&pts, 0o755))?;
    rustix_step(
        "mount /dev/pts",
        rustix::mount::mount(
            "devpts",
            &pts,
            "devpts",
            MountFlags::NOSUID | MountFlags::NOEXEC,
            c"newinstance,ptmxmode=0666,mode=0620",
        ),
    )?;
    let shm = dev.join("shm");
    step("create /dev/shm", mkdir(&shm, 0o1777))?;
    rustix_step(
        "mount /dev/shm",
        tmpfs(
            &shm,
            MountFlags::NOSUID | MountFlags::NODEV,
            &format!("size={},mode=1777", config.limits.shm_bytes),
        ),
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        step(
            "link in /dev",
            std::os::unix::fs::symlink(target, dev.join(link)),
        )?;
    }
    rustix_step(
        "make /dev read-only",
        rustix::mount::mount_remount(
            &dev,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
            "size=64k,mode=0755",
        ),
    )?;
    Ok(())
}

fn proc(root: &Path) -> Result<(), SetupError> {
    let proc = root.join("proc");
    rustix_step(
        "mount /proc",
        rustix::mount::mount(
            "proc",
            &proc,
            "proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            // Processes of other users — init, which runs as root — are invisible to the
            // sandbox user: nothing about the runtime's machinery shows in `ps`.
            c"hidepid=invisible",
        ),
    )?;
    let null = root.join("dev/null");
    for name in PROC_MASKED {
        let target = proc.join(name);
        if target.exists() {
            rustix_step(
                "mask a /proc entry",
                rustix::mount::mount_bind(&null, &target),
            )?;
        }
    }
    for name in PROC_READ_ONLY {
        let target = proc.join(name);
        if target.is_dir() {
            rustix_step(
                "bind a /proc tree",
                rustix::mount::mount_bind(&target, &target),
            )?;
            rustix_step(
                "make a /proc tree read-only",
                rustix::mount::mount_remount(
                    &target,
                    MountFlags::BIND
                        | MountFlags::RDONLY
                        | MountFlags::NOSUID
                        | MountFlags::NODEV
                        | MountFlags::NOEXEC,
                    "",
                ),
            )?;
        }
    }
    Ok(())
}

fn pivot(root: &Path) -> Result<(), SetupError> {
    rustix_step("enter the new root", rustix::process::chdir(root))?;
    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
    // nothing of the host's mount tree in this namespace.
    rustix_step("pivot_root", rustix::process::pivot_root(".", "."))?;
    rustix_step(
        "detach the host root",
        rustix::mount::unmount(".", UnmountFlags::DETACH),
    )?;
    rustix_step("enter /", rustix::process::chdir("/"))?;
    Ok(())
}

/// Keeps the copy-on-write layer open at [`crate::config::COW_FD`] in init, for snapshots
/// (I30). Close-on-exec: no command ever inherits it.
fn keep_cow_open(cow: &Path) -> Result<(), SetupError> {
    let fd = rustix_step(
        "open the copy-on-write layer",
        rustix::fs::open(
            cow,
            rustix::fs::OFlags::PATH
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ),
    )?;
    let kept = rustix_step(
        "keep the copy-on-write layer open",
        rustix::io::fcntl_dupfd_cloexec(&fd, crate::config::COW_FD),
    )?;
    // Init lives as long as the runtime; so does this descriptor.
    std::mem::forget(kept);
    Ok(())
}

/// Copies each `<seed>/<layer>/upper` into `<cow>/<layer>/upper`: the files a snapshot
/// recorded in the writable layers, put back before the overlays are mounted.
fn seed_cow(seed: &Path, cow: &Path) -> io::Result<()> {
    let Ok(layers) = std::fs::read_dir(seed) else {
        return Ok(());
    };
    for layer in layers {
        let layer = layer?;
        let upper = layer.path().join("upper");
        if std::fs::symlink_metadata(&upper).is_ok_and(|m| m.is_dir()) {
            let target = cow.join(layer.file_name()).join("upper");
            std::fs::create_dir_all(&target)?;
            copy_seed(&upper, &target, &[])?;
        }
    }
    Ok(())
}

/// Copies a seed tree (the provisioner's own directory, restored from a snapshot) into a
/// fresh tmpfs: directories, files and symlinks as themselves, with modes and owners;
/// nothing is followed. Top-level names in `skip` are left out (mount points).
fn copy_seed(from: &Path, to: &Path, skip: &[&str]) -> io::Result<()> {
    use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if skip.iter().any(|s| name == std::ffi::OsStr::new(s)) {
            continue;
        }
        let source = entry.path();
        let target = to.join(&name);
        let meta = std::fs::symlink_metadata(&source)?;
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if meta.is_dir() {
            if !target.exists() {
                std::fs::create_dir(&target)?;
            }
            copy_seed(&source, &target, &[])?;
            std::fs::set_permissions(&target, PermissionsExt::from_mode(meta.mode() & 0o7777))?;
        } else if meta.is_file() {
            copy_sparse(&source, &target, meta.len())?;
            std::fs::set_permissions(&target, PermissionsExt::from_mode(meta.mode() & 0o777))?;
        } else {
            continue;
        }
        lchown(&target, Some(meta.uid()), Some(meta.gid()))?;
    }
    Ok(())
}

/// Copies a regular file of `size` bytes extent by extent (`SEEK_DATA`/`SEEK_HOLE`), so a
/// sparse file stays sparse: copied densely, a snapshot's 10 GiB sparse file would fill the
/// size-capped tmpfs and the runtime could never start again.
fn copy_sparse(from: &Path, to: &Path, size: u64) -> io::Result<()> {
    use rustix::fs::{seek, SeekFrom};
    use rustix::io::Errno;
    use std::os::unix::fs::FileExt;
    let source = std::fs::File::open(from)?;
    let target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)?;
    let mut buffer = vec![0u8; 1024 * 1024];
    let mut position = 0u64;
    while position < size {
        let start = match seek(&source, SeekFrom::Data(position)) {
            Ok(start) => start,
            Err(Errno::NXIO) => break,
            Err(errno) => return Err(errno.into()),
        };
        let end = match seek(&source, SeekFrom::Hole(start)) {
            Ok(end) => end.min(size),
            Err(Errno::NXIO) => size,
            Err(errno) => return Err(errno.into()),
        };
        let mut offset = start;
        while offset < end {
            let want = usize::try_from(end - offset)
                .unwrap_or(usize::MAX)
                .min(buffer.len());
            let read = source.read_at(&mut buffer[..want], offset)?;
            if read == 0 {
                break;
            }
            target.write_all_at(&buffer[..read], offset)?;
            offset += read as u64;
        }
        if end <= start {
            break;
        }
        position = end;
    }
    target.set_len(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_seed_file_is_copied_with_its_holes() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        // From the data filesystem to a tmpfs, as init copies a seed: across filesystems
        // the kernel's own copy reads holes as zeros.
        let dir = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let (from, to) = (dir.path().join("from"), shm.path().join("to"));
        let file = std::fs::File::create(&from).unwrap();
        let size = 256 * 1024 * 1024;
        file.set_len(size).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        file.write_all_at(b"tail", size - 4).unwrap();
        file.write_all_at(b"middle", 100 << 20).unwrap();
        copy_sparse(&from, &to, size).unwrap();
        let meta = std::fs::metadata(&to).unwrap();
        assert_eq!(meta.len(), size);
        assert!(meta.blocks() * 512 < 1024 * 1024, "copied densely");
        let copy = std::fs::File::open(&to).unwrap();
        for (offset, want) in [
            (0, &b"head"[..]),
            (100 << 20, b"middle"),
            (size - 4, b"tail"),
        ] {
            let mut got = vec![0u8; want.len()];
            copy.read_exact_at(&mut got, offset).unwrap();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn mode_bits_of_created_dirs_are_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        mkdir(&path, 0o700).unwrap();
        mkdir(&path, 0o700).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
