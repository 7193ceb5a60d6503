//! The code interpreter: execution contexts whose kernels keep their state between calls,
//! and executions whose outputs stream back as text, rich MIME bundles and errors
//! (issue 36). Every wire (`/v1`, MCP, the AIO API's Jupyter routes, E2B's code
//! interpreter) reaches it through these methods.
//!
//! A context is one of the sandbox's processes (issue 32), tagged `code:<language>:<id>`:
//! a small driver ([`DRIVER`], shipped by warren and handed over on stdin) that talks to
//! its kernel with `jupyter_client`, the Jupyter messaging protocol's own client. So a
//! context runs inside the runtime as the sandbox user, with the runtime's limits, its run
//! record (I22), its output masked (I13), killed with its runtime and by terminate, and
//! reached through whichever replica owns the runtime. The kernel starts on the context's
//! first execution. Why a driver rather than a Jupyter server proxied by warren: the
//! processes primitive already carries stdin, ordered output, replica forwarding, masking
//! and the one killer; a server would add a port, a token and an HTTP hop per execution,
//! and a second way into the runtime.
//!
//! An execution writes one request line to the driver's stdin and follows the driver's
//! output from the offset it had before, taking the events tagged with its request id, up
//! to its `end`. A context is a quiet process: an idle kernel is no activity for the
//! reaper, and an execution holds the sandbox busy while it runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::StreamExt as _;
use warren_backend::OutputStream;
use warren_core::{SandboxId, SecretMasker};

pub use warren_protocol::{CodeEvent, ExecutionStatus};

use warren_store::{NewRun, RunKind, RunOutcome};

use crate::processes::{OutputEvent, ProcessInfo, ProcessState, StartProcess};
use crate::{FencePermit, Provisioner, ProvisionerError};

/// The driver each context runs (Python, on `jupyter_client`).
pub const DRIVER: &str = include_str!("driver.py");
/// The driver's command line: it reads its program, a JSON string, from its first line of
/// stdin.
const BOOT: &str =
    "import sys,json;exec(compile(json.loads(sys.stdin.readline()),'warren-code','exec'))";
/// Languages a context may have.
pub const LANGUAGES: &[&str] = &["python"];
/// The id of a language's default context, the one an execution naming none runs in.
pub const DEFAULT_CONTEXT: &str = "default";
/// Most contexts one sandbox may have (each is a process, counted against the sandbox's
/// processes too).
pub const MAX_CONTEXTS: usize = 16;
/// Largest code one execution takes.
pub const MAX_CODE_BYTES: usize = 1 << 20;
/// Longest context id.
pub const MAX_CONTEXT_ID_BYTES: usize = 64;
/// Largest event one execution hands on (a plot, a table): larger lines end the execution
/// with an error instead of holding the server's memory.
pub const MAX_EVENT_BYTES: usize = 32 << 20;
/// How long a driver has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// After an execution's timeout interrupted its kernel, how long the kernel has to stop;
/// then its context is restarted (its state is lost).
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How long a kernel still starting when its execution's timeout passed has to start (the
/// driver then ends the execution unrun; it gives up on a kernel after 60 s itself).
const START_GRACE: Duration = Duration::from_secs(90);
/// Most characters of an execution's code its run record keeps.
const RECORDED_CODE_CHARS: usize = 4096;
/// The tag prefix of a context's process.
const TAG_PREFIX: &str = "code:";
/// Environment the driver gets besides the context's.
const DRIVER_ENV: &[(&str, &str)] = &[
    // ipykernel's debugger warns on every start when this is unset.
    ("PYDEVD_DISABLE_FILE_VALIDATION", "1"),
];

/// A context to create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewContext {
    /// Its id; default: a fresh one.
    pub id: Option<String>,
    /// Its language; default: `python`.
    pub language: Option<String>,
    /// Its working directory, a virtual path; default: the workdir.
    pub cwd: Option<String>,
    /// Environment for its kernel.
    pub env: BTreeMap<String, String>,
    /// Who asked, for the run record (I22).
    pub requested_by: String,
}

/// One execution context.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CodeContext {
    /// Its id.
    pub id: String,
    /// Its language.
    pub language: String,
    /// Its working directory, a virtual path.
    pub cwd: String,
    /// The environment it was created with.
    pub env: BTreeMap<String, String>,
    /// The pid of its driver, one of the sandbox's processes.
    pub pid: i32,
    /// When it was created (or last restarted).
    pub created_at: DateTime<Utc>,
}

