//! Reading run records back (I22): one page of a sandbox's or a uid's runs, newest first.
//!
//! Runs are ordered by `(started_at, id)`, newest first, and paged by that key: a page ends
//! with a [`RunCursor`] naming its last run, and the next page lists the runs strictly
//! after it in that order. A run started while a caller pages appears on the first page
//! of a new listing, never twice in one, and runs started in the same millisecond are
//! neither lost nor repeated across a page boundary. Each store runs one statement per
//! page; what to ask it for and how to cut its answer into a page is written here once.

use chrono::{DateTime, Utc};
use warren_core::{SandboxId, Uid};

use crate::{RunRecord, RunStatus};

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
