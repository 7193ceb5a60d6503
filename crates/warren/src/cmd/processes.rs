//! Processes from the command line: `warren exec -it` (a terminal both ways), `warren ps`,
//! `warren attach`, `warren runs`. All of it is the server's processes API; the terminal is
//! its WebSocket.

use std::io::Write;
use std::os::fd::AsFd;
use std::process::ExitCode;

use base64::Engine;
use clap::Args;
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use warren_client::{RunsOf, WarrenClient};
use warren_protocol::{ProcessEvent, ProcessInfo, StartProcess, TerminalSize};

use super::client::{report, Connection};

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Sandbox id.
    id: String,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Sandbox id.
    id: String,
    /// The process's pid (see `warren ps`).
    pid: i32,
    /// Output offset to start from (default 0: everything still kept).
    #[arg(long, default_value_t = 0)]
    from: u64,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// The runs of this sandbox.
    #[arg(long, conflicts_with = "uid", required_unless_present = "uid")]
    sandbox: Option<String>,
    /// The runs of every sandbox of this uid.
    #[arg(long)]
    uid: Option<String>,
    /// Only runs in this state: running, finished or failed.
    #[arg(long)]
    status: Option<String>,
    /// Most runs to show (newest first).
    #[arg(long, default_value_t = 20)]
    limit: u32,
    #[command(flatten)]
    connection: Connection,
}

/// `warren ps`: the sandbox's processes.
pub async fn ps(args: PsArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match client.list_processes(&args.id).await {
        Ok(list) => {
            let mut out = String::from("PID\tSTATUS\tTAG\tSTARTED\tCOMMAND\n");
            for p in &list.processes {
                out.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    p.pid,
                    status(p),
                    p.tag.as_deref().unwrap_or("-"),
                    p.started_at,
                    p.command
                ));
            }
            super::output::bytes(out.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => report(e),
    }
}

/// `warren runs`: run records, newest first.
pub async fn runs(args: RunsArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let scope = match (&args.sandbox, &args.uid) {
        (Some(id), _) => RunsOf::Sandbox(id),
        (None, Some(uid)) => RunsOf::Uid(uid),
        (None, None) => unreachable!("clap requires one"),
    };
    match client
        .list_runs(scope, args.status.as_deref(), Some(args.limit), None)
        .await
    {
        Ok(list) => {
            let mut out = String::from("RUN\tKIND\tSTATUS\tEXIT\tSTARTED\tCOMMAND\n");
            for run in &list.runs {
                let exit = match (run.exit_code, run.signal) {
                    (Some(code), _) => code.to_string(),
                    (None, Some(signal)) => format!("signal {signal}"),
                    (None, None) => "-".into(),
                };
                out.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\n",
                    run.id,
                    serde_json::to_value(run.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    serde_json::to_value(run.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    exit,
                    run.started_at,
                    run.command
                ));
            }
            super::output::bytes(out.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => report(e),
    }
}

/// `warren attach`: the process's terminal here, until it ends or stdin does (detaching:
/// the process runs on).
pub async fn attach(args: AttachArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match terminal(&client, &args.id, args.pid, args.from, false).await {
        Ok(code) => Ok(code),
        Err(e) => report(e),
    }
}

/// `warren exec -i` / `-it`: starts the command as a process (on a terminal with `-t`)
/// and attaches to it; the exit code is the process's (128 + signal when killed).
pub async fn exec_interactive(
    client: WarrenClient,
    id: &str,
    mut request: StartProcess,
    tty: bool,
) -> anyhow::Result<ExitCode> {
    request.stdin = true;
    if tty {
        let (cols, rows) = local_size().unwrap_or((80, 24));
        request.pty = Some(TerminalSize { cols, rows });
    }
    let process = match client.start_process(id, &request).await {
        Ok(process) => process,
        Err(e) => return report(e),
    };
    let code = terminal(&client, id, process.pid, 0, tty).await;
    match code {
        Ok(code) => Ok(code),
        Err(e) => {
            // The terminal is gone before the process ended: nothing runs on for nobody.
            let _ = client.kill_process(id, process.pid).await;
            report(e)
        }
    }
}

/// The size of this process's terminal, when stdout is one.
fn local_size() -> Option<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout().as_fd()).ok()?;
    (size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}

/// Puts this terminal in raw mode (keys pass through as typed, Ctrl-C included) and
/// restores it when dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter(wanted: bool) -> Self {
        let stdin = std::io::stdin();
        if !wanted || !rustix::termios::isatty(stdin.as_fd()) {
            return Self(None);
        }
        let Ok(saved) = rustix::termios::tcgetattr(stdin.as_fd()) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let set =
            rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw);
        Self(set.ok().map(|()| saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin().as_fd(),
                rustix::termios::OptionalActions::Now,
                saved,
            );
        }
    }
}

