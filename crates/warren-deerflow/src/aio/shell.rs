//! The AIO shell and bash endpoints (`/v1/shell/*`, `/v1/bash/*`): persistent shell
//! sessions, each one real shell process in the sandbox's runtime (the provisioner's
//! `shell.rs` holds the rules; this file only reads requests and shapes answers).
//!
//! `/v1/shell` merges stdout and stderr in the order written; `/v1/bash` keeps them apart.
//! Both have their own session ids. A missing (or ended) session is 404 `Session not found:
//! <id>`, the words DeerFlow looks for to open a new session and try once more (contract
//! §0.4). Every failure is non-2xx (§0.2), never 422 (§0.3).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_provisioner::{
    CommandReport, CommandStatus, CommandWait, FencePermit, ProvisionerError, SessionInfo,
    SessionKind, SessionRequest, SessionStatus, ShellCommand, MAX_SHELL_SESSIONS,
};

use super::{ok, ok_with, AioError, AioJson, AioSandbox, AioState};

/// Who the run records name for commands that came through the AIO API (I22).
const REQUESTED_BY: &str = "deerflow";
/// What `truncate` (on by default) cuts a shell command's output to, as AIO does: the
/// middle goes, the start and the end stay.
const TRUNCATE_CHARS: usize = 30_000;
/// Longest `shell/wait` (a client asking for more gets this).
const MAX_WAIT: Duration = Duration::from_secs(600);
/// `shell/wait` without a bound.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// A bash session has no no-change timeout: a call waits for its command (or `timeout`).
const NO_NO_CHANGE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The shell and bash routes, relative to a sandbox's URL.
pub(crate) fn routes() -> axum::Router<AioState> {
    axum::Router::new()
        .route("/v1/shell/exec", post(shell_exec))
        .route("/v1/shell/view", post(shell_view))
        .route("/v1/shell/wait", post(shell_wait))
        .route("/v1/shell/kill", post(shell_kill))
        .route("/v1/shell/write", post(shell_write))
        .route("/v1/shell/sessions/create", post(shell_create))
        .route("/v1/shell/sessions/update", post(shell_update))
        .route("/v1/shell/sessions/stats", get(shell_stats))
        .route(
            "/v1/shell/sessions",
            get(shell_list).delete(shell_cleanup_all),
        )
        .route("/v1/shell/sessions/{session_id}", delete(shell_cleanup))
        .route("/v1/bash/exec", post(bash_exec))
        .route("/v1/bash/output", post(bash_output))
        .route("/v1/bash/kill", post(bash_kill))
        .route("/v1/bash/write", post(bash_write))
        .route("/v1/bash/sessions/create", post(bash_create))
        .route("/v1/bash/sessions", get(bash_list))
        .route("/v1/bash/sessions/{session_id}/close", post(bash_close))
}

type Answer = Result<Json<Value>, AioError>;

/// A provisioner failure as the AIO API answers it: the session errors with the words and
/// statuses the clients expect, the rest as every AIO handler maps them.
fn failure(error: ProvisionerError) -> AioError {
    match &error {
        ProvisionerError::ShellSessionNotFound { id } => AioError::session_not_found(id),
        ProvisionerError::ShellSessionBusy { .. }
        | ProvisionerError::TooManyShellSessions { .. } => {
            AioError::new(StatusCode::CONFLICT, error.to_string())
        }
        // The sandbox cannot run a shell: a server-side failure, never the caller's.
        ProvisionerError::ShellStartFailed { .. } => {
            AioError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
        }
        _ => error.into(),
    }
}

/// Seconds as the SDK sends them (a float, or an int): positive and finite.
fn seconds(name: &str, value: Option<f64>) -> Result<Option<Duration>, AioError> {
    match value {
        None => Ok(None),
        Some(value) if value.is_finite() && value > 0.0 => {
            Ok(Some(Duration::try_from_secs_f64(value).map_err(|_| {
                AioError::bad_request(format!("{name} is too large"))
            })?))
        }
        Some(_) => Err(AioError::bad_request(format!(
            "{name} must be a positive number of seconds"
        ))),
    }
}

fn session_param(params: &HashMap<String, String>) -> Result<&str, AioError> {
    params
        .get("session_id")
        .map(String::as_str)
        .ok_or_else(|| AioError::bad_request("the session id is missing"))
}

fn required<'a>(name: &str, value: &'a Option<String>) -> Result<&'a str, AioError> {
    value
        .as_deref()
        .ok_or_else(|| AioError::bad_request(format!("{name} is required")))
}

