//! `warren doctor`: which isolation features this host supports, and which warren uses.

use std::process::ExitCode;

use warren_isolation::{GvisorHost, GvisorPlatform, HostReport};

use super::output::outln;

pub fn run() -> anyhow::Result<ExitCode> {
    let report = HostReport::probe();
    let yes_no = |b: bool| if b { "yes" } else { "NO" };
    outln!("kernel                 {}", report.kernel);
    outln!("running as root        {}", yes_no(report.root));
    outln!("overlayfs (CoW root)   {}", yes_no(report.overlayfs));
    outln!("seccomp filters        {}", yes_no(report.seccomp));
    match report.landlock_abi {
        Some(abi) => outln!("landlock               yes (ABI {abi})"),
        None => outln!("landlock               NO (file access confined by mounts alone)"),
    }
    outln!("openat2 (file layer)   {}", yes_no(report.openat2));
    outln!(
        "unprivileged userns    {}",
        yes_no(report.unprivileged_userns)
    );
    match warren_provisioner::volumes_unsupported_reason() {
        None => {
            outln!("storage quotas         yes (a loop-mounted ext4 per uid: bytes and inodes)")
        }
        Some(reason) => {
            outln!("storage quotas         NO ({reason}); [quotas] needs unenforced = true here")
        }
    }
    // The gVisor tier (issue 19) is optional: its absence is reported, never a failure.
    let gvisor = warren_isolation::gvisor::probe(None);
    let runsc = match (&gvisor.runsc, &gvisor.runsc_version) {
        (Some(path), Some(version)) => format!("runsc {version} at {}", path.display()),
        (Some(path), None) => format!("runsc at {}", path.display()),
        (None, _) => "no runsc".to_owned(),
    };
    match gvisor.platform {
        Some(platform) => outln!(
            "gVisor tier            yes (platform {}, {runsc})",
            platform.as_str()
        ),
        None => outln!("gVisor tier            NO ({runsc})"),
    }
    outln!("  {}", gvisor.reason);
    for limitation in &gvisor.limitations {
        outln!("  limit: {limitation}");
    }
    outln!("cgroups:");
    for line in &report.cgroups {
        outln!("  {line}");
    }
    outln!(
        "seccomp denies         {}",
        warren_agent::seccomp::SeccompProgram::denied_syscalls().join(" ")
    );
    let usable = (report.root || report.unprivileged_userns) && report.overlayfs && report.seccomp;
    if usable {
        let mode = if report.root {
            "as root"
        } else {
            "unprivileged (user namespaces, no cgroups: no memory/process/CPU limits)"
        };
        let warnings = report.warnings();
        if warnings.is_empty() {
            outln!("\nthe local backend can run here, {mode}, with no warnings at start-up");
        } else {
            outln!("\nthe local backend can run here, {mode}; warnings it will log at start-up:");
            for warning in warnings {
                outln!("  - {warning}");
            }
        }
        Ok(ExitCode::SUCCESS)
    } else {
        outln!(
            "\nthe local backend cannot run here: it needs overlayfs, seccomp, and root or unprivileged user namespaces"
        );
        Ok(ExitCode::from(1))
    }
}

/// The gVisor probe's findings as `/health` reports them (issue 19).
pub fn gvisor_health(host: &GvisorHost) -> warren_protocol::GvisorHealth {
    warren_protocol::GvisorHealth {
        available: host.available,
        platform: host.platform.map(|platform| match platform {
            GvisorPlatform::Ptrace => warren_protocol::GvisorPlatform::Ptrace,
            GvisorPlatform::Kvm => warren_protocol::GvisorPlatform::Kvm,
        }),
        reason: Some(host.reason.clone()),
        runsc_version: host.runsc_version.clone(),
        limitations: host.limitations.clone(),
    }
}
