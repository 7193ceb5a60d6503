//! Artifacts: files an agent presented as results (I26), recorded per sandbox.

use warren_core::{SandboxId, Uid};

use crate::rows::artifact_from_row;
use crate::sql::{Dialect, Query};
use crate::{Artifact, StoreError};

const COLUMNS: &str = "id, sandbox_id, uid, path, size, sha256, media_type, created_at";

pub(crate) async fn record<D: Dialect>(
    db: &D,
    artifact: &Artifact,
) -> Result<Artifact, StoreError> {
    let row = Query::new(format!(
        "INSERT INTO artifacts ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         RETURNING {COLUMNS}"
    ))
    .bind(&artifact.id)
    .bind(artifact.sandbox_id.as_str())
    .bind(artifact.uid.as_str())
    .bind(&artifact.path)
    .bind(crate::to_i64(artifact.size, "artifacts", "size")?)
    .bind(&artifact.sha256)
    .bind(&artifact.media_type)
    .bind(crate::now_millis())
    .fetch_one(db)
    .await
    .map_err(StoreError::on_sandbox(
        "record an artifact",
        &artifact.sandbox_id,
    ))?;
    artifact_from_row(&row)
}

pub(crate) async fn list<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
) -> Result<Vec<Artifact>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {COLUMNS} FROM artifacts WHERE sandbox_id = $1 ORDER BY created_at, id"
    ))
    .bind(sandbox.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list artifacts"))?;
    rows.iter().map(artifact_from_row).collect()
}

pub(crate) async fn list_of_uid<D: Dialect>(
    db: &D,
    uid: &Uid,
) -> Result<Vec<Artifact>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {COLUMNS} FROM artifacts WHERE uid = $1 ORDER BY created_at, id"
    ))
    .bind(uid.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list artifacts"))?;
    rows.iter().map(artifact_from_row).collect()
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    id: &str,
) -> Result<Option<Artifact>, StoreError> {
    let row = Query::new(format!(
        "SELECT {COLUMNS} FROM artifacts WHERE sandbox_id = $1 AND id = $2"
    ))
    .bind(sandbox.as_str())
    .bind(id)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("read an artifact"))?;
    row.as_ref().map(artifact_from_row).transpose()
}
