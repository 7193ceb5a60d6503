//! The runtime seccomp filter against the real kernel.
//!
//! Each test forks `/usr/bin/python3`, installs the filter between fork and exec (after
//! `setsid` and `no_new_privs`, as the runtime does), and has the script attempt syscalls
//! through ctypes' `syscall(2)`, printing `name result` per attempt: `OK` or the errno's
//! name. The children keep the test's uid, so under root most attempts would reach the
//! kernel's own argument checks; where a host refuses a call with EPERM by itself (an LSM,
//! lockdown, a container), errno alone cannot tell who denied it, and the unit tests, which
//! run the compiled BPF in an interpreter, cover that rule.
//!
//! The arguments are chosen so that every attempt would fail harmlessly (bad flags, NULL
//! pointers, fd -1, a path that does not exist) even if the filter let it through.
//! Syscall numbers come from `libc::SYS_*`, which are x86_64's here.
#![cfg(target_arch = "x86_64")]

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use libc::c_long;
use warren_agent::seccomp::SeccompProgram;

/// Helpers every script starts with.
const PRELUDE: &str = r#"
import ctypes, errno, os, subprocess, sys, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def raw(nr, *args):
    conv = [ctypes.c_ulong(a & 0xFFFFFFFFFFFFFFFF) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *conv)
    return ret, ctypes.get_errno()

def probe(name, nr, *args):
    ret, err = raw(nr, *args)
    result = "OK" if ret >= 0 else errno.errorcode.get(err, str(err))
    print(name, result, flush=True)

def check(name, action):
    try:
        action()
        print(name, "OK", flush=True)
    except BaseException as e:
        print(name, "FAILED:" + repr(e).replace(" ", "_").replace("\n", "_"), flush=True)
"#;

const CLONE_THREAD: u64 = 0x0001_0000;
const CLONE_NEWUTS: u64 = 0x0400_0000;
const CLONE_NEWUSER: u64 = 0x1000_0000;

