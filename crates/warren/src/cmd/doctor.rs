//! `warren doctor`: which isolation features this host supports, and which warren uses.

use std::process::ExitCode;

use warren_isolation::HostReport;

pub fn run() -> anyhow::Result<ExitCode> {
    let report = HostReport::probe();
    let yes_no = |b: bool| if b { "yes" } else { "NO" };
    println!("kernel                 {}", report.kernel);
    println!("running as root        {}", yes_no(report.root));
    println!("overlayfs (CoW root)   {}", yes_no(report.overlayfs));
    println!("seccomp filters        {}", yes_no(report.seccomp));
    match report.landlock_abi {
        Some(abi) => println!("landlock               yes (ABI {abi})"),
        None => println!("landlock               NO (file access confined by mounts alone)"),
    }
    println!("openat2 (file layer)   {}", yes_no(report.openat2));
    println!(
        "unprivileged userns    {}",
        yes_no(report.unprivileged_userns)
    );
    match warren_provisioner::volumes_unsupported_reason() {
        None => {
            println!("storage quotas         yes (a loop-mounted ext4 per uid: bytes and inodes)")
        }
        Some(reason) => {
            println!("storage quotas         NO ({reason}); [quotas] needs unenforced = true here")
        }
    }
    println!("cgroups:");
    for line in &report.cgroups {
        println!("  {line}");
    }
    println!(
        "seccomp denies         {}",
        warren_isolation::seccomp::SeccompProgram::denied_syscalls().join(" ")
    );
    let usable = (report.root || report.unprivileged_userns) && report.overlayfs && report.seccomp;
    if usable {
        let mode = if report.root {
            "as root"
        } else {
            "unprivileged (user namespaces, no cgroups: no memory/process/CPU limits)"
        };
        println!("\nthe local backend can run here, {mode}; warnings it will log at start-up:");
        for warning in report.warnings() {
            println!("  - {warning}");
        }
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "\nthe local backend cannot run here: it needs overlayfs, seccomp, and root or unprivileged user namespaces"
        );
        Ok(ExitCode::from(1))
    }
}
