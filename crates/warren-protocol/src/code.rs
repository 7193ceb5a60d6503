//! Wire types of the code interpreter (`/v1/sandboxes/{id}/code`, issue 36).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::strict;

/// `POST /v1/sandboxes/{id}/code/contexts`: an execution context, a kernel that keeps its
/// state between executions. Its kernel starts on its first execution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCodeContext {
    /// Its id (1 to 64 letters, digits, `-`, `_`, `.`); default: a fresh UUID.
    #[serde(default)]
    pub id: Option<String>,
    /// Its language: `python` (default) or `bash` (where the image has bash_kernel).
    #[serde(default)]
    pub language: Option<String>,
    /// Its working directory, a virtual path; default: the workdir.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment for its kernel.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// An execution context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeContext {
    /// Its id.
    pub id: String,
    /// Its language.
    pub language: String,
    /// Its working directory, a virtual path.
    pub cwd: String,
    /// The environment it was created with.
    pub env: BTreeMap<String, String>,
    /// The pid of its driver, one of the sandbox's processes.
    pub pid: i32,
    /// When it was created or last restarted (RFC 3339).
    pub created_at: String,
}

/// `GET /v1/sandboxes/{id}/code/contexts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeContextList {
    /// The contexts, oldest first.
    pub contexts: Vec<CodeContext>,
}

/// `POST /v1/sandboxes/{id}/code/execute`: code to run in a context's kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The code.
    pub code: String,
    /// The context to run it in; default: the language's default context (`default`),
    /// created when missing. Not with `language`.
    #[serde(default)]
    pub context: Option<String>,
    /// The language when no context is named: `python` (default) or `bash`.
    #[serde(default)]
    pub language: Option<String>,
    /// Environment for this execution only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory for this execution only, a virtual path.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Interrupt the kernel after this many seconds (the execution ends with status
    /// `timeout`); default: no limit.
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub timeout_s: Option<u64>,
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// It ran to its end.
    Ok,
    /// It raised (the `error` event says what), or its kernel died.
    Error,
    /// Its timeout passed: the kernel was interrupted (or its context removed, when it did
    /// not stop).
    Timeout,
}

/// One event of an execution, as `POST .../code/execute` streams them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    /// Text the code wrote to stdout.
    Stdout {
        /// The text.
        text: String,
        /// When the kernel sent it, nanoseconds since the Unix epoch.
        timestamp: i64,
    },
    /// Text the code wrote to stderr.
    Stderr {
        /// The text.
        text: String,
        /// When the kernel sent it, nanoseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A result: the cell's value (`is_main_result`) or something it displayed (a plot).
    Result {
        /// The MIME bundle: `text/plain`, `image/png` (base64), `text/html`,
        /// `application/json`, ...
        #[schema(value_type = Object)]
        data: BTreeMap<String, serde_json::Value>,
        /// The cell's own value rather than a display call's.
        is_main_result: bool,
    },
    /// The code raised.
    Error {
        /// The exception's name.
        name: String,
        /// Its value.
        value: String,
        /// Its traceback, line by line (with the kernel's ANSI colours).
        traceback: Vec<String>,
    },
    /// The context's kernel had died and was started anew before this execution: the
    /// state of earlier executions is gone.
    Restarted,
    /// The execution ended; the last event.
    End {
        /// The context it ran in.
        context_id: String,
        /// The kernel's execution count for it.
        execution_count: Option<i64>,
        /// How it ended.
        status: ExecutionStatus,
    },
}

/// `POST .../code/execute` answered whole (no streaming `Accept`): every event gathered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeExecution {
    /// The context it ran in.
    pub context_id: String,
    /// How it ended.
    pub status: ExecutionStatus,
    /// The kernel's execution count for it.
    pub execution_count: Option<i64>,
    /// Everything it wrote to stdout, in order.
    pub stdout: String,
    /// Everything it wrote to stderr, in order.
    pub stderr: String,
    /// Its results, in order: display calls and the cell's value.
    pub results: Vec<CodeResult>,
    /// What it raised, if it did.
    pub error: Option<CodeError>,
    /// Its kernel had died and was started anew first.
    pub restarted: bool,
}

/// A result of an execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    /// The MIME bundle.
    #[schema(value_type = Object)]
    pub data: BTreeMap<String, serde_json::Value>,
    /// The cell's own value rather than a display call's.
    pub is_main_result: bool,
}

/// An error an execution raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeError {
    /// The exception's name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// Its traceback, line by line.
    pub traceback: Vec<String>,
}

impl CodeExecution {
    /// Gathers an execution's events, in order (`End` fills in how it ended).
    pub fn gather(events: impl IntoIterator<Item = CodeEvent>) -> Self {
        let mut execution = Self {
            context_id: String::new(),
            status: ExecutionStatus::Error,
            execution_count: None,
            stdout: String::new(),
            stderr: String::new(),
            results: Vec::new(),
            error: None,
            restarted: false,
        };
        for event in events {
            match event {
                CodeEvent::Stdout { text, .. } => execution.stdout.push_str(&text),
                CodeEvent::Stderr { text, .. } => execution.stderr.push_str(&text),
                CodeEvent::Result {
                    data,
                    is_main_result,
                } => execution.results.push(CodeResult {
                    data,
                    is_main_result,
                }),
                CodeEvent::Error {
                    name,
                    value,
                    traceback,
                } => {
                    execution.error = Some(CodeError {
                        name,
                        value,
                        traceback,
                    })
                }
                CodeEvent::Restarted => execution.restarted = true,
                CodeEvent::End {
                    context_id,
                    execution_count,
                    status,
                } => {
                    execution.context_id = context_id;
                    execution.execution_count = execution_count;
                    execution.status = status;
                }
            }
        }
        execution
    }
}
