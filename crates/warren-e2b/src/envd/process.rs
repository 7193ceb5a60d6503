//! `process.Process` over the provisioner's processes (issue 32), one to one: Start is
//! `start_process` (run record I22, as the sandbox user I11, a real PTY and pid), Connect
//! follows a process's output, List lists the running ones, SendInput, StreamInput and
//! CloseStdin write its stdin (a terminal's input is its stdin too), SendSignal signals
//! or kills it, and Update resizes its terminal.
//!
//! A stream opens with `start{pid}`, carries `data` events as output arrives and
//! `keepalive` events while there is none (at the interval the client asks for in
//! `Keepalive-Ping-Interval`), and closes with `end` (exit code, `exited`, Go's status
//! text, an error when it failed: what the SDKs' `CommandExitException` is built from).
//! When the sandbox is killed or paused, its streams end with `unavailable` instead,
//! which the SDKs check against the sandbox's health and report as a sandbox that stopped.

use std::pin::Pin;
use std::time::Duration;

use axum::response::Response;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use warren_backend::{OutputStream, TerminalSize};
use warren_provisioner::{
    FencePermit, OutputEvent, ProcessInfo as WarrenProcess, ProcessState, ProgramSpec,
    ProvisionerError, StartProcess,
};

use super::connect::{Call, Code, ConnectError, Message};
use super::proto::process::{
    process_event, process_input, process_selector, stream_input_request, CloseStdinRequest,
    CloseStdinResponse, ConnectRequest, ConnectResponse, ListRequest, ListResponse, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, SendInputRequest, SendInputResponse,
    SendSignalRequest, SendSignalResponse, Signal, StartRequest, StartResponse, StreamInputRequest,
    StreamInputResponse, UpdateRequest, UpdateResponse,
};
use super::EnvdContext;
use crate::{E2bError, Shared};

/// The header the SDKs ask for keepalive events with, in seconds (they send 50).
/// The keepalive interval when the client names none.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(1);
/// The longest keepalive interval honoured.
const MAX_KEEPALIVE: Duration = Duration::from_secs(50);

/// Serves one call of `process.Process`.
pub(crate) async fn serve(ctx: EnvdContext, method: &str, mut call: Call) -> Response {
    let streaming = match method {
        "Start" | "Connect" | "StreamInput" => true,
        "List" | "SendInput" | "SendSignal" | "CloseStdin" | "Update" => false,
        other => {
            return call.error(ConnectError::new(
                Code::Unimplemented,
                format!(
                    "process.Process/{} is not a method",
                    crate::error::shorten(other)
                ),
            ))
        }
    };
    if let Err(response) = call.require_streaming(streaming) {
        return response;
    }
    match method {
        "Start" => start(ctx, call).await,
        "Connect" => connect(ctx, call).await,
        "StreamInput" => stream_input(ctx, call).await,
        "List" => answer(&mut call, |request| list(ctx, request)).await,
        "SendInput" => answer(&mut call, |request| send_input(ctx, request)).await,
        "SendSignal" => answer(&mut call, |request| send_signal(ctx, request)).await,
        "CloseStdin" => answer(&mut call, |request| close_stdin(ctx, request)).await,
        _ => answer(&mut call, |request| update(ctx, request)).await,
    }
}

/// Reads a unary call's request, runs `handler` and answers its result.
async fn answer<Req, Res, F, Fut>(call: &mut Call, handler: F) -> Response
where
    Req: Message,
    Res: Message,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<Output = Result<Res, ConnectError>>,
{
    let request = match call.message::<Req>().await {
        Ok(request) => request,
        Err(error) => return call.error(error),
    };
    match handler(request).await {
        Ok(response) => call.unary(&response),
        Err(error) => call.error(error),
    }
}

