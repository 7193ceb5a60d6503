//! The OCI bundle of a gVisor runtime (issue 19): `config.json` and an empty, read-only
//! root directory, under `<data>/runtimes/<sandbox>/`.
//!
//! The view is the local runtime's (`runtime::rootfs`, I7), as a read-only root like
//! Docker's tier:
//!
//! ```text
//! /usr /bin /lib* /sbin   the host's, read-only (merged-/usr links recreated as the host has them)
//! /etc                    the host profile's filtered copy naming the layout's user, read-only
//! /home/gem               tmpfs, size-capped, 1000:1000 (the layout's home, when ephemeral)
//! <persistent mounts>     the view's ([`warren_core::view_mounts`]), rw or ro as it says;
//!                         those beneath a user's tree staged by descriptor (`staging`, I2)
//! /tmp /dev/shm           tmpfs, size-capped, 1777 (/var/tmp links to /tmp)
//! /opt/warren-agent       the agent bundle, read-only
//! /run/warren             the sandbox's socket directory (control.sock)
//! /proc /dev /sys         the Sentry's own
//! ```
//!
//! No other host path of warren's is visible (I1): the mount sources are named only in
//! `config.json`, which the Sentry never shows, and `/proc/mounts` inside names none.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use serde_json::{json, Value};
use warren_agent::bundle;
use warren_backend::{HostMount, RuntimeLimits};

use crate::config::{SANDBOX_GID, SANDBOX_UID};

/// Where the agent bundle is mounted inside (as in a Docker container).
pub(crate) const AGENT_MOUNT: &str = "/opt/warren-agent";
/// Where the sandbox's socket directory is mounted inside.
pub(crate) const SOCKET_MOUNT: &str = "/run/warren";

/// Host system directories shown read-only (the host profile's, but `/opt`: the root is
/// read-only here, and the agent's mount point lives there).
const HOST_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Capabilities of the agent inside the Sentry (root of the Sentry, not of the host): to
/// mount the Sentry's cgroupfs (`SYS_ADMIN`) and empty the bounding set every command
/// inherits (`SETPCAP`), both dropped once done, then to make each command the sandbox
/// user and to signal and reach what its commands leave. The Docker backend's gVisor tier
/// grants the same. Commands get none (no_new_privs, 1000:1000).
const AGENT_CAPABILITIES: &[&str] = &[
    "CAP_SYS_ADMIN",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
    "CAP_DAC_OVERRIDE",
];

/// Everything [`write_bundle`] needs of one runtime.
pub(crate) struct BundleSpec<'a> {
    /// The layout of the runtime's view.
    pub(crate) layout: &'static warren_core::Layout,
    /// The view's persistent mounts, in its order.
    pub(crate) mounts: &'a [HostMount],
    /// Their bind sources on the host, in the same order (trees, or staging paths).
    pub(crate) sources: Vec<&'a Path>,
    /// The filtered `/etc` of the layout's user.
    pub(crate) etc: &'a Path,
    /// The agent bundle directory.
    pub(crate) agent: &'a Path,
    /// The sandbox's socket directory.
    pub(crate) socket_dir: &'a Path,
    /// The agent's command line (`warren __container-agent <json>`'s JSON).
    pub(crate) agent_config: String,
    /// The runtime's limits.
    pub(crate) limits: &'a RuntimeLimits,
    /// `/warren/<instance>-<sandbox>`: the cgroup naming of the local runtime's, so
    /// destroy and the start-up sweep find it where they find every runtime's.
    pub(crate) cgroups_path: String,
}

