//! The commands started through envd, per sandbox: processes that outlive the request that
//! started them (`commands.run(background=True)`, `commands.connect(pid)`, PTYs).
//!
//! Built on [`Provisioner::exec`] only, so every command gets a run record (I22), limits,
//! secret masking and every backend, and runs as the sandbox user (I11):
//!
//! - **A process** is one long exec of a small `/bin/sh` wrapper ([`wrapper::WRAPPER`])
//!   owned by a task of the registry ([`process::run`]); dropping the exec kills the
//!   command's whole tree (I24), which is how SIGKILL, a sandbox's end and the server's
//!   shutdown stop it.
//! - **Its pid** is the wrapper's, printed on a marker line before the command runs and
//!   stripped from stdout ([`marker`]). The wrapper leads its own session (the agent makes
//!   every exec one), so SIGTERM goes to the process group through a short exec.
//! - **stdin**, which an exec takes only up front, is a FIFO in a private directory under
//!   `/tmp`, held open by a keeper; each input is a short exec writing to it, in order per
//!   process; closing stdin kills the keeper.
//! - **A PTY** is util-linux `script(1)` reading the FIFO; resizing is `stty -F` on the
//!   terminal the wrapper recorded.
//! - **Output** fans out to any number of subscribers ([`fanout`]) without ever waiting
//!   for one.

mod error;
mod fanout;
mod marker;
mod process;
mod wrapper;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use warren_core::SandboxId;
use warren_provisioner::{ExecInput, ProgramSpec, Provisioner};

pub(crate) use error::ProcessError;
pub(crate) use fanout::Delivery;
pub(crate) use process::{Ending, Events, Exit, Output};

use process::{lock, Config, Process, Stop};
use wrapper::Mode;

/// Most processes one sandbox may run through envd at once.
pub(crate) const MAX_PROCESSES: usize = 64;

/// How long a helper (input, signal, resize, cleanup) may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the end of a sandbox waits for its processes' tasks.
const END_WAIT: Duration = Duration::from_secs(10);

/// A PTY's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PtySize {
    /// Columns.
    pub(crate) cols: u32,
    /// Rows.
    pub(crate) rows: u32,
}

/// What to start (envd's `StartRequest`, plus what the request's context adds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StartSpec {
    /// The program.
    pub(crate) cmd: String,
    /// Its arguments.
    pub(crate) args: Vec<String>,
    /// The request's environment, over the sandbox's.
    pub(crate) envs: BTreeMap<String, String>,
    /// The sandbox's environment (`env_vars` at create).
    pub(crate) sandbox_env: BTreeMap<String, String>,
    /// The working directory as the request gave it: absolute, `~/...`, relative to the
    /// home, or none (the home).
    pub(crate) cwd: Option<String>,
    /// A tag to select it by.
    pub(crate) tag: Option<String>,
    /// Whether its stdin is open for input (envd's default when the request does not say).
    pub(crate) stdin: bool,
    /// A pseudo-terminal of this size.
    pub(crate) pty: Option<PtySize>,
    /// How long it may run; `None` (or more than the provisioner allows) is the
    /// provisioner's maximum exec timeout.
    pub(crate) timeout: Option<Duration>,
    /// Who asked, for the run records (I22): `e2b:<sandboxID>`.
    pub(crate) requested_by: String,
}

/// A started process.
pub(crate) struct Started {
    /// Its pid.
    pub(crate) pid: u32,
    /// Its events from the start on.
    pub(crate) events: Events,
}

/// Which process (envd's `ProcessSelector`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selector {
    /// By pid.
    Pid(u32),
    /// By tag (the first running process with it).
    Tag(String),
}

/// Input for a process (envd's `ProcessInput`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// For its stdin.
    Stdin(Vec<u8>),
    /// For its PTY.
    Pty(Vec<u8>),
}

/// A signal envd can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGKILL: the whole tree, at once.
    Kill,
    /// SIGTERM: to the process group.
    Term,
}

/// A running process, as `List` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessInfo {
    /// Its pid.
    pub(crate) pid: u32,
    /// Its tag.
    pub(crate) tag: Option<String>,
    /// The program.
    pub(crate) cmd: String,
    /// Its arguments.
    pub(crate) args: Vec<String>,
    /// The request's environment.
    pub(crate) envs: BTreeMap<String, String>,
    /// The request's working directory.
    pub(crate) cwd: Option<String>,
}

/// Every sandbox's envd processes.
pub(crate) struct ProcessRegistry {
    inner: Arc<Inner>,
}

/// What the registry and its tasks share.
pub(crate) struct Inner {
    /// Runs every command.
    pub(crate) provisioner: Arc<Provisioner>,
    /// Each sandbox's processes by serial, started and starting.
    sandboxes: Mutex<HashMap<SandboxId, BTreeMap<u64, Arc<Process>>>>,
    /// The next serial.
    next_serial: AtomicU64,
}

