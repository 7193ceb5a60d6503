//! Persistent shell sessions in a sandbox's runtime, for clients that keep one shell across
//! calls: the AIO sandbox API's `/v1/shell` and `/v1/bash` (issue 16).
//!
//! A session is one real shell process of the runtime, so `$$`, the working directory,
//! variables (exported or not) and functions carry over from one command to the next, and
//! no two sessions ever share a shell (DeerFlow's issue #1433 was shared-shell corruption).
//! It is built on the backend's one exec primitive, so it works unchanged on every backend
//! that runs commands:
//!
//! - **The shell** is one long exec of `/bin/sh -c BOOTSTRAP`. The bootstrap makes a private
//!   directory (0700) under `/tmp` with a FIFO, opens the FIFO read-write on fd 7 (so no
//!   writer closing it ever gives the shell an end of file), keeps the exec's stdout and
//!   stderr on fds 8 and 9, and becomes `bash --noprofile --norc /proc/self/fd/7` (or `sh`
//!   without bash). The shell reads its script from its own descriptor of the FIFO, so its
//!   stdin is `/dev/null` and a command that reads stdin, or runs `exec </dev/null`, never
//!   takes a later command's text. Its output streams back through the exec's sink.
//! - **A command** is delivered by a short exec (`cat > fifo`, the wrapped command on its
//!   stdin). The wrapper runs the command with `eval` (fds 7 to 9 closed for it, so nothing
//!   it starts can read the FIFO or write the markers), then prints an end marker on fd 8
//!   (and 9) carrying a per-command random nonce, `$?` and `$PWD`; a begin marker before it
//!   carries the runtime's clock. Only what lies between the two markers is the command's
//!   output: no echo, no prompt, no marker. The nonce never appears whole in the wrapper
//!   text, so `set -x` or `set -v` cannot forge it. Commands are serialised per session.
//! - **Stopping a command** (`hard_timeout`, kill) freezes, then kills, the shell's
//!   descendants that began after the command did, with a short helper exec; the shell
//!   itself stays. A command the shell runs itself (a `while :; do :; done` loop) leaves
//!   nothing to kill: after [`KILL_GRACE`] the whole session is ended instead.
//! - **Closing** a session closes the exec's sink, and the backend kills the shell's whole
//!   tree (I24); a terminated or reaped sandbox ends its sessions with its runtime.
//!
//! Every command gets a run record like a native exec (I22), its output is masked for the
//! sandbox's secrets (I13), and a running command counts as activity for the reaper and
//! the termination grace. An idle session holds no command: after the idle timeout without
//! use it is closed, so an open session never keeps a runtime alive by itself.

mod scan;
mod script;

use scan::*;
use script::*;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};
use warren_backend::{BackendError, ExecOutcome, ExecRequest, OutputChunk, OutputStream};
use warren_core::{MaskingStream, SandboxId, SecretMasker, VirtualPath};
use warren_store::{NewRun, RunKind, RunOutcome, SandboxRecord};

use crate::env::CommandEnv;
use crate::{FencePermit, Provisioner, ProvisionerError};

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
/// How long delivering a command to its shell may take.
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
/// The FIFO is named after the shell and opened by that name from its directory, so the
/// shell's messages read `bash: foo: command not found`, as an interactive shell's do;
/// the first command's prelude moves the shell to the session's directory.
const BOOTSTRAP: &str = r#"d=/tmp/.warren-shell-$1$2
mkdir -m 700 "$d" || exit 125
if command -v bash >/dev/null 2>&1; then f=bash; else f=sh; fi
mkfifo -m 600 "$d/$f" || { rmdir "$d"; exit 125; }
if [ "$3" = merged ]; then exec 2>&1; fi
exec 7<>"$d/$f" 8>&1 9>&2 </dev/null
printf '\036R%s%s\037%s\037%s\037%s\0' "$1" "$2" "$$" "$f" "$d" >&8
cd "$d" || exit 125
if [ "$f" = bash ]; then exec bash --noprofile --norc bash; fi
exec /bin/sh sh
"#;

/// Delivers a command: its wrapped text arrives on stdin.
const WRITE: &str = r#"exec cat > "$1""#;

/// Removes a session's directory once its shell is gone.
const CLEANUP: &str = r#"rm -rf -- "$1""#;

/// Stops a command: `$1` is the shell's pid, `$2` when the command began in hundredths of a
/// second since boot (empty: every descendant), `$3` the last pid the runtime had handed
/// out by then. The shell's descendants that began with the command are frozen, round after
/// round until no new one appears, then all killed at once, so none is reparented out of
/// reach in between. The shell itself, and the jobs of earlier commands, are never touched.
///
/// "Began with the command": a start time in a later clock tick than the command's begin,
/// or in the same tick with a newer pid (pids are handed out in order; a tick is 10 ms,
/// and two commands' markers can lie closer together than that).
const KILL: &str = r#"shell=$1
since=$2
last=$3
tck=$(getconf CLK_TCK 2>/dev/null) || tck=100
case $tck in ''|*[!0-9]*) tck=100;; esac
case $since in ''|*[!0-9]*) floor=0;; *) floor=$((since * tck / 100));; esac
case $last in ''|*[!0-9]*) last=0;; esac
frozen=" "
round=0
while [ $round -lt 50 ]; do
  round=$((round + 1))
  table=
  for stat in /proc/[0-9]*/stat; do
    { read -r line < "$stat"; } 2>/dev/null || continue
    pid=${line%% *}
    rest=${line##*) }
    set -f
    set -- $rest
    set +f
    table="$table$pid $2 ${20}
"
  done
  tree=" $shell "
  grew=1
  while [ -n "$grew" ]; do
    grew=
    while read -r pid ppid start; do
      [ -n "$pid" ] || continue
      case $tree in *" $pid "*) continue;; esac
      case $tree in *" $ppid "*) tree="$tree$pid "; grew=1;; esac
    done <<TABLE
