//! Running a command in a sandbox's runtime: start it lazily (I12), record the run (I22).

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use warren_backend::{Backend, BackendError, ExecOutcome, ExecRequest, OutputSink, RuntimeSpec};
use warren_core::SandboxId;
use warren_store::{NewRun, RunKind, RunOutcome, SandboxRecord, SandboxState, StateStore};

use crate::env::{masking_relay, CommandEnv};
use crate::metrics::FailureCause;
use crate::ownership::{PeerNode, Placement};
use crate::transitions::{refuse_unless_runnable, LifeEvent};
use crate::{FencePermit, Provisioner, ProvisionerError};

/// The code an owner answers a forwarded operation with when it no longer owns the
/// runtime ([`ProvisionerError::NotOwnerHere`]).
pub const NOT_OWNER_CODE: &str = "not_owner";

/// Whether a runtime operation may go to the runtime's owner elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A request from a client: forwarded to the owner when that is another node.
    ToOwner,
    /// A request another node forwarded here: run here or not at all.
    HereOnly,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramSpec {
    /// A shell command line, run with `/bin/sh -c`.
    Shell(String),
    /// A shell command line, run with `bash -c` (for bash syntax: arrays, `[[`, pipefail).
    Bash(String),
    /// A program and its arguments.
    Argv(Vec<String>),
}

impl ProgramSpec {
    pub(crate) fn argv(&self) -> Vec<String> {
        match self {
            Self::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
            Self::Bash(line) => vec!["bash".into(), "-c".into(), line.clone()],
            Self::Argv(argv) => argv.clone(),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Shell(line) | Self::Bash(line) => line.clone(),
            // serde_json cannot fail on a list of strings.
            Self::Argv(argv) => serde_json::to_string(argv).unwrap_or_default(),
        }
    }
}

/// One exec call as a transport received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecInput {
    /// What to run.
    pub program: ProgramSpec,
    /// Working directory as a virtual path; default: the workdir.
    pub cwd: Option<String>,
    /// Extra environment for this call.
    pub env: BTreeMap<String, String>,
    /// Timeout; default and maximum come from the configuration.
    pub timeout: Option<Duration>,
    /// Bytes for stdin.
    pub stdin: Vec<u8>,
    /// Who asked, for the run record (I22).
    pub requested_by: String,
}

/// The result of an exec, with its run record id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecReport {
    /// The run record's id.
    pub run_id: String,
    /// How the command ended.
    pub outcome: ExecOutcome,
}

impl Provisioner {
    /// Runs one command in the sandbox's runtime, starting the runtime if it is not running.
    /// With a `sink`, output also streams there as it arrives.
    ///
    /// If the caller stops waiting (its future is dropped: the client disconnected), the
    /// command's process tree is killed and the run is recorded as failed with reason
    /// `client_disconnected`; nothing keeps running for nobody (I24).
    pub async fn exec(
        &self,
        id: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
    ) -> Result<ExecReport, ProvisionerError> {
        self.exec_fenced(id, input, sink, FencePermit::unfenced())
            .await
    }

    /// [`Provisioner::exec`] under a permit from [`Provisioner::fence`] (I33). The start of
    /// the command is the acceptance point: the permit is held through the checks, the
    /// runtime's start and the opening of the run record, and let go once the command was
    /// handed to the runtime. Holding it for the whole run would let one long command keep
    /// every new holder from acquiring the guard; what a command does after it started is
    /// the holder's business, as its output is.
    pub async fn exec_fenced(
        &self,
        id: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
        permit: FencePermit,
    ) -> Result<ExecReport, ProvisionerError> {
        self.exec_routed(id, input, sink, permit, Route::ToOwner)
            .await
    }

    /// Runs a command another node forwarded here because this node owns the runtime:
    /// never forwarded again; answers [`ProvisionerError::NotOwnerHere`] when this node
    /// does not own it (any more), so the sender asks the store again.
    /// The sender's execution guard token comes along and is checked here, by the owner,
    /// so the command's start stays the acceptance point (I33) across the link.
    pub async fn exec_as_owner(
        &self,
        id: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
        permit: FencePermit,
    ) -> Result<ExecReport, ProvisionerError> {
        self.exec_routed(id, input, sink, permit, Route::HereOnly)
            .await
    }

