//! The gVisor tier's host probe (issue 19): is runsc here, which version, and which
//! platform its Sentry can run on. It starts real sandboxes (`runsc do true`), so it takes
//! a fraction of a second, and up to [`KVM_PROBE_LIMIT`] more on a host whose kvm hangs:
//! `warren serve` runs it once at start-up and `warren doctor` once per call, and
//! everything else (`/health`, the backends) reads the [`GvisorHost`] it returns.
//!
//! The platform is chosen by what works, not by what is advertised: a VM can expose a
//! `/dev/kvm` that is a paravirtual kvm (`kvm_pvm`) on which runsc's kvm platform hangs in
//! `KVM_RUN` for ever, so kvm is chosen only when the CPU has vmx/svm *and* a live kvm
//! sandbox finishes within [`KVM_PROBE_LIMIT`]; ptrace, which works wherever ptrace is
//! allowed, is the fallback and is probed live too.

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal};
use serde::Serialize;

/// How long the live kvm probe may take before it is taken to hang (it does, in `KVM_RUN`,
/// on paravirtual kvm hosts; a working one finishes in well under a second).
pub const KVM_PROBE_LIMIT: Duration = Duration::from_secs(5);
/// How long the live ptrace probe may take (0.15–0.3 s is usual; a loaded machine is
/// slower, and this probe decides whether the tier exists at all).
pub const PTRACE_PROBE_LIMIT: Duration = Duration::from_secs(20);
/// How long `runsc --version`, `list` and `delete` may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(5);
/// How long the clean-up waits for a killed probe's processes to be gone.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);
/// The probe's scratch directories start with this (one per probe, removed after it).
const PROBE_DIR_PREFIX: &str = "warren-gvisor-probe-";
const INSTALL_HINT: &str = "install Debian's runsc package (apt-get install runsc)";
/// Where runsc is looked for when PATH does not name it (a service's PATH may be short).
const WELL_KNOWN_DIRS: [&str; 3] = ["/usr/bin", "/usr/sbin", "/usr/local/bin"];
/// The reason given when warren does not run as root.
pub const NOT_ROOT_REASON: &str = "the gVisor tier needs warren to run as root";

/// Which runsc platform intercepts the sandboxed programs' system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GvisorPlatform {
    /// `ptrace`: works wherever ptrace is allowed; slower system calls.
    Ptrace,
    /// `kvm`: hardware virtualization; faster, but needs a real (vmx/svm) kvm.
    Kvm,
}

impl GvisorPlatform {
    /// Its name, as runsc and `/health` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ptrace => "ptrace",
            Self::Kvm => "kvm",
        }
    }

    /// The runsc flag that selects it (`--platform=ptrace`).
    pub fn flag(self) -> &'static str {
        match self {
            Self::Ptrace => "--platform=ptrace",
            Self::Kvm => "--platform=kvm",
        }
    }
}

/// What this host offers the gVisor tier, probed once ([`probe`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GvisorHost {
    /// Sandboxes can run on gVisor here: exactly when `platform` is set.
    pub available: bool,
    /// Where runsc is (the configured path, else the first on PATH); `None` when not found.
    pub runsc: Option<PathBuf>,
    /// What `runsc --version` reports (e.g. `0.0~20221219.0`).
    pub runsc_version: Option<String>,
    /// The platform gVisor sandboxes run on; `None` when the tier is unavailable.
    pub platform: Option<GvisorPlatform>,
    /// Why this platform was chosen, or why the tier is unavailable, in words an operator
    /// can act on.
    pub reason: String,
    /// What a sandbox on this tier cannot do here, or does differently from the kernel
    /// tier (issue 19: reported, never silently dropped); empty when unavailable.
    pub limitations: Vec<String>,
}

impl GvisorHost {
    /// Why the tier cannot run here; `None` when it can (for
    /// `Backend::gvisor_unavailable`).
    pub fn unavailable_reason(&self) -> Option<&str> {
        (!self.available).then_some(self.reason.as_str())
    }

    fn on(
        runsc: PathBuf,
        version: String,
        platform: GvisorPlatform,
        reason: String,
        stat_works: bool,
    ) -> Self {
        let limitations = limitations(platform, stat_works, release(&version));
        Self {
            available: true,
            runsc: Some(runsc),
            runsc_version: Some(version),
            platform: Some(platform),
            reason,
            limitations,
        }
    }

