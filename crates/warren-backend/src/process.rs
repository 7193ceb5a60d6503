//! A long-running process in a runtime, as a backend hands it to the provisioner: its
//! stdin and output as byte streams, its control (signal, resize, kill) and its end.
//!
//! The handle owns the process's connection to the runtime: dropping every part of it
//! (the controls and the exit) ends that connection, and the runtime kills the process's
//! whole tree (I24). Nothing keeps running for nobody.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::{BackendError, ResourceUsage};

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TerminalSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

impl TerminalSize {
    /// The size a terminal gets when none is asked for.
    pub const DEFAULT: Self = Self { cols: 80, rows: 24 };
}

/// One process to start in a runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRequest {
    /// The program and its arguments; `["/bin/sh", "-c", "<command>"]` for a shell line.
    pub argv: Vec<String>,
    /// Working directory inside the runtime, an absolute in-runtime path.
    pub cwd: String,
    /// Per-process environment, added over the runtime's.
    pub env: BTreeMap<String, String>,
    /// Run it on a terminal of this size: stdin, stdout and stderr are the terminal, and
    /// output comes as one stream ([`ProcessHandle::stderr`] is `None`).
    pub pty: Option<TerminalSize>,
}

/// What can be asked of a running process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessSignal {
    /// Send a signal to the process, or to its process group.
    Signal {
        /// The signal number.
        signal: i32,
        /// The whole process group rather than the process alone.
        group: bool,
    },
    /// Set its terminal's size (the foreground process group gets `SIGWINCH`).
    Resize(TerminalSize),
    /// Kill its whole tree, background processes included (I24).
    Kill,
    /// Kill what in its tree began after `instant`, sparing the process itself and what
    /// it started earlier: one command of a long-lived shell, the shell and its earlier
    /// jobs staying. Processes that left the tree (a double fork, `setsid`) are still in
    /// it: the runtime holds them by cgroup or subreaper, never by parentage alone.
    KillStartedAfter(RuntimeInstant),
}

/// A moment of a runtime's own clock, as a process inside it reads it: enough to tell
/// the processes started after it from those started before, even within one clock tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeInstant {
    /// The runtime's `/proc/uptime`, in hundredths of a second.
    pub uptime_centis: u64,
    /// The last pid the runtime had handed out (`/proc/loadavg`'s last field), when it
    /// tells; a process started within the same tick with a higher pid came later.
    pub last_pid: Option<i32>,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessExit {
    /// Exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Resources it used, where the backend can measure them (I22).
    pub usage: ResourceUsage,
}

/// Bytes for a process's stdin; dropping it closes stdin (the process reads EOF). Writes
/// wait while the process does not read (backpressure).
pub type ProcessInput = Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// A process's output as it comes; it ends when every holder of the stream's write end
/// (the process and whatever it left running in the background) has closed it.
pub type ProcessOutput = Pin<Box<dyn crate::OutputReader>>;

/// The end of a process: how it ended, or why the backend could not tell (the runtime
/// went away under it).
pub type ProcessWait = Pin<Box<dyn Future<Output = Result<ProcessExit, BackendError>> + Send>>;

/// How long [`ProcessControl::apply`] waits for the runtime to say a request was applied
/// before it takes it as sent: an agent of an older warren (a runtime adopted across an
/// upgrade) acknowledges nothing.
pub const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// One request to a running process, and, when its sender waits for it, how the backend
/// tells that the runtime applied it (the sender is dropped if it never will).
#[derive(Debug)]
pub struct Control {
    /// What is asked.
    pub signal: ProcessSignal,
    /// Answered once the runtime applied it.
    pub applied: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Sends [`ProcessSignal`]s to one running process. Cheap to clone; a request for a
/// process that already ended is dropped.
#[derive(Debug, Clone)]
pub struct ProcessControl {
    sender: tokio::sync::mpsc::Sender<Control>,
}

impl ProcessControl {
    /// A control whose requests arrive on the returned receiver (the backend's side).
    pub fn channel() -> (Self, tokio::sync::mpsc::Receiver<Control>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        (Self { sender }, receiver)
    }

