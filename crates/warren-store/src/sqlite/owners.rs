//! Runtime ownership on SQLite (see `owners.rs` for the rule). Each decision runs in one
//! `BEGIN IMMEDIATE` transaction: the write lock is taken before the owner row is read,
//! so two claimers serialise.

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Row, Sqlite, Transaction};
use warren_core::SandboxId;

use crate::owners::{claim_step, ClaimStep, RuntimeClaim, RuntimeOwner, TakenOver, NODE_LOST};
use crate::StoreError;

fn owner_from_row(row: &SqliteRow) -> Result<RuntimeOwner, StoreError> {
    let columns = crate::rows::Columns {
        row,
        table: "runtime_owners",
    };
    Ok(RuntimeOwner {
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        node_id: columns.get("node_id")?,
        epoch: columns.get("epoch")?,
        token: columns.get("token")?,
    })
}

/// The owner row of `sandbox`, made (nobody's, token 0) when missing.
async fn owner_row(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    sandbox: &SandboxId,
    operation: &'static str,
) -> Result<RuntimeOwner, StoreError> {
    sqlx::query(
        "INSERT INTO runtime_owners (sandbox_id, node_id, epoch, token, since) \
         VALUES (?1, NULL, 0, 0, ?2) ON CONFLICT (sandbox_id) DO NOTHING",
    )
    .bind(sandbox.as_str())
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(StoreError::query(operation))?;
    let row = sqlx::query(
        "SELECT sandbox_id, node_id, epoch, token FROM runtime_owners WHERE sandbox_id = ?1",
    )
    .bind(sandbox.as_str())
    .fetch_one(&mut **tx)
    .await
    .map_err(StoreError::query(operation))?;
    owner_from_row(&row)
}

/// Whether `node_id` is live at `epoch` by `now`, and where it is reached.
async fn node_live(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    node_id: &str,
    epoch: i64,
    operation: &'static str,
) -> Result<Option<String>, StoreError> {
    let row = sqlx::query(
        "SELECT advertise FROM nodes WHERE node_id = ?1 AND epoch = ?2 \
         AND left_at IS NULL AND expires_at > ?3",
    )
    .bind(node_id)
    .bind(epoch)
    .bind(now)
    .fetch_optional(&mut **tx)
    .await
    .map_err(StoreError::query(operation))?;
    row.map(|row| row.try_get("advertise"))
        .transpose()
        .map_err(StoreError::query(operation))
}

async fn set_owner(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    sandbox: &SandboxId,
    node_id: Option<&str>,
    epoch: i64,
    token: i64,
    operation: &'static str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE runtime_owners SET node_id = ?2, epoch = ?3, token = ?4, since = ?5 \
         WHERE sandbox_id = ?1",
    )
    .bind(sandbox.as_str())
    .bind(node_id)
    .bind(epoch)
    .bind(token)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(StoreError::query(operation))?;
    Ok(())
}

