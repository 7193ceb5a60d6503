//! `/v1/users/{uid}/workdirs`: a user's workdirs (I4, I8).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use warren_core::Workdir;
use warren_protocol::{CreateWorkdir, InitSummary, WorkdirInfo, WorkdirList};
use warren_provisioner::{Created, GitSource, WorkdirInit};

use crate::extract::{uid, ApiPath, OptionalJson};
use crate::{ApiError, ApiState};

pub(crate) fn workdir_info(
    workdir: &Workdir,
    created_at: chrono::DateTime<chrono::Utc>,
) -> WorkdirInfo {
    WorkdirInfo {
        workdir: workdir.to_string(),
        // A workdir by itself is seen through the default layout (I8).
        path: warren_core::Layout::ARS.workdir_path(workdir),
        created_at: created_at.to_rfc3339(),
        initialized: None,
    }
}

/// Creates a workdir (default `projects/<uuid>`); 201 when new, 200 when it existed, with
/// the time it was first created either way. With `init`, a refused or failing source
/// leaves no new workdir behind.
#[utoipa::path(
    post, path = "/v1/users/{uid}/workdirs", tag = "workdirs",
    params(("uid" = String, Path, description = "The workspace owner")),
    request_body(content = Option<CreateWorkdir>, description = "Optional explicit path"),
    responses(
        (status = 201, body = WorkdirInfo, description = "Created"),
        (status = 200, body = WorkdirInfo, description = "Existed already"),
        (status = 400, body = warren_protocol::ErrorBody),
        (status = 409, body = warren_protocol::ErrorBody, description = "workdir_not_empty: init fills empty workdirs only"),
        (status = 422, body = warren_protocol::ErrorBody, description = "git_failed"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
    // The body is optional: an empty one means "a fresh default workdir".
    OptionalJson(request): OptionalJson<CreateWorkdir>,
) -> Result<(StatusCode, Json<WorkdirInfo>), ApiError> {
    let uid = uid(raw_uid)?;
    let init = request.init.map(|init| WorkdirInit {
        host_dir: init.host_dir,
        git: init.git.map(|git| GitSource {
            url: git.url,
            rev: git.rev,
        }),
        files: init.files,
    });
    let made = state
        .provisioner
        .create_workdir_from(&uid, request.path.as_deref(), init)
        .await?;
    let mut info = workdir_info(&made.record.workdir, made.record.created_at);
    info.initialized = made.initialized.map(|report| InitSummary {
        files: report.files,
        bytes: report.bytes,
    });
    let status = match made.created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    Ok((status, Json(info)))
}

/// Lists the workdirs recorded for a user.
#[utoipa::path(
    get, path = "/v1/users/{uid}/workdirs", tag = "workdirs",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 200, body = WorkdirList)),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<Json<WorkdirList>, ApiError> {
    let uid = uid(raw_uid)?;
    let records = state.provisioner.list_workdirs(&uid).await?;
    Ok(Json(WorkdirList {
        workdirs: records
            .iter()
            .map(|r| workdir_info(&r.workdir, r.created_at))
            .collect(),
    }))
}
