//! Persistent shell sessions in a sandbox's runtime, for clients that keep one shell across
//! calls: the AIO sandbox API's `/v1/shell` and `/v1/bash` (issue 16).
//!
//! A session is one real shell process of the runtime, so `$$`, the working directory,
//! variables (exported or not) and functions carry over from one command to the next, and
//! no two sessions ever share a shell (DeerFlow's issue #1433 was shared-shell corruption).
//! It is one long-running process of the backend
//! ([`warren_backend::Backend::start_process`]), so it works
//! unchanged on every backend, and no helper command ever runs beside it:
//!
//! - **The shell** is `/bin/sh -c BOOTSTRAP` with its stdin kept open: the bootstrap keeps
//!   stdout and stderr on fds 8 and 9 and becomes `bash --noprofile --norc -s` (or `sh -s`
//!   without bash), reading its script from that stdin. Every command runs with stdin
//!   `/dev/null` (a redirection of the `eval` that runs it, undone after it even when the
//!   command ran `exec </dev/null`), so a command that reads stdin never takes a later
//!   command's text.
//! - **A command** is written to the shell's stdin, wrapped: the wrapper runs it with `eval`
//!   (stdin `/dev/null`, fds 8 and 9 closed for it, so nothing it starts can read the
//!   script or write the markers), then prints an end marker on fd 8 (and 9) carrying a per-command random
//!   nonce, `$?` and `$PWD`; a begin marker before it carries the runtime's clock and the
//!   last pid it handed out. Only what lies between the two markers is the command's
//!   output: no echo, no prompt, no marker. The nonce never appears whole in the wrapper
//!   text, so `set -x` or `set -v` cannot forge it. Commands are serialised per session.
//! - **Stopping a command** (`hard_timeout`, kill) asks the runtime to kill what in the
//!   shell's tree began after the command's begin marker
//!   ([`ProcessSignal::KillStartedAfter`]): the runtime's one killer, by cgroup leaf or
//!   subreaper, so a double fork or `setsid` does not escape; the shell and the jobs of
//!   earlier commands stay. A command the shell runs itself (a `while :; do :; done` loop)
//!   leaves nothing to kill: after [`KILL_GRACE`] the whole session is ended instead.
//! - **Closing** a session kills the shell's whole tree (I24); a terminated or reaped
//!   sandbox ends its sessions with its runtime.
//!
//! Every command gets a run record like a native exec (I22), its output is masked for the
//! sandbox's secrets (I13), and a running command counts as activity for the reaper and
//! the termination grace. An idle session holds no command: after the idle timeout without
//! use it is closed, so an open session never keeps a runtime alive by itself.

mod drive;
mod registry;
mod scan;
mod script;
mod session;
#[cfg(test)]
mod tests;

pub(crate) use registry::Registry;
use scan::*;
use script::*;
use session::*;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use warren_backend::{
    BackendError, OutputChunk, OutputStream, ProcessControl, ProcessExit, ProcessInput,
    ProcessRequest, ProcessSignal, ProcessStart, RuntimeInstant,
};
use warren_core::{MaskingStream, SandboxId, SecretMasker};
use warren_store::{NewRun, RunKind, RunOutcome, SandboxRecord};

use crate::env::CommandEnv;
use crate::processes::OUTPUT_GRACE;
use crate::{FencePermit, InflightHold, Provisioner, ProvisionerError};

/// Most live sessions one sandbox may hold at once (each is a shell process and up to two
/// output buffers of `output_cap` bytes).
pub const MAX_SHELL_SESSIONS: usize = 32;
/// Most live sessions made for commands that named none (each such call makes one, and
/// its client may never use it again): beyond it the least recently used idle one goes.
pub const MAX_IMPLICIT_SHELL_SESSIONS: usize = 8;
/// How long a synchronous command may go without new output before its caller gets
/// `no_change_timeout` (the command keeps running), unless the session or call sets it.
pub const DEFAULT_NO_CHANGE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest session id, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 128;
/// Longest command text, in bytes.
pub const MAX_SHELL_COMMAND_BYTES: usize = 1 << 20;

