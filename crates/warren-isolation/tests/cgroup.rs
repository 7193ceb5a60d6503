//! Sandbox cgroups against this machine's real cgroupfs.
//!
//! The tests need root and at least one cgroup hierarchy; without them each test says so and
//! returns. Every test names its cgroups `test-<pid>-<what>` and removes them in a `Drop`
//! guard, so a failed assertion leaves no directories behind. Processes are spawned behind a
//! gate (`read` on stdin) and moved into their cgroup before the gate opens, so nothing they
//! do happens outside it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use warren_isolation::cgroup::{remove_stale, CgroupSupport, Limits, SandboxCgroup, ROOT_DIR};

const MIB: u64 = 1024 * 1024;
const SIGKILL: i32 = 9;

/// Set in the environment of the test binary re-executed by the `add_self` test.
const JOIN_ENV: &str = "WARREN_CGROUP_TEST_JOIN";

/// What that helper prints once it has joined.
const JOINED: &str = "warren-cgroup-test-joined";

/// The host's cgroups; these tests need root and a usable hierarchy, and fail saying so
/// rather than skip.
fn support() -> CgroupSupport {
    assert!(
        rustix::process::geteuid().is_root(),
        "the cgroup tests need root: they create cgroups and move processes"
    );
    let support = CgroupSupport::detect().expect("detect cgroup hierarchies");
    assert!(
        support.enforceable().tree_kill,
        "no usable cgroup hierarchy on this host: {:?}",
        support.describe()
    );
    support
}

fn unique(what: &str) -> String {
    format!("test-{}-{what}", std::process::id())
}

/// Kills and removes the named sandboxes when the test ends, however it ends.
struct Cleanup {
    support: CgroupSupport,
    names: Vec<String>,
}

