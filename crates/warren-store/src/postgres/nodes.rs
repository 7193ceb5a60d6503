//! Cluster membership on PostgreSQL, judged by the database's clock, so every replica
//! agrees when a node's lease lapsed.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgRow};

use super::guard::NOW_MS;
use crate::nodes::{ttl_millis, COLUMNS};
use crate::{NodeRecord, StoreError};

use super::node_from_row;

/// The row as written: a registration or renewal is judged at its own `renewed_at`.
fn written(row: &PgRow) -> Result<NodeRecord, StoreError> {
    use sqlx::Row;
    let now: i64 = row
        .try_get("renewed_at")
        .map_err(StoreError::query("read a node"))?;
    node_from_row(row, now)
}

pub(super) async fn register(
    pool: &PgPool,
    node_id: &str,
    advertise: &str,
    ttl: Duration,
) -> Result<NodeRecord, StoreError> {
    // One statement: two registrations of one id serialise on the row, each taking the
    // epoch after the other's.
    let row = sqlx::query(&format!(
        "INSERT INTO nodes ({COLUMNS}, ttl_ms) \
         SELECT $1, $2, 1, now_ms, now_ms, now_ms + $3, NULL, $3 \
         FROM (SELECT {NOW_MS} AS now_ms) AS clock \
         ON CONFLICT (node_id) DO UPDATE SET advertise = excluded.advertise, \
         epoch = nodes.epoch + 1, registered_at = excluded.registered_at, \
         renewed_at = excluded.renewed_at, expires_at = excluded.expires_at, \
         left_at = NULL, ttl_ms = excluded.ttl_ms RETURNING {COLUMNS}"
    ))
    .bind(node_id)
    .bind(advertise)
    .bind(ttl_millis(ttl))
    .fetch_one(pool)
    .await
    .map_err(StoreError::query("register a node"))?;
    written(&row)
}

pub(super) async fn renew(
    pool: &PgPool,
    node_id: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<Option<NodeRecord>, StoreError> {
    let row = sqlx::query(&format!(
        "UPDATE nodes SET renewed_at = clock.now_ms, expires_at = clock.now_ms + $3, \
         ttl_ms = $3 FROM (SELECT {NOW_MS} AS now_ms) AS clock \
         WHERE node_id = $1 AND epoch = $2 AND left_at IS NULL \
         AND expires_at > clock.now_ms RETURNING {}",
        qualified()
    ))
    .bind(node_id)
    .bind(epoch)
    .bind(ttl_millis(ttl))
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("renew a node's lease"))?;
    row.as_ref().map(written).transpose()
}

pub(super) async fn leave(pool: &PgPool, node_id: &str, epoch: i64) -> Result<bool, StoreError> {
    let done = sqlx::query(&format!(
        "UPDATE nodes SET left_at = clock.now_ms, \
         expires_at = LEAST(expires_at, clock.now_ms) FROM (SELECT {NOW_MS} AS now_ms) AS clock \
         WHERE node_id = $1 AND epoch = $2 AND left_at IS NULL"
    ))
    .bind(node_id)
    .bind(epoch)
    .execute(pool)
    .await
    .map_err(StoreError::query("record a node leaving"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn list(pool: &PgPool) -> Result<Vec<NodeRecord>, StoreError> {
    use sqlx::Row;
    let rows = sqlx::query(&format!(
        "SELECT {}, clock.now_ms FROM nodes, (SELECT {NOW_MS} AS now_ms) AS clock \
         ORDER BY node_id",
        qualified()
    ))
    .fetch_all(pool)
    .await
    .map_err(StoreError::query("list the nodes"))?;
    rows.iter()
        .map(|row| {
            let now: i64 = row
                .try_get("now_ms")
                .map_err(StoreError::query("list the nodes"))?;
            node_from_row(row, now)
        })
        .collect()
}

/// The columns, named by table where a clock is joined.
fn qualified() -> String {
    COLUMNS
        .split(", ")
        .map(|column| format!("nodes.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}
