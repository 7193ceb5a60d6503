//! The raw system calls rustix does not offer safely, each behind a small safe function.
//!
//! **Architecture invariant:** this is the only module of the crate that contains `unsafe`.
//! Every block states the invariant it relies on. Most callers run in the runtime's init
//! process, which is single-threaded by construction (it is a fresh `execve` of warren that
//! never starts a thread), so `fork` is sound there.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Which side of a `fork` the caller is on.
pub enum Forked {
    /// The parent; the child's pid (in the caller's pid namespace).
    Parent(i32),
    /// The child.
    Child,
}

/// `fork(2)`.
///
/// Callers must be single-threaded: only the init and launcher processes call it.
pub fn fork_single_threaded() -> io::Result<Forked> {
    // SAFETY: the callers (the runtime launcher and init) are single-threaded processes, so
    // the child is a complete copy with no lock held by a vanished thread; the child may
    // allocate and use std freely.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// `clone3(CLONE_INTO_CGROUP)`: like [`fork_single_threaded`], but the child starts life in
/// the cgroup v2 directory `cgroup`, with no migration (which takes a global lock and an
/// RCU grace period, milliseconds per command).
pub fn fork_into_cgroup(cgroup: BorrowedFd<'_>) -> io::Result<Forked> {
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: as for fork: the caller is single-threaded; with no stack given the child
    // continues on a copy of the parent's stack, exactly like fork. `args` is a valid
    // clone_args of the size passed, alive for the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match result {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as i32)),
    }
}

/// `unshare(2)` of the given `CLONE_*` flags.
pub fn unshare(flags: rustix::thread::UnshareFlags) -> io::Result<()> {
    // SAFETY: rustix marks unshare unsafe because unsharing file descriptors or the
    // filesystem context under other threads' feet is unsound. The launcher is
    // single-threaded, and the flags used are namespaces only.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(io::Error::from)
}

/// How a waited-for process ended, with its resource use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// The pid reaped.
    pub pid: i32,
    /// Exit status when it exited.
    pub exit_code: Option<i32>,
    /// Terminating signal when one killed it.
    pub signal: Option<i32>,
    /// User CPU time, microseconds.
    pub user_us: i64,
    /// System CPU time, microseconds.
    pub system_us: i64,
    /// Peak resident set, KiB.
    pub max_rss_kib: i64,
}

/// `wait4(pid, WNOHANG)`: `Ok(None)` when nothing (more) is ready to reap.
pub fn wait4_nohang(pid: i32) -> io::Result<Option<Reaped>> {
    let mut status = 0;
    // SAFETY: rusage is plain old data, fully written by the kernel on success.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for writes for the duration of the call.
    let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    match reaped {
        -1 => {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ECHILD) {
                Ok(None)
            } else {
                Err(error)
            }
        }
        0 => Ok(None),
        pid => Ok(Some(Reaped {
            pid,
            exit_code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            user_us: usage.ru_utime.tv_sec * 1_000_000 + usage.ru_utime.tv_usec,
            system_us: usage.ru_stime.tv_sec * 1_000_000 + usage.ru_stime.tv_usec,
            max_rss_kib: usage.ru_maxrss,
        })),
    }
}

/// Blocks SIGCHLD for the process and returns a signalfd that reports it.
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain old data; sigemptyset/sigaddset initialise it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the calls only write to it and the signal mask.
    let fd = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Drains a signalfd (its readiness only says "something happened").
pub fn drain_signalfd(fd: BorrowedFd<'_>) {
    let mut buffer = [0u8; 128 * 8];
    while rustix::io::read(fd, &mut buffer).is_ok_and(|n| n > 0) {}
}

