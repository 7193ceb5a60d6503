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

use std::collections::BTreeSet;
use std::ffi::OsString;
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

/// The cgroup hierarchies of this host, as seen from the caller's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSupport {
    unified: Option<Unified>,
    v1: Vec<V1Mount>,
    /// This process's own cgroups (`/proc/self/cgroup`), as `(hierarchy, path)`; reported by
    /// [`CgroupSupport::describe`] because limits of an enclosing cgroup still apply.
    own: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Unified {
    path: PathBuf,
    /// Controllers listed in the root's `cgroup.controllers`.
    controllers: Vec<String>,
    /// Whether non-root cgroups have `cgroup.kill` (Linux 5.14+).
    cgroup_kill: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct V1Mount {
    path: PathBuf,
    /// Controllers bound to this hierarchy, e.g. `["cpu", "cpuacct"]` when co-mounted.
    controllers: Vec<String>,
}

impl V1Mount {
    fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }

    /// How this hierarchy is named in messages: its controllers, e.g. `cpu,cpuacct`.
    fn label(&self) -> String {
        self.controllers.join(",")
    }
}

/// The three controllers warren sets limits with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    const ALL: [Self; 3] = [Self::Memory, Self::Pids, Self::Cpu];

    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Cpu => "cpu",
        }
    }

    fn requested(self, limits: &Limits) -> bool {
        match self {
            Self::Memory => limits.memory_bytes.is_some(),
            Self::Pids => limits.pids_max.is_some(),
            Self::Cpu => limits.cpu_millis.is_some(),
        }
    }
}

/// Which controllers' interface files a sandbox directory in one hierarchy carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Controllers {
    memory: bool,
    pids: bool,
    cpu: bool,
    /// v1 `cpuacct.usage`, only read when no v2 hierarchy reports CPU usage.
    cpuacct: bool,
    /// v1 `freezer.state`, used to freeze a tree before killing it when no v2 hierarchy
    /// offers `cgroup.freeze`.
    freezer: bool,
}

impl Controllers {
    fn has(self, controller: Controller) -> bool {
        match controller {
            Controller::Memory => self.memory,
            Controller::Pids => self.pids,
            Controller::Cpu => self.cpu,
        }
    }

    fn insert(&mut self, controller: Controller) {
        match controller {
            Controller::Memory => self.memory = true,
            Controller::Pids => self.pids = true,
            Controller::Cpu => self.cpu = true,
        }
    }

    fn limit_controllers(self) -> impl Iterator<Item = Controller> {
        Controller::ALL.into_iter().filter(move |c| self.has(*c))
    }

    /// Keeps only the controllers named in a `cgroup.controllers` file.
    fn intersect_listed(self, listed: &str) -> Self {
        let listed: Vec<&str> = listed.split_whitespace().collect();
        let mut out = Self::default();
        for controller in self.limit_controllers() {
            if listed.contains(&controller.name()) {
                out.insert(controller);
            }
        }
        out
    }
}

/// Where a controller comes from on this host.
enum Backing<'a> {
    Unified,
    V1(&'a V1Mount),
    Missing,
}

/// One hierarchy a sandbox gets a directory in, before anything is created.
struct Plan<'a> {
    unified: bool,
    mount: &'a Path,
    hierarchy: String,
    /// For v2: the controllers to enable (what the root offers); for v1: what this mount
    /// carries for us.
    controllers: Controllers,
    /// Whether processes live in leafs (`init`, `exec-<n>`) here rather than in the sandbox
    /// directory itself.
    leafy: bool,
}

impl CgroupSupport {
    /// Detects the hierarchies from `/proc/self/mountinfo`, the v2 root's
    /// `cgroup.controllers`, the kernel version (for `cgroup.kill`) and `/proc/self/cgroup`.
    pub fn detect() -> Result<Self, CgroupError> {
        let mountinfo = read_host_file("/proc/self/mountinfo")?;
        let (unified, _) = parse_mountinfo(&mountinfo);
        let controllers = match &unified {
            Some(path) => {
                let file = path.join("cgroup.controllers");
                match std::fs::read_to_string(&file) {
                    Ok(text) => text,
                    Err(err) if err.kind() == io::ErrorKind::NotFound => String::new(),
                    Err(source) => {
                        return Err(CgroupError::Detect {
                            path: file.display().to_string(),
                            source,
                        })
                    }
                }
            }
            None => String::new(),
        };
        let mut support = Self::from_mountinfo(&mountinfo, &controllers);
        if let Some(unified) = &mut support.unified {
            let release = rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned();
            unified.cgroup_kill = kernel_has_cgroup_kill(&release);
        }
        // Only informational, and absent in some sandboxes: not worth failing detection.
        if let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") {
            support.own = parse_proc_cgroup(&text);
        }
        Ok(support)
    }

    /// Builds the description from mountinfo text and the v2 root's `cgroup.controllers`
    /// (empty when there is no v2 hierarchy or it offers no controllers). Assumes a kernel
    /// with `cgroup.kill`; [`CgroupSupport::detect`] checks the real one.
    pub fn from_mountinfo(mountinfo: &str, unified_controllers: &str) -> Self {
        let (unified, v1) = parse_mountinfo(mountinfo);
        Self {
            unified: unified.map(|path| Unified {
                path,
                controllers: unified_controllers
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect(),
                cgroup_kill: true,
            }),
            v1,
            own: Vec::new(),
        }
    }

    /// Mount point of the v2 hierarchy, if one is mounted.
    pub fn unified_mount(&self) -> Option<&Path> {
        self.unified.as_ref().map(|u| u.path.as_path())
    }

    /// Mount point of the v1 hierarchy carrying `controller` (e.g. `"memory"`), if mounted.
    pub fn v1_mount(&self, controller: &str) -> Option<&Path> {
        self.v1
            .iter()
            .find(|m| m.has(controller))
            .map(|m| m.path.as_path())
    }

    /// What this host can enforce.
    pub fn enforceable(&self) -> Enforceable {
        let available = |c| !matches!(self.backing(c), Backing::Missing);
        Enforceable {
            memory: available(Controller::Memory),
            pids: available(Controller::Pids),
            cpu: available(Controller::Cpu),
            tree_kill: !self.plans().is_empty(),
        }
    }

    /// Human-readable lines for `warren doctor`: hierarchies found, which limits are
    /// enforced by what, and how process trees are killed.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        match &self.unified {
            Some(u) if u.controllers.is_empty() => lines.push(format!(
                "cgroup v2 at {} (no controllers available)",
                u.path.display()
            )),
            Some(u) => lines.push(format!(
                "cgroup v2 at {} (controllers: {})",
                u.path.display(),
                u.controllers.join(" ")
            )),
            None => lines.push("cgroup v2: not mounted".to_owned()),
        }
        if self.v1.is_empty() {
            lines.push("cgroup v1: no controller hierarchies mounted".to_owned());
        } else {
            let mounts: Vec<String> = self
                .v1
                .iter()
                .map(|m| format!("{} at {}", m.label(), m.path.display()))
                .collect();
            lines.push(format!("cgroup v1: {}", mounts.join(", ")));
        }
        for controller in Controller::ALL {
            let how = match self.backing(controller) {
                Backing::Unified => "enforced with cgroup v2".to_owned(),
                Backing::V1(m) => format!("enforced with cgroup v1 {}", m.label()),
                Backing::Missing => "not enforceable (no controller)".to_owned(),
            };
            lines.push(format!("{} limit: {how}", controller.name()));
        }
        lines.push(format!("process tree kill: {}", self.kill_mechanism()));
        let own: Vec<String> = self
            .own
            .iter()
            .filter(|(hierarchy, _)| {
                hierarchy == "unified"
                    || hierarchy
                        .split(',')
                        .any(|c| ["memory", "pids", "cpu"].contains(&c))
            })
            .map(|(hierarchy, path)| format!("{hierarchy}:{path}"))
            .collect();
        if !own.is_empty() {
            lines.push(format!("this process's cgroups: {}", own.join(" ")));
        }
        lines
    }

    fn kill_mechanism(&self) -> &'static str {
        match &self.unified {
            Some(u) if u.cgroup_kill => "cgroup.kill (v2)",
            Some(_) => "v2 cgroup.procs listing",
            None if self.v1_mount("pids").is_some() => "v1 pids listing",
            None if !self.plans().is_empty() => "v1 cgroup.procs listing",
            None => "unavailable (no cgroup hierarchy)",
        }
    }

    fn cgroup_kill(&self) -> bool {
        self.unified.as_ref().is_some_and(|u| u.cgroup_kill)
    }

    fn backing(&self, controller: Controller) -> Backing<'_> {
        if let Some(u) = &self.unified {
            if u.controllers.iter().any(|c| c == controller.name()) {
                return Backing::Unified;
            }
        }
        match self.v1.iter().find(|m| m.has(controller.name())) {
            Some(mount) => Backing::V1(mount),
            None => Backing::Missing,
        }
    }

    /// The hierarchies a sandbox gets a directory in, v2 first.
    fn plans(&self) -> Vec<Plan<'_>> {
        let mut plans = Vec::new();
        if let Some(u) = &self.unified {
            let mut controllers = Controllers::default();
            for controller in Controller::ALL {
                if matches!(self.backing(controller), Backing::Unified) {
                    controllers.insert(controller);
                }
            }
            plans.push(Plan {
                unified: true,
                mount: &u.path,
                hierarchy: "unified".to_owned(),
                controllers,
                leafy: true,
            });
        }
        for mount in &self.v1 {
            let mut controllers = Controllers::default();
            for controller in Controller::ALL {
                if matches!(self.backing(controller), Backing::V1(m) if std::ptr::eq(m, mount)) {
                    controllers.insert(controller);
                }
            }
            // v2's cpu.stat already reports usage; only pure v1 hosts need cpuacct.
            controllers.cpuacct = self.unified.is_none() && mount.has("cpuacct");
            // Likewise v2's cgroup.freeze; only pure v1 hosts need the v1 freezer.
            controllers.freezer = self.unified.is_none() && mount.has("freezer");
            if controllers == Controllers::default() {
                continue;
            }
            plans.push(Plan {
                unified: false,
                mount: &mount.path,
                hierarchy: mount.label(),
                controllers,
                // With v2 present its leafs tell commands apart (and commands are spawned
                // straight into them, see `ExecCgroup::spawn_target`); v1 then only holds
                // the sandbox-wide limits, which commands inherit from init without the
                // costly migration a write to a v1 `cgroup.procs` takes.
                // The v1 freezer holds the commands in leafs too, so that one command's
                // tree can be frozen before it is killed (one more migration per command,
                // only on hosts without v2).
                leafy: (controllers.pids || controllers.freezer) && self.unified.is_none(),
            });
        }
        // Without v2 and v1 pids, some other v1 hierarchy has to carry the leafs, or a
        // single command's tree could not be told apart from the rest of the sandbox.
        if !plans.iter().any(|p| p.leafy) {
            if let Some(first) = plans.first_mut() {
                first.leafy = true;
            }
        }
        plans
    }
}

