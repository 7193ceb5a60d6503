//! What the provisioner side hands a runtime's init process, as JSON on its stdin.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use warren_core::LayoutName;

pub use warren_agent::environment::{
    base_environment, HOME_FD, PROXY_PORT, SANDBOX_GID, SANDBOX_UID,
};
pub use warren_backend::RuntimeLimits;

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
    /// copy-on-write layers, `<seed>/home` seeds the layout's home when it is ephemeral
    /// (never a home that is the persistent workdir, E2B's). The provisioner's own
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

/// The descriptor number at which init keeps its copy-on-write layer open, so the
/// provisioner can snapshot it through `/proc/<init>/fd/<n>` (the layer is mounted
/// nowhere a path from outside reaches, and nowhere inside the runtime either).
pub const COW_FD: i32 = 200;

/// The one id mapping of an unprivileged runtime's user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    /// The provisioner's uid on the host, which is 1000 inside.
    pub outside_uid: u32,
    /// The provisioner's gid on the host, which is 1000 inside.
    pub outside_gid: u32,
}

/// The root filesystem of a runtime; writes land in a per-runtime copy-on-write layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RootSource {
    /// The host's system directories (`/usr`, `/bin`, `/lib*`, `/sbin`, `/opt`) read-only,
    /// and a filtered copy of `/etc` without secrets, built once by the provisioner for
    /// each distinct sandbox user of the layouts (its `passwd` names the runtime's).
    HostProfile {
        /// The filtered `/etc` naming the runtime's layout's user.
        etc: PathBuf,
    },
    /// A root filesystem directory (an unpacked image).
    Directory {
        /// The directory.
        path: PathBuf,
    },
}
