//! The execution guard's records: a lease row per sandbox with a fencing token.
//!
//! An execution guard gives one *executor* (an agent framework's run) the exclusive right to
//! change a sandbox for a while. Unlike an advisory lock it carries a fencing token that only
//! ever grows per sandbox, and warren itself — the resource — refuses a write fenced with an
//! older token than the newest issued. A holder that paused or lost its network past its TTL
//! therefore cannot write after another took over (the argument of Kleppmann's "How to do
//! distributed locking"; AgentScope's guards have no tokens). Expiry is judged by the
//! store's clock, never extended by the server: renewing is the holder's job.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use warren_core::SandboxId;

use crate::rows::Columns;
use crate::sql::{Dialect, Query, Record};
use crate::StoreError;

/// One issued guard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Guard {
    /// The sandbox it guards.
    pub sandbox_id: SandboxId,
    /// Its fencing token: larger than every token issued before for this sandbox.
    pub token: i64,
    /// Who holds it, as the holder named itself.
    pub holder: String,
    /// When it was issued.
    pub acquired_at: DateTime<Utc>,
    /// When it lapses unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// The answer to an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardAcquire {
    /// The guard was free (never issued, released or lapsed): this one is new.
    Acquired(Guard),
    /// Another holder's guard is live; nothing changed.
    Held(Guard),
}

/// How a fencing token compares with the newest issued for its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCheck {
    /// The newest token: a write carrying it is accepted, even after the guard lapsed, as
    /// long as no newer one was issued (only a newer holder makes a token stale).
    Current,
    /// A newer token was issued: a write carrying this one must be refused.
    Stale {
        /// The newest token.
        newest: i64,
    },
    /// No such token was ever issued for this sandbox.
    Unknown {
        /// The newest token, if any was issued.
        newest: Option<i64>,
    },
}

impl FenceCheck {
    /// Compares `token` with `newest`, the newest token issued for the sandbox, if any.
    pub fn of(token: i64, newest: Option<i64>) -> Self {
        match newest {
            Some(newest) if token == newest => Self::Current,
            Some(newest) if (1..newest).contains(&token) => Self::Stale { newest },
            newest => Self::Unknown { newest },
        }
    }
}

/// A clock a test moves by hand, for stores whose guard expiry runs on the process clock
/// (SQLite). Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    millis: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            millis: Arc::new(AtomicI64::new(start.timestamp_millis())),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.millis.fetch_add(by, Ordering::SeqCst);
    }

    /// The time it shows, in unix milliseconds.
    pub fn now_millis(&self) -> i64 {
        self.millis.load(Ordering::SeqCst)
    }
}

/// A TTL as stored: whole milliseconds, saturating.
pub(crate) fn ttl_millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// A fencing token's check held open in the store (PostgreSQL: the guard row locked in a
/// transaction), so no newer token can be issued by any process until it is dropped.
pub struct FenceHold {
    _held: std::sync::Mutex<Box<dyn Send>>,
}

impl FenceHold {
    pub(crate) fn new(held: impl Send + 'static) -> Self {
        Self {
            _held: std::sync::Mutex::new(Box::new(held)),
        }
    }
}

impl std::fmt::Debug for FenceHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FenceHold")
    }
}

const COLUMNS: &str = "sandbox_id, token, holder, acquired_at, expires_at";

