//! The execution guard on PostgreSQL: a lease row judged by the database's clock
//! (`clock_timestamp()`), so every replica agrees when a guard lapsed.
//!
//! Not an advisory lock: those belong to a session, carry no token, and a holder that
//! stopped without closing its connection would keep one forever.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgRow};
use warren_core::SandboxId;

use crate::guard::ttl_millis;
use crate::rows::Columns;
use crate::{FenceCheck, Guard, GuardAcquire, StoreError};

const COLUMNS: &str = "sandbox_id, token, holder, acquired_at, expires_at";

/// The database's current time in unix milliseconds, as SQL. `clock_timestamp()` moves
/// within a transaction, unlike `now()`, so a long transaction never judges by a stale time.
/// Truncated, as every other clock of warren's is (`timestamp_millis`): a bare `::bigint`
/// rounds to the nearest millisecond, which puts a time up to half a millisecond in the
/// future, so a guard granted for 40 s could be seen to last a little over 40 s.
pub(super) const NOW_MS: &str = "floor(extract(epoch from clock_timestamp()) * 1000)::bigint";

fn guard_from_row(row: &PgRow) -> Result<Guard, StoreError> {
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
    pool: &PgPool,
    sandbox: &SandboxId,
    holder: &str,
    ttl: Duration,
) -> Result<GuardAcquire, StoreError> {
    const OPERATION: &str = "acquire a guard";
    // The upsert takes a free or lapsed row with token + 1 and leaves a live holder's row
    // alone; PostgreSQL locks the conflicting row and judges the WHERE on its newest
    // version, so two acquirers can never both take it.
    let take = format!(
        "INSERT INTO guards ({COLUMNS}, ttl_ms) SELECT $1, 1, $2, now_ms, now_ms + $3, $3 \
         FROM (SELECT {NOW_MS} AS now_ms) AS clock \
         ON CONFLICT (sandbox_id) DO UPDATE SET token = guards.token + 1, \
         holder = excluded.holder, acquired_at = excluded.acquired_at, \
         expires_at = excluded.expires_at, ttl_ms = excluded.ttl_ms \
         WHERE guards.expires_at <= excluded.acquired_at RETURNING {COLUMNS}"
    );
    let live =
        format!("SELECT {COLUMNS} FROM guards WHERE sandbox_id = $1 AND expires_at > {NOW_MS}");
    // A holder that was live at the upsert may lapse or release before the read that
    // reports it; then the guard is free and the upsert is tried again.
    for _ in 0..8 {
        let taken = sqlx::query(&take)
            .bind(sandbox.as_str())
            .bind(holder)
            .bind(ttl_millis(ttl))
            .fetch_optional(pool)
            .await
            .map_err(StoreError::on_sandbox(OPERATION, sandbox))?;
        if let Some(row) = taken {
            return Ok(GuardAcquire::Acquired(guard_from_row(&row)?));
        }
        let held = sqlx::query(&live)
            .bind(sandbox.as_str())
            .fetch_optional(pool)
            .await
            .map_err(StoreError::query(OPERATION))?;
        if let Some(row) = held {
            return Ok(GuardAcquire::Held(guard_from_row(&row)?));
        }
    }
    Err(StoreError::Corrupt {
        table: "guards",
        column: "expires_at",
        detail: format!("the guard of {sandbox} is neither free nor held"),
    })
}

pub(super) async fn renew(
    pool: &PgPool,
    sandbox: &SandboxId,
    token: i64,
    ttl: Option<Duration>,
) -> Result<Option<Guard>, StoreError> {
    let row = sqlx::query(&format!(
        "UPDATE guards SET ttl_ms = COALESCE($3, ttl_ms), \
         expires_at = {NOW_MS} + COALESCE($3, ttl_ms) \
         WHERE sandbox_id = $1 AND token = $2 AND expires_at > {NOW_MS} RETURNING {COLUMNS}"
    ))
    .bind(sandbox.as_str())
    .bind(token)
    .bind(ttl.map(ttl_millis))
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("renew a guard"))?;
    row.as_ref().map(guard_from_row).transpose()
}

pub(super) async fn release(
    pool: &PgPool,
    sandbox: &SandboxId,
    token: i64,
) -> Result<bool, StoreError> {
    let result = sqlx::query(&format!(
        "UPDATE guards SET expires_at = {NOW_MS} WHERE sandbox_id = $1 AND token = $2 \
         AND expires_at > {NOW_MS}"
    ))
    .bind(sandbox.as_str())
    .bind(token)
    .execute(pool)
    .await
    .map_err(StoreError::query("release a guard"))?;
    Ok(result.rows_affected() == 1)
}

pub(super) async fn current(
    pool: &PgPool,
    sandbox: &SandboxId,
) -> Result<Option<Guard>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM guards WHERE sandbox_id = $1 AND expires_at > {NOW_MS}"
    ))
    .bind(sandbox.as_str())
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("read a guard"))?;
    row.as_ref().map(guard_from_row).transpose()
}

pub(super) async fn check_fence(
    pool: &PgPool,
    sandbox: &SandboxId,
    token: i64,
) -> Result<FenceCheck, StoreError> {
    let newest: Option<i64> = sqlx::query_scalar("SELECT token FROM guards WHERE sandbox_id = $1")
        .bind(sandbox.as_str())
        .fetch_optional(pool)
        .await
        .map_err(StoreError::query("check a fencing token"))?;
    Ok(FenceCheck::of(token, newest))
}

/// [`check_fence`] that keeps the guard row locked `FOR SHARE` in a transaction of its own
/// while the token is current, so an acquisition on any replica (its upsert updates the
/// row) waits until the hold is dropped: the fenced write and the check are one critical
/// section across processes, as the fence gate makes them within one.
pub(super) async fn hold_fence(
    pool: &PgPool,
    sandbox: &SandboxId,
    token: i64,
) -> Result<(FenceCheck, Option<crate::FenceHold>), StoreError> {
    const OPERATION: &str = "hold a fencing token";
    let mut tx = pool.begin().await.map_err(StoreError::query(OPERATION))?;
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT token FROM guards WHERE sandbox_id = $1 FOR SHARE")
            .bind(sandbox.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
    let check = FenceCheck::of(token, newest);
    let hold = (check == FenceCheck::Current).then(|| crate::FenceHold::new(tx));
    Ok((check, hold))
}