$table
TABLE
  done
  new=
  while read -r pid ppid start; do
    [ -n "$pid" ] || continue
    [ "$pid" = "$shell" ] && continue
    case $tree in *" $pid "*) ;; *) continue;; esac
    case $frozen in *" $pid "*) continue;; esac
    case $start in ''|*[!0-9]*) continue;; esac
    if [ "$start" -lt "$floor" ]; then continue; fi
    if [ "$start" -eq "$floor" ] && [ "$pid" -le "$last" ]; then continue; fi
    new="$new $pid"
  done <<TABLE
$table
TABLE
  [ -n "$new" ] || break
  kill -STOP $new 2>/dev/null
  frozen="$frozen${new# } "
done
set -f
set -- $frozen
set +f
if [ $# -gt 0 ]; then kill -KILL "$@" 2>/dev/null; fi
echo $#
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
        let cwd = match &request.exec_dir {
            Some(dir) => self.exec_cwd(&record, dir).await?,
            None => VirtualPath::parse(".", record.layout.layout(), &[], &record.workdir)?,
        }
        .to_string();
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

    /// Starts the session's shell and waits until it is ready.
    async fn start_shell(
        self: &Arc<Self>,
        session: &Arc<Session>,
        cwd: &str,
        env: BTreeMap<String, String>,
    ) -> Result<(), StartFailure> {
        let nonce = nonce();
        let (first, second) = nonce.split_at(nonce.len() / 2);
        let request = ExecRequest {
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
            stdin: Vec::new(),
            // The session lives until it is closed or its runtime ends; no runtime outlives
            // its maximum lifetime.
            timeout: self.config.max_lifetime,
            // Everything arrives through the sink; nothing needs keeping twice.
            output_cap: 0,
        };
        let (ready, started) = oneshot::channel();
        let (close, closed) = oneshot::channel();
        session.lock().close = Some(close);
        tokio::spawn(tracing::Instrument::in_current_span(drive(
            self.clone(),
            session.clone(),
            request,
            format!("\x1eR{nonce}").into_bytes(),
            ready,
            closed,
        )));
        match tokio::time::timeout(START_TIMEOUT, started).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StartFailure::Shell("the shell ended at once".into())),
            Err(_) => {
                session.request_close();
                Err(StartFailure::Shell(format!(
                    "the shell did not start within {} s",
                    START_TIMEOUT.as_secs()
                )))
            }
        }
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
        crate::exec::refuse_fenced(&record)?;
        if record.generation != session.generation {
            // The runtime this shell ran in is gone; the driver is about to notice.
            return Err(ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            });
        }
        let exec_dir = match &command.exec_dir {
            None => None,
            Some(dir) => match self.exec_cwd(&record, dir).await {
                Ok(path) => Some(path.to_string()),
                Err(error @ ProvisionerError::InvalidCwd { .. }) if command.strict_exec_dir => {
                    return Err(error)
                }
                Err(ProvisionerError::InvalidCwd { .. }) => None,
                Err(other) => return Err(other),
            },
        };
        let process = session.process.get().cloned().ok_or_else(|| {
            ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            }
        })?;
        let nonce = nonce();
        let script = wrap(
            process.flavor,
            session.kind,
            &nonce,
            &command,
            exec_dir.as_deref(),
            !session.lock().prelude_sent,
            &session.start_dir,
        );
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
            busy: Some(Busy::new(self.clone(), session.sandbox.clone())),
        }) {
            record_run(
                self,
                &run_id,
                failed_outcome("the shell ended before the command"),
            )
            .await;
            return Err(ProvisionerError::ShellSessionNotFound {
                id: session.id.clone(),
            });
        }
        if let Err(error) = self.deliver(session, &process, script).await {
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
        session.lock().prelude_sent = true;
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

    /// Writes a wrapped command into the session's FIFO. Gives up when the shell ends
    /// meanwhile (nobody would read it: the write would block until its timeout).
    async fn deliver(
        &self,
        session: &Session,
        process: &ShellProcess,
        script: String,
    ) -> Result<(), ProvisionerError> {
        let request = ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                WRITE.into(),
                "warren-shell".into(),
                process.fifo(),
            ],
            cwd: "/".into(),
            env: BTreeMap::new(),
            stdin: script.into_bytes(),
            timeout: WRITE_TIMEOUT,
            output_cap: 4096,
        };
        let mut changed = session.changed.subscribe();
        let ended = async {
            while !session.ended() {
                if changed.changed().await.is_err() {
                    break;
                }
            }
        };
        let outcome = tokio::select! {
            outcome = self.backend.exec(&session.sandbox, &request, None) => outcome,
            () = ended => {
                return Err(ProvisionerError::ShellSessionNotFound { id: session.id.clone() })
            }
        };
        match outcome {
            Ok(outcome) if outcome.exit_code == Some(0) => Ok(()),
            Ok(outcome) => Err(ProvisionerError::ShellStartFailed {
                reason: format!(
                    "could not hand the command to the session's shell: {}",
                    describe_failure(&outcome)
                ),
            }),
            Err(error) => Err(ProvisionerError::Backend(error)),
        }
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
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
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
                    session.close().await;
                    return;
                }
            }
        };
        let Some(process) = session.process.get() else {
            return;
        };
        let request = ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                KILL.into(),
                "warren-shell-kill".into(),
                process.pid.to_string(),
                since.map(|m| m.centis.to_string()).unwrap_or_default(),
                since
                    .and_then(|m| m.last_pid)
                    .map(|pid| pid.to_string())
                    .unwrap_or_default(),
            ],
            cwd: "/".into(),
            env: BTreeMap::new(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(30),
            output_cap: 4096,
        };
        match self.backend.exec(&session.sandbox, &request, None).await {
            Ok(outcome) if outcome.exit_code == Some(0) => {}
            Ok(outcome) => {
                tracing::warn!(sandbox = %session.sandbox, session = %session.id, failure = %describe_failure(&outcome), "could not kill a shell session's command");
            }
            Err(error) => {
                tracing::warn!(sandbox = %session.sandbox, session = %session.id, %error, "could not kill a shell session's command");
            }
        }
        let deadline = tokio::time::Instant::now() + KILL_GRACE;
        loop {
            let running = session
                .lock()
                .current
                .as_ref()
                .is_some_and(|command| command.id == command_id && command.running());
            if !running {
                return;
            }
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        // Nothing to kill but the shell's own work: only ending the shell stops it.
        tracing::info!(sandbox = %session.sandbox, session = %session.id, "a stopped command did not end; ending its session");
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

fn describe_failure(outcome: &ExecOutcome) -> String {
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    let stderr = stderr.trim();
    match (outcome.exit_code, outcome.signal) {
        (_, Some(signal)) => format!("killed by signal {signal}"),
        (Some(code), _) if stderr.is_empty() => format!("exit status {code}"),
        (Some(code), _) => format!("exit status {code}: {stderr}"),
        (None, None) if outcome.timed_out => "timed out".into(),
        (None, None) => "no exit status".into(),
    }
}

fn failed_outcome(reason: &str) -> RunOutcome {
    RunOutcome {
        failure: Some(reason.to_owned()),
        ..RunOutcome::default()
    }
}

/// Closes a command's run record (I22). The command has run; a store that is briefly out
/// of reach gets a few more tries, after which restart recovery closes the run as failed.
async fn record_run(provisioner: &Provisioner, run_id: &str, outcome: RunOutcome) {
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=5 {
        match provisioner.store.finish_run(run_id, &outcome).await {
            Ok(_) => return,
            Err(warren_store::StoreError::RunAlreadyFinished { .. }) if attempt > 1 => return,
            Err(error) if error.is_unavailable() && attempt < 5 => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(error) => {
                tracing::warn!(run = run_id, %error, "could not record a shell command's outcome");
                return;
            }
        }
    }
}

/// Which shell a session got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Bash,
    Sh,
}