impl ProcessRegistry {
    /// An empty registry.
    pub(crate) fn new(provisioner: Arc<Provisioner>) -> Self {
        Self {
            inner: Arc::new(Inner {
                provisioner,
                sandboxes: Mutex::new(HashMap::new()),
                next_serial: AtomicU64::new(1),
            }),
        }
    }

    /// Starts a process and waits for its pid. Its events start with its first output;
    /// the process keeps running when the caller goes away (E2B's background commands).
    pub(crate) async fn start(
        &self,
        sandbox: &SandboxId,
        spec: StartSpec,
    ) -> Result<Started, ProcessError> {
        let mode = match spec.pty {
            Some(size) => Mode::Pty {
                // A terminal of no size confuses every program; 80x24 is what one gets.
                rows: if size.rows == 0 { 24 } else { size.rows },
                cols: if size.cols == 0 { 80 } else { size.cols },
            },
            None if spec.stdin => Mode::Stdin,
            None => Mode::Plain,
        };
        let config = Config {
            cmd: spec.cmd,
            args: spec.args,
            envs: spec.envs,
            cwd: spec.cwd,
        };
        let serial = self.inner.next_serial.fetch_add(1, Ordering::Relaxed);
        let (process, stopped) = Process::new(
            serial,
            config.clone(),
            spec.tag,
            mode,
            spec.requested_by.clone(),
        );
        // Subscribed before the command runs: the Start stream misses nothing.
        let events = process.subscribe();
        {
            let mut sandboxes = lock(&self.inner.sandboxes);
            let processes = sandboxes.entry(sandbox.clone()).or_default();
            if processes.len() >= MAX_PROCESSES {
                return Err(ProcessError::TooMany {
                    limit: MAX_PROCESSES,
                });
            }
            processes.insert(serial, process.clone());
        }
        let mut env = spec.sandbox_env;
        env.extend(config.envs.clone());
        let max = self.inner.provisioner.config().max_exec_timeout;
        let input = ExecInput {
            program: ProgramSpec::Argv(wrapper::process_argv(
                mode,
                &process.nonce,
                &config.cmd,
                &config.args,
            )),
            cwd: resolve_cwd(config.cwd.as_deref()),
            env,
            // E2B's commands have no timeout but the client's; warren's runs are bounded.
            timeout: Some(
                spec.timeout
                    .filter(|t| !t.is_zero())
                    .unwrap_or(max)
                    .min(max),
            ),
            stdin: Vec::new(),
            requested_by: spec.requested_by,
            // The run record shows what the client asked to run, not the wrapper (I22).
            record_as: Some(record_line(&config.cmd, &config.args)),
        };
        let (answer, answered) = oneshot::channel();
        let task = tokio::spawn(tracing::Instrument::in_current_span(process::run(
            self.inner.clone(),
            sandbox.clone(),
            process.clone(),
            input,
            answer,
            stopped,
        )));
        process.set_task(task);
        match answered.await {
            Ok(Ok(pid)) => Ok(Started { pid, events }),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(ProcessError::KilledBeforeStart),
        }
    }

    /// Subscribes to a running process's events from now on, with its pid.
    pub(crate) fn connect(
        &self,
        sandbox: &SandboxId,
        selector: &Selector,
    ) -> Result<(u32, Events), ProcessError> {
        let (pid, process) = self.find(sandbox, selector)?;
        Ok((pid, process.subscribe()))
    }

    /// The sandbox's running processes.
    pub(crate) fn list(&self, sandbox: &SandboxId) -> Vec<ProcessInfo> {
        let sandboxes = lock(&self.inner.sandboxes);
        let Some(processes) = sandboxes.get(sandbox) else {
            return Vec::new();
        };
        processes
            .values()
            .filter(|process| !process.is_finished())
            .filter_map(|process| {
                Some(ProcessInfo {
                    pid: process.pid()?,
                    tag: process.tag.clone(),
                    cmd: process.config.cmd.clone(),
                    args: process.config.args.clone(),
                    envs: process.config.envs.clone(),
                    cwd: process.config.cwd.clone(),
                })
            })
            .collect()
    }