/// A sandbox's cgroups: `warren/<name>` in every hierarchy in use, held as open directories.
#[derive(Debug)]
pub struct SandboxCgroup {
    name: String,
    places: Vec<Place>,
    cgroup_kill: bool,
}

/// A sandbox's directory in one hierarchy.
#[derive(Debug)]
struct Place {
    unified: bool,
    hierarchy: String,
    /// Controllers whose interface files exist in `dir` (for v2: enabled by `warren/`).
    controllers: Controllers,
    leafy: bool,
    /// `warren/`, to remove `warren/<name>` from.
    parent: OwnedFd,
    /// `warren/<name>`.
    dir: OwnedFd,
    /// `warren/<name>/init`, in leafy hierarchies; `None` if it vanished before `open`.
    init: Option<OwnedFd>,
}

impl Place {
    /// `hierarchy:warren/<name>[/leaf]`, for messages.
    fn path(&self, name: &str, leaf: Option<&str>) -> String {
        match leaf {
            Some(leaf) => format!("{}:{ROOT_DIR}/{name}/{leaf}", self.hierarchy),
            None => format!("{}:{ROOT_DIR}/{name}", self.hierarchy),
        }
    }

    fn write_limit(
        &self,
        name: &str,
        controller: Controller,
        limits: &Limits,
    ) -> Result<(), CgroupError> {
        let set = |file: &'static str, value: &str| {
            write_file(self.dir.as_fd(), file, value.as_bytes()).map_err(|source| {
                CgroupError::SetLimit {
                    path: self.path(name, None),
                    file,
                    source,
                }
            })
        };
        // Limits that are not requested are reset to unlimited, so a cgroup reused after a
        // crash doesn't keep the previous run's values.
        match (controller, self.unified) {
            (Controller::Memory, true) => {
                set(
                    "memory.max",
                    &limits
                        .memory_bytes
                        .map_or("max".to_owned(), |b| b.to_string()),
                )?;
                if file_exists(self.dir.as_fd(), "memory.swap.max") {
                    set(
                        "memory.swap.max",
                        if limits.memory_bytes.is_some() {
                            "0"
                        } else {
                            "max"
                        },
                    )?;
                }
            }
            (Controller::Memory, false) => {
                let value = limits
                    .memory_bytes
                    .map_or("-1".to_owned(), |b| b.to_string());
                let memsw = "memory.memsw.limit_in_bytes";
                let has_memsw = file_exists(self.dir.as_fd(), memsw);
                // The kernel insists memory+swap >= memory at every moment; lifting it first
                // makes any new memory limit valid, and then it's lowered to match (so swap
                // can't be used to go past the limit).
                if has_memsw {
                    set(memsw, "-1")?;
                }
                set("memory.limit_in_bytes", &value)?;
                if has_memsw && limits.memory_bytes.is_some() {
                    set(memsw, &value)?;
                }
            }
            (Controller::Pids, _) => {
                set(
                    "pids.max",
                    &limits.pids_max.map_or("max".to_owned(), |n| n.to_string()),
                )?;
            }
            (Controller::Cpu, true) => {
                let quota = limits
                    .cpu_millis
                    .map_or("max".to_owned(), |m| cpu_quota_usec(m).to_string());
                set("cpu.max", &format!("{quota} {CPU_PERIOD_USEC}"))?;
            }
            (Controller::Cpu, false) => {
                set("cpu.cfs_period_us", &CPU_PERIOD_USEC.to_string())?;
                let quota = limits
                    .cpu_millis
                    .map_or("-1".to_owned(), |m| cpu_quota_usec(m).to_string());
                set("cpu.cfs_quota_us", &quota)?;
            }
        }
        Ok(())
    }

    fn target(&self, name: &str) -> Target<'_> {
        Target {
            dir: self.dir.as_fd(),
            unified: self.unified,
            freezer: self.controllers.freezer,
            path: self.path(name, None),
        }
    }
}