/// Unblocks every signal and restores default dispositions, in a forked child before exec.
pub fn reset_signals() {
    // SAFETY: sigset_t is plain old data; the calls change only this process' signal state,
    // which is what a child about to exec wants.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for signal in [
            libc::SIGPIPE,
            libc::SIGCHLD,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
        ] {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    let socket = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    // SAFETY: ifreq is plain old data; zero is a valid initial value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: the socket is open, `request` is a valid ifreq naming "lo", and SIOCGIFFLAGS
    // writes only ifr_flags inside it.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifr_ifru is a union; SIOCGIFFLAGS initialised its ifru_flags member.
    unsafe {
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS reads the ifreq.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `kill(2)`: sends signal `signal` to `pid`, or to process group `-pid` when `group`.
/// Any number the kernel knows passes, real-time signals included (rustix names only the
/// classic ones).
pub fn send_signal(pid: i32, signal: i32, group: bool) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    let target = if group { -pid } else { pid };
    // SAFETY: kill takes two integers and touches no memory of this process; `target` is
    // never 0 or -1 (pid is positive), so it cannot reach this process's own group or
    // every process.
    if unsafe { libc::kill(target, signal) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setsid(2)`, the new session's id not read: gVisor's Sentry (issue 19) answers 0 for it,
/// which rustix's `setsid` takes for an impossible pid and panics on.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments and touches no memory of this process.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec, so a later `execve` leaves the
/// command only stdin, stdout and stderr.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it only sets a flag on
    // descriptors this process owns.
    let result = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if result < 0 {
        let error = io::Error::last_os_error();
        // gVisor's Sentry (issue 19) knows close_range but not its CLOEXEC flag (EINVAL),
        // and kernels before 5.11 lack it (ENOSYS): mark each open descriptor instead.
        return match error.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOSYS) => cloexec_each_from(first),
            _ => Err(error),
        };
    }
    Ok(())
}

/// [`cloexec_from`] one descriptor at a time, as `/proc/self/fd` lists them.
fn cloexec_each_from(first: u32) -> io::Result<()> {
    let listing = rustix::fs::open(
        "/proc/self/fd",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let mut open = Vec::new();
    for entry in rustix::fs::Dir::read_from(&listing)? {
        let entry = entry?;
        if let Some(fd) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
        {
            open.push(fd);
        }
    }
    let own = listing.as_raw_fd() as u32;
    for fd in open.into_iter().filter(|&fd| fd >= first && fd != own) {
        // SAFETY: the descriptor is this process's own (just listed) and only borrowed for
        // the fcntl; one closed since the listing fails with EBADF, which is ignored.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd as i32) };
        if let Ok(flags) = rustix::io::fcntl_getfd(borrowed) {
            rustix::io::fcntl_setfd(borrowed, flags | rustix::io::FdFlags::CLOEXEC)?;
        }
    }
    Ok(())
}

/// `execve(2)`; returns only on failure.
pub fn execve(
    path: &CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> io::Error {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    // SAFETY: `path` is NUL-terminated; `argv` and `envp` are NULL-terminated arrays of
    // pointers to NUL-terminated strings that the caller keeps alive across the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    io::Error::last_os_error()
}

/// Ends the current (forked) process at once, without running destructors or atexit
/// handlers that belong to the parent's state.
pub fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it never returns.
    unsafe { libc::_exit(code) }
}

/// Ends the current (forked) process by `signal`, as the process it supervised ended, so
/// its parent's `wait4` reports that signal. No core is dumped.
pub fn die_by_signal(signal: i32) -> ! {
    let no_core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    let _ = rustix::process::setrlimit(rustix::process::Resource::Core, no_core);
    // SAFETY: sigset_t is plain old data initialised by sigemptyset; signal, sigprocmask
    // and raise change only this process' signal state, which is about to end anyway.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
    // A signal whose default is not to terminate (it cannot have ended the command).
    exit_immediately(128 + signal)
}

/// Drops every capability from the bounding set, so nothing the command execs can regain
/// one (file capabilities included).
pub fn drop_bounding_set() -> io::Result<()> {
    for capability in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes an integer and changes only this process' bounding
        // set; EINVAL marks the first capability number the kernel does not know.
        let result = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0) };
        if result != 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::EINVAL) if capability > 0 => Ok(()),
                _ => Err(error),
            };
        }
    }
    Ok(())
}

/// The Landlock ABI version of the running kernel, or None without Landlock.
pub fn landlock_abi() -> Option<i64> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute, size 0 and the VERSION flag, landlock_create_ruleset
    // only returns the ABI version; it reads and writes no memory.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (version > 0).then_some(version)
}
