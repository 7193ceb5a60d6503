//! Run records (I22): a run's start and outcome, and reading them back one page of a
//! sandbox's or a uid's runs at a time, newest first.
//!
//! Runs are ordered by `(started_at, id)`, newest first, and paged by that key: a page ends
//! with a [`RunCursor`] naming its last run, and the next page lists the runs strictly
//! after it in that order. A run started while a caller pages appears on the first page
//! of a new listing, never twice in one, and runs started in the same millisecond are
//! neither lost nor repeated across a page boundary. Each store runs one statement per
//! page; what to ask it for and how to cut its answer into a page is written here once.

use chrono::{DateTime, Utc};
use warren_core::{SandboxId, Uid};

use crate::rows::run_from_row;
use crate::sql::{Dialect, Query};
use crate::{NewRun, RunOutcome, RunRecord, RunStatus, StoreError};

/// The columns of a run row.
const COLUMNS: &str = "id, sandbox_id, generation, command, cwd, requested_by, kind, tag, \
     pty, status, started_at, finished_at, exit_code, signal, timed_out, duration_ms, \
     cpu_user_ms, cpu_system_ms, peak_memory_bytes, failure_reason";

/// Whose runs a [`RunQuery`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunScope {
    /// The runs of one sandbox, in all its generations.
    Sandbox(SandboxId),
    /// The runs of every sandbox of one uid.
    Uid(Uid),
}

/// Where a page of runs ended: the `(started_at, id)` of its last run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    /// When that run started.
    pub started_at: DateTime<Utc>,
    /// Its id.
    pub id: String,
}

impl RunCursor {
    /// The cursor just past `run`.
    pub fn after(run: &RunRecord) -> Self {
        Self {
            started_at: run.started_at,
            id: run.id.clone(),
        }
    }
}

/// One page of runs to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunQuery {
    /// Whose runs.
    pub scope: RunScope,
    /// Only runs in this status.
    pub status: Option<RunStatus>,
    /// Only runs started at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many runs, 1 to [`RunQuery::MAX_LIMIT`]; a store reads any other value
    /// as the nearest of the two.
    pub limit: u32,
    /// Only runs after this cursor (the `next` of the previous page).
    pub after: Option<RunCursor>,
}

impl RunQuery {
    /// The largest page.
    pub const MAX_LIMIT: u32 = 500;

    /// The first page of `scope`'s runs, `limit` at most, unfiltered.
    pub fn new(scope: RunScope, limit: u32) -> Self {
        Self {
            scope,
            status: None,
            since: None,
            limit,
            after: None,
        }
    }

    /// How many rows a store fetches: one more than the page holds, so it knows whether
    /// another page follows.
    pub(crate) fn fetch(&self) -> i64 {
        i64::from(self.page_size()) + 1
    }

    fn page_size(&self) -> u32 {
        self.limit.clamp(1, Self::MAX_LIMIT)
    }

    /// The sandbox or the uid, as the statement binds it.
    pub(crate) fn scope_key(&self) -> &str {
        match &self.scope {
            RunScope::Sandbox(id) => id.as_str(),
            RunScope::Uid(uid) => uid.as_str(),
        }
    }

    /// `since` as the stored unix milliseconds, rounded up: a run recorded in the
    /// millisecond before a `since` inside it did not start at or after it.
    pub(crate) fn since_millis(&self) -> Option<i64> {
        self.since.map(|since| {
            let millis = since.timestamp_millis();
            if since.timestamp_subsec_nanos() % 1_000_000 == 0 {
                millis
            } else {
                millis.saturating_add(1)
            }
        })
    }

    /// The cursor as the stored `(started_at, id)`.
    pub(crate) fn after_key(&self) -> (Option<i64>, Option<&str>) {
        match &self.after {
            Some(cursor) => (
                Some(cursor.started_at.timestamp_millis()),
                Some(cursor.id.as_str()),
            ),
            None => (None, None),
        }
    }

    /// Cuts the rows fetched ([`RunQuery::fetch`] at most, in page order) into a page.
    pub(crate) fn page(&self, mut runs: Vec<RunRecord>) -> RunPage {
        let size = usize::try_from(self.page_size()).unwrap_or(usize::MAX);
        let next = if runs.len() > size {
            runs.truncate(size);
            runs.last().map(RunCursor::after)
        } else {
            None
        };
        RunPage { runs, next }
    }
}