    async fn exec_routed(
        &self,
        id: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
        permit: FencePermit,
        route: Route,
    ) -> Result<ExecReport, ProvisionerError> {
        let mut permit = Some(permit);
        if let ProgramSpec::Argv(argv) = &input.program {
            if argv.is_empty() {
                return Err(ProvisionerError::BadRequest("argv must not be empty"));
            }
        }
        for (name, value) in &input.env {
            warren_core::check_env_name(name)?;
            warren_core::check_env_value(name, value)?;
            self.refuse_token_in_env(name, value)?;
        }
        // Everything else a client sends toward the runtime is searched too (I13).
        for arg in input.program.argv() {
            self.refuse_token_in_command("command line", arg.as_bytes())?;
        }
        if let Some(cwd) = &input.cwd {
            self.refuse_token_in_command("working directory", cwd.as_bytes())?;
        }
        self.refuse_token_in_command("stdin", &input.stdin)?;
        let timeout = match input.timeout {
            None => self.config.default_exec_timeout,
            Some(t) if t.is_zero() => {
                return Err(ProvisionerError::BadRequest("timeout_s must be at least 1"))
            }
            Some(t) => t.min(self.config.max_exec_timeout),
        };
        // The runtime runs on one node (issue 14): a command for a runtime owned elsewhere
        // goes there whole, checked again and recorded by the owner. Where the owner is
        // remembered, it goes before any read of the store here: the owner reads the
        // sandbox and answers every refusal itself (a hop's worth of latency saved).
        let known = self.owner_fence(id).is_some();
        if !known && route == Route::ToOwner {
            self.refuse_if_fenced()?;
            if let Some(owner) = self.remembered_owner(id) {
                let fence = permit.take().and_then(|permit| permit.token());
                return self.forward_exec(&owner, id, input, sink, fence).await;
            }
        }
        let mut record = self.runnable(id).await?;
        let mut fence = match self.place_for(id, route).await? {
            Ok(fence) => fence,
            Err(owner) => {
                // The owner checks the token again when the command starts there.
                let fence = permit.take().and_then(|permit| permit.token());
                return self.forward_exec(&owner, id, input, sink, fence).await;
            }
        };
        if !known {
            // Claimed just now: a takeover marked the sandbox stopped after it was read.
            record = self.runnable(id).await?;
        }
        let forwardable = input.clone();
        let cwd = self.start_dir(&record, input.cwd.as_deref()).await?;
        // The call's own variables go over the uid's agent environment (I14).
        let CommandEnv { mut env, masker } = self.command_env(&record).await?;
        env.extend(input.env);
        let request = ExecRequest {
            argv: input.program.argv(),
            cwd: cwd.clone(),
            env,
            stdin: input.stdin,
            timeout,
            output_cap: self.config.output_cap,
        };
        let _running = self.command_running(id);
        let started = std::time::Instant::now();
        let mut moved = false;
        for attempt in 1..=2 {
            let started_run = match self.ensure_runtime(record.clone(), &fence).await {
                Ok(running) => {
                    record = running;
                    let run_id = uuid::Uuid::new_v4().to_string();
                    self.store
                        .start_run(&NewRun {
                            id: run_id.clone(),
                            sandbox_id: id.clone(),
                            generation: record.generation,
                            // The run record keeps the command line, not a secret typed into it.
                            command: String::from_utf8_lossy(
                                &masker.mask(input.program.describe().as_bytes()),
                            )
                            .into_owned(),
                            cwd: cwd.clone(),
                            requested_by: input.requested_by.clone(),
                            kind: RunKind::Exec,
                            tag: None,
                            pty: false,
                            owner: Some(fence.clone()),
                        })
                        .await
                        .map(|_| run_id)
                        .map_err(ProvisionerError::Store)
                }
                Err(error) => Err(error),
            };
            let run_id = match started_run {
                Ok(run_id) => run_id,
                // Another node took the runtime over since this one claimed it: the runtime
                // here is stale. Once, the command goes where the runtime is now.
                Err(ProvisionerError::Store(warren_store::StoreError::NotOwner { .. }))
                    if !moved =>
                {
                    moved = true;
                    self.drop_stale_runtime(id).await;
                    match self.place_for(id, route).await? {
                        Ok(here) => {
                            fence = here;
                            record = self.runnable(id).await?;
                            continue;
                        }
                        Err(owner) => {
                            let fence = permit.take().and_then(|permit| permit.token());
                            return self
                                .forward_exec(&owner, id, forwardable, sink, fence)
                                .await;
                        }
                    }
                }
                Err(error) => return Err(error),
            };
            let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
            let _cancel_on_drop = CancelOnDrop(Some(cancel));
            // Injected secrets never leave in output (I13): streamed chunks pass a masking
            // relay, the collected output is masked below.
            let (sink, relay) = match sink.clone() {
                Some(sink) if !masker.is_empty() => {
                    let (sink, relay) = masking_relay(sink, masker.clone());
                    (Some(sink), Some(relay))
                }
                other => (other, None),
            };
            // The task keeps the caller's span: its log lines carry the request and sandbox.
            let task = tokio::spawn(tracing::Instrument::in_current_span(run_and_record(
                self.backend.clone(),
                self.store.clone(),
                id.clone(),
                run_id.clone(),
                request.clone(),
                sink,
                cancelled,
            )));
            // Accepted: the command is on its way to the runtime.
            drop(permit.take());
            let result = task.await.map_err(ProvisionerError::Interrupted)?;
            if let Some(relay) = relay {
                // Every sender went with the task: the relay flushes what it held and ends.
                // Bounded, so a sender kept alive elsewhere cannot hold the answer back.
                let _ = tokio::time::timeout(Duration::from_secs(5), relay).await;
            }
            match result {
                // Starting and finishing the run recorded the sandbox's activity.
                Ok(mut outcome) => {
                    self.metrics.exec_finished(started.elapsed());
                    if !masker.is_empty() {
                        outcome.stdout = masker.mask(&outcome.stdout);
                        outcome.stderr = masker.mask(&outcome.stderr);
                    }
                    return Ok(ExecReport { run_id, outcome });
                }
                Err(RunError::Backend(BackendError::RuntimeNotFound { .. })) if attempt == 1 => {
                    self.metrics.failed(FailureCause::RuntimeLost);
                    // The runtime vanished (killed, host rebooted) before the command
                    // started: mark it stopped and start a fresh one.
                    tracing::warn!(sandbox = %id, "runtime lost; starting a new one");
                    record = self.mark_runtime_lost(&record).await?;
                }
                Err(RunError::Store(warren_store::StoreError::RunAlreadyFinished { .. })) => {
                    // The run's outcome was refused: another node took the runtime over
                    // while the command ran, and recorded the run as node_lost.
                    self.drop_stale_runtime(id).await;
                    return Err(ProvisionerError::Store(
                        warren_store::StoreError::NotOwner {
                            sandbox: id.clone(),
                            token: fence.token,
                        },
                    ));
                }
                Err(RunError::Backend(error)) => {
                    // A termination destroys the runtime under a running command (after its
                    // grace period): the connection to the runtime ends early. That is the
                    // caller's news, not a server failure.
                    if self.terminated_since(&record).await {
                        tracing::info!(sandbox = %id, %error, "the sandbox was terminated while a command ran");
                        return Err(ProvisionerError::TerminatedWhileRunning {
                            sandbox: id.clone(),
                        });
                    }
                    self.metrics.failed(FailureCause::Exec);
                    return Err(ProvisionerError::Backend(error));
                }
                Err(RunError::Store(error)) => {
                    self.metrics.failed(FailureCause::Store);
                    return Err(ProvisionerError::Store(error));
                }
            }
        }
        Err(ProvisionerError::Backend(BackendError::RuntimeNotFound {
            sandbox: id.clone(),
        }))
    }

