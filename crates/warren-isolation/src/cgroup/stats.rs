//! What a sandbox's cgroups report, read the same way in every version: gathering it from a
//! group's driver and the pids controller, and parsing the files' formats.

use super::*;

/// Adds the stats `dir` reports to `stats`, keeping values already found (v2 comes first).
pub(super) fn read_stats(
    dir: BorrowedFd<'_>,
    driver: &dyn CgroupDriver,
    controllers: Controllers,
    stats: &mut CgroupStats,
) {
    driver.read_stats(dir, controllers, stats);
    if controllers.pids {
        pids::read_stats(dir, stats);
    }
}

/// Sets `slot` from `value` unless an earlier hierarchy already filled it.
pub(super) fn fill(slot: &mut Option<u64>, value: impl FnOnce() -> Option<u64>) {
    if slot.is_none() {
        *slot = value();
    }
}

/// `quota` microseconds of CPU per `period` as thousandths of a CPU; a negative quota (v1's
/// `-1`) or a zero period is no limit.
pub(super) fn cpu_millis(quota: i64, period: u64) -> Option<u64> {
    let quota = u64::try_from(quota).ok()?;
    (period > 0).then(|| quota.saturating_mul(1000) / period)
}

/// Value of `key` in a flat-keyed file such as `cpu.stat` (`key value` per line).
pub(super) fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
