//! The pids controller, whose files (`pids.max`, `pids.current`, `pids.events`) are the same
//! in cgroup v2 and v1: the task limit and what it reports.

use super::*;

/// Writes `pids.max`; `None` resets it to unlimited.
pub(super) fn set_limit(
    dir: BorrowedFd<'_>,
    path: &str,
    pids_max: Option<u64>,
) -> Result<(), CgroupError> {
    set_file(
        dir,
        path,
        "pids.max",
        &pids_max.map_or("max".to_owned(), |n| n.to_string()),
    )
}

/// Adds the task count, the limit and the refused forks `dir` reports to `stats`, keeping
/// values already found.
pub(super) fn read_stats(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
    fill(&mut stats.pids_current, || read_u64(dir, "pids.current"));
    // "max" (unlimited) does not parse, and stays `None`.
    fill(&mut stats.pids_max, || read_u64(dir, "pids.max"));
    fill(&mut stats.pids_refused, || pids_refused(dir, 0));
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
