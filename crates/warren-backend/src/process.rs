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

/// Sends [`ProcessSignal`]s to one running process. Cheap to clone; a request for a
/// process that already ended is dropped.
#[derive(Debug, Clone)]
pub struct ProcessControl {
    sender: tokio::sync::mpsc::Sender<ProcessSignal>,
}

impl ProcessControl {
    /// A control whose requests arrive on the returned receiver (the backend's side).
    pub fn channel() -> (Self, tokio::sync::mpsc::Receiver<ProcessSignal>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        (Self { sender }, receiver)
    }

    /// Asks for `request`; `false` when the process has ended (nobody listens any more).
    pub async fn send(&self, request: ProcessSignal) -> bool {
        self.sender.send(request).await.is_ok()
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
