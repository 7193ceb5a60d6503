//! Cgroups: resource limits and whole-tree kill for sandbox runtimes.
//!
//! Namespaces hide a sandbox from the host but limit nothing, and they don't let the
//! provisioner find every process a command started: a process that calls `setsid` and
//! double-forks leaves both its process group and the parent/child chain. Cgroups solve both
//! problems. The kernel charges memory, pids and CPU time to the cgroup a process lives in,
//! membership is inherited by every descendant, and leaving requires write access to
//! cgroupfs, so "every process in this cgroup" is exactly "everything this sandbox (or this
//! command) started".
//!
//! # Layout
//!
//! Every hierarchy in use gets `warren/<name>` for a sandbox, directly under the hierarchy
//! root. Cgroup v2 forbids processes in a cgroup whose controllers are delegated to children
//! (the "no internal processes" rule), so on v2 processes never live in `warren/<name>`
//! itself: the runtime's init lives in the leaf `warren/<name>/init` and each command in a
//! leaf `warren/<name>/exec-<n>`. Limits sit on `warren/<name>`, where they cover the init and
//! every command together, while a single command's tree can still be killed through its
//! leaf. Cgroup v1 has no such rule; there leafs exist only in the hierarchy used to track
//! processes (pids, normally), and processes join `warren/<name>` directly in the others.
//!
//! # Mixed hosts
//!
//! Hosts differ: some mount only cgroup v2 with every controller, others mount v1 controllers
//! separately plus a controller-less v2 hierarchy (still useful: it tracks processes, offers
//! `cgroup.kill` and reports CPU usage). A controller can be bound to one hierarchy only, so
//! each of memory, pids and cpu is taken from v2 when the v2 root offers it, else from v1.
//! [`CgroupSupport`] records what was found; [`CgroupSupport::describe`] explains it for
//! `warren doctor`.
//!
//! # Why file descriptors
//!
//! The runtime's init pivots its root away from `/sys`, and commands are placed into their
//! leafs from processes that live inside the sandbox's mount namespace. Paths would stop
//! resolving there, so [`SandboxCgroup`] and [`ExecCgroup`] open every directory they need
//! when they are created and afterwards work only relative to those descriptors.
//!
//! # Files
//!
//! `detect.rs` what the host offers; `sandbox.rs` a sandbox's groups and limits;
//! `exec.rs` a command's leaf; `kill.rs` killing every process of a set of groups;
//! `cleanup.rs` removing them; `stats.rs` what they report; `fd.rs` cgroupfs by descriptor.
//! What differs between the versions sits behind one trait, `driver.rs`'s `CgroupDriver`,
//! implemented in `v2/` and `v1/` (a module per controller); `pids.rs` holds the pids
//! controller, whose files both versions share.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Access, AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

/// Directory under each hierarchy root that holds every sandbox cgroup.
pub const ROOT_DIR: &str = "warren";

/// Leaf holding a sandbox's init process.
const INIT_LEAF: &str = "init";

/// CPU bandwidth period; `cpu_millis` is turned into a quota per period of this length.
const CPU_PERIOD_USEC: u64 = 100_000;

/// The kernel rejects quotas below one millisecond.
const MIN_CPU_QUOTA_USEC: u64 = 1_000;

/// How long [`SandboxCgroup::kill_all`] and [`ExecCgroup::kill`] wait for processes to go.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// Interval between checks (and, without `cgroup.kill`, between rounds of SIGKILL).
const KILL_POLL: Duration = Duration::from_millis(10);

/// How long [`kill_tree`] waits for the kernel to report a cgroup frozen before it kills
/// anyway (freezing waits for each task to reach a safe point; a task stuck in the kernel
/// delays it, and the kill must not wait on that).
const FREEZE_TIMEOUT: Duration = Duration::from_millis(500);

/// After writing `cgroup.kill`, how long to let the kernel work before also signalling pids
/// one by one (which only matters for processes that are not in the v2 hierarchy).
const CGROUP_KILL_GRACE: Duration = Duration::from_secs(1);

/// How long `rmdir` is retried while the kernel still reports the cgroup busy.
const REMOVE_TIMEOUT: Duration = Duration::from_millis(500);

/// Nested cgroups deeper than this below a sandbox are neither listed nor removed; warren
/// creates only one level (the leafs), this merely bounds recursion.
const MAX_DEPTH: usize = 8;

/// Controller names that may appear in a v1 mount's super options; everything else there
/// (`rw`, `name=systemd`, `xattr`, ...) is not a controller.
const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