    /// The tier unavailable without a probe, for `reason` (a server with no backend that
    /// runs it).
    pub fn not_probed(reason: String) -> Self {
        Self::unavailable(None, None, reason)
    }

    fn unavailable(runsc: Option<PathBuf>, version: Option<String>, reason: String) -> Self {
        Self {
            available: false,
            runsc,
            runsc_version: version,
            platform: None,
            reason,
            limitations: Vec::new(),
        }
    }
}

/// What a sandbox on the gVisor tier cannot do, or does differently, on a host whose
/// probe found `platform` and (un)working coreutils `stat`.
/// The newest runsc release known to have no ISIG in its terminals' line discipline.
const LAST_RELEASE_WITHOUT_ISIG: u32 = 20221219;

/// A runsc release as its date (`0.0~20221219.0`, `release-20221219.0`): the first run of
/// eight digits in its version.
fn release(version: &str) -> Option<u32> {
    version
        .as_bytes()
        .windows(8)
        .find(|run| run.iter().all(u8::is_ascii_digit))
        .and_then(|run| std::str::from_utf8(run).ok()?.parse().ok())
}

fn limitations(platform: GvisorPlatform, stat_works: bool, release: Option<u32>) -> Vec<String> {
    let mut found = Vec::new();
    if release.is_some_and(|date| date <= LAST_RELEASE_WITHOUT_ISIG) {
        found.push(
            "terminals: Ctrl-C typed into a process's terminal (the byte 0x03) reaches the \
             program as a byte and interrupts nothing: this runsc's line discipline has no \
             ISIG; signal the process group instead (POST .../processes/{pid}/signal)"
                .to_owned(),
        );
    }
    if !stat_works {
        found.push(
            "coreutils `stat` and `ls -l` of a path fail with EINVAL: this runsc's Sentry refuses \
             statx's AT_NO_AUTOMOUNT (a newer runsc accepts it); Python's os.stat and find work"
                .to_owned(),
        );
    }
    if platform == GvisorPlatform::Ptrace {
        found.push(
            "the ptrace platform: every system call is intercepted, so fork/exec-heavy work \
             (builds, shell loops) runs several times slower than on the kernel tier"
                .to_owned(),
        );
    }
    found.extend(
        [
            "file locks taken inside the sandbox are the Sentry's own: warren's file API does \
             not see them (it never waits on one either)",
            "memory: each process may map at most three quarters of the runtime's memory limit \
             (RLIMIT_AS); the sandbox's processes together reaching the limit end the runtime",
            "processes: the sandbox user may run a quarter of the kernel tier's pids limit at \
             once (RLIMIT_NPROC): the host counts the Sentry's tasks behind each",
            "no Landlock and no per-command cgroup namespace inside: the Sentry is the boundary",
        ]
        .map(str::to_owned),
    );
    found
}

/// Probes the gVisor tier: finds runsc (`runsc` when configured, else on PATH or in the
/// usual directories), asks its version, and chooses a platform by running a sandbox on it
/// (see the module's documentation). Slow: run it once, at start-up. Leaves nothing
/// behind: each live probe runs in a scratch directory of its own, and whatever a killed
/// probe left (processes, runsc state) is killed, deleted and removed.
pub fn probe(runsc: Option<&Path>) -> GvisorHost {
    let host = probe_in(runsc, &std::env::temp_dir());
    match host.platform {
        Some(platform) => tracing::info!(
            platform = platform.as_str(),
            runsc_version = host.runsc_version.as_deref().unwrap_or(""),
            reason = %host.reason,
            "the gVisor tier is available"
        ),
        None => tracing::info!(reason = %host.reason, "the gVisor tier is unavailable"),
    }
    host
}