/// `(name, number, python arguments)`: one attempt per syscall the policy denies outright,
/// each with arguments the kernel would reject anyway.
const DENIED: &[(&str, c_long, &str)] = &[
    ("ptrace", libc::SYS_ptrace, "0xdead, 0, 0, 0"),
    (
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        "os.getpid(), None, 0, None, 0, 1",
    ),
    (
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        "os.getpid(), None, 0, None, 0, 1",
    ),
    (
        "kcmp",
        libc::SYS_kcmp,
        "os.getpid(), os.getpid(), 0xdead, 0, 0",
    ),
    ("pidfd_getfd", libc::SYS_pidfd_getfd, "-1, 0, 0"),
    ("unshare", libc::SYS_unshare, "0x10000000"),
    ("setns", libc::SYS_setns, "-1, 0"),
    ("mount", libc::SYS_mount, "None, None, None, 0, None"),
    ("umount2", libc::SYS_umount2, "None, 0"),
    ("pivot_root", libc::SYS_pivot_root, "None, None"),
    ("chroot", libc::SYS_chroot, "None"),
    ("fsopen", libc::SYS_fsopen, "None, 0"),
    ("fsconfig", libc::SYS_fsconfig, "-1, 0, None, None, 0"),
    ("fsmount", libc::SYS_fsmount, "-1, 0, 0"),
    ("fspick", libc::SYS_fspick, "-1, None, 0"),
    ("move_mount", libc::SYS_move_mount, "-1, None, -1, None, 0"),
    ("open_tree", libc::SYS_open_tree, "-1, None, 0"),
    (
        "mount_setattr",
        libc::SYS_mount_setattr,
        "-1, None, 0, None, 0",
    ),
    ("bpf", libc::SYS_bpf, "0xdead, None, 0"),
    (
        "perf_event_open",
        libc::SYS_perf_event_open,
        "None, 0, -1, -1, 0",
    ),
    ("userfaultfd", libc::SYS_userfaultfd, "0xdead"),
    ("io_uring_setup", libc::SYS_io_uring_setup, "0, None"),
    (
        "io_uring_enter",
        libc::SYS_io_uring_enter,
        "-1, 0, 0, 0, None, 0",
    ),
    (
        "io_uring_register",
        libc::SYS_io_uring_register,
        "-1, 0, None, 0",
    ),
    ("keyctl", libc::SYS_keyctl, "0xdead, 0, 0, 0, 0"),
    ("add_key", libc::SYS_add_key, "None, None, None, 0, 0"),
    ("request_key", libc::SYS_request_key, "None, None, None, 0"),
    ("init_module", libc::SYS_init_module, "None, 0, None"),
    ("finit_module", libc::SYS_finit_module, "-1, None, 0"),
    ("delete_module", libc::SYS_delete_module, "None, 0"),
    ("kexec_load", libc::SYS_kexec_load, "0, 0, None, 0x80"),
    (
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        "-1, -1, 0, None, 0x80",
    ),
    ("reboot", libc::SYS_reboot, "0, 0, 0, None"),
    ("swapon", libc::SYS_swapon, "None, 0"),
    ("swapoff", libc::SYS_swapoff, "None"),
    (
        "acct",
        libc::SYS_acct,
        "b'/nonexistent/warren-seccomp-test'",
    ),
    ("quotactl", libc::SYS_quotactl, "0, None, 0, None"),
    ("quotactl_fd", libc::SYS_quotactl_fd, "-1, 0, 0, None"),
    ("syslog", libc::SYS_syslog, "0xdead, None, 0"),
    // Harmless here: the child has called setsid(), so it has no terminal to hang up.
    ("vhangup", libc::SYS_vhangup, ""),
    ("settimeofday", libc::SYS_settimeofday, "None, None"),
    ("clock_settime", libc::SYS_clock_settime, "0xdead, None"),
    ("clock_adjtime", libc::SYS_clock_adjtime, "0xdead, None"),
    ("adjtimex", libc::SYS_adjtimex, "None"),
    (
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        "-1, None, 0",
    ),
    (
        "name_to_handle_at",
        libc::SYS_name_to_handle_at,
        "-1, None, None, None, 0",
    ),
    ("lookup_dcookie", libc::SYS_lookup_dcookie, "0, None, 0"),
    ("iopl", libc::SYS_iopl, "4"),
    ("ioperm", libc::SYS_ioperm, "0, 0, 0"),
    ("uselib", libc::SYS_uselib, "None"),
];

/// Runs `body` (after [`PRELUDE`]) in a fresh python, under the runtime filter or not, and
/// returns its `name result` lines. The script gets a scratch directory as `sys.argv[1]`.
fn run_python(body: &str, filtered: bool) -> HashMap<String, String> {
    let scratch = tempfile::tempdir().expect("scratch directory");
    let program = SeccompProgram::runtime_policy().expect("the runtime policy compiles");
    let mut command = Command::new("/usr/bin/python3");
    command
        .arg("-c")
        .arg(format!("{PRELUDE}\n{body}"))
        .arg(scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    install_in_child(&mut command, program, filtered);
    let output = command.output().expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, result)| (name.to_owned(), result.to_owned()))
        .collect()
}

