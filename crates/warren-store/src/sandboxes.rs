//! Sandboxes: the one row per (uid, runtime scope) that arbitrates which runtime is whose
//! (I5), its binding, state and generation.

use warren_core::{SandboxId, Uid};

use crate::rows::{json_column, sandbox_from_row};
use crate::sql::{Dialect, Query, Tx};
use crate::StoreError;
use crate::{NewSandbox, OwnerFence, SandboxClaim, SandboxRecord, SandboxSettings, SandboxState};

/// The columns of a sandbox row.
const COLUMNS: &str = "id, uid, runtime_scope, workdir, network, backend, state, \
     generation, created_at, last_active_at, updated_at, inherit_env, ephemeral, \
     seed_snapshot, image, layout, extra_mounts, isolation, labels, deadline_at, on_deadline, \
     branch";

/// Claims the sandbox of `new`'s identity (see [`crate::StateStore::claim_sandbox`]).
///
/// The claim reads the row and then writes in one transaction that keeps every other
/// claimer of the identity out (the dialect's write lock, a lock on the identity and the
/// row), so two claimers can never both see "no sandbox" (or both "terminated") and both
/// create one.
pub(crate) async fn claim<D: Dialect>(
    db: &D,
    new: &NewSandbox,
) -> Result<SandboxClaim, StoreError> {
    const OPERATION: &str = "claim a sandbox";
    if SandboxId::derive(&new.uid, &new.runtime_scope) != new.id {
        return Err(StoreError::SandboxIdMismatch {
            id: new.id.clone(),
            uid: new.uid.clone(),
            scope: new.runtime_scope.clone(),
        });
    }
    let network = json_column("sandboxes", "network", &new.binding.network)?;
    let extra_mounts = json_column("sandboxes", "extra_mounts", &new.binding.extra_mounts)?;
    let labels = json_column("sandboxes", "labels", &new.settings.labels)?;
    let deadline = new.settings.deadline.map(|time| time.timestamp_millis());
    let now = crate::now_millis();
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    tx.lock(&format!("sandbox:{}", new.id))
        .await
        .map_err(StoreError::query(OPERATION))?;
    let current = tx
        .fetch_optional(
            Query::new(format!(
                "SELECT {COLUMNS} FROM sandboxes WHERE id = $1{}",
                D::FOR_UPDATE
            ))
            .bind(new.id.as_str()),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    let statement = match current.as_ref().map(sandbox_from_row).transpose()? {
        Some(record) if record.state != SandboxState::Terminated => {
            tx.rollback().await.map_err(StoreError::query(OPERATION))?;
            return Ok(SandboxClaim::join_or_conflict(record, new));
        }
        Some(_terminated) => Query::new(format!(
            "UPDATE sandboxes SET uid = $2, runtime_scope = $3, workdir = $4, backend = $5, \
             state = $6, generation = generation + 1, created_at = $7, last_active_at = $7, \
             updated_at = $7, network = $8, inherit_env = $9, ephemeral = $10, \
             seed_snapshot = $11, image = $12, layout = $13, extra_mounts = $14, \
             isolation = $15, labels = $16, deadline_at = $17, on_deadline = $18, \
             branch = $19 WHERE id = $1 RETURNING {COLUMNS}"
        )),
        None => Query::new(format!(
            "INSERT INTO sandboxes (id, uid, runtime_scope, workdir, backend, state, \
             generation, created_at, last_active_at, updated_at, network, inherit_env, \
             ephemeral, seed_snapshot, image, layout, extra_mounts, isolation, labels, \
             deadline_at, on_deadline, branch) \
             VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7, $7, $8, $9, $10, $11, $12, $13, $14, \
             $15, $16, $17, $18, $19) RETURNING {COLUMNS}"
        )),
    };
    let row = tx
        .fetch_one(
            statement
                .bind(new.id.as_str())
                .bind(new.uid.as_str())
                .bind(new.runtime_scope.as_str())
                .bind(new.binding.workdir.as_str())
                .bind(new.binding.backend.as_str())
                .bind(SandboxState::Created.as_str())
                .bind(now)
                .bind(network.as_str())
                .bind(new.binding.inherit_env)
                .bind(new.binding.ephemeral)
                .bind(&new.seed_snapshot)
                .bind(&new.binding.image)
                .bind(new.binding.layout.as_str())
                .bind(extra_mounts.as_str())
                .bind(new.binding.isolation.as_str())
                .bind(labels.as_str())
                .bind(deadline)
                .bind(new.settings.on_deadline.as_str())
                .bind(new.binding.branch.as_ref().map(|name| name.as_str())),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    let record = sandbox_from_row(&row)?;
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(SandboxClaim::Created(record))
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    id: &SandboxId,
) -> Result<Option<SandboxRecord>, StoreError> {
    let row = Query::new(format!("SELECT {COLUMNS} FROM sandboxes WHERE id = $1"))
        .bind(id.as_str())
        .fetch_optional(db)
        .await
        .map_err(StoreError::query("read a sandbox"))?;
    row.as_ref().map(sandbox_from_row).transpose()
}

pub(crate) async fn list<D: Dialect>(
    db: &D,
    uid: Option<&Uid>,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let query = match uid {
        Some(uid) => Query::new(format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE uid = $1 ORDER BY created_at, id"
        ))
        .bind(uid.as_str()),
        None => Query::new(format!(
            "SELECT {COLUMNS} FROM sandboxes ORDER BY created_at, id"
        )),
    };
    let rows = query
        .fetch_all(db)
        .await
        .map_err(StoreError::query("list sandboxes"))?;
    rows.iter().map(sandbox_from_row).collect()
}

pub(crate) async fn set_state<D: Dialect>(
    db: &D,
    id: &SandboxId,
    generation: i64,
    from: SandboxState,
    to: SandboxState,
) -> Result<Option<SandboxRecord>, StoreError> {
    // The generation and state tests are part of the UPDATE itself: no race.
    let row = Query::new(format!(
        "UPDATE sandboxes SET state = $4, updated_at = $5 \
         WHERE id = $1 AND generation = $2 AND state = $3 RETURNING {COLUMNS}"
    ))
    .bind(id.as_str())
    .bind(generation)
    .bind(from.as_str())
    .bind(to.as_str())
    .bind(crate::now_millis())
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("set a sandbox state"))?;
    row.as_ref().map(sandbox_from_row).transpose()
}

