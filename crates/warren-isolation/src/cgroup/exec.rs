//! One command's leaf ([`ExecCgroup`]), and the agent's traits the sandbox's cgroups
//! implement for it.

use super::*;

/// One command's leaf `exec-<n>`, prepared so a freshly forked child can join it.
#[derive(Debug)]
pub struct ExecCgroup {
    pub(super) leaf: String,
    pub(super) leaves: Vec<Leaf>,
    /// `cgroup.procs` of every cgroup a command joins, opened for writing in advance: the
    /// child calling [`ExecCgroup::add_self`] must neither allocate nor resolve paths. The
    /// kernel (5.16+) checks a write against the opener's credentials and cgroup
    /// namespace, so the child may already have dropped privileges or entered the sandbox's
    /// cgroup namespace, as long as this handle was made before that.
    pub(super) procs: Vec<ProcsFile>,
    pub(super) cgroup_kill: bool,
}

#[derive(Debug)]
pub(super) struct Leaf {
    /// How this hierarchy's cgroup version is handled.
    pub(super) driver: &'static dyn CgroupDriver,
    pub(super) controllers: Controllers,
    pub(super) path: String,
    /// `warren/<name>`, to remove the leaf from.
    pub(super) parent: OwnedFd,
    pub(super) dir: OwnedFd,
}

#[derive(Debug)]
pub(super) struct ProcsFile {
    pub(super) fd: OwnedFd,
    pub(super) path: String,
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
            [leaf] if leaf.driver.spawns_into_leaf() => Some(leaf.dir.as_fd()),
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

    pub(super) fn targets(&self) -> Vec<Target<'_>> {
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
            read_stats(leaf.dir.as_fd(), leaf.driver, controllers, &mut stats);
        }
        stats.cpu_usage_usec
    }
}

impl Leaf {
    pub(super) fn target(&self) -> Target<'_> {
        Target {
            dir: self.dir.as_fd(),
            driver: self.driver,
            controllers: self.controllers,
            path: self.path.clone(),
        }
    }
}