/// `Start`: runs a command and streams its events. The command keeps running when the
/// client goes away (`commands.run(background=True)`, `disconnect()`); its timeout is the
/// call's (`Connect-Timeout-Ms`), as envd's.
async fn start(ctx: EnvdContext, mut call: Call) -> Response {
    let request = match call.message::<StartRequest>().await {
        Ok(request) => request,
        Err(error) => return call.error(error),
    };
    if let Err(error) = check_user(ctx.user.as_deref()) {
        return call.error(error);
    }
    let config = request.process.unwrap_or_default();
    if config.cmd.is_empty() {
        return call.error(ConnectError::new(
            Code::InvalidArgument,
            "process.cmd must name the program to run",
        ));
    }
    // The sandbox's environment (`env_vars` at create), under the request's.
    let mut env = ctx.sandbox.env_vars.clone();
    env.extend(config.envs);
    let pty = request.pty.map(|pty| {
        let size = pty.size.unwrap_or_default();
        // A terminal of no size confuses every program; 80x24 is what one gets.
        TerminalSize {
            cols: side(size.cols, 80),
            rows: side(size.rows, 24),
        }
    });
    let start = StartProcess {
        program: ProgramSpec::Argv(std::iter::once(config.cmd).chain(config.args).collect()),
        cwd: resolve_cwd(config.cwd.as_deref()),
        env,
        // A terminal takes its input on stdin; otherwise envd's default when the request
        // does not say (older SDKs) is an open stdin.
        stdin: pty.is_some() || request.stdin.unwrap_or(true),
        pty,
        tag: request.tag.filter(|tag| !tag.is_empty()),
        timeout: call.timeout().filter(|timeout| !timeout.is_zero()),
        requested_by: format!("e2b:{}", ctx.sandbox.sandbox_id),
        quiet: false,
    };
    let provisioner = &ctx.shared.provisioner;
    let id = &ctx.sandbox.warren_id;
    let started = match provisioner
        .start_process(id, start, FencePermit::unfenced())
        .await
    {
        Ok(info) => followed(&ctx, info, 0).await,
        Err(error) => Err(error),
    };
    match started {
        Ok((info, output)) => {
            let keepalive = call.keepalive(DEFAULT_KEEPALIVE, MAX_KEEPALIVE);
            call.stream(events(ctx, &info, output, keepalive, |event| {
                StartResponse { event: Some(event) }
            }))
        }
        Err(error) => call.error(process_error(error)),
    }
}

/// `Connect`: streams a running process's events from now on, opening with `start{pid}`.
async fn connect(ctx: EnvdContext, mut call: Call) -> Response {
    let request = match call.message::<ConnectRequest>().await {
        Ok(request) => request,
        Err(error) => return call.error(error),
    };
    let found = match find(&ctx, request.process).await {
        Ok(info) => {
            let from = info.output.1;
            followed(&ctx, info, from).await.map_err(process_error)
        }
        Err(error) => Err(error),
    };
    match found {
        Ok((info, output)) => {
            let keepalive = call.keepalive(DEFAULT_KEEPALIVE, MAX_KEEPALIVE);
            call.stream(events(ctx, &info, output, keepalive, |event| {
                ConnectResponse { event: Some(event) }
            }))
        }
        Err(error) => call.error(error),
    }
}

/// `List`: the running processes, with the config they were started with (the request's
/// environment: what the sandbox's adds is left out).
async fn list(ctx: EnvdContext, _request: ListRequest) -> Result<ListResponse, ConnectError> {
    let id = &ctx.sandbox.warren_id;
    let provisioner = &ctx.shared.provisioner;
    let mut processes = Vec::new();
    for info in provisioner
        .list_processes(id)
        .await
        .map_err(process_error)?
    {
        if info.state != ProcessState::Running {
            continue;
        }
        let envs = info
            .env
            .iter()
            .filter(|(name, value)| ctx.sandbox.env_vars.get(*name) != Some(*value))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let mut argv = info.argv.into_iter();
        processes.push(ProcessInfo {
            config: Some(ProcessConfig {
                cmd: argv.next().unwrap_or_default(),
                args: argv.collect(),
                envs,
                cwd: Some(info.cwd),
            }),
            pid: u32::try_from(info.pid).unwrap_or_default(),
            tag: info.tag,
        });
    }
    Ok(ListResponse { processes })
}

/// `SendInput`: bytes for a process's stdin or terminal, after any sent before.
async fn send_input(
    ctx: EnvdContext,
    request: SendInputRequest,
) -> Result<SendInputResponse, ConnectError> {
    let process = find(&ctx, request.process).await?;
    deliver(&ctx, &process, request.input).await?;
    Ok(SendInputResponse {})
}