/// How long a stopped command may take to report its end before its session is ended.
const KILL_GRACE: Duration = Duration::from_secs(3);
/// How often a stopped command that has not ended is swept again within [`KILL_GRACE`].
const KILL_AGAIN: Duration = Duration::from_millis(200);
/// How long a stopped command may take to report its begin (the shell reads its text a
/// byte at a time: slow under gVisor's ptrace platform on a busy host) before its session
/// is ended.
const BEGIN_GRACE: Duration = Duration::from_secs(10);
/// How long handing a command to its shell may take (the shell waits for it: it reads
/// its script as fast as it parses).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new shell may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a closed session waits for its shell's tree to be gone.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long an ended session stays readable (view, wait) before it is forgotten.
const ENDED_KEPT: Duration = Duration::from_secs(600);
/// Longest marker trailer (`$?` and `$PWD`).
const MAX_TRAILER: usize = 16 * 1024;

/// The byte every marker starts with; rare in output, so the scan for markers is cheap.
const MARK: u8 = 0x1e;

/// Becomes the session's shell. `$1$2` is the session nonce (split, like every nonce, so
/// it is never whole in a script text), `$3` is `merged` (stderr into stdout) or `split`.
/// The shell reads its script from stdin (`-s`), so its messages name it (`bash: line 3:
/// foo: command not found`), and every command runs with stdin `/dev/null` (see `wrap`).
const BOOTSTRAP: &str = r#"if command -v bash >/dev/null 2>&1; then f=bash; else f=sh; fi
if [ "$3" = merged ]; then exec 2>&1; fi
exec 8>&1 9>&2
printf '\036R%s%s\037%s\0' "$1" "$2" "$f" >&8
if [ "$f" = bash ]; then exec bash --noprofile --norc -s; fi
if command -v sh >/dev/null 2>&1; then exec sh -s; fi
exec /bin/sh -s
"#;

/// Which API a session serves, which decides how its output is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionKind {
    /// `/v1/shell`: stdout and stderr merged, in the order written.
    Shell,
    /// `/v1/bash`: stdout and stderr kept apart.
    Bash,
}

/// What opens a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionRequest {
    /// The client's id for it; generated when absent.
    pub id: Option<String>,
    /// Its first working directory (an existing directory under the layout's mounts);
    /// default: the workdir.
    pub exec_dir: Option<String>,
    /// Its no-change timeout; default [`DEFAULT_NO_CHANGE_TIMEOUT`].
    pub no_change_timeout: Option<Duration>,
}

/// Whether a session can take a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    /// Its shell waits for a command.
    Ready,
    /// A command runs in it.
    Busy,
    /// Its shell has ended (closed, `exit`, the sandbox ended); it takes no more commands.
    Ended,
}

/// One session as a client may see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Its id.
    pub id: String,
    /// Which API it serves.
    pub kind: SessionKind,
    /// Where its shell is (`$PWD` after its latest command), in the runtime's terms.
    pub working_dir: String,
    /// When it was opened.
    pub created_at: DateTime<Utc>,
    /// When a command was last given to it.
    pub last_used_at: DateTime<Utc>,
    /// Whether it can take a command.
    pub status: SessionStatus,
    /// The command running in it.
    pub current_command: Option<String>,
    /// How many commands it was given.
    pub command_count: u64,
    /// Its no-change timeout.
    pub no_change_timeout: Duration,
}

/// How long a caller waits for a command it gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandWait {
    /// Not at all: the answer says `running` once the shell has the command.
    Async,
    /// Until the command ends, its output stops changing for the no-change timeout, or
    /// the given time passes (the answer then says `running`).
    Until(Option<Duration>),
}

