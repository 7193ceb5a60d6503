//! Workdir checkpoints (I28) and runtime snapshots (I30): the records that name manifests
//! in a uid's snapshot store.

use warren_core::{SandboxId, Uid};

use crate::rows::{checkpoint_from_row, runtime_snapshot_from_row, Columns};
use crate::sql::{Dialect, Query};
use crate::{Checkpoint, OwnerFence, RuntimeSnapshot, StoreError};

const CHECKPOINT_COLUMNS: &str = "id, sandbox_id, workdir, manifest, files, bytes, created_at";

const SNAPSHOT_COLUMNS: &str =
    "id, sandbox_id, generation, cow_manifest, home_manifest, bytes, reason, created_at";

pub(crate) async fn record<D: Dialect>(
    db: &D,
    checkpoint: &Checkpoint,
) -> Result<Checkpoint, StoreError> {
    let row = Query::new(format!(
        "INSERT INTO checkpoints ({CHECKPOINT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         RETURNING {CHECKPOINT_COLUMNS}"
    ))
    .bind(&checkpoint.id)
    .bind(checkpoint.sandbox_id.as_str())
    .bind(checkpoint.workdir.as_str())
    .bind(&checkpoint.manifest)
    .bind(crate::to_i64(checkpoint.files, "checkpoints", "files")?)
    .bind(crate::to_i64(checkpoint.bytes, "checkpoints", "bytes")?)
    .bind(crate::now_millis())
    .fetch_one(db)
    .await
    .map_err(StoreError::on_sandbox(
        "record a checkpoint",
        &checkpoint.sandbox_id,
    ))?;
    checkpoint_from_row(&row)
}

pub(crate) async fn list<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
) -> Result<Vec<Checkpoint>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE sandbox_id = $1 \
         ORDER BY created_at, id"
    ))
    .bind(sandbox.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list checkpoints"))?;
    rows.iter().map(checkpoint_from_row).collect()
}

pub(crate) async fn delete<D: Dialect>(db: &D, id: &str) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM checkpoints WHERE id = $1")
        .bind(id)
        .execute(db)
        .await
        .map_err(StoreError::query("delete a checkpoint"))?;
    Ok(removed == 1)
}

pub(crate) async fn record_snapshot<D: Dialect>(
    db: &D,
    snapshot: &RuntimeSnapshot,
    owner: Option<&OwnerFence>,
) -> Result<RuntimeSnapshot, StoreError> {
    let row = Query::new(format!(
        "INSERT INTO runtime_snapshots ({SNAPSHOT_COLUMNS}) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE CAST($10 AS BIGINT) IS NULL OR EXISTS \
         (SELECT 1 FROM runtime_owners WHERE sandbox_id = $2 AND node_id = $9 \
         AND token = $10) RETURNING {SNAPSHOT_COLUMNS}"
    ))
    .bind(&snapshot.id)
    .bind(snapshot.sandbox_id.as_str())
    .bind(snapshot.generation)
    .bind(&snapshot.cow_manifest)
    .bind(&snapshot.home_manifest)
    .bind(i64::try_from(snapshot.bytes).unwrap_or(i64::MAX))
    .bind(&snapshot.reason)
    .bind(crate::now_millis())
    .bind(owner.map(|owner| owner.node_id.as_str()))
    .bind(owner.map(|owner| owner.token))
    .fetch_optional(db)
    .await
    .map_err(StoreError::on_sandbox(
        "record a runtime snapshot",
        &snapshot.sandbox_id,
    ))?;
    match row {
        Some(row) => runtime_snapshot_from_row(&row),
        None => Err(StoreError::NotOwner {
            sandbox: snapshot.sandbox_id.clone(),
            token: owner.map_or(0, |owner| owner.token),
        }),
    }
}

pub(crate) async fn get_snapshot<D: Dialect>(
    db: &D,
    id: &str,
) -> Result<Option<RuntimeSnapshot>, StoreError> {
    let row = Query::new(format!(
        "SELECT {SNAPSHOT_COLUMNS} FROM runtime_snapshots WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("read a runtime snapshot"))?;
    row.as_ref().map(runtime_snapshot_from_row).transpose()
}

pub(crate) async fn delete_snapshot<D: Dialect>(db: &D, id: &str) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM runtime_snapshots WHERE id = $1")
        .bind(id)
        .execute(db)
        .await
        .map_err(StoreError::query("delete a runtime snapshot"))?;
    Ok(removed == 1)
}

pub(crate) async fn list_snapshots<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
) -> Result<Vec<RuntimeSnapshot>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {SNAPSHOT_COLUMNS} FROM runtime_snapshots WHERE sandbox_id = $1 \
         ORDER BY created_at, id"
    ))
    .bind(sandbox.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list runtime snapshots"))?;
    rows.iter().map(runtime_snapshot_from_row).collect()
}

/// Every manifest a uid's checkpoints and runtime snapshots name, in byte order: one
/// garbage collector serves both.
pub(crate) async fn live_manifests<D: Dialect>(
    db: &D,
    uid: &Uid,
) -> Result<Vec<String>, StoreError> {
    let rows = Query::new(format!(
        "SELECT c.manifest{bytewise} AS manifest FROM checkpoints c \
         JOIN sandboxes s ON s.id = c.sandbox_id WHERE s.uid = $1 \
         UNION SELECT r.cow_manifest FROM runtime_snapshots r \
         JOIN sandboxes s ON s.id = r.sandbox_id WHERE s.uid = $1 \
         UNION SELECT r.home_manifest FROM runtime_snapshots r \
         JOIN sandboxes s ON s.id = r.sandbox_id WHERE s.uid = $1 ORDER BY 1",
        bytewise = D::BYTEWISE
    ))
    .bind(uid.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list live manifests"))?;
    rows.iter()
        .map(|row| {
            Columns {
                row,
                table: "checkpoints",
            }
            .get("manifest")
        })
        .collect()
}
