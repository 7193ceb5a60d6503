//! The v1 memory controller: `memory.limit_in_bytes` with memory+swap capped alongside, and
//! what `memory.usage_in_bytes`, `memory.max_usage_in_bytes` and `memory.stat` report.

use super::*;

/// Writes `memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where the kernel
/// accounts swap; `None` resets both to unlimited (`-1`).
pub(super) fn set_limit(
    dir: BorrowedFd<'_>,
    path: &str,
    bytes: Option<u64>,
) -> Result<(), CgroupError> {
    let value = bytes.map_or("-1".to_owned(), |b| b.to_string());
    let memsw = "memory.memsw.limit_in_bytes";
    let has_memsw = file_exists(dir, memsw);
    // The kernel insists memory+swap >= memory at every moment; lifting it first
    // makes any new memory limit valid, and then it's lowered to match (so swap
    // can't be used to go past the limit).
    if has_memsw {
        set_file(dir, path, memsw, "-1")?;
    }
    set_file(dir, path, "memory.limit_in_bytes", &value)?;
    if has_memsw && bytes.is_some() {
        set_file(dir, path, memsw, &value)?;
    }
    Ok(())
}

/// Adds memory usage, peak, limit and page cache to `stats`.
pub(super) fn read_stats(dir: BorrowedFd<'_>, stats: &mut CgroupStats) {
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

/// A v1 `memory.limit_in_bytes`, or `None` for the kernel's "unlimited": the largest page
/// counter in bytes (`LONG_MAX` rounded down to a page), far beyond any machine's memory.
pub(super) fn v1_memory_limit(bytes: u64) -> Option<u64> {
    const UNLIMITED_FROM: u64 = 1 << 62;
    (bytes < UNLIMITED_FROM).then_some(bytes)
}