    /// Whether the generation `seen` ran has been fenced or replaced since (or the sandbox
    /// removed): the termination fence, not the runtime, ended whatever ran in it.
    async fn terminated_since(&self, seen: &SandboxRecord) -> bool {
        match self.sandbox(&seen.id).await {
            Ok(current) => {
                current.generation != seen.generation
                    || matches!(
                        current.state,
                        SandboxState::Terminating | SandboxState::Terminated
                    )
            }
            Err(ProvisionerError::SandboxNotFound(_)) => true,
            Err(_) => false,
        }
    }

    /// Records that the running runtime of `seen` is gone, under the lifecycle lock: only
    /// a sandbox still running the same generation becomes stopped, so a termination that
    /// happened meanwhile is never undone (its fence holds).
    pub(crate) async fn mark_runtime_lost(
        &self,
        seen: &SandboxRecord,
    ) -> Result<SandboxRecord, ProvisionerError> {
        let lock = self.lifecycle_lock(&seen.id);
        let _guard = lock.lock().await;
        let current = self.sandbox(&seen.id).await?;
        refuse_unless_runnable(&current)?;
        if current.generation != seen.generation || current.state != SandboxState::Running {
            return Ok(current);
        }
        // Only the owner says its runtime is gone (issue 14).
        let Some(fence) = self.owner_fence(&seen.id) else {
            return Ok(current);
        };
        match self
            .advance(&current, LifeEvent::RuntimeLost, Some(&fence))
            .await?
        {
            Some(stopped) => Ok(stopped),
            // Moved meanwhile (paused, fenced): whatever did it is the news.
            None => self.sandbox(&seen.id).await,
        }
    }

