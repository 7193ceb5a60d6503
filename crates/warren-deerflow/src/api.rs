//! DeerFlow's provisioner API (`provisioner_url` = `http://<warren>/deerflow`), as its
//! remote sandbox backend calls it (contract §5).
//!
//! DeerFlow names sandboxes with ids of its own (`sha256("{user_id}:{thread_id}")[:8]`);
//! each is recorded as an alias of warren's sandbox of (uid = `user_id`, runtime scope =
//! `thread_id`) in the state store, so every replica resolves it the same way. An alias
//! never moves: two DeerFlow identities whose ids collide are refused (409), never given
//! each other's sandbox.

use std::path::{Component, Path};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use warren_core::{ExtraMount, LayoutName, RuntimeScope, SandboxId, Uid};
use warren_provisioner::{ErrorKind, FenceToken, ProvisionerError, SandboxRequest, FENCE_HEADER};
use warren_store::{SandboxRecord, SandboxState};

use crate::{Shared, ALIAS_NAMESPACE};

/// Most extra mounts one create may ask for (DeerFlow's reference server's limit).
const MAX_EXTRA_MOUNTS: usize = warren_core::MAX_EXTRA_MOUNTS;
/// The mount contract DeerFlow's newest revision checks for: `/mnt/user-data` is the
/// thread's `user-data`, the skills are read-only beside it.
const MOUNT_CONTRACT_VERSION: u32 = 2;

/// The provisioner API's routes, relative to `/deerflow`.
pub(crate) fn routes(shared: Shared) -> Router {
    let api = Router::new()
        .route("/api/capabilities", get(capabilities))
        .route("/api/sandboxes", get(list).post(create))
        .route("/api/sandboxes/{sandbox_id}", get(status).delete(delete))
        .route_layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(api)
        .with_state(shared)
}

/// A refused or failed provisioner call: DeerFlow reads `detail` (FastAPI's shape) and
/// only the status; warren's own clients get the usual `error` object beside it.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    fn not_found(sandbox_id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "sandbox_not_found",
            format!("Sandbox '{sandbox_id}' not found"),
        )
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({
                "detail": self.message,
                "error": {"code": self.code, "message": self.message},
            })),
        )
            .into_response()
    }
}

impl From<ProvisionerError> for Failure {
    fn from(error: ProvisionerError) -> Self {
        let status = crate::status_of(&error);
        let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
            StatusCode::BAD_REQUEST
        } else {
            status
        };
        let code = match &error {
            ProvisionerError::LayoutConflict { .. } => "layout_conflict",
            ProvisionerError::ExtraMountsConflict { .. } => "extra_mounts_conflict",
            ProvisionerError::ExtraMountSource { .. } => "extra_mount_unusable",
            ProvisionerError::Invalid(warren_core::CoreError::InvalidExtraMount { .. }) => {
                "invalid_extra_mounts"
            }
            ProvisionerError::WorkdirConflict { .. } => "workdir_conflict",
            ProvisionerError::SandboxTerminated { .. } => "sandbox_terminating",
            ProvisionerError::FenceStale { .. } => "fence_stale",
            ProvisionerError::FenceInvalid { .. } => "fence_invalid",
            other => generic_code(other.kind()),
        };
        Self::new(status, code, crate::public_message(&error))
    }
}

/// DeerFlow's code for an error it has no code of its own for, by its kind (every kind
/// named, so a new one is mapped on purpose): the server's own failures are `internal`, a
/// state that forbids the call `conflict`, and every other refusal `invalid_request`.
fn generic_code(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Conflict => "conflict",
        ErrorKind::InsufficientStorage
        | ErrorKind::Unsupported
        | ErrorKind::Unavailable
        | ErrorKind::BadGateway
        | ErrorKind::Internal => "internal",
        ErrorKind::Invalid
        | ErrorKind::Unprocessable
        | ErrorKind::Forbidden
        | ErrorKind::NotFound
        | ErrorKind::PreconditionFailed
        | ErrorKind::TooLarge
        | ErrorKind::RangeNotSatisfiable
        | ErrorKind::TooMany => "invalid_request",
    }
}

