//! Wire types of running a command in a sandbox: the request, its result and streamed
//! events, and a kill's answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{strict, ErrorDetail};

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecCommand {
    /// A shell command line, run with `/bin/sh -c`. Exactly one of `command` and `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory as a virtual path; default: the workdir.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment for this call.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The shell for `command`: `sh` (default, `/bin/sh -c`) or `bash`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Wall-clock limit in seconds (default 60, at most 3600).
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub timeout_s: Option<u64>,
    /// Text written to the command's stdin.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// The result of one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// The run record's id (I22).
    pub run_id: String,
    /// Exit status, when the command exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Standard output (invalid UTF-8 replaced).
    pub stdout: String,
    /// Standard error (invalid UTF-8 replaced).
    pub stderr: String,
    /// Output was cut at the output cap.
    pub truncated: bool,
    /// The timeout ended the command.
    pub timed_out: bool,
    /// Wall-clock time in milliseconds.
    pub duration_ms: u64,
}

/// One event of a streaming exec (`Accept: application/x-ndjson` gives one JSON object per
/// line; `Accept: text/event-stream` gives the same objects as SSE `data:` with the `type`
/// as the event name). Output arrives as it is written; `exit` (or `error`) comes last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// Bytes on standard output, base64-encoded (binary-safe).
    Stdout {
        /// Base64 of the bytes.
        data: String,
    },
    /// Bytes on standard error, base64-encoded.
    Stderr {
        /// Base64 of the bytes.
        data: String,
    },
    /// The command ended; `stdout`/`stderr` in the result hold what was kept under the cap.
    Exit {
        /// The result.
        result: ExecResult,
    },
    /// The exec failed; no `exit` follows.
    Error {
        /// The error.
        error: ErrorDetail,
    },
}

/// Answer of `POST /v1/sandboxes/{id}/kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KilledProcesses {
    /// The sandbox whose processes were killed; it keeps running.
    pub sandbox_id: String,
    /// How many processes were killed (0 when its runtime was not running).
    pub killed: u64,
}
