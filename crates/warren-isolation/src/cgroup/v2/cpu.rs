//! The v2 cpu controller: the bandwidth limit `cpu.max`, and the usage `cpu.stat` reports.

use super::*;

/// Writes `cpu.max` as a quota per [`CPU_PERIOD_USEC`]; `None` resets it to unlimited.
pub(super) fn set_limit(
    dir: BorrowedFd<'_>,
    path: &str,
    millis: Option<u64>,
) -> Result<(), CgroupError> {
    let quota = millis.map_or("max".to_owned(), |m| cpu_quota_usec(m).to_string());
    set_file(dir, path, "cpu.max", &format!("{quota} {CPU_PERIOD_USEC}"))
}

/// Adds the CPU time consumed (`cpu.stat` `usage_usec`) to `stats`.
pub(super) fn read_usage(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
    fill(&mut stats.cpu_usage_usec, || {
        let text = read_file(dir, "cpu.stat").ok()?;
        stat_field(&text, "usage_usec")
    });
}

/// Adds the CPU limit (`cpu.max`) to `stats`.
pub(super) fn read_limit(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
    fill(&mut stats.cpu_max_millis, || {
        cpu_max_millis(&read_file(dir, "cpu.max").ok()?)
    });
}

/// The CPU limit a v2 `cpu.max` (`<quota> <period>`, quota `max` for none) sets, in
/// thousandths of a CPU.
pub(super) fn cpu_max_millis(text: &str) -> Option<u64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse().ok()?;
    let period = fields.next()?.parse().ok()?;
    cpu_millis(quota, period)
}
