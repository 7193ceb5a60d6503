//! What a sandbox's cgroups report: memory, pids, CPU, and the forks its pids limit refused.

use super::*;

/// Adds the stats `dir` reports to `stats`, keeping values already found (v2 comes first).
pub(super) fn read_stats(
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
pub(super) fn pids_refused(dir: BorrowedFd<'_>, depth: usize) -> Option<u64> {
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
pub(super) fn cpu_max_millis(text: &str) -> Option<u64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse().ok()?;
    let period = fields.next()?.parse().ok()?;
    cpu_millis(quota, period)
}

/// `quota` microseconds of CPU per `period` as thousandths of a CPU; a negative quota (v1's
/// `-1`) or a zero period is no limit.
pub(super) fn cpu_millis(quota: i64, period: u64) -> Option<u64> {
    let quota = u64::try_from(quota).ok()?;
    (period > 0).then(|| quota.saturating_mul(1000) / period)
}

/// A v1 `memory.limit_in_bytes`, or `None` for the kernel's "unlimited": the largest page
/// counter in bytes (`LONG_MAX` rounded down to a page), far beyond any machine's memory.
pub(super) fn v1_memory_limit(bytes: u64) -> Option<u64> {
    const UNLIMITED_FROM: u64 = 1 << 62;
    (bytes < UNLIMITED_FROM).then_some(bytes)
}

/// Value of `key` in a flat-keyed file such as `cpu.stat` (`key value` per line).
pub(super) fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
