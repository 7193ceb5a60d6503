//! What this host offers for isolation, probed once: for `warren doctor`, start-up
//! warnings and `/health` (I17: say what is and is not enforced).

use serde::Serialize;

use crate::cgroup::CgroupSupport;

/// The isolation features of this host.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    /// warren runs as root (required by the local backend today).
    pub root: bool,
    /// The kernel release.
    pub kernel: String,
    /// overlayfs is available (the copy-on-write root).
    pub overlayfs: bool,
    /// seccomp filters are available.
    pub seccomp: bool,
    /// The Landlock ABI version, if Landlock is enabled.
    pub landlock_abi: Option<i64>,
    /// openat2(2) exists (the file layer's resolver).
    pub openat2: bool,
    /// Unprivileged user namespaces are allowed.
    pub unprivileged_userns: bool,
    /// What the cgroup hierarchies offer, one line per fact.
    pub cgroups: Vec<String>,
}

impl HostReport {
    /// Probes the running kernel.
    pub fn probe() -> Self {
        let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let max_userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let userns_clone = std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone")
            .map(|s| s.trim() != "0")
            .unwrap_or(true);
        Self {
            root: rustix::process::geteuid().is_root(),
            kernel: rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned(),
            overlayfs: filesystems
                .lines()
                .any(|l| l.trim_end().ends_with("overlay")),
            seccomp: status.lines().any(|l| l.starts_with("Seccomp:")),
            landlock_abi: warren_agent::sys::landlock_abi(),
            openat2: openat2_exists(),
            unprivileged_userns: max_userns > 0 && userns_clone,
            cgroups: CgroupSupport::detect()
                .map(|s| s.describe())
                .unwrap_or_else(|e| vec![format!("cgroups unavailable: {e}")]),
        }
    }

    /// Features the local backend would like but can run without.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.landlock_abi.is_none() {
            warnings.push("Landlock is not enabled in this kernel: file access is confined by the mount layout alone".to_owned());
        }
        warnings.extend(warren_agent::egress::nonlocal_bind_warning());
        warnings
    }
}

fn openat2_exists() -> bool {
    let how = rustix::fs::ResolveFlags::BENEATH;
    match rustix::fs::openat2(
        rustix::fs::CWD,
        ".",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        how,
    ) {
        Ok(_) => true,
        Err(e) => e != rustix::io::Errno::NOSYS,
    }
}
