//! What the host offers: the hierarchies mounted, which controller each of memory, pids
//! and cpu is taken from, and whether `cgroup.kill` exists ([`CgroupSupport`]).

use super::*;

/// The cgroup hierarchies of this host, as seen from the caller's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSupport {
    pub(super) unified: Option<Unified>,
    pub(super) v1: Vec<V1Mount>,
    /// This process's own cgroups (`/proc/self/cgroup`), as `(hierarchy, path)`; reported by
    /// [`CgroupSupport::describe`] because limits of an enclosing cgroup still apply.
    pub(super) own: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unified {
    pub(super) path: PathBuf,
    /// Controllers listed in the root's `cgroup.controllers`.
    pub(super) controllers: Vec<String>,
    /// Whether non-root cgroups have `cgroup.kill` (Linux 5.14+).
    pub(super) cgroup_kill: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct V1Mount {
    pub(super) path: PathBuf,
    /// Controllers bound to this hierarchy, e.g. `["cpu", "cpuacct"]` when co-mounted.
    pub(super) controllers: Vec<String>,
}

impl V1Mount {
    pub(super) fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }

    /// How this hierarchy is named in messages: its controllers, e.g. `cpu,cpuacct`.
    pub(super) fn label(&self) -> String {
        self.controllers.join(",")
    }
}

/// The three controllers warren sets limits with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    pub(super) const ALL: [Self; 3] = [Self::Memory, Self::Pids, Self::Cpu];

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Cpu => "cpu",
        }
    }

    pub(super) fn requested(self, limits: &Limits) -> bool {
        match self {
            Self::Memory => limits.memory_bytes.is_some(),
            Self::Pids => limits.pids_max.is_some(),
            Self::Cpu => limits.cpu_millis.is_some(),
        }
    }
}

/// Which controllers' interface files a sandbox directory in one hierarchy carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Controllers {
    pub(super) memory: bool,
    pub(super) pids: bool,
    pub(super) cpu: bool,
    /// v1 `cpuacct.usage`, only read when no v2 hierarchy reports CPU usage.
    pub(super) cpuacct: bool,
    /// v1 `freezer.state`, used to freeze a tree before killing it when no v2 hierarchy
    /// offers `cgroup.freeze`.
    pub(super) freezer: bool,
}

impl Controllers {
    pub(super) fn has(self, controller: Controller) -> bool {
        match controller {
            Controller::Memory => self.memory,
            Controller::Pids => self.pids,
            Controller::Cpu => self.cpu,
        }
    }

    pub(super) fn insert(&mut self, controller: Controller) {
        match controller {
            Controller::Memory => self.memory = true,
            Controller::Pids => self.pids = true,
            Controller::Cpu => self.cpu = true,
        }
    }

    pub(super) fn limit_controllers(self) -> impl Iterator<Item = Controller> {
        Controller::ALL.into_iter().filter(move |c| self.has(*c))
    }
}

/// Where a controller comes from on this host.
pub(super) enum Backing<'a> {
    Unified,
    V1(&'a V1Mount),
    Missing,
}

/// One hierarchy a sandbox gets a directory in, before anything is created.
pub(super) struct Plan<'a> {
    /// How the hierarchy's cgroup version is handled: [`v2::Driver`] or [`v1::Driver`].
    pub(super) driver: &'static dyn CgroupDriver,
    pub(super) mount: &'a Path,
    pub(super) hierarchy: String,
    /// For v2: the controllers to enable (what the root offers); for v1: what this mount
    /// carries for us.
    pub(super) controllers: Controllers,
    /// Whether processes live in leafs (`init`, `exec-<n>`) here rather than in the sandbox
    /// directory itself.
    pub(super) leafy: bool,
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

    pub(super) fn kill_mechanism(&self) -> &'static str {
        match &self.unified {
            Some(u) if u.cgroup_kill => "cgroup.kill (v2)",
            Some(_) => "v2 cgroup.procs listing",
            None if self.v1_mount("pids").is_some() => "v1 pids listing",
            None if !self.plans().is_empty() => "v1 cgroup.procs listing",
            None => "unavailable (no cgroup hierarchy)",
        }
    }

    pub(super) fn cgroup_kill(&self) -> bool {
        self.unified.as_ref().is_some_and(|u| u.cgroup_kill)
    }

    pub(super) fn backing(&self, controller: Controller) -> Backing<'_> {
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
    pub(super) fn plans(&self) -> Vec<Plan<'_>> {
        let mut plans = Vec::new();
        if let Some(u) = &self.unified {
            let mut controllers = Controllers::default();
            for controller in Controller::ALL {
                if matches!(self.backing(controller), Backing::Unified) {
                    controllers.insert(controller);
                }
            }
            plans.push(Plan {
                driver: &v2::Driver,
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
                driver: &v1::Driver,
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

/// `cgroup.kill` appeared in Linux 5.14.
pub(super) fn kernel_has_cgroup_kill(release: &str) -> bool {
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
pub(super) fn parse_mountinfo(text: &str) -> (Option<PathBuf>, Vec<V1Mount>) {
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
pub(super) fn unescape_mount_path(field: &str) -> PathBuf {
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
pub(super) fn parse_proc_cgroup(text: &str) -> Vec<(String, String)> {
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

pub(super) fn read_host_file(path: &str) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Detect {
        path: path.to_owned(),
        source,
    })
}
