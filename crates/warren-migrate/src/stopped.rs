//! Proof that the old system is stopped (I36): no process may have a file open, a mapping,
//! its working directory or its root under the source while it is migrated.
//!
//! The kernel's own view is read from `/proc`: each process's `fd/*`, `cwd`, `root` and
//! `maps` name the files it holds. A process this user may not inspect (another user's,
//! without root) cannot be ruled out, so it is reported as such rather than ignored.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One process using the source, for the refusal's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceUser {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`).
    pub command: String,
    /// What it holds, relative to the source (`cwd`, `open file users/a/x`, `mapping …`).
    pub holds: String,
}

impl std::fmt::Display for SourceUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({}): {}", self.pid, self.command, self.holds)
    }
}

/// The processes that use anything under `source` (canonical), this process excepted.
/// One entry per process: the first thing found that it holds.
pub fn processes_using(source: &Path) -> Vec<SourceUser> {
    processes_using_in(Path::new("/proc"), source, std::process::id())
}

fn processes_using_in(proc: &Path, source: &Path, me: u32) -> Vec<SourceUser> {
    let mut users = Vec::new();
    let Ok(entries) = fs::read_dir(proc) else {
        return users;
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != me)
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let dir = proc.join(pid.to_string());
        if let Some(holds) = holding(&dir, source) {
            let command = fs::read_to_string(dir.join("comm"))
                .map(|name| name.trim_end().to_owned())
                .unwrap_or_else(|_| "?".to_owned());
            users.push(SourceUser {
                pid,
                command,
                holds,
            });
        }
    }
    users
}

/// What the process at `dir` (`/proc/<pid>`) holds under `source`, if anything. A process
/// that ended meanwhile holds nothing.
fn holding(dir: &Path, source: &Path) -> Option<String> {
    let under = |target: &Path| -> Option<String> {
        // The kernel appends " (deleted)" to removed files; such a file is still held.
        let bytes = target.as_os_str().as_bytes();
        let bytes = bytes.strip_suffix(b" (deleted)").unwrap_or(bytes);
        let target = Path::new(std::ffi::OsStr::from_bytes(bytes));
        let rest = target.strip_prefix(source).ok()?;
        Some(if rest.as_os_str().is_empty() {
            "the source itself".to_owned()
        } else {
            rest.display().to_string()
        })
    };
    for link in ["cwd", "root", "exe"] {
        if let Ok(target) = fs::read_link(dir.join(link)) {
            if let Some(path) = under(&target) {
                return Some(format!("{link} {path}"));
            }
        }
    }
    if let Ok(fds) = fs::read_dir(dir.join("fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = fs::read_link(fd.path()) {
                if let Some(path) = under(&target) {
                    return Some(format!("open file {path}"));
                }
            }
        }
    } else if dir.exists() {
        // Not ours to inspect: it may hold anything.
        if let Ok(uid) = fs::metadata(dir).map(|m| std::os::unix::fs::MetadataExt::uid(&m)) {
            if uid != rustix::process::geteuid().as_raw() {
                return Some(
                    "cannot be inspected by this user (run the migration as root)".to_owned(),
                );
            }
        }
    }
    if let Ok(maps) = fs::read(dir.join("maps")) {
        for line in maps.split(|&b| b == b'\n') {
            // The path is the sixth field, and may contain spaces.
            if let Some(start) = line.iter().position(|&b| b == b'/') {
                let path = PathBuf::from(std::ffi::OsStr::from_bytes(&line[start..]));
                if let Some(path) = under(&path) {
                    return Some(format!("mapping {path}"));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_process_with_its_cwd_in_the_source_is_named() {
        let source = tempfile::tempdir().unwrap();
        let source_path = source.path().canonicalize().unwrap();
        let mut child = Command::new("sleep")
            .arg("30")
            .current_dir(&source_path)
            .spawn()
            .unwrap();
        let users = processes_using(&source_path);
        child.kill().unwrap();
        child.wait().unwrap();
        let found = users.iter().find(|u| u.pid == child.id()).expect("found");
        assert_eq!(found.command, "sleep");
        assert_eq!(found.holds, "cwd the source itself");
    }

    #[test]
    fn a_process_holding_a_file_open_is_named_with_the_file() {
        let source = tempfile::tempdir().unwrap();
        let source_path = source.path().canonicalize().unwrap();
        fs::create_dir(source_path.join("threads")).unwrap();
        fs::write(source_path.join("threads/held.txt"), b"x").unwrap();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("exec 3<\"$1\"; echo ready; exec sleep 30")
            .arg("sh")
            .arg(source_path.join("threads/held.txt"))
            .current_dir("/")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let users = processes_using(&source_path);
        child.kill().unwrap();
        child.wait().unwrap();
        let found = users.iter().find(|u| u.pid == child.id()).expect("found");
        assert_eq!(found.holds, "open file threads/held.txt");
    }

    #[test]
    fn a_path_that_only_shares_a_prefix_with_the_source_is_not_under_it() {
        let parent = tempfile::tempdir().unwrap();
        let parent = parent.path().canonicalize().unwrap();
        let source = parent.join("src");
        let sibling = parent.join("src-other");
        fs::create_dir(&source).unwrap();
        fs::create_dir(&sibling).unwrap();
        let mut child = Command::new("sleep")
            .arg("30")
            .current_dir(&sibling)
            .spawn()
            .unwrap();
        let users = processes_using(&source);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(users.iter().all(|u| u.pid != child.id()), "{users:?}");
    }
}
