//! What the kubelet holds on the host outside a pod's thread: records of what a killed
//! test process left (and their sweep), the host's mounts, and killing containers.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{find_tool, Tools};

/// Where each pod's network namespace and emptyDir mounts are recorded with the pid of the
/// process running it, so that what a killed test process left is removed by the next
/// kubelet made on this machine.
pub(super) const RECORDS: &str = "/run/warren-kubelet";

/// Removes the network namespaces and emptyDir mounts of pods whose kubelet's process is
/// gone (killed before it could clean up; its containers died with it).
pub(super) fn sweep_leftovers(tools: &Tools) {
    let Ok(entries) = fs::read_dir(RECORDS) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.path().extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(record) = fs::read(entry.path())
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        else {
            continue;
        };
        let alive = record["pid"]
            .as_u64()
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if alive {
            continue;
        }
        // One sweeper takes the record; the others find it gone.
        let claimed = entry
            .path()
            .with_extension(format!("sweeping-{}", std::process::id()));
        if fs::rename(entry.path(), &claimed).is_err() {
            continue;
        }
        let ours = our_tmpfs_mounts();
        for mount in record["mounts"].as_array().into_iter().flatten().rev() {
            if let Some(mount) = mount.as_str().map(PathBuf::from) {
                if ours.contains(&mount) {
                    unmount(&mount);
                }
            }
        }
        if let Some(netns) = record["netns"].as_str() {
            let _ = Command::new(&tools.ip)
                .args(["netns", "del", netns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_file(&claimed);
    }
}

/// Mount points of the kubelet's emptyDir tmpfs mounts on the host.
fn our_tmpfs_mounts() -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (mount, filesystem) = line.split_once(" - ")?;
            let target = mount.split(' ').nth(4)?;
            let source = filesystem.split(' ').nth(1)?;
            (source == "warren-kubelet-emptydir").then(|| PathBuf::from(unescape_mountinfo(target)))
        })
        .collect()
}

pub(super) fn unmount(path: &Path) {
    let quiet = |lazy: bool| {
        let mut command = Command::new(find_tool("umount", "mount"));
        if lazy {
            command.arg("-l");
        }
        command
            .arg(path)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !quiet(false) {
        quiet(true);
    }
}

/// Mount points on the host at or below `dir` (from `/proc/self/mountinfo`).
pub(super) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|target| PathBuf::from(unescape_mountinfo(target)))
        .filter(|target| target.starts_with(dir))
        .collect()
}

fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Kills a container: the PID 1 of its pid namespace (the kernel then kills the rest of the
/// namespace), then `unshare` if it has no child yet. `unshare --kill-child` and the inner
/// `setpriv --pdeathsig keep` would also carry the kill down from `unshare`.
pub(super) fn kill_container(unshare: u32) {
    let pid1s = children(unshare);
    for pid in &pid1s {
        signal_kill(*pid);
    }
    if pid1s.is_empty() {
        signal_kill(unshare);
    }
}

fn signal_kill(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// The children of `pid` (its main thread's).
pub(super) fn children(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
