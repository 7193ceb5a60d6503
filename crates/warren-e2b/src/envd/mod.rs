//! Each sandbox's envd: the Connect services `process.Process` and
//! `filesystem.Filesystem`, `/files` and `/health`, on the E2B listener.
//!
//! A request names its sandbox by the `E2b-Sandbox-Id` header (clients configured with
//! `E2B_SANDBOX_URL`) or by its host name `49983-<id>.<domain>` (clients configured with
//! `E2B_DOMAIN`). When the sandbox was created `secure`, `X-Access-Token` must be its envd
//! access token; signed `/files` URLs carry a signature instead. A sandbox of another key
//! is indistinguishable from one that does not exist: E2B's envd has no notion of a key,
//! so the capability is the sandbox id plus its access token.

pub(crate) mod connect;
mod files;
mod filesystem;
#[cfg(test)]
mod fixture;
mod fs;
mod process;
pub(crate) mod proto;
mod watch;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::state::E2bSandbox;
use crate::Shared;

/// The port E2B's SDKs address envd at (`49983-<id>.<domain>`).
pub(crate) const ENVD_PORT: u16 = 49983;

/// The envd version warren reports (`envdVersion`): the SDKs switch features on it, so it
/// names the newest envd whose behaviour warren's envd has: closing stdin (0.5.2) and
/// octet-stream and gzip uploads (0.5.7). Not 0.6.2 and later: per-file metadata kept as
/// extended attributes and entry info in watch events, which the SDKs then refuse with a
/// clear "requires envd 0.6.x" rather than warren silently dropping them.
pub(crate) const ENVD_VERSION: &str = "0.5.7";

/// One envd request, its sandbox resolved and authenticated.
#[derive(Clone)]
pub(crate) struct EnvdContext {
    /// What every handler shares.
    pub(crate) shared: Shared,
    /// The sandbox the request is for.
    pub(crate) sandbox: E2bSandbox,
    /// The user the request asked to act as (`Authorization: Basic <user>:`), if any.
    /// Only the sandbox user exists (I11); `root` is refused where it matters.
    pub(crate) user: Option<String>,
}

/// The envd routes.
pub(crate) fn routes(shared: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/process.Process/{method}", post(process_call))
        .route("/filesystem.Filesystem/{method}", post(filesystem_call))
        .route("/files", get(files::download).post(files::upload))
        .with_state(shared)
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn process_call(
    State(shared): State<Shared>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    call_service(shared, request, |ctx, call| async move {
        process::serve(ctx, &method, call).await
    })
    .await
}

async fn filesystem_call(
    State(shared): State<Shared>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    call_service(shared, request, |ctx, call| async move {
        filesystem::serve(ctx, &method, call).await
    })
    .await
}

/// Reads a Connect call, resolves and authenticates its sandbox, and hands both to a
/// service; a call that fails either is answered in its own form.
async fn call_service<F, Fut>(shared: Shared, request: Request, service: F) -> Response
where
    F: FnOnce(EnvdContext, connect::Call) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let mut call = match connect::Call::from_request(request) {
        Ok(call) => call,
        Err(response) => return response,
    };
    match resolve(&shared, call.headers()).await {
        Ok(ctx) => service(ctx, call).await,
        Err(error) => {
            call.drain().await;
            call.error(error)
        }
    }
}

/// The sandbox a request names, by header or host name.
pub(crate) fn sandbox_id_of(headers: &HeaderMap, domain: Option<&str>) -> Option<String> {
    if let Some(id) = headers
        .get("e2b-sandbox-id")
        .and_then(|value| value.to_str().ok())
    {
        return Some(id.to_owned());
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|value| value.to_str().ok())?;
    let host = host.split(':').next()?;
    let rest = [ENVD_PORT, crate::code::JUPYTER_PORT]
        .iter()
        .find_map(|port| host.strip_prefix(&format!("{port}-")))?;
    let (id, host_domain) = rest.split_once('.')?;
    match domain {
        Some(domain) if host_domain.eq_ignore_ascii_case(domain) => Some(id.to_owned()),
        _ => None,
    }
}

/// Resolves and authenticates the sandbox of an envd request: unknown, paused-and-gone
/// or wrong-token all answer the same way.
pub(crate) async fn resolve(
    shared: &Shared,
    headers: &HeaderMap,
) -> Result<EnvdContext, connect::ConnectError> {
    let Some(id) = sandbox_id_of(headers, shared.config.domain.as_deref()) else {
        return Err(connect::ConnectError::new(
            connect::Code::InvalidArgument,
            "the request names no sandbox: send the E2b-Sandbox-Id header or use the host name 49983-<sandboxID>.<domain>",
        ));
    };
    let not_found = || connect::ConnectError::sandbox_gone(&id);
    let sandbox = crate::control::live_sandbox(shared, &id)
        .await
        .map_err(|error| error.into_connect())?
        .ok_or_else(not_found)?;
    if !access_granted(shared, &sandbox, headers, &["x-access-token"]) {
        return Err(connect::ConnectError::new(
            connect::Code::Unauthenticated,
            "the X-Access-Token header is missing or is not this sandbox's envd access token",
        ));
    }
    let user = basic_user(headers);
    Ok(EnvdContext {
        shared: shared.clone(),
        sandbox,
        user,
    })
}

/// Whether a request may reach `sandbox`'s services: always for a sandbox that is not
/// `secure`, else when one of the headers `names` carries its access token.
pub(crate) fn access_granted(
    shared: &Shared,
    sandbox: &E2bSandbox,
    headers: &HeaderMap,
    names: &[&str],
) -> bool {
    !sandbox.secure || presents_token(shared, sandbox, headers, names)
}

/// Whether one of the headers `names` carries `sandbox`'s access token.
pub(crate) fn presents_token(
    shared: &Shared,
    sandbox: &E2bSandbox,
    headers: &HeaderMap,
    names: &[&str],
) -> bool {
    names
        .iter()
        .filter_map(|name| headers.get(*name)?.to_str().ok())
        .any(|token| shared.secrets.token_matches(&sandbox.sandbox_id, token))
}

/// The user of `Authorization: Basic base64(<user>:)`, as the SDKs send it.
pub(crate) fn basic_user(headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next()?.to_owned();
    (!user.is_empty()).then_some(user)
}

impl IntoResponse for connect::ConnectError {
    fn into_response(self) -> Response {
        connect::unary_error(connect::Codec::Json, &self)
    }
}
