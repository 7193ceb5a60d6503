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

use crate::rows::{node_from_row, Columns};
use crate::sql::{Dialect, Query, Record};
use crate::StoreError;

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

/// The row as written: a registration or renewal is judged at its own `renewed_at`.
fn written(row: &impl Record) -> Result<NodeRecord, StoreError> {
    let now: i64 = Columns {
        row,
        table: "nodes",
    }
    .get("renewed_at")?;
    node_from_row(row, now)
}

pub(crate) async fn register<D: Dialect>(
    db: &D,
    node_id: &str,
    advertise: &str,
    ttl: Duration,
) -> Result<NodeRecord, StoreError> {
    // One statement: two registrations of one id serialise on the row, each taking the
    // epoch after the other's.
    let row = Query::new(format!(
        "INSERT INTO nodes ({COLUMNS}, ttl_ms) \
         SELECT $1, $2, 1, now_ms, now_ms, now_ms + $3, NULL, $3 \
         FROM (SELECT :now AS now_ms) AS clock WHERE true \
         ON CONFLICT (node_id) DO UPDATE SET advertise = excluded.advertise, \
         epoch = nodes.epoch + 1, registered_at = excluded.registered_at, \
         renewed_at = excluded.renewed_at, expires_at = excluded.expires_at, \
         left_at = NULL, ttl_ms = excluded.ttl_ms RETURNING {COLUMNS}"
    ))
    .bind(node_id)
    .bind(advertise)
    .bind(ttl_millis(ttl))
    .clock(db)
    .fetch_one(db)
    .await
    .map_err(StoreError::query("register a node"))?;
    written(&row)
}

pub(crate) async fn renew<D: Dialect>(
    db: &D,
    node_id: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<Option<NodeRecord>, StoreError> {
    let row = Query::new(format!(
        "UPDATE nodes SET renewed_at = clock.now_ms, expires_at = clock.now_ms + $3, \
         ttl_ms = $3 FROM (SELECT :now AS now_ms) AS clock \
         WHERE node_id = $1 AND epoch = $2 AND left_at IS NULL \
         AND expires_at > clock.now_ms RETURNING {}",
        qualified()
    ))
    .bind(node_id)
    .bind(epoch)
    .bind(ttl_millis(ttl))
    .clock(db)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("renew a node's lease"))?;
    row.as_ref().map(written).transpose()
}

pub(crate) async fn leave<D: Dialect>(
    db: &D,
    node_id: &str,
    epoch: i64,
) -> Result<bool, StoreError> {
    let done = Query::new(
        "UPDATE nodes SET left_at = clock.now_ms, \
         expires_at = CASE WHEN expires_at < clock.now_ms THEN expires_at ELSE clock.now_ms END FROM (SELECT :now AS now_ms) AS clock \
         WHERE node_id = $1 AND epoch = $2 AND left_at IS NULL"
    )
    .bind(node_id)
    .bind(epoch)
    .clock(db)
    .execute(db)
    .await
    .map_err(StoreError::query("record a node leaving"))?;
    Ok(done == 1)
}

pub(crate) async fn list<D: Dialect>(db: &D) -> Result<Vec<NodeRecord>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {}, clock.now_ms FROM nodes, (SELECT :now AS now_ms) AS clock \
         ORDER BY node_id",
        qualified()
    ))
    .clock(db)
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list the nodes"))?;
    rows.iter()
        .map(|row| {
            let now: i64 = Columns {
                row,
                table: "nodes",
            }
            .get("now_ms")?;
            node_from_row(row, now)
        })
        .collect()
}

/// The columns, named by table where a clock is joined.
fn qualified() -> String {
    COLUMNS
        .split(", ")
        .map(|column| format!("nodes.{column} AS {column}"))
        .collect::<Vec<_>>()
        .join(", ")
}