/// [`probe`], with its scratch directories under `scratch`.
fn probe_in(configured: Option<&Path>, scratch: &Path) -> GvisorHost {
    let runsc = match locate(configured, std::env::var_os("PATH").as_deref()) {
        Ok(path) => path,
        Err(reason) => return GvisorHost::unavailable(None, None, reason),
    };
    let dir = match ProbeDir::create(scratch) {
        Ok(dir) => dir,
        Err(error) => {
            return GvisorHost::unavailable(
                Some(runsc),
                None,
                format!(
                    "cannot make the probe's scratch directory under {} ({error}): make the \
                     temporary directory (TMPDIR) writable",
                    scratch.display()
                ),
            )
        }
    };
    let version = match version_of(&runsc, &dir.path) {
        Ok(version) => version,
        Err(reason) => return GvisorHost::unavailable(Some(runsc), None, reason),
    };
    if !rustix::process::geteuid().is_root() {
        return GvisorHost::unavailable(Some(runsc), Some(version), NOT_ROOT_REASON.to_owned());
    }
    let kvm = kvm_verdict(&runsc, &dir.path);
    if let KvmVerdict::Works { stat_works, .. } = kvm {
        let reason = kvm.describe();
        return GvisorHost::on(runsc, version, GvisorPlatform::Kvm, reason, stat_works);
    }
    let outcome = live_probe(
        &runsc,
        GvisorPlatform::Ptrace,
        PTRACE_PROBE_LIMIT,
        &dir.path.join("ptrace"),
    );
    match outcome {
        LiveOutcome::Succeeded { took, stat_works } => {
            let reason = ptrace_reason(&kvm, took);
            GvisorHost::on(runsc, version, GvisorPlatform::Ptrace, reason, stat_works)
        }
        failed => GvisorHost::unavailable(
            Some(runsc),
            Some(version),
            ptrace_failure_reason(&kvm, &failed, scratch),
        ),
    }
}

/// The configured runsc when it is an executable file, else the first `runsc` on `path`
/// (absolute entries only: a relative one would depend on the working directory) or in
/// the usual directories.
fn locate(configured: Option<&Path>, path: Option<&OsStr>) -> Result<PathBuf, String> {
    if let Some(configured) = configured {
        return if is_executable(configured) {
            Ok(configured.to_owned())
        } else {
            Err(format!(
                "runsc not found at {} (the configured path): {INSTALL_HINT}, or configure \
                 where runsc is",
                configured.display()
            ))
        };
    }
    let listed = path
        .map(|path| std::env::split_paths(path).collect::<Vec<_>>())
        .unwrap_or_default();
    listed
        .into_iter()
        .filter(|dir| dir.is_absolute())
        .chain(WELL_KNOWN_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join("runsc"))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| format!("runsc not found: {INSTALL_HINT}"))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn version_of(runsc: &Path, dir: &Path) -> Result<String, String> {
    let reinstall = "reinstall Debian's runsc package (apt-get install --reinstall runsc)";
    let mut command = Command::new(runsc);
    command.arg("--version");
    match run_bounded(&mut command, COMMAND_LIMIT, dir, "version") {
        Ran::Finished(done) if done.status.success() => {
            parse_version(&done.stdout).ok_or_else(|| {
                format!(
                    "`{} --version` printed no version: {reinstall}",
                    runsc.display()
                )
            })
        }
        Ran::Finished(done) => Err(format!(
            "`{} --version` failed ({}): {reinstall}",
            runsc.display(),
            failure_detail(done.status, &done.stderr)
        )),
        Ran::TimedOut => Err(format!(
            "`{} --version` did not finish within {} s: {reinstall}",
            runsc.display(),
            COMMAND_LIMIT.as_secs()
        )),
        Ran::NotStarted(error) => Err(format!(
            "cannot run {} ({error}): {reinstall}",
            runsc.display()
        )),
    }
}

/// The version in `runsc --version`'s output: its first line, without the `runsc version`
/// prefix this runsc prints (`runsc version 0.0~20221219.0` → `0.0~20221219.0`).
fn parse_version(stdout: &str) -> Option<String> {
    let first = stdout
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())?;
    let version = first.strip_prefix("runsc version").unwrap_or(first).trim();
    (!version.is_empty()).then(|| version.to_owned())
}

