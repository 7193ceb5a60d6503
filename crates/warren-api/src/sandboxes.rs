//! `/v1/sandboxes`: sandbox identity, lifecycle and exec (I5, I12, I15, I22).

use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_core::{
    IsolationScope, IsolationTier, LayoutName, NetworkPolicy, RunContext, RuntimeScope, Uid,
};
use warren_protocol::{
    CreateSandbox, ExecCommand, ExecResult, ForkSandbox, ForkedSandboxes, GvisorHealth,
    NetworkSpec, OnDeadline, PausedSandbox, ResumeSandbox, SandboxInfo, SandboxIsolation,
    SandboxLayout, SandboxList, TerminateSandbox, UpdateSandbox,
};
use warren_provisioner::{
    Created, DeadlineAction, ExecInput, ExecReport, ProgramSpec, ProvisionerError, SandboxRequest,
    SettingsChange, DEFAULT_TERMINATE_GRACE,
};
use warren_store::SandboxRecord;

use crate::extract::{ApiJson, Fence, OptionalJson, SandboxPath};
use crate::{ApiError, ApiState};

/// The API's view of a sandbox; `gvisor` is the server's gVisor probe, whose limitations
/// a gVisor sandbox carries as its warnings (issue 19: reported, never silently dropped).
pub(crate) fn sandbox_info(record: &SandboxRecord, gvisor: &GvisorHealth) -> SandboxInfo {
    SandboxInfo {
        sandbox_id: record.id.to_string(),
        uid: record.uid.to_string(),
        runtime_scope_id: record.runtime_scope.to_string(),
        workdir: record.binding.workdir.to_string(),
        branch: record.binding.branch.as_ref().map(ToString::to_string),
        workdir_path: record
            .binding
            .layout
            .layout()
            .workdir_path(&record.binding.workdir),
        layout: match record.binding.layout {
            LayoutName::Ars => SandboxLayout::Ars,
            LayoutName::Deerflow => SandboxLayout::Deerflow,
            LayoutName::E2b => SandboxLayout::E2b,
        },
        isolation: match record.binding.isolation {
            IsolationTier::Kernel => SandboxIsolation::Kernel,
            IsolationTier::Gvisor => SandboxIsolation::Gvisor,
        },
        network: NetworkSpec {
            mode: record.binding.network.mode().to_owned(),
            allow: record.binding.network.allow().to_vec(),
            deny: record.binding.network.deny().to_vec(),
        },
        backend: record.binding.backend.as_str().to_owned(),
        image: record.binding.image.clone(),
        inherit_env: record.binding.inherit_env,
        ephemeral: record.binding.ephemeral,
        state: record.state.as_str().to_owned(),
        labels: record.settings.labels.clone(),
        deadline: record
            .settings
            .deadline
            .map(|deadline| deadline.to_rfc3339()),
        on_deadline: match record.settings.on_deadline {
            DeadlineAction::Terminate => OnDeadline::Terminate,
            DeadlineAction::Pause => OnDeadline::Pause,
        },
        generation: record.generation,
        created_at: record.created_at.to_rfc3339(),
        last_active_at: record.last_active_at.to_rfc3339(),
        warnings: match record.binding.isolation {
            IsolationTier::Kernel => Vec::new(),
            IsolationTier::Gvisor => gvisor.limitations.clone(),
        },
    }
}

fn network_policy(spec: NetworkSpec) -> Result<NetworkPolicy, ApiError> {
    let policy = match spec.mode.as_str() {
        "none" | "open" if !spec.allow.is_empty() => {
            return Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_network"),
                "`allow` is only meaningful with mode `allowlist`",
            ))
        }
        "none" if !spec.deny.is_empty() => {
            return Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_network"),
                "`deny` is meaningless with mode `none`, which refuses everything",
            ))
        }
        "none" => NetworkPolicy::None,
        "open" => NetworkPolicy::Open { deny: spec.deny },
        "allowlist" => NetworkPolicy::Allowlist {
            allow: spec.allow,
            deny: spec.deny,
        },
        other => {
            return Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_network"),
                format!("unknown network mode {other:?}; use none, open or allowlist"),
            ))
        }
    };
    Ok(policy)
}