fn guard_from_row(row: &impl Record) -> Result<Guard, StoreError> {
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

pub(crate) async fn acquire<D: Dialect>(
    db: &D,
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
         FROM (SELECT :now AS now_ms) AS clock WHERE true \
         ON CONFLICT (sandbox_id) DO UPDATE SET token = guards.token + 1, \
         holder = excluded.holder, acquired_at = excluded.acquired_at, \
         expires_at = excluded.expires_at, ttl_ms = excluded.ttl_ms \
         WHERE guards.expires_at <= excluded.acquired_at RETURNING {COLUMNS}"
    );
    let live = format!("SELECT {COLUMNS} FROM guards WHERE sandbox_id = $1 AND expires_at > :now");
    // A holder that was live at the upsert may lapse or release before the read that
    // reports it; then the guard is free and the upsert is tried again.
    for _ in 0..8 {
        let taken = Query::new(take.as_str())
            .bind(sandbox.as_str())
            .bind(holder)
            .bind(ttl_millis(ttl))
            .clock(db)
            .fetch_optional(db)
            .await
            .map_err(StoreError::on_sandbox(OPERATION, sandbox))?;
        if let Some(row) = taken {
            return Ok(GuardAcquire::Acquired(guard_from_row(&row)?));
        }
        let held = Query::new(live.as_str())
            .bind(sandbox.as_str())
            .clock(db)
            .fetch_optional(db)
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

pub(crate) async fn renew<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    token: i64,
    ttl: Option<Duration>,
) -> Result<Option<Guard>, StoreError> {
    let row = Query::new(format!(
        "UPDATE guards SET ttl_ms = COALESCE($3, ttl_ms), \
         expires_at = :now + COALESCE($3, ttl_ms) \
         WHERE sandbox_id = $1 AND token = $2 AND expires_at > :now RETURNING {COLUMNS}"
    ))
    .bind(sandbox.as_str())
    .bind(token)
    .bind(ttl.map(ttl_millis))
    .clock(db)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("renew a guard"))?;
    row.as_ref().map(guard_from_row).transpose()
}

pub(crate) async fn release<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    token: i64,
) -> Result<bool, StoreError> {
    let released = Query::new(
        "UPDATE guards SET expires_at = :now WHERE sandbox_id = $1 AND token = $2 \
         AND expires_at > :now",
    )
    .bind(sandbox.as_str())
    .bind(token)
    .clock(db)
    .execute(db)
    .await
    .map_err(StoreError::query("release a guard"))?;
    Ok(released == 1)
}

pub(crate) async fn current<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
) -> Result<Option<Guard>, StoreError> {
    let row = Query::new(format!(
        "SELECT {COLUMNS} FROM guards WHERE sandbox_id = $1 AND expires_at > :now"
    ))
    .bind(sandbox.as_str())
    .clock(db)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("read a guard"))?;
    row.as_ref().map(guard_from_row).transpose()
}

pub(crate) async fn check_fence<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    token: i64,
) -> Result<FenceCheck, StoreError> {
    let row = Query::new("SELECT token FROM guards WHERE sandbox_id = $1")
        .bind(sandbox.as_str())
        .fetch_optional(db)
        .await
        .map_err(StoreError::query("check a fencing token"))?;
    let newest: Option<i64> = row
        .map(|row| {
            Columns {
                row: &row,
                table: "guards",
            }
            .get("token")
        })
        .transpose()?;
    Ok(FenceCheck::of(token, newest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_token_is_current_and_older_ones_are_stale() {
        assert_eq!(FenceCheck::of(3, Some(3)), FenceCheck::Current);
        assert_eq!(FenceCheck::of(2, Some(3)), FenceCheck::Stale { newest: 3 });
        assert_eq!(FenceCheck::of(1, Some(3)), FenceCheck::Stale { newest: 3 });
    }

    #[test]
    fn a_token_never_issued_is_unknown() {
        assert_eq!(
            FenceCheck::of(4, Some(3)),
            FenceCheck::Unknown { newest: Some(3) }
        );
        assert_eq!(
            FenceCheck::of(0, Some(3)),
            FenceCheck::Unknown { newest: Some(3) }
        );
        assert_eq!(
            FenceCheck::of(1, None),
            FenceCheck::Unknown { newest: None }
        );
    }

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_share_it() {
        let clock = ManualClock::new(DateTime::from_timestamp_millis(1_000).unwrap());
        let other = clock.clone();
        clock.advance(Duration::from_millis(250));
        assert_eq!(other.now_millis(), 1_250);
    }
}
