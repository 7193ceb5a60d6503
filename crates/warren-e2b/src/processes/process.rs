//! One process: what it was started with, its events, and the task that owns its exec.
//!
//! The task is the only owner of the exec future: the command lives exactly as long as
//! the task keeps polling it. Dropping the future (a kill, a sandbox that ended, the
//! server shutting down and dropping the task) makes the provisioner kill the command's
//! whole process tree (I24), so nothing keeps running for nobody.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use warren_backend::{ExecOutcome, OutputChunk, OutputStream};
use warren_core::SandboxId;
use warren_provisioner::{ExecInput, ExecReport, ProvisionerError};

use super::fanout::{Fanout, Subscription, BACKLOG_BYTES};
use super::marker::{Marker, MarkerScanner};
use super::wrapper::{Mode, EXIT_NO_PTY};
use super::{Inner, ProcessError};

/// Chunks the exec may have in flight towards the task; the task only moves them to the
/// fanout, which never waits, so this stays nearly empty.
const SINK_CAPACITY: usize = 64;
/// How long output may still arrive after the exec answered (a masking relay flushing).
const DRAIN: Duration = Duration::from_secs(2);
/// Most stderr kept from before the marker, for the error a failed start answers.
const EARLY_STDERR: usize = 8 * 1024;

/// One chunk of a process's output, as envd's `DataEvent` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Output {
    /// Standard output.
    Stdout(Bytes),
    /// Standard error.
    Stderr(Bytes),
    /// A PTY's output (stdout and stderr alike).
    Pty(Bytes),
}

impl Output {
    /// Its size, for the fanout's backlog bound.
    fn len(&self) -> usize {
        match self {
            Self::Stdout(b) | Self::Stderr(b) | Self::Pty(b) => b.len(),
        }
    }
}

/// How a process ended, as envd's `EndEvent` says it (Go's `ProcessState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The exit status; -1 when a signal (or a failure) ended it.
    pub(crate) exit_code: i32,
    /// Whether it exited (rather than being killed by a signal).
    pub(crate) exited: bool,
    /// `exit status 1`, `signal: killed`.
    pub(crate) status: String,
    /// Set when it did not succeed: the same text as `status`, or what failed. The SDKs'
    /// `CommandExitException` carries it.
    pub(crate) error: Option<String>,
}

impl Exit {
    /// The end of a command that ran.
    pub(crate) fn from_outcome(outcome: &ExecOutcome) -> Self {
        match (outcome.exit_code, outcome.signal) {
            (Some(code), _) => {
                let status = format!("exit status {code}");
                Self {
                    exit_code: code,
                    exited: true,
                    error: (code != 0).then(|| status.clone()),
                    status,
                }
            }
            (None, Some(signal)) => Self::signalled(signal),
            (None, None) => Self::failed("the command ended without an exit status".into()),
        }
    }

    /// Killed by `signal`.
    pub(crate) fn signalled(signal: i32) -> Self {
        let status = format!("signal: {}", signal_name(signal));
        Self {
            exit_code: -1,
            exited: false,
            error: Some(status.clone()),
            status,
        }
    }

    /// Killed with SIGKILL (SendSignal, or the command's timeout).
    pub(crate) fn killed() -> Self {
        Self::signalled(9)
    }

    /// Lost: the exec failed under it (the runtime went away).
    pub(crate) fn failed(error: String) -> Self {
        Self {
            exit_code: -1,
            exited: false,
            status: "error".into(),
            error: Some(error),
        }
    }
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

/// The last thing a process's stream says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The process ended: envd's `end` event.
    Exited(Exit),
    /// The sandbox was killed or paused: the stream ends as a dropped connection would,
    /// with no `end` event (see `ProcessRegistry::end_sandbox`).
    SandboxEnded,
}

/// A subscriber's view of a process's events.
pub(crate) type Events = Subscription<Output, Ending>;

/// Why a process is stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SendSignal SIGKILL.
    Kill,
    /// The sandbox ended.
    SandboxEnded,
}

/// What a process was started with, as `List` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// The program.
    pub(crate) cmd: String,
    /// Its arguments.
    pub(crate) args: Vec<String>,
    /// The request's environment (not the sandbox's).
    pub(crate) envs: BTreeMap<String, String>,
    /// The request's working directory, as given.
    pub(crate) cwd: Option<String>,
}

