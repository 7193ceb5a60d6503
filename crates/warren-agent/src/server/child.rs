//! What happens in a command's process between `fork` and `execve`, in init.
//!
//! The order matters: join the command's cgroup and session while still root, switch to
//! 1000:1000 (I11), which clears every capability (init already emptied the bounding
//! set), set `no_new_privs`, install the seccomp filter last (it must still allow
//! `execve`), enter the working directory *as the sandbox user* so its permissions apply,
//! and exec. Landlock is inherited from init (`confine`).

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use crate::environment::{SANDBOX_GID, SANDBOX_UID};
use crate::protocol::ExecSpec;
use crate::seccomp::SeccompProgram;
use crate::server::CommandGroup;
use crate::sys;

/// Who the process is before it becomes the sandbox user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// Root of the runtime (init as root): every id is switched and groups dropped.
    Root,
    /// 1000:1000 of the runtime's own user namespace, holding that namespace's capabilities.
    UserNamespace,
    /// Already 1000:1000 with no capability: the agent in a container.
    AlreadySandboxUser,
    /// Root of a gVisor sandbox (issue 19): every id is switched and groups dropped, as
    /// for `Root`, but there is no cgroup namespace to make (the Sentry has none; the
    /// command's group is in the Sentry's own hierarchy, which it never sees mounted).
    SentryRoot,
}

/// Runs in the forked child; never returns. A failure is written to `error_pipe` as
/// "<stage> <errno>" and the child exits 127.
pub(crate) fn exec_command(
    spec: &ExecSpec,
    stdio: [OwnedFd; 3],
    cgroup: Option<&dyn CommandGroup>,
    seccomp: &SeccompProgram,
    nofile: u64,
    credentials: Credentials,
    error_pipe: OwnedFd,
) -> ! {
    let fail = |stage: &str, errno: i32| -> ! {
        let _ = rustix::io::write(&error_pipe, format!("{stage} {errno}").as_bytes());
        sys::exit_immediately(127)
    };
    let errno = |e: rustix::io::Errno| e.raw_os_error();
    sys::reset_signals();
    // Spawned straight into its cgroup when possible (see init); otherwise join it now.
    if let Some(cgroup) = cgroup.filter(|c| c.spawn_target().is_none()) {
        if let Err(e) = cgroup.add_self() {
            fail("cgroup", errno(e));
        }
    }
    // A cgroup namespace rooted at the command's own cgroup: /proc/self/cgroup inside shows
    // "/" and nothing of the host's hierarchy. (Init cannot unshare it earlier: moving a
    // process into a cgroup outside the mover's namespace root is refused.) A container
    // already has its own, and no capability to make another.
    if matches!(credentials, Credentials::Root | Credentials::UserNamespace) {
        if let Err(e) = sys::unshare(rustix::thread::UnshareFlags::NEWCGROUP) {
            fail("cgroup namespace", e.raw_os_error().unwrap_or(0));
        }
    }
    if let Err(e) = sys::setsid() {
        fail("setsid", e.raw_os_error().unwrap_or(0));
    }
    let [stdin, stdout, stderr] = stdio;
    for (result, stage) in [
        (rustix::stdio::dup2_stdin(&stdin), "stdin"),
        (rustix::stdio::dup2_stdout(&stdout), "stdout"),
        (rustix::stdio::dup2_stderr(&stderr), "stderr"),
    ] {
        if let Err(e) = result {
            fail(stage, errno(e));
        }
    }
    drop((stdin, stdout, stderr));
    // On a terminal (`pty`), the terminal becomes the controlling one of the session just
    // made: Ctrl-C and the size's SIGWINCH reach its foreground process group.
    if spec.pty.is_some() {
        if let Err(e) = rustix::process::ioctl_tiocsctty(rustix::stdio::stdin()) {
            fail("controlling terminal", errno(e));
        }
    }
    if let Err(e) = sys::cloexec_from(3) {
        fail("fds", e.raw_os_error().unwrap_or(0));
    }
    let limit = rustix::process::Rlimit {
        current: Some(nofile),
        maximum: Some(nofile),
    };
    if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Nofile, limit) {
        fail("rlimit", errno(e));
    }
    let no_core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    let _ = rustix::process::setrlimit(rustix::process::Resource::Core, no_core);
    // Raising the score back is always allowed; it fails only if init could not lower it.
    let _ = std::fs::write("/proc/self/oom_score_adj", "0");
    if let Err((stage, e)) = become_sandbox_user(credentials) {
        fail(stage, errno(e));
    }
    if seccomp.apply().is_err() {
        fail("seccomp", libc::EPERM);
    }
    if let Err(e) = rustix::process::chdir(spec.cwd.as_str()) {
        fail("cwd", errno(e));
    }
    let error = exec(spec);
    fail("exec", error.raw_os_error().unwrap_or(0))
}

