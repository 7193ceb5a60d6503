//! Cluster membership: one row per node (issue 14), with an epoch and a lease on the
//! store's clock.
//!
//! A node registers under its `--node-id` and gets an epoch larger than every earlier
//! registration of that id, so a process that restarted (or a second process given the
//! same id) supersedes the previous one: the old epoch can no longer renew and must stop.
//! The lease is renewed by its holder, never extended by anyone else; a lapsed lease is
//! not renewed either (the node must register again, with a new epoch, and give up what
//! it held), so "lapsed" is final for that epoch on every replica.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// One node of the cluster as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeRecord {
    /// The node's name (`--node-id`).
    pub node_id: String,
    /// The internal URL other replicas reach it at (`--advertise`).
    pub advertise: String,
    /// Grows at every registration of this id.
    pub epoch: i64,
    /// When this epoch registered.
    pub registered_at: DateTime<Utc>,
    /// When its lease was last renewed.
    pub renewed_at: DateTime<Utc>,
    /// When its lease lapses unless renewed.
    pub expires_at: DateTime<Utc>,
    /// When it left cleanly, if it did.
    pub left_at: Option<DateTime<Utc>>,
    /// Where it is, by the store's clock when the record was read.
    pub state: NodeState,
}

/// Where a node's current epoch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Its lease is live.
    Live,
    /// Its lease lapsed without it leaving: it may be dead, paused or cut off.
    Lapsed,
    /// It left cleanly.
    Left,
}

impl NodeState {
    /// The state of a row read at `now` (unix milliseconds).
    pub(crate) fn at(now: i64, expires_at: i64, left: bool) -> Self {
        if left {
            Self::Left
        } else if expires_at > now {
            Self::Live
        } else {
            Self::Lapsed
        }
    }
}

/// The columns every query returns.
pub(crate) const COLUMNS: &str =
    "node_id, advertise, epoch, registered_at, renewed_at, expires_at, left_at";

/// Milliseconds of a node lease.
pub(crate) fn ttl_millis(ttl: Duration) -> i64 {
    crate::guard::ttl_millis(ttl)
}