/// Cuts `text` to at most `max` characters by leaving out its middle.
fn middle_truncate(text: String, max: usize) -> String {
    let count = text.chars().count();
    if max == 0 || count <= max {
        return text;
    }
    let notice = format!("\n... [{} characters truncated] ...\n", count - max);
    let head = max / 2;
    let tail = max - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}{notice}{end}")
}

fn rfc3339(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

// --- /v1/shell ---------------------------------------------------------------------------

/// The status words of the shell API (`BashCommandStatus` in the SDK).
fn shell_status(status: CommandStatus) -> &'static str {
    match status {
        CommandStatus::Running => "running",
        CommandStatus::NoChangeTimeout => "no_change_timeout",
        CommandStatus::Completed => "completed",
        CommandStatus::HardTimeout => "hard_timeout",
        CommandStatus::Killed | CommandStatus::Terminated => "terminated",
    }
}

fn shell_result(report: CommandReport, truncate: bool) -> Value {
    let output = if truncate {
        middle_truncate(report.stdout, TRUNCATE_CHARS)
    } else {
        report.stdout
    };
    json!({
        "session_id": report.session_id,
        "command": report.command,
        "status": shell_status(report.status),
        "output": output,
        "exit_code": report.exit_code,
    })
}

#[derive(Debug, Default, Deserialize)]
struct ShellExec {
    command: Option<String>,
    id: Option<String>,
    exec_dir: Option<String>,
    async_mode: Option<bool>,
    timeout: Option<f64>,
    strict: Option<bool>,
    no_change_timeout: Option<f64>,
    hard_timeout: Option<f64>,
    truncate: Option<bool>,
}

/// `POST /v1/shell/exec`: runs a command in a session (a new one without `id`).
async fn shell_exec(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ShellExec>,
) -> Answer {
    let command = required("command", &request.command)?;
    let wait = if request.async_mode.unwrap_or(false) {
        CommandWait::Async
    } else {
        CommandWait::Until(seconds("timeout", request.timeout)?)
    };
    let mut shell = ShellCommand::new(command, REQUESTED_BY);
    shell.exec_dir = request.exec_dir;
    shell.strict_exec_dir = request.strict.unwrap_or(false);
    shell.hard_timeout = seconds("hard_timeout", request.hard_timeout)?;
    shell.no_change_timeout = seconds("no_change_timeout", request.no_change_timeout)?;
    shell.wait = wait;
    let report = state
        .provisioner
        .run_in_shell_session(
            &sandbox.id,
            SessionKind::Shell,
            request.id.as_deref(),
            shell,
            FencePermit::unfenced(),
        )
        .await
        .map_err(failure)?;
    Ok(ok(shell_result(report, request.truncate.unwrap_or(true))))
}

#[derive(Debug, Default, Deserialize)]
struct ShellId {
    id: Option<String>,
}

/// `POST /v1/shell/view`: the session's latest command and its output so far.
async fn shell_view(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ShellId>,
) -> Answer {
    let id = required("id", &request.id)?;
    let report = state
        .provisioner
        .view_shell_session(&sandbox.id, SessionKind::Shell, id)
        .map_err(failure)?;
    let console = if report.command_id.is_empty() {
        json!([])
    } else {
        json!([{"ps_1": "$", "command": report.command, "output": report.stdout}])
    };
    let mut data = shell_result(report, false);
    data["console"] = console;
    Ok(ok(data))
}

#[derive(Debug, Default, Deserialize)]
struct ShellWait {
    id: Option<String>,
    seconds: Option<f64>,
    max_wait_seconds: Option<f64>,
}

/// `POST /v1/shell/wait`: waits (at most `max_wait_seconds`) for the latest command.
async fn shell_wait(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ShellWait>,
) -> Answer {
    let id = required("id", &request.id)?;
    let bound = match (request.seconds, request.max_wait_seconds) {
        (None, None) => DEFAULT_WAIT,
        (a, b) => {
            let a = a.unwrap_or(f64::INFINITY);
            let b = b.unwrap_or(f64::INFINITY);
            let secs = a.min(b);
            if secs.is_nan() || secs < 0.0 {
                return Err(AioError::bad_request(
                    "seconds and max_wait_seconds must not be negative",
                ));
            }
            Duration::try_from_secs_f64(secs)
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT)
        }
    };
    let report = state
        .provisioner
        .wait_shell_session(&sandbox.id, SessionKind::Shell, id, bound)
        .await
        .map_err(failure)?;
    Ok(ok(json!({
        "status": shell_status(report.status),
        "exit_code": report.exit_code,
    })))
}