/// One command for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellCommand {
    /// The shell text, run by the session's shell as typed.
    pub command: String,
    /// A directory to change to first (persistently, as `cd` would).
    pub exec_dir: Option<String>,
    /// Refuse a missing `exec_dir` (otherwise the command runs where the shell is).
    pub strict_exec_dir: bool,
    /// Variables for this command only; `None` unsets one for it.
    pub env: BTreeMap<String, Option<String>>,
    /// Kill the command's tree after this long (the shell stays).
    pub hard_timeout: Option<Duration>,
    /// The no-change timeout for this command, over the session's.
    pub no_change_timeout: Option<Duration>,
    /// How long the caller waits.
    pub wait: CommandWait,
    /// Who asked, for the run record (I22).
    pub requested_by: String,
}

impl ShellCommand {
    /// A command that is waited for, with every option at its default.
    pub fn new(command: impl Into<String>, requested_by: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            exec_dir: None,
            strict_exec_dir: false,
            env: BTreeMap::new(),
            hard_timeout: None,
            no_change_timeout: None,
            wait: CommandWait::Until(None),
            requested_by: requested_by.into(),
        }
    }
}

/// Where a command is, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandStatus {
    /// It runs.
    Running,
    /// It runs, and wrote nothing new for the no-change timeout (only a waiting caller
    /// sees this; the command goes on).
    NoChangeTimeout,
    /// It ended by itself.
    Completed,
    /// Its hard timeout killed it.
    HardTimeout,
    /// A kill request ended it.
    Killed,
    /// Its shell ended under it (`exit`, the session closed, the sandbox ended).
    Terminated,
}

/// A command's state and output as a client may see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandReport {
    /// The session that runs it.
    pub session_id: String,
    /// Its id; empty when the session has had no command yet.
    pub command_id: String,
    /// Its text as given.
    pub command: String,
    /// Where it is.
    pub status: CommandStatus,
    /// Its exit status, once it ended (and the shell's, when the shell ended under it).
    pub exit_code: Option<i32>,
    /// Its output: stdout and stderr in the order written for [`SessionKind::Shell`],
    /// stdout alone for [`SessionKind::Bash`]. Secrets masked (I13).
    pub stdout: String,
    /// Its stderr ([`SessionKind::Bash`] only).
    pub stderr: String,
    /// More than `output_cap` bytes were written to a stream: its middle was left out.
    pub truncated: bool,
    /// Its run record's id (I22).
    pub run_id: String,
    /// The session's shell has ended: it takes no more commands.
    pub session_ended: bool,
}

impl Provisioner {
    /// Opens a session in the sandbox's runtime, starting the runtime if needed (I12). An
    /// open session with the same id is returned as it is; an ended one is replaced.
    pub async fn open_shell_session(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        kind: SessionKind,
        request: SessionRequest,
    ) -> Result<SessionInfo, ProvisionerError> {
        let session = self.open_detached(sandbox, kind, request, false).await?;
        Ok(session.info())
    }

