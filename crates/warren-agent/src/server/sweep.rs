//! Killing processes found through the runtime's own `/proc`, where no cgroup holds them:
//! a Docker container (the agent and its command supervisors have no cgroup of their own)
//! and an unprivileged runtime (no cgroups at all).
//!
//! A process found in one listing and killed in the next step may have forked meanwhile;
//! its child is not in the listing. So every round first stops (SIGSTOP) each process it
//! found, which keeps a stopped process from forking again, then kills them (SIGKILL
//! works on stopped processes), and rounds repeat until a listing finds nobody: a fork
//! bomb can only add what it forked between one listing and its SIGSTOP (I24). Where a
//! process that stays shares a process group with the ones killed (a shell and its
//! commands, without job control), nothing is stopped ([`Stopping::Never`]): a stopped
//! member of an orphaned process group makes the kernel send the whole group SIGHUP when
//! another member exits (gVisor does), and the shell would end with it.
//!
//! A listing is not a snapshot either: `/proc` is read first, each process's `stat`
//! after. A process alive when the directory was read may fork (children the listing
//! lacks) and exit before its `stat` is read, so it shows up only as a zombie. A listing
//! finds nobody only when no process it would pick died since the listing before.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// How long a sweep keeps going before it gives up on processes that will not die.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(10);

/// One process of the pid namespace, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its pid.
    pub pid: i32,
    /// Its parent's pid.
    pub ppid: i32,
    /// When it started, in clock ticks since boot: with `pid`, tells a process from a later
    /// one that reuses its pid.
    pub start_time: u64,
    /// Exited but not yet reaped: nothing left to signal, only to reap.
    pub zombie: bool,
}

/// Every process of the caller's pid namespace, from its `/proc`.
pub fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    // Newest first (pids rise until they wrap), right after the directory was read: a
    // process that forks and exits at once is likeliest young, and still alive then.
    pids.sort_unstable_by(|a, b| b.cmp(a));
    pids.into_iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields 3 (state), 4 (ppid) and 22 (starttime); the command name (field 2)
            // may hold spaces and parentheses, so count from the last ')'.
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            let start_time = fields.nth(17)?.parse().ok()?;
            Some(Process {
                pid,
                ppid,
                start_time,
                zombie: state == "Z" || state == "X",
            })
        })
        .collect()
}

/// Whether a listing in which `select` picked nobody shows that nobody is left: not if
/// `select` would pick one of its zombies that was no zombie of the listing before
/// (`zombies_before`). That one was alive when this listing began, so it may have forked
/// children this listing lacks (see the module's doc); a zombie of the listing before had
/// no child born after it, and each of its children alive then is in this listing.
fn conclusive(
    listed: &[Process],
    zombies_before: &BTreeSet<(i32, u64)>,
    select: &mut impl FnMut(&[Process]) -> Vec<i32>,
) -> bool {
    let died_since: Vec<Process> = listed
        .iter()
        .map(|process| Process {
            zombie: process.zombie && zombies_before.contains(&(process.pid, process.start_time)),
            ..*process
        })
        .collect();
    select(&died_since).is_empty()
}

/// The zombies of a listing, each as pid and start time.
fn zombies(listed: &[Process]) -> BTreeSet<(i32, u64)> {
    listed
        .iter()
        .filter(|process| process.zombie)
        .map(|process| (process.pid, process.start_time))
        .collect()
}

/// The live descendants of `ancestor` among `processes`.
pub fn descendants(processes: &[Process], ancestor: i32) -> Vec<i32> {
    let mut children = HashMap::<i32, Vec<i32>>::new();
    for process in processes {
        children.entry(process.ppid).or_default().push(process.pid);
    }
    let zombies: BTreeSet<i32> = processes
        .iter()
        .filter(|p| p.zombie)
        .map(|p| p.pid)
        .collect();
    let mut found = Vec::new();
    let mut queue = vec![ancestor];
    while let Some(parent) = queue.pop() {
        for &child in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            if !zombies.contains(&child) {
                found.push(child);
            }
            queue.push(child);
        }
    }
    found
}

/// How many ticks before a moment a process's start may read and still have begun after
/// it: gVisor (runsc 20221219) reports a start up to a tick before the `/proc/uptime` its
/// parent read first.
const SINCE_SLACK: u64 = 2;

/// A moment of the runtime's clock, to tell the processes that began after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Since {
    /// The clock tick it fell in, as `/proc/<pid>/stat` counts start times.
    tick: u64,
    /// The newest pid then, when known.
    last_pid: Option<i32>,
}

impl Since {
    /// The moment `/proc/uptime` read `uptime_centis` hundredths, `last_pid` the newest pid,
    /// on a clock of `ticks_per_second`.
    pub fn new(uptime_centis: u64, last_pid: Option<i32>, ticks_per_second: u64) -> Self {
        Self {
            tick: uptime_centis.saturating_mul(ticks_per_second) / 100,
            last_pid,
        }
    }

    /// Whether `process` began after this moment: in a later tick, or within the
    /// [`SINCE_SLACK`] ticks up to it with a newer pid (pids are handed out in order; a tick
    /// is 10 ms, and two commands of one shell can begin closer together than that).
    /// Without the newest pid, every process of those ticks counts as later.
    pub fn precedes(&self, process: &Process) -> bool {
        process.start_time > self.tick
            || (process.start_time.saturating_add(SINCE_SLACK) >= self.tick
                && self.last_pid.is_none_or(|last| process.pid > last))
    }
}

