//! What crosses the node-to-node link: the provisioner's values as JSON, bytes as base64.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use warren_backend::{ExecOutcome, ResourceUsage};
use warren_provisioner::{ExecInput, ExecReport, ProgramSpec};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// An exec as the receiving replica parsed it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForwardedExec {
    pub(crate) program: Program,
    pub(crate) cwd: Option<String>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) stdin_b64: String,
    pub(crate) requested_by: String,
    /// Whether the caller streams output (the owner sends it as it comes).
    pub(crate) stream: bool,
    /// The caller's execution guard token, checked by the owner at the command's start.
    pub(crate) fence: Option<i64>,
    /// What earlier replicas sent for a run record's command line (`record_as`, retired):
    /// accepted and ignored, so forwarding goes on through a rolling upgrade.
    #[serde(default, skip_serializing, rename = "record_as")]
    pub(crate) _retired_record_as: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Program {
    Shell(String),
    Bash(String),
    Argv(Vec<String>),
}

impl ForwardedExec {
    pub(crate) fn new(input: ExecInput, stream: bool, fence: Option<i64>) -> Self {
        Self {
            program: match input.program {
                ProgramSpec::Shell(line) => Program::Shell(line),
                ProgramSpec::Bash(line) => Program::Bash(line),
                ProgramSpec::Argv(argv) => Program::Argv(argv),
            },
            cwd: input.cwd,
            env: input.env,
            timeout_ms: input
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            stdin_b64: B64.encode(&input.stdin),
            requested_by: input.requested_by,
            stream,
            fence,
            _retired_record_as: None,
        }
    }

    pub(crate) fn into_input(self) -> Result<ExecInput, &'static str> {
        Ok(ExecInput {
            program: match self.program {
                Program::Shell(line) => ProgramSpec::Shell(line),
                Program::Bash(line) => ProgramSpec::Bash(line),
                Program::Argv(argv) => ProgramSpec::Argv(argv),
            },
            cwd: self.cwd,
            env: self.env,
            timeout: self.timeout_ms.map(Duration::from_millis),
            stdin: B64
                .decode(self.stdin_b64)
                .map_err(|_| "stdin_b64 is not base64")?,
            requested_by: self.requested_by,
        })
    }
}

/// How often the owner says it is alive during a forwarded exec.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long the caller waits for a line of the answer before it gives the owner up.
pub(crate) const SILENCE_LIMIT: Duration = Duration::from_secs(5);

/// One line of the owner's answer to a forwarded exec (NDJSON).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Frame {
    /// Sent every [`HEARTBEAT`] while the command runs, so the caller tells a silent
    /// command from a paused or cut-off owner.
    Alive,
    Stdout(String),
    Stderr(String),
    Report(Report),
    Error(RemoteError),
}

/// An error as the owner answered it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct RemoteError {
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl RemoteError {
    /// The owner's error, as the caller answers it (its status and code kept).
    pub(crate) fn into_error(self) -> warren_provisioner::ProvisionerError {
        warren_provisioner::ProvisionerError::Forwarded {
            status: self.status,
            code: self.code,
            message: self.message,
        }
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Report {
    run_id: String,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdout_b64: String,
    stderr_b64: String,
    truncated: bool,
    timed_out: bool,
    duration_ms: u64,
    cpu_user_ms: Option<i64>,
    cpu_system_ms: Option<i64>,
    peak_memory_bytes: Option<i64>,
}

impl Report {
    pub(crate) fn new(report: ExecReport) -> Self {
        let outcome = report.outcome;
        Self {
            run_id: report.run_id,
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            stdout_b64: B64.encode(&outcome.stdout),
            stderr_b64: B64.encode(&outcome.stderr),
            truncated: outcome.truncated,
            timed_out: outcome.timed_out,
            duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
            cpu_user_ms: outcome.usage.cpu_user_ms,
            cpu_system_ms: outcome.usage.cpu_system_ms,
            peak_memory_bytes: outcome.usage.peak_memory_bytes,
        }
    }

    pub(crate) fn into_report(self) -> Result<ExecReport, &'static str> {
        Ok(ExecReport {
            run_id: self.run_id,
            outcome: ExecOutcome {
                exit_code: self.exit_code,
                signal: self.signal,
                stdout: B64
                    .decode(self.stdout_b64)
                    .map_err(|_| "stdout is not base64")?,
                stderr: B64
                    .decode(self.stderr_b64)
                    .map_err(|_| "stderr is not base64")?,
                truncated: self.truncated,
                timed_out: self.timed_out,
                duration: Duration::from_millis(self.duration_ms),
                usage: ResourceUsage {
                    cpu_user_ms: self.cpu_user_ms,
                    cpu_system_ms: self.cpu_system_ms,
                    peak_memory_bytes: self.peak_memory_bytes,
                },
            },
        })
    }
}

pub(crate) fn encode(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    B64.decode(text).ok()
}

/// The body of a forwarded runtime end.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndRuntime {
    pub(crate) grace_ms: u64,
}