    /// [`Provisioner::open_session`] in a task of its own: a caller that goes away (an
    /// HTTP client timing out) never leaves a started shell outside the registry.
    async fn open_detached(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        kind: SessionKind,
        request: SessionRequest,
        implicit: bool,
    ) -> Result<Arc<Session>, ProvisionerError> {
        let (provisioner, sandbox) = (self.clone(), sandbox.clone());
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            provisioner
                .open_session(&sandbox, kind, request, implicit)
                .await
        }))
        .await
        .map_err(ProvisionerError::Interrupted)?
    }

    /// Runs a command in a session (`id`), or in a new session when `id` is `None`. The
    /// permit is let go once the shell has the command (see [`Provisioner::exec_fenced`]).
    pub async fn run_in_shell_session(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: Option<&str>,
        command: ShellCommand,
        permit: FencePermit,
    ) -> Result<CommandReport, ProvisionerError> {
        self.check_command(&command)?;
        let session = match id {
            Some(id) => self.shells.find(sandbox, kind, id)?,
            None => {
                let request = SessionRequest {
                    id: None,
                    exec_dir: None,
                    no_change_timeout: None,
                };
                self.open_detached(sandbox, kind, request, true).await?
            }
        };
        let wait = command.wait;
        // Handing the command over runs to its end whatever the caller does: a run record
        // opened and a command half written to the shell would otherwise be left behind.
        let provisioner = self.clone();
        let submitted = session.clone();
        let command_id = tokio::spawn(tracing::Instrument::in_current_span(async move {
            provisioner.submit(&submitted, command, permit).await
        }))
        .await
        .map_err(ProvisionerError::Interrupted)??;
        match (command_id, wait) {
            (Some(id), CommandWait::Until(limit)) => Ok(session.await_command(&id, limit).await),
            _ => Ok(session.latest_report(None)),
        }
    }

    /// The session's latest command: its state and output so far.
    pub fn view_shell_session(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
    ) -> Result<CommandReport, ProvisionerError> {
        let session = self.shells.find(sandbox, kind, id)?;
        Ok(session.latest_report(None))
    }

    /// Waits until the session's latest command ends, or `max` passes, and reports it.
    pub async fn wait_shell_session(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
        max: Duration,
    ) -> Result<CommandReport, ProvisionerError> {
        let session = self.shells.find(sandbox, kind, id)?;
        let deadline = tokio::time::Instant::now() + max;
        let mut changed = session.changed.subscribe();
        loop {
            {
                let state = session.lock();
                if !state.current.as_ref().is_some_and(Command::running) {
                    return Ok(session.report_of(&state, None));
                }
            }
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep_until(deadline) => return Ok(session.latest_report(None)),
            }
        }
    }

    /// Kills the session's running command's tree (its shell stays, unless the command
    /// was the shell's own work and would not stop) and reports the command.
    pub async fn kill_shell_command(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
    ) -> Result<CommandReport, ProvisionerError> {
        let session = self.shells.find(sandbox, kind, id)?;
        let running = session
            .lock()
            .current
            .as_ref()
            .filter(|command| command.running())
            .map(|command| command.id.clone());
        if let Some(command) = running {
            // In a task of its own: a kill left half done would leave processes frozen.
            let (provisioner, stopped) = (self.clone(), session.clone());
            tokio::spawn(async move {
                provisioner
                    .stop_command(&stopped, &command, Stop::Kill)
                    .await
            })
            .await
            .map_err(ProvisionerError::Interrupted)?;
        }
        Ok(session.latest_report(None))
    }

    /// Changes a session's no-change timeout; a caller waiting for a command of it now
    /// goes by the new value (DeerFlow's abort sets 1 s to get its waiter back).
    pub fn update_shell_session(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
        no_change_timeout: Option<Duration>,
    ) -> Result<SessionInfo, ProvisionerError> {
        let session = self.shells.find(sandbox, kind, id)?;
        if let Some(timeout) = no_change_timeout {
            let mut state = session.lock();
            state.no_change_timeout = timeout;
            if let Some(command) = state.current.as_mut() {
                command.no_change_override = None;
            }
            drop(state);
            session.notify();
        }
        Ok(session.info())
    }

    /// Closes a session: its shell and everything it started are killed (I24).
    pub async fn close_shell_session(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
    ) -> Result<(), ProvisionerError> {
        let session = self.shells.find(sandbox, kind, id)?;
        self.shells.forget(&session);
        session.close().await;
        Ok(())
    }

    /// Closes every session of `kind` in the sandbox; returns how many there were.
    pub async fn close_shell_sessions(&self, sandbox: &SandboxId, kind: SessionKind) -> usize {
        let sessions = self.shells.of(sandbox, kind);
        for session in &sessions {
            self.shells.forget(session);
        }
        futures::future::join_all(sessions.iter().map(|session| session.close())).await;
        sessions.len()
    }

    /// The sandbox's sessions of `kind`, oldest first; ended ones too, for a while.
    pub fn shell_sessions(&self, sandbox: &SandboxId, kind: SessionKind) -> Vec<SessionInfo> {
        self.shells
            .of(sandbox, kind)
            .iter()
            .map(|session| session.info())
            .collect()
    }

    fn check_command(&self, command: &ShellCommand) -> Result<(), ProvisionerError> {
        if command.command.len() > MAX_SHELL_COMMAND_BYTES {
            return Err(ProvisionerError::BadRequest("a command is at most 1 MiB"));
        }
        if command.command.contains('\0') {
            return Err(ProvisionerError::BadRequest(
                "a command must not contain a NUL byte",
            ));
        }
        self.refuse_token_in_command("command line", command.command.as_bytes())?;
        if let Some(dir) = &command.exec_dir {
            self.refuse_token_in_command("working directory", dir.as_bytes())?;
        }
        for (name, value) in &command.env {
            warren_core::check_env_name(name)?;
            if let Some(value) = value {
                warren_core::check_env_value(name, value)?;
                self.refuse_token_in_env(name, value)?;
            }
        }
        if command.hard_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ProvisionerError::BadRequest(
                "hard_timeout must be more than 0 seconds",
            ));
        }
        Ok(())
    }

    async fn open_session(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        kind: SessionKind,
        request: SessionRequest,
        implicit: bool,
    ) -> Result<Arc<Session>, ProvisionerError> {
        let id = match request.id {
            Some(id) => {
                check_session_id(&id)?;
                id
            }
            None => uuid::Uuid::new_v4().to_string(),
        };
        if let Some(dir) = &request.exec_dir {
            self.refuse_token_in_command("working directory", dir.as_bytes())?;
        }
        // One opening at a time per sandbox: two creates of one id start one shell.
        let lock = self.shells.open_lock(sandbox);
        let _opening = lock.lock().await;
        if let Some(existing) = self.shells.get(sandbox, kind, &id) {
            if !existing.ended() {
                return Ok(existing);
            }
            self.shells.forget(&existing);
        }
        self.shells.make_room(sandbox, implicit)?;
        let mut record = self.start_runtime_here(sandbox).await?.0;
        let cwd = self.start_dir(&record, request.exec_dir.as_deref()).await?;
        // The shell gets the uid's agent environment, as every command does (I14).
        let CommandEnv { env, masker } = self.command_env(&record).await?;
        let no_change = request
            .no_change_timeout
            .unwrap_or(DEFAULT_NO_CHANGE_TIMEOUT)
            .max(Duration::from_secs(1));
        for attempt in 1..=2 {
            let session = Arc::new(Session::new(
                id.clone(),
                kind,
                implicit,
                &record,
                cwd.clone(),
                no_change,
                masker.clone(),
            ));
            match self.start_shell(&session, &cwd, env.clone()).await {
                Ok(()) => {
                    self.shells.insert(session.clone());
                    return Ok(session);
                }
                Err(StartFailure::Backend(BackendError::RuntimeNotFound { .. }))
                    if attempt == 1 =>
                {
                    // The runtime vanished since it was last seen running: start a fresh one,
                    // as a native exec would.
                    tracing::warn!(%sandbox, "runtime lost; starting a new one for a shell session");
                    let lost = self.mark_runtime_lost(&record).await?;
                    record = self.start_runtime_here(&lost.id).await?.0;
                }
                Err(StartFailure::Backend(error)) => return Err(ProvisionerError::Backend(error)),
                Err(StartFailure::Shell(reason)) => {
                    return Err(ProvisionerError::ShellStartFailed { reason })
                }
            }
        }
        Err(ProvisionerError::Backend(BackendError::RuntimeNotFound {
            sandbox: sandbox.clone(),
        }))
    }

    /// Starts the session's shell, waits until it is ready and hands it the prelude.
    async fn start_shell(
        self: &Arc<Self>,
        session: &Arc<Session>,
        cwd: &str,
        env: BTreeMap<String, String>,
    ) -> Result<(), StartFailure> {
        let nonce = nonce();
        let (first, second) = nonce.split_at(nonce.len() / 2);
        let request = ProcessRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                BOOTSTRAP.into(),
                "warren-shell".into(),
                first.into(),
                second.into(),
                match session.kind {
                    SessionKind::Shell => "merged".into(),
                    SessionKind::Bash => "split".into(),
                },
            ],
            cwd: cwd.to_owned(),
            env,
            pty: None,
        };
        // The session lives until it is closed or its runtime ends; no runtime outlives
        // its maximum lifetime.
        let handle = match self.backend.start_process(&session.sandbox, &request).await {
            Ok(ProcessStart::Started(handle)) => handle,
            Ok(ProcessStart::Failed { stage, errno }) => {
                return Err(StartFailure::Shell(ProcessStart::failure_message(
                    &stage, errno, "/bin/sh", cwd,
                )))
            }
            Err(error) => return Err(StartFailure::Backend(error)),
        };
        // The session holds the shell's stdin and control from here on; the driver reads
        // its output and waits for its end.
        let warren_backend::ProcessHandle {
            stdin,
            stdout,
            stderr,
            control,
            exit,
            ..
        } = handle;
        *session.stdin.lock().await = Some(stdin);
        let _ = session.control.set(control.clone());
        let (ready, started) = oneshot::channel();
        let (close, closed) = oneshot::channel();
        session.lock().close = Some(close);
        let outputs = [
            Some((stdout, OutputStream::Stdout)),
            stderr.map(|e| (e, OutputStream::Stderr)),
        ];
        tokio::spawn(tracing::Instrument::in_current_span(drive::drive(
            self.clone(),
            session.clone(),
            drive::Shell {
                outputs: outputs.into_iter().flatten().collect(),
                control,
                exit,
            },
            format!("\x1eR{nonce}").into_bytes(),
            ready,
            closed,
        )));
        let flavor = match tokio::time::timeout(START_TIMEOUT, started).await {
            Ok(Ok(result)) => result?,
            Ok(Err(_)) => return Err(StartFailure::Shell("the shell ended at once".into())),
            Err(_) => {
                session.request_close();
                return Err(StartFailure::Shell(format!(
                    "the shell did not start within {} s",
                    START_TIMEOUT.as_secs()
                )));
            }
        };
        let prelude = prelude(flavor, &session.start_dir);
        if let Err(error) = self.deliver(session, prelude).await {
            session.close().await;
            return Err(StartFailure::Shell(error.to_string()));
        }
        Ok(())
    }

    /// Hands `command` to the session's shell; returns its id, or `None` when the shell
    /// ended before it got the command.
    async fn submit(
        self: &Arc<Self>,
        session: &Arc<Session>,
        command: ShellCommand,
        permit: FencePermit,
    ) -> Result<Option<String>, ProvisionerError> {
        let mut permit = Some(permit);
        // Commands of one session run one after another, in the order they came.
        let order = session.submit.lock().await;
        session.check_can_run()?;
        let record = self.sandbox(&session.sandbox).await?;
        crate::transitions::refuse_unless_runnable(&record)?;
        if record.generation != session.generation {
            // The runtime this shell ran in is gone; the driver is about to notice.
            return Err(ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            });
        }
        let exec_dir = match &command.exec_dir {
            None => None,
            Some(dir) => match self.exec_cwd(&record, dir).await {
                Ok(path) => Some(path),
                Err(error @ ProvisionerError::InvalidCwd { .. }) if command.strict_exec_dir => {
                    return Err(error)
                }
                Err(ProvisionerError::InvalidCwd { .. }) => None,
                Err(other) => return Err(other),
            },
        };
        let flavor = session.flavor.get().copied().ok_or_else(|| {
            ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            }
        })?;
        let nonce = nonce();
        let script = wrap(flavor, session.kind, &nonce, &command, exec_dir.as_deref());
        let run_id = uuid::Uuid::new_v4().to_string();
        let cwd = exec_dir
            .clone()
            .unwrap_or_else(|| session.lock().cwd.clone());
        self.store
            .start_run(&NewRun {
                id: run_id.clone(),
                sandbox_id: session.sandbox.clone(),
                generation: session.generation,
                // The run record keeps the command line, not a secret typed into it.
                command: String::from_utf8_lossy(&session.masker.mask(command.command.as_bytes()))
                    .into_owned(),
                cwd,
                requested_by: command.requested_by.clone(),
                kind: RunKind::Exec,
                tag: None,
                pty: false,
                owner: self.owner_fence(&session.sandbox),
            })
            .await?;
        let command_id = uuid::Uuid::new_v4().to_string();
        if !session.begin_command(Command {
            id: command_id.clone(),
            text: command.command.clone(),
            nonce: nonce.clone(),
            run_id: run_id.clone(),
            started: Instant::now(),
            begin_mark: None,
            begun: false,
            output: [
                Capture::new(self.config.output_cap, &session.masker),
                Capture::new(self.config.output_cap, &session.masker),
            ],
            last_output: tokio::time::Instant::now(),
            no_change_override: command
                .no_change_timeout
                .map(|t| t.max(Duration::from_secs(1))),
            stop: None,
            exit_code: None,
            ends_seen: [false, false],
            finished: None,
            busy: Some(self.command_running(&session.sandbox)),
        }) {
            crate::exec::record_failure(
                self.store.as_ref(),
                &run_id,
                "the shell ended before the command",
            )
            .await;
            return Err(ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            });
        }
        if let Err(error) = self.deliver(session, script).await {
            // The shell never got it: the command did not run.
            if let Some((run_id, outcome)) =
                session.finish_current(&command_id, Finish::Undelivered)
            {
                record_run(self, &run_id, outcome).await;
            }
            if session.ended() {
                return Ok(None);
            }
            return Err(error);
        }
        // Accepted: the shell has the command.
        drop(permit.take());
        if let Some(limit) = command.hard_timeout {
            let limit = limit.min(self.config.max_exec_timeout);
            let (provisioner, watched, command) =
                (self.clone(), session.clone(), command_id.clone());
            tokio::spawn(async move {
                tokio::time::sleep(limit).await;
                provisioner
                    .stop_command(&watched, &command, Stop::HardTimeout)
                    .await;
            });
        }
        drop(order);
        Ok(Some(command_id))
    }

    /// Writes `script` to the session's shell. Gives up when the shell ends meanwhile;
    /// a shell that takes a script only in part is ended (it holds half a command).
    async fn deliver(&self, session: &Session, script: String) -> Result<(), ProvisionerError> {
        let mut changed = session.changed.subscribe();
        let ended = async {
            while !session.ended() {
                if changed.changed().await.is_err() {
                    break;
                }
            }
        };
        let write = async {
            let mut stdin = session.stdin.lock().await;
            let Some(input) = stdin.as_mut() else {
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            };
            input.write_all(script.as_bytes()).await?;
            input.flush().await
        };
        let failure = tokio::select! {
            written = tokio::time::timeout(WRITE_TIMEOUT, write) => match written {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("it took no input for {} s", WRITE_TIMEOUT.as_secs()),
            },
            () = ended => {
                return Err(ProvisionerError::ShellSessionNotFound { id: session.id.clone() })
            }
        };
        if session.ended() {
            return Err(ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            });
        }
        session.request_close();
        Err(ProvisionerError::ShellStartFailed {
            reason: format!("could not hand the command to the session's shell: {failure}"),
        })
    }

    /// Stops the session's command `command_id` if it still runs: its tree is killed and
    /// the shell reports the end; a command that does not end (the shell's own loop) ends
    /// the session.
    async fn stop_command(self: &Arc<Self>, session: &Arc<Session>, command_id: &str, why: Stop) {
        let mut changed = session.changed.subscribe();
        {
            let mut state = session.lock();
            match state.current.as_mut() {
                Some(command) if command.id == command_id && command.running() => {
                    command.stop.get_or_insert(why);
                }
                _ => return,
            }
        }
        session.notify();
        // Kill only what began with the command: wait (briefly) for its begin marker.
        let deadline = tokio::time::Instant::now() + BEGIN_GRACE;
        let since = loop {
            let begun = {
                let state = session.lock();
                match state.current.as_ref() {
                    Some(command) if command.id == command_id && command.running() => {
                        command.begun.then_some(command.begin_mark)
                    }
                    _ => return,
                }
            };
            if let Some(since) = begun {
                break since;
            }
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep_until(deadline) => {
                    // The shell never began it: the shell is stuck; end the session.
                    tracing::warn!(sandbox = %session.sandbox, session = %session.id, "a stopped command never began; ending its session");
                    session.close().await;
                    return;
                }
            }
        };
        let Some(since) = since else {
            // The runtime's clock could not be read: only ending the shell stops it.
            session.close().await;
            return;
        };
        let Some(control) = session.control.get() else {
            return;
        };
        // Sent again until the command ends: the shell may not have started the command's
        // processes yet when the first sweep ran (it printed the begin marker, then forks),
        // and anything started after the marker is the command's at every sweep.
        let kill = ProcessSignal::KillStartedAfter(RuntimeInstant {
            uptime_centis: since.centis,
            last_pid: since.last_pid,
        });
        let deadline = tokio::time::Instant::now() + KILL_GRACE;
        let mut again = tokio::time::Instant::now();
        loop {
            let running = session
                .lock()
                .current
                .as_ref()
                .is_some_and(|command| command.id == command_id && command.running());
            if !running {
                return;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            if now >= again {
                control.send(kill).await;
                again = now + KILL_AGAIN;
            }
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep_until(again.min(deadline)) => {}
            }
        }
        // Nothing to kill but the shell's own work: only ending the shell stops it.
        tracing::warn!(sandbox = %session.sandbox, session = %session.id, "a stopped command did not end; ending its session");
        session.close().await;
    }
}

