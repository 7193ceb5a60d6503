//! Cluster membership on SQLite: the same rows as on PostgreSQL, judged by the process
//! clock (one process owns the file; see docs/design.md).

use std::time::Duration;

use sqlx::sqlite::SqlitePool;

use crate::nodes::{ttl_millis, COLUMNS};
use crate::{NodeRecord, StoreError};

use super::node_from_row;

pub(super) async fn register(
    pool: &SqlitePool,
    now: i64,
    node_id: &str,
    advertise: &str,
    ttl: Duration,
) -> Result<NodeRecord, StoreError> {
    let ttl = ttl_millis(ttl);
    let row = sqlx::query(&format!(
        "INSERT INTO nodes ({COLUMNS}, ttl_ms) VALUES (?1, ?2, 1, ?3, ?3, ?4, NULL, ?5) \
         ON CONFLICT (node_id) DO UPDATE SET advertise = excluded.advertise, \
         epoch = nodes.epoch + 1, registered_at = excluded.registered_at, \
         renewed_at = excluded.renewed_at, expires_at = excluded.expires_at, \
         left_at = NULL, ttl_ms = excluded.ttl_ms RETURNING {COLUMNS}"
    ))
    .bind(node_id)
    .bind(advertise)
    .bind(now)
    .bind(now.saturating_add(ttl))
    .bind(ttl)
    .fetch_one(pool)
    .await
    .map_err(StoreError::query("register a node"))?;
    node_from_row(&row, now)
}

pub(super) async fn renew(
    pool: &SqlitePool,
    now: i64,
    node_id: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<Option<NodeRecord>, StoreError> {
    let ttl = ttl_millis(ttl);
    let row = sqlx::query(&format!(
        "UPDATE nodes SET renewed_at = ?3, expires_at = ?4, ttl_ms = ?5 \
         WHERE node_id = ?1 AND epoch = ?2 AND left_at IS NULL AND expires_at > ?3 \
         RETURNING {COLUMNS}"
    ))
    .bind(node_id)
    .bind(epoch)
    .bind(now)
    .bind(now.saturating_add(ttl))
    .bind(ttl)
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("renew a node's lease"))?;
    row.map(|row| node_from_row(&row, now)).transpose()
}

pub(super) async fn leave(
    pool: &SqlitePool,
    now: i64,
    node_id: &str,
    epoch: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET left_at = ?3, expires_at = MIN(expires_at, ?3) \
         WHERE node_id = ?1 AND epoch = ?2 AND left_at IS NULL",
    )
    .bind(node_id)
    .bind(epoch)
    .bind(now)
    .execute(pool)
    .await
    .map_err(StoreError::query("record a node leaving"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn list(pool: &SqlitePool, now: i64) -> Result<Vec<NodeRecord>, StoreError> {
    let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM nodes ORDER BY node_id"))
        .fetch_all(pool)
        .await
        .map_err(StoreError::query("list the nodes"))?;
    rows.iter().map(|row| node_from_row(row, now)).collect()
}