/// `execve` with a `PATH` search like `execvp`, using the command's own environment.
fn exec(spec: &ExecSpec) -> std::io::Error {
    let to_c =
        |s: &[u8]| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let argv: Result<Vec<CString>, _> = spec.argv.iter().map(|a| to_c(a.as_bytes())).collect();
    let env: Result<Vec<CString>, _> = spec
        .env
        .iter()
        .map(|(k, v)| to_c(format!("{k}={v}").as_bytes()))
        .collect();
    let (argv, env) = match (argv, env) {
        (Ok(argv), Ok(env)) => (argv, env),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let Some(program) = spec.argv.first() else {
        return std::io::Error::from_raw_os_error(libc::EINVAL);
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    if program.contains('/') {
        return match to_c(program.as_bytes()) {
            Ok(path) => sys::execve(&path, &argv_ptrs, &env_ptrs),
            Err(e) => e,
        };
    }
    let search = spec
        .env
        .get("PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", String::as_str);
    let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
    for dir in search.split(':').filter(|d| !d.is_empty()) {
        let candidate = std::path::Path::new(dir).join(program);
        let Ok(path) = to_c(candidate.as_os_str().as_bytes()) else {
            continue;
        };
        let error = sys::execve(&path, &argv_ptrs, &env_ptrs);
        // Keep looking after "not here"; remember "here but not allowed" (like execvp).
        match error.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => {}
            _ => last = error,
        }
    }
    last
}

/// Makes the calling process the sandbox user for good (I11): no supplementary groups
/// (where the runtime allows dropping them), 1000:1000, no capability in any set, and
/// `no_new_privs`. What a command's process does before its exec, and what every process
/// the server forks for work of its own does first (a relay, a home move, a file
/// operation). A failure names its step.
pub(crate) fn become_sandbox_user(
    credentials: Credentials,
) -> Result<(), (&'static str, rustix::io::Errno)> {
    // In a user namespace setgroups is denied (see init) and the caller's groups stay; in
    // a container the agent already is the sandbox user, without the capability.
    let in_sentry = credentials == Credentials::SentryRoot;
    let groups = match credentials {
        Credentials::Root | Credentials::SentryRoot => rustix::thread::set_thread_groups(&[]),
        Credentials::UserNamespace | Credentials::AlreadySandboxUser => Ok(()),
    };
    groups
        .and_then(|()| {
            let gid = rustix::process::Gid::from_raw(SANDBOX_GID);
            rustix::thread::set_thread_res_gid(gid, gid, gid)
        })
        .and_then(|()| {
            let uid = rustix::process::Uid::from_raw(SANDBOX_UID);
            rustix::thread::set_thread_res_uid(uid, uid, uid)
        })
        .map_err(|e| ("credentials", e))?;
    // As root, becoming 1000 cleared every capability; in a user namespace the process
    // already is 1000 and still holds the namespace's capabilities: clear them explicitly.
    let no_capabilities = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: no_capabilities,
            permitted: no_capabilities,
            inheritable: no_capabilities,
        },
    )
    .map_err(|e| ("capabilities", e))?;
    match rustix::thread::clear_ambient_capability_set() {
        // gVisor's Sentry has no ambient set (EINVAL): there is nothing to clear.
        Err(rustix::io::Errno::INVAL) if in_sentry => {}
        Err(e) => return Err(("capabilities", e)),
        Ok(()) => {}
    }
    rustix::thread::set_no_new_privs(true).map_err(|e| ("no_new_privs", e))
}
