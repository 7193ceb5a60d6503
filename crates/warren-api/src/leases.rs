//! `/v1/sandboxes/{id}/leases`: runs holding a runtime (I25).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use warren_core::SandboxId;
use warren_protocol::{CreateLease, LeaseInfo, RenewLease};
use warren_provisioner::ProvisionerError;
use warren_store::Lease;

use crate::extract::{ApiJson, ApiPath, OptionalJson};
use crate::{ApiError, ApiState};

fn info(lease: &Lease) -> LeaseInfo {
    LeaseInfo {
        lease_id: lease.id.clone(),
        holder: lease.holder.clone(),
        generation: lease.generation,
        expires_at: lease.expires_at.to_rfc3339(),
    }
}

fn sandbox(raw: &str) -> Result<SandboxId, ApiError> {
    SandboxId::parse(raw).map_err(|e| ProvisionerError::from(e).into())
}

/// Takes a lease: while any lease is live, the runtime is never reaped.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/leases", tag = "leases",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateLease,
    responses(
        (status = 201, body = LeaseInfo),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_terminating or sandbox_terminated"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CreateLease>,
) -> Result<(StatusCode, Json<LeaseInfo>), ApiError> {
    let lease = state
        .provisioner
        .acquire_lease(
            &sandbox(&id)?,
            &request.holder,
            Duration::from_secs(request.ttl_s),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(info(&lease))))
}

/// Extends a live lease; an expired one is 404 (its holder is presumed dead).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/leases/{lease_id}/renew", tag = "leases",
    params(("id" = String, Path, description = "Sandbox id"), ("lease_id" = String, Path, description = "Lease id")),
    request_body(content = Option<RenewLease>),
    responses((status = 200, body = LeaseInfo), (status = 404, body = warren_protocol::ErrorBody, description = "lease_not_found")),
    security(("bearer" = []))
)]
pub(crate) async fn renew(
    State(state): State<ApiState>,
    ApiPath((id, lease_id)): ApiPath<(String, String)>,
    OptionalJson(request): OptionalJson<RenewLease>,
) -> Result<Json<LeaseInfo>, ApiError> {
    let ttl = Duration::from_secs(request.ttl_s.unwrap_or(60));
    let lease = state
        .provisioner
        .renew_lease(&sandbox(&id)?, &lease_id, ttl)
        .await?;
    Ok(Json(info(&lease)))
}

/// Ends a lease. The runtime is reclaimed after the idle timeout once no lease, command
/// or process keeps it.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/leases/{lease_id}", tag = "leases",
    params(("id" = String, Path, description = "Sandbox id"), ("lease_id" = String, Path, description = "Lease id")),
    responses((status = 204, description = "Released"), (status = 404, body = warren_protocol::ErrorBody, description = "lease_not_found")),
    security(("bearer" = []))
)]
pub(crate) async fn release(
    State(state): State<ApiState>,
    ApiPath((id, lease_id)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    state
        .provisioner
        .release_lease(&sandbox(&id)?, &lease_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
