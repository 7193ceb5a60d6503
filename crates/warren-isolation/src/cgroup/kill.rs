//! Killing every process of a set of cgroups: frozen first where a freezer exists, then
//! SIGKILL, `cgroup.kill` where the kernel has it, until none is left.

use super::*;

/// A cgroup directory whose processes (and those of its descendants) are to be killed.
pub(super) struct Target<'a> {
    pub(super) dir: BorrowedFd<'a>,
    /// How its hierarchy's cgroup version freezes and kills.
    pub(super) driver: &'static dyn CgroupDriver,
    /// Controllers whose files exist in `dir` (the v1 freezer's `freezer.state` among them).
    pub(super) controllers: Controllers,
    /// `hierarchy:warren/...`, for messages.
    pub(super) path: String,
}

/// Kills everything in `targets` and waits until they are empty; returns how many
/// processes were killed (each counted once, however many rounds it took).
///
/// The targets are frozen first (v2 `cgroup.freeze`, Linux 5.2+; on hosts without v2, the
/// v1 freezer): a frozen process cannot fork, so a fork bomb cannot refill what is being
/// killed and a listed pid cannot exit and be reused by an unrelated process before its
/// signal arrives (I24). Frozen v2 processes still die of SIGKILL, from `cgroup.kill` or one
/// by one; frozen v1 processes die only once thawed, so v1 targets are thawed right after
/// the first round of signals (with SIGKILL pending, a thawed process dies before it runs
/// again). Every target is thawed in the end, so a failed kill never leaves processes
/// frozen forever.
pub(super) fn kill_tree(targets: &[Target<'_>], use_cgroup_kill: bool) -> Result<u64, CgroupError> {
    let frozen = freeze(targets);
    let result = kill_frozen(targets, use_cgroup_kill, &frozen);
    thaw(&frozen);
    result
}

/// Thaws what [`freeze`] froze. Best effort: a target removed meanwhile has nothing left to
/// thaw.
pub(super) fn thaw(frozen: &[&Target<'_>]) {
    for target in frozen {
        target.driver.thaw(target.dir);
    }
}

/// Freezes every target its driver can freeze (v2 `cgroup.freeze`, the v1 freezer) and
/// waits (bounded) until the kernel reports it frozen; returns the targets it froze, to thaw.
pub(super) fn freeze<'t, 'a>(targets: &'t [Target<'a>]) -> Vec<&'t Target<'a>> {
    let frozen: Vec<&Target<'_>> = targets
        .iter()
        .filter(|t| t.driver.freeze(t.dir, t.controllers))
        .collect();
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    while Instant::now() < deadline {
        let settled = frozen.iter().all(|t| t.driver.frozen(t.dir));
        if settled {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    frozen
}

pub(super) fn kill_frozen(
    targets: &[Target<'_>],
    use_cgroup_kill: bool,
    frozen: &[&Target<'_>],
) -> Result<u64, CgroupError> {
    let frozen_v1: Vec<&Target<'_>> = frozen
        .iter()
        .copied()
        .filter(|t| !t.driver.frozen_die())
        .collect();
    let mut thawed_v1 = frozen_v1.is_empty();
    let mut seen = BTreeSet::new();
    seen.extend(list_pids(targets)?);
    let mut killed_by_kernel = false;
    if use_cgroup_kill {
        for target in targets {
            match target.driver.kill(target.dir) {
                Ok(true) => killed_by_kernel = true,
                // v1, or v2 before Linux 5.14: fall back to signalling pid by pid.
                Ok(false) => {}
                Err(source) => {
                    return Err(CgroupError::Kill {
                        path: target.path.clone(),
                        source,
                    })
                }
            }
        }
    }
    let start = Instant::now();
    loop {
        let pids = list_pids(targets)?;
        seen.extend(pids.iter().copied());
        if pids.is_empty() {
            return Ok(seen.len() as u64);
        }
        let elapsed = start.elapsed();
        if elapsed >= KILL_TIMEOUT {
            return Err(CgroupError::Kill {
                path: targets.first().map(|t| t.path.clone()).unwrap_or_default(),
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} processes still present after {} s",
                        pids.len(),
                        KILL_TIMEOUT.as_secs()
                    ),
                ),
            });
        }
        if !killed_by_kernel || elapsed >= CGROUP_KILL_GRACE {
            // 0 stands for a process outside the caller's pid namespace: it can't be
            // signalled from here, but it keeps the cgroup non-empty.
            for pid in pids
                .into_iter()
                .filter(|&p| p > 0)
                .filter_map(Pid::from_raw)
            {
                // ESRCH just means it exited meanwhile; anything else shows up as a
                // process that stays, which the timeout reports.
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            if !thawed_v1 {
                // Every listed process has SIGKILL pending: thawed, it dies at once.
                thaw(&frozen_v1);
                thawed_v1 = true;
            }
        }
        std::thread::sleep(KILL_POLL);
    }
}

/// The pids in `targets` and their descendant cgroups, sorted and deduplicated (a process is
/// listed once per hierarchy). Zombies are not listed: the kernel unlinks a task from its
/// cgroup when it exits, not when it is reaped.
pub(super) fn list_pids(targets: &[Target<'_>]) -> Result<Vec<i32>, CgroupError> {
    let mut pids = Vec::new();
    for target in targets {
        collect_pids(target.dir, &target.path, 0, &mut pids)?;
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

pub(super) fn collect_pids(
    dir: BorrowedFd<'_>,
    path: &str,
    depth: usize,
    pids: &mut Vec<i32>,
) -> Result<(), CgroupError> {
    let list_err = |source| CgroupError::ListProcesses {
        path: path.to_owned(),
        source,
    };
    let text = match read_file(dir, "cgroup.procs") {
        Ok(text) => text,
        // Removed meanwhile (ENODEV once a held directory is gone): nothing in it.
        Err(err) if is_gone(&err) => return Ok(()),
        Err(source) => return Err(list_err(source)),
    };
    pids.extend(
        text.lines()
            .filter_map(|line| line.trim().parse::<i32>().ok()),
    );
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    let children = match child_dirs(dir) {
        Ok(children) => children,
        Err(err) if is_gone(&err) => return Ok(()),
        Err(source) => return Err(list_err(source)),
    };
    for child in children {
        let child_path = format!("{path}/{child}");
        match open_dir_optional(dir, child.as_str()) {
            Ok(Some(fd)) => collect_pids(fd.as_fd(), &child_path, depth + 1, pids)?,
            Ok(None) => {}
            Err(source) => {
                return Err(CgroupError::ListProcesses {
                    path: child_path,
                    source,
                })
            }
        }
    }
    Ok(())
}