impl Cleanup {
    fn new(support: &CgroupSupport, names: &[&str]) -> Self {
        Self {
            support: support.clone(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in &self.names {
            if let Ok(Some(cgroup)) = SandboxCgroup::open(&self.support, name) {
                if let Err(err) = cgroup.kill_all() {
                    eprintln!("cleanup: cannot kill {name}: {err}");
                }
                if let Err(err) = cgroup.remove() {
                    eprintln!("cleanup: cannot remove {name}: {err}");
                }
            }
        }
    }
}

/// Every directory a sandbox can have, one per hierarchy in use.
fn sandbox_dirs(support: &CgroupSupport, name: &str) -> Vec<PathBuf> {
    let mut roots: Vec<&Path> = support.unified_mount().into_iter().collect();
    let mut controllers = vec!["memory", "pids", "cpu"];
    // A separately mounted cpuacct is only used for CPU usage when v2 can't report it.
    if support.unified_mount().is_none() {
        controllers.push("cpuacct");
    }
    for controller in controllers {
        if let Some(mount) = support.v1_mount(controller) {
            if !roots.contains(&mount) {
                roots.push(mount);
            }
        }
    }
    roots
        .into_iter()
        .map(|root| root.join(ROOT_DIR).join(name))
        .collect()
}

/// The directory whose interface files hold `controller`'s limits for a sandbox.
fn limit_dir(support: &CgroupSupport, name: &str, controller: &str) -> PathBuf {
    let root = support
        .v1_mount(controller)
        .or(support.unified_mount())
        .expect("a hierarchy for the controller");
    root.join(ROOT_DIR).join(name)
}

/// The hierarchy that tracks leafs: v2 if mounted, else v1 pids.
fn leaf_dir(support: &CgroupSupport, name: &str, leaf: &str) -> PathBuf {
    let root = support
        .unified_mount()
        .or(support.v1_mount("pids"))
        .expect("a leaf hierarchy");
    root.join(ROOT_DIR).join(name).join(leaf)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
        .trim()
        .to_owned()
}

fn pids_in(dir: &Path) -> Vec<i32> {
    read(&dir.join("cgroup.procs"))
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// `pid`'s cgroup in the v2 hierarchy (`controller == None`) or the v1 one carrying
/// `controller`, from `/proc/<pid>/cgroup`.
fn cgroup_of(pid: u32, controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let _id = fields.next()?;
        let controllers = fields.next()?;
        let path = fields.next()?;
        let matches = match controller {
            None => controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        matches.then(|| path.to_owned())
    })
}

/// `(state, session id)` from `/proc/<pid>/stat`, `None` once the process is reaped.
fn stat_of(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain anything, so parse after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    Some((fields[0].chars().next()?, fields[3].parse().ok()?))
}

fn is_dead(pid: i32) -> bool {
    matches!(stat_of(pid), None | Some(('Z' | 'X', _)))
}

fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `sh -c` running `script` once a line arrives on stdin; EOF (the test dropped the child
/// without opening the gate) makes it exit instead.
fn gated(script: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!("read _gate || exit 1; {script}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sh")
}

fn open_gate(child: &mut Child) {
    let mut stdin = child.stdin.take().expect("gate");
    writeln!(stdin).expect("open gate");
}

fn pid_of(child: &Child) -> i32 {
    i32::try_from(child.id()).expect("pid fits i32")
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            start.elapsed() < timeout,
            "child {} did not exit",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn limits_are_written_to_the_controller_files() {
    let support = support();
    let name = unique("limits");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let limits = Limits {
        memory_bytes: Some(64 * MIB),
        pids_max: Some(50),
        cpu_millis: Some(500),
    };
    let (_cgroup, unenforced) = SandboxCgroup::create(&support, &name, &limits).unwrap();

    let enforceable = support.enforceable();
    let expected: Vec<&str> = [
        ("memory", enforceable.memory),
        ("pids", enforceable.pids),
        ("cpu", enforceable.cpu),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(c, _)| c)
    .collect();
    assert_eq!(unenforced, expected);

    if enforceable.memory {
        let dir = limit_dir(&support, &name, "memory");
        if support.v1_mount("memory").is_some() {
            assert_eq!(read(&dir.join("memory.limit_in_bytes")), "67108864");
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                assert_eq!(read(&memsw), "67108864");
            }
        } else {
            assert_eq!(read(&dir.join("memory.max")), "67108864");
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                assert_eq!(read(&swap), "0");
            }
        }
    }
    if enforceable.pids {
        assert_eq!(
            read(&limit_dir(&support, &name, "pids").join("pids.max")),
            "50"
        );
    }
    if enforceable.cpu {
        let dir = limit_dir(&support, &name, "cpu");
        if support.v1_mount("cpu").is_some() {
            assert_eq!(read(&dir.join("cpu.cfs_period_us")), "100000");
            assert_eq!(read(&dir.join("cpu.cfs_quota_us")), "50000");
        } else {
            assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        }
    }
}

#[test]
fn creating_again_after_a_crash_reuses_the_cgroup_and_replaces_its_limits() {
    let support = support();
    assert!(
        support.enforceable().memory,
        "this test needs the memory cgroup controller"
    );
    let name = unique("reuse");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let small = Limits {
        memory_bytes: Some(32 * MIB),
        ..Limits::default()
    };
    // The first handle is dropped without `remove`, as a crashed provisioner would.
    drop(SandboxCgroup::create(&support, &name, &small).unwrap());

    // Raising the limit past the old memory+swap limit must not trip the v1 ordering rule.
    let large = Limits {
        memory_bytes: Some(128 * MIB),
        ..Limits::default()
    };
    let (_cgroup, _) = SandboxCgroup::create(&support, &name, &large).unwrap();
    let dir = limit_dir(&support, &name, "memory");
    let file = if support.v1_mount("memory").is_some() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    assert_eq!(read(&dir.join(file)), (128 * MIB).to_string());

    // Unset limits go back to unlimited.
    let (_cgroup, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();
    let value = read(&dir.join(file));
    assert!(
        value == "max" || value.parse::<u64>().unwrap() > 1 << 60,
        "{file} is {value}"
    );
}

#[test]
fn open_finds_an_existing_sandbox_and_returns_none_for_an_unknown_one() {
    let support = support();
    let name = unique("open");
    let _cleanup = Cleanup::new(&support, &[&name]);
    assert!(SandboxCgroup::open(&support, &name).unwrap().is_none());
    let (created, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();
    drop(created);
    let opened = SandboxCgroup::open(&support, &name)
        .unwrap()
        .expect("sandbox");
    assert_eq!(opened.name(), name);
    assert!(opened.is_empty());
}

#[test]
fn add_init_puts_the_process_in_the_init_leaf_of_every_hierarchy() {
    let support = support();
    let name = unique("init");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();

    let mut child = gated("exec sleep 100");
    cgroup.add_init(pid_of(&child)).unwrap();
    open_gate(&mut child);
    wait_until("sh execs sleep", Duration::from_secs(5), || {
        comm_of(child.id()) == "sleep"
    });

    let sandbox = format!("/{ROOT_DIR}/{name}");
    let init = format!("{sandbox}/init");
    if support.unified_mount().is_some() {
        assert_eq!(cgroup_of(child.id(), None), Some(init.clone()));
    }
    if support.v1_mount("pids").is_some() {
        // With v2 present, v1 pids carries only the sandbox-wide limit (no leafs).
        let expected = if support.unified_mount().is_some() {
            sandbox.clone()
        } else {
            init.clone()
        };
        assert_eq!(cgroup_of(child.id(), Some("pids")), Some(expected));
    }
    for controller in ["memory", "cpu"] {
        if support.v1_mount(controller).is_some() {
            assert_eq!(
                cgroup_of(child.id(), Some(controller)),
                Some(sandbox.clone()),
                "{controller}"
            );
        }
    }
    assert!(!cgroup.is_empty());

    cgroup.kill_all().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(SIGKILL));
    assert!(cgroup.is_empty());
}

#[test]
fn killing_an_exec_leaf_takes_down_its_whole_tree_including_a_setsid_grandchild() {
    let support = support();
    let name = unique("tree");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();

    // The init must survive the command's kill.
    let mut init = gated("exec sleep 100");
    cgroup.add_init(pid_of(&init)).unwrap();
    open_gate(&mut init);

    let exec = cgroup.exec_leaf(1).unwrap();
    assert_eq!(exec.name(), "exec-1");
    // `; true` keeps the inner sh from exec'ing its sleep, so the tree has a fixed shape.
    let mut command = gated("setsid sleep 100 & sh -c 'sleep 100; true' & sleep 100 & wait");
    exec.add_pid(pid_of(&command)).unwrap();
    open_gate(&mut command);

    let leaf = leaf_dir(&support, &name, "exec-1");
    let (_, session) = stat_of(pid_of(&command)).expect("sh is alive");
    // sh, the setsid'd sleep, the inner sh and its sleep, and the last sleep, with the
    // first in a session of its own. Both are waited for: a forked child is in the leaf
    // before it has run setsid(2), so five pids alone do not yet make the shape tested.
    wait_until(
        "the tree is up, one process in its own session",
        Duration::from_secs(5),
        || {
            let tree = pids_in(&leaf);
            tree.len() >= 5
                && tree
                    .iter()
                    .any(|&pid| stat_of(pid).is_some_and(|(_, s)| s != session))
        },
    );
    let tree = pids_in(&leaf);

    exec.kill().unwrap();
    assert!(exec.is_empty());
    assert!(pids_in(&leaf).is_empty());
    assert_eq!(command.wait().unwrap().signal(), Some(SIGKILL));
    wait_until("the whole tree is gone", Duration::from_secs(5), || {
        tree.iter().all(|&pid| is_dead(pid))
    });

    assert!(!is_dead(pid_of(&init)), "the init survives");
    assert!(!cgroup.is_empty());
    assert!(exec.cpu_usage_usec().is_some() || support.unified_mount().is_none());
    exec.remove().unwrap();
    assert!(!leaf.exists());

    cgroup.kill_all().unwrap();
    assert_eq!(init.wait().unwrap().signal(), Some(SIGKILL));
}

#[test]
fn kill_all_empties_the_init_and_every_exec_leaf() {
    let support = support();
    let name = unique("killall");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();

    let mut children = Vec::new();
    let mut init = gated("exec sleep 100");
    cgroup.add_init(pid_of(&init)).unwrap();
    open_gate(&mut init);
    children.push(init);
    for n in 1..=2 {
        let exec = cgroup.exec_leaf(n).unwrap();
        let mut command = gated("sleep 100 & sleep 100 & wait");
        exec.add_pid(pid_of(&command)).unwrap();
        open_gate(&mut command);
        children.push(command);
    }
    let leafs = ["init", "exec-1", "exec-2"].map(|leaf| leaf_dir(&support, &name, leaf));
    wait_until("all processes are up", Duration::from_secs(5), || {
        leafs.iter().map(|l| pids_in(l).len()).sum::<usize>() >= 7
    });

    cgroup.kill_all().unwrap();
    assert!(cgroup.is_empty());
    for leaf in &leafs {
        assert!(pids_in(leaf).is_empty(), "{}", leaf.display());
    }
    for mut child in children {
        assert_eq!(child.wait().unwrap().signal(), Some(SIGKILL));
    }
}

#[test]
fn remove_leaves_no_directory_behind_in_any_hierarchy() {
    let support = support();
    let name = unique("remove");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let (cgroup, _) = SandboxCgroup::create(
        &support,
        &name,
        &Limits {
            memory_bytes: Some(64 * MIB),
            pids_max: Some(100),
            cpu_millis: Some(1000),
        },
    )
    .unwrap();
    let dirs = sandbox_dirs(&support, &name);
    assert!(!dirs.is_empty());
    for dir in &dirs {
        assert!(dir.is_dir(), "{} exists after create", dir.display());
    }

    let exec = cgroup.exec_leaf(1).unwrap();
    let _second = cgroup.exec_leaf(2).unwrap();
    let mut command = gated("exec sleep 100");
    exec.add_pid(pid_of(&command)).unwrap();
    open_gate(&mut command);

    cgroup.kill_all().unwrap();
    command.wait().unwrap();
    cgroup.remove().unwrap();
    for dir in &dirs {
        assert!(!dir.exists(), "{} remains after remove", dir.display());
    }
    // The leaf handle outlives its directory; removing it again is fine.
    exec.remove().unwrap();
}

#[test]
fn a_32_mib_memory_limit_gets_a_200_mib_allocation_killed_while_the_test_survives() {
    let support = support();
    assert!(
        support.enforceable().memory,
        "this test needs the memory cgroup controller"
    );
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let name = unique("oom");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let limits = Limits {
        memory_bytes: Some(32 * MIB),
        ..Limits::default()
    };
    let (cgroup, unenforced) = SandboxCgroup::create(&support, &name, &limits).unwrap();
    assert!(unenforced.is_empty() || !unenforced.contains(&"memory"));

    // Placed like init: commands inherit the sandbox-wide limits from it.
    let mut command = gated(&format!(
        "exec {python} -c 'b = bytearray(200 * 1024 * 1024)'"
    ));
    cgroup.add_init(pid_of(&command)).unwrap();
    open_gate(&mut command);

    let status = wait_with_timeout(&mut command, Duration::from_secs(30));
    assert_eq!(
        status.signal(),
        Some(SIGKILL),
        "python exited with {status}"
    );
    let stats = cgroup.stats();
    assert!(
        stats.memory_peak_bytes.is_none_or(|peak| peak <= 32 * MIB),
        "{stats:?}"
    );
}

#[test]
fn pids_max_of_20_makes_a_fork_loop_fail() {
    let support = support();
    assert!(
        support.enforceable().pids,
        "this test needs the pids cgroup controller"
    );
    let name = unique("pids");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let limits = Limits {
        pids_max: Some(20),
        ..Limits::default()
    };
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &limits).unwrap();

    let mut command = gated("for i in $(seq 50); do sleep 5 & done; wait");
    cgroup.add_init(pid_of(&command)).unwrap();
    open_gate(&mut command);

    let status = wait_with_timeout(&mut command, Duration::from_secs(60));
    let stats = cgroup.stats();
    let pids = stats.pids_current;
    assert!(pids.is_some_and(|n| n <= 20), "pids.current {pids:?}");
    // What the reaper compares pids.current with (`process_pressure`), and the forks the
    // limit refused, which it compares between two passes.
    assert_eq!(stats.pids_max, Some(20), "{stats:?}");
    assert!(stats.pids_refused.is_some_and(|n| n > 0), "{stats:?}");
    // The sleeps that did start hold stderr open; kill them before reading it.
    cgroup.kill_all().unwrap();
    let mut stderr = String::new();
    command
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.to_lowercase().contains("fork"),
        "no fork failure reported (status {status}): {stderr:?}"
    );
}

#[test]
fn a_fork_bomb_in_an_exec_leaf_is_killed_whole_counted_and_left_thawed() {
    let support = support();
    // Without a pids limit the bomb would take every pid of the host from the tests and
    // services beside it: refuse to start it rather than find out.
    assert!(
        support.enforceable().pids,
        "this host's cgroups enforce no pids limit, so a fork bomb cannot be contained: {support:?}"
    );
    let name = unique("bomb");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let limits = Limits {
        pids_max: Some(64),
        ..Limits::default()
    };
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &limits).unwrap();
    let mut init = gated("exec sleep 100");
    cgroup.add_init(pid_of(&init)).unwrap();
    open_gate(&mut init);

