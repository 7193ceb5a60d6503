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
//! to its `end` ([`driver`] parses the lines, [`execution`] follows them). A context is a quiet process: an idle kernel is no activity for the
//! reaper, and an execution holds the sandbox busy while it runs.

mod driver;
mod execution;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use warren_core::SandboxId;

pub use warren_protocol::{CodeEvent, ExecutionStatus};

use warren_store::{NewRun, RunKind};

use driver::{first_line, DriverEvent};
use execution::Execution;

use crate::processes::{ProcessInfo, ProcessState, StartProcess};
use crate::{FencePermit, Provisioner, ProvisionerError};

/// The driver each context runs (Python, on `jupyter_client`).
pub const DRIVER: &str = include_str!("driver.py");
/// The driver's command line: it reads its program, a JSON string, from its first line of
/// stdin.
const BOOT: &str =
    "import sys,json;exec(compile(json.loads(sys.stdin.readline()),'warren-code','exec'))";
/// Languages a context may have, each with the Jupyter kernel that runs it: Python's
/// ipykernel, and bash_kernel where the image has it.
pub const LANGUAGES: &[(&str, &str)] = &[("python", "python3"), ("bash", "bash")];
/// The variable that tells the driver its kernel (the driver takes it out of its own
/// environment, so the kernel never sees it).
const KERNEL_ENV: &str = "WARREN_CODE_KERNEL";
/// The id of Python's default context, the one an execution naming neither a context nor
/// another language runs in; another language's is `default-<language>` ([`default_context_id`]).
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
    env.remove(KERNEL_ENV);
    env
}

/// The language asked for, checked; default `python`.
pub fn check_language(language: Option<&str>) -> Result<&'static str, ProvisionerError> {
    let asked = language.unwrap_or("python");
    let asked = if asked == "python3" { "python" } else { asked };
    LANGUAGES
        .iter()
        .find(|(known, _)| *known == asked)
        .map(|(known, _)| *known)
        .ok_or_else(|| ProvisionerError::UnsupportedLanguage {
            language: asked.to_owned(),
        })
}

/// The id of a language's default context: `default` for Python, `default-bash` for bash.
pub fn default_context_id(language: &str) -> String {
    if language == "python" {
        DEFAULT_CONTEXT.to_owned()
    } else {
        format!("{DEFAULT_CONTEXT}-{language}")
    }
}

/// The Jupyter kernel of a language [`check_language`] accepted.
fn kernel_of(language: &str) -> &'static str {
    LANGUAGES
        .iter()
        .find(|(known, _)| *known == language)
        .map_or("python3", |(_, kernel)| *kernel)
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
        // One creator at a time per sandbox on this node: two creates of one id make one.
        let lock = self.code_creation_lock(id);
        let _creating = lock.lock().await;
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
        process_env.insert(KERNEL_ENV.to_owned(), kernel_of(language).to_owned());
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
            match self.write_stdin(id, pid, &program, false).await {
                // Ended before it read its program (a python that cannot start): its
                // output and exit say why, as for a driver that ends later.
                Ok(_)
                | Err(ProvisionerError::ProcessStdinClosed { .. })
                | Err(ProvisionerError::ProcessEnded { .. }) => {}
                Err(other) => return Err(other),
            }
            first_line(output).await
        };
        let unavailable = |reason: String| ProvisionerError::CodeInterpreterUnavailable { reason };
        let failed = match tokio::time::timeout(READY_TIMEOUT, ready).await {
            Ok(Ok(line)) => match serde_json::from_slice::<DriverEvent>(&line) {
                Ok(event) if event.t == "ready" => None,
                // `unavailable`: what the image lacks.
                Ok(event) => Some(unavailable(event.message.unwrap_or(event.t))),
                Err(_) => Some(unavailable(
                    String::from_utf8_lossy(&line).trim().to_owned(),
                )),
            },
            // The driver ended first (`first_line` says why), or the runtime went away.
            Ok(Err(error)) => Some(error),
            Err(_) => Some(unavailable("the driver did not start in time".to_owned())),
        };
        if let Some(error) = failed {
            let _ = self.kill_process(id, pid).await;
            return Err(error);
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

    /// The context `input.id` names, made from `input` when it does not exist; whether it
    /// was made here. Two callers naming one new context get the one context: the second
    /// finds what the first made.
    pub async fn code_context_or_create(
        &self,
        id: &SandboxId,
        input: NewContext,
        permit: FencePermit,
    ) -> Result<(CodeContext, bool), ProvisionerError> {
        let Some(context) = input.id.clone() else {
            return Ok((self.create_code_context(id, input, permit).await?, true));
        };
        match self.code_context(id, &context).await {
            Ok(found) => return Ok((found, false)),
            Err(ProvisionerError::CodeContextNotFound { .. }) => {}
            Err(other) => return Err(other),
        }
        match self.create_code_context(id, input, permit).await {
            Ok(made) => Ok((made, true)),
            // Made by a request that came meanwhile.
            Err(ProvisionerError::CodeContextExists { .. }) => {
                Ok((self.code_context(id, &context).await?, false))
            }
            Err(other) => Err(other),
        }
    }

    /// Removes every code context of the sandbox (their kernels end); how many went. One
    /// gone meanwhile is not counted and is no error.
    pub async fn remove_code_contexts(&self, id: &SandboxId) -> Result<usize, ProvisionerError> {
        let mut removed = 0;
        for context in self.code_contexts(id).await? {
            match self.kill_process(id, context.pid).await {
                Ok(_) => removed += 1,
                Err(ProvisionerError::ProcessNotFound { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(removed)
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
            recorded: false,
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
            .find(|c| c.id == default_context_id(language) && c.language == language)
        {
            return Ok(found);
        }
        self.start_driver(
            id,
            language,
            &default_context_id(language),
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
        assert_eq!(check_language(Some("bash")).unwrap(), "bash");
        assert_eq!(kernel_of("python"), "python3");
        assert_eq!(kernel_of("bash"), "bash");
        let refused = check_language(Some("cobol")).unwrap_err();
        assert!(refused.to_string().contains("cobol"), "{refused}");
    }

    #[test]
    fn the_driver_is_handed_over_as_one_json_line() {
        let line = serde_json::Value::from(DRIVER).to_string();
        assert!(!line.contains('\n'));
        let back: String = serde_json::from_str(&line).unwrap();
        assert_eq!(back, DRIVER);
    }
}
