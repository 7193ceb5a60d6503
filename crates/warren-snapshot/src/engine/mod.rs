//! Taking, comparing and restoring snapshots of a tree beneath a [`WorkspaceRoot`].

mod chunking;
mod diff;
mod restore;
mod take;

pub use diff::{diff, diff_with, Diff};
pub use restore::{restore, restore_transient_with, restore_with};
pub use take::{snapshot, snapshot_with};

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use warren_fs::{Entry, FsError, WorkspaceRoot, MAX_WALK_DEPTH};

use crate::SnapshotError;

/// Chunk sizes (restic's order of magnitude): an edit re-stores at most a few hundred KiB,
/// and a large file is a few chunks per MiB, not dozens. Chunks are gathered into packs
/// (`pack.rs`), so their number is no longer the number of objects the store creates.
const MIN_CHUNK: usize = 128 * 1024;
const AVG_CHUNK: usize = 512 * 1024;
const MAX_CHUNK: usize = 2 * 1024 * 1024;
/// zstd level 1: the fast end, as `zstd -1`; chunks that do not compress cost little.
const ZSTD_LEVEL: i32 = 1;
/// Files with at most this much data are read whole and cut in memory; larger ones are
/// streamed through a buffer of the largest chunk.
const WHOLE_FILE: u64 = 8 * 1024 * 1024;
/// Packs one index object names (the last index of a snapshot may name fewer): a snapshot
/// stopped midway leaves at most this many packs unindexed, so unused by the next one.
const PACKS_PER_INDEX: usize = 4;
/// Most entries one tree may have.
const MAX_ENTRIES: usize = 5_000_000;
/// Most bytes of file data (holes not counted) one snapshot reads unless told otherwise:
/// the order of a generous workspace. Beyond it a snapshot costs minutes of a server
/// thread and as much store space; the operator raises it in `[snapshots] max_bytes`.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// Holes shorter than this are read as zeros rather than recorded: the manifest stays
/// short whatever the file's layout, at the cost of reading at most this much per data
/// extent.
const MIN_HOLE: u64 = 64 * 1024;
/// How many data extents are looked up between two checks of the cancel flag.
const EXTENTS_PER_CHECK: usize = 1024;

/// A flag that stops snapshots and restores at their next chunk: set it, and the work
/// fails with [`SnapshotError::Cancelled`] within a chunk's time. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag; work watching it stops.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether it was set.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What bounds one snapshot, diff or restore: the data it may read, a flag that stops it
/// (server shutdown), and a deadline (the reaper's, per sandbox). Blocking threads check
/// them between chunks, so they never outlive a cancel by more than a chunk's work.
#[derive(Debug, Clone)]
pub struct SnapshotLimits {
    /// Most bytes of file data a snapshot reads or reuses, holes not counted; over it the
    /// snapshot fails with [`SnapshotError::TooLarge`].
    pub max_bytes: u64,
    /// Stops the work when set.
    pub cancel: Option<CancelFlag>,
    /// Stops the work when passed.
    pub deadline: Option<Instant>,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            cancel: None,
            deadline: None,
        }
    }
}

impl SnapshotLimits {
    /// Fails once the work must stop.
    fn check(&self) -> Result<(), SnapshotError> {
        if self.cancel.as_ref().is_some_and(CancelFlag::is_cancelled) {
            return Err(SnapshotError::Cancelled {
                reason: "the server is shutting down",
            });
        }
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(SnapshotError::Cancelled {
                reason: "its deadline passed",
            });
        }
        Ok(())
    }
}

/// What a snapshot did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SnapshotStats {
    /// Regular files (hard links counted once).
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Entries that cannot be kept (sockets, fifos, devices), skipped.
    pub skipped: u64,
    /// Bytes read from the tree.
    pub bytes_read: u64,
    /// Compressed bytes newly written to the store (deduplicated chunks cost nothing).
    pub bytes_stored: u64,
    /// Chunks the files were cut into.
    pub chunks: u64,
    /// Of those, how many were new to the store.
    pub chunks_new: u64,
    /// Files found unchanged since the parent snapshot (same inode, size, times) whose
    /// chunks were reused without reading them.
    pub files_unchanged: u64,
}

/// The entries under `base` with paths relative to it (the exact bytes of their names),
/// parents first; the base itself comes first with the empty path.
fn walk(root: &WorkspaceRoot, base: &str) -> Result<Vec<(OsString, Entry)>, SnapshotError> {
    let top = root.stat(base)?;
    let listing = root.list(base, MAX_WALK_DEPTH, MAX_ENTRIES)?;
    if listing.truncated {
        return Err(SnapshotError::File(FsError::TooManyEntries {
            path: base.to_owned(),
            limit: MAX_ENTRIES,
        }));
    }
    // Listed paths start with the base as the file layer normalises it (`top.os_path`).
    let mut prefix = top.os_path.as_bytes().to_vec();
    if !prefix.is_empty() {
        prefix.push(b'/');
    }
    let mut entries = vec![(OsString::new(), top)];
    for entry in listing.entries {
        let bytes = entry.os_path.as_bytes();
        let relative = OsStr::from_bytes(bytes.strip_prefix(prefix.as_slice()).unwrap_or(bytes));
        entries.push((relative.to_owned(), entry));
    }
    Ok(entries)
}

fn join(base: &str, relative: &str) -> String {
    match (base.is_empty(), relative.is_empty()) {
        (true, _) => relative.to_owned(),
        (false, true) => base.to_owned(),
        (false, false) => format!("{base}/{relative}"),
    }
}

/// [`join`] for a relative path that need not be UTF-8.
fn join_os(base: &str, relative: &OsStr) -> OsString {
    let mut out = OsString::from(base);
    if !base.is_empty() && !relative.is_empty() {
        out.push("/");
    }
    out.push(relative);
    out
}

/// A relative path as messages and diffs show it.
fn shown(relative: &OsStr) -> String {
    relative.to_string_lossy().into_owned()
}

/// Data bytes seen so far by one snapshot or diff, against its limit.
struct Budget<'l> {
    limits: &'l SnapshotLimits,
    used: u64,
}

impl Budget<'_> {
    fn spend(&mut self, bytes: u64, shown: &str) -> Result<(), SnapshotError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limits.max_bytes {
            return Err(SnapshotError::TooLarge {
                path: shown.to_owned(),
                limit: self.limits.max_bytes,
            });
        }
        Ok(())
    }
}
