//! `process.Process` over the process engine (`crate::processes`): Start and Connect
//! stream a process's events, List, SendInput, StreamInput, SendSignal, CloseStdin and
//! Update act on a running one. Every command runs through the provisioner's exec, as the
//! sandbox user (I11), with a run record (I22).
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
use futures::{Stream, StreamExt};

use super::connect::{Call, Code, ConnectError, Message};
use super::proto::process::{
    process_event, process_input, process_selector, stream_input_request, CloseStdinRequest,
    CloseStdinResponse, ConnectRequest, ConnectResponse, ListRequest, ListResponse, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, SendInputRequest, SendInputResponse,
    SendSignalRequest, SendSignalResponse, Signal, StartRequest, StartResponse, StreamInputRequest,
    StreamInputResponse, UpdateRequest, UpdateResponse,
};
use super::EnvdContext;
use crate::processes::{
    Delivery, Ending, Events, Exit, Input, Output, ProcessError, PtySize, Selector, StartSpec,
};
use crate::E2bError;

/// The header the SDKs ask for keepalive events with, in seconds (they send 50).
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";
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
/// call's (`Connect-Timeout-Ms`), as envd's, bounded by warren's longest exec.
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
    let spec = StartSpec {
        cmd: config.cmd,
        args: config.args,
        envs: config.envs.into_iter().collect(),
        sandbox_env: ctx.sandbox.env_vars.clone(),
        cwd: config.cwd,
        tag: request.tag,
        // envd's default when the request does not say (older SDKs): stdin is open.
        stdin: request.stdin.unwrap_or(true),
        pty: request.pty.map(|pty| {
            let size = pty.size.unwrap_or_default();
            PtySize {
                cols: size.cols,
                rows: size.rows,
            }
        }),
        timeout: call.timeout(),
        requested_by: format!("e2b:{}", ctx.sandbox.sandbox_id),
    };
    let registry = &ctx.shared.processes;
    match registry.start(&ctx.sandbox.warren_id, spec).await {
        Ok(started) => {
            let keepalive = keepalive_interval(&call);
            call.stream(events(started.pid, started.events, keepalive, |event| {
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
    let connected = selector(request.process).and_then(|selector| {
        ctx.shared
            .processes
            .connect(&ctx.sandbox.warren_id, &selector)
            .map_err(process_error)
    });
    match connected {
        Ok((pid, subscription)) => {
            let keepalive = keepalive_interval(&call);
            call.stream(events(pid, subscription, keepalive, |event| {
                ConnectResponse { event: Some(event) }
            }))
        }
        Err(error) => call.error(error),
    }
}

/// `List`: the running processes, with the config they were started with.
async fn list(ctx: EnvdContext, _request: ListRequest) -> Result<ListResponse, ConnectError> {
    let processes = ctx
        .shared
        .processes
        .list(&ctx.sandbox.warren_id)
        .into_iter()
        .map(|info| ProcessInfo {
            config: Some(ProcessConfig {
                cmd: info.cmd,
                args: info.args,
                envs: info.envs.into_iter().collect(),
                cwd: info.cwd,
            }),
            pid: info.pid,
            tag: info.tag,
        })
        .collect();
    Ok(ListResponse { processes })
}

/// `SendInput`: bytes for a process's stdin or PTY, after any sent before.
async fn send_input(
    ctx: EnvdContext,
    request: SendInputRequest,
) -> Result<SendInputResponse, ConnectError> {
    let selector = selector(request.process)?;
    deliver(&ctx, &selector, request.input).await?;
    Ok(SendInputResponse {})
}

/// `StreamInput`: a client stream whose first message names the process and whose later
/// ones carry input (or keepalives), delivered in order as they arrive.
async fn stream_input(ctx: EnvdContext, mut call: Call) -> Response {
    let mut messages = Box::pin(call.messages::<StreamInputRequest>());
    let mut target: Option<Selector> = None;
    while let Some(message) = messages.next().await {
        let result = match message.map(|message| message.event) {
            Err(error) => Err(error),
            Ok(Some(stream_input_request::Event::Start(start))) => {
                selector(start.process).and_then(|selector| {
                    // envd resolves the process once, at the start.
                    ctx.shared
                        .processes
                        .connect(&ctx.sandbox.warren_id, &selector)
                        .map(|_| target = Some(selector))
                        .map_err(process_error)
                })
            }
            Ok(Some(stream_input_request::Event::Data(data))) => match &target {
                Some(selector) => deliver(&ctx, selector, data.input).await,
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

/// Hands one `ProcessInput` to the engine.
async fn deliver(
    ctx: &EnvdContext,
    selector: &Selector,
    input: Option<ProcessInput>,
) -> Result<(), ConnectError> {
    let input = match input.and_then(|input| input.input) {
        Some(process_input::Input::Stdin(bytes)) => Input::Stdin(bytes),
        Some(process_input::Input::Pty(bytes)) => Input::Pty(bytes),
        None => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "input must hold stdin or pty bytes",
            ))
        }
    };
    ctx.shared
        .processes
        .send_input(&ctx.sandbox.warren_id, selector, input)
        .await
        .map_err(process_error)
}

/// `SendSignal`: SIGKILL (the whole tree, at once) or SIGTERM (the process group).
async fn send_signal(
    ctx: EnvdContext,
    request: SendSignalRequest,
) -> Result<SendSignalResponse, ConnectError> {
    let selector = selector(request.process)?;
    let signal = match Signal::try_from(request.signal) {
        Ok(Signal::Sigkill) => crate::processes::Signal::Kill,
        Ok(Signal::Sigterm) => crate::processes::Signal::Term,
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
    ctx.shared
        .processes
        .signal(&ctx.sandbox.warren_id, &selector, signal)
        .await
        .map_err(process_error)?;
    Ok(SendSignalResponse {})
}

/// `CloseStdin`: the process reads an end of file once it read what was sent.
async fn close_stdin(
    ctx: EnvdContext,
    request: CloseStdinRequest,
) -> Result<CloseStdinResponse, ConnectError> {
    let selector = selector(request.process)?;
    ctx.shared
        .processes
        .close_stdin(&ctx.sandbox.warren_id, &selector)
        .await
        .map_err(process_error)?;
    Ok(CloseStdinResponse {})
}

/// `Update`: resizes a process's PTY (the only thing an update changes).
async fn update(ctx: EnvdContext, request: UpdateRequest) -> Result<UpdateResponse, ConnectError> {
    let selector = selector(request.process)?;
    let Some(size) = request.pty.and_then(|pty| pty.size) else {
        // Nothing to change; the process must still exist.
        ctx.shared
            .processes
            .connect(&ctx.sandbox.warren_id, &selector)
            .map_err(process_error)?;
        return Ok(UpdateResponse {});
    };
    ctx.shared
        .processes
        .resize(
            &ctx.sandbox.warren_id,
            &selector,
            PtySize {
                cols: size.cols,
                rows: size.rows,
            },
        )
        .await
        .map_err(process_error)?;
    Ok(UpdateResponse {})
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

/// The engine's selector for envd's.
fn selector(selector: Option<ProcessSelector>) -> Result<Selector, ConnectError> {
    match selector.and_then(|selector| selector.selector) {
        Some(process_selector::Selector::Pid(pid)) => Ok(Selector::Pid(pid)),
        Some(process_selector::Selector::Tag(tag)) => Ok(Selector::Tag(tag)),
        None => Err(ConnectError::new(
            Code::InvalidArgument,
            "the request must name a process by pid or tag",
        )),
    }
}

/// The keepalive interval the client asked for (`Keepalive-Ping-Interval`, seconds).
fn keepalive_interval(call: &Call) -> Duration {
    call.headers()
        .get(KEEPALIVE_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs).clamp(Duration::from_secs(1), MAX_KEEPALIVE))
        .unwrap_or(DEFAULT_KEEPALIVE)
}

/// A process's events as envd streams them: `start`, then `data` and `keepalive`, then
/// `end` (or `unavailable` when the sandbox ended), each wrapped by `wrap` into the
/// method's response message.
fn events<T, F>(
    pid: u32,
    subscription: Events,
    keepalive: Duration,
    wrap: F,
) -> impl Stream<Item = Result<T, ConnectError>> + Send + 'static
where
    T: Message,
    F: Fn(ProcessEvent) -> T + Send + Sync + 'static,
{
    let start = event(process_event::Event::Start(process_event::StartEvent {
        pid,
    }));
    let rest = futures::stream::unfold(Some((subscription, keepalive)), |state| async move {
        let (mut subscription, keepalive) = state?;
        let next = tokio::time::timeout(keepalive, subscription.next()).await;
        let item = match next {
                Err(_) => Ok(event(process_event::Event::Keepalive(
                    process_event::KeepAlive {},
                ))),
                Ok(None) => return None,
                Ok(Some(delivery)) => match delivery {
                    Delivery::Item(output) => Ok(data(output)),
                    Delivery::Lost(bytes) => Ok(data(Output::Stderr(
                        format!(
                            "\n[warren: {bytes} bytes of this command's output were dropped: this client read them too slowly]\n"
                        )
                        .into(),
                    ))),
                    Delivery::End(Ending::Exited(exit)) => Ok(end(exit)),
                    Delivery::End(Ending::SandboxEnded) => Err(ConnectError::new(
                        Code::Unavailable,
                        "the sandbox was killed or paused while the command ran",
                    )),
                },
            };
        let more = item.is_ok();
        Some((item, more.then_some((subscription, keepalive))))
    });
    let stream: Pin<Box<dyn Stream<Item = Result<ProcessEvent, ConnectError>> + Send>> =
        Box::pin(futures::stream::once(async move { Ok(start) }).chain(rest));
    stream.map(move |item| item.map(&wrap))
}

/// A `ProcessEvent` holding `event`.
fn event(event: process_event::Event) -> ProcessEvent {
    ProcessEvent { event: Some(event) }
}

/// A `data` event.
fn data(output: Output) -> ProcessEvent {
    use process_event::data_event::Output as Data;
    let output = match output {
        Output::Stdout(bytes) => Data::Stdout(bytes.to_vec()),
        Output::Stderr(bytes) => Data::Stderr(bytes.to_vec()),
        Output::Pty(bytes) => Data::Pty(bytes.to_vec()),
    };
    event(process_event::Event::Data(process_event::DataEvent {
        output: Some(output),
    }))
}

/// The `end` event.
fn end(exit: Exit) -> ProcessEvent {
    event(process_event::Event::End(process_event::EndEvent {
        exit_code: exit.exit_code,
        exited: exit.exited,
        status: exit.status,
        error: exit.error,
    }))
}

/// An engine failure as envd's Connect error.
fn process_error(error: ProcessError) -> ConnectError {
    let code = match &error {
        ProcessError::PidNotFound(_)
        | ProcessError::TagNotFound(_)
        | ProcessError::Ended { .. } => Code::NotFound,
        ProcessError::TooMany { .. } => Code::ResourceExhausted,
        ProcessError::StartFailed(_)
        | ProcessError::PtyUnavailable(_)
        | ProcessError::StdinDisabled { .. }
        | ProcessError::StdinClosed { .. }
        | ProcessError::PtyInputExpected { .. }
        | ProcessError::StdinInputExpected { .. }
        | ProcessError::NoPty { .. }
        | ProcessError::ClosePty { .. } => Code::FailedPrecondition,
        ProcessError::SandboxEnded => Code::Unavailable,
        ProcessError::KilledBeforeStart => Code::Aborted,
        ProcessError::Helper { .. } => Code::Internal,
        ProcessError::Provisioner(_) => {
            let ProcessError::Provisioner(error) = error else {
                unreachable!("matched above")
            };
            return E2bError::Provisioner(error).into_connect();
        }
    };
    ConnectError::new(code, error.to_string())
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
    fn selectors_and_errors_map_to_envds() {
        assert_eq!(
            selector(Some(ProcessSelector {
                selector: Some(process_selector::Selector::Pid(7))
            }))
            .expect("pid"),
            Selector::Pid(7)
        );
        assert_eq!(
            selector(None).expect_err("none").code,
            Code::InvalidArgument
        );
        // The SDKs' kill answers false on not_found.
        assert_eq!(
            process_error(ProcessError::PidNotFound(7)).code,
            Code::NotFound
        );
        assert_eq!(
            process_error(ProcessError::SandboxEnded).code,
            Code::Unavailable
        );
    }

    #[tokio::test]
    async fn a_stream_opens_with_start_keeps_alive_and_closes_with_end() {
        use crate::processes::Exit;
        // A fanout driven by hand stands in for a process.
        let fanout = crate::processes::test_fanout();
        let subscription = fanout.subscribe();
        let mut stream = Box::pin(events(42, subscription, Duration::from_millis(20), |e| {
            StartResponse { event: Some(e) }
        }));
        let first = stream.next().await.expect("start").expect("ok");
        assert_eq!(
            first.event.and_then(|e| e.event),
            Some(process_event::Event::Start(process_event::StartEvent {
                pid: 42
            }))
        );
        let idle = stream.next().await.expect("keepalive").expect("ok");
        assert!(matches!(
            idle.event.and_then(|e| e.event),
            Some(process_event::Event::Keepalive(_))
        ));
        fanout.push(Output::Stdout("hi".into()), 2);
        fanout.finish(Ending::Exited(Exit::from_outcome(
            &warren_backend::ExecOutcome {
                exit_code: Some(1),
                ..Default::default()
            },
        )));
        let mut saw_data = false;
        loop {
            let item = stream.next().await.expect("more").expect("ok");
            match item.event.and_then(|e| e.event) {
                Some(process_event::Event::Data(data)) => {
                    assert_eq!(
                        data.output,
                        Some(process_event::data_event::Output::Stdout(b"hi".to_vec()))
                    );
                    saw_data = true;
                }
                Some(process_event::Event::End(end)) => {
                    assert_eq!(
                        (end.exit_code, end.exited, end.status.as_str()),
                        (1, true, "exit status 1")
                    );
                    assert_eq!(end.error.as_deref(), Some("exit status 1"));
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(saw_data);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_sandbox_that_ended_ends_the_stream_with_unavailable() {
        let fanout = crate::processes::test_fanout();
        let mut stream = Box::pin(events(1, fanout.subscribe(), Duration::from_secs(5), |e| {
            ConnectResponse { event: Some(e) }
        }));
        let _start = stream.next().await;
        fanout.finish(Ending::SandboxEnded);
        let error = stream.next().await.expect("an error").expect_err("error");
        assert_eq!(error.code, Code::Unavailable);
        assert!(stream.next().await.is_none());
    }
}