    /// Sends input, after every input sent before it to the same process.
    pub(crate) async fn send_input(
        &self,
        sandbox: &SandboxId,
        selector: &Selector,
        input: Input,
    ) -> Result<(), ProcessError> {
        let (pid, process) = self.find(sandbox, selector)?;
        let bytes = match (process.mode, input) {
            (Mode::Pty { .. }, Input::Pty(bytes)) => bytes,
            (Mode::Pty { .. }, Input::Stdin(_)) => {
                return Err(ProcessError::PtyInputExpected { pid })
            }
            (_, Input::Pty(_)) => return Err(ProcessError::StdinInputExpected { pid }),
            (Mode::Plain, Input::Stdin(_)) => return Err(ProcessError::StdinDisabled { pid }),
            (Mode::Stdin, Input::Stdin(bytes)) => bytes,
        };
        let closed = process.input.lock().await;
        if *closed {
            return Err(ProcessError::StdinClosed { pid });
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let outcome = self
            .helper(
                sandbox,
                &process,
                wrapper::WRITE_INPUT,
                vec![wrapper::fifo(&process.nonce)],
                bytes,
            )
            .await?;
        drop(closed);
        match outcome.exit_code {
            Some(0) => Ok(()),
            _ if process.is_finished() => Err(ProcessError::Ended { pid }),
            Some(3) => Err(ProcessError::Ended { pid }),
            _ => Err(helper_failed("sending input", &outcome)),
        }
    }

    /// Closes a process's stdin: it reads an end of file once it read what was sent.
    /// Nothing to do for a process started without stdin, as with envd.
    pub(crate) async fn close_stdin(
        &self,
        sandbox: &SandboxId,
        selector: &Selector,
    ) -> Result<(), ProcessError> {
        let (pid, process) = self.find(sandbox, selector)?;
        match process.mode {
            Mode::Plain => return Ok(()),
            Mode::Pty { .. } => return Err(ProcessError::ClosePty { pid }),
            Mode::Stdin => {}
        }
        let mut closed = process.input.lock().await;
        if *closed {
            return Ok(());
        }
        let Some(keeper) = process.keeper() else {
            return Err(ProcessError::Ended { pid });
        };
        let outcome = self
            .helper(
                sandbox,
                &process,
                wrapper::CLOSE_STDIN,
                vec![keeper.to_string()],
                Vec::new(),
            )
            .await?;
        if outcome.exit_code != Some(0) {
            return Err(helper_failed("closing stdin", &outcome));
        }
        *closed = true;
        Ok(())
    }

    /// Sends a signal: SIGKILL stops the process's task, which kills its whole tree
    /// (I24); SIGTERM goes to its process group.
    pub(crate) async fn signal(
        &self,
        sandbox: &SandboxId,
        selector: &Selector,
        signal: Signal,
    ) -> Result<(), ProcessError> {
        let (pid, process) = self.find(sandbox, selector)?;
        match signal {
            Signal::Kill => {
                process.stop(Stop::Kill);
                Ok(())
            }
            Signal::Term => {
                let outcome = self
                    .helper(
                        sandbox,
                        &process,
                        wrapper::SIGNAL,
                        vec!["TERM".into(), pid.to_string()],
                        Vec::new(),
                    )
                    .await?;
                if outcome.exit_code == Some(0) || process.is_finished() {
                    Ok(())
                } else {
                    Err(helper_failed("sending SIGTERM", &outcome))
                }
            }
        }
    }

    /// Resizes a process's PTY; its foreground program gets `SIGWINCH`.
    pub(crate) async fn resize(
        &self,
        sandbox: &SandboxId,
        selector: &Selector,
        size: PtySize,
    ) -> Result<(), ProcessError> {
        let (pid, process) = self.find(sandbox, selector)?;
        if !matches!(process.mode, Mode::Pty { .. }) {
            return Err(ProcessError::NoPty { pid });
        }
        let outcome = self
            .helper(
                sandbox,
                &process,
                wrapper::RESIZE,
                vec![
                    wrapper::private_dir(&process.nonce),
                    size.rows.max(1).to_string(),
                    size.cols.max(1).to_string(),
                ],
                Vec::new(),
            )
            .await?;
        match outcome.exit_code {
            Some(0) => Ok(()),
            _ if process.is_finished() => Err(ProcessError::Ended { pid }),
            _ => Err(helper_failed("resizing the PTY", &outcome)),
        }
    }

    /// Kills every process of a sandbox (kill, pause, timeout) and forgets them: their
    /// streams end without an `end` event, as a dropped connection would. Returns once
    /// their tasks dropped their execs (or after a bound).
    pub(crate) async fn end_sandbox(&self, sandbox: &SandboxId) {
        let processes = lock(&self.inner.sandboxes)
            .remove(sandbox)
            .unwrap_or_default();
        let mut tasks = Vec::new();
        for process in processes.into_values() {
            process.stop(Stop::SandboxEnded);
            tasks.extend(process.take_task());
        }
        let _ = tokio::time::timeout(END_WAIT, futures::future::join_all(tasks)).await;
    }

    /// The running process a selector names, with its pid.
    fn find(
        &self,
        sandbox: &SandboxId,
        selector: &Selector,
    ) -> Result<(u32, Arc<Process>), ProcessError> {
        let not_found = || match selector {
            Selector::Pid(pid) => ProcessError::PidNotFound(*pid),
            Selector::Tag(tag) => ProcessError::TagNotFound(tag.clone()),
        };
        let sandboxes = lock(&self.inner.sandboxes);
        let processes = sandboxes.get(sandbox).ok_or_else(not_found)?;
        select(processes.values(), selector).ok_or_else(not_found)
    }

    /// Runs a helper script for a process: a short exec with its own run record (I22).
    async fn helper(
        &self,
        sandbox: &SandboxId,
        process: &Process,
        script: &str,
        args: Vec<String>,
        stdin: Vec<u8>,
    ) -> Result<warren_backend::ExecOutcome, ProcessError> {
        self.inner
            .helper(sandbox, process, script, args, stdin)
            .await
    }
}

impl Inner {
    /// Runs a helper script for a process (see [`ProcessRegistry::helper`]).
    async fn helper(
        &self,
        sandbox: &SandboxId,
        process: &Process,
        script: &str,
        args: Vec<String>,
        stdin: Vec<u8>,
    ) -> Result<warren_backend::ExecOutcome, ProcessError> {
        let input = ExecInput {
            program: ProgramSpec::Argv(wrapper::helper_argv(script, &args)),
            cwd: None,
            env: BTreeMap::new(),
            timeout: Some(HELPER_TIMEOUT),
            stdin,
            requested_by: process.requested_by.clone(),
            record_as: Some(format!(
                "(e2b: {} process {})",
                helper_name(script),
                process
                    .pid()
                    .map_or_else(|| "?".to_owned(), |pid| pid.to_string())
            )),
        };
        Ok(self.provisioner.exec(sandbox, input, None).await?.outcome)
    }