    /// Where a runtime operation on `id` runs: `Ok` here under the fence, `Err` at the
    /// owner elsewhere; for an operation forwarded here, only here.
    pub(crate) async fn place_for(
        &self,
        id: &SandboxId,
        route: Route,
    ) -> Result<Result<warren_store::OwnerFence, PeerNode>, ProvisionerError> {
        match (self.place_runtime(id).await?, route) {
            (Placement::Here(fence), _) => Ok(Ok(fence)),
            (Placement::Elsewhere(owner), Route::ToOwner) => Ok(Err(owner)),
            (Placement::Elsewhere(_), Route::HereOnly) => Err(ProvisionerError::NotOwnerHere {
                sandbox: id.clone(),
            }),
        }
    }

    /// Sends the command to the node that owns the runtime, with the caller's sink; the
    /// owner records the run. Once, when the owner answers that it no longer owns the
    /// runtime (it gave it up meanwhile), the store is asked again.
    async fn forward_exec(
        &self,
        owner: &PeerNode,
        id: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
        fence: Option<crate::FenceToken>,
    ) -> Result<ExecReport, ProvisionerError> {
        let link = self.forwarding_to(owner, id)?;
        match link
            .exec(owner, id, input.clone(), sink.clone(), fence)
            .await
        {
            Err(error @ ProvisionerError::PeerUnreachable { .. }) => {
                // Ask the store next time: the owner may be gone, its runtime taken over.
                self.ownership.forget_owner(id);
                Err(error)
            }
            Err(ProvisionerError::Forwarded { code, .. }) if code == NOT_OWNER_CODE => {
                self.ownership.forget_owner(id);
                match self.place_runtime(id).await? {
                    Placement::Elsewhere(now) if now != *owner => {
                        link.exec(&now, id, input, sink, fence).await
                    }
                    Placement::Elsewhere(_) => Err(ProvisionerError::PeerUnreachable {
                        node: owner.node_id.clone(),
                        reason: "it does not own the runtime the store says it owns".into(),
                    }),
                    Placement::Here(_) => {
                        let permit = self.fence(id, fence).await?;
                        Box::pin(self.exec_as_owner(id, input, sink, permit)).await
                    }
                }
            }
            other => other,
        }
    }

    /// The sandbox, when a command may run in it now: its backend runs commands and no
    /// cleanup fence is up (I24).
    pub(crate) async fn runnable(&self, id: &SandboxId) -> Result<SandboxRecord, ProvisionerError> {
        let record = self.sandbox(id).await?;
        let kind = record.binding.backend;
        if !self
            .backend
            .capabilities_of(kind)
            .is_some_and(|capabilities| capabilities.exec)
        {
            return Err(ProvisionerError::ExecUnsupported {
                backend: kind.as_str(),
            });
        }
        refuse_unless_runnable(&record)?;
        Ok(record)
    }

    /// Starts the sandbox's runtime now unless it runs already, for transports whose
    /// clients expect a sandbox to be up before its first command (DeerFlow's readiness
    /// probe). Refused behind the cleanup fence, and on backends that cannot run commands.
    /// A runtime that runs on another node counts as started.
    pub async fn start_runtime(&self, id: &SandboxId) -> Result<SandboxRecord, ProvisionerError> {
        let record = self.runnable(id).await?;
        match self.place_runtime(id).await? {
            // Read after the claim: a takeover marks the sandbox stopped.
            Placement::Here(fence) => self.ensure_runtime(self.runnable(id).await?, &fence).await,
            Placement::Elsewhere(_) => Ok(record),
        }
    }