/// `X-API-Key` must be the configured key (compared in constant time); anything else is
/// 401. No other credential is accepted here, the provisioner token included: DeerFlow
/// holds a key of its own (I13).
async fn require_api_key(
    State(shared): State<Shared>,
    request: Request,
    next: Next,
) -> Result<Response, Failure> {
    let presented = request.headers().get("x-api-key").map(|v| v.as_bytes());
    match presented {
        Some(key) if shared.config.api_key.matches(key) => Ok(next.run(request).await),
        _ => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized: send the key of [deerflow] api_key as X-API-Key",
        )),
    }
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn capabilities() -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "lark_cli_init_image": false,
        "lark_cli_broker_image": false,
        "mount_contract_version": MOUNT_CONTRACT_VERSION,
    }))
}

/// `POST /api/sandboxes`: every key DeerFlow's revisions send; unknown keys are ignored
/// and `null` is absent.
#[derive(Debug, Deserialize)]
pub(crate) struct CreateSandbox {
    sandbox_id: Option<String>,
    thread_id: Option<String>,
    user_id: Option<String>,
    #[allow(dead_code)] // accepted for compatibility; the reference server ignores it too
    include_legacy_skills: Option<bool>,
    provision_lark_cli_runtime: Option<bool>,
    provision_lark_cli_broker: Option<bool>,
    extra_mounts: Option<Vec<ExtraMountRequest>>,
}

/// One entry of `extra_mounts`, as DeerFlow sends it.
#[derive(Debug, Deserialize)]
pub(crate) struct ExtraMountRequest {
    host_path: Option<String>,
    container_path: Option<String>,
    read_only: Option<bool>,
}

/// What every answer about one sandbox carries (contract §5.5: the mount-contract
/// revision checks all six).
#[derive(Debug, Serialize)]
struct SandboxAnswer {
    sandbox_id: String,
    sandbox_url: String,
    status: &'static str,
    user_id: String,
    thread_id: String,
    mount_contract_version: u32,
}

/// `^[A-Za-z0-9_-]{1,max}$`: DeerFlow's own patterns for thread and user ids (and what its
/// sandbox ids, 8 hex digits, always match).
fn check_id(field: &str, value: &str, max: usize) -> Result<(), Failure> {
    let valid = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(Failure::bad_request(
            "invalid_request",
            format!("{field} must be 1 to {max} letters, digits, '_' or '-'"),
        ))
    }
}