fn invalid(error: warren_core::CoreError) -> ApiError {
    ProvisionerError::from(error).into()
}

/// The sandbox identity a create request names: explicit, or derived from an isolation
/// scope (I29). Mixing the two forms is refused rather than guessed at.
fn identity(request: &CreateSandbox) -> Result<(Uid, RuntimeScope), ApiError> {
    let refuse = |message: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            warren_protocol::code!(StatusCode::BAD_REQUEST.as_u16(), "invalid_request"),
            message.to_owned(),
        )
    };
    match &request.scope {
        None => {
            if request.user_id.is_some()
                || request.session_id.is_some()
                || request.agent_id.is_some()
            {
                return Err(refuse(
                    "user_id, session_id and agent_id go with \"scope\"; send a scope, or uid and runtime_scope_id",
                ));
            }
            let (Some(uid), Some(scope)) = (&request.uid, &request.runtime_scope_id) else {
                return Err(refuse(
                    "send uid and runtime_scope_id, or a scope (user, session, agent, global) with its ids",
                ));
            };
            Ok((
                crate::extract::uid(uid.clone())?,
                RuntimeScope::new(scope.as_str()).map_err(invalid)?,
            ))
        }
        Some(scope) => {
            if request.uid.is_some() || request.runtime_scope_id.is_some() {
                return Err(refuse(
                    "\"scope\" derives uid and runtime_scope_id; send one form, not both",
                ));
            }
            let derived = IsolationScope::parse(scope)
                .and_then(|scope| {
                    scope.derive(RunContext {
                        user_id: request.user_id.as_deref(),
                        session_id: request.session_id.as_deref(),
                        agent_id: request.agent_id.as_deref(),
                    })
                })
                .map_err(invalid)?;
            Ok((derived.uid, derived.runtime_scope))
        }
    }
}