/// One process of a sandbox.
pub(crate) struct Process {
    /// Its number in the registry (pids are the runtime's and may repeat across runtimes).
    pub(crate) serial: u64,
    /// What it was started with.
    pub(crate) config: Config,
    /// Its tag, for selectors.
    pub(crate) tag: Option<String>,
    /// How its stdin and output are wired.
    pub(crate) mode: Mode,
    /// Names its private directory and marker; hex digits only.
    pub(crate) nonce: String,
    /// Who asked, for the run records of its helpers (I22).
    pub(crate) requested_by: String,
    /// What the wrapper's marker said, once it did.
    marker: OnceLock<Marker>,
    /// Its events.
    fanout: Arc<Fanout<Output, Ending>>,
    /// Serialises input (so it stays in order) and remembers whether stdin was closed.
    pub(crate) input: tokio::sync::Mutex<bool>,
    /// Stops the task; taken by the first stop.
    stop: Mutex<Option<oneshot::Sender<Stop>>>,
    /// The task, awaited when the sandbox ends.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Process {
    /// A process not started yet, with the receiver its task stops on.
    pub(crate) fn new(
        serial: u64,
        config: Config,
        tag: Option<String>,
        mode: Mode,
        requested_by: String,
    ) -> (Arc<Self>, oneshot::Receiver<Stop>) {
        let (stop, stopped) = oneshot::channel();
        let nonce = format!("{:016x}{:08x}", rand::random::<u64>(), serial as u32);
        let process = Arc::new(Self {
            serial,
            config,
            tag,
            mode,
            nonce,
            requested_by,
            marker: OnceLock::new(),
            fanout: Fanout::new(BACKLOG_BYTES),
            input: tokio::sync::Mutex::new(false),
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(None),
        });
        (process, stopped)
    }

    /// Records what the marker said, as the task does when it reads it.
    #[cfg(test)]
    pub(crate) fn mark(&self, marker: Marker) {
        let _ = self.marker.set(marker);
    }

    /// Ends its stream, as the task does.
    #[cfg(test)]
    pub(crate) fn finish(&self, ending: Ending) {
        self.fanout.finish(ending);
    }

