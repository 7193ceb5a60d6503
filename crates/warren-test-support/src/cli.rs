//! Running the warren binary once, as a command line, in a clean environment.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::server::SERVE_SETTINGS;

/// Runs `bin` with `args` and `env` (nothing else of the test's environment that matters to
/// warren), waiting at most 30 s, and returns its output.
pub fn run_to_exit(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin);
    command
        .args(args)
        .env_remove("WARREN_TOKEN")
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null());
    for key in SERVE_SETTINGS {
        command.env_remove(key);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    output_within(&mut command, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{} {args:?} did not exit within 30 s", bin.display()))
}

/// Runs `command` with its stdout and stderr captured (stdin as the caller set it, or
/// inherited) and returns its output, or `None` once `within` passed: then it is killed.
pub fn output_within(command: &mut Command, within: Duration) -> Option<Output> {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(within) {
        Ok(output) => Some(output.expect("the process ran")),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            None
        }
    }
}
