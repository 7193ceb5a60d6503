//! Wire types of long-running processes (`/v1/sandboxes/{id}/processes`, issue 32).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{strict, ErrorDetail};

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Columns (1 to 4096).
    #[serde(deserialize_with = "strict::required_u16")]
    pub cols: u16,
    /// Rows (1 to 4096).
    #[serde(deserialize_with = "strict::required_u16")]
    pub rows: u16,
}

/// `POST /v1/sandboxes/{id}/processes`: starts a process that keeps running after the
/// answer, with its output kept for readers and its stdin open on request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// A shell command line, run with `/bin/sh -c` (or `shell`). Exactly one of `command`
    /// and `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// The shell for `command`: `sh` (default) or `bash`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Working directory as a virtual path; default: the workdir.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment for this process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run it on a terminal of this size (opened inside the runtime): stdin, stdout and
    /// stderr are the terminal, and its output comes as one stream (`stdout`).
    #[serde(default, deserialize_with = "strict::object")]
    pub pty: Option<TerminalSize>,
    /// Keep its stdin open for `POST .../stdin`; otherwise it reads end-of-file at once.
    #[serde(default)]
    pub stdin: bool,
    /// A name to find it by (1 to 256 bytes).
    #[serde(default)]
    pub tag: Option<String>,
    /// Kill its whole tree after this many seconds; default: no limit (it ends when it
    /// ends, is killed, or its runtime ends).
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub timeout_s: Option<u64>,
}

/// A process, running or ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// Its pid inside the runtime.
    pub pid: i32,
    /// Its run record (`GET /v1/sandboxes/{id}/runs`, I22).
    pub run_id: String,
    /// The name it was given.
    pub tag: Option<String>,
    /// The command line (secrets masked), or its argv as JSON.
    pub command: String,
    /// Working directory as a virtual path.
    pub cwd: String,
    /// Its terminal's size, when it runs on one.
    pub pty: Option<TerminalSize>,
    /// Whether its stdin still takes input.
    pub stdin_open: bool,
    /// Who started it (`X-Warren-Requested-By`).
    pub requested_by: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// `running`; `exited` (see `exit_code` and `signal`); `lost`: its runtime ended under
    /// it (terminated, reaped) and no exit status exists.
    pub status: String,
    /// Exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its timeout ended it.
    pub timed_out: bool,
    /// When it ended (RFC 3339).
    pub ended_at: Option<String>,
    /// Offset of the oldest output byte still kept: reading from before it reports the
    /// bytes lost.
    pub output_start: u64,
    /// Offset after the newest output byte.
    pub output_end: u64,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    /// Running processes and those that ended in the last ten minutes, by pid.
    pub processes: Vec<ProcessInfo>,
}

/// One event of a process's output (`GET .../processes/{pid}/output`): NDJSON lines, SSE
/// events named by `type`, or the items of a JSON answer. Offsets count every byte the
/// process wrote on either stream, from 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcessEvent {
    /// Bytes on standard output (a terminal's whole output), base64.
    Stdout {
        /// The offset of the first byte.
        offset: u64,
        /// Base64 of the bytes.
        data: String,
    },
    /// Bytes on standard error, base64.
    Stderr {
        /// The offset of the first byte.
        offset: u64,
        /// Base64 of the bytes.
        data: String,
    },
    /// Bytes `from` to `to` (exclusive) were dropped from the process's bounded output
    /// before this reader got them.
    Lost {
        /// First offset lost.
        from: u64,
        /// First offset not lost.
        to: u64,
    },
    /// The process ended and its output is complete; the last event of a stream.
    End {
        /// The process as it ended.
        process: ProcessInfo,
    },
    /// The stream failed; nothing follows.
    Error {
        /// The error.
        error: ErrorDetail,
    },
}

/// `GET .../processes/{pid}/output` without a streaming `Accept`: what is there now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessOutput {
    /// Output from the offset asked for (`stdout`, `stderr`, `lost`), at most 256 KiB.
    pub events: Vec<ProcessEvent>,
    /// The offset to ask for next.
    pub next: u64,
    /// The process now.
    pub process: ProcessInfo,
}

/// Answer of `POST .../processes/{pid}/stdin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StdinWritten {
    /// Bytes written to the process's stdin.
    pub written: u64,
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalProcess {
    /// The signal: a number (1 to 64) or a name such as `SIGINT`, `INT`, `SIGTERM`.
    #[schema(value_type = String)]
    pub signal: SignalName,
    /// The whole process group (what a terminal's Ctrl-C reaches; default) or the process
    /// alone.
    #[serde(default = "yes")]
    pub group: bool,
}

fn yes() -> bool {
    true
}

/// A signal by number or by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SignalName {
    /// Its number (a whole number, written as JSON writes it: `2` or `2.0`).
    Number(serde_json::Number),
    /// Its name, with or without `SIG`.
    Name(String),
}

impl SignalName {
    /// The signal's number, when it names one Linux knows.
    pub fn number(&self) -> Option<i32> {
        match self {
            Self::Number(n) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e6)
                        .map(|f| f as i64)
                })
                .and_then(|n| i32::try_from(n).ok())
                .filter(|n| (1..=64).contains(n)),
            Self::Name(name) => {
                let bare = name.strip_prefix("SIG").unwrap_or(name);
                SIGNALS
                    .iter()
                    .find(|(known, _)| *known == bare)
                    .map(|(_, number)| *number)
            }
        }
    }
}

/// The signals Linux names on x86-64 and aarch64 (`signal(7)`).
pub const SIGNALS: [(&str, i32); 31] = [
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("STKFLT", 16),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("URG", 23),
    ("XCPU", 24),
    ("XFSZ", 25),
    ("VTALRM", 26),
    ("PROF", 27),
    ("WINCH", 28),
    ("IO", 29),
    ("PWR", 30),
    ("SYS", 31),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_read_by_number_and_by_name_with_or_without_sig() {
        let number = |text: &str| SignalName::Number(serde_json::from_str(text).unwrap());
        assert_eq!(number("2").number(), Some(2));
        assert_eq!(number("2.0").number(), Some(2));
        assert_eq!(number("2.5").number(), None);
        assert_eq!(SignalName::Name("SIGINT".into()).number(), Some(2));
        assert_eq!(SignalName::Name("TERM".into()).number(), Some(15));
        assert_eq!(number("0").number(), None);
        assert_eq!(number("65").number(), None);
        assert_eq!(SignalName::Name("SIGNOPE".into()).number(), None);
    }
}
