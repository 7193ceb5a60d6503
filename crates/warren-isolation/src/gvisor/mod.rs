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

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

mod bounded;
mod live;
mod locate;
mod platform;
#[cfg(test)]
mod tests;

use live::{live_probe, LiveOutcome, ProbeDir};
use locate::{locate, version_of};
use platform::{kvm_verdict, ptrace_failure_reason, ptrace_reason, KvmVerdict};

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