/// The body, parsed leniently (any content type) and refused with 400, never 422.
fn parse_body(body: &[u8]) -> Result<CreateSandbox, Failure> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        Failure::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    if !value.is_object() {
        return Err(Failure::bad_request(
            "invalid_json",
            "the body must be a JSON object",
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| Failure::bad_request("invalid_json", format!("invalid request: {e}")))
}

async fn create(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<SandboxAnswer>, Failure> {
    let request = parse_body(&body)?;
    let sandbox_id = request
        .sandbox_id
        .ok_or_else(|| Failure::bad_request("invalid_request", "sandbox_id is required"))?;
    check_id("sandbox_id", &sandbox_id, 64)?;
    let user_id = request.user_id.unwrap_or_else(|| "default".to_owned());
    check_id("user_id", &user_id, 128)?;
    // No thread: the sandbox is its own thread, as in DeerFlow's reference server.
    let thread_id = request.thread_id.unwrap_or_else(|| sandbox_id.clone());
    check_id("thread_id", &thread_id, 64)?;
    if request.provision_lark_cli_runtime == Some(true)
        || request.provision_lark_cli_broker == Some(true)
    {
        return Err(Failure::bad_request(
            "lark_cli_unsupported",
            "this provisioner has no Lark CLI images (GET /api/capabilities says so); \
             create the sandbox without provision_lark_cli_runtime/broker",
        ));
    }
    let extra_mounts = check_extra_mounts(
        &shared.config,
        request.extra_mounts.as_deref().unwrap_or(&[]),
    )?;
    let base = base_url(&shared, &headers)?;

    let uid = Uid::new(user_id.clone()).map_err(ProvisionerError::from)?;
    let scope = RuntimeScope::new(thread_id.clone()).map_err(ProvisionerError::from)?;
    let id = SandboxId::derive(&uid, &scope);
    // An id DeerFlow already gave another identity is refused before anything is made.
    if let Some(alias) = shared.aliases_get(&sandbox_id).await? {
        if alias != id {
            return Err(alias_conflict(&sandbox_id));
        }
    }
    // DeerFlow's own shape: users/{user_id}/threads/{thread_id}/user-data, the UserWorkspace
    // being the user's directory.
    let workdir = format!("threads/{thread_id}/user-data");
    let provisioner = &shared.provisioner;
    provisioner.create_workdir(&uid, Some(&workdir)).await?;
    let mut sandbox = SandboxRequest::new(uid, scope);
    sandbox.workdir = Some(workdir);
    sandbox.layout = Some(LayoutName::Deerflow);
    // Exactly what this request names: a live sandbox made with other mounts is a
    // conflict (409), never silently kept or changed.
    sandbox.extra_mounts = Some(extra_mounts);
    sandbox.network = shared.config.network.clone();
    let (record, _) = provisioner.create_sandbox(sandbox).await?;
    shared.aliases_put(&sandbox_id, &record.id).await?;
    // DeerFlow polls `{sandbox_url}/v1/sandbox` next and expects `Running` from then on:
    // the runtime starts now, not at the first command (the one exception to I12, made by
    // the client's contract).
    let record = provisioner.start_runtime(&record.id).await?;
    Ok(Json(answer(&shared, &base, &sandbox_id, &record)))
}

pub(crate) fn alias_conflict(sandbox_id: &str) -> Failure {
    Failure::new(
        StatusCode::CONFLICT,
        "sandbox_id_conflict",
        format!(
            "sandbox_id {sandbox_id:?} already names the sandbox of another user_id/thread_id; \
             DeerFlow ids are 8 hex digits and this one collided"
        ),
    )
}

/// The URL prefix sandbox URLs start with.
fn base_url(shared: &Shared, headers: &HeaderMap) -> Result<String, Failure> {
    if let Some(base) = &shared.config.sandbox_base_url {
        return Ok(base.clone());
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|host| {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
        })
        .ok_or_else(|| {
            Failure::bad_request(
                "no_host",
                "the request has no usable Host header; set [deerflow] sandbox_base_url",
            )
        })?;
    Ok(format!("http://{host}"))
}

fn answer(shared: &Shared, base: &str, sandbox_id: &str, record: &SandboxRecord) -> SandboxAnswer {
    let capability = shared
        .capabilities
        .capability(&record.id, record.generation);
    SandboxAnswer {
        sandbox_id: sandbox_id.to_owned(),
        sandbox_url: format!("{base}/deerflow/sandboxes/{}/{capability}", record.id),
        status: status_name(record.state),
        user_id: record.uid.as_str().to_owned(),
        thread_id: record.runtime_scope.as_str().to_owned(),
        mount_contract_version: MOUNT_CONTRACT_VERSION,
    }
}

/// DeerFlow keeps a sandbox only while it says `Running` (contract §0.8); the other names
/// follow its reference server's pod phases.
fn status_name(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Running => "Running",
        SandboxState::Created => "Pending",
        SandboxState::Stopped | SandboxState::Pausing | SandboxState::Paused => "Stopped",
        SandboxState::Terminating | SandboxState::Terminated => "Terminated",
    }
}

fn is_live(record: &SandboxRecord) -> bool {
    !matches!(
        record.state,
        SandboxState::Terminating | SandboxState::Terminated
    )
}

/// The live sandbox DeerFlow's `sandbox_id` names, or 404.
async fn resolve(shared: &Shared, sandbox_id: &str) -> Result<SandboxRecord, Failure> {
    let Some(id) = shared.aliases_get(sandbox_id).await? else {
        return Err(Failure::not_found(sandbox_id));
    };
    match shared.provisioner.sandbox(&id).await {
        Ok(record) if is_live(&record) => Ok(record),
        Ok(_) | Err(ProvisionerError::SandboxNotFound(_)) => Err(Failure::not_found(sandbox_id)),
        Err(other) => Err(other.into()),
    }
}

async fn status(
    State(shared): State<Shared>,
    axum::extract::Path(sandbox_id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<Json<SandboxAnswer>, Failure> {
    let record = resolve(&shared, &sandbox_id).await?;
    let base = base_url(&shared, &headers)?;
    Ok(Json(answer(&shared, &base, &sandbox_id, &record)))
}

/// `DELETE /api/sandboxes/{id}`: terminates through the provisioner's one termination
/// path (the cleanup fence first, running commands get their grace, I24) and keeps every
/// file (I15). A fencing token in `X-Warren-Fence` is honoured as on `/v1` (I33). An
/// unknown or already terminated sandbox answers the same `ok` (DeerFlow retries deletes).
async fn delete(
    State(shared): State<Shared>,
    axum::extract::Path(sandbox_id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, Failure> {
    let done = Json(serde_json::json!({"ok": true, "sandbox_id": sandbox_id}));
    let Some(id) = shared.aliases_get(&sandbox_id).await? else {
        return Ok(done);
    };
    let fence =
        FenceToken::from_header_values(headers.get_all(FENCE_HEADER).iter().map(|v| v.as_bytes()))?;
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = shared.provisioner.fence(&id, fence).await?;
    match shared
        .provisioner
        .terminate_sandbox(&id, warren_provisioner::DEFAULT_TERMINATE_GRACE)
        .await
    {
        Ok(_) | Err(ProvisionerError::SandboxNotFound(_)) => Ok(done),
        Err(other) => Err(other.into()),
    }
}

/// `GET /api/sandboxes`: every live sandbox DeerFlow created (it adopts them all into its
/// warm pool at start-up), nothing made through other APIs.
async fn list(
    State(shared): State<Shared>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, Failure> {
    let base = base_url(&shared, &headers)?;
    let aliases = shared
        .provisioner
        .list_sandbox_aliases(ALIAS_NAMESPACE)
        .await?;
    let mut sandboxes = Vec::with_capacity(aliases.len());
    for alias in aliases {
        match shared.provisioner.sandbox(&alias.sandbox_id).await {
            Ok(record) if is_live(&record) => {
                sandboxes.push(answer(&shared, &base, &alias.alias, &record))
            }
            Ok(_) | Err(ProvisionerError::SandboxNotFound(_)) => {}
            Err(other) => return Err(other.into()),
        }
    }
    let count = sandboxes.len();
    Ok(Json(
        serde_json::json!({"sandboxes": sandboxes, "count": count}),
    ))
}

/// Extra mounts are checked against the operator's settings (contract §5.4): the container
/// path must be one `[deerflow] extra_mount_paths` allows, the host path must lie under a
/// directory of `[deerflow] extra_mount_roots`. What passes becomes the sandbox's extra
/// mounts ([`ExtraMount`]): the operator's directory by its path, the rest beneath it
/// resolved by descriptor with no link followed whenever a runtime starts (I2).
fn check_extra_mounts(
    config: &crate::DeerflowConfig,
    mounts: &[ExtraMountRequest],
) -> Result<Vec<ExtraMount>, Failure> {
    if mounts.len() > MAX_EXTRA_MOUNTS {
        return Err(Failure::bad_request(
            "invalid_extra_mounts",
            format!(
                "{} extra mounts were asked for; at most {MAX_EXTRA_MOUNTS} are allowed",
                mounts.len()
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut checked = Vec::with_capacity(mounts.len());
    for mount in mounts {
        let (Some(container), Some(host)) = (&mount.container_path, &mount.host_path) else {
            return Err(Failure::bad_request(
                "invalid_extra_mounts",
                "every extra mount needs host_path and container_path",
            ));
        };
        let container = normalize(container).ok_or_else(|| {
            Failure::bad_request(
                "invalid_extra_mounts",
                "an extra mount's container_path must be an absolute path",
            )
        })?;
        if !config.extra_mount_paths.contains(&container) {
            return Err(Failure::bad_request(
                "extra_mount_not_allowed",
                format!(
                    "Unsupported extra mount path: {}; the container paths extra mounts may \
                     use are listed in [deerflow] extra_mount_paths ({})",
                    shorten(&container),
                    if config.extra_mount_paths.is_empty() {
                        "none are allowed now".to_owned()
                    } else {
                        config.extra_mount_paths.join(", ")
                    }
                ),
            ));
        }
        if !seen.insert(container.clone()) {
            return Err(Failure::bad_request(
                "invalid_extra_mounts",
                format!(
                    "duplicate extra mount container_path {}",
                    shorten(&container)
                ),
            ));
        }
        // Stricter than DeerFlow's reference server, which normalises `..` away: a host
        // path that climbs is refused outright, and so is a relative one.
        let host_path = Path::new(host.as_str());
        let climbs = host_path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
            || host.split('/').any(|part| part == "." || part == "..");
        // The innermost root the host path lies strictly beneath.
        let found = (host_path.is_absolute() && !climbs)
            .then(|| {
                config
                    .extra_mount_roots
                    .iter()
                    .filter_map(|root| {
                        let rest = host_path.strip_prefix(root).ok()?;
                        (!rest.as_os_str().is_empty()).then_some((root, rest))
                    })
                    .max_by_key(|(root, _)| root.as_os_str().len())
            })
            .flatten();
        let Some((root, rest)) = found else {
            return Err(Failure::bad_request(
                "extra_mount_not_allowed",
                format!(
                    "Extra mount host path for {} is outside the directories [deerflow] \
                     extra_mount_roots allows{}: it must be an absolute path without `.` or \
                     `..` beneath one of them",
                    shorten(&container),
                    if config.extra_mount_roots.is_empty() {
                        " (none are allowed now)"
                    } else {
                        ""
                    }
                ),
            ));
        };
        let beneath = rest.to_str().ok_or_else(|| {
            Failure::bad_request(
                "invalid_extra_mounts",
                format!("the host path for {} is not UTF-8", shorten(&container)),
            )
        })?;
        // DeerFlow's default: writable unless it says read_only.
        let writable = !mount.read_only.unwrap_or(false);
        let extra = ExtraMount::new(
            &container,
            root.clone(),
            beneath,
            writable,
            &warren_core::Layout::DEERFLOW,
        )
        .map_err(|e| Failure::bad_request("invalid_extra_mounts", e.to_string()))?;
        checked.push(extra);
    }
    Ok(checked)
}

/// `posixpath.normpath` for absolute paths: `.` and empty components dropped, `..` taken
/// back; `None` for a relative path.
fn normalize(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

fn shorten(text: &str) -> String {
    let short: String = text.chars().take(100).collect();
    short.chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generic_code_follows_the_status_class_of_its_kind() {
        for kind in ErrorKind::ALL {
            let status = kind.transport_status();
            let expected = match status {
                500.. => "internal",
                409 => "conflict",
                _ => "invalid_request",
            };
            assert_eq!(generic_code(kind), expected, "{kind:?}");
        }
    }

    #[test]
    fn container_paths_are_normalised_like_posixpath() {
        assert_eq!(normalize("/mnt/a/../b/./c//").as_deref(), Some("/mnt/b/c"));
        assert_eq!(normalize("/../..").as_deref(), Some("/"));
        assert_eq!(normalize("mnt/a"), None);
    }

    #[test]
    fn only_running_is_reported_as_running() {
        for state in SandboxState::ALL {
            assert_eq!(
                status_name(state) == "Running",
                state == SandboxState::Running
            );
        }
    }
}