/// Code to run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunCode {
    /// The code.
    pub code: String,
    /// The context to run it in; default: the language's default context, created when
    /// missing.
    pub context: Option<String>,
    /// The language, when no context is named; default: `python`.
    pub language: Option<String>,
    /// Environment for this execution only.
    pub env: BTreeMap<String, String>,
    /// Working directory for this execution only, a virtual path.
    pub cwd: Option<String>,
    /// Interrupt the kernel after this long; none: no deadline.
    pub timeout: Option<Duration>,
    /// Environment for the default context's kernel, when this execution creates it.
    pub context_env: BTreeMap<String, String>,
    /// Who asked, for a context created for it.
    pub requested_by: String,
}

/// What a context's id and language are, from its process's tag.
fn parse_tag(tag: &str) -> Option<(&str, &str)> {
    tag.strip_prefix(TAG_PREFIX)?.split_once(':')
}

fn tag_of(language: &str, id: &str) -> String {
    format!("{TAG_PREFIX}{language}:{id}")
}

fn context_of(process: &ProcessInfo) -> Option<CodeContext> {
    if process.state != ProcessState::Running {
        return None;
    }
    let (language, id) = parse_tag(process.tag.as_deref()?)?;
    Some(CodeContext {
        id: id.to_owned(),
        language: language.to_owned(),
        cwd: process.cwd.clone(),
        env: context_env(process.env.clone()),
        pid: process.pid,
        created_at: process.started_at,
    })
}

/// A context's environment: its driver's, without what warren adds.
fn context_env(mut env: BTreeMap<String, String>) -> BTreeMap<String, String> {
    for (name, _) in DRIVER_ENV {
        env.remove(*name);
    }
    env
}

/// The language asked for, checked; default `python`.
pub fn check_language(language: Option<&str>) -> Result<&'static str, ProvisionerError> {
    let asked = language.unwrap_or("python");
    let asked = if asked == "python3" { "python" } else { asked };
    LANGUAGES
        .iter()
        .find(|known| **known == asked)
        .copied()
        .ok_or_else(|| ProvisionerError::UnsupportedLanguage {
            language: asked.to_owned(),
        })
}

fn check_context_id(id: &str) -> Result<(), ProvisionerError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_CONTEXT_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ProvisionerError::BadRequest(
            "a context id is 1 to 64 letters, digits, '-', '_' or '.'",
        ))
    }
}

/// One line of the driver's output.
#[derive(Debug, Default, serde::Deserialize)]
struct DriverEvent {
    #[serde(default)]
    id: Option<String>,
    t: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    ts: Option<i64>,
    #[serde(default)]
    main: Option<bool>,
    #[serde(default)]
    data: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    count: Option<i64>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    traceback: Option<Vec<String>>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Splits a process's stdout into lines, bounded.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// The complete lines `bytes` ends; an over-long line is an error.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, ()> {
        let mut lines = Vec::new();
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            self.partial.extend_from_slice(piece);
            if self.partial.len() > MAX_EVENT_BYTES {
                self.partial.clear();
                return Err(());
            }
            if self.partial.ends_with(b"\n") {
                lines.push(std::mem::take(&mut self.partial));
            }
        }
        Ok(lines)
    }
}

/// Masks the sandbox's secrets in every text an event carries (I13). The driver's output
/// was masked as bytes already; this catches a secret the JSON encoding had escaped.
fn mask_event(event: CodeEvent, masker: &SecretMasker) -> CodeEvent {
    if masker.is_empty() {
        return event;
    }
    let mask = |text: String| String::from_utf8_lossy(&masker.mask(text.as_bytes())).into_owned();
    match event {
        CodeEvent::Stdout { text, timestamp } => CodeEvent::Stdout {
            text: mask(text),
            timestamp,
        },
        CodeEvent::Stderr { text, timestamp } => CodeEvent::Stderr {
            text: mask(text),
            timestamp,
        },
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => CodeEvent::Error {
            name: mask(name),
            value: mask(value),
            traceback: traceback.into_iter().map(mask).collect(),
        },
        CodeEvent::Result {
            data,
            is_main_result,
        } => CodeEvent::Result {
            data: data
                .into_iter()
                .map(|(mime, value)| {
                    let value = if mime.starts_with("image/") {
                        value
                    } else {
                        mask_json(value, &mask)
                    };
                    (mime, value)
                })
                .collect(),
            is_main_result,
        },
        other => other,
    }
}