/// Whether a sweep stops what it found before killing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopping {
    /// Stop every process found, then kill them all: nothing found forks in between.
    First,
    /// Kill at once, oldest first: for a sweep that spares a process of the same process
    /// group.
    Never,
}

/// Stops, then kills, every process `select` picks from each listing (it picks among the
/// live ones), round after round, calling `reap` after each round (the caller's children
/// must be waited for by the caller, who may have to report them), until a listing picks
/// nobody and is [`conclusive`], or the sweep has run for 10 s. Returns how many distinct
/// processes it killed.
pub fn stop_and_kill(
    stopping: Stopping,
    mut select: impl FnMut(&[Process]) -> Vec<i32>,
    mut reap: impl FnMut(),
) -> u64 {
    let started = Instant::now();
    let mut killed = BTreeSet::new();
    let mut zombies_before = BTreeSet::new();
    loop {
        let listed = processes();
        let picked = select(&listed);
        if (picked.is_empty() && conclusive(&listed, &zombies_before, &mut select))
            || started.elapsed() > SWEEP_TIMEOUT
        {
            return killed.len() as u64;
        }
        zombies_before = zombies(&listed);
        let mut picked = picked;
        if stopping == Stopping::Never {
            // Parents before children: a parent outlives its child's kill by no instant in
            // which it could act on that death (a subshell running its next command).
            let start: HashMap<i32, u64> = listed.iter().map(|p| (p.pid, p.start_time)).collect();
            picked.sort_by_key(|pid| (start.get(pid).copied().unwrap_or(u64::MAX), *pid));
        }
        let pids: Vec<Pid> = picked.iter().copied().filter_map(Pid::from_raw).collect();
        // ESRCH only means it is gone already.
        if stopping == Stopping::First {
            for &pid in &pids {
                let _ = rustix::process::kill_process(pid, Signal::STOP);
            }
        }
        for &pid in &pids {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        killed.extend(picked);
        reap();
        // Killed processes may still be settling before they can be reaped.
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: i32, ppid: i32, zombie: bool) -> Process {
        Process {
            pid,
            ppid,
            start_time: 0,
            zombie,
        }
    }

    #[test]
    fn descendants_follow_every_generation_and_skip_zombies() {
        let table = [
            process(1, 0, false),
            process(10, 1, false),
            process(11, 10, false),
            process(12, 11, true),
            process(13, 12, false),
            process(20, 1, false),
        ];
        let mut found = descendants(&table, 10);
        found.sort_unstable();
        assert_eq!(found, vec![11, 13]);
    }

    #[test]
    fn a_listing_is_conclusive_only_when_none_it_would_pick_died_since_the_listing_before() {
        let select = &mut |listed: &[Process]| descendants(listed, 1);
        let died_long_ago = process(10, 1, true);
        let unrelated = process(30, 2, true);
        let before = zombies(&[died_long_ago, unrelated]);
        assert!(conclusive(&[died_long_ago, unrelated], &before, select));
        assert!(conclusive(
            &[died_long_ago, process(31, 2, true)],
            &before,
            select
        ));
        // Alive when the listing began, it may have forked children the listing lacks.
        assert!(!conclusive(
            &[died_long_ago, process(11, 10, true)],
            &before,
            select
        ));
        // The same pid, a later process.
        let reused = Process {
            start_time: 7,
            ..died_long_ago
        };
        assert!(!conclusive(&[reused], &before, select));
    }

    #[test]
    fn a_moment_precedes_later_ticks_and_newer_pids_of_the_ticks_up_to_it() {
        let at = |pid, start_time| Process {
            pid,
            ppid: 1,
            start_time,
            zombie: false,
        };
        // 123.45 s since boot on a 100 Hz clock is tick 12345.
        let since = Since::new(12_345, Some(500), 100);
        let cases = [
            (at(900, 12_342), false, "a tick before the slack"),
            (at(499, 12_345), false, "an older pid of the same tick"),
            (at(500, 12_345), false, "the newest pid then"),
            (at(501, 12_345), true, "a newer pid of the same tick"),
            (at(501, 12_343), true, "a newer pid a clock lag early"),
            (at(499, 12_344), false, "an older pid a tick early"),
            (at(2, 12_346), true, "a later tick, whatever its pid"),
        ];
        for (process, later, what) in cases {
            assert_eq!(since.precedes(&process), later, "{what}");
        }
        let unknown = Since::new(12_345, None, 100);
        assert!(unknown.precedes(&at(2, 12_345)));
        assert!(unknown.precedes(&at(2, 12_343)), "within the clock lag");
        assert!(!unknown.precedes(&at(2, 12_342)));
        // A 250 Hz clock counts 2.5 ticks a hundredth: tick 250.
        assert!(Since::new(100, None, 250).precedes(&at(9, 251)));
        assert!(!Since::new(100, None, 250).precedes(&at(9, 247)));
    }

    #[test]
    fn this_process_appears_in_its_own_listing() {
        let me = std::process::id() as i32;
        let listed = processes();
        let mine = listed.iter().find(|p| p.pid == me).expect("listed");
        assert_eq!(
            mine.ppid,
            rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get())
        );
        assert!(!mine.zombie);
    }
}
