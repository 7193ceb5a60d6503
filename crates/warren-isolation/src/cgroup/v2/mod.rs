//! Cgroup v2, the unified hierarchy ([`Driver`]): controllers enabled from the root down,
//! `cgroup.freeze` and `cgroup.kill`; its memory and cpu files live in `memory.rs` and
//! `cpu.rs`.

use super::*;

mod cpu;
mod memory;
#[cfg(test)]
mod tests;

/// Cgroup v2. Its sandbox directories hold no processes themselves (the "no internal
/// processes" rule): they live in the leafs.
#[derive(Debug)]
pub(in crate::cgroup) struct Driver;

impl CgroupDriver for Driver {
    fn prepare(
        &self,
        hierarchy: &str,
        root: BorrowedFd<'_>,
        parent: BorrowedFd<'_>,
        planned: Controllers,
    ) {
        if planned != Controllers::default() {
            // v2 hands a controller to a cgroup only when every ancestor enabled it for
            // its children, so enable it from the root down to `warren/`.
            enable_controllers(root, &format!("{hierarchy}:/"), planned);
            enable_controllers(parent, &format!("{hierarchy}:{ROOT_DIR}"), planned);
        }
    }

    fn created(&self, dir: BorrowedFd<'_>, path: &str, planned: Controllers) -> Controllers {
        // What actually got through: an ancestor may have refused (e.g. a
        // non-root cgroup namespace root that holds processes).
        let controllers = match read_file(dir, "cgroup.controllers") {
            Ok(listed) => planned.intersect_listed(&listed),
            Err(err) => {
                tracing::debug!(
                    cgroup = %path,
                    error = %err,
                    "cannot read cgroup.controllers"
                );
                Controllers::default()
            }
        };
        // Lets the leafs report their own memory and pids usage.
        enable_controllers(dir, path, controllers);
        controllers
    }

    fn opened(&self, dir: BorrowedFd<'_>, planned: Controllers) -> Controllers {
        read_file(dir, "cgroup.controllers")
            .map(|listed| planned.intersect_listed(&listed))
            .unwrap_or_default()
    }

    fn set_memory(
        &self,
        dir: BorrowedFd<'_>,
        path: &str,
        bytes: Option<u64>,
    ) -> Result<(), CgroupError> {
        memory::set_limit(dir, path, bytes)
    }

    fn set_cpu(
        &self,
        dir: BorrowedFd<'_>,
        path: &str,
        millis: Option<u64>,
    ) -> Result<(), CgroupError> {
        cpu::set_limit(dir, path, millis)
    }

    fn spawns_into_leaf(&self) -> bool {
        true
    }

    /// `cgroup.freeze` (Linux 5.2+).
    fn freeze(&self, dir: BorrowedFd<'_>, _controllers: Controllers) -> bool {
        write_file(dir, "cgroup.freeze", b"1").is_ok()
    }

    fn frozen(&self, dir: BorrowedFd<'_>) -> bool {
        read_file(dir, "cgroup.events").map_or(true, |events| {
            stat_field(&events, "frozen") == Some(1) || stat_field(&events, "populated") == Some(0)
        })
    }

    fn thaw(&self, dir: BorrowedFd<'_>) {
        let _ = write_file(dir, "cgroup.freeze", b"0");
    }

    fn frozen_die(&self) -> bool {
        true
    }

    /// `cgroup.kill` (Linux 5.14+).
    fn kill(&self, dir: BorrowedFd<'_>) -> io::Result<bool> {
        match write_file(dir, "cgroup.kill", b"1") {
            Ok(()) => Ok(true),
            // Before Linux 5.14: fall back to signalling pid by pid.
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(err),
        }
    }

    fn read_stats(&self, dir: BorrowedFd<'_>, controllers: Controllers, stats: &mut CgroupStats) {
        // cpu.stat's usage_usec exists in every non-root v2 cgroup, controller or not.
        cpu::read_usage(dir, stats);
        if controllers.memory {
            memory::read_stats(dir, stats);
        }
        if controllers.cpu {
            cpu::read_limit(dir, stats);
        }
    }
}

impl Controllers {
    /// Keeps only the controllers named in a `cgroup.controllers` file.
    pub(super) fn intersect_listed(self, listed: &str) -> Self {
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

/// Enables each of `controllers` in `dir`'s `cgroup.subtree_control`, one at a time so one
/// refusal doesn't block the others. Failures only mean a limit can't be enforced, which the
/// caller learns from `cgroup.controllers` below, so they are logged, not returned.
pub(super) fn enable_controllers(dir: BorrowedFd<'_>, path: &str, controllers: Controllers) {
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