/// `value` with every string in it (keys too) masked.
fn mask_json(value: serde_json::Value, mask: &impl Fn(String) -> String) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(text) => Value::String(mask(text)),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| mask_json(v, mask)).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (mask(k), mask_json(v, mask)))
                .collect(),
        ),
        other => other,
    }
}

/// Whether a driver line says the kernel began to run this request.
fn started(request: &str, line: &[u8]) -> bool {
    // Short lines only: a result's data is never parsed twice.
    line.len() < 256
        && serde_json::from_slice::<DriverEvent>(line)
            .is_ok_and(|event| event.t == "started" && event.id.as_deref() == Some(request))
}

/// An execution's event from a driver line, when the line is for it.
fn event_for(request: &str, line: &[u8], context: &str) -> Option<CodeEvent> {
    let event: DriverEvent = serde_json::from_slice(line).ok()?;
    if event.id.as_deref() != Some(request) {
        return None;
    }
    let now = || Utc::now().timestamp_nanos_opt().unwrap_or_default();
    Some(match event.t.as_str() {
        "stdout" => CodeEvent::Stdout {
            text: event.text.unwrap_or_default(),
            timestamp: event.ts.unwrap_or_else(now),
        },
        "stderr" => CodeEvent::Stderr {
            text: event.text.unwrap_or_default(),
            timestamp: event.ts.unwrap_or_else(now),
        },
        "result" => CodeEvent::Result {
            data: event.data.unwrap_or_default(),
            is_main_result: event.main.unwrap_or(false),
        },
        "error" => CodeEvent::Error {
            name: event.name.unwrap_or_default(),
            value: event.value.unwrap_or_default(),
            traceback: event.traceback.unwrap_or_default(),
        },
        "restarted" => CodeEvent::Restarted,
        "end" => CodeEvent::End {
            context_id: context.to_owned(),
            execution_count: event.count,
            status: if event.status.as_deref() == Some("ok") {
                ExecutionStatus::Ok
            } else {
                ExecutionStatus::Error
            },
        },
        "bad_request" => CodeEvent::Error {
            name: "BadRequest".to_owned(),
            value: event.message.unwrap_or_default(),
            traceback: Vec::new(),
        },
        _ => return None,
    })
}

fn driver_failure(name: &str, value: String, context: &str) -> [CodeEvent; 2] {
    [
        CodeEvent::Error {
            name: name.to_owned(),
            value,
            traceback: Vec::new(),
        },
        CodeEvent::End {
            context_id: context.to_owned(),
            execution_count: None,
            status: ExecutionStatus::Error,
        },
    ]
}

