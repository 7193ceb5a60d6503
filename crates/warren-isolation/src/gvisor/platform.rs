//! Choosing the platform: kvm only when the CPU has vmx/svm and a live kvm sandbox finishes
//! in time, and the reasons given for falling back to ptrace or for having no tier.

use std::io;
use std::path::Path;
use std::time::Duration;

use super::live::{live_probe, LiveOutcome};
use super::{GvisorPlatform, KVM_PROBE_LIMIT, PTRACE_PROBE_LIMIT};

/// The hardware virtualization flag the CPU advertises in `/proc/cpuinfo` (`vmx`: Intel
/// VT-x, `svm`: AMD-V), if any. kvm's platform needs one: a paravirtual kvm (`kvm_pvm`)
/// exposes `/dev/kvm` without it, and runsc's kvm platform hangs on it.
pub(super) fn virtualization_flag(cpuinfo: &str) -> Option<&'static str> {
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
pub(super) enum KvmVerdict {
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
    pub(super) fn describe(&self) -> String {
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

pub(super) fn kvm_verdict(runsc: &Path, dir: &Path) -> KvmVerdict {
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
pub(super) fn ptrace_reason(kvm: &KvmVerdict, took: Duration) -> String {
    format!(
        "{}: using ptrace (its live probe ran in {} ms)",
        kvm.describe(),
        took.as_millis()
    )
}

/// Why the tier is unavailable, when ptrace's probe did not pass either.
pub(super) fn ptrace_failure_reason(
    kvm: &KvmVerdict,
    ptrace: &LiveOutcome,
    scratch: &Path,
) -> String {
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
}