    /// Starts the runtime *on this node* for work that must run here (a persistent shell
    /// session lives in this process); refused when another node owns it.
    pub(crate) async fn start_runtime_here(
        &self,
        id: &SandboxId,
    ) -> Result<(SandboxRecord, warren_store::OwnerFence), ProvisionerError> {
        self.runnable(id).await?;
        match self.place_runtime(id).await? {
            Placement::Here(fence) => {
                let record = self.runnable(id).await?;
                Ok((self.ensure_runtime(record, &fence).await?, fence))
            }
            Placement::Elsewhere(owner) => Err(ProvisionerError::RuntimeElsewhere {
                sandbox: id.clone(),
                node: owner.node_id,
            }),
        }
    }

    /// Starts the sandbox's runtime unless it runs already (I12). Serialised per sandbox, so
    /// concurrent first execs start one runtime.
    pub(crate) async fn ensure_runtime(
        &self,
        record: SandboxRecord,
        fence: &warren_store::OwnerFence,
    ) -> Result<SandboxRecord, ProvisionerError> {
        if record.state == SandboxState::Running {
            return Ok(record);
        }
        let lock = self.lifecycle_lock(&record.id);
        let _guard = lock.lock().await;
        let record = self.sandbox(&record.id).await?;
        refuse_unless_runnable(&record)?;
        if record.state == SandboxState::Running {
            return Ok(record);
        }
        // A reaped runtime comes back as it was (I30); a damaged snapshot must not keep
        // the sandbox from running, so it starts cold then.
        let seed = match self.resume_seed(&record).await {
            Ok(seed) => seed,
            Err(error) => {
                tracing::warn!(sandbox = %record.id, %error, "cannot resume from the latest snapshot; starting fresh");
                None
            }
        };
        // What the layout mounts must exist, whatever the sandbox user removed since.
        self.prepare_layout(&record).await?;
        let (user_workspace, skill_projection) = self.mounts(&record);
        let (branch, frozen) = self.branch_view(&record).await?;
        // A sandbox made before a branch of its workdir does not start while it exists, on
        // a backend that cannot show the baseline read-only.
        self.refuse_writable_baseline(
            &record.uid,
            record.binding.backend,
            record.binding.layout,
            &record.binding.workdir,
            &frozen,
        )?;
        let spec = RuntimeSpec {
            sandbox: record.id.clone(),
            generation: record.generation,
            uid: record.uid.clone(),
            runtime_scope: record.runtime_scope.clone(),
            user_workspace,
            skill_projection,
            env: self.runtime_env(&record),
            seed: seed.clone(),
            branch,
            frozen,
            binding: record.binding.clone(),
        };
        let started = std::time::Instant::now();
        let created = self.backend.create(&spec).await;
        if let Some(seed) = seed {
            // Init copied it into the runtime's own layers; the seed itself is not needed.
            let _ = tokio::fs::remove_dir_all(seed).await;
        }
        if let Err(error) = created {
            self.metrics.failed(FailureCause::RuntimeStart);
            return Err(ProvisionerError::Backend(error));
        }
        self.metrics.runtime_started(started.elapsed());
        // A fence that went up while the runtime started did not see it: it goes here,
        // under the same lifecycle lock the fence takes (see `fence_self`).
        if self.is_fenced() {
            let _ = self.backend.destroy(&record.id).await;
            self.refuse_if_fenced()?;
        }
        let running = self.advance(&record, LifeEvent::Start, Some(fence)).await;
        match running {
            Ok(Some(running)) => {
                // Its trust store holds the sandbox's authority before any command runs.
                self.install_egress_authority(&running).await;
                Ok(running)
            }
            Err(ProvisionerError::Store(warren_store::StoreError::NotOwner { .. })) => {
                // Taken over while it started: the new owner runs the sandbox, not this one.
                let _ = self.backend.destroy(&record.id).await;
                self.ownership_lost(&record.id);
                Err(ProvisionerError::Backend(BackendError::RuntimeNotFound {
                    sandbox: record.id.clone(),
                }))
            }
            Err(error) => {
                let _ = self.backend.destroy(&record.id).await;
                Err(error)
            }
            Ok(None) => {
                // Paused or fenced while it started (by another replica): the runtime
                // goes, and the caller learns why.
                let _ = self.backend.destroy(&record.id).await;
                refuse_unless_runnable(&self.sandbox(&record.id).await?)?;
                Err(ProvisionerError::Backend(BackendError::RuntimeNotFound {
                    sandbox: record.id.clone(),
                }))
            }
        }
    }
}

