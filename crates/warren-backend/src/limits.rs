//! Resource limits of one runtime, as every backend applies them.

use serde::{Deserialize, Serialize};

/// Resource limits of one runtime (I23).
///
/// The ephemeral file systems (CoW layer, `/home/gem`, `/tmp`, `/dev/shm`) are tmpfs: their
/// pages count against `memory_bytes`. The defaults keep their sum well below the memory
/// limit, so filling them answers "No space left on device" rather than the OOM killer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeLimits {
    /// Memory of the whole runtime, bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads of the whole runtime.
    pub pids_max: Option<u64>,
    /// CPU quota in thousandths of a CPU (1000 = one CPU).
    pub cpu_millis: Option<u64>,
    /// Size of the copy-on-write layer over the root filesystem, bytes.
    pub cow_bytes: u64,
    /// Size of the ephemeral `/home/gem`, bytes.
    pub home_bytes: u64,
    /// Size of `/tmp`, bytes.
    pub tmp_bytes: u64,
    /// Size of `/dev/shm`, bytes.
    pub shm_bytes: u64,
    /// Open files per process.
    pub nofile: u64,
}

impl Default for RuntimeLimits {
    fn default() -> Self {
        const MIB: u64 = 1024 * 1024;
        Self {
            memory_bytes: Some(2048 * MIB),
            pids_max: Some(512),
            cpu_millis: Some(1000),
            cow_bytes: 512 * MIB,
            home_bytes: 256 * MIB,
            tmp_bytes: 256 * MIB,
            shm_bytes: 64 * MIB,
            nofile: 1024,
        }
    }
}