/// The hardware virtualization flag the CPU advertises in `/proc/cpuinfo` (`vmx`: Intel
/// VT-x, `svm`: AMD-V), if any. kvm's platform needs one: a paravirtual kvm (`kvm_pvm`)
/// exposes `/dev/kvm` without it, and runsc's kvm platform hangs on it.
fn virtualization_flag(cpuinfo: &str) -> Option<&'static str> {
    let flags = cpuinfo.lines().filter_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "flags").then_some(value)
    });
    for line in flags {
        for flag in line.split_whitespace() {
            match flag {
                "vmx" => return Some("vmx"),
                "svm" => return Some("svm"),
                _ => {}
            }
        }
    }
    None
}

/// Whether runsc's kvm platform can run here, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KvmVerdict {
    NoDevice,
    DeviceUnusable(String),
    NoCpuFlag,
    ProbeTimedOut,
    ProbeFailed(String),
    Works {
        flag: &'static str,
        took: Duration,
        stat_works: bool,
    },
}

impl KvmVerdict {
    /// The verdict in words: why kvm is used, or why it is not.
    fn describe(&self) -> String {
        match self {
            Self::NoDevice => {
                "kvm: there is no /dev/kvm (no hardware virtualization exposed to this machine)"
                    .to_owned()
            }
            Self::DeviceUnusable(error) => {
                format!("kvm: /dev/kvm cannot be opened read-write ({error})")
            }
            Self::NoCpuFlag => "kvm: /dev/kvm is present but the CPU has no vmx/svm (a \
                                paravirtual kvm, e.g. kvm_pvm)"
                .to_owned(),
            Self::ProbeTimedOut => format!(
                "kvm: a live probe (`runsc --platform=kvm --network=none do true`) did not \
                 finish within {} s and was killed (kvm hangs in KVM_RUN on some nested or \
                 paravirtual hosts)",
                KVM_PROBE_LIMIT.as_secs()
            ),
            Self::ProbeFailed(detail) => format!(
                "kvm: a live probe (`runsc --platform=kvm --network=none do true`) failed \
                 ({detail})"
            ),
            Self::Works { flag, took, .. } => format!(
                "kvm: /dev/kvm opens read-write, the CPU has {flag}, and a live probe ran in \
                 {} ms",
                took.as_millis()
            ),
        }
    }
}

fn kvm_verdict(runsc: &Path, dir: &Path) -> KvmVerdict {
    // Opening it is side-effect free: nothing is created before KVM_CREATE_VM.
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return KvmVerdict::NoDevice,
        Err(error) => return KvmVerdict::DeviceUnusable(error.to_string()),
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let Some(flag) = virtualization_flag(&cpuinfo) else {
        return KvmVerdict::NoCpuFlag;
    };
    match live_probe(
        runsc,
        GvisorPlatform::Kvm,
        KVM_PROBE_LIMIT,
        &dir.join("kvm"),
    ) {
        LiveOutcome::Succeeded { took, stat_works } => KvmVerdict::Works {
            flag,
            took,
            stat_works,
        },
        LiveOutcome::TimedOut => KvmVerdict::ProbeTimedOut,
        LiveOutcome::Failed(detail) => KvmVerdict::ProbeFailed(detail),
    }
}

/// Why ptrace, when its probe passed.
fn ptrace_reason(kvm: &KvmVerdict, took: Duration) -> String {
    format!(
        "{}: using ptrace (its live probe ran in {} ms)",
        kvm.describe(),
        took.as_millis()
    )
}

/// Why the tier is unavailable, when ptrace's probe did not pass either.
fn ptrace_failure_reason(kvm: &KvmVerdict, ptrace: &LiveOutcome, scratch: &Path) -> String {
    let what = match ptrace {
        LiveOutcome::Failed(detail) => format!("failed ({detail})"),
        LiveOutcome::TimedOut => format!(
            "did not finish within {} s and was killed",
            PTRACE_PROBE_LIMIT.as_secs()
        ),
        LiveOutcome::Succeeded { .. } => "passed".to_owned(),
    };
    format!(
        "{}; and ptrace: a live probe (`runsc --platform=ptrace --network=none do true`) \
         {what}: check that runsc may use ptrace here (kernel.yama.ptrace_scope below 3, no \
         seccomp profile or LSM denying it to warren) and that every directory above the \
         temporary directory {} is searchable by all (runsc's sandbox mounts its chroot there)",
        kvm.describe(),
        scratch.display()
    )
}