/// Writes `<dir>/rootfs` (empty but for mount points and the host's merged-/usr links)
/// and `<dir>/config.json`.
pub(crate) fn write_bundle(dir: &Path, spec: &BundleSpec<'_>) -> io::Result<()> {
    let rootfs = dir.join("rootfs");
    mkdir(&rootfs)?;
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        tmpfs("/dev", "mode=0755,size=64k", &["nosuid", "noexec"]),
    ];
    for name in HOST_DIRS {
        let host = Path::new("/").join(name);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&host)?, rootfs.join(name))?;
        } else if meta.is_dir() {
            mkdir(&rootfs.join(name))?;
            mounts.push(bind(&host, &format!("/{name}"), false));
        }
    }
    mount_point(&rootfs, "/etc")?;
    mounts.push(bind(spec.etc, "/etc", false));
    for dir in ["var", "root", "tmp", "home"] {
        mkdir(&rootfs.join(dir))?;
    }
    std::os::unix::fs::symlink("/tmp", rootfs.join("var/tmp"))?;
    let limits = spec.limits;
    let home = spec.layout.home;
    if spec.layout.home_is_ephemeral() {
        mount_point(&rootfs, home)?;
        mounts.push(tmpfs(
            home,
            &format!(
                "size={},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_GID}",
                limits.home_bytes
            ),
            &["nosuid", "nodev"],
        ));
    }
    // After the home: mounts inside it get their mount points in its tmpfs (the Sentry
    // makes them there); the others are made on the root here, before it is read-only.
    for (mount, source) in spec.mounts.iter().zip(&spec.sources) {
        let in_home = spec.layout.home_is_ephemeral()
            && Path::new(&mount.target).starts_with(home)
            && mount.target != home;
        if !in_home {
            mount_point(&rootfs, &mount.target)?;
        }
        mounts.push(bind(source, &mount.target, mount.writable));
    }
    mounts.push(tmpfs(
        "/tmp",
        &format!("size={},mode=1777", limits.tmp_bytes),
        &["nosuid", "nodev"],
    ));
    mounts.push(tmpfs(
        "/dev/shm",
        &format!("size={},mode=1777", limits.shm_bytes),
        &["nosuid", "nodev"],
    ));
    mount_point(&rootfs, AGENT_MOUNT)?;
    mounts.push(bind(spec.agent, AGENT_MOUNT, false));
    mount_point(&rootfs, SOCKET_MOUNT)?;
    mounts.push(bind(spec.socket_dir, SOCKET_MOUNT, true));
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            // The Sentry's root, which the agent needs to mount the Sentry's cgroupfs and
            // make each command 1000:1000; the host sees runsc's sandbox process.
            "user": {"uid": 0, "gid": 0},
            "args": agent_args(spec.agent_config.clone()),
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": AGENT_CAPABILITIES,
                "effective": AGENT_CAPABILITIES,
                "permitted": AGENT_CAPABILITIES,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": limits.nofile, "soft": limits.nofile}],
            "noNewPrivileges": true,
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "warren",
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                {"type": "uts"}, {"type": "mount"},
            ],
            "cgroupsPath": spec.cgroups_path,
            "resources": resources(limits),
        },
    });
    let json = serde_json::to_vec_pretty(&config).map_err(io::Error::other)?;
    std::fs::write(dir.join("config.json"), json)
}

/// The agent run through the bundle's own loader, as in a Docker container, so the
/// executable never depends on the libraries of the root it runs in.
fn agent_args(config: String) -> Vec<String> {
    vec![
        format!("{AGENT_MOUNT}/{}", bundle::LOADER),
        "--argv0".into(),
        "warren-agent".into(),
        "--library-path".into(),
        format!("{AGENT_MOUNT}/lib"),
        format!("{AGENT_MOUNT}/{}", bundle::PROGRAM),
        warren_agent::CONTAINER_AGENT_ARG.into(),
        config,
    ]
}

/// The host cgroup's limits. Memory is the runtime's (the Sentry's memory is what the
/// runtime costs the host, I22; an OOM there ends the whole sandbox). The pids limit is
/// scaled: the host counts the Sentry's and the gofer's tasks, several per process
/// inside, so the runtime's own limit is the agent's to enforce inside (`max_processes`).
fn resources(limits: &RuntimeLimits) -> Value {
    let mut resources = json!({});
    if let Some(memory) = limits.memory_bytes {
        resources["memory"] = json!({ "limit": memory });
    }
    if let Some(pids) = limits.pids_max {
        resources["pids"] = json!({ "limit": warren_agent::sentry_limits::host_tasks(pids) });
    }
    if let Some(millis) = limits.cpu_millis {
        const PERIOD: u64 = 100_000;
        resources["cpu"] = json!({
            "quota": (millis * PERIOD / 1000).max(1000),
            "period": PERIOD,
        });
    }
    resources
}

fn bind(source: &Path, target: &str, writable: bool) -> Value {
    json!({
        "destination": target,
        "type": "bind",
        "source": source,
        "options": ["bind", if writable { "rw" } else { "ro" }, "nosuid", "nodev"],
    })
}

fn tmpfs(target: &str, data: &str, flags: &[&str]) -> Value {
    let mut options: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
    options.extend(data.split(',').map(str::to_owned));
    json!({"destination": target, "type": "tmpfs", "source": "tmpfs", "options": options})
}

fn mkdir(path: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Makes the directory `target` (absolute, inside the runtime) under `rootfs`, a fresh
/// directory of warren's: only plain components, each made as a directory.
fn mount_point(rootfs: &Path, target: &str) -> io::Result<PathBuf> {
    let mut path = rootfs.to_owned();
    for component in Path::new(target).components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => {
                path.push(name);
                // The host's merged-/usr links are the only links here; a target beneath
                // one would make its mount point on the host.
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(io::Error::other(format!(
                        "{target} lies beneath a link of the root ({})",
                        Path::new(name).display()
                    )));
                }
                mkdir(&path)?;
            }
            _ => {
                return Err(io::Error::other(format!(
                    "{target} is no plain absolute path"
                )))
            }
        }
    }
    Ok(path)
}
