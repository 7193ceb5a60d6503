//! What a server's runtimes leave on the host by design, removed after a test: local
//! runtimes' processes and cgroups, workspace volumes' mounts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Unmounts the per-uid workspace volumes of a server with storage quotas (they stay
/// mounted after the server by design); their loop devices go with the last unmount.
pub fn unmount_workspace_volumes(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(data_dir.join("user-data/shared")) else {
        return;
    };
    for entry in entries.flatten() {
        let workspace = entry.path().join("workspace");
        if std::fs::read_dir(data_dir.join("volumes")).is_ok() {
            let _ = Command::new("umount").arg("-l").arg(&workspace).output();
        }
    }
}

/// Unmounts what a server mounted under its data directory and leaves mounted by design
/// (workdir branches' overlay views, I27), deepest first, lazily.
pub fn unmount_under(data_dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = format!("{}/", data_dir.display());
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.matches('/').count()));
    points.dedup();
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(point).output();
    }
}

/// Kills every runtime recorded under `data_dir` and removes its cgroups.
pub fn reap_runtimes(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(data_dir.join("runtimes")) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(identity) = std::fs::read(entry.path().join("runtime.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        else {
            continue;
        };
        if let Some(pid) = identity["pid"].as_i64() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        if let Some(cgroup) = identity["cgroup"].as_str() {
            for hierarchy in cgroup_hierarchies() {
                remove_cgroup_tree(&hierarchy.join("warren").join(cgroup));
            }
        }
    }
}

fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        out.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    out
}

fn remove_cgroup_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for attempt in 0..200 {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.path().is_dir() {
                    remove_cgroup_tree(&entry.path());
                }
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        let _ = attempt;
        std::thread::sleep(Duration::from_millis(10));
    }
}
