//! `/v1/users/{uid}/branches` and `/v1/sandboxes/{id}/merge`: branches of a workdir over
//! a read-only baseline, and their explicit merger (I27).
//!
//! A workdir is named in the body or the query (it has slashes, so it is no path segment).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use warren_core::{BranchName, Workdir};
use warren_protocol::{
    BranchChange, BranchDiff, BranchInfo, BranchList, CreateBranch, EntryVersion, MergeBranches,
    MergeConflictInfo, MergeResult, MergeStepInfo,
};
use warren_provisioner::MergeRequest;
use warren_store::BranchRecord;

use crate::extract::{uid, ApiJson, ApiPath, ApiQuery, Fence, SandboxPath};
use crate::{ApiError, ApiState};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WorkdirQuery {
    /// The workdir, relative to the user's workspace.
    workdir: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only the branches of this workdir.
    workdir: Option<String>,
}

fn info(record: &BranchRecord) -> BranchInfo {
    BranchInfo {
        workdir: record.workdir.to_string(),
        name: record.name.to_string(),
        from_checkpoint: record.checkpoint.clone(),
        created_at: record.created_at.to_rfc3339(),
        merged_at: record.merged_at.map(|at| at.to_rfc3339()),
    }
}

/// Makes a branch of a workdir, as it is now (the workdir is then read-only while the
/// branch exists) or from one of its checkpoints. It costs a mount, whatever the size of
/// the workdir, then only what it changes.
#[utoipa::path(
    post, path = "/v1/users/{uid}/branches", tag = "branches",
    params(("uid" = String, Path, description = "The workspace owner")),
    request_body = CreateBranch,
    responses(
        (status = 201, body = BranchInfo),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_branch, invalid_workdir"),
        (status = 404, body = warren_protocol::ErrorBody, description = "workdir_not_found, checkpoint_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "branch_exists; workdir_in_use: a running sandbox can write the workdir"),
        (status = 422, body = warren_protocol::ErrorBody, description = "branches_unsupported"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
    ApiJson(request): ApiJson<CreateBranch>,
) -> Result<(StatusCode, Json<BranchInfo>), ApiError> {
    let uid = uid(raw_uid)?;
    let workdir =
        Workdir::new(request.workdir).map_err(warren_provisioner::ProvisionerError::from)?;
    let name = BranchName::new(request.name).map_err(warren_provisioner::ProvisionerError::from)?;
    let record = state
        .provisioner
        .create_branch(&uid, &workdir, name, request.from_checkpoint.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(info(&record))))
}

/// The user's branches, of one workdir or of all, oldest first.
#[utoipa::path(
    get, path = "/v1/users/{uid}/branches", tag = "branches",
    params(("uid" = String, Path, description = "The workspace owner"), ListQuery),
    responses((status = 200, body = BranchList)),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<BranchList>, ApiError> {
    let uid = uid(raw_uid)?;
    let workdir = query
        .workdir
        .map(Workdir::new)
        .transpose()
        .map_err(warren_provisioner::ProvisionerError::from)?;
    let records = state
        .provisioner
        .list_branches(&uid, workdir.as_ref())
        .await?;
    Ok(Json(BranchList {
        branches: records.iter().map(info).collect(),
    }))
}

fn names(
    raw_uid: String,
    workdir: String,
    name: String,
) -> Result<(warren_core::Uid, Workdir, BranchName), ApiError> {
    let invalid = warren_provisioner::ProvisionerError::from;
    Ok((
        uid(raw_uid)?,
        Workdir::new(workdir).map_err(invalid)?,
        BranchName::new(name).map_err(invalid)?,
    ))
}

/// What the branch changed against its baseline.
#[utoipa::path(
    get, path = "/v1/users/{uid}/branches/{branch}/diff", tag = "branches",
    params(
        ("uid" = String, Path, description = "The workspace owner"),
        ("branch" = String, Path, description = "The branch"),
        WorkdirQuery,
    ),
    responses(
        (status = 200, body = BranchDiff),
        (status = 404, body = warren_protocol::ErrorBody, description = "branch_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn diff(
    State(state): State<ApiState>,
    ApiPath((raw_uid, raw_name)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<WorkdirQuery>,
) -> Result<Json<BranchDiff>, ApiError> {
    let (uid, workdir, name) = names(raw_uid, query.workdir, raw_name)?;
    let changes = state.provisioner.branch_diff(&uid, &workdir, &name).await?;
    Ok(Json(BranchDiff {
        workdir: workdir.to_string(),
        name: name.to_string(),
        changes: changes
            .into_iter()
            .map(|change| BranchChange {
                change: change.what().to_owned(),
                before: change.before.as_ref().map(|kind| kind.name().to_owned()),
                after: change.after.as_ref().map(|kind| kind.name().to_owned()),
                path: change.path,
            })
            .collect(),
    }))
}

/// Deletes a branch and what it changed; the workdir is writable again once it has no
/// branch made of it.
#[utoipa::path(
    delete, path = "/v1/users/{uid}/branches/{branch}", tag = "branches",
    params(
        ("uid" = String, Path, description = "The workspace owner"),
        ("branch" = String, Path, description = "The branch"),
        WorkdirQuery,
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, body = warren_protocol::ErrorBody, description = "branch_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "branch_in_use"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    ApiPath((raw_uid, raw_name)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<WorkdirQuery>,
) -> Result<StatusCode, ApiError> {
    let (uid, workdir, name) = names(raw_uid, query.workdir, raw_name)?;
    state
        .provisioner
        .delete_branch(&uid, &workdir, &name)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One side of a conflict on the wire.
pub(crate) fn version(version: &warren_merge::Version) -> EntryVersion {
    use warren_merge::Version as V;
    match version {
        V::Absent => EntryVersion::Absent,
        V::Text { text, mode } => EntryVersion::Text {
            text: text.clone(),
            mode: *mode,
        },
        V::Binary { size, hash, mode } => EntryVersion::Binary {
            size: *size,
            hash: hash.clone(),
            mode: *mode,
        },
        V::Symlink { target } => EntryVersion::Symlink {
            target: target.clone(),
        },
        V::Dir { mode } => EntryVersion::Dir { mode: *mode },
    }
}

/// A conflict on the wire.
pub(crate) fn conflict(conflict: &warren_merge::Conflict) -> MergeConflictInfo {
    MergeConflictInfo {
        path: conflict.path.clone(),
        branch: conflict.branch.clone(),
        reason: conflict.reason.to_owned(),
        base: version(&conflict.base),
        ours: version(&conflict.ours),
        theirs: version(&conflict.theirs),
    }
}

/// Merges branches of the sandbox's workdir into what the sandbox writes: its workdir, or
/// the branch of it it is bound to. Three-way per file against the workdir as the branches
/// were made of it: changes to different files, and to different lines of one text file,
/// combine; anything else is a conflict, answered with the baseline, ours and theirs, and
/// nothing is applied. All or nothing, after a checkpoint of the target (restore it to undo
/// the merge). Made by the holder of the sandbox's execution guard: send its token as
/// `X-Warren-Fence` (a dry run needs none).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/merge", tag = "branches",
    params(("id" = String, Path, description = "The sandbox whose workdir is the target")),
    request_body = MergeBranches,
    responses(
        (status = 200, body = MergeResult),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request: no guard token, or branches that cannot be merged here"),
        (status = 404, body = warren_protocol::ErrorBody, description = "branch_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "merge_conflict (with `conflicts`), merge_incomplete: other branches of the workdir left out, branch_merged, merge_stale, fence_stale, sandbox_busy"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn merge(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<MergeBranches>,
) -> Result<Json<MergeResult>, ApiError> {
    let branches = request
        .branches
        .into_iter()
        .map(BranchName::new)
        .collect::<Result<Vec<_>, _>>()
        .map_err(warren_provisioner::ProvisionerError::from)?;
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let permit = state.provisioner.fence(&id, fence).await?;
    let outcome = state
        .provisioner
        .merge_branches(
            &id,
            MergeRequest {
                branches,
                dry_run: request.dry_run,
            },
            &permit,
        )
        .await?;
    Ok(Json(MergeResult {
        applied: outcome.applied,
        checkpoint_id: outcome.checkpoint,
        steps: outcome
            .steps
            .iter()
            .map(|step| MergeStepInfo {
                path: step.path.clone(),
                action: step.action.as_str().to_owned(),
                from: step.from.clone(),
                merged_lines: step.merged_lines,
            })
            .collect(),
        conflicts: outcome.conflicts.iter().map(conflict).collect(),
    }))
}
