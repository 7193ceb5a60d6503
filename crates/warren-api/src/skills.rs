//! `/v1/users/{uid}/skills`: what a uid's read-only `/home/gem/skills` holds (I7, I32).

use axum::extract::State;
use axum::Json;

use crate::extract::{uid, ApiPath};
use crate::{ApiError, ApiState};

/// The skills granted to the uid.
#[utoipa::path(
    get, path = "/v1/users/{uid}/skills", tag = "skills",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 200, description = "{\"granted\": [names]}")),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let uid = uid(raw_uid)?;
    let granted = state.provisioner.granted_skills(&uid).await?;
    Ok(Json(serde_json::json!({ "granted": granted })))
}

/// Grants a skill of the operator's catalog and rebuilds the projection. A runtime that is
/// running keeps the projection it mounted; the next one sees the new skill.
#[utoipa::path(
    put, path = "/v1/users/{uid}/skills/{skill}", tag = "skills",
    params(("uid" = String, Path, description = "The workspace owner"), ("skill" = String, Path, description = "The skill's name")),
    responses((status = 200, description = "What the rebuild did")),
    security(("bearer" = []))
)]
pub(crate) async fn grant(
    State(state): State<ApiState>,
    ApiPath((raw_uid, skill)): ApiPath<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let uid = uid(raw_uid)?;
    let report = state.provisioner.grant_skill(&uid, &skill).await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

/// Revokes a granted skill and rebuilds the projection.
#[utoipa::path(
    delete, path = "/v1/users/{uid}/skills/{skill}", tag = "skills",
    params(("uid" = String, Path, description = "The workspace owner"), ("skill" = String, Path, description = "The skill's name")),
    responses((status = 200, description = "What the rebuild did"), (status = 404, body = warren_protocol::ErrorBody, description = "skill_not_granted")),
    security(("bearer" = []))
)]
pub(crate) async fn revoke(
    State(state): State<ApiState>,
    ApiPath((raw_uid, skill)): ApiPath<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let uid = uid(raw_uid)?;
    let report = state.provisioner.revoke_skill(&uid, &skill).await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

/// Rebuilds the projection from the operator's skill directories (after they changed).
#[utoipa::path(
    post, path = "/v1/users/{uid}/skills/sync", tag = "skills",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 200, description = "What the rebuild did")),
    security(("bearer" = []))
)]
pub(crate) async fn sync(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let uid = uid(raw_uid)?;
    let report = state.provisioner.sync_skills(&uid).await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}
