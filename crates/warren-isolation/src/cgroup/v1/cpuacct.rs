//! The v1 cpuacct controller: CPU time consumed (`cpuacct.usage`), read only where no v2
//! hierarchy reports it.

use super::*;

/// Adds the CPU time consumed to `stats` (the kernel counts nanoseconds).
pub(super) fn read_usage(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
    fill(&mut stats.cpu_usage_usec, || {
        read_u64(dir, "cpuacct.usage").map(|ns| ns / 1000)
    });
}