/// Finds or creates the sandbox of (uid, runtime scope). No runtime starts (I12).
#[utoipa::path(
    post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    responses(
        (status = 201, body = SandboxInfo, description = "Created"),
        (status = 200, body = SandboxInfo, description = "Exists with this identity"),
        (status = 404, body = warren_protocol::ErrorBody, description = "workdir_not_found"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request, invalid_uid, invalid_scope, invalid_network, invalid_image; reserved_uid: a uid named directly may not start with session:, agent: or global:"),
        (status = 409, body = warren_protocol::ErrorBody, description = "workdir_conflict, network_conflict, env_policy_conflict, backend_conflict, layout_conflict or isolation_conflict: the live sandbox is bound otherwise; sandbox_terminating: its labels or deadline cannot change now"),
        (status = 422, body = warren_protocol::ErrorBody, description = "image_not_found: the image (named, or the server's default) is not on the Docker host; warren never pulls. isolation_unavailable: the sandbox's backend cannot run the gvisor tier on this server. host_mounts_unsupported: the backend (kubernetes) cannot mount an ephemeral sandbox's scratch tree or extra mounts"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    ApiJson(request): ApiJson<CreateSandbox>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let (uid, scope) = identity(&request)?;
    // Known before anything happens, so every line of this request carries it.
    tracing::Span::current().record(
        "sandbox",
        tracing::field::display(warren_core::SandboxId::derive(&uid, &scope)),
    );
    // Absent: the server's default policy, which the provisioner applies.
    let network = request.network.map(network_policy).transpose()?;
    let secrets = crate::secrets::new_secrets(request.secrets)?;
    let (record, created) = state
        .provisioner
        .create_sandbox(SandboxRequest {
            workdir: request.workdir,
            branch: request.branch,
            network,
            inherit_env: request.inherit_env.unwrap_or(true),
            ephemeral: request.ephemeral,
            from_snapshot: request.from_snapshot,
            backend: request.backend,
            image: request.image,
            layout: request.layout.map(|layout| match layout {
                SandboxLayout::Ars => LayoutName::Ars,
                SandboxLayout::Deerflow => LayoutName::Deerflow,
                SandboxLayout::E2b => LayoutName::E2b,
            }),
            isolation: request.isolation.map(|isolation| match isolation {
                SandboxIsolation::Kernel => IsolationTier::Kernel,
                SandboxIsolation::Gvisor => IsolationTier::Gvisor,
            }),
            settings: SettingsChange {
                labels: request.labels,
                timeout: request
                    .timeout_s
                    .map(|seconds| Some(Duration::from_secs(seconds))),
                on_deadline: request.on_deadline.map(deadline_action),
            },
            secrets,
            ..SandboxRequest::new(uid, scope)
        })
        .await?;
    let status = match created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    Ok((status, Json(sandbox_info(&record, &state.gvisor))))
}

fn deadline_action(action: OnDeadline) -> DeadlineAction {
    match action {
        OnDeadline::Terminate => DeadlineAction::Terminate,
        OnDeadline::Pause => DeadlineAction::Pause,
    }
}

/// The query of `GET /v1/sandboxes`, for the document only: [`list`] reads it itself,
/// as `label` may repeat.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct ListQuery {
    /// Only this user's sandboxes.
    uid: Option<String>,
    /// Only sandboxes carrying this label, as `key=value` (percent-encoded); repeat it for
    /// sandboxes carrying every one given.
    #[param(style = Form, explode)]
    label: Option<Vec<String>>,
    /// Only sandboxes in this state.
    state: Option<String>,
}

/// Lists sandboxes, optionally of one user, in one state, or carrying labels.
#[utoipa::path(
    get, path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses(
        (status = 200, body = SandboxList),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_query: a label filter that is not key=value, or an unknown state"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<SandboxList>, ApiError> {
    let invalid = |message: String| {
        ApiError::bad_request(warren_protocol::code!(400, "invalid_query"), message)
    };
    let mut uid = None;
    let mut wanted_state = None;
    let mut labels = Vec::new();
    for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*key {
            "uid" => uid = Some(crate::extract::uid(value.into_owned())?),
            "state" => {
                wanted_state = Some(
                    value
                        .parse::<warren_store::SandboxState>()
                        .map_err(|error| invalid(error.to_string()))?,
                )
            }
            "label" => {
                let (name, wanted) = value
                    .split_once('=')
                    .ok_or_else(|| invalid(format!("label {value:?} is not key=value")))?;
                labels.push((name.to_owned(), wanted.to_owned()));
            }
            // As before `label` and `state` existed: other parameters are ignored.
            _ => {}
        }
    }
    let records = state.provisioner.list_sandboxes(uid.as_ref()).await?;
    Ok(Json(SandboxList {
        sandboxes: records
            .iter()
            .filter(|record| wanted_state.is_none_or(|wanted| record.state == wanted))
            .filter(|record| {
                labels
                    .iter()
                    .all(|(name, wanted)| record.settings.labels.get(name) == Some(wanted))
            })
            .map(|record| sandbox_info(record, &state.gvisor))
            .collect(),
    }))
}

/// One sandbox.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = warren_protocol::ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(sandbox_info(
        &state.provisioner.sandbox(&id).await?,
        &state.gvisor,
    )))
}

/// Changes a sandbox's deadline or labels; what the body leaves out stays.
#[utoipa::path(
    patch, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = UpdateSandbox,
    responses(
        (status = 200, body = SandboxInfo),
        (status = 404, body = warren_protocol::ErrorBody),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_terminating, sandbox_terminated"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn update(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<UpdateSandbox>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let _permit = state.provisioner.fence(&id, fence).await?;
    let change = SettingsChange {
        labels: request.labels,
        timeout: request
            .timeout_s
            .map(|seconds| seconds.map(Duration::from_secs)),
        on_deadline: request.on_deadline.map(deadline_action),
    };
    let record = state.provisioner.update_settings(&id, change).await?;
    Ok(Json(sandbox_info(&record, &state.gvisor)))
}

/// Pauses the sandbox: nothing runs in it until it is resumed. Its runtime, if one runs,
/// is snapshotted and ended: running processes end and memory is not kept; files and
/// installed packages are, and the runtime a resume starts comes back with them.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = PausedSandbox),
        (status = 404, body = warren_protocol::ErrorBody),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_state_conflict: paused already; sandbox_terminating, sandbox_terminated"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
) -> Result<Json<PausedSandbox>, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let paused = state.provisioner.pause_sandbox(&id).await?;
    Ok(Json(PausedSandbox {
        sandbox: sandbox_info(&paused.record, &state.gvisor),
        processes_ended: paused.runtime_ended,
        runtime_snapshot: paused.snapshot,
        snapshot_error: paused.snapshot_error,
    }))
}

