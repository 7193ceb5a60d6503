//! Long-running processes: the core's one primitive beyond run-to-completion (issue 32).
//!
//! A process is started in a sandbox's runtime by the backend ([`Backend::start_process`])
//! and held here, on the node that owns the runtime: its stdin stays open until closed,
//! its output goes into a bounded log with byte offsets ([`output`]) that any number of
//! readers follow and a reader that went away resumes from its offset, and it can be
//! signalled, resized (on a terminal) and killed. Every wire (`/v1`, MCP, E2B, the AIO
//! shell, the CLI) reaches processes through these methods; none keeps a process of its
//! own.
//!
//! Each process has one run record (I22), opened when it starts and closed when it ends
//! with its exit code or signal and the resources the backend measured, however many
//! inputs, signals or readers it had. Its output is masked for the sandbox's secrets
//! across chunk boundaries, terminal output included (I13). A running process is activity:
//! the reaper leaves its runtime alone, and a termination's grace waits for it. Ending it
//! (kill, its timeout, the runtime's end) goes through the runtime's one killer, its
//! cgroup leaf or the agent's sweep (I24).

mod calls;
pub mod output;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use warren_backend::{
    BackendError, OutputStream, ProcessControl, ProcessExit, ProcessInput, ProcessOutput,
    ProcessRequest, ProcessSignal, ProcessStart, TerminalSize,
};
use warren_core::{SandboxId, SecretMasker};
use warren_store::{NewRun, RunKind, RunOutcome};

pub use calls::{ProcessAnswer, ProcessCall, ProcessRead, MAX_OUTPUT_WAIT};
use output::OutputLog;
pub use output::{OutputPiece, OutputRead};

use crate::env::CommandEnv;
use crate::exec::{ProgramSpec, Route};
use crate::{FencePermit, Provisioner, ProvisionerError};

/// Most processes one sandbox may have running at once.
pub const MAX_PROCESSES: usize = 32;
/// Most ended processes a sandbox's listing keeps (the oldest go first).
pub const MAX_ENDED_PROCESSES: usize = 32;
/// How long an ended process stays readable (its output, its end).
pub const ENDED_KEPT: Duration = Duration::from_secs(600);
/// Bytes of output each process keeps for readers that come back.
pub const OUTPUT_KEPT: usize = 1 << 20;
/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 256;
/// Largest terminal side, in cells.
pub const MAX_TERMINAL_SIDE: u16 = 4096;
/// How long output is still awaited after the process ended, for pipes a background
/// process it started keeps open: after that its output counts as complete (more that
/// comes is still kept).
pub(crate) const OUTPUT_GRACE: Duration = Duration::from_millis(150);
/// Bytes of stdin kept from one chunk to the next for the token check: more than the
/// longest spelling of the token (base64, percent-encoded) that `TokenFinder` knows.
const STDIN_CARRY: usize = 4096;
/// Most bytes one read of the log hands out.
const READ_LIMIT: usize = 256 * 1024;

/// A process to start, as a transport received it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartProcess {
    /// What to run.
    pub program: ProgramSpec,
    /// Working directory as a virtual path; default: the workdir.
    pub cwd: Option<String>,
    /// Extra environment for this process.
    pub env: BTreeMap<String, String>,
    /// Run it on a terminal of this size.
    pub pty: Option<TerminalSize>,
    /// Keep its stdin open for input; otherwise it reads end-of-file at once.
    pub stdin: bool,
    /// A name the caller gives it, to find it again (`GET .../processes` shows it).
    pub tag: Option<String>,
    /// Kill its tree after this long; none: it runs until it ends, is killed, or its
    /// runtime ends.
    pub timeout: Option<Duration>,
    /// Who asked, for the run record (I22).
    pub requested_by: String,
    /// It waits for work between bursts (a code interpreter's kernel): it is no activity
    /// of its own, for the idle reaper nor for a termination's grace; whoever gives it work
    /// holds the sandbox busy meanwhile ([`crate::code`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet: bool,
}