/// Why a command is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    HardTimeout,
    Kill,
}

enum StartFailure {
    Backend(BackendError),
    Shell(String),
}

/// Checks a client's session id: 1 to 128 characters of `[A-Za-z0-9._-]`.
pub fn check_session_id(id: &str) -> Result<(), ProvisionerError> {
    if id.is_empty()
        || id.len() > MAX_SESSION_ID_BYTES
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ProvisionerError::BadRequest(
            "a session id is 1 to 128 characters of A-Z, a-z, 0-9, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// 128 random bits as 32 hex digits.
fn nonce() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// How a shell that ended at once ended, with what it wrote (`said`).
fn describe_exit(exit: &ProcessExit, said: &str) -> String {
    let how = match (exit.exit_code, exit.signal) {
        (_, Some(signal)) => format!("killed by signal {signal}"),
        (Some(code), _) => format!("exit status {code}"),
        (None, None) => "no exit status".into(),
    };
    match said.trim() {
        "" => how,
        said => format!("{how}: {}", said.chars().take(500).collect::<String>()),
    }
}

/// Closes a command's run record (I22); one the store cannot close now is closed as
/// failed by restart recovery.
async fn record_run(provisioner: &Provisioner, run_id: &str, outcome: RunOutcome) {
    if let Err(crate::exec::RunError::Store(error)) =
        crate::exec::record_outcome(provisioner.store.as_ref(), run_id, &outcome).await
    {
        tracing::warn!(run = run_id, %error, "could not record a shell command's outcome");
    }
}

/// Which shell a session got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Bash,
    Sh,
}