    let exec = cgroup.exec_leaf(1).unwrap();
    // Thirty sleepers that cannot die out on their own (a bomb alone under 64 pids may
    // collapse), and a bomb churning beside them.
    let mut bomb = gated(
        "for i in $(seq 30); do sleep 100 & done; bomb() { bomb | bomb & }; bomb; exec sleep 100",
    );
    // As a command is: forked by init, so in the sandbox's cgroups (on a host with v1 pids
    // beside v2, the pids limit is the v1 sandbox's), then into its v2 exec leaf. Moved
    // into the leaf alone, the bomb ran under no pids limit and, before the kill, took
    // every pid of the host from the tests beside it (fork: EAGAIN).
    cgroup.add_init(pid_of(&bomb)).unwrap();
    exec.add_pid(pid_of(&bomb)).unwrap();
    open_gate(&mut bomb);
    let leaf = leaf_dir(&support, &name, "exec-1");
    wait_until("the bomb fills the leaf", Duration::from_secs(10), || {
        pids_in(&leaf).len() >= 31
    });

    let killed = exec.kill().unwrap();
    assert!(killed >= 31, "only {killed} processes counted");
    assert!(pids_in(&leaf).is_empty());
    // Nothing forked back in after the kill returned.
    std::thread::sleep(Duration::from_millis(100));
    assert!(pids_in(&leaf).is_empty());
    // Frozen for the kill, thawed after: a leaf is never left frozen.
    if support.unified_mount().is_some() {
        assert_eq!(read(&leaf.join("cgroup.freeze")), "0");
    } else if let Some(freezer) = support.v1_mount("freezer") {
        let state = freezer
            .join(ROOT_DIR)
            .join(&name)
            .join("exec-1/freezer.state");
        assert_eq!(read(&state), "THAWED");
    }
    assert!(!is_dead(pid_of(&init)), "the init survives");
    let _ = bomb.wait();
    cgroup.kill_all().unwrap();
    let _ = init.wait();
}

