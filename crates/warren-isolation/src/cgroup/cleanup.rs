//! Removing cgroups: a sandbox's tree after it ended, and what an earlier server left.

use super::*;

/// Finds the sandboxes under `warren/` in every hierarchy and kills and removes each one
/// `keep` rejects: recovery after a provisioner restart. Returns the removed names, sorted. A
/// sandbox that cannot be removed is logged and left for the next sweep rather than stopping
/// the others; only failing to list is an error.
pub fn remove_stale(
    support: &CgroupSupport,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, CgroupError> {
    let mut names = BTreeSet::new();
    for plan in support.plans() {
        let list_err = |source| CgroupError::ListSandboxes {
            path: format!("{}:{ROOT_DIR}", plan.hierarchy),
            source,
        };
        let Some(root) = open_dir_optional(CWD, plan.mount).map_err(list_err)? else {
            continue;
        };
        let Some(parent) = open_dir_optional(root.as_fd(), ROOT_DIR).map_err(list_err)? else {
            continue;
        };
        names.extend(child_dirs(parent.as_fd()).map_err(list_err)?);
    }
    let mut removed = Vec::new();
    for name in names {
        // Names warren could not have created are somebody else's business.
        if keep(&name) || validate_name(&name).is_err() {
            continue;
        }
        let result = SandboxCgroup::open(support, &name).and_then(|cgroup| match cgroup {
            Some(cgroup) => {
                cgroup.kill_all()?;
                cgroup.remove()?;
                Ok(true)
            }
            None => Ok(false),
        });
        match result {
            Ok(true) => removed.push(name),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(
                    sandbox = %name,
                    error = %err,
                    "cannot remove stale sandbox cgroup; leaving it for the next sweep"
                );
            }
        }
    }
    Ok(removed)
}

/// Removes every cgroup below `dir`, deepest first.
pub(super) fn remove_children(
    dir: BorrowedFd<'_>,
    path: &str,
    depth: usize,
) -> Result<(), CgroupError> {
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    let children = match child_dirs(dir) {
        Ok(children) => children,
        Err(err) if is_gone(&err) => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Remove {
                path: path.to_owned(),
                source,
            })
        }
    };
    for child in children {
        let child_path = format!("{path}/{child}");
        match open_dir_optional(dir, child.as_str()) {
            Ok(Some(fd)) => remove_children(fd.as_fd(), &child_path, depth + 1)?,
            Ok(None) => continue,
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: child_path,
                    source,
                })
            }
        }
        remove_dir(dir, &child, &child_path)?;
    }
    Ok(())
}

/// `rmdir` relative to `parent`; already gone is fine. `EBUSY` is retried briefly because
/// tasks killed a moment ago may still be on their way out.
pub(super) fn remove_dir(
    parent: BorrowedFd<'_>,
    name: &str,
    path: &str,
) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::BUSY) if start.elapsed() < REMOVE_TIMEOUT => {
                std::thread::sleep(KILL_POLL);
            }
            Err(errno) => {
                return Err(CgroupError::Remove {
                    path: path.to_owned(),
                    source: errno.into(),
                })
            }
        }
    }
}