/// The body of a forwarded runtime snapshot.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TakeSnapshot {
    pub(crate) reason: String,
}

/// The answer to a forwarded runtime snapshot.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct SnapshotTaken {
    pub(crate) snapshot_id: String,
}

/// One line of the owner's streamed answer to a process call or a follow (NDJSON): the
/// items, with [`Line::Alive`] every [`HEARTBEAT`] while none comes, or the error that
/// ends it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Line<T> {
    Alive,
    Item(T),
    Error(RemoteError),
}

/// Where a forwarded follow starts.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FollowFrom {
    pub(crate) from: u64,
}

/// Whether a forwarded stdin closes after its body.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StdinClose {
    pub(crate) close: bool,
}

/// The answer to a forwarded stdin.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct StdinWritten {
    pub(crate) written: u64,
}

/// A file operation in the owner's runtime, and what a write sends.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForwardedFile {
    pub(crate) op: warren_backend::FileOp,
    pub(crate) data_b64: String,
}

/// What the owner's runtime answered a forwarded file operation, and a read's bytes.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileAnswered {
    pub(crate) answer: Result<warren_backend::FileAnswer, warren_backend::FileFailure>,
    pub(crate) data_b64: String,
}

impl ForwardedFile {
    pub(crate) fn new(op: &warren_backend::FileOp, data: &[u8]) -> Self {
        Self {
            op: op.clone(),
            data_b64: B64.encode(data),
        }
    }

    /// The operation and its bytes; `None` when they are not base64.
    pub(crate) fn into_parts(self) -> Option<(warren_backend::FileOp, Vec<u8>)> {
        Some((self.op, B64.decode(self.data_b64).ok()?))
    }
}

impl FileAnswered {
    pub(crate) fn new(reply: warren_backend::FileReply) -> Self {
        Self {
            answer: reply.answer,
            data_b64: B64.encode(reply.data),
        }
    }

    /// The reply; `None` when its bytes are not base64.
    pub(crate) fn into_reply(self) -> Option<warren_backend::FileReply> {
        Some(warren_backend::FileReply {
            answer: self.answer,
            data: B64.decode(self.data_b64).ok()?,
        })
    }
}

/// The answer to a forwarded kill.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Killed {
    pub(crate) killed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_crosses_the_link_unchanged() {
        let input = ExecInput {
            program: ProgramSpec::Argv(vec!["printf".into(), "a\0b".into()]),
            cwd: Some("/mnt/x".into()),
            env: BTreeMap::from([("A".into(), "1".into())]),
            timeout: Some(Duration::from_millis(1500)),
            stdin: vec![0, 255, 10],
            requested_by: "agent".into(),
        };
        let json =
            serde_json::to_string(&ForwardedExec::new(input.clone(), true, Some(7))).unwrap();
        let back: ForwardedExec = serde_json::from_str(&json).unwrap();
        assert!(back.stream);
        assert_eq!(back.fence, Some(7));
        assert_eq!(back.into_input().unwrap(), input);
    }

    #[test]
    fn an_exec_from_a_replica_before_record_as_was_retired_is_still_taken() {
        let input = ExecInput {
            program: ProgramSpec::Shell("true".into()),
            cwd: None,
            env: BTreeMap::new(),
            timeout: None,
            stdin: Vec::new(),
            requested_by: "agent".into(),
        };
        let mut json =
            serde_json::to_value(ForwardedExec::new(input.clone(), false, None)).unwrap();
        assert!(json.get("record_as").is_none(), "{json}");
        json["record_as"] = serde_json::Value::Null;
        let back: ForwardedExec = serde_json::from_value(json).unwrap();
        assert_eq!(back.into_input().unwrap(), input);
    }

    #[test]
    fn a_file_operation_and_its_answer_cross_the_link_unchanged() {
        let op = warren_backend::FileOp::Write {
            path: "/tmp/a".into(),
            append: false,
            if_match: None,
            if_none_match_any: true,
            create_parents: true,
            mode: Some(0o600),
            cap: 10,
        };
        let json = serde_json::to_string(&ForwardedFile::new(&op, &[0, 255, 10])).unwrap();
        let back: ForwardedFile = serde_json::from_str(&json).unwrap();
        assert_eq!(back.into_parts().unwrap(), (op, vec![0, 255, 10]));
        let failure = warren_backend::FileFailure::Refused {
            kind: "permission_denied".into(),
            path: "/etc/passwd".into(),
        };
        let reply = warren_backend::FileReply {
            answer: Err(failure.clone()),
            data: Vec::new(),
        };
        let json = serde_json::to_string(&FileAnswered::new(reply)).unwrap();
        let back: FileAnswered = serde_json::from_str(&json).unwrap();
        assert_eq!(back.into_reply().unwrap().answer, Err(failure));
    }
}