/// `StreamInput`: a client stream whose first message names the process and whose later
/// ones carry input (or keepalives), delivered in order as they arrive.
async fn stream_input(ctx: EnvdContext, mut call: Call) -> Response {
    let mut messages = Box::pin(call.messages::<StreamInputRequest>());
    let mut target: Option<WarrenProcess> = None;
    while let Some(message) = messages.next().await {
        let result = match message.map(|message| message.event) {
            Err(error) => Err(error),
            // envd resolves the process once, at the start.
            Ok(Some(stream_input_request::Event::Start(start))) => find(&ctx, start.process)
                .await
                .map(|process| target = Some(process)),
            Ok(Some(stream_input_request::Event::Data(data))) => match &target {
                Some(process) => deliver(&ctx, process, data.input).await,
                None => Err(ConnectError::new(
                    Code::InvalidArgument,
                    "the input stream must start with a start event naming the process",
                )),
            },
            Ok(Some(stream_input_request::Event::Keepalive(_))) => Ok(()),
            Ok(None) => Err(ConnectError::new(
                Code::InvalidArgument,
                "a stream input message holds no event",
            )),
        };
        if let Err(error) = result {
            return call.error(error);
        }
    }
    call.unary(&StreamInputResponse {})
}

/// Writes one `ProcessInput` to the process's stdin: `pty` bytes for a terminal, `stdin`
/// bytes otherwise.
async fn deliver(
    ctx: &EnvdContext,
    info: &WarrenProcess,
    input: Option<ProcessInput>,
) -> Result<(), ConnectError> {
    let pid = info.pid;
    let bytes = match (input.and_then(|input| input.input), info.pty.is_some()) {
        (Some(process_input::Input::Pty(bytes)), true)
        | (Some(process_input::Input::Stdin(bytes)), false) => bytes,
        (Some(process_input::Input::Stdin(_)), true) => {
            return Err(failed_precondition(format!(
                "process {pid} has a PTY: send its input as `pty`, not `stdin`"
            )))
        }
        (Some(process_input::Input::Pty(_)), false) => {
            return Err(failed_precondition(format!(
                "process {pid} has no PTY: send its input as `stdin`, not `pty`"
            )))
        }
        (None, _) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "input must hold stdin or pty bytes",
            ))
        }
    };
    ctx.shared
        .provisioner
        .write_stdin(&ctx.sandbox.warren_id, pid, &bytes, false)
        .await
        .map_err(process_error)?;
    Ok(())
}

/// `SendSignal`: SIGKILL (the whole tree, at once) or SIGTERM (the process group).
async fn send_signal(
    ctx: EnvdContext,
    request: SendSignalRequest,
) -> Result<SendSignalResponse, ConnectError> {
    let process = find(&ctx, request.process).await?;
    let (id, pid) = (&ctx.sandbox.warren_id, process.pid);
    let provisioner = &ctx.shared.provisioner;
    let sent = match Signal::try_from(request.signal) {
        Ok(Signal::Sigkill) => provisioner.kill_process(id, pid).await.map(drop),
        Ok(Signal::Sigterm) => provisioner.signal_process(id, pid, SIGTERM, true).await,
        _ => {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!(
                    "signal {} is not supported: send SIGKILL or SIGTERM",
                    request.signal
                ),
            ))
        }
    };
    match sent {
        // It ended on its own meanwhile: what the signal was for.
        Ok(()) | Err(ProvisionerError::ProcessEnded { .. }) => Ok(SendSignalResponse {}),
        Err(error) => Err(process_error(error)),
    }
}

/// `CloseStdin`: the process reads an end of file once it read what was sent. Nothing to
/// do for a process started without stdin, as with envd.
async fn close_stdin(
    ctx: EnvdContext,
    request: CloseStdinRequest,
) -> Result<CloseStdinResponse, ConnectError> {
    let info = find(&ctx, request.process).await?;
    if info.pty.is_some() {
        return Err(failed_precondition(format!(
            "process {} has a PTY, whose input cannot be closed: send Ctrl-D (0x04) instead",
            info.pid
        )));
    }
    let closed = ctx
        .shared
        .provisioner
        .write_stdin(&ctx.sandbox.warren_id, info.pid, &[], true)
        .await;
    match closed {
        Ok(_) | Err(ProvisionerError::ProcessStdinClosed { .. }) => Ok(CloseStdinResponse {}),
        Err(error) => Err(process_error(error)),
    }
}

/// `Update`: resizes a process's PTY (the only thing an update changes).
async fn update(ctx: EnvdContext, request: UpdateRequest) -> Result<UpdateResponse, ConnectError> {
    // Nothing to change without a size; the process must still exist.
    let process = find(&ctx, request.process).await?;
    if let Some(size) = request.pty.and_then(|pty| pty.size) {
        let size = TerminalSize {
            cols: side(size.cols, 1),
            rows: side(size.rows, 1),
        };
        ctx.shared
            .provisioner
            .resize_process(&ctx.sandbox.warren_id, process.pid, size)
            .await
            .map_err(process_error)?;
    }
    Ok(UpdateResponse {})
}