/// `POST /v1/shell/kill`: kills the session's running command.
async fn shell_kill(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ShellId>,
) -> Answer {
    let id = required("id", &request.id)?;
    let report = state
        .provisioner
        .kill_shell_command(&sandbox.id, SessionKind::Shell, id)
        .await
        .map_err(failure)?;
    Ok(ok(json!({
        "status": shell_status(report.status),
        "exit_code": report.exit_code,
        "returncode": report.exit_code,
    })))
}

/// `POST /v1/shell/write`: commands run with stdin at `/dev/null`, so there is nothing to
/// write to; answered as not implemented (DeerFlow never calls it).
async fn shell_write(_sandbox: AioSandbox) -> Answer {
    Err(AioError::new(
        StatusCode::NOT_IMPLEMENTED,
        "writing to a running command is not supported: commands read no input; pass input in the command itself",
    ))
}

#[derive(Debug, Default, Deserialize)]
struct ShellCreate {
    id: Option<String>,
    exec_dir: Option<String>,
    no_change_timeout: Option<f64>,
}

/// `POST /v1/shell/sessions/create`: opens a session (an open one with the id is returned).
async fn shell_create(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ShellCreate>,
) -> Answer {
    let info = state
        .provisioner
        .open_shell_session(
            &sandbox.id,
            SessionKind::Shell,
            SessionRequest {
                id: request.id,
                exec_dir: request.exec_dir,
                no_change_timeout: seconds("no_change_timeout", request.no_change_timeout)?,
            },
        )
        .await
        .map_err(failure)?;
    Ok(ok(json!({
        "session_id": info.id,
        "working_dir": info.working_dir,
    })))
}

#[derive(Debug, Default, Deserialize)]
struct ShellUpdate {
    id: Option<String>,
    no_change_timeout: Option<f64>,
}

/// `POST /v1/shell/sessions/update`: a new no-change timeout, also for a waiting call.
async fn shell_update(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ShellUpdate>,
) -> Answer {
    let id = required("id", &request.id)?;
    let info = state
        .provisioner
        .update_shell_session(
            &sandbox.id,
            SessionKind::Shell,
            id,
            seconds("no_change_timeout", request.no_change_timeout)?,
        )
        .map_err(failure)?;
    Ok(ok_with(
        &format!("Session {} updated", info.id),
        Value::Null,
    ))
}

fn shell_session_status(info: &SessionInfo) -> &'static str {
    match info.status {
        SessionStatus::Ready => "active",
        SessionStatus::Busy => "busy",
        SessionStatus::Ended => "terminated",
    }
}

/// `GET /v1/shell/sessions`: the sandbox's shell sessions by id.
async fn shell_list(State(state): State<AioState>, sandbox: AioSandbox) -> Answer {
    let now = chrono::Utc::now();
    let sessions: serde_json::Map<String, Value> = state
        .provisioner
        .shell_sessions(&sandbox.id, SessionKind::Shell)
        .into_iter()
        .map(|info| {
            let entry = json!({
                "working_dir": info.working_dir,
                "created_at": rfc3339(&info.created_at),
                "last_used_at": rfc3339(&info.last_used_at),
                "age_seconds": (now - info.created_at).num_seconds().max(0),
                "status": shell_session_status(&info),
                "current_command": info.current_command,
            });
            (info.id, entry)
        })
        .collect();
    Ok(ok(json!({ "sessions": sessions })))
}

/// `GET /v1/shell/sessions/stats`.
async fn shell_stats(State(state): State<AioState>, sandbox: AioSandbox) -> Answer {
    let sessions = state
        .provisioner
        .shell_sessions(&sandbox.id, SessionKind::Shell);
    let live: Vec<_> = sessions
        .iter()
        .filter(|info| info.status != SessionStatus::Ended)
        .collect();
    let active = live
        .iter()
        .filter(|info| info.status == SessionStatus::Busy)
        .count();
    Ok(ok(json!({
        "total_sessions": live.len(),
        "active_sessions": active,
        "idle_sessions": live.len() - active,
        "max_sessions": MAX_SHELL_SESSIONS,
        "session_timeout": state.provisioner.config().idle_timeout.as_secs(),
        "usage_ratio": live.len() as f64 / MAX_SHELL_SESSIONS as f64,
    })))
}

/// `DELETE /v1/shell/sessions/{session_id}`: kills the session's shell and everything it
/// started.
async fn shell_cleanup(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    Path(params): Path<HashMap<String, String>>,
) -> Answer {
    let id = session_param(&params)?;
    state
        .provisioner
        .close_shell_session(&sandbox.id, SessionKind::Shell, id)
        .await
        .map_err(failure)?;
    Ok(ok_with(&format!("Session {id} cleaned up"), Value::Null))
}

