//! `/v1/sandboxes/{id}/processes`: long-running processes (issue 32). Each handler parses
//! and calls the provisioner's processes, which hold every rule and every process.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use warren_backend::OutputStream;
use warren_protocol::{
    ProcessEvent, ProcessInfo, ProcessList, ProcessOutput, SignalProcess, StartProcess,
    TerminalSize,
};
use warren_provisioner::{OutputEvent, OutputPiece, ProcessRead, ProcessState};

use crate::extract::{sandbox_id, ApiJson, ApiPath, ApiQuery, Fence, SandboxPath};
use crate::stream::StreamFormat;
use crate::{ApiError, ApiState};

/// The path of one process: the sandbox and the pid.
#[derive(Debug, Deserialize)]
pub(crate) struct ProcessPath {
    id: String,
    pid: i32,
}

impl ProcessPath {
    pub(crate) fn parse(self) -> Result<(warren_core::SandboxId, i32), ApiError> {
        Ok((sandbox_id(&self.id)?, self.pid))
    }
}

/// Where to read a process's output from.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct OutputQuery {
    /// The offset to start at (default 0: everything still kept). Bytes dropped from the
    /// process's bounded output before it are reported as one `lost` event.
    #[serde(default)]
    from: u64,
}

/// Starts a process that keeps running after the answer: a server, a build, a REPL on a
/// terminal. Its output is kept (the newest 1 MiB) for readers to follow from any offset,
/// its stdin stays open with `"stdin": true`, and it can be signalled, resized and killed.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"),
        ("X-Warren-Requested-By" = Option<String>, Header, description = "Who asks, for the run record")),
    request_body = StartProcess,
    responses(
        (status = 201, body = ProcessInfo, description = "Started"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request, invalid_cwd, token_in_command, token_in_env, invalid_env"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "too_many_processes, sandbox_terminating, sandbox_terminated, fence_stale"),
        (status = 422, body = warren_protocol::ErrorBody, description = "process_not_started: no such program, or a working directory it cannot enter"),
        (status = 501, body = warren_protocol::ErrorBody, description = "exec_not_supported, processes_not_supported"),
        (status = 503, body = warren_protocol::ErrorBody, description = "runtime_elsewhere: another replica owns the runtime"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn start(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    headers: HeaderMap,
    ApiJson(request): ApiJson<StartProcess>,
) -> Result<Response, ApiError> {
    let program =
        crate::sandboxes::program_spec(request.command, request.argv, request.shell.as_deref())?;
    let input = warren_provisioner::StartProcess {
        program,
        cwd: request.cwd,
        env: request.env,
        pty: request.pty.map(terminal_size),
        stdin: request.stdin,
        tag: request.tag,
        timeout: request.timeout_s.map(Duration::from_secs),
        requested_by: crate::sandboxes::requested_by(&headers),
        quiet: false,
    };
    let permit = state.provisioner.fence(&id, fence).await?;
    let info = state.provisioner.start_process(&id, input, permit).await?;
    Ok((StatusCode::CREATED, Json(process_info(&info))).into_response())
}

/// The sandbox's processes on the replica that owns its runtime: running ones and those
/// that ended in the last ten minutes.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = ProcessList),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<ProcessList>, ApiError> {
    let processes = state.provisioner.list_processes(&id).await?;
    Ok(Json(ProcessList {
        processes: processes.iter().map(process_info).collect(),
    }))
}

/// One process.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime")),
    responses(
        (status = 200, body = ProcessInfo),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
) -> Result<Json<ProcessInfo>, ApiError> {
    let (id, pid) = path.parse()?;
    let info = state.provisioner.process_info(&id, pid).await?;
    Ok(Json(process_info(&info)))
}

/// The process's output from an offset. With `Accept: application/x-ndjson` or
/// `text/event-stream` the answer follows the process, event by event, until it ended and
/// its output is complete (`end`); a reader that went away comes back with `from` set to
/// the offset after the last byte it got and loses nothing still kept. Otherwise the
/// answer is what is there now.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime"), OutputQuery),
    responses(
        (status = 200, body = ProcessOutput, description = "What is there now (JSON), or a stream of ProcessEvent (NDJSON / SSE) with a streaming Accept"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn output(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    ApiQuery(query): ApiQuery<OutputQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (id, pid) = path.parse()?;
    let Some(format) = StreamFormat::from_accept(&headers) else {
        let ProcessRead { read, process } = state
            .provisioner
            .read_process_output(&id, pid, query.from, Duration::ZERO)
            .await?;
        let mut events: Vec<ProcessEvent> = read
            .lost
            .map(|(from, to)| ProcessEvent::Lost { from, to })
            .into_iter()
            .collect();
        events.extend(read.pieces.iter().map(output_event));
        return Ok(Json(ProcessOutput {
            events,
            next: read.next,
            process: process_info(&process),
        })
        .into_response());
    };
    let followed = state
        .provisioner
        .follow_process(&id, pid, query.from)
        .await?;
    let events = followed.map(move |event| {
        let event = match event {
            OutputEvent::Output(piece) => output_event(&piece),
            OutputEvent::Lost { from, to } => ProcessEvent::Lost { from, to },
            OutputEvent::End(info) => ProcessEvent::End {
                process: process_info(&info),
            },
        };
        Ok::<_, Infallible>(frame(format, &event))
    });
    Ok(crate::stream::streaming(format, Body::from_stream(events)))
}

/// Writes the request body to the process's stdin, as it arrives: a large body goes at
/// the pace the process reads it (backpressure), in order, with no other writer's bytes
/// between its own.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, body = warren_protocol::StdinWritten, description = "Written"),
        (status = 400, body = warren_protocol::ErrorBody, description = "token_in_command"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "stdin_closed, process_ended, fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn stdin(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    Fence(fence): Fence,
    body: Body,
) -> Result<Json<warren_protocol::StdinWritten>, ApiError> {
    let (id, pid) = path.parse()?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    let written = state
        .provisioner
        .write_stdin_stream(&id, pid, body.into_data_stream(), false)
        .await?;
    Ok(Json(warren_protocol::StdinWritten { written }))
}

/// Closes the process's stdin: it reads end-of-file (on a terminal, input just stops).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin/close", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime")),
    responses(
        (status = 204, description = "Closed"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "stdin_closed, fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn close_stdin(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    Fence(fence): Fence,
) -> Result<StatusCode, ApiError> {
    let (id, pid) = path.parse()?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    state.provisioner.write_stdin(&id, pid, &[], true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends a signal to the process's group (default) or to the process alone. `SIGKILL` to
/// the group ends its whole tree, background processes included.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime")),
    request_body = SignalProcess,
    responses(
        (status = 204, description = "Sent"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_signal"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "process_ended, fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn signal(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<SignalProcess>,
) -> Result<StatusCode, ApiError> {
    let (id, pid) = path.parse()?;
    let number = request.signal.number().ok_or_else(|| {
        ApiError::bad_request(
            warren_protocol::code!(400, "invalid_signal"),
            "signal must be a number from 1 to 64 or a name such as SIGINT, INT or SIGTERM",
        )
    })?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    state
        .provisioner
        .signal_process(&id, pid, number, request.group)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the size of the process's terminal; its foreground process group gets `SIGWINCH`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime")),
    request_body = TerminalSize,
    responses(
        (status = 204, description = "Resized"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request: a side out of range"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "not_a_terminal, process_ended, fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn resize(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    Fence(fence): Fence,
    ApiJson(size): ApiJson<TerminalSize>,
) -> Result<StatusCode, ApiError> {
    let (id, pid) = path.parse()?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    state
        .provisioner
        .resize_process(&id, pid, terminal_size(size))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kills the process's whole tree, background processes included (I24), and answers once
/// it ended.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/kill", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime")),
    responses(
        (status = 200, body = ProcessInfo, description = "Ended"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn kill(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    Fence(fence): Fence,
) -> Result<Json<ProcessInfo>, ApiError> {
    let (id, pid) = path.parse()?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    let info = state.provisioner.kill_process(&id, pid).await?;
    Ok(Json(process_info(&info)))
}

/// A terminal both ways over a WebSocket, what `kubectl exec -it` and `docker attach`
/// users expect: the process's stdout (a terminal's whole output) arrives as binary
/// messages from offset `from`, anything else as text messages holding `ProcessEvent`
/// JSON (`stderr`, `lost`, and `end` last, before the close). Binary messages from the
/// client are stdin; text messages are JSON controls: `{"type":"resize","cols":C,"rows":R}`,
/// `{"type":"signal","signal":"SIGINT","group":true}`, `{"type":"stdin_close"}`,
/// `{"type":"kill"}`. Closing the socket detaches: the process runs on.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}/attach", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "The process's pid in the runtime"), OutputQuery),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol"),
        (status = 400, body = warren_protocol::ErrorBody, description = "websocket_required: the request is not a WebSocket upgrade"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, process_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn attach(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    ApiQuery(query): ApiQuery<OutputQuery>,
    Fence(fence): Fence,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let (id, pid) = path.parse()?;
    let output = state
        .provisioner
        .follow_process(&id, pid, query.from)
        .await?;
    drop(state.provisioner.fence(&id, fence).await?);
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::bad_request(
            warren_protocol::code!(400, "websocket_required"),
            format!("attach speaks WebSocket: {}", rejection.body_text()),
        )
    })?;
    Ok(upgrade
        .on_upgrade(move |socket| terminal(state, id, pid, output, socket))
        .into_response())
}

/// A control message of an attached client.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    Resize {
        cols: u16,
        rows: u16,
    },
    Signal {
        signal: warren_protocol::SignalName,
        #[serde(default = "group_default")]
        group: bool,
    },
    StdinClose,
    Kill,
}

fn group_default() -> bool {
    true
}

/// Serves one attached client until the process's output is complete or the client goes.
async fn terminal(
    state: ApiState,
    id: warren_core::SandboxId,
    pid: i32,
    mut output: futures::stream::BoxStream<'static, OutputEvent>,
    socket: WebSocket,
) {
    let (mut to_client, mut from_client) = socket.split();
    let text = |event: &ProcessEvent| {
        Message::Text(serde_json::to_string(event).unwrap_or_default().into())
    };
    loop {
        tokio::select! {
            event = output.next() => {
                let message = match event {
                    Some(OutputEvent::Output(piece)) if piece.stream == OutputStream::Stdout => {
                        Message::Binary(piece.bytes.into())
                    }
                    Some(OutputEvent::Output(piece)) => text(&output_event(&piece)),
                    Some(OutputEvent::Lost { from, to }) => text(&ProcessEvent::Lost { from, to }),
                    Some(OutputEvent::End(info)) => {
                        let end = ProcessEvent::End { process: process_info(&info) };
                        let _ = to_client.send(text(&end)).await;
                        let _ = to_client.send(Message::Close(None)).await;
                        return;
                    }
                    None => return,
                };
                if to_client.send(message).await.is_err() {
                    return;
                }
            }
            message = from_client.next() => {
                let outcome = match message {
                    Some(Ok(Message::Binary(bytes))) => {
                        state.provisioner.write_stdin(&id, pid, &bytes, false).await.map(drop).map_err(ApiError::from)
                    }
                    Some(Ok(Message::Text(body))) => match serde_json::from_str::<Control>(&body) {
                        Ok(control) => control_process(&state, &id, pid, control).await,
                        Err(error) => Err(ApiError::bad_request(warren_protocol::code!(400, "invalid_json"), format!("not a control message: {error}"))),
                    },
                    Some(Ok(_)) => Ok(()),
                    // Detached: the process runs on.
                    Some(Err(_)) | None => return,
                };
                if let Err(error) = outcome {
                    let event = ProcessEvent::Error {
                        error: warren_protocol::ErrorDetail::new(error.code(), error.message()),
                    };
                    if to_client.send(text(&event)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

async fn control_process(
    state: &ApiState,
    id: &warren_core::SandboxId,
    pid: i32,
    control: Control,
) -> Result<(), ApiError> {
    let provisioner = &state.provisioner;
    match control {
        Control::Resize { cols, rows } => {
            let size = warren_backend::TerminalSize { cols, rows };
            provisioner.resize_process(id, pid, size).await?;
        }
        Control::Signal { signal, group } => {
            let number = signal.number().ok_or_else(|| {
                ApiError::bad_request(
                    warren_protocol::code!(400, "invalid_signal"),
                    "signal must be 1 to 64 or a name such as SIGINT",
                )
            })?;
            provisioner.signal_process(id, pid, number, group).await?;
        }
        Control::StdinClose => {
            provisioner.write_stdin(id, pid, &[], true).await?;
        }
        Control::Kill => {
            provisioner.signal_process(id, pid, 9, true).await?;
        }
    }
    Ok(())
}

fn terminal_size(size: TerminalSize) -> warren_backend::TerminalSize {
    warren_backend::TerminalSize {
        cols: size.cols,
        rows: size.rows,
    }
}

fn output_event(piece: &OutputPiece) -> ProcessEvent {
    let data = base64::engine::general_purpose::STANDARD.encode(&piece.bytes);
    match piece.stream {
        OutputStream::Stdout => ProcessEvent::Stdout {
            offset: piece.offset,
            data,
        },
        OutputStream::Stderr => ProcessEvent::Stderr {
            offset: piece.offset,
            data,
        },
    }
}

fn rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A process as the wire shows it.
pub(crate) fn process_info(info: &warren_provisioner::ProcessInfo) -> ProcessInfo {
    let (status, exit_code, signal, timed_out, ended_at) = match info.state {
        ProcessState::Running => ("running", None, None, false, None),
        ProcessState::Ended {
            exit_code,
            signal,
            timed_out,
            ended_at,
        } => (
            "exited",
            exit_code,
            signal,
            timed_out,
            Some(rfc3339(ended_at)),
        ),
        ProcessState::Lost { ended_at } => ("lost", None, None, false, Some(rfc3339(ended_at))),
    };
    ProcessInfo {
        sandbox_id: info.sandbox_id.to_string(),
        pid: info.pid,
        run_id: info.run_id.clone(),
        tag: info.tag.clone(),
        command: info.command.clone(),
        cwd: info.cwd.clone(),
        pty: info.pty.map(|size| TerminalSize {
            cols: size.cols,
            rows: size.rows,
        }),
        stdin_open: info.stdin_open,
        requested_by: info.requested_by.clone(),
        started_at: rfc3339(info.started_at),
        status: status.to_owned(),
        exit_code,
        signal,
        timed_out,
        ended_at,
        output_start: info.output.0,
        output_end: info.output.1,
    }
}

fn frame(format: StreamFormat, event: &ProcessEvent) -> Bytes {
    // ProcessEvent holds only strings, numbers and options: serialising cannot fail.
    let json = serde_json::to_string(event).unwrap_or_default();
    match format {
        StreamFormat::NdJson => Bytes::from(json + "\n"),
        StreamFormat::EventStream => {
            let name = match event {
                ProcessEvent::Stdout { .. } => "stdout",
                ProcessEvent::Stderr { .. } => "stderr",
                ProcessEvent::Lost { .. } => "lost",
                ProcessEvent::End { .. } => "end",
                ProcessEvent::Error { .. } => "error",
            };
            Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
        }
    }
}