pub(crate) async fn set_settings<D: Dialect>(
    db: &D,
    id: &SandboxId,
    generation: i64,
    settings: &SandboxSettings,
) -> Result<Option<SandboxRecord>, StoreError> {
    let labels = json_column("sandboxes", "labels", &settings.labels)?;
    let row = Query::new(format!(
        "UPDATE sandboxes SET labels = $3, deadline_at = $4, on_deadline = $5, \
         updated_at = $6 WHERE id = $1 AND generation = $2 RETURNING {COLUMNS}"
    ))
    .bind(id.as_str())
    .bind(generation)
    .bind(labels.as_str())
    .bind(settings.deadline.map(|time| time.timestamp_millis()))
    .bind(settings.on_deadline.as_str())
    .bind(crate::now_millis())
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("set a sandbox's settings"))?;
    row.as_ref().map(sandbox_from_row).transpose()
}

/// Binds a sandbox with no runtime to a branch of its workdir (a fork moves its source
/// onto one). Only while the generation has no runtime: `created`, `stopped` or `paused`.
pub(crate) async fn set_branch<D: Dialect>(
    db: &D,
    id: &SandboxId,
    generation: i64,
    branch: Option<&warren_core::BranchName>,
) -> Result<Option<SandboxRecord>, StoreError> {
    let row = Query::new(format!(
        "UPDATE sandboxes SET branch = $3, updated_at = $4 WHERE id = $1 AND generation = $2 \
         AND state IN ('created', 'stopped', 'paused') RETURNING {COLUMNS}"
    ))
    .bind(id.as_str())
    .bind(generation)
    .bind(branch.map(|name| name.as_str()))
    .bind(crate::now_millis())
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("bind a sandbox to a branch"))?;
    row.as_ref().map(sandbox_from_row).transpose()
}

pub(crate) async fn due<D: Dialect>(
    db: &D,
    now: chrono::DateTime<chrono::Utc>,
    limit: u32,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {COLUMNS} FROM sandboxes WHERE deadline_at IS NOT NULL \
         AND deadline_at <= $1 AND state IN ('created', 'running', 'stopped') \
         ORDER BY deadline_at, id LIMIT $2"
    ))
    .bind(now.timestamp_millis())
    .bind(i64::from(limit))
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list sandboxes past their deadline"))?;
    rows.iter().map(sandbox_from_row).collect()
}

pub(crate) async fn touch<D: Dialect>(db: &D, id: &SandboxId) -> Result<(), StoreError> {
    // Never backwards: a touch from a replica whose clock runs behind keeps the later time.
    let touched = Query::new(
        "UPDATE sandboxes SET last_active_at = \
         CASE WHEN last_active_at > $2 THEN last_active_at ELSE $2 END WHERE id = $1",
    )
    .bind(id.as_str())
    .bind(crate::now_millis())
    .execute(db)
    .await
    .map_err(StoreError::query("touch a sandbox"))?;
    if touched == 0 {
        return Err(StoreError::UnknownSandbox { id: id.clone() });
    }
    Ok(())
}

/// [`set_state`] for a runtime a node owns: written only while `fence` still holds it.
pub(crate) async fn set_runtime_state<D: Dialect>(
    db: &D,
    id: &SandboxId,
    generation: i64,
    from: SandboxState,
    to: SandboxState,
    fence: &OwnerFence,
) -> Result<Option<SandboxRecord>, StoreError> {
    let row = Query::new(format!(
        "UPDATE sandboxes SET state = $3, updated_at = $4 \
         WHERE id = $1 AND generation = $2 AND state = $7 AND EXISTS (SELECT 1 \
         FROM runtime_owners WHERE sandbox_id = $1 AND node_id = $5 AND token = $6) \
         RETURNING {COLUMNS}"
    ))
    .bind(id.as_str())
    .bind(generation)
    .bind(to.as_str())
    .bind(crate::now_millis())
    .bind(fence.node_id.as_str())
    .bind(fence.token)
    .bind(from.as_str())
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("set a runtime's state"))?;
    match row {
        Some(row) => sandbox_from_row(&row).map(Some),
        None => crate::owners::refuse_unless_owner(db, id, fence)
            .await
            .map(|()| None),
    }
}
