//! The v1 freezer controller (`freezer.state`): holds a tree still before it is killed where
//! no v2 hierarchy offers `cgroup.freeze`.

use super::*;

/// Starts freezing; `false` when the write fails.
pub(super) fn freeze(dir: BorrowedFd<'_>) -> bool {
    write_file(dir, "freezer.state", b"FROZEN").is_ok()
}

/// Whether the kernel reports the group frozen (or the state cannot be read).
pub(super) fn frozen(dir: BorrowedFd<'_>) -> bool {
    read_file(dir, "freezer.state").map_or(true, |s| s.trim() == "FROZEN")
}

/// Thaws, best effort.
pub(super) fn thaw(dir: BorrowedFd<'_>) {
    let _ = write_file(dir, "freezer.state", b"THAWED");
}
