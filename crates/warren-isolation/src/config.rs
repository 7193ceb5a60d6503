//! What the provisioner side hands a runtime's init process, as JSON on its stdin.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use warren_core::LayoutName;

/// The uid and gid every command runs as (I11).
pub const SANDBOX_UID: u32 = 1000;
/// See [`SANDBOX_UID`].
pub const SANDBOX_GID: u32 = 1000;

/// Everything the init process needs to build and run one runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    /// The sandbox id (also the cgroup name and hostname suffix).
    pub sandbox: String,
    /// The sandbox generation this runtime serves.
    pub generation: i64,
    /// The runtime's cgroup name (under `warren/`), unique per warren instance so two
    /// instances on one host never share one.
    pub cgroup_name: String,
    /// Host directory of this runtime: control socket, mount points, identity file.
    pub runtime_dir: PathBuf,
    /// What the runtime looks like from inside: its home and where its mounts go (I7).
    pub layout: LayoutName,
    /// Operator-allowed host directories shown beside the layout's mounts.
    #[serde(default)]
    pub extra_mounts: Vec<warren_core::ExtraMount>,
    /// The persistent mounts ([`warren_core::view_mounts`]), resolved to the host.
    pub mounts: Vec<MountConfig>,
    /// Where the root filesystem comes from.
    pub root: RootSource,
    /// Resource limits.
    pub limits: RuntimeLimits,
    /// Whether the runtime gets an egress proxy port ([`PROXY_PORT`] on its loopback).
    pub egress: bool,
    /// Unprivileged mode: the runtime gets its own user namespace in which the sandbox
    /// user 1000:1000 is the provisioner's own uid and gid outside. `None` as root.
    pub user_namespace: Option<IdMap>,
    /// Whether the runtime gets cgroups (limits, whole-tree kill). Unprivileged warren
    /// cannot create them without a delegated hierarchy.
    pub cgroups: bool,
    /// A restored snapshot to start from (I30): `<seed>/cow/<layer>/upper` seeds the
    /// copy-on-write layers, `<seed>/home` seeds `/home/gem`. The provisioner's own
    /// directory, removed once the runtime started.
    #[serde(default)]
    pub seed: Option<PathBuf>,
}

/// One persistent mount of a runtime, as [`warren_backend::HostMount`] describes it.
///
/// Init opens it again itself, inside the runtime's mount namespace (a bind mount's
/// source must belong to it): `tree` by its path, `beneath` from that descriptor with no
/// link followed and no mount crossed (I2), through the same [`warren_backend::HostMount`]
/// logic the other backends use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountConfig {
    /// Where the mount appears inside the runtime: one of the layout's targets.
    pub target: String,
    /// The host directory warren owns that the source lies in.
    pub tree: PathBuf,
    /// The directory beneath `tree` the mount shows; empty for `tree` itself.
    pub beneath: String,
    /// Whether the runtime may write under it.
    pub writable: bool,
}

impl From<&warren_backend::HostMount> for MountConfig {
    fn from(mount: &warren_backend::HostMount) -> Self {
        Self {
            target: mount.target.to_owned(),
            tree: mount.tree.clone(),
            beneath: mount.beneath.clone(),
            writable: mount.writable,
        }
    }
}

/// The sandbox user's name and home. Every layout has the same ones (a test holds them
/// to it): the host profile's `/etc/passwd` is built once for all runtimes, so a layout
/// with another user or home would need a profile of its own.
pub fn sandbox_user() -> (&'static str, &'static str) {
    let layout = LayoutName::default().layout();
    (layout.user, layout.home)
}

/// The descriptor number at which init keeps its copy-on-write layer open, so the
/// provisioner can snapshot it through `/proc/<init>/fd/<n>` (the layer is mounted
/// nowhere a path from outside reaches, and nowhere inside the runtime either).
pub const COW_FD: i32 = 200;

/// The descriptor number at which a container's agent keeps `/home/gem` open, so the
/// provisioner can snapshot and seed it through `/proc/<agent>/fd/<n>`: resolved by the
/// agent inside the container, never through a path of the image's (which could hold
/// symlinks that mean something else on the host).
pub const HOME_FD: i32 = 201;

/// The one id mapping of an unprivileged runtime's user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    /// The provisioner's uid on the host, which is 1000 inside.
    pub outside_uid: u32,
    /// The provisioner's gid on the host, which is 1000 inside.
    pub outside_gid: u32,
}

/// The loopback port inside a runtime where its egress proxy listens (network `open` or
/// `allowlist`); init hands each connection to the provisioner, which filters it.
pub const PROXY_PORT: u16 = 3128;

/// The root filesystem of a runtime; writes land in a per-runtime copy-on-write layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RootSource {
    /// The host's system directories (`/usr`, `/bin`, `/lib*`, `/sbin`, `/opt`) read-only,
    /// and a filtered copy of `/etc` without secrets, built once by the provisioner.
    HostProfile {
        /// The filtered `/etc`.
        etc: PathBuf,
    },
    /// A root filesystem directory (an unpacked image).
    Directory {
        /// The directory.
        path: PathBuf,
    },
}

/// Resource limits of one runtime (I23).
///
/// The ephemeral file systems (CoW layer, `/home/gem`, `/tmp`, `/dev/shm`) are tmpfs: their
/// pages count against `memory_bytes`. The defaults keep their sum well below the memory
/// limit, so filling them answers "No space left on device" rather than the OOM killer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeLimits {
    /// Memory of the whole runtime, bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads of the whole runtime.
    pub pids_max: Option<u64>,
    /// CPU quota in thousandths of a CPU (1000 = one CPU).
    pub cpu_millis: Option<u64>,
    /// Size of the copy-on-write layer over the root filesystem, bytes.
    pub cow_bytes: u64,
    /// Size of the ephemeral `/home/gem`, bytes.
    pub home_bytes: u64,
    /// Size of `/tmp`, bytes.
    pub tmp_bytes: u64,
    /// Size of `/dev/shm`, bytes.
    pub shm_bytes: u64,
    /// Open files per process.
    pub nofile: u64,
}

impl Default for RuntimeLimits {
    fn default() -> Self {
        const MIB: u64 = 1024 * 1024;
        Self {
            memory_bytes: Some(2048 * MIB),
            pids_max: Some(512),
            cpu_millis: Some(1000),
            cow_bytes: 512 * MIB,
            home_bytes: 256 * MIB,
            tmp_bytes: 256 * MIB,
            shm_bytes: 64 * MIB,
            nofile: 1024,
        }
    }
}

/// The clean environment every command starts from (I13, I14); the sandbox and call
/// environments are layered over it by the provisioner side.
pub fn base_environment() -> BTreeMap<String, String> {
    let (user, home) = sandbox_user();
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", home),
        ("USER", user),
        ("LOGNAME", user),
        ("SHELL", "/bin/sh"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("TERM", "dumb"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_has_the_one_sandbox_user_the_host_profile_names() {
        for name in LayoutName::ALL {
            let layout = name.layout();
            assert_eq!((layout.user, layout.home), sandbox_user(), "{name}");
        }
        let env = base_environment();
        assert_eq!((env["USER"].as_str(), env["HOME"].as_str()), sandbox_user());
    }
}
