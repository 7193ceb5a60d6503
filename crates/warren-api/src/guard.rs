//! `/v1/sandboxes/{id}/guard`: the execution guard (I33). One executor at a time holds a
//! sandbox; its fencing token, sent as `X-Warren-Fence` with every change, is refused with
//! 409 `fence_stale` once a newer holder took over. The rules live in the provisioner
//! (`guard.rs`); this module only parses and answers.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use warren_protocol::{CreateGuard, GuardInfo, RenewGuard};
use warren_store::Guard;

use crate::extract::{ApiJson, ApiQuery, SandboxPath};
use crate::{ApiError, ApiState};

fn info(guard: &Guard) -> GuardInfo {
    let time = |at: &chrono::DateTime<chrono::Utc>| {
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    GuardInfo {
        token: guard.token,
        holder: guard.holder.clone(),
        acquired_at: time(&guard.acquired_at),
        expires_at: time(&guard.expires_at),
    }
}

/// A token from a JSON number or a query: one beyond what the server issues is a token
/// that was never issued.
fn token(raw: u64) -> i64 {
    i64::try_from(raw).unwrap_or(i64::MAX)
}

/// Takes the sandbox's execution guard. The token only ever grows per sandbox (across
/// generations too); a guard nobody renews lapses after `ttl_s` by the server's clock, and
/// the next holder then gets a larger token.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/guard", tag = "guard",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateGuard,
    responses(
        (status = 201, body = GuardInfo, description = "Acquired: send `token` as X-Warren-Fence with every change, renew at a third of the TTL"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request: holder or ttl_s out of range"),
        (status = 409, body = warren_protocol::ErrorBody, description = "guard_held: another holder's guard is live; the error names `holder` and `expires_at`"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn acquire(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(request): ApiJson<CreateGuard>,
) -> Result<(StatusCode, Json<GuardInfo>), ApiError> {
    let guard = state
        .provisioner
        .acquire_guard(&id, &request.holder, Duration::from_secs(request.ttl_s))
        .await?;
    Ok((StatusCode::CREATED, Json(info(&guard))))
}

/// The live guard: who holds it and until when. 404 `guard_not_found` when nobody does.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/guard", tag = "guard",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = GuardInfo),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, or guard_not_found: no live guard (never taken, released or lapsed)"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<GuardInfo>, ApiError> {
    match state.provisioner.current_guard(&id).await? {
        Some(guard) => Ok(Json(info(&guard))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            warren_protocol::code!(StatusCode::NOT_FOUND.as_u16(), "guard_not_found"),
            format!("nobody holds the execution guard of sandbox {id}; acquire it with POST /v1/sandboxes/{{id}}/guard"),
        )),
    }
}

/// Extends the live guard to `ttl_s` from now. A lapsed, released or superseded token is
/// 404: its holder lost the guard and must acquire it again (with a new token).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/guard/renew", tag = "guard",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RenewGuard,
    responses(
        (status = 200, body = GuardInfo),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request: ttl_s out of range"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, or guard_not_found: the token is not the live guard"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn renew(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(request): ApiJson<RenewGuard>,
) -> Result<Json<GuardInfo>, ApiError> {
    let guard = state
        .provisioner
        .renew_guard(
            &id,
            token(request.token),
            request.ttl_s.map(Duration::from_secs),
        )
        .await?;
    Ok(Json(info(&guard)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReleaseQuery {
    /// The token the acquisition returned.
    token: u64,
}

/// Releases the live guard at once, so the next holder need not wait out its TTL. Its token
/// stays the newest until someone acquires: only a newer holder makes it stale.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/guard", tag = "guard",
    params(("id" = String, Path, description = "Sandbox id"), ReleaseQuery),
    responses(
        (status = 204, description = "Released"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, or guard_not_found: the token is not the live guard"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn release(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<ReleaseQuery>,
) -> Result<StatusCode, ApiError> {
    state
        .provisioner
        .release_guard(&id, token(query.token))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
