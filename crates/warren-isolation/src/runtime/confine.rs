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

/// Where the sandbox user may write in every layout (DAC and the mount layout decide the
/// rest); the layout's home and writable persistent mounts are added to it ([`writable`]).
pub(crate) const WRITABLE: &[&str] = &["/tmp", "/dev", "/usr/local", "/opt"];

/// Everything the sandbox user may write to in a runtime of `layout` with `extra` mounts:
/// [`WRITABLE`], the layout's home, and the view's writable persistent mounts
/// (`/mnt/user-data` for DeerFlow's, a writable extra mount); read-only mounts and the
/// rest of the root stay read-only for Landlock too.
pub(crate) fn writable(
    layout: &'static warren_core::Layout,
    extra: &[warren_core::ExtraMount],
) -> Vec<String> {
    let mut paths: Vec<String> = WRITABLE.iter().map(|p| (*p).to_owned()).collect();
    let view = warren_core::view_mounts(layout, extra);
    let more =
        std::iter::once(layout.home).chain(view.iter().filter(|m| m.writable).map(|m| m.target));
    for path in more {
        // A path beneath one already listed (the ARS workspace in /home/gem) adds nothing.
        let covered = paths.iter().any(|p| {
            path == p
                || path
                    .strip_prefix(p.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        if !covered {
            paths.push(path.to_owned());
        }
    }
    paths.sort_unstable();
    paths
}

/// Confines the calling process (init) and all its future children, letting it write
/// beneath `writable` only. Returns whether the kernel enforces it (best effort: a kernel
/// without Landlock keeps the mount layout as the boundary, which `warren doctor` and
/// /health report).
pub(crate) fn confine<'a>(
    writable: &[String],
    cgroup_dirs: impl Iterator<Item = BorrowedFd<'a>>,
) -> Result<bool, landlock::RulesetError> {
    let abi = ABI::V5;
    let all = AccessFs::from_all(abi);
    let mut ruleset = Ruleset::default()
        .handle_access(all)?
        .create()?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(
            writable.iter().filter(|p| std::path::Path::new(p).exists()),
            all,
        ))?;
    for dir in cgroup_dirs {
        ruleset = ruleset.add_rule(PathBeneath::new(dir, all))?;
    }
    let status = ruleset.restrict_self()?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

#[cfg(test)]
mod tests {
    use warren_core::LayoutName;

    use super::*;

    #[test]
    fn landlock_lets_each_layout_write_to_its_writable_mounts_and_nothing_more() {
        let ars = writable(LayoutName::Ars.layout(), &[]);
        assert_eq!(ars, ["/dev", "/home/gem", "/opt", "/tmp", "/usr/local"]);
        let deerflow = writable(LayoutName::Deerflow.layout(), &[]);
        assert_eq!(
            deerflow,
            [
                "/dev",
                "/home/gem",
                "/mnt/user-data",
                "/opt",
                "/tmp",
                "/usr/local"
            ]
        );
        assert!(!deerflow.iter().any(|p| p.starts_with("/mnt/skills")));
        let e2b = writable(LayoutName::E2b.layout(), &[]);
        assert_eq!(e2b, ["/dev", "/home/user", "/opt", "/tmp", "/usr/local"]);
    }

    #[test]
    fn landlock_lets_a_writable_extra_mount_be_written_and_a_read_only_one_not() {
        let layout = LayoutName::Deerflow.layout();
        let extra = |target: &str, writable| {
            warren_core::ExtraMount::new(target, "/srv/df".into(), "x", writable, layout).unwrap()
        };
        let paths = writable(
            layout,
            &[
                extra("/mnt/scratch", true),
                extra("/mnt/acp-workspace", false),
            ],
        );
        assert!(paths.iter().any(|p| p == "/mnt/scratch"), "{paths:?}");
        assert!(
            !paths.iter().any(|p| p == "/mnt/acp-workspace"),
            "{paths:?}"
        );
    }
}