/// `DELETE /v1/shell/sessions`: every shell session of the sandbox.
async fn shell_cleanup_all(State(state): State<AioState>, sandbox: AioSandbox) -> Answer {
    let closed = state
        .provisioner
        .close_shell_sessions(&sandbox.id, SessionKind::Shell)
        .await;
    Ok(ok_with(
        &format!("{closed} session(s) cleaned up"),
        Value::Null,
    ))
}

// --- /v1/bash ----------------------------------------------------------------------------

/// The status words of the bash API (`CommandStatus` in the SDK).
fn bash_status(report: &CommandReport) -> &'static str {
    match report.status {
        CommandStatus::Running | CommandStatus::NoChangeTimeout => "running",
        CommandStatus::Completed => "completed",
        CommandStatus::HardTimeout => "timed_out",
        CommandStatus::Killed => "killed",
        // The command ended its shell (`exit 3`): it completed, with that status.
        CommandStatus::Terminated if report.exit_code.is_some() => "completed",
        CommandStatus::Terminated => "killed",
    }
}

fn bash_result(report: CommandReport, max_output_length: usize) -> Value {
    json!({
        "session_id": report.session_id,
        "command_id": report.command_id,
        "command": report.command,
        "status": bash_status(&report),
        "exit_code": report.exit_code,
        "offset": report.stdout.len(),
        "stderr_offset": report.stderr.len(),
        "stdout": middle_truncate(report.stdout, max_output_length),
        "stderr": middle_truncate(report.stderr, max_output_length),
    })
}

fn bash_session(info: &SessionInfo) -> Value {
    json!({
        "session_id": info.id,
        "status": if info.status == SessionStatus::Ended { "closed" } else { "ready" },
        "working_dir": info.working_dir,
        "created_at": rfc3339(&info.created_at),
        "last_used_at": rfc3339(&info.last_used_at),
        "current_command": info.current_command,
        "command_count": info.command_count,
    })
}

#[derive(Debug, Default, Deserialize)]
struct BashExec {
    command: Option<String>,
    session_id: Option<String>,
    exec_dir: Option<String>,
    env: Option<BTreeMap<String, Option<String>>>,
    async_mode: Option<bool>,
    timeout: Option<f64>,
    hard_timeout: Option<f64>,
    max_output_length: Option<u64>,
}

/// `POST /v1/bash/exec`: runs a command in a bash session (a new one without
/// `session_id`); `env` holds for this command only.
async fn bash_exec(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<BashExec>,
) -> Answer {
    let command = required("command", &request.command)?;
    let asynchronous = request.async_mode.unwrap_or(false);
    let mut bash = ShellCommand::new(command, REQUESTED_BY);
    bash.exec_dir = request.exec_dir;
    bash.strict_exec_dir = true;
    bash.env = request.env.unwrap_or_default();
    bash.hard_timeout = seconds("hard_timeout", request.hard_timeout)?;
    bash.no_change_timeout = Some(NO_NO_CHANGE);
    bash.wait = if asynchronous {
        CommandWait::Async
    } else {
        CommandWait::Until(seconds("timeout", request.timeout)?)
    };
    let session = match request.session_id {
        Some(id) => Some(id),
        // A new session, opened here so it has no no-change timeout either.
        None => Some(open_bash(&state, &sandbox, None, None).await?.id),
    };
    let report = state
        .provisioner
        .run_in_shell_session(
            &sandbox.id,
            SessionKind::Bash,
            session.as_deref(),
            bash,
            FencePermit::unfenced(),
        )
        .await
        .map_err(failure)?;
    let max = if asynchronous {
        0
    } else {
        usize::try_from(request.max_output_length.unwrap_or(0)).unwrap_or(usize::MAX)
    };
    Ok(ok(bash_result(report, max)))
}

async fn open_bash(
    state: &AioState,
    sandbox: &AioSandbox,
    id: Option<String>,
    exec_dir: Option<String>,
) -> Result<SessionInfo, AioError> {
    state
        .provisioner
        .open_shell_session(
            &sandbox.id,
            SessionKind::Bash,
            SessionRequest {
                id,
                exec_dir,
                no_change_timeout: Some(NO_NO_CHANGE),
            },
        )
        .await
        .map_err(failure)
}

#[derive(Debug, Default, Deserialize)]
struct BashCreate {
    session_id: Option<String>,
    exec_dir: Option<String>,
}

