//! Killing processes found through the runtime's own `/proc`, where no cgroup holds them:
//! a Docker container (the agent and its command supervisors have no cgroup of their own)
//! and an unprivileged runtime (no cgroups at all).
//!
//! A process found in one listing and killed in the next step may have forked meanwhile;
//! its child is not in the listing. So every round first stops (SIGSTOP) each process it
//! found, which keeps a stopped process from forking again, then kills them (SIGKILL
//! works on stopped processes), and rounds repeat until a listing finds nobody: a fork
//! bomb can only add what it forked between one listing and its SIGSTOP (I24).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// How long a sweep keeps going before it gives up on processes that will not die.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(10);

/// One process of the pid namespace, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Process {
    pub pid: i32,
    pub ppid: i32,
    /// Exited but not yet reaped: nothing left to signal, only to reap.
    pub zombie: bool,
}

/// Every process of the caller's pid namespace, from its `/proc`.
pub(crate) fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields 3 (state) and 4 (ppid); the command name (field 2) may hold spaces
            // and parentheses, so count from the last ')'.
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            Some(Process {
                pid,
                ppid,
                zombie: state == "Z" || state == "X",
            })
        })
        .collect()
}

/// The live descendants of `ancestor` among `processes`.
pub(crate) fn descendants(processes: &[Process], ancestor: i32) -> Vec<i32> {
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

/// Stops, then kills, every process `select` picks from each listing, round after round,
/// calling `reap` after each round (the caller's children must be waited for by the
/// caller, who may have to report them), until a listing picks nobody or the sweep has
/// run for 10 s. Returns how many distinct processes it killed.
pub(crate) fn stop_and_kill(
    mut select: impl FnMut(&[Process]) -> Vec<i32>,
    mut reap: impl FnMut(),
) -> u64 {
    let started = Instant::now();
    let mut killed = BTreeSet::new();
    loop {
        let picked = select(&processes());
        if picked.is_empty() || started.elapsed() > SWEEP_TIMEOUT {
            return killed.len() as u64;
        }
        let pids: Vec<Pid> = picked.iter().copied().filter_map(Pid::from_raw).collect();
        // ESRCH only means it is gone already.
        for &pid in &pids {
            let _ = rustix::process::kill_process(pid, Signal::STOP);
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
        Process { pid, ppid, zombie }
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

    /// Set for the helper process the fork-bomb test re-executes this test binary as.
    const SWEEP_HELPER_ENV: &str = "WARREN_SWEEP_TEST_HELPER";

    /// Only does something as the helper: becomes a subreaper (as a container's command
    /// supervisor is), waits for its gate (its parent put it into a cgroup with a pids
    /// limit meanwhile), starts a fork bomb, lets it grow, sweeps its subtree, and prints
    /// how many it killed and how many descendants were left.
    #[test]
    fn helper_sweeps_a_fork_bomb_when_run_by_the_sweep_test() {
        if std::env::var_os(SWEEP_HELPER_ENV).is_none() {
            return;
        }
        use std::io::BufRead;
        rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
        let mut gate = String::new();
        std::io::stdin().lock().read_line(&mut gate).unwrap();
        // Never a bomb without its pids limit: only inside the cgroup the test made.
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert!(
            cgroups
                .lines()
                .any(|l| l.contains("/warren/test-") && l.contains("-sweep")),
            "the helper is not in the test's pids cgroup: {cgroups}"
        );
        // Twenty sleepers that cannot die out on their own, and a bomb churning beside them.
        let mut bomb = std::process::Command::new("sh")
            .args([
                "-c",
                "for i in $(seq 20); do sleep 100 & done; bomb() { bomb | bomb & }; bomb; exec sleep 100",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while descendants(&processes(), me).len() < 21 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let killed = stop_and_kill(
            |listed| descendants(listed, me),
            || while let Ok(Some(_)) = crate::sys::wait4_nohang(-1) {},
        );
        let left = descendants(&processes(), me).len();
        // Already reaped by the sweep's `wait4(-1)`, like every other descendant.
        let _ = bomb.wait();
        println!("SWEPT killed={killed} left={left}");
    }

    #[test]
    fn a_fork_bomb_is_stopped_and_killed_until_no_descendant_is_left() {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root: it bounds the bomb with a pids cgroup"
        );
        let support = crate::cgroup::CgroupSupport::detect().unwrap();
        assert!(
            support.enforceable().pids,
            "this test needs the pids controller"
        );
        let name = format!("test-{}-sweep", std::process::id());
        let limits = crate::cgroup::Limits {
            pids_max: Some(64),
            ..Default::default()
        };
        let (cgroup, _) = crate::cgroup::SandboxCgroup::create(&support, &name, &limits).unwrap();
        let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "runtime::sweep::tests::helper_sweeps_a_fork_bomb_when_run_by_the_sweep_test",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SWEEP_HELPER_ENV, "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let joined = cgroup.add_init(helper.id() as i32);
        {
            use std::io::Write;
            let mut gate = helper.stdin.take().unwrap();
            let _ = gate.write_all(b"go\n");
        }
        let output = helper.wait_with_output().unwrap();
        // Whatever happened, nothing of the bomb may outlive the test.
        let _ = cgroup.kill_all();
        let _ = cgroup.remove();
        joined.unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("SWEPT ").map(|(_, rest)| rest.to_owned()))
            .unwrap_or_else(|| panic!("the helper reported nothing: {text}"));
        let field = |key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                .unwrap()
        };
        assert_eq!(field("left"), 0, "{line}");
        assert!(field("killed") >= 21, "{line}");
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
