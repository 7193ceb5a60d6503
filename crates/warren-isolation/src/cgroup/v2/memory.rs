//! The v2 memory controller: `memory.max` with swap capped by `memory.swap.max`, and what
//! `memory.current`, `memory.peak` and `memory.stat` report.

use super::*;

/// Writes `memory.max`, and `memory.swap.max` where the kernel accounts swap, so swap cannot
/// be used to exceed the limit; `None` resets both to unlimited.
pub(super) fn set_limit(
    dir: BorrowedFd<'_>,
    path: &str,
    bytes: Option<u64>,
) -> Result<(), CgroupError> {
    set_file(
        dir,
        path,
        "memory.max",
        &bytes.map_or("max".to_owned(), |b| b.to_string()),
    )?;
    if file_exists(dir, "memory.swap.max") {
        set_file(
            dir,
            path,
            "memory.swap.max",
            if bytes.is_some() { "0" } else { "max" },
        )?;
    }
    Ok(())
}

/// Adds memory usage, peak, limit and page cache to `stats`.
pub(super) fn read_stats(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
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
