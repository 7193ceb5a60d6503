//! A sandbox's cgroups ([`SandboxCgroup`]): made under `warren/<name>` in every hierarchy
//! in use, limits set, the init's leaf, and the names they may have.

use super::*;

/// A sandbox's cgroups: `warren/<name>` in every hierarchy in use, held as open directories.
#[derive(Debug)]
pub struct SandboxCgroup {
    pub(super) name: String,
    pub(super) places: Vec<Place>,
    pub(super) cgroup_kill: bool,
}

/// A sandbox's directory in one hierarchy.
#[derive(Debug)]
pub(super) struct Place {
    /// How this hierarchy's cgroup version is handled.
    pub(super) driver: &'static dyn CgroupDriver,
    pub(super) hierarchy: String,
    /// Controllers whose interface files exist in `dir` (for v2: enabled by `warren/`).
    pub(super) controllers: Controllers,
    pub(super) leafy: bool,
    /// `warren/`, to remove `warren/<name>` from.
    pub(super) parent: OwnedFd,
    /// `warren/<name>`.
    pub(super) dir: OwnedFd,
    /// `warren/<name>/init`, in leafy hierarchies; `None` if it vanished before `open`.
    pub(super) init: Option<OwnedFd>,
}

impl Place {
    /// `hierarchy:warren/<name>[/leaf]`, for messages.
    pub(super) fn path(&self, name: &str, leaf: Option<&str>) -> String {
        match leaf {
            Some(leaf) => format!("{}:{ROOT_DIR}/{name}/{leaf}", self.hierarchy),
            None => format!("{}:{ROOT_DIR}/{name}", self.hierarchy),
        }
    }

    /// Writes `controller`'s limit from `limits`: pids the same way in every version, memory
    /// and cpu through this hierarchy's driver.
    pub(super) fn write_limit(
        &self,
        name: &str,
        controller: Controller,
        limits: &Limits,
    ) -> Result<(), CgroupError> {
        let (dir, path) = (self.dir.as_fd(), self.path(name, None));
        // Limits that are not requested are reset to unlimited, so a cgroup reused after a
        // crash doesn't keep the previous run's values.
        match controller {
            Controller::Memory => self.driver.set_memory(dir, &path, limits.memory_bytes),
            Controller::Pids => pids::set_limit(dir, &path, limits.pids_max),
            Controller::Cpu => self.driver.set_cpu(dir, &path, limits.cpu_millis),
        }
    }

    pub(super) fn target(&self, name: &str) -> Target<'_> {
        Target {
            dir: self.dir.as_fd(),
            driver: self.driver,
            controllers: self.controllers,
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

    pub(super) fn populate(
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
            plan.driver.prepare(
                &plan.hierarchy,
                root.as_fd(),
                parent.as_fd(),
                plan.controllers,
            );
            let dir =
                make_dir(parent.as_fd(), &self.name).map_err(|source| CgroupError::Create {
                    path: at(&rel),
                    source,
                })?;
            let controllers = plan
                .driver
                .created(dir.as_fd(), &at(&rel), plan.controllers);
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
                driver: plan.driver,
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
            let controllers = plan.driver.opened(dir.as_fd(), plan.controllers);
            places.push(Place {
                driver: plan.driver,
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
                    driver: place.driver,
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

    pub(super) fn targets(&self) -> Vec<Target<'_>> {
        self.places.iter().map(|p| p.target(&self.name)).collect()
    }

    /// Removes the leafs and `warren/<name>` in every hierarchy (call after
    /// [`SandboxCgroup::kill_all`]); directories already gone are fine. Every hierarchy is
    /// attempted; the first failure is returned.
    pub fn remove(self) -> Result<(), CgroupError> {
        self.remove_dirs()
    }

    pub(super) fn remove_dirs(&self) -> Result<(), CgroupError> {
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
                place.driver,
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

/// The agent's server puts each command in a leaf of the sandbox's cgroups.
impl warren_agent::server::CommandGroups for SandboxCgroup {
    fn group(&self, n: u64) -> io::Result<Box<dyn warren_agent::server::CommandGroup>> {
        self.exec_leaf(n)
            .map(|leaf| Box::new(leaf) as Box<dyn warren_agent::server::CommandGroup>)
            .map_err(io::Error::other)
    }
}

/// `cpu_millis` as a quota per [`CPU_PERIOD_USEC`], at least [`MIN_CPU_QUOTA_USEC`].
pub(super) fn cpu_quota_usec(cpu_millis: u64) -> u64 {
    cpu_millis
        .saturating_mul(CPU_PERIOD_USEC / 1000)
        .max(MIN_CPU_QUOTA_USEC)
}

/// Sandbox names become directory names next to each other under `warren/`. Dots are refused
/// because every cgroup interface file has one, so a name could never collide with them.
pub(super) fn validate_name(name: &str) -> Result<(), CgroupError> {
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