/// `POST /v1/bash/sessions/create`.
async fn bash_create(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<BashCreate>,
) -> Answer {
    let info = open_bash(&state, &sandbox, request.session_id, request.exec_dir).await?;
    Ok(ok(bash_session(&info)))
}

/// `GET /v1/bash/sessions`.
async fn bash_list(State(state): State<AioState>, sandbox: AioSandbox) -> Answer {
    let sessions: Vec<Value> = state
        .provisioner
        .shell_sessions(&sandbox.id, SessionKind::Bash)
        .iter()
        .map(bash_session)
        .collect();
    Ok(ok(sessions))
}

/// `POST /v1/bash/sessions/{session_id}/close`.
async fn bash_close(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    Path(params): Path<HashMap<String, String>>,
) -> Answer {
    let id = session_param(&params)?;
    state
        .provisioner
        .close_shell_session(&sandbox.id, SessionKind::Bash, id)
        .await
        .map_err(failure)?;
    Ok(ok_with(&format!("Session {id} closed"), Value::Null))
}

#[derive(Debug, Default, Deserialize)]
struct BashOutput {
    session_id: Option<String>,
    command_id: Option<String>,
    offset: Option<u64>,
    stderr_offset: Option<u64>,
    wait: Option<bool>,
    wait_timeout: Option<f64>,
}

/// The part of `text` from byte `offset` on (at a character boundary).
fn from_offset(text: &str, offset: Option<u64>) -> String {
    let mut at = usize::try_from(offset.unwrap_or(0))
        .unwrap_or(usize::MAX)
        .min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    text[at..].to_owned()
}

/// `POST /v1/bash/output`: the latest command's output from the given offsets; with
/// `wait`, after waiting (at most `wait_timeout`) for the command to end.
async fn bash_output(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<BashOutput>,
) -> Answer {
    let id = required("session_id", &request.session_id)?;
    let report = if request.wait.unwrap_or(false) {
        let bound = seconds("wait_timeout", request.wait_timeout)?
            .unwrap_or(DEFAULT_WAIT)
            .min(MAX_WAIT);
        state
            .provisioner
            .wait_shell_session(&sandbox.id, SessionKind::Bash, id, bound)
            .await
    } else {
        state
            .provisioner
            .view_shell_session(&sandbox.id, SessionKind::Bash, id)
    }
    .map_err(failure)?;
    if let Some(command) = &request.command_id {
        if *command != report.command_id {
            return Err(AioError::not_found(format!(
                "Command not found: {command} (only the session's latest command is kept)"
            )));
        }
    }
    let command = (!report.command_id.is_empty()).then(|| {
        json!({
            "command_id": report.command_id,
            "command": report.command,
            "status": bash_status(&report),
            "exit_code": report.exit_code,
        })
    });
    Ok(ok(json!({
        "session_id": report.session_id,
        "stdout": from_offset(&report.stdout, request.offset),
        "stderr": from_offset(&report.stderr, request.stderr_offset),
        "offset": report.stdout.len(),
        "stderr_offset": report.stderr.len(),
        "command": command,
    })))
}

#[derive(Debug, Default, Deserialize)]
struct BashKill {
    session_id: Option<String>,
}

/// `POST /v1/bash/kill`: kills the session's running command (always with SIGKILL).
async fn bash_kill(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<BashKill>,
) -> Answer {
    let id = required("session_id", &request.session_id)?;
    let report = state
        .provisioner
        .kill_shell_command(&sandbox.id, SessionKind::Bash, id)
        .await
        .map_err(failure)?;
    Ok(ok(json!({
        "session_id": report.session_id,
        "command_id": report.command_id,
        "status": bash_status(&report),
        "exit_code": report.exit_code,
    })))
}

/// `POST /v1/bash/write`: see [`shell_write`].
async fn bash_write(sandbox: AioSandbox) -> Answer {
    shell_write(sandbox).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_output_keeps_its_start_and_its_end() {
        let text: String = "a".repeat(10) + &"b".repeat(10);
        let cut = middle_truncate(text, 10);
        assert!(cut.starts_with("aaaaa\n"), "{cut}");
        assert!(cut.ends_with("\nbbbbb"), "{cut}");
        assert!(cut.contains("[10 characters truncated]"));
        assert_eq!(middle_truncate("short".into(), 10), "short");
        assert_eq!(middle_truncate("no limit".into(), 0), "no limit");
    }

    #[test]
    fn offsets_cut_at_character_boundaries() {
        assert_eq!(from_offset("héllo", Some(2)), "llo");
        assert_eq!(from_offset("abc", Some(10)), "");
        assert_eq!(from_offset("abc", None), "abc");
    }
}
