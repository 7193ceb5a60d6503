//! Landlock for the whole runtime, applied once by init to itself after the root is
//! assembled, so every command inherits one domain.
//!
//! One shared domain matters: Landlock forbids a process from inspecting processes of a
//! sibling domain, so per-command domains would hide a background process started by one
//! exec from the next (`ps`, `/proc/<pid>`), breaking the shared runtime of I6.
//!
//! The rules: read and execute everywhere; write only where the sandbox user is meant to;
//! and full access beneath the runtime's own cgroup directories (held open by init, not
//! reachable from inside), where init creates and removes each command's cgroup.

use std::os::fd::BorrowedFd;

use landlock::{
    path_beneath_rules, Access, AccessFs, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};

/// Where the sandbox user may write (DAC and the mount layout decide the rest).
pub(crate) const WRITABLE: &[&str] = &["/home/gem", "/tmp", "/dev", "/usr/local", "/opt"];

/// Confines the calling process (init) and all its future children. Returns whether the
/// kernel enforces it (best effort: a kernel without Landlock keeps the mount layout as the
/// boundary, which `warren doctor` and /health report).
pub(crate) fn confine<'a>(
    cgroup_dirs: impl Iterator<Item = BorrowedFd<'a>>,
) -> Result<bool, landlock::RulesetError> {
    let abi = ABI::V5;
    let all = AccessFs::from_all(abi);
    let mut ruleset = Ruleset::default()
        .handle_access(all)?
        .create()?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(
            WRITABLE.iter().filter(|p| std::path::Path::new(p).exists()),
            all,
        ))?;
    for dir in cgroup_dirs {
        ruleset = ruleset.add_rule(PathBeneath::new(dir, all))?;
    }
    let status = ruleset.restrict_self()?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}