/// One page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunRecord>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<RunCursor>,
}
pub(crate) async fn start<D: Dialect>(db: &D, new: &NewRun) -> Result<RunRecord, StoreError> {
    // A fenced run is written only while its node still owns the runtime (issue 14): the
    // check and the insert are one statement.
    let row = Query::new(format!(
        "INSERT INTO runs (id, sandbox_id, generation, command, cwd, requested_by, status, \
         started_at, timed_out, node_id, kind, tag, pty) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, FALSE, $9, $11, $12, $13 \
         WHERE CAST($10 AS BIGINT) IS NULL OR EXISTS (SELECT 1 FROM runtime_owners \
         WHERE sandbox_id = $2 AND node_id = $9 AND token = $10) RETURNING {COLUMNS}"
    ))
    .bind(new.id.as_str())
    .bind(new.sandbox_id.as_str())
    .bind(new.generation)
    .bind(new.command.as_str())
    .bind(new.cwd.as_str())
    .bind(new.requested_by.as_str())
    .bind(RunStatus::Running.as_str())
    .bind(crate::now_millis())
    .bind(new.owner.as_ref().map(|owner| owner.node_id.as_str()))
    .bind(new.owner.as_ref().map(|owner| owner.token))
    .bind(new.kind.as_str())
    .bind(new.tag.as_deref())
    .bind(new.pty)
    .fetch_optional(db)
    .await
    .map_err(|error| match crate::error::violation(&error) {
        Some(sqlx::error::ErrorKind::UniqueViolation) => StoreError::DuplicateRun {
            run_id: new.id.clone(),
        },
        _ => StoreError::on_sandbox("start a run", &new.sandbox_id)(error),
    })?;
    match row {
        Some(row) => run_from_row(&row),
        None => Err(StoreError::NotOwner {
            sandbox: new.sandbox_id.clone(),
            token: new.owner.as_ref().map_or(0, |owner| owner.token),
        }),
    }
}

pub(crate) async fn finish<D: Dialect>(
    db: &D,
    run_id: &str,
    outcome: &RunOutcome,
) -> Result<RunRecord, StoreError> {
    const OPERATION: &str = "finish a run";
    let status = if outcome.failure.is_some() {
        RunStatus::Failed
    } else {
        RunStatus::Finished
    };
    // Only a running run can finish: an outcome already recorded is never overwritten.
    let row = Query::new(format!(
        "UPDATE runs SET status = $2, finished_at = $3, exit_code = $4, signal = $5, \
         timed_out = $6, duration_ms = $7, cpu_user_ms = $8, cpu_system_ms = $9, \
         peak_memory_bytes = $10, failure_reason = $11 \
         WHERE id = $1 AND status = 'running' RETURNING {COLUMNS}"
    ))
    .bind(run_id)
    .bind(status.as_str())
    .bind(crate::now_millis())
    .bind(outcome.exit_code)
    .bind(outcome.signal)
    .bind(outcome.timed_out)
    .bind(outcome.duration_ms)
    .bind(outcome.cpu_user_ms)
    .bind(outcome.cpu_system_ms)
    .bind(outcome.peak_memory_bytes)
    .bind(outcome.failure.as_deref())
    .fetch_optional(db)
    .await
    .map_err(StoreError::query(OPERATION))?;
    if let Some(row) = row {
        return run_from_row(&row);
    }
    // Tell the two misses apart for the caller; the record cannot return to running, so
    // this second read cannot contradict the update.
    let exists = Query::new("SELECT id FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(db)
        .await
        .map_err(StoreError::query(OPERATION))?
        .is_some();
    let run_id = run_id.to_owned();
    Err(if exists {
        StoreError::RunAlreadyFinished { run_id }
    } else {
        StoreError::UnknownRun { run_id }
    })
}

pub(crate) async fn query<D: Dialect>(db: &D, query: &RunQuery) -> Result<RunPage, StoreError> {
    // The scope picks the statement, so each can use its index; the cursor and `since` are
    // always bound (a cursor past every run, a time before all) to keep one shape.
    let scope = match &query.scope {
        RunScope::Sandbox(_) => "sandbox_id = $1",
        RunScope::Uid(_) => "sandbox_id IN (SELECT id FROM sandboxes WHERE uid = $1)",
    };
    let (after_started, after_id) = query.after_key();
    let rows = Query::new(format!(
        "SELECT {COLUMNS} FROM runs WHERE {scope} \
         AND (CAST($2 AS TEXT) IS NULL OR status = $2) AND started_at >= $3 \
         AND (started_at, id) < ($4, $5) \
         ORDER BY started_at DESC, id DESC LIMIT $6"
    ))
    .bind(query.scope_key())
    .bind(query.status.map(RunStatus::as_str))
    .bind(query.since_millis().unwrap_or(i64::MIN))
    .bind(after_started.unwrap_or(i64::MAX))
    .bind(after_id.unwrap_or(""))
    .bind(query.fetch())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list runs"))?;
    let runs = rows.iter().map(run_from_row).collect::<Result<_, _>>()?;
    Ok(query.page(runs))
}

pub(crate) async fn fail_running<D: Dialect>(
    db: &D,
    node_id: &str,
    reason: &str,
) -> Result<u64, StoreError> {
    Query::new(
        "UPDATE runs SET status = 'failed', finished_at = $1, failure_reason = $2 \
         WHERE status = 'running' AND (node_id = $3 OR node_id IS NULL)",
    )
    .bind(crate::now_millis())
    .bind(reason)
    .bind(node_id)
    .execute(db)
    .await
    .map_err(StoreError::query("fail running runs"))
}
