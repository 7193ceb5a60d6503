//! The probe as a whole: its reasons, its limitations, and the real probe on this host;
//! and the helpers the submodules' tests share.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;

use super::live::{clean_up, processes_naming};
use super::locate::is_executable;
use super::platform::virtualization_flag;
use super::*;

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

/// A temporary directory runsc's sandbox can reach (tempfile makes them 0700).
pub(super) fn searchable_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

/// No process names the scratch directory (runsc's gofer and sandbox processes name
/// their state and bundle directories under it: `pgrep -f runsc-sandbox` would also
/// see other tests' sandboxes), and no probe directory is left in it.
pub(super) fn assert_no_leftovers(scratch: &Path) {
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