impl SandboxCgroup {
    /// Creates (or reuses after a crash: existing directories are fine) `warren/<name>` and
    /// its `init` leaf in every hierarchy in use, and writes `limits` (unset ones reset to
    /// unlimited). Returns the names of the requested limits that no controller can enforce
    /// (`"memory"`, `"pids"`, `"cpu"`), so the caller can warn once.
    ///
    /// Must be called while the cgroup mounts are still visible, i.e. before `pivot_root`;
    /// everything afterwards goes through the directories opened here.
    pub fn create(
        support: &CgroupSupport,
        name: &str,
        limits: &Limits,
    ) -> Result<(Self, Vec<&'static str>), CgroupError> {
        validate_name(name)?;
        let mut cgroup = Self {
            name: name.to_owned(),
            places: Vec::new(),
            cgroup_kill: support.cgroup_kill(),
        };
        match cgroup.populate(support, limits) {
            Ok(unenforced) => Ok((cgroup, unenforced)),
            Err(err) => {
                // Don't leave half a sandbox behind; whatever resists is swept later by
                // `remove_stale`.
                if let Err(cleanup) = cgroup.remove_dirs() {
                    tracing::debug!(
                        error = %cleanup,
                        "cannot clean up a partly created sandbox cgroup"
                    );
                }
                Err(err)
            }
        }
    }

    fn populate(
        &mut self,
        support: &CgroupSupport,
        limits: &Limits,
    ) -> Result<Vec<&'static str>, CgroupError> {
        for plan in support.plans() {
            let at = |rel: &str| format!("{}:{rel}", plan.hierarchy);
            let root = open_dir(CWD, plan.mount).map_err(|source| CgroupError::Open {
                path: at("/"),
                source,
            })?;
            let parent =
                make_dir(root.as_fd(), ROOT_DIR).map_err(|source| CgroupError::Create {
                    path: at(ROOT_DIR),
                    source,
                })?;
            let rel = format!("{ROOT_DIR}/{}", self.name);
            let mut controllers = plan.controllers;
            if plan.unified && controllers != Controllers::default() {
                // v2 hands a controller to a cgroup only when every ancestor enabled it for
                // its children, so enable it from the root down to `warren/`.
                enable_controllers(root.as_fd(), &at("/"), controllers);
                enable_controllers(parent.as_fd(), &at(ROOT_DIR), controllers);
            }
            let dir =
                make_dir(parent.as_fd(), &self.name).map_err(|source| CgroupError::Create {
                    path: at(&rel),
                    source,
                })?;
            if plan.unified {
                // What actually got through: an ancestor may have refused (e.g. a
                // non-root cgroup namespace root that holds processes).
                controllers = match read_file(dir.as_fd(), "cgroup.controllers") {
                    Ok(listed) => controllers.intersect_listed(&listed),
                    Err(err) => {
                        tracing::debug!(
                            cgroup = %at(&rel),
                            error = %err,
                            "cannot read cgroup.controllers"
                        );
                        Controllers::default()
                    }
                };
                // Lets the leafs report their own memory and pids usage.
                enable_controllers(dir.as_fd(), &at(&rel), controllers);
            }
            let init = if plan.leafy {
                Some(
                    make_dir(dir.as_fd(), INIT_LEAF).map_err(|source| CgroupError::Create {
                        path: at(&format!("{rel}/{INIT_LEAF}")),
                        source,
                    })?,
                )
            } else {
                None
            };
            self.places.push(Place {
                unified: plan.unified,
                hierarchy: plan.hierarchy,
                controllers,
                leafy: plan.leafy,
                parent,
                dir,
                init,
            });
        }

