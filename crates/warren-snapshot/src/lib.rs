//! warren's content-addressed snapshot engine (I28, I30, I31), shared by workdir
//! checkpoints and runtime snapshots.
//!
//! A tree is read by file descriptor through `warren-fs`, files are cut by content-defined
//! chunking (FastCDC 2020: 128 KiB / 512 KiB / 2 MiB), each chunk is named by its BLAKE3 hash and
//! stored zstd-compressed once, and a [`Manifest`] lists every entry (path, type, mode,
//! owner, time, size, symlink target, hard link, chunk list). The manifest is itself
//! content-addressed and is written last: it is the commit point, so an interrupted
//! snapshot is never visible. Work streams: memory stays within a few chunks whatever the
//! tree's size.
//!
//! A restore checks every chunk's hash, builds the whole tree in a temporary directory
//! next to the target and only then swaps it in with one `RENAME_EXCHANGE`: a corrupt or
//! missing chunk gives a clear error and leaves the target as it was.

#![deny(missing_docs)]

mod engine;
mod fetch;
mod gc;
mod manifest;
mod pack;
mod redis_store;
mod s3;
mod sql;
mod store;

pub use engine::{
    diff, diff_with, restore, restore_transient_with, restore_with, snapshot, snapshot_with,
    CancelFlag, Diff, SnapshotLimits, SnapshotStats, DEFAULT_MAX_BYTES,
};
pub use gc::{collect_garbage, GcStats};
pub use manifest::{EntryKind, Hole, Manifest, ManifestEntry};
pub use redis_store::RedisStore;
pub use s3::{S3Config, S3Store};
pub use sql::SqlStore;
pub use store::{LocalStore, ObjectStore};

/// Why a snapshot, restore or diff failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The tree could not be read or written; the file layer says why.
    #[error("{0}")]
    File(#[from] warren_fs::FsError),
    /// Reading or writing a file's bytes failed midway.
    #[error("{path}: {source}")]
    Io {
        /// The entry, relative to the tree.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The object store failed.
    #[error("the snapshot store could not {operation}: {source}")]
    Store {
        /// What it was doing.
        operation: &'static str,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A key that is not one this engine makes.
    #[error("invalid object key {0:?}")]
    InvalidKey(String),
    /// No manifest with this id.
    #[error("no snapshot {0} in the store")]
    ManifestNotFound(String),
    /// A chunk the manifest needs is not in the store.
    #[error("chunk {hash} of {path} is missing from the store; the snapshot cannot be restored")]
    MissingChunk {
        /// The chunk's BLAKE3 hash.
        hash: String,
        /// The file that needs it.
        path: String,
    },
    /// A stored object's content does not match its name.
    #[error("{what} {hash} is corrupt (its content does not match its hash); the snapshot cannot be restored")]
    Corrupt {
        /// "chunk" or "manifest".
        what: &'static str,
        /// Its name.
        hash: String,
    },
    /// The tree holds more file data than one snapshot may read (holes not counted).
    #[error("{path}: the tree holds more than {limit} bytes of file data, the most one snapshot may read ([snapshots] max_bytes); remove or shrink large files")]
    TooLarge {
        /// The entry that crossed the limit, relative to the tree.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The work was stopped before it finished: nothing of it is visible.
    #[error("the snapshot was stopped before it finished: {reason}")]
    Cancelled {
        /// Why (the server is shutting down, the deadline passed).
        reason: &'static str,
    },
}

impl SnapshotError {
    pub(crate) fn store(operation: &'static str, source: std::io::Error) -> Self {
        Self::Store { operation, source }
    }
}
