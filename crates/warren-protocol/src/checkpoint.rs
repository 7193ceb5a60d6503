//! Wire types of workdir checkpoints (I28).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A workdir checkpoint (I28).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInfo {
    /// `ckpt-…`.
    pub checkpoint_id: String,
    /// The workdir it records.
    pub workdir: String,
    /// Regular files recorded.
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// RFC 3339.
    pub created_at: String,
}

/// What taking a checkpoint did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointSummary {
    /// Regular files (hard links counted once).
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Sockets, fifos and devices, which are not kept.
    pub skipped: u64,
    /// Bytes read from the workdir.
    pub bytes_read: u64,
    /// Compressed bytes newly stored; chunks already stored for this uid cost nothing.
    pub bytes_stored: u64,
    /// Chunks the files were cut into, and how many were new.
    pub chunks: u64,
    /// See `chunks`.
    pub chunks_new: u64,
    /// `bytes_read / bytes_stored` (how much deduplication and compression saved).
    pub dedup_ratio: f64,
    /// Wall-clock time.
    pub elapsed_ms: u64,
}

/// `POST /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointCreated {
    /// The checkpoint.
    pub checkpoint: CheckpointInfo,
    /// What it took.
    pub summary: CheckpointSummary,
}

/// `GET /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    /// Oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
}

/// `GET /v1/sandboxes/{id}/checkpoints/{cid}/diff`: paths relative to the workdir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointDiff {
    /// There now, not in the checkpoint.
    pub added: Vec<String>,
    /// In the checkpoint, not there now.
    pub removed: Vec<String>,
    /// In both, with other content, type, mode or link target.
    pub changed: Vec<String>,
}