    /// Removes a killed process's private directory, in the background (best effort: the
    /// runtime's `/tmp` goes with the runtime anyway).
    pub(crate) fn spawn_cleanup(self: &Arc<Self>, sandbox: SandboxId, process: Arc<Process>) {
        let inner = self.clone();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let dir = wrapper::private_dir(&process.nonce);
            if let Err(error) = inner
                .helper(&sandbox, &process, wrapper::CLEANUP, vec![dir], Vec::new())
                .await
            {
                tracing::debug!(%error, "removing a killed process's directory failed");
            }
        }));
    }

    /// Forgets an ended process.
    pub(crate) fn forget(&self, process: &Process) {
        let mut sandboxes = lock(&self.sandboxes);
        sandboxes.retain(|_, processes| {
            processes.remove(&process.serial);
            !processes.is_empty()
        });
    }
}

/// The running process a selector names among `processes`, with its pid: the newest one
/// with the pid or tag (a pid may repeat in a new runtime before the old entry is gone).
fn select<'a>(
    processes: impl DoubleEndedIterator<Item = &'a Arc<Process>>,
    selector: &Selector,
) -> Option<(u32, Arc<Process>)> {
    processes
        .rev()
        .filter(|process| !process.is_finished())
        .find_map(|process| {
            let pid = process.pid()?;
            let hit = match selector {
                Selector::Pid(wanted) => pid == *wanted,
                Selector::Tag(tag) => process.tag.as_deref() == Some(tag.as_str()),
            };
            hit.then(|| (pid, process.clone()))
        })
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

/// A helper that ran but did not succeed.
fn helper_failed(what: &'static str, outcome: &warren_backend::ExecOutcome) -> ProcessError {
    let stderr = String::from_utf8_lossy(&outcome.stderr).trim().to_owned();
    let detail = if stderr.is_empty() {
        Exit::from_outcome(outcome).status
    } else {
        stderr
    };
    ProcessError::Helper { what, detail }
}

/// A fanout of process events driven by hand, for the envd layer's tests.
#[cfg(test)]
pub(crate) fn test_fanout() -> Arc<fanout::Fanout<Output, Ending>> {
    fanout::Fanout::new(fanout::BACKLOG_BYTES)
}

#[cfg(test)]
mod tests;

/// The command line a run record shows for an E2B process: the program and its
/// arguments as JSON, as the native API records an argv.
fn record_line(cmd: &str, args: &[String]) -> String {
    let argv: Vec<&str> = std::iter::once(cmd)
        .chain(args.iter().map(String::as_str))
        .collect();
    serde_json::to_string(&argv).unwrap_or_default()
}

/// What a helper does, in run records.
fn helper_name(script: &str) -> &'static str {
    [
        (wrapper::WRITE_INPUT, "send input to"),
        (wrapper::CLOSE_STDIN, "close stdin of"),
        (wrapper::SIGNAL, "signal"),
        (wrapper::RESIZE, "resize the pty of"),
        (wrapper::CLEANUP, "clean up after"),
    ]
    .into_iter()
    .find_map(|(known, name)| (known == script).then_some(name))
    .unwrap_or("helper for")
}