/// How one live probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LiveOutcome {
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
fn live_probe(runsc: &Path, platform: GvisorPlatform, limit: Duration, dir: &Path) -> LiveOutcome {
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
/// runs in a session of its own), then deletes every container runsc still lists under it.
fn clean_up(runsc: &Path, dir: &Path) {
    kill_processes_naming(dir);
    let mut roots = vec![dir.join("state")];
    if let Ok(entries) = std::fs::read_dir(dir) {
        roots.extend(
            entries
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().starts_with("runsc-do"))
                .map(|entry| entry.path()),
        );
    }
    for root in roots {
        let mut list = Command::new(runsc);
        list.arg("--root").arg(&root).args(["list", "-quiet"]);
        let Ran::Finished(listed) = run_bounded(&mut list, COMMAND_LIMIT, dir, "list") else {
            continue;
        };
        for id in listed.stdout.split_whitespace() {
            let mut delete = Command::new(runsc);
            delete
                .arg("--root")
                .arg(&root)
                .args(["delete", "-force", id]);
            if !matches!(run_bounded(&mut delete, COMMAND_LIMIT, dir, "delete"), Ran::Finished(done) if done.status.success())
            {
                tracing::warn!(root = %root.display(), id, "cannot delete a container the gVisor probe left");
            }
        }
    }
    kill_processes_naming(dir);
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
fn processes_naming(needle: &[u8]) -> Vec<i32> {
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
struct ProbeDir {
    path: PathBuf,
}

impl ProbeDir {
    fn create(parent: &Path) -> io::Result<Self> {
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

/// A command that finished within its limit.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

enum Ran {
    Finished(Finished),
    /// It did not finish in time: its process group was SIGKILLed.
    TimedOut,
    NotStarted(io::Error),
}

/// Runs `command` in a process group of its own, its output in files under `dir` (files,
/// not pipes: a sandbox that outlives runsc would hold a pipe open), for at most `limit`;
/// past it, the whole group is SIGKILLed.
fn run_bounded(command: &mut Command, limit: Duration, dir: &Path, name: &str) -> Ran {
    let stdout_path = dir.join(format!("{name}.stdout"));
    let stderr_path = dir.join(format!("{name}.stderr"));
    let files = std::fs::File::create(&stdout_path)
        .and_then(|out| Ok((out, std::fs::File::create(&stderr_path)?)));
    let (stdout, stderr) = match files {
        Ok(files) => files,
        Err(error) => return Ran::NotStarted(error),
    };
    let started = Instant::now();
    // Nothing of warren's environment (its token may be there) reaches runsc or the
    // sandboxed `true`, which finds its program on the host's usual PATH whatever
    // warren's is: only that, and what the caller sets.
    let set: Vec<_> = command
        .get_envs()
        .filter_map(|(key, value)| Some((key.to_owned(), value?.to_owned())))
        .collect();
    let child = command
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .envs(set)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => return Ran::NotStarted(error),
    };
    let status = wait_until(&mut child, started + limit);
    let took = started.elapsed();
    let Some(status) = status else {
        let _ = rustix::process::kill_process_group(Pid::from_child(&child), Signal::KILL);
        if wait_until(&mut child, Instant::now() + CLEANUP_LIMIT).is_none() {
            tracing::warn!(
                pid = child.id(),
                "a killed gVisor probe command is not reaped"
            );
        }
        return Ran::TimedOut;
    };
    let read = |path: &Path| {
        String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
    };
    Ran::Finished(Finished {
        status,
        stdout: read(&stdout_path),
        stderr: read(&stderr_path),
        took,
    })
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// A failed command in a few words: its exit status and the end of what it said.
fn failure_detail(status: ExitStatus, stderr: &str) -> String {
    let tail = stderr_tail(stderr);
    if tail.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {tail}")
    }
}

/// The last few non-empty lines of `stderr`, joined, at most 400 bytes: the error, without
/// the log before it.
fn stderr_tail(stderr: &str) -> String {
    const LINES: usize = 3;
    const MAX: usize = 400;
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let tail = lines[lines.len().saturating_sub(LINES)..].join(" / ");
    if tail.len() <= MAX {
        return tail;
    }
    let mut start = tail.len() - MAX;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &tail[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO_PVM: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme \
        de pse tsc msr pae hypervisor lahf_lm abm\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\n\
        flags\t\t: fpu vme de pse tsc msr pae hypervisor lahf_lm abm\n";

    #[test]
    fn cpuinfo_flags_name_vmx_or_svm_only_as_whole_flags_of_a_flags_line() {
        assert_eq!(virtualization_flag(CPUINFO_PVM), None);
        assert_eq!(
            virtualization_flag("processor\t: 0\nflags\t\t: fpu vme vmx sse\n"),
            Some("vmx")
        );
        assert_eq!(
            virtualization_flag("processor\t: 0\nflags\t\t: fpu svm sse\n"),
            Some("svm")
        );
        // A flag merely containing the letters, or vmx named outside the flags line
        // (`vmx flags` lists VT-x features on Intel CPUs), is not hardware virtualization.
        assert_eq!(virtualization_flag("flags\t\t: fpu vmxe svm_lock\n"), None);
        assert_eq!(
            virtualization_flag("flags\t\t: fpu\nvmx flags\t: vnmi\nmodel name\t: svm\n"),
            None
        );
        assert_eq!(virtualization_flag(""), None);
    }

    #[test]
    fn the_version_is_the_first_line_without_runscs_prefix() {
        assert_eq!(
            parse_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n").as_deref(),
            Some("0.0~20221219.0")
        );
        assert_eq!(
            parse_version("\nrunsc version release-20240513.0\n").as_deref(),
            Some("release-20240513.0")
        );
        assert_eq!(parse_version("1.2.3\n").as_deref(), Some("1.2.3"));
        assert_eq!(parse_version("runsc version \n"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn reasons_say_what_was_found_and_what_to_do() {
        assert_eq!(
            KvmVerdict::NoCpuFlag.describe(),
            "kvm: /dev/kvm is present but the CPU has no vmx/svm (a paravirtual kvm, e.g. \
             kvm_pvm)"
        );
        assert_eq!(
            ptrace_reason(&KvmVerdict::NoCpuFlag, Duration::from_millis(180)),
            "kvm: /dev/kvm is present but the CPU has no vmx/svm (a paravirtual kvm, e.g. \
             kvm_pvm): using ptrace (its live probe ran in 180 ms)"
        );
        assert!(KvmVerdict::ProbeTimedOut
            .describe()
            .contains("did not finish within 5 s and was killed"));
        assert!(KvmVerdict::NoDevice.describe().contains("no /dev/kvm"));
        assert_eq!(
            KvmVerdict::Works {
                flag: "vmx",
                took: Duration::from_millis(420),
                stat_works: true,
            }
            .describe(),
            "kvm: /dev/kvm opens read-write, the CPU has vmx, and a live probe ran in 420 ms"
        );
        let failed = ptrace_failure_reason(
            &KvmVerdict::NoDevice,
            &LiveOutcome::Failed("exit status: 128: ptrace: operation not permitted".into()),
            Path::new("/tmp"),
        );
        assert!(
            failed.contains("ptrace: operation not permitted"),
            "{failed}"
        );
        assert!(failed.contains("kernel.yama.ptrace_scope"), "{failed}");

        assert_eq!(
            locate(None, Some(OsStr::new("/nonexistent-a:relative/bin"))).map(|_| ()),
            if WELL_KNOWN_DIRS
                .iter()
                .any(|dir| is_executable(&Path::new(dir).join("runsc")))
            {
                Ok(())
            } else {
                Err(
                    "runsc not found: install Debian's runsc package (apt-get install runsc)"
                        .to_owned(),
                )
            }
        );
        let missing = locate(Some(Path::new("/nonexistent/runsc")), None).unwrap_err();
        assert_eq!(
            missing,
            "runsc not found at /nonexistent/runsc (the configured path): install Debian's \
             runsc package (apt-get install runsc), or configure where runsc is"
        );
        let host = GvisorHost::unavailable(None, None, missing.clone());
        assert_eq!(host.unavailable_reason(), Some(missing.as_str()));
        assert_eq!(
            serde_json::to_value(&host).unwrap(),
            serde_json::json!({"available": false, "runsc": null, "runsc_version": null,
                               "platform": null, "reason": missing, "limitations": []})
        );
    }

    #[test]
    fn stderr_tails_keep_the_last_lines_and_at_most_400_bytes() {
        assert_eq!(stderr_tail(""), "");
        assert_eq!(
            stderr_tail("starting\n\nloading\nboot failed\ncreating container: EPERM\n"),
            "loading / boot failed / creating container: EPERM"
        );
        let long = format!("{}\n", "é".repeat(500));
        let tail = stderr_tail(&long);
        assert!(tail.starts_with('…') && tail.len() <= 400 + '…'.len_utf8() + 1);
    }

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

    /// The real probe on this host, as root with runsc installed (scripts/test installs it):
    /// available; ptrace unless the CPU has vmx/svm; nothing left behind.
    #[test]
    fn the_real_probe_finds_a_platform_and_leaves_nothing_behind() {
        assert!(
            rustix::process::geteuid().is_root(),
            "the gVisor probe test runs as root (scripts/test does)"
        );
        let scratch = searchable_tempdir();
        let host = probe_in(None, scratch.path());
        assert!(host.available, "{host:?}");
        assert!(
            host.runsc.is_some() && host.runsc_version.is_some(),
            "{host:?}"
        );
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        if virtualization_flag(&cpuinfo).is_none() {
            assert_eq!(host.platform, Some(GvisorPlatform::Ptrace), "{host:?}");
            assert!(host.reason.contains("using ptrace"), "{host:?}");
        }
        // The probe asked coreutils' stat too: its answer is a limitation exactly when
        // stat fails in a sandbox here, which `runsc do` shows independently.
        let stat = std::process::Command::new(host.runsc.as_ref().unwrap())
            .args([
                "--network=none",
                "--ignore-cgroups",
                host.platform.unwrap().flag(),
                "do",
            ])
            .args(["/bin/sh", "-c", "stat / >/dev/null 2>&1"])
            .env("TMPDIR", scratch.path())
            .current_dir(scratch.path())
            .status()
            .unwrap();
        let reported = host.limitations.iter().any(|l| l.contains("`stat`"));
        assert_eq!(reported, !stat.success(), "{host:?}");
        assert!(host.limitations.iter().any(|l| l.contains("file locks")));
        let old_runsc = release(host.runsc_version.as_deref().unwrap())
            .is_some_and(|date| date <= LAST_RELEASE_WITHOUT_ISIG);
        let ctrl_c = host.limitations.iter().any(|l| l.contains("ISIG"));
        assert_eq!(ctrl_c, old_runsc, "{host:?}");
        clean_up(host.runsc.as_ref().unwrap(), scratch.path());
        assert_no_leftovers(scratch.path());
    }

    #[test]
    fn a_runsc_release_is_read_from_its_version_as_a_date() {
        assert_eq!(release("0.0~20221219.0"), Some(20221219));
        assert_eq!(release("release-20240513.0"), Some(20240513));
        assert_eq!(release("0.0~git"), None);
        let old = limitations(GvisorPlatform::Ptrace, true, release("0.0~20221219.0"));
        assert!(old.iter().any(|l| l.contains("ISIG")));
        let newer = limitations(GvisorPlatform::Ptrace, true, release("release-20240513.0"));
        assert!(!newer.iter().any(|l| l.contains("ISIG")));
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

    /// A temporary directory runsc's sandbox can reach (tempfile makes them 0700).
    fn searchable_tempdir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        dir
    }

    /// No process names the scratch directory (runsc's gofer and sandbox processes name
    /// their state and bundle directories under it: `pgrep -f runsc-sandbox` would also
    /// see other tests' sandboxes), and no probe directory is left in it.
    fn assert_no_leftovers(scratch: &Path) {
        let naming = processes_naming(scratch.as_os_str().as_encoded_bytes());
        assert!(naming.is_empty(), "probe processes left: {naming:?}");
        let dirs: Vec<_> = std::fs::read_dir(scratch)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .filter(|name| name.to_string_lossy().starts_with(PROBE_DIR_PREFIX))
            .collect();
        assert!(dirs.is_empty(), "probe directories left: {dirs:?}");
    }
}