/// SIGTERM's number.
const SIGTERM: i32 = 15;
/// The largest terminal side warren's processes take, in cells.
const MAX_TERMINAL_SIDE: u16 = 4096;

/// A terminal side from envd's request: `default` for 0, at most warren's largest.
fn side(cells: u32, default: u16) -> u16 {
    match cells {
        0 => default,
        cells => {
            u16::try_from(cells.min(u32::from(MAX_TERMINAL_SIDE))).unwrap_or(MAX_TERMINAL_SIDE)
        }
    }
}

/// The working directory an E2B request means, as an absolute path in the runtime:
/// relative paths and `~` are the sandbox user's home, as envd resolves them.
fn resolve_cwd(cwd: Option<&str>) -> Option<String> {
    let home = warren_core::Layout::E2B.home;
    let cwd = cwd.filter(|cwd| !cwd.is_empty())?;
    Some(if cwd == "~" {
        home.to_owned()
    } else if let Some(rest) = cwd.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if cwd.starts_with('/') {
        cwd.to_owned()
    } else {
        format!("{home}/{cwd}")
    })
}

/// Refuses users other than the sandbox user for commands: every command runs as uid
/// 1000 (I11), so running one as `root` would be a lie.
fn check_user(user: Option<&str>) -> Result<(), ConnectError> {
    if user == Some("root") {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            "warren runs every command as the sandbox user (uid 1000); root is not available",
        ));
    }
    super::fs::check_user(user)
        .map_err(|unknown| ConnectError::new(Code::Unauthenticated, unknown.to_string()))
}

/// The running process envd's selector names: by pid, or the newest running one with the
/// tag. An ended process is not found, as with envd.
async fn find(
    ctx: &EnvdContext,
    selector: Option<ProcessSelector>,
) -> Result<WarrenProcess, ConnectError> {
    let id = &ctx.sandbox.warren_id;
    let provisioner = &ctx.shared.provisioner;
    let (found, not_found) = match selector.and_then(|selector| selector.selector) {
        Some(process_selector::Selector::Pid(pid)) => (
            match i32::try_from(pid) {
                Ok(pid) => provisioner.process_info(id, pid).await.ok(),
                Err(_) => None,
            },
            format!("process with pid {pid} not found"),
        ),
        Some(process_selector::Selector::Tag(tag)) => (
            provisioner.process_by_tag(id, &tag).await.ok(),
            format!(
                "process with tag {:?} not found",
                crate::error::shorten(&tag)
            ),
        ),
        None => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "the request must name a process by pid or tag",
            ))
        }
    };
    found
        .filter(|process| process.state == ProcessState::Running)
        .ok_or_else(|| ConnectError::new(Code::NotFound, not_found))
}

/// The process and its output followed from offset `from`.
async fn followed(
    ctx: &EnvdContext,
    info: WarrenProcess,
    from: u64,
) -> Result<(WarrenProcess, BoxStream<'static, OutputEvent>), ProvisionerError> {
    let output = ctx
        .shared
        .provisioner
        .follow_process(&ctx.sandbox.warren_id, info.pid, from)
        .await?;
    Ok((info, output))
}

/// A process's events as envd streams them, following its output from offset `from`:
/// `start`, then `data` and `keepalive`, then `end` (or `unavailable` when the sandbox
/// ended), each wrapped by `wrap` into the method's response message.
fn events<T, F>(
    ctx: EnvdContext,
    info: &WarrenProcess,
    output: BoxStream<'static, OutputEvent>,
    keepalive: Duration,
    wrap: F,
) -> impl Stream<Item = Result<T, ConnectError>> + Send + 'static
where
    T: Message,
    F: Fn(ProcessEvent) -> T + Send + Sync + 'static,
{
    let start = event(process_event::Event::Start(process_event::StartEvent {
        pid: u32::try_from(info.pid).unwrap_or_default(),
    }));
    let pty = info.pty.is_some();
    let state = (output, ctx.shared, ctx.sandbox.sandbox_id);
    let rest = futures::stream::unfold(Some(state), move |state| async move {
        let (mut output, shared, sandbox_id) = state?;
        let item = match tokio::time::timeout(keepalive, output.next()).await {
            Err(_) => Ok(event(process_event::Event::Keepalive(
                process_event::KeepAlive {},
            ))),
            Ok(None) => return None,
            Ok(Some(OutputEvent::Output(piece))) => Ok(data(piece.stream, pty, piece.bytes)),
            Ok(Some(OutputEvent::Lost { from, to })) => Ok(data(
                OutputStream::Stderr,
                false,
                format!(
                    "\n[warren: {} bytes of this command's output were dropped: this client read them too slowly]\n",
                    to.saturating_sub(from)
                )
                .into(),
            )),
            Ok(Some(OutputEvent::End(info))) => end(&shared, &sandbox_id, info.state).await,
        };
        let more = matches!(&item, Ok(event) if !matches!(event.event, Some(process_event::Event::End(_))));
        Some((item, more.then_some((output, shared, sandbox_id))))
    });
    let stream: Pin<Box<dyn Stream<Item = Result<ProcessEvent, ConnectError>> + Send>> =
        Box::pin(futures::stream::once(async move { Ok(start) }).chain(rest));
    stream.map(move |item| item.map(&wrap))
}

