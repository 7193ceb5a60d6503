//! The limits of a gVisor runtime (issue 19), shared by every backend that runs one.
//!
//! The host's cgroups hold runsc's Sentry, not the sandbox's processes one by one: on the
//! ptrace platform each process of the sandbox costs host tasks of the Sentry's (measured
//! on runsc 20221219: 100 sleepers took 822; a fork bomb held at 128 processes peaked at
//! 4,052), and one runaway allocation reaches the host's memory limit as the Sentry's,
//! which ends every process of the sandbox at once. So the sandbox's own bounds are set
//! inside, by the agent, and the host's are sized around them, to stop a Sentry gone wrong,
//! not the sandbox's processes.

/// The most processes (tasks) the sandbox user may have at once inside a gVisor runtime
/// whose kernel-tier limit is `pids_max`: a quarter of it, at least 32, so that with the
/// Sentry's threads for each the host still carries about what a kernel-tier runtime may.
pub fn sandbox_processes(pids_max: u64) -> u64 {
    (pids_max / 4).max(32)
}

/// The host's pids limit of that runtime: room for the Sentry's tasks behind each of the
/// sandbox's processes at their peak (a fork bomb: about 32 each) and its own, so the
/// limit inside is what refuses a fork bomb and the host's never kills the Sentry.
pub fn host_tasks(pids_max: u64) -> u64 {
    sandbox_processes(pids_max)
        .saturating_mul(48)
        .saturating_add(512)
}

/// The address space one process of a gVisor runtime may map when the runtime's memory
/// limit is `memory_bytes`: three quarters of it, so one runaway fails its own allocation
/// (ENOMEM) before the host's memory cgroup ends the whole sandbox. Several large
/// processes together can still reach the host's limit: that ends the runtime (its
/// workspace is kept, I15).
pub fn address_space(memory_bytes: u64) -> u64 {
    memory_bytes / 4 * 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_limit_leaves_room_for_the_sentrys_tasks_behind_every_process() {
        for pids_max in [1, 64, 512, 4096] {
            let inside = sandbox_processes(pids_max);
            assert!(inside >= 32);
            assert!(host_tasks(pids_max) >= inside * 40, "{pids_max}");
        }
        assert_eq!(sandbox_processes(512), 128);
        assert_eq!(host_tasks(u64::MAX), u64::MAX);
    }

    #[test]
    fn one_process_may_map_less_than_the_whole_runtime_may_hold() {
        let gib = 1024 * 1024 * 1024;
        assert_eq!(address_space(2 * gib), 3 * gib / 2);
        assert!(address_space(2 * gib) < 2 * gib);
    }
}
