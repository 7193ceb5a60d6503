//! `/v1/users/{uid}/usage`: a uid's workspace storage against its quota (I23).

use axum::extract::{Path, State};
use axum::Json;
use warren_protocol::{UsageFigure, WorkspaceUsage};

use crate::extract::uid;
use crate::{ApiError, ApiState};

/// Bytes and inodes used by a uid's workspace and its limits, from the kernel's accounting
/// of the uid's own filesystem (`used` is `null` when quotas are not enforced).
#[utoipa::path(
    get, path = "/v1/users/{uid}/usage", tag = "workdirs",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses(
        (status = 200, body = WorkspaceUsage),
        (status = 400, body = warren_protocol::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path(raw_uid): Path<String>,
) -> Result<Json<WorkspaceUsage>, ApiError> {
    let uid = uid(raw_uid)?;
    let usage = state.provisioner.workspace_usage(&uid).await?;
    Ok(Json(WorkspaceUsage {
        uid: uid.to_string(),
        enforcement: usage.enforcement.as_str().to_owned(),
        bytes: UsageFigure {
            used: usage.bytes_used,
            limit: usage.bytes_limit,
        },
        inodes: UsageFigure {
            used: usage.inodes_used,
            limit: usage.inodes_limit,
        },
    }))
}