        let mut unenforced = Vec::new();
        for controller in Controller::ALL {
            match self.places.iter().find(|p| p.controllers.has(controller)) {
                Some(place) => place.write_limit(&self.name, controller, limits)?,
                None if controller.requested(limits) => unenforced.push(controller.name()),
                None => {}
            }
        }
        Ok(unenforced)
    }

    /// Opens the cgroups of an existing sandbox (after a provisioner restart); `None` if it
    /// exists in no hierarchy.
    pub fn open(support: &CgroupSupport, name: &str) -> Result<Option<Self>, CgroupError> {
        validate_name(name)?;
        let mut places = Vec::new();
        for plan in support.plans() {
            let at = |rel: &str| format!("{}:{rel}", plan.hierarchy);
            let rel = format!("{ROOT_DIR}/{name}");
            let open_err = |path: String| move |source| CgroupError::Open { path, source };
            let Some(root) = open_dir_optional(CWD, plan.mount).map_err(open_err(at("/")))? else {
                continue;
            };
            let Some(parent) =
                open_dir_optional(root.as_fd(), ROOT_DIR).map_err(open_err(at(ROOT_DIR)))?
            else {
                continue;
            };
            let Some(dir) = open_dir_optional(parent.as_fd(), name).map_err(open_err(at(&rel)))?
            else {
                continue;
            };
            let init = if plan.leafy {
                open_dir_optional(dir.as_fd(), INIT_LEAF)
                    .map_err(open_err(at(&format!("{rel}/{INIT_LEAF}"))))?
            } else {
                None
            };
            let controllers = if plan.unified {
                read_file(dir.as_fd(), "cgroup.controllers")
                    .map(|listed| plan.controllers.intersect_listed(&listed))
                    .unwrap_or_default()
            } else {
                plan.controllers
            };
            places.push(Place {
                unified: plan.unified,
                hierarchy: plan.hierarchy,
                controllers,
                leafy: plan.leafy,
                parent,
                dir,
                init,
            });
        }
        Ok((!places.is_empty()).then(|| Self {
            name: name.to_owned(),
            places,
            cgroup_kill: support.cgroup_kill(),
        }))
    }

    /// The sandbox name this cgroup was created or opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves `pid` (in the caller's pid namespace) into the `init` leafs and the sandbox
    /// cgroups of the other hierarchies. Children it forked before the move stay behind, so
    /// move the init before it starts anything.
    pub fn add_init(&self, pid: i32) -> Result<(), CgroupError> {
        let value = pid.to_string();
        for place in &self.places {
            let (dir, path) = if place.leafy {
                let path = place.path(&self.name, Some(INIT_LEAF));
                match &place.init {
                    Some(init) => (init.as_fd(), path),
                    None => {
                        return Err(CgroupError::AddProcess {
                            path,
                            pid,
                            source: io::Error::from(io::ErrorKind::NotFound),
                        })
                    }
                }
            } else {
                (place.dir.as_fd(), place.path(&self.name, None))
            };
            write_file(dir, "cgroup.procs", value.as_bytes())
                .map_err(|source| CgroupError::AddProcess { path, pid, source })?;
        }
        Ok(())
    }

    /// Creates (or reuses) the leaf `exec-<n>` for one command and returns a handle with
    /// everything [`ExecCgroup::add_self`] needs already opened.
    pub fn exec_leaf(&self, n: u64) -> Result<ExecCgroup, CgroupError> {
        let leaf = format!("exec-{n}");
        let mut leaves = Vec::new();
        let mut procs = Vec::new();
        for place in &self.places {
            if place.leafy {
                let path = place.path(&self.name, Some(&leaf));
                let dir =
                    make_dir(place.dir.as_fd(), &leaf).map_err(|source| CgroupError::Create {
                        path: path.clone(),
                        source,
                    })?;
                let parent = place.dir.try_clone().map_err(|source| CgroupError::Open {
                    path: place.path(&self.name, None),
                    source,
                })?;
                procs.push(ProcsFile {
                    fd: open_procs(dir.as_fd()).map_err(|source| CgroupError::Open {
                        path: path.clone(),
                        source,
                    })?,
                    path: path.clone(),
                });
                leaves.push(Leaf {
                    unified: place.unified,
                    controllers: place.controllers,
                    path,
                    parent,
                    dir,
                });
            }
            // Non-leafy hierarchies need nothing: a command is init's child and inherits
            // init's place there.
        }
        Ok(ExecCgroup {
            leaf,
            leaves,
            procs,
            cgroup_kill: self.cgroup_kill,
        })
    }

    /// Kills every process of the sandbox, waits until none is left, and returns how many
    /// were killed.
    ///
    /// Where a v2 hierarchy is mounted its cgroups are frozen first, so nothing forks while
    /// the kill runs; then `cgroup.kill` (v2) has the kernel kill the whole subtree
    /// atomically. Otherwise every listed pid gets SIGKILL, repeatedly, until the cgroups
    /// are empty; unfrozen (pure v1), a pid may be reused by an unrelated process between
    /// listing and signalling, a race only freezing or `cgroup.kill` avoids. Fails with
    /// `TimedOut` after 10 s. The calling process must not be inside the sandbox.
    pub fn kill_all(&self) -> Result<u64, CgroupError> {
        kill_tree(&self.targets(), self.cgroup_kill)
    }

    fn targets(&self) -> Vec<Target<'_>> {
        self.places.iter().map(|p| p.target(&self.name)).collect()
    }

    /// Removes the leafs and `warren/<name>` in every hierarchy (call after
    /// [`SandboxCgroup::kill_all`]); directories already gone are fine. Every hierarchy is
    /// attempted; the first failure is returned.
    pub fn remove(self) -> Result<(), CgroupError> {
        self.remove_dirs()
    }

    fn remove_dirs(&self) -> Result<(), CgroupError> {
        let mut first_err = None;
        for place in &self.places {
            let path = place.path(&self.name, None);
            let result = remove_children(place.dir.as_fd(), &path, 0)
                .and_then(|()| remove_dir(place.parent.as_fd(), &self.name, &path));
            if let Err(err) = result {
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Current resource usage.
    pub fn stats(&self) -> CgroupStats {
        let mut stats = CgroupStats::default();
        for place in &self.places {
            read_stats(
                place.dir.as_fd(),
                place.unified,
                place.controllers,
                &mut stats,
            );
        }
        stats
    }

    /// The sandbox's directory in every hierarchy in use, for rules that must name them
    /// (init confines itself with Landlock but still manages its command cgroups here).
    pub fn directories(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.places.iter().map(|place| place.dir.as_fd())
    }

    /// Whether no process is left in the sandbox (in any hierarchy, any leaf). A cgroup that
    /// cannot be read counts as not empty.
    pub fn is_empty(&self) -> bool {
        list_pids(&self.targets()).is_ok_and(|pids| pids.is_empty())
    }
}

/// One command's leaf `exec-<n>`, prepared so a freshly forked child can join it.
#[derive(Debug)]
pub struct ExecCgroup {
    leaf: String,
    leaves: Vec<Leaf>,
    /// `cgroup.procs` of every cgroup a command joins, opened for writing in advance: the
    /// child calling [`ExecCgroup::add_self`] must neither allocate nor resolve paths. The
    /// kernel (5.16+) checks a write against the opener's credentials and cgroup
    /// namespace, so the child may already have dropped privileges or entered the sandbox's
    /// cgroup namespace, as long as this handle was made before that.
    procs: Vec<ProcsFile>,
    cgroup_kill: bool,
}

#[derive(Debug)]
struct Leaf {
    unified: bool,
    controllers: Controllers,
    path: String,
    /// `warren/<name>`, to remove the leaf from.
    parent: OwnedFd,
    dir: OwnedFd,
}

#[derive(Debug)]
struct ProcsFile {
    fd: OwnedFd,
    path: String,
}

/// The agent's server puts each command in a leaf of the sandbox's cgroups.
impl warren_agent::server::CommandGroups for SandboxCgroup {
    fn group(&self, n: u64) -> io::Result<Box<dyn warren_agent::server::CommandGroup>> {
        self.exec_leaf(n)
            .map(|leaf| Box::new(leaf) as Box<dyn warren_agent::server::CommandGroup>)
            .map_err(io::Error::other)
    }
}

impl warren_agent::server::CommandGroup for ExecCgroup {
    fn name(&self) -> &str {
        ExecCgroup::name(self)
    }

    fn spawn_target(&self) -> Option<BorrowedFd<'_>> {
        ExecCgroup::spawn_target(self)
    }

    fn add_self(&self) -> Result<(), Errno> {
        ExecCgroup::add_self(self)
    }

    fn kill(&self) -> io::Result<u64> {
        ExecCgroup::kill(self).map_err(io::Error::other)
    }

    fn is_empty(&self) -> bool {
        ExecCgroup::is_empty(self)
    }

    fn remove(self: Box<Self>) -> io::Result<()> {
        ExecCgroup::remove(*self).map_err(io::Error::other)
    }
}

impl ExecCgroup {
    /// Moves the calling process into the leaf (and, on v1, into the sandbox's other
    /// cgroups) by writing `0` to the pre-opened `cgroup.procs` files. Async-signal-safe:
    /// meant for a forked child before `exec`.
    pub fn add_self(&self) -> Result<(), Errno> {
        for procs in &self.procs {
            write_fd(procs.fd.as_fd(), b"0")?;
        }
        Ok(())
    }

    /// Moves `pid` (in the caller's pid namespace) into the leaf, like
    /// [`ExecCgroup::add_self`] does for the caller. Children it forked before stay behind.
    pub fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        let value = pid.to_string();
        for procs in &self.procs {
            write_fd(procs.fd.as_fd(), value.as_bytes()).map_err(|errno| {
                CgroupError::AddProcess {
                    path: procs.path.clone(),
                    pid,
                    source: errno.into(),
                }
            })?;
        }
        Ok(())
    }

    /// The v2 leaf to spawn the command straight into (`clone3(CLONE_INTO_CGROUP)`), when
    /// it is the command's only placement; then no `add_self` migration is needed.
    pub fn spawn_target(&self) -> Option<BorrowedFd<'_>> {
        match self.leaves.as_slice() {
            [leaf] if leaf.unified => Some(leaf.dir.as_fd()),
            _ => None,
        }
    }

    /// The leaf's name, `exec-<n>`.
    pub fn name(&self) -> &str {
        &self.leaf
    }

    /// Kills the command's whole process tree (setsid'd and reparented descendants
    /// included) and waits until the leaf is empty; see [`SandboxCgroup::kill_all`] for the
    /// mechanism. Does nothing on hosts without any usable hierarchy.
    pub fn kill(&self) -> Result<u64, CgroupError> {
        kill_tree(&self.targets(), self.cgroup_kill)
    }

    fn targets(&self) -> Vec<Target<'_>> {
        self.leaves.iter().map(Leaf::target).collect()
    }

    /// Whether no process is left in the leaf. A leaf that cannot be read counts as not empty.
    pub fn is_empty(&self) -> bool {
        list_pids(&self.targets()).is_ok_and(|pids| pids.is_empty())
    }

    /// Removes the leaf directories; ones already gone are fine. `EBUSY` (processes remain)
    /// is reported as [`CgroupError::Remove`]; the leaf then goes with the sandbox.
    pub fn remove(self) -> Result<(), CgroupError> {
        let mut first_err = None;
        for leaf in &self.leaves {
            let result = remove_children(leaf.dir.as_fd(), &leaf.path, 0)
                .and_then(|()| remove_dir(leaf.parent.as_fd(), &self.leaf, &leaf.path));
            if let Err(err) = result {
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// CPU time consumed by the command's processes, where a hierarchy reports it per leaf
    /// (v2 `cpu.stat`, or v1 `cpuacct` if it carries the leafs).
    pub fn cpu_usage_usec(&self) -> Option<u64> {
        let mut stats = CgroupStats::default();
        for leaf in &self.leaves {
            let controllers = Controllers {
                cpuacct: leaf.controllers.cpuacct,
                ..Controllers::default()
            };
            read_stats(leaf.dir.as_fd(), leaf.unified, controllers, &mut stats);
        }
        stats.cpu_usage_usec
    }
}

impl Leaf {
    fn target(&self) -> Target<'_> {
        Target {
            dir: self.dir.as_fd(),
            unified: self.unified,
            freezer: self.controllers.freezer,
            path: self.path.clone(),
        }
    }
}

/// Finds the sandboxes under `warren/` in every hierarchy and kills and removes each one
/// `keep` rejects: recovery after a provisioner restart. Returns the removed names, sorted. A
/// sandbox that cannot be removed is logged and left for the next sweep rather than stopping
/// the others; only failing to list is an error.
pub fn remove_stale(
    support: &CgroupSupport,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, CgroupError> {
    let mut names = BTreeSet::new();
    for plan in support.plans() {
        let list_err = |source| CgroupError::ListSandboxes {
            path: format!("{}:{ROOT_DIR}", plan.hierarchy),
            source,
        };
        let Some(root) = open_dir_optional(CWD, plan.mount).map_err(list_err)? else {
            continue;
        };
        let Some(parent) = open_dir_optional(root.as_fd(), ROOT_DIR).map_err(list_err)? else {
            continue;
        };
        names.extend(child_dirs(parent.as_fd()).map_err(list_err)?);
    }
    let mut removed = Vec::new();
    for name in names {
        // Names warren could not have created are somebody else's business.
        if keep(&name) || validate_name(&name).is_err() {
            continue;
        }
        let result = SandboxCgroup::open(support, &name).and_then(|cgroup| match cgroup {
            Some(cgroup) => {
                cgroup.kill_all()?;
                cgroup.remove()?;
                Ok(true)
            }
            None => Ok(false),
        });
        match result {
            Ok(true) => removed.push(name),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(
                    sandbox = %name,
                    error = %err,
                    "cannot remove stale sandbox cgroup; leaving it for the next sweep"
                );
            }
        }
    }
    Ok(removed)
}

/// A cgroup directory whose processes (and those of its descendants) are to be killed.
struct Target<'a> {
    dir: BorrowedFd<'a>,
    unified: bool,
    /// A v1 freezer hierarchy (`freezer.state`).
    freezer: bool,
    /// `hierarchy:warren/...`, for messages.
    path: String,
}

