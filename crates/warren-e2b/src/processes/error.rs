//! What the process engine refuses or fails at.

use warren_provisioner::ProvisionerError;

/// A failed or refused process operation.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcessError {
    /// No running process has this pid.
    #[error("process with pid {0} not found")]
    PidNotFound(u32),
    /// No running process has this tag.
    #[error("process with tag {0:?} not found")]
    TagNotFound(String),
    /// The sandbox runs as many envd processes as it may.
    #[error("this sandbox already runs {limit} commands started through envd (the most it may): wait for one to end or kill one")]
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// The command could not be started (the wrapper failed before the command ran).
    #[error("the command could not be started: {0}")]
    StartFailed(String),
    /// The sandbox image cannot give a command a pseudo-terminal.
    #[error("a PTY needs util-linux script(1) in the sandbox image: {0}")]
    PtyUnavailable(String),
    /// Input for a process started without stdin.
    #[error("process {pid} was started without stdin: start it with stdin enabled (`stdin=True`) to send it input")]
    StdinDisabled {
        /// The process.
        pid: u32,
    },
    /// Input after stdin was closed.
    #[error("stdin of process {pid} was closed")]
    StdinClosed {
        /// The process.
        pid: u32,
    },
    /// `stdin` input for a PTY.
    #[error("process {pid} has a PTY: send its input as `pty`, not `stdin`")]
    PtyInputExpected {
        /// The process.
        pid: u32,
    },
    /// `pty` input for a process without a PTY.
    #[error("process {pid} has no PTY: send its input as `stdin`, not `pty`")]
    StdinInputExpected {
        /// The process.
        pid: u32,
    },
    /// A PTY operation on a process without a PTY.
    #[error("process {pid} has no PTY")]
    NoPty {
        /// The process.
        pid: u32,
    },
    /// CloseStdin on a PTY.
    #[error("process {pid} has a PTY, whose input cannot be closed: send Ctrl-D (0x04) instead")]
    ClosePty {
        /// The process.
        pid: u32,
    },
    /// The process ended while the operation was on its way.
    #[error("process {pid} ended")]
    Ended {
        /// The process.
        pid: u32,
    },
    /// The sandbox was killed or paused: its processes ended with it.
    #[error("the sandbox was killed or paused, and its commands with it")]
    SandboxEnded,
    /// The process was killed before it started.
    #[error("the command was killed before it started")]
    KilledBeforeStart,
    /// A helper command (input, signal, resize) failed.
    #[error("{what} failed: {detail}")]
    Helper {
        /// What the helper was for.
        what: &'static str,
        /// Why it failed.
        detail: String,
    },
    /// The provisioner refused or failed (bad cwd or environment, sandbox gone, ...).
    #[error(transparent)]
    Provisioner(#[from] ProvisionerError),
}
