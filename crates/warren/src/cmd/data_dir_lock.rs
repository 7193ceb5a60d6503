//! One data directory, one server: `warren serve` holds an exclusive lock on
//! `<data>/serve.lock` for as long as it runs, taken before it touches anything else in the
//! directory (token, state store, runtimes).
//!
//! Two servers on one data directory would both reconcile the state store with the backend
//! and adopt the same live runtimes, each then believing it alone owns them (I16). The lock
//! is `flock(2)` on an open file description, so the kernel drops it when the holder dies,
//! however it dies: a stale lock file never blocks a restart. The descriptor is close-on-exec
//! (std opens every file so), so runtimes, which outlive the server, never inherit it.
//!
//! The file's contents only *name* the holder for the message a second server prints; the
//! lock itself is the only thing trusted.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "serve.lock";

/// Who holds a data directory, as written into its lock file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    /// The holding server's process id.
    pub pid: u32,
    /// When it took the lock (RFC 3339).
    pub since: String,
    /// The address it listens on.
    pub listen: String,
}

/// The exclusive hold on a data directory; released when dropped or when the process ends.
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
    /// When the lock was taken, for every record of the holder.
    since: String,
}

impl DataDirLock {
    /// Takes the lock without waiting, or fails naming the server that holds it.
    pub fn acquire(data_dir: &Path, listen: &str) -> anyhow::Result<Self> {
        let path = data_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // A planted symlink must not make warren lock (or write) another file.
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .with_context(|| format!("cannot open the data directory's lock {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match serde_json::from_str::<Holder>(&text) {
                    Ok(h) => format!(
                        "warren serve (pid {}, listening on {}, since {})",
                        h.pid, h.listen, h.since
                    ),
                    Err(_) => "another warren process".to_owned(),
                };
                bail!(
                    "the data directory {} is in use by {holder}; stop that server first, or \
                     give this one another --data-dir",
                    data_dir.display()
                );
            }
            Err(TryLockError::Error(error)) => {
                return Err(error).with_context(|| {
                    format!("cannot lock the data directory's lock {}", path.display())
                })
            }
        }
        let mut lock = Self {
            file,
            path,
            since: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        lock.record(listen)?;
        Ok(lock)
    }

    /// Rewrites the holder record, e.g. once the listener is bound and its port known.
    pub fn record(&mut self, listen: &str) -> anyhow::Result<()> {
        let holder = Holder {
            pid: std::process::id(),
            since: self.since.clone(),
            listen: listen.to_owned(),
        };
        let text = serde_json::to_string(&holder).expect("a holder serialises");
        (|| {
            self.file.set_len(0)?;
            self.file.seek(SeekFrom::Start(0))?;
            self.file.write_all(text.as_bytes())?;
            self.file.flush()
        })()
        .with_context(|| format!("cannot write the lock file {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path(), "127.0.0.1:7000").unwrap();
        let error = DataDirLock::acquire(dir.path(), "127.0.0.1:7001").unwrap_err();
        let message = format!("{error:#}");
        assert!(
            message.contains(&format!("pid {}", std::process::id()))
                && message.contains("127.0.0.1:7000")
                && message.contains("--data-dir"),
            "{message}"
        );
        drop(first);
        DataDirLock::acquire(dir.path(), "127.0.0.1:7001").expect("free again once dropped");
    }

    #[test]
    fn a_stale_lock_file_of_a_dead_holder_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(LOCK_FILE),
            r#"{"pid":1,"since":"2020-01-01T00:00:00Z","listen":"x"}"#,
        )
        .unwrap();
        let lock = DataDirLock::acquire(dir.path(), "127.0.0.1:7002").unwrap();
        drop(lock);
    }

    #[test]
    fn a_symlink_planted_as_the_lock_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep me").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        assert!(DataDirLock::acquire(dir.path(), "x").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }
}