/// The session's shell, once it said it is ready.
#[derive(Debug, Clone)]
struct ShellProcess {
    /// `$$` inside the runtime.
    pid: i32,
    /// Its private directory (holding the FIFO `in`), in the runtime.
    dir: String,
    flavor: Flavor,
}

impl ShellProcess {
    /// The FIFO the shell reads its commands from.
    fn fifo(&self) -> String {
        let name = match self.flavor {
            Flavor::Bash => "bash",
            Flavor::Sh => "sh",
        };
        format!("{}/{name}", self.dir)
    }
}

/// A command running counts as activity (the reaper, the termination grace), as a native
/// exec's does; dropped when the command ends.
struct Busy {
    provisioner: Arc<Provisioner>,
    sandbox: SandboxId,
}

impl Busy {
    fn new(provisioner: Arc<Provisioner>, sandbox: SandboxId) -> Self {
        provisioner.inflight_started(&sandbox);
        Self {
            provisioner,
            sandbox,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.provisioner.inflight_ended(&self.sandbox);
    }
}

/// One session.
struct Session {
    id: String,
    kind: SessionKind,
    /// Made for a command that named no session: the first to go when room is needed.
    implicit: bool,
    sandbox: SandboxId,
    /// The runtime generation its shell runs in.
    generation: i64,
    created_at: DateTime<Utc>,
    /// Where the shell starts: its first command's prelude changes there.
    start_dir: String,
    masker: SecretMasker,
    process: OnceLock<ShellProcess>,
    state: Mutex<State>,
    /// Bumped on every change of `state`, for whoever waits.
    changed: watch::Sender<u64>,
    /// Serialises commands.
    submit: tokio::sync::Mutex<()>,
}

struct State {
    cwd: String,
    last_used: Instant,
    last_used_at: DateTime<Utc>,
    no_change_timeout: Duration,
    command_count: u64,
    prelude_sent: bool,
    /// Set once the shell has ended: its exit status, and when.
    ended: Option<(Option<i32>, Instant)>,
    /// The latest command, running or not.
    current: Option<Command>,
    stdout: Scan,
    stderr: Scan,
    /// Closing the session: the driver closes the shell's sink.
    close: Option<oneshot::Sender<()>>,
}

struct Command {
    id: String,
    text: String,
    nonce: String,
    run_id: String,
    started: Instant,
    /// When the command began: the runtime's clock (hundredths of a second since boot)
    /// and the last pid it had handed out.
    begin_mark: Option<BeginMark>,
    begun: bool,
    /// stdout (everything, for a shell session) and stderr.
    output: [Capture; 2],
    last_output: tokio::time::Instant,
    no_change_override: Option<Duration>,
    stop: Option<Stop>,
    exit_code: Option<i32>,
    /// End markers seen, per stream.
    ends_seen: [bool; 2],
    finished: Option<CommandStatus>,
    busy: Option<Busy>,
}

impl Command {
    fn running(&self) -> bool {
        self.finished.is_none()
    }
}

/// How a command's end came about.
enum Finish {
    /// Its end markers arrived.
    Marked,
    /// The shell ended under it, with this exit status.
    ShellEnded(Option<i32>),
    /// It never reached the shell.
    Undelivered,
}

impl Session {
    fn new(
        id: String,
        kind: SessionKind,
        implicit: bool,
        record: &SandboxRecord,
        cwd: String,
        no_change_timeout: Duration,
        masker: SecretMasker,
    ) -> Self {
        Self {
            id,
            kind,
            implicit,
            sandbox: record.id.clone(),
            generation: record.generation,
            created_at: Utc::now(),
            start_dir: cwd.clone(),
            masker,
            process: OnceLock::new(),
            state: Mutex::new(State {
                cwd,
                last_used: Instant::now(),
                last_used_at: Utc::now(),
                no_change_timeout,
                command_count: 0,
                prelude_sent: false,
                ended: None,
                current: None,
                stdout: Scan::default(),
                stderr: Scan::default(),
                close: None,
            }),
            changed: watch::channel(0).0,
            submit: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    fn ended(&self) -> bool {
        self.lock().ended.is_some()
    }

    fn check_can_run(&self) -> Result<(), ProvisionerError> {
        let state = self.lock();
        if state.ended.is_some() {
            return Err(ProvisionerError::ShellSessionNotFound {
                id: self.id.clone(),
            });
        }
        if let Some(command) = state.current.as_ref().filter(|c| c.running()) {
            return Err(ProvisionerError::ShellSessionBusy {
                id: self.id.clone(),
                command: command.text.chars().take(200).collect(),
            });
        }
        Ok(())
    }

    /// Makes `command` the session's current one; false when the shell has ended.
    fn begin_command(&self, command: Command) -> bool {
        {
            let mut state = self.lock();
            if state.ended.is_some() {
                return false;
            }
            state.command_count += 1;
            state.last_used = Instant::now();
            state.last_used_at = Utc::now();
            state.stdout.expect();
            state.stderr.expect();
            state.current = Some(command);
        }
        self.notify();
        true
    }

    fn info(&self) -> SessionInfo {
        let state = self.lock();
        let running = state.current.as_ref().filter(|c| c.running());
        SessionInfo {
            id: self.id.clone(),
            kind: self.kind,
            working_dir: state.cwd.clone(),
            created_at: self.created_at,
            last_used_at: state.last_used_at,
            status: if state.ended.is_some() {
                SessionStatus::Ended
            } else if running.is_some() {
                SessionStatus::Busy
            } else {
                SessionStatus::Ready
            },
            current_command: running.map(|c| c.text.clone()),
            command_count: state.command_count,
            no_change_timeout: state.no_change_timeout,
        }
    }

    fn latest_report(&self, status: Option<CommandStatus>) -> CommandReport {
        let state = self.lock();
        self.report_of(&state, status)
    }

    fn report_of(&self, state: &State, status: Option<CommandStatus>) -> CommandReport {
        let session_ended = state.ended.is_some();
        let Some(command) = &state.current else {
            return CommandReport {
                session_id: self.id.clone(),
                command_id: String::new(),
                command: String::new(),
                status: if session_ended {
                    CommandStatus::Terminated
                } else {
                    CommandStatus::Completed
                },
                exit_code: state.ended.and_then(|(code, _)| code),
                stdout: String::new(),
                stderr: String::new(),
                truncated: false,
                run_id: String::new(),
                session_ended,
            };
        };
        let [stdout, stderr] = &command.output;
        CommandReport {
            session_id: self.id.clone(),
            command_id: command.id.clone(),
            command: command.text.clone(),
            status: status
                .filter(|_| command.running())
                .or(command.finished)
                .unwrap_or(CommandStatus::Running),
            exit_code: command.exit_code,
            stdout: stdout.text(),
            stderr: stderr.text(),
            truncated: stdout.truncated() || stderr.truncated(),
            run_id: command.run_id.clone(),
            session_ended,
        }
    }

    /// Waits for the command `id` as [`CommandWait::Until`] describes.
    async fn await_command(&self, id: &str, limit: Option<Duration>) -> CommandReport {
        let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
        let mut changed = self.changed.subscribe();
        loop {
            let wake = {
                let state = self.lock();
                let Some(command) = state.current.as_ref().filter(|c| c.id == id) else {
                    return self.report_of(&state, None);
                };
                if !command.running() {
                    return self.report_of(&state, None);
                }
                let quiet = command
                    .no_change_override
                    .unwrap_or(state.no_change_timeout);
                // A timeout too long to represent never passes.
                let stale = command.last_output.checked_add(quiet);
                let now = tokio::time::Instant::now();
                if stale.is_some_and(|stale| now >= stale) {
                    return self.report_of(&state, Some(CommandStatus::NoChangeTimeout));
                }
                if deadline.is_some_and(|deadline| now >= deadline) {
                    return self.report_of(&state, Some(CommandStatus::Running));
                }
                match (stale, deadline) {
                    (Some(stale), Some(deadline)) => Some(stale.min(deadline)),
                    (stale, deadline) => stale.or(deadline),
                }
            };
            let sleep = async {
                match wake {
                    Some(wake) => tokio::time::sleep_until(wake).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changed.changed() => {}
                () = sleep => {}
            }
        }
    }

    /// Takes what the shell wrote.
    fn feed(self: &Arc<Self>, provisioner: &Arc<Provisioner>, chunk: &OutputChunk) {
        let finished = {
            let mut state = self.lock();
            let State {
                current,
                stdout,
                stderr,
                cwd,
                ..
            } = &mut *state;
            let Some(command) = current.as_mut().filter(|c| c.running()) else {
                return;
            };
            let (scan, index) = match (self.kind, chunk.stream) {
                (_, OutputStream::Stdout) => (stdout, 0),
                (SessionKind::Bash, OutputStream::Stderr) => (stderr, 1),
                // A merged session's stderr is its stdout; nothing else writes there.
                (SessionKind::Shell, OutputStream::Stderr) => return,
            };
            let (a, b) = command.nonce.split_at(command.nonce.len() / 2);
            let begin = [&[MARK, b'B'][..], a.as_bytes(), b.as_bytes()].concat();
            let end = [&[MARK, b'E'][..], a.as_bytes(), b.as_bytes()].concat();
            let mut events = Vec::new();
            scan.feed(&chunk.bytes, &begin, &end, &mut events);
            for event in events {
                match event {
                    Event::Output(bytes) => {
                        command.output[index].push(&bytes);
                        command.last_output = tokio::time::Instant::now();
                    }
                    Event::Begun(trailer) if index == 0 => {
                        command.begun = true;
                        command.begin_mark = parse_begin(&trailer);
                    }
                    Event::Begun(_) => {}
                    Event::Ended(trailer) => {
                        command.ends_seen[index] = true;
                        if index == 0 {
                            let trailer = String::from_utf8_lossy(&trailer);
                            let trailer = trailer.strip_prefix('\x1f').unwrap_or(&trailer);
                            let mut fields = trailer.splitn(2, '\x1f');
                            command.exit_code = fields.next().and_then(|rc| rc.parse().ok());
                            if let Some(pwd) = fields.next().filter(|p| p.starts_with('/')) {
                                *cwd = pwd.to_owned();
                            }
                        }
                    }
                }
            }
            let needed = match self.kind {
                SessionKind::Shell => 1,
                SessionKind::Bash => 2,
            };
            let done = command.ends_seen[..needed].iter().all(|seen| *seen);
            let id = command.id.clone();
            drop(state);
            if done {
                self.finish_current(&id, Finish::Marked)
            } else {
                self.notify();
                None
            }
        };
        if let Some((run_id, outcome)) = finished {
            let provisioner = provisioner.clone();
            tokio::spawn(async move { record_run(&provisioner, &run_id, outcome).await });
        }
    }

    /// Ends the command `id` if it still runs; returns its run record's id and outcome.
    fn finish_current(&self, id: &str, how: Finish) -> Option<(String, RunOutcome)> {
        let outcome = {
            let mut state = self.lock();
            let command = state
                .current
                .as_mut()
                .filter(|c| c.id == id && c.running())?;
            for capture in &mut command.output {
                capture.finish();
            }
            let (status, failure) = match (&how, command.stop) {
                (Finish::Undelivered, _) => (
                    CommandStatus::Terminated,
                    Some("the command never reached the session's shell".to_owned()),
                ),
                (_, Some(Stop::HardTimeout)) => (CommandStatus::HardTimeout, None),
                (_, Some(Stop::Kill)) => (CommandStatus::Killed, None),
                (Finish::Marked, None) => (CommandStatus::Completed, None),
                (Finish::ShellEnded(_), None) => (CommandStatus::Terminated, None),
            };
            if let Finish::ShellEnded(code) = how {
                command.exit_code = command.exit_code.or(code);
            }
            command.finished = Some(status);
            command.busy = None;
            let outcome = RunOutcome {
                exit_code: command.exit_code,
                signal: None,
                timed_out: status == CommandStatus::HardTimeout,
                duration_ms: i64::try_from(command.started.elapsed().as_millis())
                    .unwrap_or(i64::MAX),
                cpu_user_ms: None,
                cpu_system_ms: None,
                peak_memory_bytes: None,
                failure,
            };
            (command.run_id.clone(), outcome)
        };
        self.notify();
        Some(outcome)
    }

    /// Asks the driver to close the shell's sink (the backend then kills its tree).
    fn request_close(&self) {
        if let Some(close) = self.lock().close.take() {
            let _ = close.send(());
        }
    }

    /// Closes the session and waits (bounded) until its shell's tree is gone.
    async fn close(&self) {
        self.request_close();
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + CLOSE_TIMEOUT;
        while !self.ended() {
            tokio::select! {
                result = changed.changed() => if result.is_err() { return },
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(sandbox = %self.sandbox, session = %self.id, "a closed shell session did not end in time");
                    return;
                }
            }
        }
    }

    /// When an idle session is closed: `idle` after its last use, unless a command runs.
    fn idle_deadline(&self, idle: Duration) -> Option<tokio::time::Instant> {
        let state = self.lock();
        if state.current.as_ref().is_some_and(Command::running) {
            return None;
        }
        Some(tokio::time::Instant::from_std(state.last_used + idle))
    }
}

/// Runs the session's shell: starts the exec, reports readiness, feeds its output to the
/// session, closes it on request or when idle, and ends the session when the shell ends.
async fn drive(
    provisioner: Arc<Provisioner>,
    session: Arc<Session>,
    request: ExecRequest,
    ready_token: Vec<u8>,
    ready: oneshot::Sender<Result<(), StartFailure>>,
    mut close: oneshot::Receiver<()>,
) {
    let (sink, mut chunks) = mpsc::channel::<OutputChunk>(64);
    let backend = provisioner.backend.clone();
    let exec = backend.exec(&session.sandbox, &request, Some(sink));
    tokio::pin!(exec);
    let mut ready = Some(ready);
    // What the bootstrap wrote before it was ready (its errors, if it fails).
    let mut early: Vec<u8> = Vec::new();
    let mut closing = false;
    let idle = provisioner.config.idle_timeout;
    let result = loop {
        let idle_at = session.idle_deadline(idle);
        tokio::select! {
            result = &mut exec => break result,
            chunk = chunks.recv(), if !closing => match chunk {
                Some(chunk) if ready.is_some() => {
                    early.extend_from_slice(&chunk.bytes);
                    if let Some(process) = parse_ready(&early, &ready_token) {
                        let _ = session.process.set(process);
                        if let Some(ready) = ready.take() {
                            if ready.send(Ok(())).is_err() {
                                // The opener gave up waiting: nobody will use this shell.
                                closing = true;
                                chunks.close();
                            }
                        }
                        early = Vec::new();
                    } else if early.len() > 64 * 1024 {
                        early.drain(..early.len() - 4096);
                    }
                }
                Some(chunk) => session.feed(&provisioner, &chunk),
                None => {}
            },
            _ = &mut close, if !closing => {
                closing = true;
                // The backend sees the sink closed and kills the shell's whole tree (I24).
                chunks.close();
            }
            () = async { tokio::time::sleep_until(idle_at.unwrap_or_else(tokio::time::Instant::now)).await }, if idle_at.is_some() && !closing => {
                if session.idle_deadline(idle).is_some_and(|at| at <= tokio::time::Instant::now()) {
                    tracing::info!(sandbox = %session.sandbox, session = %session.id, "closing an idle shell session");
                    closing = true;
                    chunks.close();
                }
            }
        }
    };
    // Every chunk was sent before the exec returned: take the rest.
    while let Ok(chunk) = chunks.try_recv() {
        if ready.is_none() && !closing {
            session.feed(&provisioner, &chunk);
        } else {
            early.extend_from_slice(&chunk.bytes);
        }
    }
    let exit_code = match &result {
        Ok(outcome) => outcome.exit_code,
        Err(_) => None,
    };
    if let Some(ready) = ready.take() {
        let failure = match &result {
            Err(BackendError::RuntimeNotFound { sandbox }) => {
                StartFailure::Backend(BackendError::RuntimeNotFound {
                    sandbox: sandbox.clone(),
                })
            }
            Err(error) => StartFailure::Shell(format!("the runtime could not run it: {error}")),
            Ok(outcome) => {
                let said = String::from_utf8_lossy(&early);
                let said = said.trim();
                StartFailure::Shell(if said.is_empty() {
                    format!("the shell ended at once ({})", describe_failure(outcome))
                } else {
                    format!(
                        "the shell ended at once ({}): {}",
                        describe_failure(outcome),
                        said.chars().take(500).collect::<String>()
                    )
                })
            }
        };
        let _ = ready.send(Err(failure));
    }
    let running = {
        let mut state = session.lock();
        state.ended = Some((exit_code, Instant::now()));
        state.close = None;
        state
            .current
            .as_ref()
            .filter(|c| c.running())
            .map(|c| c.id.clone())
    };
    if let Some(id) = running {
        if let Some((run_id, mut outcome)) =
            session.finish_current(&id, Finish::ShellEnded(exit_code))
        {
            if outcome.exit_code.is_none() {
                outcome.failure = Some(match &result {
                    Err(error) => format!("backend_error: {error}"),
                    Ok(_) => "the session's shell was killed".to_owned(),
                });
            }
            record_run(&provisioner, &run_id, outcome).await;
        }
    }
    session.notify();
    // The FIFO's directory goes with the shell (if the runtime is still there).
    if let Some(process) = session.process.get() {
        let cleanup = ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                CLEANUP.into(),
                "warren-shell".into(),
                process.dir.clone(),
            ],
            cwd: "/".into(),
            env: BTreeMap::new(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(10),
            output_cap: 1024,
        };
        let _ = backend.exec(&session.sandbox, &cleanup, None).await;
    }
}

/// The sessions of every sandbox.
#[derive(Default)]
pub(crate) struct Registry {
    sessions: Mutex<HashMap<SandboxId, Vec<Arc<Session>>>>,
    open_locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Vec<Arc<Session>>>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        // Ended sessions stay readable for a while, then go.
        sessions.retain(|_, list| {
            list.retain(|session| {
                session
                    .lock()
                    .ended
                    .is_none_or(|(_, at)| at.elapsed() < ENDED_KEPT)
            });
            !list.is_empty()
        });
        sessions
    }

