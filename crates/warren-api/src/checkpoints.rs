//! `/v1/sandboxes/{id}/checkpoints`: record, compare and restore a workdir (I28).
//!
//! A restore puts the workdir's files back as they were. It does not undo anything a
//! command did outside the workdir: messages sent, commits pushed, packages installed
//! elsewhere stay as they are.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use warren_protocol::{
    CheckpointCreated, CheckpointDiff, CheckpointInfo, CheckpointList, CheckpointSummary,
};
use warren_store::Checkpoint;

use crate::extract::{sandbox_id, ApiPath, Fence, SandboxPath};
use crate::{ApiError, ApiState};

fn info(checkpoint: &Checkpoint) -> CheckpointInfo {
    CheckpointInfo {
        checkpoint_id: checkpoint.id.clone(),
        workdir: checkpoint.workdir.to_string(),
        files: checkpoint.files,
        bytes: checkpoint.bytes,
        created_at: checkpoint.created_at.to_rfc3339(),
    }
}

/// Records the sandbox's workdir: only chunks this uid has not stored yet are written.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 201, body = CheckpointCreated),
        (status = 422, body = warren_protocol::ErrorBody, description = "snapshot_too_large: the workdir holds more file data than [snapshots] max_bytes (holes of sparse files not counted); nothing was recorded"),
        (status = 503, body = warren_protocol::ErrorBody, description = "snapshot_cancelled: the server is shutting down; nothing was recorded"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
) -> Result<(StatusCode, Json<CheckpointCreated>), ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let started = std::time::Instant::now();
    let (checkpoint, stats) = state.provisioner.create_checkpoint(&id).await?;
    let ratio = if stats.bytes_stored == 0 {
        0.0
    } else {
        stats.bytes_read as f64 / stats.bytes_stored as f64
    };
    Ok((
        StatusCode::CREATED,
        Json(CheckpointCreated {
            checkpoint: info(&checkpoint),
            summary: CheckpointSummary {
                files: stats.files,
                dirs: stats.dirs,
                symlinks: stats.symlinks,
                skipped: stats.skipped,
                bytes_read: stats.bytes_read,
                bytes_stored: stats.bytes_stored,
                chunks: stats.chunks,
                chunks_new: stats.chunks_new,
                dedup_ratio: ratio,
                elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            },
        }),
    ))
}

/// The sandbox's checkpoints, oldest first.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = CheckpointList)),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<CheckpointList>, ApiError> {
    let checkpoints = state.provisioner.list_checkpoints(&id).await?;
    Ok(Json(CheckpointList {
        checkpoints: checkpoints.iter().map(info).collect(),
    }))
}

/// Paths added, removed and changed in the workdir since the checkpoint.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/checkpoints/{checkpoint_id}/diff", tag = "checkpoints",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("checkpoint_id" = String, Path, description = "Checkpoint id"),
    ),
    responses((status = 200, body = CheckpointDiff), (status = 404, body = warren_protocol::ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn diff(
    State(state): State<ApiState>,
    ApiPath((raw_id, checkpoint)): ApiPath<(String, String)>,
) -> Result<Json<CheckpointDiff>, ApiError> {
    let id = sandbox_id(&raw_id)?;
    let diff = state.provisioner.checkpoint_diff(&id, &checkpoint).await?;
    Ok(Json(CheckpointDiff {
        added: diff.added,
        removed: diff.removed,
        changed: diff.changed,
    }))
}

/// Puts the workdir back as the checkpoint recorded it, in one atomic swap. Refused with
/// 409 `sandbox_busy` while commands run in the sandbox. External side effects of commands
/// (anything outside the workdir) are not undone.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/checkpoints/{checkpoint_id}/restore", tag = "checkpoints",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("checkpoint_id" = String, Path, description = "Checkpoint id"),
    ),
    responses(
        (status = 200, body = CheckpointInfo, description = "Restored"),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_busy"),
        (status = 422, body = warren_protocol::ErrorBody, description = "checkpoint_unusable: a chunk is missing or corrupt; the workdir is unchanged"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn restore(
    State(state): State<ApiState>,
    ApiPath((raw_id, checkpoint)): ApiPath<(String, String)>,
    Fence(fence): Fence,
) -> Result<Json<CheckpointInfo>, ApiError> {
    let id = sandbox_id(&raw_id)?;
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let restored = state
        .provisioner
        .restore_checkpoint(&id, &checkpoint)
        .await?;
    Ok(Json(info(&restored)))
}

/// Collects garbage in the uid's snapshot store: chunks and manifests no checkpoint needs,
/// older than the grace period.
#[utoipa::path(
    post, path = "/v1/users/{uid}/snapshots/gc", tag = "checkpoints",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 200, description = "What was kept and removed")),
    security(("bearer" = []))
)]
pub(crate) async fn gc(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let uid = crate::extract::uid(raw_uid)?;
    let stats = state.provisioner.collect_snapshot_garbage(&uid).await?;
    Ok(Json(serde_json::to_value(stats).unwrap_or_default()))
}

fn snapshot_info(snapshot: &warren_store::RuntimeSnapshot) -> serde_json::Value {
    serde_json::json!({
        "snapshot_id": snapshot.id,
        "generation": snapshot.generation,
        "bytes": snapshot.bytes,
        "reason": snapshot.reason,
        "created_at": snapshot.created_at.to_rfc3339(),
    })
}

/// Records the running runtime's ephemeral state (I30): the copy-on-write layers over the
/// root (installed packages) and `/home/gem` outside the persistent mounts. `/tmp` is not
/// kept. A reaped runtime resumes from the latest snapshot of its generation.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/snapshots", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 201, description = "The snapshot"),
        (status = 409, body = warren_protocol::ErrorBody, description = "runtime_not_running"),
        (status = 422, body = warren_protocol::ErrorBody, description = "snapshot_too_large: the runtime's ephemeral state holds more file data than [snapshots] max_bytes (holes of sparse files not counted); nothing was recorded"),
        (status = 501, body = warren_protocol::ErrorBody, description = "snapshot_not_supported"),
        (status = 503, body = warren_protocol::ErrorBody, description = "snapshot_cancelled: the server is shutting down; nothing was recorded"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn snapshot(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let snapshot = state.provisioner.snapshot_runtime(&id, "api").await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&snapshot))))
}

/// The sandbox's runtime snapshots, oldest first.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/snapshots", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "{\"snapshots\": [...]}")),
    security(("bearer" = []))
)]
pub(crate) async fn snapshots(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<serde_json::Value>, ApiError> {
    let list = state.provisioner.list_runtime_snapshots(&id).await?;
    Ok(Json(serde_json::json!({
        "snapshots": list.iter().map(snapshot_info).collect::<Vec<_>>(),
    })))
}