    /// Asks for `request` without waiting for it; `false` when the process has ended
    /// (nobody listens any more).
    pub async fn send(&self, request: ProcessSignal) -> bool {
        self.sender
            .send(Control {
                signal: request,
                applied: None,
            })
            .await
            .is_ok()
    }

    /// Asks for `request` and returns once the runtime applied it, so what the caller
    /// does next (input after a resize, a read after a signal) comes after it; `false`
    /// when the process has ended. Waits at most [`APPLY_WAIT`] for an acknowledgement.
    pub async fn apply(&self, request: ProcessSignal) -> bool {
        let (applied, answered) = tokio::sync::oneshot::channel();
        let control = Control {
            signal: request,
            applied: Some(applied),
        };
        if self.sender.send(control).await.is_err() {
            return false;
        }
        match tokio::time::timeout(APPLY_WAIT, answered).await {
            Ok(answer) => answer.is_ok(),
            Err(_) => true,
        }
    }
}

/// A started process.
pub struct ProcessHandle {
    /// Its pid inside the runtime.
    pub pid: i32,
    /// Its stdin.
    pub stdin: ProcessInput,
    /// Its stdout (on a terminal: everything the terminal shows).
    pub stdout: ProcessOutput,
    /// Its stderr; `None` on a terminal.
    pub stderr: Option<ProcessOutput>,
    /// Signals, resizes and kills.
    pub control: ProcessControl,
    /// How it ends.
    pub exit: ProcessWait,
}

impl std::fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle")
            .field("pid", &self.pid)
            .field("pty", &self.stderr.is_none())
            .finish_non_exhaustive()
    }
}

/// What starting a process came to.
#[derive(Debug)]
pub enum ProcessStart {
    /// It runs.
    Started(ProcessHandle),
    /// The runtime could not start it: `stage` is the step that failed (`cwd`, `exec`,
    /// `credentials`, ...), `errno` why.
    Failed {
        /// The step.
        stage: String,
        /// The error number.
        errno: i32,
    },
}

impl ProcessStart {
    /// Why a process could not be started, in words a caller can act on (the program
    /// named by `argv[0]`, the working directory `cwd`).
    pub fn failure_message(stage: &str, errno: i32, program: &str, cwd: &str) -> String {
        let reason = std::io::Error::from_raw_os_error(errno);
        match stage {
            "exec" => format!("cannot run {program:?}: {reason}"),
            "cwd" => format!("cannot enter {cwd}: {reason}"),
            other => format!("process setup failed at {other}: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALLER: ProcessSignal = ProcessSignal::Resize(TerminalSize { cols: 50, rows: 10 });

    #[tokio::test]
    async fn apply_returns_only_once_the_runtime_applied_the_request() {
        let (control, mut requests) = ProcessControl::channel();
        let (go, applied_now) = tokio::sync::oneshot::channel::<()>();
        let backend = tokio::spawn(async move {
            let request = requests.recv().await.unwrap();
            assert_eq!(request.signal, SMALLER);
            applied_now.await.unwrap();
            request.applied.unwrap().send(()).unwrap();
            requests
        });
        let applying = tokio::spawn({
            let control = control.clone();
            async move { control.apply(SMALLER).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!applying.is_finished(), "it waits for the runtime");
        go.send(()).unwrap();
        assert!(applying.await.unwrap());

        // A process that ended drops the request unanswered: nothing was applied.
        let mut requests = backend.await.unwrap();
        let ending = tokio::spawn(async move { drop(requests.recv().await) });
        assert!(!control.apply(SMALLER).await);
        ending.await.unwrap();
        // Nobody listens any more: refused at once.
        assert!(!control.apply(SMALLER).await);
        assert!(!control.send(ProcessSignal::Kill).await);
    }
}