/// A `ProcessEvent` holding `event`.
fn event(event: process_event::Event) -> ProcessEvent {
    ProcessEvent { event: Some(event) }
}

/// A `data` event: a terminal's output is `pty`, whichever stream carried it.
fn data(stream: OutputStream, pty: bool, bytes: Vec<u8>) -> ProcessEvent {
    use process_event::data_event::Output as Data;
    let output = match (pty, stream) {
        (true, _) => Data::Pty(bytes),
        (false, OutputStream::Stdout) => Data::Stdout(bytes),
        (false, OutputStream::Stderr) => Data::Stderr(bytes),
    };
    event(process_event::Event::Data(process_event::DataEvent {
        output: Some(output),
    }))
}

/// The last item of a stream: envd's `end` event, or `unavailable` when the process went
/// with its sandbox (its runtime lost, or killed by a kill or pause of the sandbox).
async fn end(
    shared: &Shared,
    sandbox_id: &str,
    state: ProcessState,
) -> Result<ProcessEvent, ConnectError> {
    let killed_from_outside = matches!(
        state,
        ProcessState::Ended {
            exit_code: None,
            signal: Some(_),
            timed_out: false,
            ..
        }
    );
    let gone = killed_from_outside
        && !matches!(
            crate::control::live_sandbox(shared, sandbox_id).await,
            Ok(Some(_))
        );
    match end_event(state) {
        Some(end) if !gone => Ok(event(process_event::Event::End(end))),
        // E2B's words, which the SDKs turn into `SandboxNotRunning`.
        _ => Err(ConnectError::sandbox_gone(sandbox_id)),
    }
}

/// How a process ended as envd's `EndEvent` says it (Go's `ProcessState`); `None` while
/// it runs or when its runtime went away under it.
fn end_event(state: ProcessState) -> Option<process_event::EndEvent> {
    let ProcessState::Ended {
        exit_code, signal, ..
    } = state
    else {
        return None;
    };
    let (exit_code, exited, status) = match (exit_code, signal) {
        (Some(code), _) => (code, true, format!("exit status {code}")),
        (None, Some(signal)) => (-1, false, format!("signal: {}", signal_name(signal))),
        (None, None) => {
            return Some(process_event::EndEvent {
                exit_code: -1,
                exited: false,
                status: "error".into(),
                error: Some("the command ended without an exit status".into()),
            })
        }
    };
    Some(process_event::EndEvent {
        exit_code,
        exited,
        error: (exit_code != 0).then(|| status.clone()),
        status,
    })
}

/// A signal's name as Go prints it (`ProcessState.String()`), which envd's `status` is.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

/// A `failed_precondition` error.
fn failed_precondition(message: String) -> ConnectError {
    ConnectError::new(Code::FailedPrecondition, message)
}

