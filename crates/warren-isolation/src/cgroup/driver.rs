//! The trait each cgroup version implements ([`CgroupDriver`]): what warren does with a
//! sandbox's directory in one hierarchy that cgroup v2 and v1 do differently.

use super::*;

/// How one cgroup version handles a sandbox's directory (or a command's leaf) in one
/// hierarchy: readying it for limits, writing them, freezing and killing its processes,
/// reading what it reports.
///
/// [`v2::Driver`] and [`v1::Driver`] implement it. A sandbox holds one directory per
/// hierarchy in use, each with the driver of its version, so a hybrid host (limits from v1
/// controllers, processes tracked by a controller-less v2 hierarchy) composes both; which
/// hierarchy carries what is decided once, by [`CgroupSupport`]. What the versions share
/// lives outside the drivers: joining a group through `cgroup.procs` ([`SandboxCgroup`],
/// [`ExecCgroup`]), listing and signalling its processes (`kill.rs`), removing it
/// (`cleanup.rs`), and the pids controller, whose files are the same in both (`pids.rs`).
pub(super) trait CgroupDriver: fmt::Debug + Sync {
    /// Readies the hierarchy's `root` and `warren/` (`parent`) before a sandbox directory is
    /// made in `warren/`, for the `planned` controllers; `hierarchy` names it in messages.
    fn prepare(
        &self,
        hierarchy: &str,
        root: BorrowedFd<'_>,
        parent: BorrowedFd<'_>,
        planned: Controllers,
    );

    /// The controllers a sandbox directory just made (or reused) carries, after readying it
    /// for its leafs; `path` names it in messages.
    fn created(&self, dir: BorrowedFd<'_>, path: &str, planned: Controllers) -> Controllers;

    /// The controllers an existing sandbox directory carries (opened after a restart).
    fn opened(&self, dir: BorrowedFd<'_>, planned: Controllers) -> Controllers;

    /// Writes the memory limit; `None` resets it to unlimited.
    fn set_memory(
        &self,
        dir: BorrowedFd<'_>,
        path: &str,
        bytes: Option<u64>,
    ) -> Result<(), CgroupError>;

    /// Writes the CPU bandwidth limit in thousandths of a CPU; `None` resets it to unlimited.
    fn set_cpu(
        &self,
        dir: BorrowedFd<'_>,
        path: &str,
        millis: Option<u64>,
    ) -> Result<(), CgroupError>;

    /// Whether a command can be spawned straight into a leaf here
    /// (`clone3(CLONE_INTO_CGROUP)`).
    fn spawns_into_leaf(&self) -> bool;

    /// Starts freezing the processes of `dir` and below; `false` when it cannot.
    fn freeze(&self, dir: BorrowedFd<'_>, controllers: Controllers) -> bool;

    /// Whether a freeze has settled (or cannot be told).
    fn frozen(&self, dir: BorrowedFd<'_>) -> bool;

    /// Thaws what [`CgroupDriver::freeze`] froze. Best effort: a group removed meanwhile has
    /// nothing left to thaw.
    fn thaw(&self, dir: BorrowedFd<'_>);

    /// Whether a frozen process dies of SIGKILL without being thawed first.
    fn frozen_die(&self) -> bool;

    /// Has the kernel kill every process of `dir` and below at once; `Ok(false)` when this
    /// version or kernel cannot (the caller then signals pid by pid).
    fn kill(&self, dir: BorrowedFd<'_>) -> io::Result<bool>;

    /// Adds what `dir` reports to `stats`, keeping values already found; pids are read by
    /// [`read_stats`] for both versions.
    fn read_stats(&self, dir: BorrowedFd<'_>, controllers: Controllers, stats: &mut CgroupStats);
}

/// Writes one limit `value` to `file` of the cgroup `dir` (named `path` in messages).
pub(super) fn set_file(
    dir: BorrowedFd<'_>,
    path: &str,
    file: &'static str,
    value: &str,
) -> Result<(), CgroupError> {
    write_file(dir, file, value.as_bytes()).map_err(|source| CgroupError::SetLimit {
        path: path.to_owned(),
        file,
        source,
    })
}
