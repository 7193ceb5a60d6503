//! Wire types of run records (I22).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What kind of run a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// A command the caller waited for (`POST /v1/sandboxes/{id}/exec`, a shell command).
    Exec,
    /// A long-running process the caller started and comes back to.
    Process,
    /// One execution of code in a code context's kernel (`tag` is the context's id).
    Code,
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Started and not yet finished.
    Running,
    /// The command ran to an end: any exit code, signal or timeout.
    Finished,
    /// warren could not run the command to completion; see `failure_reason`.
    Failed,
}

/// The record of one run (I22): what ran, where, for whom, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunInfo {
    /// The run's id (an exec answers it as `run_id`).
    pub id: String,
    /// The sandbox it ran in.
    pub sandbox_id: String,
    /// The sandbox generation it ran in.
    pub generation: i64,
    /// What kind of run it is.
    pub kind: RunKind,
    /// The caller's own label for it, if it gave one.
    pub tag: Option<String>,
    /// Whether it ran on a terminal.
    pub pty: bool,
    /// The command line, or the argv as JSON, with injected secrets masked.
    pub command: String,
    /// Its working directory, as a virtual path.
    pub cwd: String,
    /// Who asked for it.
    pub requested_by: String,
    /// Where it is in its life.
    pub status: RunStatus,
    /// When it started (RFC 3339, milliseconds): a `since` that includes it.
    pub started_at: String,
    /// When it finished or failed (RFC 3339, milliseconds).
    pub finished_at: Option<String>,
    /// The exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether warren ended it for running too long.
    pub timed_out: bool,
    /// Wall-clock run time in milliseconds, once it ended.
    pub duration_ms: Option<u64>,
    /// User CPU time in milliseconds, when measured.
    pub cpu_user_ms: Option<u64>,
    /// System CPU time in milliseconds, when measured.
    pub cpu_system_ms: Option<u64>,
    /// Peak resident memory in bytes, when measured.
    pub peak_memory_bytes: Option<u64>,
    /// Why warren could not run it to completion, when it failed.
    pub failure_reason: Option<String>,
}

/// `GET /v1/sandboxes/{id}/runs`, `GET /v1/users/{uid}/runs`: one page of run records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// Newest first (by start time, then id).
    pub runs: Vec<RunInfo>,
    /// Pass as `page_token` for the next page; null on the last page.
    pub next_page_token: Option<String>,
}