/// Forks the sandbox: `count` new sandboxes of the same uid, each starting from the
/// source's runtime state (installed packages, the home) as a runtime snapshot taken now
/// records it, with its workdir on a new branch of the source's, so forks never write into
/// each other or the source. The source moves onto a branch of its own. Memory and running
/// processes are not forked: a running source is paused and resumed for it (its processes
/// end, as at a pause).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/fork", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = Option<ForkSandbox>),
    responses(
        (status = 201, body = ForkedSandboxes),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request: count out of 1..20, an ephemeral sandbox"),
        (status = 404, body = warren_protocol::ErrorBody),
        (status = 409, body = warren_protocol::ErrorBody, description = "workdir_in_use: another running sandbox can write the workdir; branch_in_use; sandbox_terminated"),
        (status = 422, body = warren_protocol::ErrorBody, description = "branches_unsupported"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn fork(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    OptionalJson(request): OptionalJson<ForkSandbox>,
) -> Result<(StatusCode, Json<ForkedSandboxes>), ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let count = usize::try_from(request.count.unwrap_or(1)).unwrap_or(usize::MAX);
    let settings = SettingsChange {
        labels: request.labels,
        timeout: request
            .timeout_s
            .map(|seconds| Some(Duration::from_secs(seconds))),
        on_deadline: None,
    };
    let forked = state.provisioner.fork_sandbox(&id, count, settings).await?;
    Ok((
        StatusCode::CREATED,
        Json(ForkedSandboxes {
            source: sandbox_info(&forked.source, &state.gvisor),
            forks: forked
                .forks
                .iter()
                .map(|fork| sandbox_info(fork, &state.gvisor))
                .collect(),
            snapshot_id: forked.snapshot,
            not_forked: "memory and running processes: the runtime is a process tree, not a \
                         VM; the source's running processes ended, as at a pause"
                .to_owned(),
        }),
    ))
}

/// Resumes a paused sandbox and starts its runtime from the pause's snapshot.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = Option<ResumeSandbox>),
    responses(
        (status = 200, body = SandboxInfo),
        (status = 404, body = warren_protocol::ErrorBody),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_state_conflict: not paused; sandbox_terminating, sandbox_terminated"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn resume(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    OptionalJson(request): OptionalJson<ResumeSandbox>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let _permit = state.provisioner.fence(&id, fence).await?;
    let change = SettingsChange {
        timeout: request
            .timeout_s
            .map(|seconds| Some(Duration::from_secs(seconds))),
        ..SettingsChange::default()
    };
    let record = state.provisioner.resume_sandbox(&id, change).await?;
    Ok(Json(sandbox_info(&record, &state.gvisor)))
}

/// Terminates the sandbox at once: running commands are killed with its runtime;
/// workspace files stay (I15). `POST .../terminate` is the same with a grace period.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SandboxInfo, description = "Terminated"), (status = 404, body = warren_protocol::ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
) -> Result<Json<SandboxInfo>, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    Ok(Json(sandbox_info(
        &state
            .provisioner
            .terminate_sandbox(&id, Duration::ZERO)
            .await?,
        &state.gvisor,
    )))
}

/// Terminates the sandbox when its root run has ended (I24): new execs and leases are
/// refused with 409 `sandbox_terminating` at once, running commands get `grace_s` to
/// finish, then the runtime is destroyed. Workspace files stay (I15); a later create of
/// the same identity starts a new generation.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/terminate", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = Option<TerminateSandbox>),
    responses(
        (status = 200, body = SandboxInfo, description = "Terminated"),
        (status = 404, body = warren_protocol::ErrorBody),
        (status = 400, body = warren_protocol::ErrorBody, description = "grace_s out of range"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn terminate(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    OptionalJson(request): OptionalJson<TerminateSandbox>,
) -> Result<Json<SandboxInfo>, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let grace = request
        .grace_s
        .map_or(DEFAULT_TERMINATE_GRACE, Duration::from_secs);
    Ok(Json(sandbox_info(
        &state.provisioner.terminate_sandbox(&id, grace).await?,
        &state.gvisor,
    )))
}

/// Kills every process of the sandbox but its runtime's own (init, or a container's
/// agent): running commands, which end by SIGKILL, and whatever they left running in the
/// background, such as a fork bomb holding the process limit. The sandbox, its runtime and
/// its files stay; the next exec runs in the same runtime. No body is read.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/kill", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = warren_protocol::KilledProcesses, description = "Every process but the runtime's own is gone; `killed` says how many there were"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_sandbox_id"),
        (status = 401, body = warren_protocol::ErrorBody, description = "unauthorized: no Bearer token, or not this server's"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_terminating, sandbox_terminated: its runtime is being or has been destroyed"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn kill(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
) -> Result<Json<warren_protocol::KilledProcesses>, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let killed = state.provisioner.kill_processes(&id).await?;
    Ok(Json(warren_protocol::KilledProcesses {
        sandbox_id: id.to_string(),
        killed,
    }))
}

