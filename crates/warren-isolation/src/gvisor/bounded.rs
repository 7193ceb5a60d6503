//! Running one runsc command bounded in time, in a process group of its own, with its
//! output in files, and a failure told in a few words.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use super::CLEANUP_LIMIT;

/// A command that finished within its limit.
pub(super) struct Finished {
    pub(super) status: ExitStatus,
    pub(super) stdout: String,
    pub(super) stderr: String,
    pub(super) took: Duration,
}

pub(super) enum Ran {
    Finished(Finished),
    /// It did not finish in time: its process group was SIGKILLed.
    TimedOut,
    NotStarted(io::Error),
}

/// Runs `command` in a process group of its own, its output in files under `dir` (files,
/// not pipes: a sandbox that outlives runsc would hold a pipe open), for at most `limit`;
/// past it, the whole group is SIGKILLed.
pub(super) fn run_bounded(command: &mut Command, limit: Duration, dir: &Path, name: &str) -> Ran {
    let stdout_path = dir.join(format!("{name}.stdout"));
    let stderr_path = dir.join(format!("{name}.stderr"));
    let files = std::fs::File::create(&stdout_path)
        .and_then(|out| Ok((out, std::fs::File::create(&stderr_path)?)));
    let (stdout, stderr) = match files {
        Ok(files) => files,
        Err(error) => return Ran::NotStarted(error),
    };
    let started = Instant::now();
    // Nothing of warren's environment (its token may be there) reaches runsc or the
    // sandboxed `true`, which finds its program on the host's usual PATH whatever
    // warren's is: only that, and what the caller sets.
    let set: Vec<_> = command
        .get_envs()
        .filter_map(|(key, value)| Some((key.to_owned(), value?.to_owned())))
        .collect();
    let child = command
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .envs(set)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => return Ran::NotStarted(error),
    };
    let status = wait_until(&mut child, started + limit);
    let took = started.elapsed();
    let Some(status) = status else {
        let _ = rustix::process::kill_process_group(Pid::from_child(&child), Signal::KILL);
        if wait_until(&mut child, Instant::now() + CLEANUP_LIMIT).is_none() {
            tracing::warn!(
                pid = child.id(),
                "a killed gVisor probe command is not reaped"
            );
        }
        return Ran::TimedOut;
    };
    let read = |path: &Path| {
        String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
    };
    Ran::Finished(Finished {
        status,
        stdout: read(&stdout_path),
        stderr: read(&stderr_path),
        took,
    })
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// A failed command in a few words: its exit status and the end of what it said.
pub(super) fn failure_detail(status: ExitStatus, stderr: &str) -> String {
    let tail = stderr_tail(stderr);
    if tail.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {tail}")
    }
}

/// The last few non-empty lines of `stderr`, joined, at most 400 bytes: the error, without
/// the log before it.
fn stderr_tail(stderr: &str) -> String {
    const LINES: usize = 3;
    const MAX: usize = 400;
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let tail = lines[lines.len().saturating_sub(LINES)..].join(" / ");
    if tail.len() <= MAX {
        return tail;
    }
    let mut start = tail.len() - MAX;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &tail[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_tails_keep_the_last_lines_and_at_most_400_bytes() {
        assert_eq!(stderr_tail(""), "");
        assert_eq!(
            stderr_tail("starting\n\nloading\nboot failed\ncreating container: EPERM\n"),
            "loading / boot failed / creating container: EPERM"
        );
        let long = format!("{}\n", "é".repeat(500));
        let tail = stderr_tail(&long);
        assert!(tail.starts_with('…') && tail.len() <= 400 + '…'.len_utf8() + 1);
    }
}
