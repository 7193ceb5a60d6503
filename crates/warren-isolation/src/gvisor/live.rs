//! One live probe (`runsc do` of the smallest sandbox) in a scratch directory of its own,
//! and the clean-up that leaves nothing of it running or recorded.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal};

use super::bounded::{failure_detail, run_bounded, Ran};
use super::{GvisorPlatform, CLEANUP_LIMIT, COMMAND_LIMIT, PROBE_DIR_PREFIX};

/// How one live probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum LiveOutcome {
    /// The sandbox ran; whether coreutils' `stat` of a path worked in it.
    Succeeded {
        took: Duration,
        stat_works: bool,
    },
    TimedOut,
    /// It could not run, or exited unsuccessfully: the exit status and stderr's tail.
    Failed(String),
}

/// The live probe's exit status when coreutils' `stat` failed in the sandbox.
const STAT_FAILS: i32 = 42;

/// Runs `runsc <platform> --network=none do true` in `dir` (made for it): the smallest
/// sandbox, which proves the platform can run a program. `do` keeps its bundle and state
/// under `TMPDIR`, so `TMPDIR` is `dir`: everything it makes is found and removed there,
/// and every process it starts names `dir` on its command line. It configures no cgroups
/// (`--ignore-cgroups`): the question is the platform, and a killed probe must leave
/// nothing behind.
pub(super) fn live_probe(
    runsc: &Path,
    platform: GvisorPlatform,
    limit: Duration,
    dir: &Path,
) -> LiveOutcome {
    if let Err(error) = make_searchable_dir(dir) {
        return LiveOutcome::Failed(format!("cannot make {} ({error})", dir.display()));
    }
    let state = dir.join("state");
    if let Err(error) = std::fs::create_dir(&state) {
        return LiveOutcome::Failed(format!("cannot make {} ({error})", state.display()));
    }
    let mut command = Command::new(runsc);
    command
        .arg("--root")
        .arg(&state)
        .args(["--ignore-cgroups", platform.flag(), "--network=none", "do"])
        // The smallest program, plus one question of compatibility: whether coreutils'
        // `stat` (statx with AT_NO_AUTOMOUNT, coreutils 9) works here (runsc 20221219's
        // Sentry refuses that flag with EINVAL, so `ls -l` and `stat` of any path fail).
        .args(["/bin/sh", "-c"])
        .arg(format!("stat / >/dev/null 2>&1 || exit {STAT_FAILS}"))
        .env("TMPDIR", dir)
        // The sandbox sees the host's root (read-only, under an overlay) and starts in this
        // directory, so it must exist there: warren's own might not.
        .current_dir(dir);
    let outcome = match run_bounded(&mut command, limit, dir, "do") {
        Ran::Finished(done) if done.status.success() => LiveOutcome::Succeeded {
            took: done.took,
            stat_works: true,
        },
        Ran::Finished(done) if done.status.code() == Some(STAT_FAILS) => LiveOutcome::Succeeded {
            took: done.took,
            stat_works: false,
        },
        Ran::Finished(done) => LiveOutcome::Failed(failure_detail(done.status, &done.stderr)),
        Ran::TimedOut => LiveOutcome::TimedOut,
        Ran::NotStarted(error) => LiveOutcome::Failed(format!("cannot run runsc: {error}")),
    };
    clean_up(runsc, dir);
    outcome
}