/// Runs a command in the sandbox's runtime, starting it on first use (I12), and records
/// the run (I22). With `Accept: application/x-ndjson` or `text/event-stream` the answer
/// streams [`warren_protocol::ExecEvent`]s as output arrives; a client that disconnects
/// mid-stream has the command's process tree killed.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecCommand,
    responses(
        (status = 200, body = ExecResult, description = "The result (JSON), or a stream of ExecEvent (NDJSON / SSE)"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request, invalid_env, invalid_cwd; token_in_env or token_in_command: a value (env, command line, cwd, stdin) contains the provisioner token, raw, percent-encoded or base64 (I13)"),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_terminated (also when the sandbox is terminated while the command runs), sandbox_terminating"),
        (status = 501, body = warren_protocol::ErrorBody, description = "exec_not_supported by this backend"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn exec(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ExecCommand>,
) -> Result<Response, ApiError> {
    let program = program_spec(request.command, request.argv, request.shell.as_deref())?;
    let requested_by = requested_by(&headers);
    let input = ExecInput {
        program,
        cwd: request.cwd,
        env: request.env,
        timeout: request.timeout_s.map(Duration::from_secs),
        stdin: request.stdin.unwrap_or_default().into_bytes(),
        requested_by,
    };
    // Checked before any answer starts, so a stale token is a 409 even for a stream; the
    // start of the command is the acceptance point (`Provisioner::exec_fenced`).
    let permit = state.provisioner.fence(&id, fence).await?;
    match crate::stream::StreamFormat::from_accept(&headers) {
        Some(format) => Ok(crate::stream::exec_stream(state, id, input, format, permit)),
        None => {
            let report = state
                .provisioner
                .exec_fenced(&id, input, None, permit)
                .await?;
            Ok(Json(exec_result(report)).into_response())
        }
    }
}

/// What to run: exactly one of a shell line (`command`, in `shell`) and an argv.
pub(crate) fn program_spec(
    command: Option<String>,
    argv: Option<Vec<String>>,
    shell: Option<&str>,
) -> Result<ProgramSpec, ApiError> {
    match (command, argv) {
        (Some(command), None) => match shell {
            None | Some("sh") => Ok(ProgramSpec::Shell(command)),
            Some("bash") => Ok(ProgramSpec::Bash(command)),
            Some(other) => Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_request"),
                format!("unknown shell {other:?}: use \"sh\" or \"bash\""),
            )),
        },
        (None, Some(argv)) => Ok(ProgramSpec::Argv(argv)),
        _ => Err(ApiError::bad_request(
            warren_protocol::code!(400, "invalid_request"),
            "give exactly one of `command` (a shell line) and `argv` (a program and its arguments)",
        )),
    }
}

/// Who asks, for a run record (I22): `X-Warren-Requested-By`, else `api`.
pub(crate) fn requested_by(headers: &HeaderMap) -> String {
    headers
        .get("x-warren-requested-by")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| "api".to_owned(), |v| v.chars().take(256).collect())
}

pub(crate) fn exec_result(report: ExecReport) -> ExecResult {
    let outcome = report.outcome;
    ExecResult {
        run_id: report.run_id,
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        stdout: String::from_utf8_lossy(&outcome.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&outcome.stderr).into_owned(),
        truncated: outcome.truncated,
        timed_out: outcome.timed_out,
        duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
    }
}