/// Kills everything in `targets` and waits until they are empty; returns how many
/// processes were killed (each counted once, however many rounds it took).
///
/// The targets are frozen first (v2 `cgroup.freeze`, Linux 5.2+; on hosts without v2, the
/// v1 freezer): a frozen process cannot fork, so a fork bomb cannot refill what is being
/// killed and a listed pid cannot exit and be reused by an unrelated process before its
/// signal arrives (I24). Frozen v2 processes still die of SIGKILL, from `cgroup.kill` or one
/// by one; frozen v1 processes die only once thawed, so v1 targets are thawed right after
/// the first round of signals (with SIGKILL pending, a thawed process dies before it runs
/// again). Every target is thawed in the end, so a failed kill never leaves processes
/// frozen forever.
fn kill_tree(targets: &[Target<'_>], use_cgroup_kill: bool) -> Result<u64, CgroupError> {
    let frozen = freeze(targets);
    let result = kill_frozen(targets, use_cgroup_kill, &frozen);
    thaw(&frozen);
    result
}

/// Thaws what [`freeze`] froze. Best effort: a target removed meanwhile has nothing left to
/// thaw.
fn thaw(frozen: &[&Target<'_>]) {
    for target in frozen {
        let _ = if target.unified {
            write_file(target.dir, "cgroup.freeze", b"0")
        } else {
            write_file(target.dir, "freezer.state", b"THAWED")
        };
    }
}

/// Freezes every v2 target that offers `cgroup.freeze` and waits (bounded) until the
/// kernel reports it frozen; returns the targets it froze, to thaw.
fn freeze<'t, 'a>(targets: &'t [Target<'a>]) -> Vec<&'t Target<'a>> {
    let frozen: Vec<&Target<'_>> = targets
        .iter()
        .filter(|t| {
            if t.unified {
                write_file(t.dir, "cgroup.freeze", b"1").is_ok()
            } else {
                t.freezer && write_file(t.dir, "freezer.state", b"FROZEN").is_ok()
            }
        })
        .collect();
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    while Instant::now() < deadline {
        let settled = frozen.iter().all(|t| {
            if !t.unified {
                return read_file(t.dir, "freezer.state").map_or(true, |s| s.trim() == "FROZEN");
            }
            read_file(t.dir, "cgroup.events").map_or(true, |events| {
                stat_field(&events, "frozen") == Some(1)
                    || stat_field(&events, "populated") == Some(0)
            })
        });
        if settled {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    frozen
}

fn kill_frozen(
    targets: &[Target<'_>],
    use_cgroup_kill: bool,
    frozen: &[&Target<'_>],
) -> Result<u64, CgroupError> {
    let frozen_v1: Vec<&Target<'_>> = frozen.iter().copied().filter(|t| !t.unified).collect();
    let mut thawed_v1 = frozen_v1.is_empty();
    let mut seen = BTreeSet::new();
    seen.extend(list_pids(targets)?);
    let mut killed_by_kernel = false;
    if use_cgroup_kill {
        for target in targets.iter().filter(|t| t.unified) {
            match write_file(target.dir, "cgroup.kill", b"1") {
                Ok(()) => killed_by_kernel = true,
                // Before Linux 5.14: fall back to signalling pid by pid.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CgroupError::Kill {
                        path: target.path.clone(),
                        source,
                    })
                }
            }
        }
    }
    let start = Instant::now();
    loop {
        let pids = list_pids(targets)?;
        seen.extend(pids.iter().copied());
        if pids.is_empty() {
            return Ok(seen.len() as u64);
        }
        let elapsed = start.elapsed();
        if elapsed >= KILL_TIMEOUT {
            return Err(CgroupError::Kill {
                path: targets.first().map(|t| t.path.clone()).unwrap_or_default(),
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} processes still present after {} s",
                        pids.len(),
                        KILL_TIMEOUT.as_secs()
                    ),
                ),
            });
        }
        if !killed_by_kernel || elapsed >= CGROUP_KILL_GRACE {
            // 0 stands for a process outside the caller's pid namespace: it can't be
            // signalled from here, but it keeps the cgroup non-empty.
            for pid in pids
                .into_iter()
                .filter(|&p| p > 0)
                .filter_map(Pid::from_raw)
            {
                // ESRCH just means it exited meanwhile; anything else shows up as a
                // process that stays, which the timeout reports.
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            if !thawed_v1 {
                // Every listed process has SIGKILL pending: thawed, it dies at once.
                thaw(&frozen_v1);
                thawed_v1 = true;
            }
        }
        std::thread::sleep(KILL_POLL);
    }
}