#[test]
fn stats_report_memory_pids_and_cpu_of_the_sandbox() {
    let support = support();
    let name = unique("stats");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();
    let empty = cgroup.stats();

    let mut init = gated("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 100");
    cgroup.add_init(pid_of(&init)).unwrap();
    open_gate(&mut init);
    wait_until("the busy loop ends", Duration::from_secs(30), || {
        comm_of(init.id()) == "sleep"
    });

    let stats = cgroup.stats();
    let enforceable = support.enforceable();
    if enforceable.memory {
        assert!(
            stats.memory_current_bytes.is_some_and(|b| b > 0),
            "{stats:?}"
        );
        assert!(stats.memory_peak_bytes.is_some(), "{stats:?}");
    }
    if enforceable.pids {
        assert_eq!(stats.pids_current, Some(1), "{stats:?}");
        assert_eq!(empty.pids_current, Some(0));
    }
    if support.unified_mount().is_some() || support.v1_mount("cpuacct").is_some() {
        assert!(stats.cpu_usage_usec.is_some_and(|u| u > 0), "{stats:?}");
    }

    cgroup.kill_all().unwrap();
    init.wait().unwrap();
}

#[test]
fn remove_stale_removes_what_keep_rejects_and_only_that() {
    let support = support();
    let stale = unique("stale");
    let kept = unique("kept");
    let _cleanup = Cleanup::new(&support, &[&stale, &kept]);
    let (stale_cgroup, _) = SandboxCgroup::create(&support, &stale, &Limits::default()).unwrap();
    let (_kept_cgroup, _) = SandboxCgroup::create(&support, &kept, &Limits::default()).unwrap();

    // A leftover runtime in the stale sandbox must be killed on the way.
    let mut leftover = gated("exec sleep 100");
    stale_cgroup.add_init(pid_of(&leftover)).unwrap();
    open_gate(&mut leftover);
    drop(stale_cgroup);

    // Other tests run concurrently: keep everything but the stale sandbox.
    let removed = remove_stale(&support, &|name| name != stale).unwrap();
    assert_eq!(removed, vec![stale.clone()]);
    assert_eq!(leftover.wait().unwrap().signal(), Some(SIGKILL));
    assert!(SandboxCgroup::open(&support, &stale).unwrap().is_none());
    for dir in sandbox_dirs(&support, &stale) {
        assert!(!dir.exists(), "{}", dir.display());
    }
    assert!(SandboxCgroup::open(&support, &kept).unwrap().is_some());
}

