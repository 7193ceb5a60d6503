//! `warren drain`: asks the server on this node's data directory to drain and stop, as
//! SIGTERM does (issue 14): in cluster mode it snapshots every runtime it owns to the
//! shared store and hands them back before it exits, so another replica resumes them.
//!
//! The server is found through its data directory's lock: only while the lock is held
//! is the pid recorded in it the server's, and the signal goes through a pidfd opened
//! before the lock is checked again, so a pid reused after the server died is never hit.

use std::fs::{OpenOptions, TryLockError};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use super::data_dir_lock::{Holder, LOCK_FILE};

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The data directory of the server to drain.
    #[arg(long, env = "WARREN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Seconds to wait for the server to finish draining and exit.
    #[arg(long, default_value_t = 300)]
    wait_s: u64,
}

/// The lock file, never through a planted symlink.
fn open_lock(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// Whether the data directory's lock is held by a running server.
fn held(path: &std::path::Path) -> anyhow::Result<bool> {
    let file = open_lock(path)?;
    match file.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("cannot check the lock {}", path.display()))
        }
    }
}

pub fn run(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let data_dir = match args.data_dir {
        Some(dir) => dir,
        None => super::serve::default_data_dir()?,
    };
    let lock = data_dir.join(LOCK_FILE);
    if !lock.exists() || !held(&lock)? {
        bail!(
            "no warren server runs on {} (its lock is not held); nothing to drain",
            data_dir.display()
        );
    }
    let mut text = String::new();
    open_lock(&lock)?.read_to_string(&mut text)?;
    let holder: Holder = serde_json::from_str(&text)
        .with_context(|| format!("the lock file {} names no server", lock.display()))?;
    let pid = i32::try_from(holder.pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .context("the lock file names an impossible pid")?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .with_context(|| format!("cannot reach process {pid:?}"))?;
    // The pidfd names that process for good: if the lock is still held now, it is the
    // server's (the holder wrote its own pid after locking).
    if !held(&lock)? {
        bail!("the server on {} stopped meanwhile", data_dir.display());
    }
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::TERM)
        .context("cannot signal the server")?;
    eprintln!(
        "warren: asked the server (pid {}, listening on {}) to drain; waiting for it to hand its runtimes back and stop",
        holder.pid, holder.listen
    );
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    while held(&lock)? {
        if Instant::now() > deadline {
            bail!(
                "the server is still draining after {} s; it goes on, and `warren drain --wait-s` waits longer",
                args.wait_s
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("warren: the server drained and stopped");
    Ok(ExitCode::SUCCESS)
}
