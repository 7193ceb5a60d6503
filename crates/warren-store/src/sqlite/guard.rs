//! The execution guard on SQLite: the same lease row as on PostgreSQL, judged by the
//! process clock (one process owns the file's guards; see docs/design.md).

use std::time::Duration;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use warren_core::SandboxId;

use super::Columns;
use crate::guard::ttl_millis;
use crate::{FenceCheck, Guard, GuardAcquire, StoreError};

const COLUMNS: &str = "sandbox_id, token, holder, acquired_at, expires_at";

fn guard_from_row(row: &SqliteRow) -> Result<Guard, StoreError> {
    let columns = Columns {
        row,
        table: "guards",
    };
    Ok(Guard {
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        token: columns.get("token")?,
        holder: columns.get("holder")?,
        acquired_at: columns.time("acquired_at")?,
        expires_at: columns.time("expires_at")?,
    })
}

pub(super) async fn acquire(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
    holder: &str,
    ttl: Duration,
) -> Result<GuardAcquire, StoreError> {
    const OPERATION: &str = "acquire a guard";
    let expires = now.saturating_add(ttl_millis(ttl));
    // IMMEDIATE: the write lock is held from the upsert to the read of the live holder, so
    // the answer is one consistent view.
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(StoreError::query(OPERATION))?;
    // Takes the guard when there is no row or its holder lapsed; a live holder's row is
    // left alone (the WHERE of the upsert) and nothing is returned.
    let taken = sqlx::query(&format!(
        "INSERT INTO guards ({COLUMNS}, ttl_ms) VALUES (?1, 1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (sandbox_id) DO UPDATE SET token = guards.token + 1, \
         holder = excluded.holder, acquired_at = excluded.acquired_at, \
         expires_at = excluded.expires_at, ttl_ms = excluded.ttl_ms \
         WHERE guards.expires_at <= ?3 RETURNING {COLUMNS}"
    ))
    .bind(sandbox.as_str())
    .bind(holder)
    .bind(now)
    .bind(expires)
    .bind(ttl_millis(ttl))
    .fetch_optional(&mut *tx)
    .await
    .map_err(StoreError::on_sandbox(OPERATION, sandbox))?;
    let answer = match taken {
        Some(row) => GuardAcquire::Acquired(guard_from_row(&row)?),
        None => {
            let row = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM guards WHERE sandbox_id = ?1"
            ))
            .bind(sandbox.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
            GuardAcquire::Held(guard_from_row(&row)?)
        }
    };
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(answer)
}

pub(super) async fn renew(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
    token: i64,
    ttl: Option<Duration>,
) -> Result<Option<Guard>, StoreError> {
    let row = sqlx::query(&format!(
        "UPDATE guards SET ttl_ms = COALESCE(?3, ttl_ms), expires_at = ?4 + COALESCE(?3, ttl_ms) \
         WHERE sandbox_id = ?1 AND token = ?2 AND expires_at > ?4 RETURNING {COLUMNS}"
    ))
    .bind(sandbox.as_str())
    .bind(token)
    .bind(ttl.map(ttl_millis))
    .bind(now)
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("renew a guard"))?;
    row.as_ref().map(guard_from_row).transpose()
}

pub(super) async fn release(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
    token: i64,
) -> Result<bool, StoreError> {
    let result = sqlx::query(
        "UPDATE guards SET expires_at = ?3 WHERE sandbox_id = ?1 AND token = ?2 \
         AND expires_at > ?3",
    )
    .bind(sandbox.as_str())
    .bind(token)
    .bind(now)
    .execute(pool)
    .await
    .map_err(StoreError::query("release a guard"))?;
    Ok(result.rows_affected() == 1)
}

pub(super) async fn current(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
) -> Result<Option<Guard>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM guards WHERE sandbox_id = ?1 AND expires_at > ?2"
    ))
    .bind(sandbox.as_str())
    .bind(now)
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("read a guard"))?;
    row.as_ref().map(guard_from_row).transpose()
}

pub(super) async fn check_fence(
    pool: &SqlitePool,
    sandbox: &SandboxId,
    token: i64,
) -> Result<FenceCheck, StoreError> {
    let newest: Option<i64> = sqlx::query_scalar("SELECT token FROM guards WHERE sandbox_id = ?1")
        .bind(sandbox.as_str())
        .fetch_optional(pool)
        .await
        .map_err(StoreError::query("check a fencing token"))?;
    Ok(FenceCheck::of(token, newest))
}