/// Leaves nothing of a live probe in `dir` running or recorded: kills every process that
/// names `dir` (a killed `runsc do` leaves its gofer and, on some hosts, its sandbox, which
/// runs in a session of its own), then deletes every container runsc still lists under it,
/// and again until a listing of every root finishes and finds none, or [`CLEANUP_LIMIT`]
/// passes: a listing that did not finish in time, or a delete that failed or did not take,
/// is tried again rather than taken for "nothing left".
pub(super) fn clean_up(runsc: &Path, dir: &Path) {
    let deadline = Instant::now() + CLEANUP_LIMIT;
    loop {
        kill_processes_naming(dir);
        let found = delete_listed(runsc, dir);
        if found.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(dir = %dir.display(), ?found, "cannot delete containers the gVisor probe left");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deletes every container runsc lists under the probe's roots; what was found (or could
/// not be listed), by root and id, with how its delete went.
fn delete_listed(runsc: &Path, dir: &Path) -> Vec<String> {
    let mut roots = vec![dir.join("state")];
    if let Ok(entries) = std::fs::read_dir(dir) {
        roots.extend(
            entries
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().starts_with("runsc-do"))
                .map(|entry| entry.path()),
        );
    }
    let mut found = Vec::new();
    for root in roots {
        let mut list = Command::new(runsc);
        list.arg("--root").arg(&root).args(["list", "-quiet"]);
        let Ran::Finished(listed) = run_bounded(&mut list, COMMAND_LIMIT, dir, "list") else {
            found.push(format!("{}: not listed in time", root.display()));
            continue;
        };
        for id in listed.stdout.split_whitespace() {
            let mut delete = Command::new(runsc);
            delete
                .arg("--root")
                .arg(&root)
                .args(["delete", "-force", id]);
            match run_bounded(&mut delete, COMMAND_LIMIT, dir, "delete") {
                Ran::Finished(done) if done.status.success() => {
                    found.push(format!("{}/{id}: deleted", root.display()));
                }
                Ran::Finished(done) => found.push(format!(
                    "{}/{id}: {}",
                    root.display(),
                    failure_detail(done.status, &done.stderr)
                )),
                _ => found.push(format!("{}/{id}: not deleted in time", root.display())),
            }
        }
    }
    found
}

/// SIGKILLs every process whose command line contains `dir`, until none is left or
/// [`CLEANUP_LIMIT`] passes. Each is signalled through a pidfd opened before its command
/// line is read again, so a pid reused meanwhile is never signalled.
fn kill_processes_naming(dir: &Path) {
    let needle = dir.as_os_str().as_encoded_bytes();
    let deadline = Instant::now() + CLEANUP_LIMIT;
    loop {
        let found = processes_naming(needle);
        if found.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                pids = ?found,
                dir = %dir.display(),
                "processes of the gVisor probe survive SIGKILL"
            );
            return;
        }
        for pid in found {
            let Some(pid) = Pid::from_raw(pid) else {
                continue;
            };
            match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
                Ok(pidfd) => {
                    if cmdline_contains(pid.as_raw_pid(), needle) {
                        let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::KILL);
                    }
                }
                Err(rustix::io::Errno::NOSYS) => {
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
                Err(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids whose command line contains `needle` (zombies have none, so they never count).
pub(super) fn processes_naming(needle: &[u8]) -> Vec<i32> {
    let own = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != own && cmdline_contains(pid, needle))
        .collect()
}

fn cmdline_contains(pid: i32, needle: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| contains(&cmdline, needle))
        .unwrap_or(false)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// Makes `dir` (a new directory) 0711, whatever the umask: runsc's sandbox, no longer
/// privileged by then, reaches `TMPDIR` through it to mount its chroot there, and fails
/// with EACCES behind a 0700 directory; 0711 lets it pass without listing anything.
fn make_searchable_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}

/// The probe's scratch directory (0711, a fresh name), removed when dropped.
pub(super) struct ProbeDir {
    pub(super) path: PathBuf,
}

impl ProbeDir {
    pub(super) fn create(parent: &Path) -> io::Result<Self> {
        let mut attempt = 0u32;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.subsec_nanos());
            let path = parent.join(format!(
                "{PROBE_DIR_PREFIX}{}-{nanos:08x}{attempt}",
                std::process::id()
            ));
            match make_searchable_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

impl Drop for ProbeDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(dir = %self.path.display(), %error, "cannot remove the gVisor probe's scratch directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gvisor::locate::locate;
    use crate::gvisor::tests::{assert_no_leftovers, searchable_tempdir};

    #[test]
    fn a_probe_dir_is_searchable_but_not_listable_and_removed_when_dropped() {
        let parent = tempfile::tempdir().unwrap();
        let dir = ProbeDir::create(parent.path()).unwrap();
        let mode = std::fs::metadata(&dir.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o711);
        std::fs::write(dir.path.join("leftover"), b"x").unwrap();
        let path = dir.path.clone();
        drop(dir);
        assert!(!path.exists());
    }

    /// A probe killed at its limit (mid-start here) leaves no process and no state behind.
    #[test]
    fn a_probe_killed_at_its_limit_leaves_nothing_behind() {
        assert!(
            rustix::process::geteuid().is_root(),
            "the gVisor probe test runs as root (scripts/test does)"
        );
        let runsc = locate(None, std::env::var_os("PATH").as_deref()).unwrap();
        let scratch = searchable_tempdir();
        // ptrace killed while its sandbox starts; kvm killed while it hangs in KVM_RUN
        // where it does (a paravirtual kvm), else it passes or fails: nothing is left
        // either way.
        let cases = [
            (GvisorPlatform::Ptrace, Duration::from_millis(60)),
            (GvisorPlatform::Ptrace, Duration::from_millis(120)),
            (GvisorPlatform::Kvm, Duration::from_secs(1)),
        ];
        for (platform, limit) in cases {
            let dir = scratch.path().join(format!(
                "killed-{}-{}",
                platform.as_str(),
                limit.as_millis()
            ));
            let outcome = live_probe(&runsc, platform, limit, &dir);
            eprintln!("{platform:?} within {limit:?}: {outcome:?}");
            if platform == GvisorPlatform::Ptrace {
                assert!(
                    matches!(
                        outcome,
                        LiveOutcome::TimedOut | LiveOutcome::Succeeded { .. }
                    ),
                    "{outcome:?}"
                );
            }
            let left: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("runsc-do"))
                .flat_map(|name| {
                    let mut list = Command::new(&runsc);
                    list.arg("--root")
                        .arg(dir.join(&name))
                        .args(["list", "-quiet"]);
                    String::from_utf8_lossy(&list.output().unwrap().stdout)
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .collect();
            assert!(left.is_empty(), "runsc still lists {left:?}");
        }
        assert_no_leftovers(scratch.path());
    }
}
