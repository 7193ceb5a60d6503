//! The v1 cpu controller: CFS bandwidth (`cpu.cfs_period_us`, `cpu.cfs_quota_us`) as the
//! limit and as what is reported.

use super::*;

/// Writes the period, then the quota per period (`-1` when `None`: unlimited).
pub(super) fn set_limit(
    dir: BorrowedFd<'_>,
    path: &str,
    millis: Option<u64>,
) -> Result<(), CgroupError> {
    set_file(dir, path, "cpu.cfs_period_us", &CPU_PERIOD_USEC.to_string())?;
    let quota = millis.map_or("-1".to_owned(), |m| cpu_quota_usec(m).to_string());
    set_file(dir, path, "cpu.cfs_quota_us", &quota)
}

/// Adds the CPU limit (quota over period) to `stats`.
pub(super) fn read_limit(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
    fill(&mut stats.cpu_max_millis, || {
        let quota = read_file(dir, "cpu.cfs_quota_us").ok()?;
        let period = read_u64(dir, "cpu.cfs_period_us")?;
        cpu_millis(quota.trim().parse().ok()?, period)
    });
}