/// Makes `command`'s child drop its terminal (`setsid`) and, if `filtered`, set
/// `no_new_privs` and install `program`, between fork and exec.
#[allow(unsafe_code)]
fn install_in_child(command: &mut Command, program: SeccompProgram, filtered: bool) {
    let hook = move || -> std::io::Result<()> {
        rustix::process::setsid()?;
        if filtered {
            rustix::thread::set_no_new_privs(true)?;
            // The error holds an OS errno and nothing allocated; report it without allocating.
            program
                .apply()
                .map_err(|_| std::io::Error::last_os_error())?;
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child of a multi-threaded process, where only
    // async-signal-safe work is sound. It makes three plain syscalls (setsid, prctl,
    // seccomp) through rustix and seccompiler, neither of which allocates, locks or touches
    // thread-local state; `SeccompProgram::apply` is documented and written to that end,
    // and `program` was fully built before the fork.
    unsafe {
        command.pre_exec(hook);
    }
}

fn probe_line(name: &str, nr: c_long, args: &str) -> String {
    if args.is_empty() {
        format!("probe({name:?}, {nr})\n")
    } else {
        format!("probe({name:?}, {nr}, {args})\n")
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn assert_result(results: &HashMap<String, String>, name: &str, expected: &str) {
    assert_eq!(
        results.get(name).map(String::as_str),
        Some(expected),
        "{name}: {results:?}"
    );
}

/// `(name, domain, type, protocol)`: socket families the policy refuses (EAFNOSUPPORT).
const REFUSED_FAMILIES: &[(&str, u64, u64, u64)] = &[
    ("vsock", 40, 1, 0),                 // AF_VSOCK, SOCK_STREAM
    ("packet", 17, 3, 0),                // AF_PACKET, SOCK_RAW
    ("key", 15, 3, 2),                   // AF_KEY, SOCK_RAW, PF_KEY_V2
    ("alg", 38, 5, 0),                   // AF_ALG, SOCK_SEQPACKET
    ("bluetooth", 31, 3, 0),             // AF_BLUETOOTH, SOCK_RAW
    ("tipc", 30, 5, 0),                  // AF_TIPC, SOCK_SEQPACKET
    ("rds", 21, 5, 0),                   // AF_RDS, SOCK_SEQPACKET
    ("xdp", 44, 3, 0),                   // AF_XDP, SOCK_RAW
    ("unspec", 0, 1, 0),                 // AF_UNSPEC
    ("vsock_high", 0x1_0000_0028, 1, 0), // AF_VSOCK with high bits: the kernel reads an int
    ("netlink_uevent", 16, 2, 15),       // AF_NETLINK, SOCK_DGRAM, NETLINK_KOBJECT_UEVENT
    ("netlink_audit", 16, 3, 9),         // AF_NETLINK, SOCK_RAW, NETLINK_AUDIT
];

/// `(name, domain, type, protocol)`: socket families tools need, which stay allowed.
const ALLOWED_FAMILIES: &[(&str, u64, u64, u64)] = &[
    ("unix", 1, 1, 0),              // AF_UNIX, SOCK_STREAM
    ("inet", 2, 1, 0),              // AF_INET, SOCK_STREAM
    ("inet6", 10, 2, 0),            // AF_INET6, SOCK_DGRAM
    ("netlink", 16, 3, 0),          // AF_NETLINK, SOCK_RAW, NETLINK_ROUTE
    ("netlink_diag", 16, 3, 4),     // AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG
    ("netlink_generic", 16, 3, 16), // AF_NETLINK, SOCK_RAW, NETLINK_GENERIC
];

fn socket_probes() -> String {
    let mut script = String::new();
    for (name, domain, kind, protocol) in REFUSED_FAMILIES.iter().chain(ALLOWED_FAMILIES) {
        script.push_str(&probe_line(
            &format!("socket_{name}"),
            libc::SYS_socket,
            &format!("{domain:#x}, {kind}, {protocol}"),
        ));
    }
    // socketpair takes a family too (AF_UNIX and AF_TIPC implement it).
    for (name, domain) in [("unix", 1), ("tipc", 30), ("vsock", 40)] {
        script.push_str(&probe_line(
            &format!("socketpair_{name}"),
            libc::SYS_socketpair,
            &format!("{domain}, 5, 0, (ctypes.c_int * 2)()"),
        ));
    }
    script
}

#[test]
fn socket_families_a_sandbox_does_not_need_fail_with_eafnosupport() {
    let results = run_python(&socket_probes(), true);
    for (name, ..) in REFUSED_FAMILIES {
        assert_result(&results, &format!("socket_{name}"), "EAFNOSUPPORT");
    }
    for (name, ..) in ALLOWED_FAMILIES {
        assert_result(&results, &format!("socket_{name}"), "OK");
    }
    assert_result(&results, "socketpair_unix", "OK");
    assert_result(&results, "socketpair_tipc", "EAFNOSUPPORT");
    assert_result(&results, "socketpair_vsock", "EAFNOSUPPORT");
}

#[test]
fn without_the_filter_root_can_open_a_packet_socket() {
    assert!(
        is_root(),
        "this control test needs root: AF_PACKET proves the filter is what refuses families"
    );
    let results = run_python(&socket_probes(), false);
    assert_result(&results, "socket_packet", "OK");
    assert_result(&results, "socket_netlink_uevent", "OK");
}

#[test]
fn every_syscall_denied_outright_has_a_probe() {
    for name in SeccompProgram::denied_syscalls() {
        if name == "clone3" {
            continue; // ENOSYS, probed on its own below.
        }
        assert!(
            DENIED.iter().any(|(probed, _, _)| *probed == name),
            "{name} has no probe"
        );
    }
}

#[test]
fn denied_syscalls_fail_with_eperm_under_the_filter() {
    let script: String = DENIED
        .iter()
        .map(|(name, nr, args)| probe_line(name, *nr, args))
        .collect();
    let results = run_python(&script, true);
    let wrong: Vec<String> = DENIED
        .iter()
        .filter(|(name, _, _)| results.get(*name).map(String::as_str) != Some("EPERM"))
        .map(|(name, _, _)| format!("{name}={:?}", results.get(*name)))
        .collect();
    assert!(wrong.is_empty(), "not EPERM: {wrong:?}");
}

#[test]
fn clone3_fails_with_enosys_under_the_filter() {
    let results = run_python(&probe_line("clone3", libc::SYS_clone3, "None, 0"), true);
    assert_result(&results, "clone3", "ENOSYS");
}

#[test]
fn clone_with_a_namespace_flag_fails_with_eperm_but_plain_clone_reaches_the_kernel() {
    // CLONE_THREAD without CLONE_SIGHAND makes the kernel refuse with EINVAL before it
    // creates anything, so no attempt can fork the interpreter even unfiltered.
    let flags: [(&str, u64); 8] = [
        ("newns", 0x0002_0000),
        ("newcgroup", 0x0200_0000),
        ("newuts", CLONE_NEWUTS),
        ("newipc", 0x0800_0000),
        ("newuser", CLONE_NEWUSER),
        ("newpid", 0x2000_0000),
        ("newnet", 0x4000_0000),
        ("newtime", 0x0000_0080),
    ];
    let mut script: String = flags
        .iter()
        .map(|(name, flag)| {
            probe_line(
                &format!("clone_{name}"),
                libc::SYS_clone,
                &format!("{:#x}, 0, None, None, 0", flag | CLONE_THREAD),
            )
        })
        .collect();
    script.push_str(&probe_line(
        "clone_plain",
        libc::SYS_clone,
        &format!("{CLONE_THREAD:#x}, 0, None, None, 0"),
    ));
    let results = run_python(&script, true);
    for (name, _) in flags {
        assert_result(&results, &format!("clone_{name}"), "EPERM");
    }
    assert_result(&results, "clone_plain", "EINVAL");
}

#[test]
fn unshare_of_a_user_namespace_fails_with_eperm() {
    let script = probe_line(
        "unshare_newuser",
        libc::SYS_unshare,
        &CLONE_NEWUSER.to_string(),
    );
    let results = run_python(&script, true);
    assert_result(&results, "unshare_newuser", "EPERM");
}

#[test]
fn terminal_injection_ioctls_fail_with_eperm_but_other_ioctls_reach_the_kernel() {
    // stdin is /dev/null: the kernel itself would answer ENOTTY.
    let buffer = "ctypes.create_string_buffer(64)";
    let script = [
        ("tiocsti", "0x5412"),
        ("tiocsti_high_bits", "0x100005412"),
        ("tioclinux", "0x541C"),
        ("tiocgwinsz", "0x5413"),
    ]
    .iter()
    .map(|(name, request)| probe_line(name, libc::SYS_ioctl, &format!("0, {request}, {buffer}")))
    .collect::<String>();
    let results = run_python(&script, true);
    assert_result(&results, "tiocsti", "EPERM");
    assert_result(&results, "tiocsti_high_bits", "EPERM");
    assert_result(&results, "tioclinux", "EPERM");
    assert_result(&results, "tiocgwinsz", "ENOTTY");
}

#[test]
fn personality_can_be_queried_but_not_changed() {
    let script = [
        ("query", "0xffffffff"),
        ("per_linux", "0"),
        ("uname26", "8"),
        ("addr_no_randomize", "0x0040000"),
    ]
    .iter()
    .map(|(name, persona)| probe_line(name, libc::SYS_personality, persona))
    .collect::<String>();
    let results = run_python(&script, true);
    assert_result(&results, "query", "OK");
    assert_result(&results, "per_linux", "OK");
    assert_result(&results, "uname26", "EPERM");
    assert_result(&results, "addr_no_randomize", "EPERM");
}

#[test]
fn fork_threads_files_and_subprocesses_still_work_under_the_filter() {
    let script = r#"
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7, status

def thread():
    seen = []
    t = threading.Thread(target=lambda: seen.append(threading.get_native_id()))
    t.start()
    t.join()
    assert seen and seen[0] != threading.get_native_id(), seen

def files():
    path = os.path.join(sys.argv[1], "note.txt")
    with open(path, "w") as f:
        f.write("hello")
    with open(path) as f:
        assert f.read() == "hello"

def shell():
    r = subprocess.run(["/bin/sh", "-c", "echo ok"], capture_output=True)
    assert r.returncode == 0 and r.stdout == b"ok\n", r

def inherited():
    r = subprocess.run(["/bin/sh", "-c", "grep '^Seccomp:' /proc/self/status"], capture_output=True)
    assert r.stdout.split() == [b"Seccomp:", b"2"], r

for name, action in [("fork", fork), ("thread", thread), ("files", files), ("shell", shell), ("inherited", inherited)]:
    check(name, action)
"#;
    let results = run_python(script, true);
    for name in ["fork", "thread", "files", "shell", "inherited"] {
        assert_result(&results, name, "OK");
    }
}

#[test]
fn without_the_filter_root_can_unshare_a_uts_namespace() {
    assert!(
        is_root(),
        "this control test needs root: unshare(CLONE_NEWUTS) proves the filter is what denies it"
    );
    let mut script = probe_line(
        "unshare_newuts",
        libc::SYS_unshare,
        &CLONE_NEWUTS.to_string(),
    );
    // The same attempts the filter answers with EPERM and ENOSYS get the kernel's own
    // answer here: proof the probes are harmless and the filter is what denies them.
    for (name, nr, args) in DENIED {
        script.push_str(&probe_line(name, *nr, args));
    }
    script.push_str(&probe_line(
        "clone_newuser",
        libc::SYS_clone,
        &format!("{:#x}, 0, None, None, 0", CLONE_NEWUSER | CLONE_THREAD),
    ));
    script.push_str(&probe_line("clone3", libc::SYS_clone3, "None, 0"));
    let results = run_python(&script, false);
    assert_result(&results, "unshare_newuts", "OK");
    assert_result(&results, "clone_newuser", "EINVAL");
    assert_result(&results, "clone3", "EINVAL");
    // These fail argument checks (a bad fd, bad flags, no such process) before any
    // permission check, whatever the host's security modules say.
    for name in [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "setns",
        "pidfd_getfd",
        "io_uring_enter",
        "quotactl_fd",
    ] {
        let answer = results.get(name).map(String::as_str);
        assert!(
            answer.is_some_and(|a| a != "EPERM"),
            "{name} answered {answer:?} without the filter"
        );
    }

    let filtered = run_python(
        &probe_line(
            "unshare_newuts",
            libc::SYS_unshare,
            &CLONE_NEWUTS.to_string(),
        ),
        true,
    );
    assert_result(&filtered, "unshare_newuts", "EPERM");
}