impl Provisioner {
    /// Creates an execution context: starts its driver (its kernel starts on the first
    /// execution). The start is the acceptance point of the execution guard (I33).
    pub async fn create_code_context(
        &self,
        id: &SandboxId,
        input: NewContext,
        permit: FencePermit,
    ) -> Result<CodeContext, ProvisionerError> {
        let language = check_language(input.language.as_deref())?;
        let context = match input.id {
            Some(context) => {
                check_context_id(&context)?;
                context
            }
            None => uuid::Uuid::new_v4().to_string(),
        };
        let existing = self.code_contexts(id).await?;
        if existing.iter().any(|c| c.id == context) {
            return Err(ProvisionerError::CodeContextExists {
                sandbox: id.clone(),
                context,
            });
        }
        if existing.len() >= MAX_CONTEXTS {
            return Err(ProvisionerError::TooManyCodeContexts {
                sandbox: id.clone(),
                max: MAX_CONTEXTS,
            });
        }
        self.start_driver(
            id,
            language,
            &context,
            input.cwd,
            input.env,
            input.requested_by,
            permit,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_driver(
        &self,
        id: &SandboxId,
        language: &str,
        context: &str,
        cwd: Option<String>,
        env: BTreeMap<String, String>,
        requested_by: String,
        permit: FencePermit,
    ) -> Result<CodeContext, ProvisionerError> {
        let mut process_env = env;
        for (name, value) in DRIVER_ENV {
            process_env.insert((*name).to_owned(), (*value).to_owned());
        }
        let start = StartProcess {
            program: crate::ProgramSpec::Argv(vec![
                "python3".to_owned(),
                "-u".to_owned(),
                "-c".to_owned(),
                BOOT.to_owned(),
            ]),
            cwd,
            env: process_env,
            pty: None,
            stdin: true,
            tag: Some(tag_of(language, context)),
            timeout: None,
            requested_by,
            quiet: true,
        };
        let info = match self.start_process(id, start, permit).await {
            // No python3 at all; a working directory it cannot enter stays what it is.
            Err(ProvisionerError::ProcessNotStarted { reason })
                if reason.starts_with("cannot run \"python3\"") =>
            {
                return Err(ProvisionerError::CodeInterpreterUnavailable {
                    reason: format!("{reason}: the image needs python3 with ipykernel"),
                })
            }
            other => other?,
        };
        let pid = info.pid;
        let ready = async {
            let mut program = serde_json::Value::from(DRIVER).to_string().into_bytes();
            program.push(b'\n');
            let output = self.follow_process(id, pid, 0).await?;
            self.write_stdin(id, pid, &program, false).await?;
            first_line(output).await
        };
        let failed = match tokio::time::timeout(READY_TIMEOUT, ready).await {
            Ok(Ok(line)) => match serde_json::from_slice::<DriverEvent>(&line) {
                Ok(event) if event.t == "ready" => None,
                Ok(event) => Some(event.message.unwrap_or(event.t)),
                Err(_) => Some(String::from_utf8_lossy(&line).trim().to_owned()),
            },
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some("the driver did not start in time".to_owned()),
        };
        if let Some(reason) = failed {
            let _ = self.kill_process(id, pid).await;
            return Err(ProvisionerError::CodeInterpreterUnavailable { reason });
        }
        Ok(CodeContext {
            id: context.to_owned(),
            language: language.to_owned(),
            cwd: info.cwd,
            env: context_env(info.env),
            pid,
            created_at: info.started_at,
        })
    }

    /// The sandbox's execution contexts (those whose driver runs).
    pub async fn code_contexts(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<CodeContext>, ProvisionerError> {
        let mut contexts: Vec<CodeContext> = self
            .list_processes(id)
            .await?
            .iter()
            .filter_map(context_of)
            .collect();
        contexts.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(contexts)
    }

    /// One execution context.
    pub async fn code_context(
        &self,
        id: &SandboxId,
        context: &str,
    ) -> Result<CodeContext, ProvisionerError> {
        self.code_contexts(id)
            .await?
            .into_iter()
            .find(|c| c.id == context)
            .ok_or_else(|| ProvisionerError::CodeContextNotFound {
                sandbox: id.clone(),
                context: context.to_owned(),
            })
    }

    /// Removes a context: its driver and kernel are killed, its state is gone.
    pub async fn remove_code_context(
        &self,
        id: &SandboxId,
        context: &str,
    ) -> Result<(), ProvisionerError> {
        let found = self.code_context(id, context).await?;
        self.kill_process(id, found.pid).await?;
        Ok(())
    }

    /// Restarts a context's kernel: its state is gone; its id, language, working
    /// directory and environment stay.
    pub async fn restart_code_context(
        &self,
        id: &SandboxId,
        context: &str,
        requested_by: String,
        permit: FencePermit,
    ) -> Result<CodeContext, ProvisionerError> {
        let found = self.code_context(id, context).await?;
        self.kill_process(id, found.pid).await?;
        self.start_driver(
            id,
            &found.language,
            &found.id,
            Some(found.cwd),
            found.env,
            requested_by,
            permit,
        )
        .await
    }

    /// Interrupts what the context's kernel runs now (`KeyboardInterrupt` in Python).
    pub async fn interrupt_code_context(
        &self,
        id: &SandboxId,
        context: &str,
    ) -> Result<(), ProvisionerError> {
        let found = self.code_context(id, context).await?;
        self.write_stdin(id, found.pid, b"{\"op\":\"interrupt\"}\n", false)
            .await
            .map(drop)
    }

    /// Runs code in a context, its events streaming as the kernel sends them, up to one
    /// [`CodeEvent::End`]. Executions in one context run one after the other. With a
    /// timeout, the kernel is interrupted when it passes (and its context restarted when
    /// it does not stop); a caller that drops the stream before its end interrupts it too.
    pub async fn run_code(
        self: &Arc<Self>,
        id: &SandboxId,
        input: RunCode,
        permit: FencePermit,
    ) -> Result<BoxStream<'static, CodeEvent>, ProvisionerError> {
        if input.code.len() > MAX_CODE_BYTES {
            return Err(ProvisionerError::BadRequest("code must be at most 1 MiB"));
        }
        if input.timeout.is_some_and(|t| t.is_zero()) {
            return Err(ProvisionerError::BadRequest("timeout must be positive"));
        }
        for (name, value) in &input.env {
            warren_core::check_env_name(name)?;
            warren_core::check_env_value(name, value)?;
            self.refuse_token_in_env(name, value)?;
        }
        let context = match &input.context {
            Some(context) => {
                if input.language.is_some() {
                    return Err(ProvisionerError::BadRequest(
                        "name a context or a language, not both",
                    ));
                }
                self.code_context(id, context).await?
            }
            None => {
                let language = check_language(input.language.as_deref())?;
                self.default_context(
                    id,
                    language,
                    input.context_env.clone(),
                    &input.requested_by,
                    permit,
                )
                .await?
            }
        };
        let cwd = match &input.cwd {
            Some(cwd) => Some(self.code_cwd(id, cwd).await?),
            None => None,
        };
        let request_id = uuid::Uuid::new_v4().to_string();
        let request = serde_json::json!({
            "op": "execute",
            "id": request_id,
            "code": input.code,
            "env": input.env,
            "cwd": cwd,
        });
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        let masker = self.secret_masker(id).await?;
        // The output from before the request on: every event of it comes after.
        let from = self.process_info(id, context.pid).await?.output.1;
        let output = self.follow_process(id, context.pid, from).await?;
        let busy = self.inflight.hold(id.clone());
        // Each execution is a run of its own (I22): the code (masked, cut), its context.
        let run_id = uuid::Uuid::new_v4().to_string();
        let record = self.sandbox(id).await?;
        let shown: String = input.code.chars().take(RECORDED_CODE_CHARS).collect();
        self.store
            .start_run(&NewRun {
                id: run_id.clone(),
                sandbox_id: id.clone(),
                generation: record.generation,
                command: String::from_utf8_lossy(&masker.mask(shown.as_bytes())).into_owned(),
                cwd: cwd.clone().unwrap_or_else(|| context.cwd.clone()),
                requested_by: input.requested_by.clone(),
                owner: self.owner_fence(id),
                kind: RunKind::Code,
                tag: Some(context.id.clone()),
                pty: false,
            })
            .await?;
        if let Err(error) = self.write_stdin(id, context.pid, &line, false).await {
            crate::exec::record_failure(
                self.store.as_ref(),
                &run_id,
                &format!("not_started: {error}"),
            )
            .await;
            return Err(error);
        }
        let execution = Execution {
            provisioner: self.clone(),
            sandbox: id.clone(),
            context,
            request: request_id,
            masker,
            timeout: input.timeout,
            run_id,
            started: std::time::Instant::now(),
            status: None,
            ended: false,
            busy: Some(busy),
        };
        Ok(execution.events(output))
    }

    /// The language's default context, created when missing.
    async fn default_context(
        &self,
        id: &SandboxId,
        language: &'static str,
        env: BTreeMap<String, String>,
        requested_by: &str,
        permit: FencePermit,
    ) -> Result<CodeContext, ProvisionerError> {
        // One creator at a time per sandbox on this node: two first executions make one
        // default context.
        let lock = self.code_creation_lock(id);
        let _creating = lock.lock().await;
        let contexts = self.code_contexts(id).await?;
        if let Some(found) = contexts
            .into_iter()
            .find(|c| c.id == DEFAULT_CONTEXT && c.language == language)
        {
            return Ok(found);
        }
        self.start_driver(
            id,
            language,
            DEFAULT_CONTEXT,
            None,
            env,
            requested_by.to_owned(),
            permit,
        )
        .await
    }

    /// A per-execution working directory, checked and resolved as a process's is.
    async fn code_cwd(&self, id: &SandboxId, cwd: &str) -> Result<String, ProvisionerError> {
        self.refuse_token_in_command("working directory", cwd.as_bytes())?;
        let record = self.runnable(id).await?;
        Ok(self.start_dir(&record, Some(cwd)).await?.to_string())
    }

    fn code_creation_lock(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.code_creation.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(id.clone()).or_default().clone()
    }
}

/// The first line of a process's stdout, or why there is none.
async fn first_line(
    mut output: BoxStream<'static, OutputEvent>,
) -> Result<Vec<u8>, ProvisionerError> {
    let mut lines = Lines::default();
    let mut stderr = Vec::new();
    while let Some(event) = output.next().await {
        match event {
            OutputEvent::Output(piece) if piece.stream == OutputStream::Stdout => {
                let found = lines.push(&piece.bytes).map_err(|()| {
                    ProvisionerError::CodeInterpreterUnavailable {
                        reason: "the driver's first line is too long".to_owned(),
                    }
                })?;
                if let Some(line) = found.into_iter().next() {
                    return Ok(line);
                }
            }
            OutputEvent::Output(piece) => {
                if stderr.len() < 4096 {
                    stderr.extend_from_slice(&piece.bytes);
                }
            }
            OutputEvent::Lost { .. } => {}
            OutputEvent::End(_) => break,
        }
    }
    let said = String::from_utf8_lossy(&stderr);
    let said = said.trim();
    Err(ProvisionerError::CodeInterpreterUnavailable {
        reason: if said.is_empty() {
            "the driver ended before it was ready".to_owned()
        } else {
            format!("the driver ended before it was ready: {said}")
        },
    })
}

/// One execution under way.
struct Execution {
    provisioner: Arc<Provisioner>,
    sandbox: SandboxId,
    context: CodeContext,
    request: String,
    masker: SecretMasker,
    timeout: Option<Duration>,
    /// Its run record.
    run_id: String,
    /// When it was asked for.
    started: std::time::Instant,
    /// How it ended, once its end came.
    status: Option<ExecutionStatus>,
    /// Its end was handed on: dropping it interrupts nothing.
    ended: bool,
    /// Holds the sandbox busy (the context's driver is quiet) until the execution ended
    /// and its end was recorded as the sandbox's last activity.
    busy: Option<crate::InflightHold>,
}

impl Execution {
    /// The driver request that interrupts this execution, and only it.
    fn interrupt_line(&self) -> Vec<u8> {
        let mut line = serde_json::json!({"op": "interrupt", "id": self.request})
            .to_string()
            .into_bytes();
        line.push(b'\n');
        line
    }
}

impl Drop for Execution {
    /// The end of an execution is the sandbox's last activity: the idle timeout counts
    /// from it, and the sandbox stays busy until that is recorded. A caller that went away
    /// before the end interrupts its execution (or drops it, when it still waits behind
    /// another), so an abandoned loop does not hold the kernel.
    fn drop(&mut self) {
        let busy = self.busy.take();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let provisioner = self.provisioner.clone();
        let sandbox = self.sandbox.clone();
        let pid = self.context.pid;
        let interrupt = (!self.ended).then(|| self.interrupt_line());
        let outcome = RunOutcome {
            exit_code: match self.status {
                Some(ExecutionStatus::Ok) => Some(0),
                Some(ExecutionStatus::Error) => Some(1),
                Some(ExecutionStatus::Timeout) | None => None,
            },
            timed_out: self.status == Some(ExecutionStatus::Timeout),
            duration_ms: i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX),
            failure: self
                .status
                .is_none()
                .then(|| "interrupted: the caller went away before the end".to_owned()),
            ..RunOutcome::default()
        };
        let run_id = self.run_id.clone();
        runtime.spawn(async move {
            if let Some(line) = interrupt {
                let _ = provisioner.write_stdin(&sandbox, pid, &line, false).await;
            }
            // Finishing the run moves the sandbox's last activity too.
            if let Err(crate::exec::RunError::Store(error)) =
                crate::exec::record_outcome(provisioner.store.as_ref(), &run_id, &outcome).await
            {
                tracing::warn!(%sandbox, %error, "could not record the end of an execution");
            }
            drop(busy);
        });
    }
}

/// Where an execution's stream is.
enum Phase {
    /// Waiting for the kernel (`true` once it began to run this request).
    Running(bool),
    /// Its timeout passed and the kernel was interrupted: waiting for it to stop.
    Interrupted,
    /// Its end was handed on.
    Done,
}

impl Execution {
    fn events(self, output: BoxStream<'static, OutputEvent>) -> BoxStream<'static, CodeEvent> {
        let deadline = self
            .timeout
            .map(|timeout| tokio::time::Instant::now() + timeout);
        let state = (
            self,
            output,
            Lines::default(),
            Phase::Running(false),
            deadline,
            std::collections::VecDeque::<CodeEvent>::new(),
        );
        futures::stream::unfold(
            state,
            |(mut execution, mut output, mut lines, mut phase, mut deadline, mut queue)| async move {
                loop {
                    if let Some(event) = queue.pop_front() {
                        if let CodeEvent::End { status, .. } = &event {
                            phase = Phase::Done;
                            execution.ended = true;
                            execution.status = Some(*status);
                        }
                        let event = mask_event(event, &execution.masker);
                        return Some((event, (execution, output, lines, phase, deadline, queue)));
                    }
                    if matches!(phase, Phase::Done) {
                        return None;
                    }
                    let next = match deadline {
                        Some(at) => match tokio::time::timeout_at(at, output.next()).await {
                            Ok(next) => next,
                            Err(_) => {
                                deadline = execution.deadline_passed(&mut phase).await;
                                if matches!(phase, Phase::Done) {
                                    queue.extend(execution.timed_out(true));
                                }
                                continue;
                            }
                        },
                        None => output.next().await,
                    };
                    match next {
                        Some(OutputEvent::Output(piece)) if piece.stream == OutputStream::Stdout => {
                            let Ok(found) = lines.push(&piece.bytes) else {
                                queue.extend(driver_failure(
                                    "OutputTooLarge",
                                    format!(
                                        "one output of the execution is over {MAX_EVENT_BYTES} bytes"
                                    ),
                                    &execution.context.id,
                                ));
                                continue;
                            };
                            for line in found {
                                if started(&execution.request, &line) {
                                    match phase {
                                        Phase::Running(_) => phase = Phase::Running(true),
                                        // Interrupted while its kernel started: the driver
                                        // ends it now, unrun.
                                        Phase::Interrupted => {
                                            deadline =
                                                Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                                        }
                                        Phase::Done => {}
                                    }
                                    continue;
                                }
                                let Some(event) =
                                    event_for(&execution.request, &line, &execution.context.id)
                                else {
                                    continue;
                                };
                                let event = match (event, &phase) {
                                    (CodeEvent::End { context_id, execution_count, .. }, Phase::Interrupted) => {
                                        CodeEvent::End {
                                            context_id,
                                            execution_count,
                                            status: ExecutionStatus::Timeout,
                                        }
                                    }
                                    (event, _) => event,
                                };
                                queue.push_back(event);
                            }
                        }
                        Some(OutputEvent::Output(_)) => {}
                        Some(OutputEvent::Lost { from, to }) => {
                            queue.extend(driver_failure(
                                "OutputLost",
                                format!("{} bytes of the execution's output were lost", to - from),
                                &execution.context.id,
                            ));
                        }
                        Some(OutputEvent::End(_)) | None => {
                            let ended = matches!(phase, Phase::Interrupted);
                            if ended {
                                queue.extend(execution.timed_out(false));
                            } else {
                                queue.extend(driver_failure(
                                    "KernelDied",
                                    "the context's kernel ended (its runtime ended, or it was \
                                     removed); its state is lost"
                                        .to_owned(),
                                    &execution.context.id,
                                ));
                            }
                        }
                    }
                }
            },
        )
        .boxed()
    }

    /// The timeout passed: interrupt the kernel, and give it [`INTERRUPT_GRACE`]; after
    /// that, restart the context. Returns the next deadline.
    async fn deadline_passed(&self, phase: &mut Phase) -> Option<tokio::time::Instant> {
        match *phase {
            Phase::Running(began) => {
                *phase = Phase::Interrupted;
                let line = self.interrupt_line();
                let _ = self
                    .provisioner
                    .write_stdin(&self.sandbox, self.context.pid, &line, false)
                    .await;
                let grace = if began { INTERRUPT_GRACE } else { START_GRACE };
                Some(tokio::time::Instant::now() + grace)
            }
            Phase::Interrupted | Phase::Done => {
                // The kernel does not stop: its context starts anew, empty.
                let _ = self
                    .provisioner
                    .kill_process(&self.sandbox, self.context.pid)
                    .await;
                *phase = Phase::Done;
                None
            }
        }
    }

    fn timed_out(&self, killed: bool) -> [CodeEvent; 2] {
        let value = if killed {
            "the execution's timeout passed and its kernel did not stop when interrupted: the \
             context was removed and its state is lost"
        } else {
            "the execution's timeout passed; its kernel was interrupted"
        };
        [
            CodeEvent::Error {
                name: "TimeoutError".to_owned(),
                value: value.to_owned(),
                traceback: Vec::new(),
            },
            CodeEvent::End {
                context_id: self.context.id.clone(),
                execution_count: None,
                status: ExecutionStatus::Timeout,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_s_id_and_language_come_back_from_its_process_s_tag() {
        assert_eq!(parse_tag(&tag_of("python", "c1")), Some(("python", "c1")));
        assert_eq!(parse_tag("server"), None);
        assert_eq!(parse_tag("code:python"), None);
    }

    #[test]
    fn context_ids_are_short_plain_names() {
        assert!(check_context_id("default").is_ok());
        assert!(check_context_id("9f1c-2.a_b").is_ok());
        for bad in ["", "a:b", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(check_context_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn python_is_the_language_and_others_are_refused_by_name() {
        assert_eq!(check_language(None).unwrap(), "python");
        assert_eq!(check_language(Some("python3")).unwrap(), "python");
        let refused = check_language(Some("cobol")).unwrap_err();
        assert!(refused.to_string().contains("cobol"), "{refused}");
    }

    #[test]
    fn lines_split_across_pieces_come_whole_and_an_over_long_line_is_refused() {
        let mut lines = Lines::default();
        assert!(lines.push(b"{\"a\":").unwrap().is_empty());
        assert_eq!(
            lines.push(b"1}\n{\"b\":2}\n{").unwrap(),
            vec![b"{\"a\":1}\n".to_vec(), b"{\"b\":2}\n".to_vec()]
        );
        let mut long = Lines::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut refused = false;
        for _ in 0..=(MAX_EVENT_BYTES >> 20) {
            if long.push(&chunk).is_err() {
                refused = true;
            }
        }
        assert!(refused, "a line over the bound is refused");
    }

    #[test]
    fn only_the_execution_s_own_events_are_taken() {
        let line = br#"{"id":"r1","t":"stdout","text":"hi\n","ts":5}"#;
        assert_eq!(
            event_for("r1", line, "default"),
            Some(CodeEvent::Stdout {
                text: "hi\n".into(),
                timestamp: 5
            })
        );
        assert_eq!(event_for("r2", line, "default"), None);
        let end = br#"{"id":"r1","t":"end","status":"error","count":4}"#;
        assert_eq!(
            event_for("r1", end, "c"),
            Some(CodeEvent::End {
                context_id: "c".into(),
                execution_count: Some(4),
                status: ExecutionStatus::Error
            })
        );
        assert_eq!(event_for("r1", b"not json", "c"), None);
    }

    #[test]
    fn secrets_are_masked_in_every_text_of_an_event_but_not_in_images() {
        let masker = SecretMasker::new([("TOKEN", "s3cr\"t")]);
        let error = mask_event(
            CodeEvent::Error {
                name: "E".into(),
                value: "got s3cr\"t".into(),
                traceback: vec!["line s3cr\"t".into()],
            },
            &masker,
        );
        let CodeEvent::Error {
            value, traceback, ..
        } = error
        else {
            panic!("an error stays an error");
        };
        assert_eq!(value, "got [masked:TOKEN]");
        assert_eq!(traceback, vec!["line [masked:TOKEN]".to_owned()]);
        let result = mask_event(
            CodeEvent::Result {
                data: BTreeMap::from([
                    ("text/plain".into(), serde_json::json!("'s3cr\"t'")),
                    (
                        "application/json".into(),
                        serde_json::json!({"k": "s3cr\"t"}),
                    ),
                    ("image/png".into(), serde_json::json!("s3cr\"t")),
                ]),
                is_main_result: true,
            },
            &masker,
        );
        let CodeEvent::Result { data, .. } = result else {
            panic!("a result stays a result");
        };
        assert_eq!(data["text/plain"], "'[masked:TOKEN]'");
        assert!(!data["application/json"].to_string().contains("s3cr"));
        assert_eq!(data["image/png"], "s3cr\"t", "image bytes are not text");
    }

    #[test]
    fn the_driver_is_handed_over_as_one_json_line() {
        let line = serde_json::Value::from(DRIVER).to_string();
        assert!(!line.contains('\n'));
        let back: String = serde_json::from_str(&line).unwrap();
        assert_eq!(back, DRIVER);
    }
}