/// The pids in `targets` and their descendant cgroups, sorted and deduplicated (a process is
/// listed once per hierarchy). Zombies are not listed: the kernel unlinks a task from its
/// cgroup when it exits, not when it is reaped.
fn list_pids(targets: &[Target<'_>]) -> Result<Vec<i32>, CgroupError> {
    let mut pids = Vec::new();
    for target in targets {
        collect_pids(target.dir, &target.path, 0, &mut pids)?;
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

fn collect_pids(
    dir: BorrowedFd<'_>,
    path: &str,
    depth: usize,
    pids: &mut Vec<i32>,
) -> Result<(), CgroupError> {
    let list_err = |source| CgroupError::ListProcesses {
        path: path.to_owned(),
        source,
    };
    let text = match read_file(dir, "cgroup.procs") {
        Ok(text) => text,
        // Removed meanwhile (ENODEV once a held directory is gone): nothing in it.
        Err(err) if is_gone(&err) => return Ok(()),
        Err(source) => return Err(list_err(source)),
    };
    pids.extend(
        text.lines()
            .filter_map(|line| line.trim().parse::<i32>().ok()),
    );
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    let children = match child_dirs(dir) {
        Ok(children) => children,
        Err(err) if is_gone(&err) => return Ok(()),
        Err(source) => return Err(list_err(source)),
    };
    for child in children {
        let child_path = format!("{path}/{child}");
        match open_dir_optional(dir, child.as_str()) {
            Ok(Some(fd)) => collect_pids(fd.as_fd(), &child_path, depth + 1, pids)?,
            Ok(None) => {}
            Err(source) => {
                return Err(CgroupError::ListProcesses {
                    path: child_path,
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Removes every cgroup below `dir`, deepest first.
fn remove_children(dir: BorrowedFd<'_>, path: &str, depth: usize) -> Result<(), CgroupError> {
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    let children = match child_dirs(dir) {
        Ok(children) => children,
        Err(err) if is_gone(&err) => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Remove {
                path: path.to_owned(),
                source,
            })
        }
    };
    for child in children {
        let child_path = format!("{path}/{child}");
        match open_dir_optional(dir, child.as_str()) {
            Ok(Some(fd)) => remove_children(fd.as_fd(), &child_path, depth + 1)?,
            Ok(None) => continue,
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: child_path,
                    source,
                })
            }
        }
        remove_dir(dir, &child, &child_path)?;
    }
    Ok(())
}

/// `rmdir` relative to `parent`; already gone is fine. `EBUSY` is retried briefly because
/// tasks killed a moment ago may still be on their way out.
fn remove_dir(parent: BorrowedFd<'_>, name: &str, path: &str) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::BUSY) if start.elapsed() < REMOVE_TIMEOUT => {
                std::thread::sleep(KILL_POLL);
            }
            Err(errno) => {
                return Err(CgroupError::Remove {
                    path: path.to_owned(),
                    source: errno.into(),
                })
            }
        }
    }
}

/// Adds the stats `dir` reports to `stats`, keeping values already found (v2 comes first).
fn read_stats(
    dir: BorrowedFd<'_>,
    unified: bool,
    controllers: Controllers,
    stats: &mut CgroupStats,
) {
    fn fill(slot: &mut Option<u64>, value: impl FnOnce() -> Option<u64>) {
        if slot.is_none() {
            *slot = value();
        }
    }
    if unified {
        // cpu.stat's usage_usec exists in every non-root v2 cgroup, controller or not.
        fill(&mut stats.cpu_usage_usec, || {
            let text = read_file(dir, "cpu.stat").ok()?;
            stat_field(&text, "usage_usec")
        });
        if controllers.memory {
            fill(&mut stats.memory_current_bytes, || {
                read_u64(dir, "memory.current")
            });
            fill(&mut stats.memory_peak_bytes, || {
                read_u64(dir, "memory.peak")
            });
            // "max" (unlimited) does not parse, and stays `None`.
            fill(&mut stats.memory_max_bytes, || read_u64(dir, "memory.max"));
            fill(&mut stats.memory_file_bytes, || {
                stat_field(&read_file(dir, "memory.stat").ok()?, "file")
            });
        }
        if controllers.cpu {
            fill(&mut stats.cpu_max_millis, || {
                cpu_max_millis(&read_file(dir, "cpu.max").ok()?)
            });
        }
    } else {
        if controllers.memory {
            fill(&mut stats.memory_current_bytes, || {
                read_u64(dir, "memory.usage_in_bytes")
            });
            fill(&mut stats.memory_peak_bytes, || {
                read_u64(dir, "memory.max_usage_in_bytes")
            });
            fill(&mut stats.memory_max_bytes, || {
                read_u64(dir, "memory.limit_in_bytes").and_then(v1_memory_limit)
            });
            // `total_cache` counts the whole subtree (commands in leafs included), `cache`
            // only the directory itself; old kernels without hierarchy have only `cache`.
            fill(&mut stats.memory_file_bytes, || {
                let text = read_file(dir, "memory.stat").ok()?;
                stat_field(&text, "total_cache").or_else(|| stat_field(&text, "cache"))
            });
        }
        if controllers.cpu {
            fill(&mut stats.cpu_max_millis, || {
                let quota = read_file(dir, "cpu.cfs_quota_us").ok()?;
                let period = read_u64(dir, "cpu.cfs_period_us")?;
                cpu_millis(quota.trim().parse().ok()?, period)
            });
        }
        if controllers.cpuacct {
            fill(&mut stats.cpu_usage_usec, || {
                read_u64(dir, "cpuacct.usage").map(|ns| ns / 1000)
            });
        }
    }
    if controllers.pids {
        fill(&mut stats.pids_current, || read_u64(dir, "pids.current"));
        // "max" (unlimited) does not parse, and stays `None`.
        fill(&mut stats.pids_max, || read_u64(dir, "pids.max"));
        fill(&mut stats.pids_refused, || pids_refused(dir, 0));
    }
}

/// The `max` count of `pids.events` in `dir` and every cgroup below it; `None` when `dir`
/// itself has none (a kernel without the file).
fn pids_refused(dir: BorrowedFd<'_>, depth: usize) -> Option<u64> {
    let own = stat_field(&read_file(dir, "pids.events").ok()?, "max")?;
    let below = if depth >= MAX_DEPTH {
        0
    } else {
        child_dirs(dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|child| open_dir_optional(dir, child.as_str()).ok().flatten())
            .filter_map(|child| pids_refused(child.as_fd(), depth + 1))
            .sum()
    };
    Some(own + below)
}

/// The CPU limit a v2 `cpu.max` (`<quota> <period>`, quota `max` for none) sets, in
/// thousandths of a CPU.
fn cpu_max_millis(text: &str) -> Option<u64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse().ok()?;
    let period = fields.next()?.parse().ok()?;
    cpu_millis(quota, period)
}

/// `quota` microseconds of CPU per `period` as thousandths of a CPU; a negative quota (v1's
/// `-1`) or a zero period is no limit.
fn cpu_millis(quota: i64, period: u64) -> Option<u64> {
    let quota = u64::try_from(quota).ok()?;
    (period > 0).then(|| quota.saturating_mul(1000) / period)
}

/// A v1 `memory.limit_in_bytes`, or `None` for the kernel's "unlimited": the largest page
/// counter in bytes (`LONG_MAX` rounded down to a page), far beyond any machine's memory.
fn v1_memory_limit(bytes: u64) -> Option<u64> {
    const UNLIMITED_FROM: u64 = 1 << 62;
    (bytes < UNLIMITED_FROM).then_some(bytes)
}

/// Value of `key` in a flat-keyed file such as `cpu.stat` (`key value` per line).
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Enables each of `controllers` in `dir`'s `cgroup.subtree_control`, one at a time so one
/// refusal doesn't block the others. Failures only mean a limit can't be enforced, which the
/// caller learns from `cgroup.controllers` below, so they are logged, not returned.
fn enable_controllers(dir: BorrowedFd<'_>, path: &str, controllers: Controllers) {
    for controller in controllers.limit_controllers() {
        let request = format!("+{}", controller.name());
        if let Err(err) = write_file(dir, "cgroup.subtree_control", request.as_bytes()) {
            tracing::debug!(
                cgroup = %path,
                controller = controller.name(),
                error = %err,
                "cannot enable cgroup controller"
            );
        }
    }
}

fn cpu_quota_usec(cpu_millis: u64) -> u64 {
    cpu_millis
        .saturating_mul(CPU_PERIOD_USEC / 1000)
        .max(MIN_CPU_QUOTA_USEC)
}

/// Sandbox names become directory names next to each other under `warren/`. Dots are refused
/// because every cgroup interface file has one, so a name could never collide with them.
fn validate_name(name: &str) -> Result<(), CgroupError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(CgroupError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// `cgroup.kill` appeared in Linux 5.14.
fn kernel_has_cgroup_kill(release: &str) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (5, 14),
        _ => false,
    }
}