pub(super) async fn claim(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
    node_id: &str,
    epoch: i64,
    sole: bool,
) -> Result<RuntimeClaim, StoreError> {
    const OPERATION: &str = "claim a runtime";
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(StoreError::query(OPERATION))?;
    if node_live(&mut tx, now, node_id, epoch, OPERATION)
        .await?
        .is_none()
    {
        return Ok(RuntimeClaim::NotMember);
    }
    let current = owner_row(&mut tx, now, sandbox, OPERATION).await?;
    let owner_at = match &current.node_id {
        Some(_) if sole => None,
        Some(owner) => node_live(&mut tx, now, owner, current.epoch, OPERATION).await?,
        None => None,
    };
    let claim = match claim_step(&current, node_id, epoch, owner_at.is_some()) {
        ClaimStep::Keep => RuntimeClaim::Owned {
            token: current.token,
            took_over: None,
        },
        ClaimStep::Elsewhere => RuntimeClaim::Elsewhere {
            // claim_step says Elsewhere only for an owner whose address was read.
            node_id: current.node_id.clone().unwrap_or_default(),
            advertise: owner_at.unwrap_or_default(),
            token: current.token,
        },
        ClaimStep::Take => {
            let token = current.token + 1;
            set_owner(
                &mut tx,
                now,
                sandbox,
                Some(node_id),
                epoch,
                token,
                OPERATION,
            )
            .await?;
            RuntimeClaim::Owned {
                token,
                took_over: None,
            }
        }
        ClaimStep::TakeOver => {
            let token = current.token + 1;
            set_owner(
                &mut tx,
                now,
                sandbox,
                Some(node_id),
                epoch,
                token,
                OPERATION,
            )
            .await?;
            let lost_runs = sqlx::query(
                "UPDATE runs SET status = 'failed', finished_at = ?2, failure_reason = ?3 \
                 WHERE sandbox_id = ?1 AND status = 'running'",
            )
            .bind(sandbox.as_str())
            .bind(now)
            .bind(NODE_LOST)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?
            .rows_affected();
            // The lost node's runtime is gone for this store: the new owner starts one.
            sqlx::query(
                "UPDATE sandboxes SET state = 'stopped', updated_at = ?2 \
                 WHERE id = ?1 AND state = 'running'",
            )
            .bind(sandbox.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
            RuntimeClaim::Owned {
                token,
                took_over: Some(TakenOver {
                    node_id: current.node_id.clone().unwrap_or_default(),
                    epoch: current.epoch,
                    lost_runs,
                }),
            }
        }
    };
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(claim)
}

pub(super) async fn adopt(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
    node_id: &str,
    epoch: i64,
) -> Result<Option<i64>, StoreError> {
    const OPERATION: &str = "adopt a runtime";
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(StoreError::query(OPERATION))?;
    let current = owner_row(&mut tx, now, sandbox, OPERATION).await?;
    let token = match current.node_id.as_deref() {
        // Never claimed: a runtime from before ownership was recorded (one node).
        None if current.token == 0 => 1,
        Some(owner) if owner == node_id => current.token,
        _ => return Ok(None),
    };
    set_owner(
        &mut tx,
        now,
        sandbox,
        Some(node_id),
        epoch,
        token,
        OPERATION,
    )
    .await?;
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(Some(token))
}

pub(super) async fn release(
    pool: &SqlitePool,
    now: i64,
    sandbox: &SandboxId,
    node_id: &str,
    token: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE runtime_owners SET node_id = NULL, since = ?4 \
         WHERE sandbox_id = ?1 AND node_id = ?2 AND token = ?3",
    )
    .bind(sandbox.as_str())
    .bind(node_id)
    .bind(token)
    .bind(now)
    .execute(pool)
    .await
    .map_err(StoreError::query("release a runtime"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn get(
    pool: &SqlitePool,
    sandbox: &SandboxId,
) -> Result<Option<RuntimeOwner>, StoreError> {
    let row = sqlx::query(
        "SELECT sandbox_id, node_id, epoch, token FROM runtime_owners WHERE sandbox_id = ?1",
    )
    .bind(sandbox.as_str())
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("read a runtime's owner"))?;
    row.as_ref().map(owner_from_row).transpose()
}

pub(super) async fn list(pool: &SqlitePool) -> Result<Vec<RuntimeOwner>, StoreError> {
    let rows = sqlx::query(
        "SELECT sandbox_id, node_id, epoch, token FROM runtime_owners \
         WHERE node_id IS NOT NULL ORDER BY sandbox_id",
    )
    .fetch_all(pool)
    .await
    .map_err(StoreError::query("list runtime owners"))?;
    rows.iter().map(owner_from_row).collect()
}

/// `Ok` when `fence` still holds the runtime (the write it guarded failed for another
/// reason), [`StoreError::NotOwner`] otherwise.
pub(super) async fn refuse_unless_owner(
    pool: &SqlitePool,
    sandbox: &SandboxId,
    fence: &crate::OwnerFence,
) -> Result<(), StoreError> {
    match get(pool, sandbox).await? {
        Some(owner)
            if owner.node_id.as_deref() == Some(fence.node_id.as_str())
                && owner.token == fence.token =>
        {
            Ok(())
        }
        _ => Err(StoreError::NotOwner {
            sandbox: sandbox.clone(),
            token: fence.token,
        }),
    }
}