/// Relays this terminal and the process's until its output ended; its exit code.
async fn terminal(
    client: &WarrenClient,
    id: &str,
    pid: i32,
    from: u64,
    tty: bool,
) -> Result<ExitCode, warren_client::ClientError> {
    let socket = client.attach(id, pid, from).await?;
    let (mut to_server, mut from_server) = socket.split();
    let _raw = RawMode::enter(tty);
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 * 1024];
    let mut stdin_open = true;
    let mut resized = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .map_err(|e| warren_client::ClientError::Attach(e.to_string()))?;
    let gone = |e: tokio_tungstenite::tungstenite::Error| {
        warren_client::ClientError::Attach(e.to_string())
    };
    loop {
        tokio::select! {
            message = from_server.next() => {
                let Some(message) = message else {
                    return Ok(ExitCode::from(1));
                };
                match message.map_err(gone)? {
                    Message::Binary(bytes) => {
                        let mut out = std::io::stdout();
                        let _ = out.write_all(&bytes);
                        let _ = out.flush();
                    }
                    Message::Text(text) => match serde_json::from_str::<ProcessEvent>(&text) {
                        Ok(ProcessEvent::End { process }) => return Ok(exit_code(&process)),
                        Ok(ProcessEvent::Stderr { data, .. }) => {
                            let bytes = base64::engine::general_purpose::STANDARD
                                .decode(data)
                                .unwrap_or_default();
                            let _ = std::io::stderr().write_all(&bytes);
                        }
                        Ok(ProcessEvent::Lost { from, to }) => {
                            eprintln!("\r\nwarren: {} bytes of output were dropped before they could be shown\r", to - from);
                        }
                        Ok(ProcessEvent::Error { error }) => {
                            eprintln!("\r\nwarren: {} ({})\r", error.message, error.code);
                        }
                        _ => {}
                    },
                    Message::Close(_) => return Ok(ExitCode::from(1)),
                    _ => {}
                }
            }
            read = stdin.read(&mut buffer), if stdin_open => {
                match read {
                    Ok(0) | Err(_) => {
                        stdin_open = false;
                        let close = serde_json::json!({"type": "stdin_close"}).to_string();
                        to_server.send(Message::Text(close.into())).await.map_err(gone)?;
                    }
                    Ok(n) => {
                        to_server
                            .send(Message::Binary(buffer[..n].to_vec().into()))
                            .await
                            .map_err(gone)?;
                    }
                }
            }
            _ = resized.recv(), if tty => {
                if let Some((cols, rows)) = local_size() {
                    let resize = serde_json::json!({"type": "resize", "cols": cols, "rows": rows}).to_string();
                    to_server.send(Message::Text(resize.into())).await.map_err(gone)?;
                }
            }
        }
    }
}

/// The shell's convention: the process's own status, or 128 + the signal that ended it.
fn exit_code(process: &ProcessInfo) -> ExitCode {
    let code = match (process.exit_code, process.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn status(process: &ProcessInfo) -> String {
    match (process.status.as_str(), process.exit_code, process.signal) {
        ("exited", Some(code), _) => format!("exited({code})"),
        ("exited", None, Some(signal)) => format!("killed({signal})"),
        (other, _, _) => other.to_owned(),
    }
}