/// Where a process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProcessState {
    /// It runs.
    Running,
    /// It ended.
    Ended {
        /// Its exit status, when it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, when one did.
        signal: Option<i32>,
        /// Its timeout ended it.
        timed_out: bool,
        /// When warren learned of its end.
        ended_at: DateTime<Utc>,
    },
    /// Its runtime went away under it (terminated, reaped, lost): no exit status exists.
    Lost {
        /// When warren learned of it.
        ended_at: DateTime<Utc>,
    },
}

/// What one process is, as every wire shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessInfo {
    /// The sandbox it runs in.
    pub sandbox_id: SandboxId,
    /// Its pid inside the runtime.
    pub pid: i32,
    /// Its run record.
    pub run_id: String,
    /// The caller's name for it.
    pub tag: Option<String>,
    /// The command line (secrets masked), or a JSON argv.
    pub command: String,
    /// Its argv as started.
    pub argv: Vec<String>,
    /// The extra environment it was started with ([`StartProcess::env`]), as given.
    pub env: BTreeMap<String, String>,
    /// The working directory as a virtual path.
    pub cwd: String,
    /// Its terminal's size now, when it runs on one.
    pub pty: Option<TerminalSize>,
    /// Whether its stdin still takes input.
    pub stdin_open: bool,
    /// Who started it.
    pub requested_by: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Where it is in its life.
    pub state: ProcessState,
    /// Offset of the oldest output byte still kept, and after the newest.
    pub output: (u64, u64),
}

/// One event of a process's output as a reader follows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum OutputEvent {
    /// Bytes it wrote.
    Output(OutputPiece),
    /// Bytes `from..to` were dropped from the log before this reader got them.
    Lost {
        /// First offset lost.
        from: u64,
        /// First offset not lost.
        to: u64,
    },
    /// It ended and its output is complete; the last event.
    End(Box<ProcessInfo>),
}