    fn open_lock(&self, sandbox: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.open_locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(sandbox.clone()).or_default().clone()
    }

    fn get(&self, sandbox: &SandboxId, kind: SessionKind, id: &str) -> Option<Arc<Session>> {
        self.lock()
            .get(sandbox)?
            .iter()
            .find(|session| session.kind == kind && session.id == id)
            .cloned()
    }

    fn find(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
    ) -> Result<Arc<Session>, ProvisionerError> {
        self.get(sandbox, kind, id)
            .ok_or_else(|| ProvisionerError::ShellSessionNotFound {
                id: id.chars().take(MAX_SESSION_ID_BYTES).collect(),
            })
    }

    fn of(&self, sandbox: &SandboxId, kind: SessionKind) -> Vec<Arc<Session>> {
        self.lock()
            .get(sandbox)
            .map(|list| {
                list.iter()
                    .filter(|session| session.kind == kind)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn insert(&self, session: Arc<Session>) {
        self.lock()
            .entry(session.sandbox.clone())
            .or_default()
            .push(session);
    }

    fn forget(&self, session: &Arc<Session>) {
        let mut sessions = self.lock();
        if let Some(list) = sessions.get_mut(&session.sandbox) {
            list.retain(|other| !Arc::ptr_eq(other, session));
        }
    }

    /// Makes room for one more live session in the sandbox: ended ones are dropped, then,
    /// at a bound, the least recently used idle session made for a command without a
    /// session id (its client never said it wants it again) is closed; a sandbox full of
    /// sessions its clients named is full.
    fn make_room(&self, sandbox: &SandboxId, implicit: bool) -> Result<(), ProvisionerError> {
        let mut sessions = self.lock();
        let Some(list) = sessions.get_mut(sandbox) else {
            return Ok(());
        };
        list.retain(|session| !session.ended());
        let implicit_count = list.iter().filter(|session| session.implicit).count();
        if list.len() < MAX_SHELL_SESSIONS
            && !(implicit && implicit_count >= MAX_IMPLICIT_SHELL_SESSIONS)
        {
            return Ok(());
        }
        let victim = list
            .iter()
            .filter(|session| session.implicit && session.info().status == SessionStatus::Ready)
            .min_by_key(|session| session.lock().last_used)
            .cloned();
        match victim {
            Some(victim) => {
                list.retain(|other| !Arc::ptr_eq(other, &victim));
                victim.request_close();
                Ok(())
            }
            // Implicit sessions all busy, under the overall bound: one more is fine.
            None if list.len() < MAX_SHELL_SESSIONS => Ok(()),
            None => Err(ProvisionerError::TooManyShellSessions {
                sandbox: sandbox.clone(),
                max: MAX_SHELL_SESSIONS,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(chunks: &[&[u8]], begin: &[u8], end: &[u8]) -> Vec<Event> {
        let mut scan = Scan::default();
        scan.expect();
        let mut events = Vec::new();
        for chunk in chunks {
            scan.feed(chunk, begin, end, &mut events);
        }
        events
    }

    fn output_of(events: &[Event]) -> Vec<u8> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Output(bytes) => Some(bytes.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn only_the_bytes_between_the_markers_are_the_commands_output() {
        let begin = b"\x1eBabc";
        let end = b"\x1eEabc";
        let stream = b"late output\x1eBabc\x1f12.34\0hello\nno newline\x1eEabc\x1f0\x1f/tmp\0after";
        let events = scan_all(&[stream], begin, end);
        assert_eq!(output_of(&events), b"hello\nno newline");
        assert!(events.contains(&Event::Begun(b"\x1f12.34".to_vec())));
        assert!(events.contains(&Event::Ended(b"\x1f0\x1f/tmp".to_vec())));
    }

    #[test]
    fn a_marker_split_across_chunks_at_every_byte_is_still_found() {
        let begin = b"\x1eBnonce";
        let end = b"\x1eEnonce";
        let stream = b"x\x1eBnonce\x1f1.00\0out\x1e not a marker\x1eEnonce\x1f3\x1f/a b\0";
        for cut in 0..stream.len() {
            for second in cut..stream.len() {
                let events = scan_all(
                    &[&stream[..cut], &stream[cut..second], &stream[second..]],
                    begin,
                    end,
                );
                assert_eq!(
                    output_of(&events),
                    b"out\x1e not a marker",
                    "cuts at {cut} and {second}"
                );
                assert_eq!(
                    events.last(),
                    Some(&Event::Ended(b"\x1f3\x1f/a b".to_vec()))
                );
            }
        }
    }

    #[test]
    fn a_capture_keeps_the_head_and_the_tail_of_a_long_output() {
        let mut capture = Capture::new(8, &SecretMasker::default());
        capture.push(b"0123");
        capture.push(b"456789ab");
        capture.push(b"cdef");
        capture.finish();
        assert!(capture.truncated());
        assert_eq!(
            capture.text(),
            "0123\n[warren: 8 bytes of output left out]\ncdef"
        );
        let mut short = Capture::new(8, &SecretMasker::default());
        short.push(b"abc");
        short.finish();
        assert!(!short.truncated());
        assert_eq!(short.text(), "abc");
    }

    #[test]
    fn a_capture_masks_a_secret_split_between_chunks() {
        let masker = SecretMasker::new([("KEY", "s3cr3t")]);
        let mut capture = Capture::new(1024, &masker);
        capture.push(b"a s3c");
        capture.push(b"r3t b");
        capture.finish();
        assert_eq!(capture.text(), "a [masked:KEY] b");
    }

    #[test]
    fn the_nonce_is_never_whole_in_the_wrapper_text() {
        let nonce = nonce();
        let mut command = ShellCommand::new("echo $(date) 'quoted'", "test");
        command.env.insert("A".into(), Some("x'y".into()));
        command.env.insert("B".into(), None);
        for flavor in [Flavor::Bash, Flavor::Sh] {
            for kind in [SessionKind::Shell, SessionKind::Bash] {
                let text = wrap(
                    flavor,
                    kind,
                    &nonce,
                    &command,
                    Some("/mnt/user-data"),
                    true,
                    "/mnt/user-data",
                );
                assert!(!text.contains(&nonce), "{text}");
                assert!(text.contains(&quote("echo $(date) 'quoted'")));
            }
        }
    }

    #[test]
    fn session_ids_are_short_and_plain() {
        assert!(check_session_id("0b6c5a52-2c1e-4c5e-9d3e-1f2a3b4c5d6e").is_ok());
        assert!(check_session_id("a.b_c-D9").is_ok());
        for bad in ["", "a/b", "a b", "ä", &"x".repeat(129)] {
            assert!(check_session_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_begin_mark_holds_the_runtime_clock_in_hundredths_and_its_last_pid() {
        assert_eq!(
            parse_begin(b"\x1f12345.67\x1f4242"),
            Some(BeginMark {
                centis: 1_234_567,
                last_pid: Some(4242)
            })
        );
        assert_eq!(
            parse_begin(b"\x1f3.5\x1f"),
            Some(BeginMark {
                centis: 350,
                last_pid: None
            })
        );
        assert_eq!(parse_begin(b"\x1f"), None);
    }

    /// A session shell run by the host itself (no backend): the bootstrap started with
    /// `PATH`, fed through its FIFO and read the way the driver does it.
    struct HostShell {
        child: std::process::Child,
        chunks: std::sync::mpsc::Receiver<Vec<u8>>,
        process: ShellProcess,
        first: bool,
    }

    impl HostShell {
        fn start(path: &str) -> Self {
            use std::io::Read;
            let nonce = nonce();
            let (a, b) = nonce.split_at(16);
            let mut child = std::process::Command::new("/bin/sh")
                .args(["-c", BOOTSTRAP, "warren-shell", a, b, "merged"])
                .current_dir("/")
                .env("PATH", path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdout = child.stdout.take().unwrap();
            let (sender, chunks) = std::sync::mpsc::channel::<Vec<u8>>();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n) = stdout.read(&mut buffer) {
                    if n == 0 || sender.send(buffer[..n].to_vec()).is_err() {
                        break;
                    }
                }
            });
            let token = format!("\x1eR{nonce}").into_bytes();
            let mut early = Vec::new();
            let process = loop {
                early.extend(
                    chunks
                        .recv_timeout(Duration::from_secs(10))
                        .expect("the shell says it is ready"),
                );
                if let Some(process) = parse_ready(&early, &token) {
                    break process;
                }
            };
            Self {
                child,
                chunks,
                process,
                first: true,
            }
        }

        /// Hands `text` to the shell; returns the command's begin and end tokens.
        fn send(&mut self, text: &str) -> (Vec<u8>, Vec<u8>) {
            use std::io::Write;
            let nonce = nonce();
            let command = ShellCommand::new(text, "test");
            let script = wrap(
                self.process.flavor,
                SessionKind::Shell,
                &nonce,
                &command,
                None,
                self.first,
                "/",
            );
            self.first = false;
            // Without a reader (the shell died) this fails at once instead of hanging.
            std::os::unix::fs::OpenOptionsExt::custom_flags(
                std::fs::OpenOptions::new().write(true),
                rustix::fs::OFlags::NONBLOCK.bits() as i32,
            )
            .open(self.process.fifo())
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
            let (x, y) = nonce.split_at(16);
            (
                [&[MARK, b'B'][..], x.as_bytes(), y.as_bytes()].concat(),
                [&[MARK, b'E'][..], x.as_bytes(), y.as_bytes()].concat(),
            )
        }

        /// Reads the command's events until `stop` says so, or the shell ends (the events
        /// seen come back with `false` then).
        fn events_until(
            &mut self,
            scan: &mut Scan,
            tokens: &(Vec<u8>, Vec<u8>),
            mut stop: impl FnMut(&Event) -> bool,
        ) -> (Vec<Event>, bool) {
            let mut seen = Vec::new();
            loop {
                let Ok(chunk) = self.chunks.recv_timeout(Duration::from_secs(10)) else {
                    return (seen, false);
                };
                let mut events = Vec::new();
                scan.feed(&chunk, &tokens.0, &tokens.1, &mut events);
                for event in events {
                    let done = stop(&event);
                    seen.push(event);
                    if done {
                        return (seen, true);
                    }
                }
            }
        }

        /// Runs `text`: its output, and its end trailer (`None`: the shell ended).
        fn run(&mut self, text: &str) -> (String, Option<String>) {
            let tokens = self.send(text);
            let mut scan = Scan::default();
            scan.expect();
            let mut output = Vec::new();
            let mut end = None;
            let (events, _) =
                self.events_until(&mut scan, &tokens, |e| matches!(e, Event::Ended(_)));
            for event in events {
                match event {
                    Event::Output(bytes) => output.extend(bytes),
                    Event::Ended(trailer) => {
                        end = Some(String::from_utf8_lossy(&trailer).into_owned())
                    }
                    Event::Begun(_) => {}
                }
            }
            (String::from_utf8_lossy(&output).into_owned(), end)
        }
    }

    impl Drop for HostShell {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.process.dir);
        }
    }

    /// The bootstrap and the wrapper, run by the host's own shells (bash, and `sh` with no
    /// bash on its PATH).
    #[test]
    fn both_shell_flavors_keep_their_state_and_give_exact_output() {
        let tools = tempfile_dir();
        for tool in ["mkdir", "mkfifo", "rmdir", "cat"] {
            let path = std::process::Command::new("/bin/sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap();
            let path = String::from_utf8(path.stdout).unwrap();
            std::os::unix::fs::symlink(path.trim(), tools.join(tool)).unwrap();
        }
        for (flavor, path) in [
            (Flavor::Bash, std::env::var("PATH").unwrap()),
            (Flavor::Sh, tools.display().to_string()),
        ] {
            let mut shell = HostShell::start(&path);
            assert_eq!(shell.process.flavor, flavor);
            let (pid, _) = shell.run("cd /tmp && X=1 && f() { echo \"fn $1\"; } && echo $$");
            let (out, end) = shell.run("echo $$ $X $PWD; f a; echo err >&2; printf 'no newline'");
            assert_eq!(
                out,
                format!("{} 1 /tmp\nfn a\nerr\nno newline", pid.trim()),
                "{flavor:?}"
            );
            assert_eq!(end.as_deref(), Some("\x1f0\x1f/tmp"), "{flavor:?}");
            let (out, end) = shell.run("echo 'unterminated");
            assert!(
                out.contains("nterminated") || out.contains("EOF"),
                "{flavor:?}: {out}"
            );
            assert_ne!(end.as_deref(), Some("\x1f0\x1f/tmp"), "{flavor:?}");
            assert_eq!(
                shell.run("cat; echo $X").0,
                "1\n",
                "{flavor:?}: stdin is at its end"
            );
            let (out, end) = shell.run("echo bye; exit 3");
            assert_eq!((out.as_str(), end), ("bye\n", None), "{flavor:?}");
            assert_eq!(shell.child.wait().unwrap().code(), Some(3), "{flavor:?}");
        }
        let _ = std::fs::remove_dir_all(&tools);
    }

    /// The kill script spares what an earlier command left running even when it started
    /// in the same clock tick as the stopped command began (the pid tells them apart), and
    /// kills the stopped command's whole tree.
    #[test]
    fn stopping_a_command_spares_the_shell_and_earlier_jobs_even_within_one_clock_tick() {
        let mut shell = HostShell::start(&std::env::var("PATH").unwrap());
        let (old, _) = shell.run("sleep 300 & echo $!");
        let old: i32 = old.trim().parse().unwrap();
        let tokens = shell.send("sleep 301 & (sleep 302; echo never) & sleep 303");
        let mut scan = Scan::default();
        scan.expect();
        let (begun, _) = shell.events_until(&mut scan, &tokens, |e| matches!(e, Event::Begun(_)));
        let Some(Event::Begun(trailer)) = begun.last() else {
            panic!("{begun:?}")
        };
        let mark = parse_begin(trailer).unwrap();
        let last_pid = mark.last_pid.expect("/proc/loadavg names the last pid");
        assert!(u64::try_from(old).unwrap() <= last_pid);
        // Wait until the command's processes exist.
        let children = || {
            std::fs::read_to_string(format!(
                "/proc/{}/task/{}/children",
                shell.process.pid, shell.process.pid
            ))
            .unwrap_or_default()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while children().split_whitespace().count() < 4 {
            assert!(Instant::now() < deadline, "children: {}", children());
            std::thread::sleep(Duration::from_millis(10));
        }
        // Make the earlier job look as if it began in the command's own tick.
        let stat = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap();
        let start: u64 = stat
            .rsplit_once(") ")
            .unwrap()
            .1
            .split_whitespace()
            .nth(19)
            .unwrap()
            .parse()
            .unwrap();
        let tck = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .unwrap();
        let tck: u64 = String::from_utf8(tck.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let killed = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                KILL,
                "warren-shell-kill",
                &shell.process.pid.to_string(),
                &(start * 100 / tck).to_string(),
                &last_pid.to_string(),
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&killed.stdout).trim(),
            "4",
            "{killed:?}"
        );
        let (rest, stayed) =
            shell.events_until(&mut scan, &tokens, |e| matches!(e, Event::Ended(_)));
        assert!(stayed, "the shell stays: {rest:?}");
        let Some(Event::Ended(end)) = rest.last() else {
            panic!("{rest:?}")
        };
        assert!(
            String::from_utf8_lossy(end).starts_with("\x1f137\x1f"),
            "{rest:?}"
        );
        assert!(
            rustix::process::test_kill_process(rustix::process::Pid::from_raw(old).unwrap())
                .is_ok(),
            "the earlier job lives"
        );
        // (bash may report the killed background jobs first, as an interactive one would.)
        let (out, _) = shell.run("echo $$");
        assert_eq!(
            out.lines().last(),
            Some(shell.process.pid.to_string().as_str()),
            "{out}"
        );
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(old).unwrap(),
            rustix::process::Signal::KILL,
        );
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("warren-shell-test-{}", nonce()));
        std::fs::create_dir(&dir).unwrap();
        dir
    }
}