/// Splits mountinfo into the first cgroup2 mount point and the v1 hierarchies (one entry per
/// distinct controller set: later bind mounts of the same hierarchy are ignored).
fn parse_mountinfo(text: &str) -> (Option<PathBuf>, Vec<V1Mount>) {
    let mut unified = None;
    let mut v1: Vec<V1Mount> = Vec::new();
    for line in text.lines() {
        // `id parent dev root mountpoint options [optional...] - fstype source superoptions`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut right = right.split(' ');
        let (Some(fstype), Some(_source), Some(super_options)) =
            (right.next(), right.next(), right.next())
        else {
            continue;
        };
        match fstype {
            "cgroup2" if unified.is_none() => unified = Some(unescape_mount_path(mount_point)),
            "cgroup" => {
                let controllers: Vec<String> = super_options
                    .split(',')
                    .filter(|option| V1_CONTROLLERS.contains(option))
                    .map(str::to_owned)
                    .collect();
                // Named hierarchies without controllers (name=systemd) limit nothing.
                if controllers.is_empty() || v1.iter().any(|m| m.controllers == controllers) {
                    continue;
                }
                v1.push(V1Mount {
                    path: unescape_mount_path(mount_point),
                    controllers,
                });
            }
            _ => {}
        }
    }
    (unified, v1)
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mount_path(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match escape {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                // Three octal digits can exceed a byte (\777); keep such text verbatim.
                match u8::try_from(value) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 4;
                    }
                    Err(_) => {
                        out.push(bytes[i]);
                        i += 1;
                    }
                }
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// `/proc/self/cgroup` lines `id:controllers:path` as `(hierarchy, path)`, with the v2 entry
/// (empty controller list) named `unified`.
fn parse_proc_cgroup(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let _id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            let hierarchy = if controllers.is_empty() {
                "unified"
            } else {
                controllers
            };
            Some((hierarchy.to_owned(), path.to_owned()))
        })
        .collect()
}

fn read_host_file(path: &str) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Detect {
        path: path.to_owned(),
        source,
    })
}

fn is_gone(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(code) if code == Errno::NOENT.raw_os_error() || code == Errno::NODEV.raw_os_error()
    )
}