/// A provisioner failure as envd's Connect error: the process failures with the codes
/// envd answers them with, the rest as every envd call answers them.
fn process_error(error: ProvisionerError) -> ConnectError {
    let (code, message) = match &error {
        ProvisionerError::ProcessNotFound { pid, .. } => {
            (Code::NotFound, format!("process with pid {pid} not found"))
        }
        ProvisionerError::ProcessTagNotFound { tag, .. } => (
            Code::NotFound,
            format!("process with tag {:?} not found", crate::error::shorten(tag)),
        ),
        ProvisionerError::ProcessEnded { pid } => (Code::NotFound, format!("process {pid} ended")),
        ProvisionerError::TooManyProcesses { max, .. } => (
            Code::ResourceExhausted,
            format!("this sandbox already runs {max} processes (the most it may): wait for one to end or kill one"),
        ),
        ProvisionerError::ProcessStdinClosed { pid } => (
            Code::FailedPrecondition,
            format!("stdin of process {pid} is closed (or was never open: start it with stdin enabled, `stdin=True`, to send it input)"),
        ),
        ProvisionerError::NotATerminal { pid } => {
            (Code::FailedPrecondition, format!("process {pid} has no PTY"))
        }
        ProvisionerError::ProcessNotStarted { .. } => {
            (Code::FailedPrecondition, error.public_message())
        }
        _ => return E2bError::Provisioner(error).into_connect(),
    };
    ConnectError::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_other_than_the_sandbox_user_are_refused() {
        assert!(check_user(None).is_ok());
        assert!(check_user(Some("user")).is_ok());
        let root = check_user(Some("root")).expect_err("root");
        assert_eq!(root.code, Code::PermissionDenied);
        assert!(root.message.contains("uid 1000"));
        assert_eq!(
            check_user(Some("mallory")).expect_err("unknown").code,
            Code::Unauthenticated
        );
    }

    #[test]
    fn process_failures_keep_envds_codes() {
        let sandbox = warren_core::SandboxId::parse("sbx-0123456789abcdef01234567").expect("an id");
        let code = |error| process_error(error).code;
        // The SDKs' kill answers false on not_found.
        assert_eq!(
            code(ProvisionerError::ProcessNotFound {
                sandbox: sandbox.clone(),
                pid: 7
            }),
            Code::NotFound
        );
        assert_eq!(
            code(ProvisionerError::ProcessTagNotFound {
                sandbox: sandbox.clone(),
                tag: "web".into()
            }),
            Code::NotFound
        );
        assert_eq!(
            code(ProvisionerError::ProcessEnded { pid: 7 }),
            Code::NotFound
        );
        assert_eq!(
            code(ProvisionerError::TooManyProcesses { sandbox, max: 32 }),
            Code::ResourceExhausted
        );
        for error in [
            ProvisionerError::ProcessStdinClosed { pid: 7 },
            ProvisionerError::NotATerminal { pid: 7 },
            ProvisionerError::ProcessNotStarted {
                reason: "no such file".into(),
            },
        ] {
            assert_eq!(code(error), Code::FailedPrecondition);
        }
        let message = process_error(ProvisionerError::ProcessNotFound {
            sandbox: warren_core::SandboxId::parse("sbx-0123456789abcdef01234567").expect("an id"),
            pid: 7,
        })
        .message;
        assert_eq!(message, "process with pid 7 not found");
    }

    #[test]
    fn end_events_read_as_envds() {
        let ended = |exit_code, signal| ProcessState::Ended {
            exit_code,
            signal,
            timed_out: false,
            ended_at: chrono::Utc::now(),
        };
        let ok = end_event(ended(Some(0), None)).expect("an end");
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let failed = end_event(ended(Some(1), None)).expect("an end");
        assert_eq!(failed.error.as_deref(), Some("exit status 1"));
        let killed = end_event(ended(None, Some(9))).expect("an end");
        assert_eq!(
            (killed.exit_code, killed.exited, killed.status.as_str()),
            (-1, false, "signal: killed")
        );
        assert_eq!(killed.error.as_deref(), Some("signal: killed"));
        assert_eq!(signal_name(15), "terminated");
        assert_eq!(signal_name(40), "signal 40");
        assert_eq!(end_event(ProcessState::Running), None);
        assert_eq!(
            end_event(ProcessState::Lost {
                ended_at: chrono::Utc::now()
            }),
            None
        );
    }

    #[test]
    fn working_directories_and_terminal_sides_read_as_envds() {
        assert_eq!(resolve_cwd(None), None);
        assert_eq!(resolve_cwd(Some("")), None);
        assert_eq!(resolve_cwd(Some("~")).as_deref(), Some("/home/user"));
        assert_eq!(
            resolve_cwd(Some("~/a/b")).as_deref(),
            Some("/home/user/a/b")
        );
        assert_eq!(resolve_cwd(Some("src")).as_deref(), Some("/home/user/src"));
        assert_eq!(resolve_cwd(Some("/tmp")).as_deref(), Some("/tmp"));
        assert_eq!((side(0, 80), side(0, 1), side(100, 80)), (80, 1, 100));
        assert_eq!(side(1 << 20, 80), MAX_TERMINAL_SIDE);
    }
}