/// A process warren holds.
pub struct ManagedProcess {
    sandbox: SandboxId,
    pid: i32,
    run_id: String,
    tag: Option<String>,
    command: String,
    argv: Vec<String>,
    /// The extra environment it was started with ([`StartProcess::env`]).
    env: BTreeMap<String, String>,
    cwd: String,
    requested_by: String,
    started_at: DateTime<Utc>,
    /// It waits for work between bursts ([`StartProcess::quiet`]).
    quiet: bool,
    /// Its stdin; `None` once closed.
    stdin: tokio::sync::Mutex<Option<ProcessInput>>,
    stdin_open: std::sync::atomic::AtomicBool,
    /// Set when stdin is to close (asked for, or the process ended): a writer waiting on
    /// a process that does not read gives up, so closing never waits for it.
    stdin_closing: watch::Sender<bool>,
    control: ProcessControl,
    terminal: Mutex<Option<TerminalSize>>,
    log: Mutex<OutputLog>,
    /// Bumped on every change a reader may wait for: new output, the end, the output
    /// complete.
    changed: watch::Sender<u64>,
    state: watch::Sender<ProcessState>,
    /// Set once its output is complete: every stream ended, or the grace after its end
    /// passed.
    output_done: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ManagedProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedProcess")
            .field("sandbox", &self.sandbox)
            .field("pid", &self.pid)
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl ManagedProcess {
    /// What it is now.
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            sandbox_id: self.sandbox.clone(),
            pid: self.pid,
            run_id: self.run_id.clone(),
            tag: self.tag.clone(),
            command: self.command.clone(),
            argv: self.argv.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            pty: *lock(&self.terminal),
            stdin_open: self.stdin_open.load(std::sync::atomic::Ordering::SeqCst),
            requested_by: self.requested_by.clone(),
            started_at: self.started_at,
            state: *self.state.borrow(),
            output: lock(&self.log).bounds(),
        }
    }

    /// Whether it still runs.
    pub fn is_running(&self) -> bool {
        *self.state.borrow() == ProcessState::Running
    }

    /// Its output from `from` on, as much as one read hands out.
    pub fn read_output(&self, from: u64) -> OutputRead {
        lock(&self.log).read(from, READ_LIMIT)
    }

    /// Follows its output from `from`: what is kept from there, then what comes, until it
    /// ended and its output is complete ([`OutputEvent::End`]). Dropping the stream stops
    /// following; the process runs on.
    pub fn follow(self: Arc<Self>, from: u64) -> impl futures::Stream<Item = OutputEvent> {
        let changes = self.changed.subscribe();
        futures::stream::unfold(
            (self, changes, from, false),
            |(process, mut changes, next, ended)| async move {
                if ended {
                    return None;
                }
                loop {
                    // Marked seen before reading: a change after the read wakes the wait.
                    changes.borrow_and_update();
                    let done = process
                        .output_done
                        .load(std::sync::atomic::Ordering::SeqCst);
                    let read = process.read_output(next);
                    if let Some((from, to)) = read.lost {
                        let event = OutputEvent::Lost { from, to };
                        return Some((vec![event], (process, changes, from.max(to), false)));
                    }
                    if !read.pieces.is_empty() {
                        let next = read.next;
                        let events = read.pieces.into_iter().map(OutputEvent::Output).collect();
                        return Some((events, (process, changes, next, false)));
                    }
                    if done {
                        let end = OutputEvent::End(Box::new(process.info()));
                        return Some((vec![end], (process, changes, next, true)));
                    }
                    if changes.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
        .flat_map(futures::stream::iter)
    }

    /// Waits until output past offset `from` exists, or its output is complete.
    pub async fn wait_for_output(&self, from: u64) {
        let mut changes = self.changed.subscribe();
        loop {
            changes.borrow_and_update();
            let done = self.output_done.load(std::sync::atomic::Ordering::SeqCst);
            if done || lock(&self.log).bounds().1 > from {
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until it ended; how.
    pub async fn wait(&self) -> ProcessInfo {
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|state| *state != ProcessState::Running)
            .await;
        self.info()
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The processes of every sandbox this node holds.
#[derive(Debug, Default, Clone)]
pub(crate) struct Table {
    sandboxes: Arc<Mutex<HashMap<SandboxId, ByPid>>>,
    /// Starts under way per sandbox, counted against [`MAX_PROCESSES`] with the running
    /// ones (locked after `sandboxes`).
    starting: Arc<Mutex<HashMap<SandboxId, usize>>>,
}

/// A start under way: it counts against [`MAX_PROCESSES`] until dropped, which the start
/// does once its process is in the table (or it failed).
#[derive(Debug)]
pub(crate) struct Starting {
    table: Table,
    sandbox: SandboxId,
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mut starting = lock(&self.table.starting);
        if let Some(pending) = starting.get_mut(&self.sandbox) {
            *pending -= 1;
            if *pending == 0 {
                starting.remove(&self.sandbox);
            }
        }
    }
}

/// One sandbox's processes, by pid.
type ByPid = BTreeMap<i32, Arc<ManagedProcess>>;

impl Table {
    fn get(&self, sandbox: &SandboxId, pid: i32) -> Option<Arc<ManagedProcess>> {
        lock(&self.sandboxes).get(sandbox)?.get(&pid).cloned()
    }

    /// The pids of the sandbox's running quiet processes ([`StartProcess::quiet`]).
    pub(crate) fn quiet_pids(&self, sandbox: &SandboxId) -> Vec<i32> {
        lock(&self.sandboxes)
            .get(sandbox)
            .map(|processes| {
                processes
                    .values()
                    .filter(|p| p.quiet && p.is_running())
                    .map(|p| p.pid)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn list(&self, sandbox: &SandboxId) -> Vec<Arc<ManagedProcess>> {
        let mut sandboxes = lock(&self.sandboxes);
        let Some(processes) = sandboxes.get_mut(sandbox) else {
            return Vec::new();
        };
        forget_old(processes);
        processes.values().cloned().collect()
    }

    /// Counts one more start for the sandbox, unless its running processes and the starts
    /// under way reach [`MAX_PROCESSES`]: both are counted under one lock, so concurrent
    /// starts never pass the bound.
    fn reserve(&self, sandbox: &SandboxId) -> Option<Starting> {
        let sandboxes = lock(&self.sandboxes);
        let mut starting = lock(&self.starting);
        let running = sandboxes.get(sandbox).map_or(0, |processes| {
            processes.values().filter(|p| p.is_running()).count()
        });
        let pending = starting.entry(sandbox.clone()).or_default();
        if running + *pending >= MAX_PROCESSES {
            if *pending == 0 {
                starting.remove(sandbox);
            }
            return None;
        }
        *pending += 1;
        Some(Starting {
            table: self.clone(),
            sandbox: sandbox.clone(),
        })
    }

    /// Forgets an ended process (and its sandbox's entry once empty), unless a newer
    /// process took its pid.
    fn forget(&self, process: &Arc<ManagedProcess>) {
        let mut sandboxes = lock(&self.sandboxes);
        let Some(processes) = sandboxes.get_mut(&process.sandbox) else {
            return;
        };
        if processes
            .get(&process.pid)
            .is_some_and(|held| Arc::ptr_eq(held, process))
        {
            processes.remove(&process.pid);
        }
        if processes.is_empty() {
            sandboxes.remove(&process.sandbox);
        }
    }

    fn insert(&self, process: Arc<ManagedProcess>) {
        let mut sandboxes = lock(&self.sandboxes);
        let processes = sandboxes.entry(process.sandbox.clone()).or_default();
        // A pid of an earlier runtime of the sandbox may come again: the new process wins.
        processes.insert(process.pid, process);
        forget_old(processes);
    }
}

/// Drops ended processes past [`ENDED_KEPT`], and the oldest beyond [`MAX_ENDED_PROCESSES`].
fn forget_old(processes: &mut ByPid) {
    let now = Utc::now();
    let kept = chrono::Duration::from_std(ENDED_KEPT).unwrap_or(chrono::Duration::MAX);
    let mut ended: Vec<(DateTime<Utc>, i32)> = Vec::new();
    processes.retain(|pid, process| match *process.state.borrow() {
        ProcessState::Running => true,
        ProcessState::Ended { ended_at, .. } | ProcessState::Lost { ended_at } => {
            let keep = now - ended_at < kept;
            if keep {
                ended.push((ended_at, *pid));
            }
            keep
        }
    });
    if ended.len() > MAX_ENDED_PROCESSES {
        ended.sort();
        for (_, pid) in &ended[..ended.len() - MAX_ENDED_PROCESSES] {
            processes.remove(pid);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Provisioner {
    /// Starts a process in the sandbox's runtime here, or at its owner
    /// ([`Provisioner::start_process`]).
    pub(crate) async fn start_process_routed(
        &self,
        id: &SandboxId,
        input: StartProcess,
        permit: FencePermit,
        route: Route,
    ) -> Result<ProcessInfo, ProvisionerError> {
        let argv = input.program.argv();
        if argv.is_empty() {
            return Err(ProvisionerError::BadRequest("argv must not be empty"));
        }
        for (name, value) in &input.env {
            warren_core::check_env_name(name)?;
            warren_core::check_env_value(name, value)?;
            self.refuse_token_in_env(name, value)?;
        }
        for arg in &argv {
            self.refuse_token_in_command("command line", arg.as_bytes())?;
        }
        if let Some(cwd) = &input.cwd {
            self.refuse_token_in_command("working directory", cwd.as_bytes())?;
        }
        if let Some(tag) = &input.tag {
            if tag.is_empty() || tag.len() > MAX_TAG_BYTES || tag.chars().any(char::is_control) {
                return Err(ProvisionerError::BadRequest(
                    "tag must be 1 to 256 bytes with no control character",
                ));
            }
        }
        if let Some(size) = input.pty {
            check_terminal_size(size)?;
        }
        if input.timeout.is_some_and(|t| t.is_zero()) {
            return Err(ProvisionerError::BadRequest("timeout_s must be at least 1"));
        }
        self.runnable(id).await?;
        let mut fence = match self.place_for(id, route).await? {
            Ok(fence) => fence,
            // The owner checks the token again when the process starts there; this node's
            // hold goes first, as for a forwarded exec, so the two never wait on each other.
            Err(owner) => {
                let token = permit.token();
                drop(permit);
                return self.forward_start(owner, id, input, token).await;
            }
        };
        // Held until the process is in the table: the bound holds for concurrent starts.
        let _starting =
            self.processes
                .reserve(id)
                .ok_or_else(|| ProvisionerError::TooManyProcesses {
                    sandbox: id.clone(),
                    max: MAX_PROCESSES,
                })?;
        // Read after the claim: a takeover marks the sandbox stopped.
        let mut record = self
            .ensure_runtime(self.runnable(id).await?, &fence)
            .await?;
        let cwd = self.start_dir(&record, input.cwd.as_deref()).await?;
        let CommandEnv { mut env, masker } = self.command_env(&record).await?;
        env.extend(input.env.clone());
        let request = ProcessRequest {
            argv: argv.clone(),
            cwd: cwd.clone(),
            env,
            pty: input.pty,
        };
        let command =
            String::from_utf8_lossy(&masker.mask(input.program.describe().as_bytes())).into_owned();
        for attempt in 1..=2 {
            let run_id = uuid::Uuid::new_v4().to_string();
            self.store
                .start_run(&NewRun {
                    id: run_id.clone(),
                    sandbox_id: id.clone(),
                    generation: record.generation,
                    command: command.clone(),
                    cwd: cwd.clone(),
                    requested_by: input.requested_by.clone(),
                    owner: Some(fence.clone()),
                    kind: RunKind::Process,
                    tag: input.tag.clone(),
                    pty: input.pty.is_some(),
                })
                .await?;
            let started = self.backend.start_process(id, &request).await;
            let failure = match started {
                Ok(ProcessStart::Started(handle)) => {
                    // Accepted: the process runs.
                    drop(permit);
                    let process = Arc::new(ManagedProcess {
                        sandbox: id.clone(),
                        pid: handle.pid,
                        run_id: run_id.clone(),
                        tag: input.tag.clone(),
                        command: command.clone(),
                        argv: argv.clone(),
                        env: input.env.clone(),
                        cwd: cwd.clone(),
                        requested_by: input.requested_by.clone(),
                        started_at: Utc::now(),
                        quiet: input.quiet,
                        stdin: tokio::sync::Mutex::new(input.stdin.then_some(handle.stdin)),
                        stdin_open: std::sync::atomic::AtomicBool::new(input.stdin),
                        stdin_closing: watch::channel(!input.stdin).0,
                        control: handle.control,
                        terminal: Mutex::new(input.pty),
                        log: Mutex::new(OutputLog::new(OUTPUT_KEPT)),
                        changed: watch::channel(0).0,
                        state: watch::channel(ProcessState::Running).0,
                        output_done: std::sync::atomic::AtomicBool::new(false),
                    });
                    self.processes.insert(process.clone());
                    let pumps = [
                        Some((handle.stdout, OutputStream::Stdout)),
                        handle.stderr.map(|e| (e, OutputStream::Stderr)),
                    ]
                    .into_iter()
                    .flatten()
                    .map(|(output, stream)| {
                        tokio::spawn(pump(process.clone(), output, stream, masker.clone()))
                    })
                    .collect();
                    // A quiet process is no activity of its own (its callers hold the
                    // sandbox busy while it works).
                    let running = (!input.quiet).then(|| self.inflight.hold(id.clone()));
                    tokio::spawn(tracing::Instrument::in_current_span(supervise(
                        process.clone(),
                        handle.exit,
                        pumps,
                        input.timeout,
                        self.store.clone(),
                        running,
                        self.processes.clone(),
                    )));
                    return Ok(process.info());
                }
                Ok(ProcessStart::Failed { stage, errno }) => {
                    let reason = ProcessStart::failure_message(
                        &stage,
                        errno,
                        argv.first().map_or("", String::as_str),
                        &cwd.to_string(),
                    );
                    crate::exec::record_failure(
                        self.store.as_ref(),
                        &run_id,
                        &format!("not_started: {reason}"),
                    )
                    .await;
                    return Err(ProvisionerError::ProcessNotStarted { reason });
                }
                Err(error) => error,
            };
            crate::exec::record_failure(
                self.store.as_ref(),
                &run_id,
                &format!("backend_error: {failure}"),
            )
            .await;
            match failure {
                BackendError::RuntimeNotFound { .. } if attempt == 1 => {
                    // The runtime vanished before the process started: a fresh one.
                    tracing::warn!(sandbox = %id, "runtime lost; starting a new one");
                    self.mark_runtime_lost(&record).await?;
                    (record, fence) = self.start_runtime_here(id).await?;
                }
                other => return Err(ProvisionerError::Backend(other)),
            }
        }
        Err(ProvisionerError::Backend(BackendError::RuntimeNotFound {
            sandbox: id.clone(),
        }))
    }

    /// A process this node holds, by pid.
    pub(crate) fn held_process(
        &self,
        id: &SandboxId,
        pid: i32,
    ) -> Result<Arc<ManagedProcess>, ProvisionerError> {
        self.processes
            .get(id, pid)
            .ok_or_else(|| ProvisionerError::ProcessNotFound {
                sandbox: id.clone(),
                pid,
            })
    }

    /// The processes this node holds for the sandbox: running ones and those that ended
    /// recently, by pid.
    pub(crate) fn held_processes(&self, id: &SandboxId) -> Vec<ProcessInfo> {
        self.processes.list(id).iter().map(|p| p.info()).collect()
    }

    /// The newest process this node holds for the sandbox with this tag, running ones first.
    pub(crate) fn held_process_by_tag(
        &self,
        id: &SandboxId,
        tag: &str,
    ) -> Result<ProcessInfo, ProvisionerError> {
        self.processes
            .list(id)
            .into_iter()
            .filter(|p| p.tag.as_deref() == Some(tag))
            .max_by_key(|p| (p.is_running(), p.started_at))
            .map(|p| p.info())
            .ok_or_else(|| ProvisionerError::ProcessTagNotFound {
                sandbox: id.clone(),
                tag: tag.to_owned(),
            })
    }

    /// Writes a stream of chunks to a held process's stdin; see
    /// [`Provisioner::write_stdin_stream`].
    pub(crate) async fn write_held_stdin<B, E>(
        &self,
        process: &ManagedProcess,
        chunks: impl futures::Stream<Item = Result<B, E>>,
        close: bool,
    ) -> Result<u64, ProvisionerError>
    where
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let pid = process.pid;
        let mut closing = process.stdin_closing.subscribe();
        let mut stdin = process.stdin.lock().await;
        if stdin.is_none() {
            return Err(ProvisionerError::ProcessStdinClosed { pid });
        }
        tokio::pin!(chunks);
        let mut written = 0u64;
        // The end of what came before, so a token split across chunks is seen whole.
        let mut carry: Vec<u8> = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| ProvisionerError::StdinInterrupted {
                pid,
                reason: error.to_string(),
            })?;
            let bytes = chunk.as_ref();
            if bytes.is_empty() {
                continue;
            }
            carry.extend_from_slice(bytes);
            self.refuse_token_in_command("stdin", &carry)?;
            carry.drain(..carry.len().saturating_sub(STDIN_CARRY));
            let Some(writer) = stdin.as_mut() else {
                return Err(ProvisionerError::ProcessStdinClosed { pid });
            };
            let writing = async {
                writer.write_all(bytes).await?;
                writer.flush().await
            };
            let sent = tokio::select! {
                sent = writing => sent,
                _ = closing.wait_for(|closing| *closing), if !close => {
                    return Err(ProvisionerError::ProcessStdinClosed { pid });
                }
            };
            if sent.is_err() {
                // The reading end is gone: the process (and all that held its stdin) ended.
                *stdin = None;
                process
                    .stdin_open
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                return Err(ProvisionerError::ProcessEnded { pid });
            }
            written += bytes.len() as u64;
        }
        if close {
            if let Some(mut writer) = stdin.take() {
                let _ = writer.shutdown().await;
            }
            process
                .stdin_open
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(written)
    }
}

impl ManagedProcess {
    /// Whether its stdin is to close: a writer waiting on it while it does not read lets
    /// go at once, so closing never waits for that writer.
    pub(crate) fn closing_stdin(&self) {
        self.stdin_closing.send_replace(true);
    }

    /// Sends a signal to it, or to its process group.
    pub(crate) async fn signal(&self, signal: i32, group: bool) -> Result<(), ProvisionerError> {
        if !(1..=64).contains(&signal) {
            return Err(ProvisionerError::BadRequest(
                "signal must be a signal number from 1 to 64",
            ));
        }
        self.refuse_ended()?;
        // Killing goes through the runtime's one killer, the whole tree (I24).
        // A signal is answered once delivered, so what the caller does next comes after
        // it; a kill's answer is the process's end.
        let sent = if signal == SIGKILL && group {
            self.control.send(ProcessSignal::Kill).await
        } else {
            self.control
                .apply(ProcessSignal::Signal { signal, group })
                .await
        };
        if !sent {
            return Err(ProvisionerError::ProcessEnded { pid: self.pid });
        }
        Ok(())
    }

    /// Kills its whole tree, background processes included (I24), and waits until it
    /// ended.
    pub(crate) async fn kill(&self) -> ProcessInfo {
        if self.is_running() {
            self.control.send(ProcessSignal::Kill).await;
        }
        self.wait().await
    }

    /// Sets the size of its terminal; it sees `SIGWINCH`.
    pub(crate) async fn resize(&self, size: TerminalSize) -> Result<(), ProvisionerError> {
        check_terminal_size(size)?;
        self.refuse_ended()?;
        if lock(&self.terminal).is_none() {
            return Err(ProvisionerError::NotATerminal { pid: self.pid });
        }
        // Returns once the terminal has its new size: input sent next sees it.
        if !self.control.apply(ProcessSignal::Resize(size)).await {
            return Err(ProvisionerError::ProcessEnded { pid: self.pid });
        }
        *lock(&self.terminal) = Some(size);
        Ok(())
    }

    /// Its output from `from`, waiting up to `wait` when there is none yet and it may come.
    pub(crate) async fn read_waiting(&self, from: u64, wait: Duration) -> OutputRead {
        let read = self.read_output(from);
        if !read.pieces.is_empty() || read.lost.is_some() || wait.is_zero() {
            return read;
        }
        // Something new, or the end: whichever comes first within the wait.
        let _ = tokio::time::timeout(wait, self.wait_for_output(from)).await;
        self.read_output(from)
    }

    fn refuse_ended(&self) -> Result<(), ProvisionerError> {
        if self.is_running() {
            Ok(())
        } else {
            Err(ProvisionerError::ProcessEnded { pid: self.pid })
        }
    }
}

/// The signal that cannot be caught: for a whole group, the runtime's killer does it.
const SIGKILL: i32 = 9;

fn check_terminal_size(size: TerminalSize) -> Result<(), ProvisionerError> {
    let side = 1..=MAX_TERMINAL_SIDE;
    if side.contains(&size.cols) && side.contains(&size.rows) {
        Ok(())
    } else {
        Err(ProvisionerError::BadRequest(
            "a terminal's cols and rows must each be 1 to 4096",
        ))
    }
}

/// Reads one output stream into the process's log, masking secrets across reads (I13).
async fn pump(
    process: Arc<ManagedProcess>,
    mut output: ProcessOutput,
    stream: OutputStream,
    masker: SecretMasker,
) {
    let mut masking = (!masker.is_empty()).then(|| masker.stream());
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match output.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let bytes = match &mut masking {
            Some(masking) => masking.push(&buffer[..n]),
            None => buffer[..n].to_vec(),
        };
        lock(&process.log).push(stream, &bytes);
        process.notify();
    }
    if let Some(masking) = &mut masking {
        let held = masking.finish();
        lock(&process.log).push(stream, &held);
        process.notify();
    }
}

/// Waits for the process's end (killing its tree when its timeout passes), records it
/// (I22), and marks its output complete once every stream ended or the grace passed.
async fn supervise(
    process: Arc<ManagedProcess>,
    exit: warren_backend::ProcessWait,
    mut pumps: Vec<tokio::task::JoinHandle<()>>,
    timeout: Option<Duration>,
    store: Arc<dyn warren_store::StateStore>,
    running: Option<crate::InflightHold>,
    table: Table,
) {
    let started = std::time::Instant::now();
    tokio::pin!(exit);
    let deadline = async {
        match timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut timed_out = false;
    let ended: Result<ProcessExit, BackendError> = loop {
        tokio::select! {
            ended = &mut exit => break ended,
            () = &mut deadline, if !timed_out => {
                timed_out = true;
                process.control.send(ProcessSignal::Kill).await;
            }
        }
    };
    let ended_at = Utc::now();
    let (state, outcome) = match &ended {
        Ok(exit) => (
            ProcessState::Ended {
                exit_code: exit.exit_code,
                signal: exit.signal,
                timed_out,
                ended_at,
            },
            RunOutcome {
                exit_code: exit.exit_code,
                signal: exit.signal,
                timed_out,
                duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
                cpu_user_ms: exit.usage.cpu_user_ms,
                cpu_system_ms: exit.usage.cpu_system_ms,
                peak_memory_bytes: exit.usage.peak_memory_bytes,
                failure: None,
            },
        ),
        Err(error) => (
            ProcessState::Lost { ended_at },
            RunOutcome {
                duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
                failure: Some(format!("runtime_ended: {error}")),
                ..RunOutcome::default()
            },
        ),
    };
    // Its stdin goes with it: a writer waiting on a full pipe (a background process holds
    // it unread) gives up.
    process
        .stdin_open
        .store(false, std::sync::atomic::Ordering::SeqCst);
    process.stdin_closing.send_replace(true);
    process.state.send_replace(state);
    process.notify();
    let _ = crate::exec::record_outcome(store.as_ref(), &process.run_id, &outcome).await;
    drop(running);
    // Output written before the end is in the pipes now; pipes a background process
    // holds open do not keep readers waiting past the grace.
    let all = futures::future::join_all(pumps.iter_mut());
    let _ = tokio::time::timeout(OUTPUT_GRACE, all).await;
    process
        .output_done
        .store(true, std::sync::atomic::Ordering::SeqCst);
    process.notify();
    // A pump still reading (a background process holds its pipe) keeps filling the log
    // until that pipe closes; it holds the process only as long.
    drop(pumps);
    if let Ok(mut stdin) = process.stdin.try_lock() {
        stdin.take();
    }
    // Readable for a while after its end; then forgotten, with its output.
    tokio::time::sleep(ENDED_KEPT).await;
    table.forget(&process);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_under_way_count_against_the_bound_until_they_end() {
        let table = Table::default();
        let a = SandboxId::parse("sbx-000000000000000000000001").unwrap();
        let b = SandboxId::parse("sbx-000000000000000000000002").unwrap();
        let held: Vec<Starting> = (0..MAX_PROCESSES)
            .map(|_| table.reserve(&a).expect("room"))
            .collect();
        assert!(table.reserve(&a).is_none(), "the bound holds");
        assert!(table.reserve(&b).is_some(), "per sandbox");
        drop(held);
        assert!(lock(&table.starting).is_empty(), "nothing is left counted");
        assert!(table.reserve(&a).is_some());
    }
}