fn open_dir<P: rustix::path::Arg>(parent: impl AsFd, path: P) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn open_dir_optional<P: rustix::path::Arg>(
    parent: impl AsFd,
    path: P,
) -> io::Result<Option<OwnedFd>> {
    match open_dir(parent, path) {
        Ok(fd) => Ok(Some(fd)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// `mkdir` (existing is fine: reuse after a crash) and open.
fn make_dir(parent: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    let mode = Mode::RWXU | Mode::RGRP | Mode::XGRP | Mode::ROTH | Mode::XOTH;
    match rustix::fs::mkdirat(parent, name, mode) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(errno) => return Err(errno.into()),
    }
    open_dir(parent, name)
}

fn open_procs(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        "cgroup.procs",
        OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// One `write` of the whole value: cgroup files take each write as one command.
fn write_fd(fd: BorrowedFd<'_>, data: &[u8]) -> Result<(), Errno> {
    loop {
        match rustix::io::write(fd, data) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(errno),
        }
    }
}

fn write_file(dir: BorrowedFd<'_>, file: &str, data: &[u8]) -> io::Result<()> {
    let fd = rustix::fs::openat(dir, file, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(write_fd(fd.as_fd(), data)?)
}

fn read_file(dir: BorrowedFd<'_>, file: &str) -> io::Result<String> {
    let fd = rustix::fs::openat(dir, file, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match rustix::io::read(&fd, &mut buf[..]) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(Errno::INTR) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
    String::from_utf8(out).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
}

fn read_u64(dir: BorrowedFd<'_>, file: &str) -> Option<u64> {
    read_file(dir, file).ok()?.trim().parse().ok()
}

fn file_exists(dir: BorrowedFd<'_>, file: &str) -> bool {
    rustix::fs::accessat(dir, file, Access::EXISTS, AtFlags::empty()).is_ok()
}

/// Names of the subdirectories (child cgroups) of `dir`.
fn child_dirs(dir: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy();
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            // Some filesystems leave d_type out; cgroupfs fills it, but be safe.
            FileType::Unknown => {
                rustix::fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            }
            _ => false,
        };
        if is_dir {
            names.push(name.into_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine: v1 controllers mounted one per hierarchy, a named systemd hierarchy,
    /// and a controller-less cgroup2 at `unified`.
    const MIXED: &str = "\
22 1 0:20 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd host booted into the unified hierarchy.
    const PURE_V2: &str = "\
24 1 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 24 0:29 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// An older systemd hybrid: cpu and cpuacct co-mounted, optional fields present.
    const COMOUNTED: &str = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
";

    const NO_CGROUPS: &str = "\
21 1 0:19 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
22 1 0:20 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
";

    fn plan_summary(support: &CgroupSupport) -> Vec<(String, Controllers, bool)> {
        support
            .plans()
            .into_iter()
            .map(|p| (p.hierarchy, p.controllers, p.leafy))
            .collect()
    }

    #[test]
    fn mixed_layout_takes_limits_from_v1_and_tracking_from_the_controllerless_v2() {
        let support = CgroupSupport::from_mountinfo(MIXED, "hugetlb\n");
        assert_eq!(
            support.unified_mount(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            support.v1_mount("memory"),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            support.v1_mount("cpuacct"),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        assert_eq!(
            support.v1_mount("freezer"),
            Some(Path::new("/sys/fs/cgroup/freezer"))
        );
        assert_eq!(support.v1_mount("name=systemd"), None);
        assert_eq!(
            support.enforceable(),
            Enforceable {
                memory: true,
                pids: true,
                cpu: true,
                tree_kill: true
            }
        );
        let memory = Controllers {
            memory: true,
            ..Controllers::default()
        };
        let pids = Controllers {
            pids: true,
            ..Controllers::default()
        };
        let cpu = Controllers {
            cpu: true,
            ..Controllers::default()
        };
        // cpuacct is left out: the v2 hierarchy's cpu.stat reports usage already; v1 pids
        // holds only the sandbox-wide limit, commands are told apart by the v2 leafs.
        assert_eq!(
            plan_summary(&support),
            vec![
                ("unified".to_owned(), Controllers::default(), true),
                ("cpu".to_owned(), cpu, false),
                ("memory".to_owned(), memory, false),
                ("pids".to_owned(), pids, false),
            ]
        );
        let description = support.describe();
        assert!(description.contains(&"memory limit: enforced with cgroup v1 memory".to_owned()));
        assert!(description.contains(&"process tree kill: cgroup.kill (v2)".to_owned()));
        assert!(description
            .contains(&"cgroup v2 at /sys/fs/cgroup/unified (controllers: hugetlb)".to_owned()));
    }

    #[test]
    fn pure_v2_with_controllers_puts_everything_in_the_unified_hierarchy() {
        let support =
            CgroupSupport::from_mountinfo(PURE_V2, "cpuset cpu io memory hugetlb pids rdma misc\n");
        assert_eq!(support.unified_mount(), Some(Path::new("/sys/fs/cgroup")));
        assert_eq!(support.v1_mount("memory"), None);
        assert_eq!(
            support.enforceable(),
            Enforceable {
                memory: true,
                pids: true,
                cpu: true,
                tree_kill: true
            }
        );
        let all = Controllers {
            memory: true,
            pids: true,
            cpu: true,
            cpuacct: false,
            freezer: false,
        };
        assert_eq!(
            plan_summary(&support),
            vec![("unified".to_owned(), all, true)]
        );
        let description = support.describe();
        assert!(description.contains(&"cpu limit: enforced with cgroup v2".to_owned()));
        assert!(description.contains(&"cgroup v1: no controller hierarchies mounted".to_owned()));
    }

    #[test]
    fn pure_v2_without_the_memory_controller_cannot_enforce_memory() {
        let support = CgroupSupport::from_mountinfo(PURE_V2, "cpu pids\n");
        let enforceable = support.enforceable();
        assert!(!enforceable.memory);
        assert!(enforceable.pids && enforceable.cpu && enforceable.tree_kill);
        assert!(support
            .describe()
            .contains(&"memory limit: not enforceable (no controller)".to_owned()));
    }

    #[test]
    fn comounted_cpu_and_cpuacct_form_one_hierarchy_that_also_reports_usage() {
        let support = CgroupSupport::from_mountinfo(COMOUNTED, "");
        assert_eq!(support.unified_mount(), None);
        assert_eq!(
            support.v1_mount("cpu"),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(support.v1_mount("cpu"), support.v1_mount("cpuacct"));
        let plans = plan_summary(&support);
        assert_eq!(plans[0].0, "cpu,cpuacct");
        assert!(plans[0].1.cpu && plans[0].1.cpuacct && !plans[0].2);
        assert_eq!(plans[2].0, "pids");
        assert!(plans[2].2, "pids carries the leafs without v2");
        assert!(support
            .describe()
            .contains(&"process tree kill: v1 pids listing".to_owned()));
    }

    #[test]
    fn no_cgroup_mounts_means_nothing_is_enforceable() {
        let support = CgroupSupport::from_mountinfo(NO_CGROUPS, "");
        assert_eq!(support.unified_mount(), None);
        assert_eq!(support.enforceable(), Enforceable::default());
        assert!(support.plans().is_empty());
        let description = support.describe();
        assert!(description.contains(&"cgroup v2: not mounted".to_owned()));
        assert!(description.contains(&"pids limit: not enforceable (no controller)".to_owned()));
        assert!(description
            .contains(&"process tree kill: unavailable (no cgroup hierarchy)".to_owned()));
    }

    #[test]
    fn pure_v1_with_a_freezer_keeps_the_leafs_there_too_and_hybrid_hosts_do_not() {
        let v1 = "35 31 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
                  37 31 0:34 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n";
        let support = CgroupSupport::from_mountinfo(v1, "");
        assert_eq!(
            plan_summary(&support),
            vec![
                (
                    "pids".to_owned(),
                    Controllers {
                        pids: true,
                        ..Controllers::default()
                    },
                    true
                ),
                (
                    "freezer".to_owned(),
                    Controllers {
                        freezer: true,
                        ..Controllers::default()
                    },
                    true
                ),
            ]
        );
        // With v2 mounted, cgroup.freeze does it: the v1 freezer is not used.
        let hybrid = format!("{v1}30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
        let support = CgroupSupport::from_mountinfo(&hybrid, "");
        assert!(plan_summary(&support)
            .iter()
            .all(|(hierarchy, controllers, _)| hierarchy != "freezer" && !controllers.freezer));
    }

    #[test]
    fn v1_without_pids_puts_the_leafs_in_another_hierarchy() {
        let text = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let support = CgroupSupport::from_mountinfo(text, "");
        assert_eq!(
            plan_summary(&support),
            vec![(
                "memory".to_owned(),
                Controllers {
                    memory: true,
                    ..Controllers::default()
                },
                true
            )]
        );
        assert!(support.enforceable().tree_kill);
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        let text = "41 31 0:38 / /mnt/cgroup\\040two rw - cgroup2 cgroup2 rw\n";
        let support = CgroupSupport::from_mountinfo(text, "");
        assert_eq!(support.unified_mount(), Some(Path::new("/mnt/cgroup two")));
        assert_eq!(
            unescape_mount_path("a\\134b\\777"),
            PathBuf::from("a\\b\\777")
        );
    }

    #[test]
    fn a_second_mount_of_the_same_hierarchy_is_ignored() {
        let text = "\
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
90 80 0:32 / /container/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        let support = CgroupSupport::from_mountinfo(text, "");
        assert_eq!(
            support.v1_mount("memory"),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(support.plans().len(), 1);
    }

    #[test]
    fn proc_self_cgroup_lines_name_their_hierarchy() {
        let own = parse_proc_cgroup("4:memory:/process_api/x\n1:cpu,cpuacct:/\n0::/init.scope\n");
        assert_eq!(
            own,
            vec![
                ("memory".to_owned(), "/process_api/x".to_owned()),
                ("cpu,cpuacct".to_owned(), "/".to_owned()),
                ("unified".to_owned(), "/init.scope".to_owned()),
            ]
        );
    }

    #[test]
    fn cgroup_kill_needs_linux_5_14() {
        assert!(kernel_has_cgroup_kill("6.18.44-fc-v857"));
        assert!(kernel_has_cgroup_kill("5.14.0"));
        assert!(!kernel_has_cgroup_kill("5.13.19-generic"));
        assert!(!kernel_has_cgroup_kill("4.19.0"));
        assert!(!kernel_has_cgroup_kill("garbage"));
    }

    #[test]
    fn cpu_millis_become_a_quota_per_100ms_with_a_1ms_floor() {
        assert_eq!(cpu_quota_usec(1000), 100_000);
        assert_eq!(cpu_quota_usec(500), 50_000);
        assert_eq!(cpu_quota_usec(2500), 250_000);
        assert_eq!(cpu_quota_usec(1), MIN_CPU_QUOTA_USEC);
        assert_eq!(cpu_quota_usec(u64::MAX), u64::MAX);
    }

    #[test]
    fn sandbox_names_must_be_plain_directory_names() {
        assert!(validate_name("test-123_4").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "cgroup.procs",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(
                matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn cpu_limits_are_read_as_thousandths_of_a_cpu() {
        assert_eq!(cpu_max_millis("100000 100000\n"), Some(1000));
        assert_eq!(cpu_max_millis("50000 100000"), Some(500));
        assert_eq!(cpu_max_millis("250000 100000\n"), Some(2500));
        assert_eq!(cpu_max_millis("max 100000\n"), None);
        assert_eq!(cpu_max_millis(""), None);
        assert_eq!(cpu_max_millis("100000 0"), None);
        // v1: `cpu.cfs_quota_us` is -1 without a limit.
        assert_eq!(cpu_millis(-1, 100_000), None);
        assert_eq!(cpu_millis(200_000, 100_000), Some(2000));
    }

    #[test]
    fn a_v1_memory_limit_of_the_page_counters_maximum_is_no_limit() {
        assert_eq!(v1_memory_limit(9_223_372_036_854_771_712), None);
        assert_eq!(v1_memory_limit(2 << 30), Some(2 << 30));
    }

    #[test]
    fn page_cache_is_read_from_memory_stat() {
        let v2 = "anon 104857600\nfile 52428800\nkernel 1024\nfile_mapped 0\n";
        assert_eq!(stat_field(v2, "file"), Some(52_428_800));
        assert_eq!(stat_field(v2, "anon"), Some(104_857_600));
        let v1 = "cache 4096\nrss 8192\ntotal_cache 12288\ntotal_rss 16384\n";
        assert_eq!(stat_field(v1, "total_cache"), Some(12_288));
        assert_eq!(stat_field(v1, "cache"), Some(4096));
    }

    #[test]
    fn cpu_stat_fields_are_found_by_key() {
        let text = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
        assert_eq!(stat_field(text, "usage_usec"), Some(1234));
        assert_eq!(stat_field(text, "system_usec"), Some(234));
        assert_eq!(stat_field(text, "nr_periods"), None);
    }

    #[test]
    fn controllers_are_intersected_with_what_the_parent_enabled() {
        let wanted = Controllers {
            memory: true,
            pids: true,
            cpu: true,
            cpuacct: false,
            freezer: false,
        };
        let got = wanted.intersect_listed("cpuset memory pids\n");
        assert!(got.memory && got.pids && !got.cpu);
    }
}