/// Everything that can fail while detecting, creating, filling, killing or removing cgroups.
///
/// `path` is relative to a hierarchy and prefixed with it, e.g. `pids:warren/box/init` or
/// `unified:warren/box`, so a message says which controller refused what.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Reading the mount table or the root of the v2 hierarchy failed.
    #[error("cannot detect cgroup hierarchies from {path}")]
    Detect {
        /// The file that could not be read.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The sandbox name cannot be a cgroup directory name.
    #[error("invalid sandbox cgroup name {name:?}: use 1-128 of [A-Za-z0-9_-]")]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// Creating a cgroup directory failed.
    #[error("cannot create cgroup {path}")]
    Create {
        /// The cgroup.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Opening a cgroup directory or one of its files failed.
    #[error("cannot open cgroup {path}")]
    Open {
        /// The cgroup.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Writing a limit failed.
    #[error("cannot write {file} of cgroup {path}")]
    SetLimit {
        /// The cgroup.
        path: String,
        /// The interface file, e.g. `memory.max`.
        file: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Moving a process into a cgroup failed.
    #[error("cannot move pid {pid} into cgroup {path}")]
    AddProcess {
        /// The cgroup.
        path: String,
        /// The process (as seen from the caller's pid namespace).
        pid: i32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Listing the processes of a cgroup failed.
    #[error("cannot list the processes of cgroup {path}")]
    ListProcesses {
        /// The cgroup.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Killing the processes of a cgroup failed, or they outlived the timeout.
    #[error("cannot kill the processes of cgroup {path}")]
    Kill {
        /// The cgroup.
        path: String,
        /// Why (`TimedOut` when processes remained).
        #[source]
        source: io::Error,
    },
    /// Removing a cgroup directory failed (`EBUSY` while processes remain).
    #[error("cannot remove cgroup {path}")]
    Remove {
        /// The cgroup.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Listing the sandboxes under `warren/` failed.
    #[error("cannot list sandbox cgroups in {path}")]
    ListSandboxes {
        /// The `warren` directory of one hierarchy.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Resource limits of one sandbox, applied to the init and all commands together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory in bytes; swap is capped too where the kernel accounts it, so it cannot be
    /// used to exceed the limit.
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (processes and threads).
    pub pids_max: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU: 1000 is one full CPU, 500 half of one, 2000
    /// two. Enforced as a quota per 100 ms period (at least 1 ms).
    pub cpu_millis: Option<u64>,
}

/// Which limits this host can enforce and whether a command's process tree can be killed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforceable {
    /// A memory controller is available (v2 or v1).
    pub memory: bool,
    /// A pids controller is available (v2 or v1).
    pub pids: bool,
    /// A cpu controller is available (v2 or v1).
    pub cpu: bool,
    /// Some hierarchy tracks processes, so a whole tree (setsid'd grandchildren included)
    /// can be found and killed.
    pub tree_kill: bool,
}

/// Resource usage of a sandbox; a field is `None` when no mounted controller reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Memory charged now (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub memory_current_bytes: Option<u64>,
    /// Highest memory charged so far (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`).
    pub memory_peak_bytes: Option<u64>,
    /// Tasks now (`pids.current`).
    pub pids_current: Option<u64>,
    /// The task limit (`pids.max`); `None` when unlimited (`max`) or not reported.
    pub pids_max: Option<u64>,
    /// Forks refused because a pids limit was reached, so far: the `max` count of
    /// `pids.events`, summed over the sandbox's cgroup and every cgroup below it (the
    /// kernel counts a refusal in the forking task's cgroup, or, on cgroup v2 of recent
    /// kernels, in the one whose limit was reached). It falls when a leaf that counted
    /// some is removed.
    pub pids_refused: Option<u64>,
    /// CPU time consumed (v2 `cpu.stat` `usage_usec`, v1 `cpuacct.usage`).
    pub cpu_usage_usec: Option<u64>,
    /// The memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`); `None` when
    /// unlimited or not reported.
    pub memory_max_bytes: Option<u64>,
    /// Page cache charged, tmpfs included (v2 `memory.stat` `file`, v1 `total_cache`).
    pub memory_file_bytes: Option<u64>,
    /// The CPU limit in thousandths of a CPU (v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
    /// `cpu.cfs_period_us`); `None` when unlimited or not reported.
    pub cpu_max_millis: Option<u64>,
}

mod cleanup;
mod detect;
mod driver;
mod exec;
mod fd;
mod kill;
mod pids;
mod sandbox;
mod stats;
#[cfg(test)]
mod tests;
mod v1;
mod v2;

pub use cleanup::remove_stale;
pub use detect::CgroupSupport;
pub use exec::ExecCgroup;
pub use sandbox::SandboxCgroup;
use {cleanup::*, detect::*, driver::*, exec::*, fd::*, kill::*, sandbox::*, stats::*};
