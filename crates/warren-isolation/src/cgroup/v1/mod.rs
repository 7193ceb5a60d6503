//! Cgroup v1, one hierarchy per controller or co-mounted set ([`Driver`]): its controllers'
//! files, one module each (`memory.rs`, `cpu.rs`, `cpuacct.rs`, `freezer.rs`; pids is
//! shared with v2).

use super::*;

mod cpu;
mod cpuacct;
mod freezer;
mod memory;
#[cfg(test)]
mod tests;

/// Cgroup v1. A sandbox directory needs no preparation and carries every controller its
/// hierarchy is planned for; freezing needs the freezer controller, and nothing kills a
/// whole group at once.
#[derive(Debug)]
pub(in crate::cgroup) struct Driver;

impl CgroupDriver for Driver {
    fn prepare(
        &self,
        _hierarchy: &str,
        _root: BorrowedFd<'_>,
        _parent: BorrowedFd<'_>,
        _planned: Controllers,
    ) {
    }

    fn created(&self, _dir: BorrowedFd<'_>, _path: &str, planned: Controllers) -> Controllers {
        planned
    }

    fn opened(&self, _dir: BorrowedFd<'_>, planned: Controllers) -> Controllers {
        planned
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
        false
    }

    fn freeze(&self, dir: BorrowedFd<'_>, controllers: Controllers) -> bool {
        controllers.freezer && freezer::freeze(dir)
    }

    fn frozen(&self, dir: BorrowedFd<'_>) -> bool {
        freezer::frozen(dir)
    }

    fn thaw(&self, dir: BorrowedFd<'_>) {
        freezer::thaw(dir);
    }

    /// A process frozen by the v1 freezer dies only once thawed.
    fn frozen_die(&self) -> bool {
        false
    }

    fn kill(&self, _dir: BorrowedFd<'_>) -> io::Result<bool> {
        Ok(false)
    }

    fn read_stats(&self, dir: BorrowedFd<'_>, controllers: Controllers, stats: &mut CgroupStats) {
        if controllers.memory {
            memory::read_stats(dir, stats);
        }
        if controllers.cpu {
            cpu::read_limit(dir, stats);
        }
        if controllers.cpuacct {
            cpuacct::read_usage(dir, stats);
        }
    }
}