    /// Its pid, once the wrapper reported it.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.marker.get().map(|marker| marker.pid)
    }

    /// The keeper holding its FIFO open, if it has one.
    pub(crate) fn keeper(&self) -> Option<u32> {
        self.marker.get().and_then(|marker| marker.keeper)
    }

    /// A new subscriber of its events (from now on).
    pub(crate) fn subscribe(&self) -> Events {
        self.fanout.subscribe()
    }

    /// Whether it ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.fanout.is_finished()
    }

    /// Asks the task to stop; false when it was already asked (or ended).
    pub(crate) fn stop(&self, why: Stop) -> bool {
        let sender = lock(&self.stop).take();
        sender.is_some_and(|sender| sender.send(why).is_ok())
    }

    /// Keeps the task's handle.
    pub(crate) fn set_task(&self, task: JoinHandle<()>) {
        *lock(&self.task) = Some(task);
    }

    /// Takes the task's handle.
    pub(crate) fn take_task(&self) -> Option<JoinHandle<()>> {
        lock(&self.task).take()
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// How the task's loop ended.
enum Finish {
    /// The exec answered (or failed).
    Exec(Result<ExecReport, ProvisionerError>),
    /// Stopped from outside.
    Stopped(Stop),
    /// The wrapper's stdout was not what it prints.
    Broken(String),
}

/// The task of one process: runs its exec, strips the marker, fans its output out,
/// registers its pid, and ends its stream. `started` answers the Start call: the pid, or
/// why the command never ran.
pub(crate) async fn run(
    inner: Arc<Inner>,
    sandbox: SandboxId,
    process: Arc<Process>,
    input: ExecInput,
    started: oneshot::Sender<Result<u32, ProcessError>>,
    mut stopped: oneshot::Receiver<Stop>,
) {
    let (sink, mut chunks) = mpsc::channel::<OutputChunk>(SINK_CAPACITY);
    let provisioner = inner.provisioner.clone();
    let sandbox_id = sandbox.clone();
    // Boxed so it can be dropped, killing the command (I24), before the task ends.
    let mut exec = Box::pin(async move { provisioner.exec(&sandbox, input, Some(sink)).await });
    let mut started = Some(started);
    let mut scanner = Some(MarkerScanner::new(&process.nonce));
    let mut early_stderr = Vec::new();
    let mut report = None;
    let mut closed = false;
    let mut drain_until = None;
    let pty = matches!(process.mode, Mode::Pty { .. });
    let finish = loop {
        if closed {
            if let Some(report) = report.take() {
                break Finish::Exec(report);
            }
        }
        tokio::select! {
            biased;
            why = &mut stopped => break Finish::Stopped(why.unwrap_or(Stop::Kill)),
            chunk = chunks.recv(), if !closed => {
                let Some(chunk) = chunk else {
                    closed = true;
                    continue;
                };
                let bytes = match (chunk.stream, scanner.as_mut()) {
                    (OutputStream::Stdout, Some(scan)) => match scan.feed(&chunk.bytes) {
                        Ok(None) => continue,
                        Ok(Some((marker, rest))) => {
                            scanner = None;
                            let pid = marker.pid;
                            let _ = process.marker.set(marker);
                            if let Some(started) = started.take() {
                                let _ = started.send(Ok(pid));
                            }
                            if !early_stderr.is_empty() {
                                let early = Bytes::from(std::mem::take(&mut early_stderr));
                                push(&process, if pty { Output::Pty(early) } else { Output::Stderr(early) });
                            }
                            rest
                        }
                        Err(error) => break Finish::Broken(error.to_string()),
                    },
                    (OutputStream::Stderr, Some(_)) => {
                        let room = EARLY_STDERR.saturating_sub(early_stderr.len());
                        early_stderr.extend_from_slice(&chunk.bytes[..chunk.bytes.len().min(room)]);
                        continue;
                    }
                    (_, None) => chunk.bytes,
                };
                if bytes.is_empty() {
                    continue;
                }
                let bytes = Bytes::from(bytes);
                push(&process, match (pty, chunk.stream) {
                    (true, _) => Output::Pty(bytes),
                    (false, OutputStream::Stdout) => Output::Stdout(bytes),
                    (false, OutputStream::Stderr) => Output::Stderr(bytes),
                });
            }
            result = &mut exec, if report.is_none() && drain_until.is_none() => {
                report = Some(result);
                drain_until = Some(Instant::now() + DRAIN);
            }
            () = tokio::time::sleep_until(drain_until.unwrap_or_else(Instant::now)), if drain_until.is_some() && !closed => {
                // A sender outlived the exec: what it still holds is not waited for.
                closed = true;
            }
        }
    };
    // Whatever happened, the command must not outlive this point unowned (I24).
    drop(exec);
    let marked = started.is_none();
    let ending = match finish {
        Finish::Exec(Ok(report)) if marked => Ending::Exited(Exit::from_outcome(&report.outcome)),
        Finish::Exec(Ok(report)) => {
            let stderr = String::from_utf8_lossy(&early_stderr).trim().to_owned();
            let why = if stderr.is_empty() {
                Exit::from_outcome(&report.outcome).status
            } else {
                stderr
            };
            let error =
                if report.outcome.exit_code == Some(EXIT_NO_PTY) && process.mode != Mode::Plain {
                    ProcessError::PtyUnavailable(why)
                } else {
                    ProcessError::StartFailed(why)
                };
            answer(&mut started, Err(error));
            Ending::Exited(Exit::failed("the command could not be started".into()))
        }
        Finish::Exec(Err(error)) if marked => Ending::Exited(Exit::failed(error.public_message())),
        Finish::Exec(Err(error)) => {
            answer(&mut started, Err(ProcessError::Provisioner(error)));
            Ending::Exited(Exit::failed("the command could not be started".into()))
        }
        Finish::Broken(why) => {
            answer(&mut started, Err(ProcessError::StartFailed(why.clone())));
            Ending::Exited(Exit::failed(why))
        }
        Finish::Stopped(Stop::Kill) => {
            answer(&mut started, Err(ProcessError::KilledBeforeStart));
            if marked && process.mode.has_fifo() {
                // The wrapper died without its cleanup; the runtime is up (it just ran it).
                inner.spawn_cleanup(sandbox_id, process.clone());
            }
            Ending::Exited(Exit::killed())
        }
        Finish::Stopped(Stop::SandboxEnded) => {
            answer(&mut started, Err(ProcessError::SandboxEnded));
            Ending::SandboxEnded
        }
    };
    // Gone from List before its stream says it ended, as envd does.
    inner.forget(&process);
    process.fanout.finish(ending);
}

/// Answers the Start call if it was not answered yet.
fn answer(
    started: &mut Option<oneshot::Sender<Result<u32, ProcessError>>>,
    result: Result<u32, ProcessError>,
) {
    if let Some(started) = started.take() {
        let _ = started.send(result);
    }
}

/// Hands one chunk to every subscriber.
fn push(process: &Process, output: Output) {
    let weight = output.len();
    process.fanout.push(output, weight);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_read_as_envds() {
        let ok = Exit::from_outcome(&ExecOutcome {
            exit_code: Some(0),
            ..ExecOutcome::default()
        });
        assert_eq!(
            ok,
            Exit {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None
            }
        );
        let failed = Exit::from_outcome(&ExecOutcome {
            exit_code: Some(1),
            ..ExecOutcome::default()
        });
        assert_eq!(failed.error.as_deref(), Some("exit status 1"));
        let killed = Exit::from_outcome(&ExecOutcome {
            signal: Some(9),
            ..ExecOutcome::default()
        });
        assert_eq!(killed, Exit::killed());
        assert_eq!(
            (killed.exit_code, killed.exited, killed.status.as_str()),
            (-1, false, "signal: killed")
        );
        assert_eq!(Exit::signalled(15).status, "signal: terminated");
        assert_eq!(Exit::signalled(40).status, "signal: signal 40");
    }
}