/// Not a test on its own: run by `add_self_moves_the_calling_process_into_the_exec_leaf` in
/// a re-executed test binary (by its exact name, with `--ignored`), where it joins `exec-7`
/// of the named sandbox and waits.
#[test]
#[ignore = "a helper, run by add_self_moves_the_calling_process_into_the_exec_leaf"]
fn helper_joins_an_exec_leaf_when_run_by_the_add_self_test() {
    let name = std::env::var(JOIN_ENV).expect("run by the add_self test, which names the sandbox");
    let support = CgroupSupport::detect().unwrap();
    let cgroup = SandboxCgroup::open(&support, &name)
        .unwrap()
        .expect("sandbox exists");
    let exec = cgroup.exec_leaf(7).unwrap();
    exec.add_self().unwrap();
    println!("{JOINED}");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(100));
}

#[test]
fn add_self_moves_the_calling_process_into_the_exec_leaf() {
    let support = support();
    let name = unique("self");
    let _cleanup = Cleanup::new(&support, &[&name]);
    let (cgroup, _) = SandboxCgroup::create(&support, &name, &Limits::default()).unwrap();
    let exec = cgroup.exec_leaf(7).unwrap();
    assert!(exec.is_empty());

    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_joins_an_exec_leaf_when_run_by_the_add_self_test",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(JOIN_ENV, &name)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(helper.stdout.take().unwrap());
    let joined = stdout
        .lines()
        .map_while(Result::ok)
        // libtest prints `test <name> ... ` before the test's own output, on the same line.
        .any(|line| line.contains(JOINED));
    assert!(joined, "the helper did not join");

    let leaf = format!("/{ROOT_DIR}/{name}/exec-7");
    if support.unified_mount().is_some() {
        assert_eq!(cgroup_of(helper.id(), None), Some(leaf.clone()));
    }
    if support.v1_mount("pids").is_some() && support.unified_mount().is_none() {
        assert_eq!(cgroup_of(helper.id(), Some("pids")), Some(leaf));
    }
    assert!(!exec.is_empty());

    exec.kill().unwrap();
    assert_eq!(helper.wait().unwrap().signal(), Some(SIGKILL));
    assert!(exec.is_empty());
}