/// Sends on drop: the exec task learns that its caller stopped waiting.
struct CancelOnDrop(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            let _ = cancel.send(());
        }
    }
}

pub(crate) enum RunError {
    Backend(BackendError),
    Store(warren_store::StoreError),
}

/// Runs the command and closes its run record, whatever happens (I22, I24). It runs as its
/// own task so the record is closed even when the caller goes away.
async fn run_and_record(
    backend: Arc<dyn Backend>,
    store: Arc<dyn StateStore>,
    sandbox: SandboxId,
    run_id: String,
    request: ExecRequest,
    sink: Option<OutputSink>,
    cancelled: tokio::sync::oneshot::Receiver<()>,
) -> Result<ExecOutcome, RunError> {
    let result = tokio::select! {
        result = backend.exec(&sandbox, &request, sink) => Some(result),
        // Dropping the backend's future closes its connection to the runtime, which kills
        // the command's process tree.
        Ok(()) = cancelled => None,
    };
    let failed = |reason: String| RunOutcome {
        exit_code: None,
        signal: None,
        timed_out: false,
        duration_ms: 0,
        cpu_user_ms: None,
        cpu_system_ms: None,
        peak_memory_bytes: None,
        failure: Some(reason),
    };
    let outcome = match &result {
        Some(Ok(outcome)) => RunOutcome {
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            timed_out: outcome.timed_out,
            duration_ms: duration_ms(outcome.duration),
            cpu_user_ms: outcome.usage.cpu_user_ms,
            cpu_system_ms: outcome.usage.cpu_system_ms,
            peak_memory_bytes: outcome.usage.peak_memory_bytes,
            failure: None,
        },
        Some(Err(error)) => failed(format!("backend_error: {error}")),
        None => failed("client_disconnected".to_owned()),
    };
    record_outcome(store.as_ref(), &run_id, &outcome).await?;
    match result {
        Some(Ok(outcome)) => Ok(outcome),
        Some(Err(error)) => Err(RunError::Backend(error)),
        None => Err(RunError::Backend(BackendError::Exec {
            sandbox,
            source: std::io::Error::other("the caller went away"),
        })),
    }
}

/// How long a finished command's outcome waits for a state store that is out of reach.
const RECORD_RETRY_FOR: Duration = Duration::from_secs(60);

/// Records a finished command's outcome (I22). The command has run, so its outcome is
/// worth waiting for: while the store is unavailable (a PostgreSQL server restarting) the
/// write is retried, with backoff, for [`RECORD_RETRY_FOR`]. Past that the run stays open
/// in the store and restart recovery closes it as failed; the caller gets 503.
pub(crate) async fn record_outcome(
    store: &dyn StateStore,
    run_id: &str,
    outcome: &RunOutcome,
) -> Result<(), RunError> {
    let deadline = tokio::time::Instant::now() + RECORD_RETRY_FOR;
    let mut pause = Duration::from_millis(50);
    let mut retried = false;
    loop {
        match store.finish_run(run_id, outcome).await {
            Ok(_) => return Ok(()),
            // The connection broke after an earlier attempt committed: recorded already.
            Err(warren_store::StoreError::RunAlreadyFinished { .. }) if retried => return Ok(()),
            Err(error) if error.is_unavailable() && tokio::time::Instant::now() < deadline => {
                tracing::warn!(run = run_id, %error, "the state store is out of reach; retrying the run's outcome");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
                retried = true;
            }
            Err(error) => return Err(RunError::Store(error)),
        }
    }
}

/// Records that a run failed before it ran (`reason`), as best it can: a run the store
/// cannot close now is closed as failed by restart recovery.
pub(crate) async fn record_failure(store: &dyn StateStore, run_id: &str, reason: &str) {
    let outcome = RunOutcome {
        failure: Some(reason.to_owned()),
        ..RunOutcome::default()
    };
    if let Err(RunError::Store(error)) = record_outcome(store, run_id, &outcome).await {
        tracing::warn!(run = run_id, %error, "could not record a run that did not start");
    }
}

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod start_tests;
