//! What a running runtime consumes, as the kernel accounts it ([`crate::Backend::usage`]).

/// The resources a runtime uses now, read from the kernel's accounting of the runtime as a
/// whole (its cgroup: init or the agent and every command together), never estimated
/// (I22). Limits are the ones the kernel enforces on the runtime (I23), `None` when it
/// enforces none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RuntimeUsage {
    /// CPU time every process of the runtime consumed since it started, in microseconds
    /// (cgroup v2 `cpu.stat` `usage_usec`, v1 `cpuacct.usage`). It only grows while one
    /// runtime lives: a smaller figure means another runtime serves the sandbox now.
    pub cpu_usage_usec: u64,
    /// Memory charged to the runtime now, page cache included, in bytes (v2
    /// `memory.current`, v1 `memory.usage_in_bytes`).
    pub memory_current: u64,
    /// The memory limit in bytes (v2 `memory.max`, v1 `memory.limit_in_bytes`), `None`
    /// when the runtime has none.
    pub memory_max: Option<u64>,
    /// The part of `memory_current` that is file-backed page cache, tmpfs included, in
    /// bytes (v2 `memory.stat` `file`, v1 `total_cache`); the kernel reclaims it under
    /// pressure. `None` when the kernel does not say.
    pub memory_file: Option<u64>,
    /// The CPU limit in thousandths of a CPU (v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
    /// `cpu.cfs_period_us`: 1000 is one full CPU), `None` when the runtime has none.
    pub cpu_limit_millis: Option<u64>,
}

impl RuntimeUsage {
    /// Memory the runtime's processes hold that the kernel cannot simply drop: what is
    /// charged less the page cache (what `free` calls used).
    pub fn memory_used(&self) -> u64 {
        self.memory_current
            .saturating_sub(self.memory_file.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_leaves_the_page_cache_out() {
        let usage = RuntimeUsage {
            memory_current: 300,
            memory_file: Some(100),
            ..RuntimeUsage::default()
        };
        assert_eq!(usage.memory_used(), 200);
        // A cache figure above the charge (read a moment apart) never wraps around.
        let racing = RuntimeUsage {
            memory_current: 100,
            memory_file: Some(150),
            ..RuntimeUsage::default()
        };
        assert_eq!(racing.memory_used(), 0);
        let unknown = RuntimeUsage {
            memory_current: 100,
            ..RuntimeUsage::default()
        };
        assert_eq!(unknown.memory_used(), 100);
    }
}
