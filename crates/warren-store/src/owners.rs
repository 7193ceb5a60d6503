//! One owner per runtime (issue 14): the node that may start, exec in, snapshot or
//! destroy a sandbox's runtime, recorded with a fencing token that grows at every change
//! of owner.
//!
//! The rule, decided inside the store in one transaction, so two replicas can never both
//! win: a claim by a live member takes a runtime nobody owns, keeps one it owns at its
//! current epoch, and *takes over* one whose owner's epoch is no longer live (lapsed,
//! left or superseded: final for that epoch, see `nodes.rs`) with a larger token. A
//! takeover closes the lost owner's runs in flight as `node_lost` and marks a running
//! sandbox stopped, so the new owner starts its runtime afresh (from the latest runtime
//! snapshot, I30). Every write about the runtime afterwards names the token it holds
//! ([`OwnerFence`]); one whose token was superseded is refused with
//! [`StoreError::NotOwner`](crate::StoreError::NotOwner), so a paused node's late writes
//! never land.

use crate::rows::Columns;
use crate::sql::{Dialect, Query, Record, Tx};
use crate::StoreError;
use warren_core::SandboxId;

/// The failure reason of a run whose node lost its runtime to a takeover.
pub const NODE_LOST: &str = "node_lost";

/// A sandbox's runtime ownership as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeOwner {
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// The owning node; `None` when nobody owns the runtime.
    pub node_id: Option<String>,
    /// The owner's epoch when it claimed (or adopted) the runtime.
    pub epoch: i64,
    /// Grows at every change of owner; 0 before the first claim.
    pub token: i64,
}

/// What [`StateStore::claim_runtime`](crate::StateStore::claim_runtime) decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeClaim {
    /// The claimer owns the runtime, with this token.
    Owned {
        /// The fencing token of this ownership.
        token: i64,
        /// Set when the claim took the runtime from a node whose epoch was not live.
        took_over: Option<TakenOver>,
    },
    /// A live node owns it: runtime operations go there.
    Elsewhere {
        /// The owner.
        node_id: String,
        /// Where other replicas reach it.
        advertise: String,
        /// Its token.
        token: i64,
    },
    /// The claimer's own epoch is not live (its lease lapsed, it left, or another process
    /// registered its id): it must join again before it may own anything.
    NotMember,
}

/// The owner a takeover replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    /// The node that owned the runtime.
    pub node_id: String,
    /// At this epoch.
    pub epoch: i64,
    /// Its runs in flight, now closed as [`NODE_LOST`].
    pub lost_runs: u64,
}

/// The ownership a write about a runtime is made under: refused unless `node_id` still
/// owns the runtime with `token`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OwnerFence {
    /// The node making the write.
    pub node_id: String,
    /// The token it holds.
    pub token: i64,
}

/// What the claim rule does with a runtime's row, given the claimer and the current owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimStep {
    /// Ours already, at our epoch.
    Keep,
    /// Nobody's: take it with token + 1.
    Take,
    /// A live node's.
    Elsewhere,
    /// A node's whose epoch is not live: take it with token + 1 and close its runs.
    TakeOver,
}

/// The one claim rule both stores apply (inside their transaction).
///
/// `owner_live` says whether the current owner's recorded epoch is its live one.
pub(crate) fn claim_step(
    current: &RuntimeOwner,
    node_id: &str,
    epoch: i64,
    owner_live: bool,
) -> ClaimStep {
    match current.node_id.as_deref() {
        None => ClaimStep::Take,
        Some(owner) if owner == node_id && current.epoch == epoch => ClaimStep::Keep,
        Some(_) if owner_live => ClaimStep::Elsewhere,
        Some(_) => ClaimStep::TakeOver,
    }
}

fn owner_from_row(row: &impl Record) -> Result<RuntimeOwner, StoreError> {
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
async fn owner_row<D: Dialect>(
    tx: &mut Tx<'_, D>,
    now: i64,
    sandbox: &SandboxId,
    operation: &'static str,
) -> Result<RuntimeOwner, StoreError> {
    Query::new(
        "INSERT INTO runtime_owners (sandbox_id, node_id, epoch, token, since) \
         VALUES ($1, NULL, 0, 0, $2) ON CONFLICT (sandbox_id) DO NOTHING",
    )
    .bind(sandbox.as_str())
    .bind(now)
    .execute_in(tx)
    .await
    .map_err(StoreError::query(operation))?;
    let row = Query::new(format!(
        "SELECT sandbox_id, node_id, epoch, token FROM runtime_owners WHERE sandbox_id = $1\
         {}",
        D::FOR_UPDATE
    ))
    .bind(sandbox.as_str())
    .fetch_one_in(tx)
    .await
    .map_err(StoreError::query(operation))?;
    owner_from_row(&row)
}

/// Whether `node_id` is live at `epoch` by `now`, and where it is reached.
async fn node_live<D: Dialect>(
    tx: &mut Tx<'_, D>,
    now: i64,
    node_id: &str,
    epoch: i64,
    operation: &'static str,
) -> Result<Option<String>, StoreError> {
    let row = Query::new(
        "SELECT advertise FROM nodes WHERE node_id = $1 AND epoch = $2 \
         AND left_at IS NULL AND expires_at > $3",
    )
    .bind(node_id)
    .bind(epoch)
    .bind(now)
    .fetch_optional_in(tx)
    .await
    .map_err(StoreError::query(operation))?;
    row.map(|row| {
        Columns {
            row: &row,
            table: "nodes",
        }
        .get("advertise")
    })
    .transpose()
}

async fn set_owner<D: Dialect>(
    tx: &mut Tx<'_, D>,
    now: i64,
    sandbox: &SandboxId,
    node_id: Option<&str>,
    epoch: i64,
    token: i64,
    operation: &'static str,
) -> Result<(), StoreError> {
    Query::new(
        "UPDATE runtime_owners SET node_id = $2, epoch = $3, token = $4, since = $5 \
         WHERE sandbox_id = $1",
    )
    .bind(sandbox.as_str())
    .bind(node_id)
    .bind(epoch)
    .bind(token)
    .bind(now)
    .execute_in(tx)
    .await
    .map_err(StoreError::query(operation))?;
    Ok(())
}

pub(crate) async fn claim<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    node_id: &str,
    epoch: i64,
    sole: bool,
) -> Result<RuntimeClaim, StoreError> {
    const OPERATION: &str = "claim a runtime";
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    let now = tx.now().await.map_err(StoreError::query(OPERATION))?;
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
        step @ (ClaimStep::Take | ClaimStep::TakeOver) => {
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
            let took_over = if step == ClaimStep::TakeOver {
                let lost_runs = Query::new(
                    "UPDATE runs SET status = 'failed', finished_at = $2, failure_reason = $3 \
                     WHERE sandbox_id = $1 AND status = 'running'",
                )
                .bind(sandbox.as_str())
                .bind(now)
                .bind(NODE_LOST)
                .execute_in(&mut tx)
                .await
                .map_err(StoreError::query(OPERATION))?;
                // The lost node's runtime is gone for this store: the new owner starts one.
                Query::new(
                    "UPDATE sandboxes SET state = 'stopped', updated_at = $2 \
                     WHERE id = $1 AND state = 'running'",
                )
                .bind(sandbox.as_str())
                .bind(now)
                .execute_in(&mut tx)
                .await
                .map_err(StoreError::query(OPERATION))?;
                Some(TakenOver {
                    node_id: current.node_id.clone().unwrap_or_default(),
                    epoch: current.epoch,
                    lost_runs,
                })
            } else {
                None
            };
            RuntimeClaim::Owned { token, took_over }
        }
    };
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(claim)
}

pub(crate) async fn adopt<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    node_id: &str,
    epoch: i64,
) -> Result<Option<i64>, StoreError> {
    const OPERATION: &str = "adopt a runtime";
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    let now = tx.now().await.map_err(StoreError::query(OPERATION))?;
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

pub(crate) async fn release<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    node_id: &str,
    token: i64,
) -> Result<bool, StoreError> {
    let done = Query::new(
        "UPDATE runtime_owners SET node_id = NULL, since = :now \
         WHERE sandbox_id = $1 AND node_id = $2 AND token = $3",
    )
    .bind(sandbox.as_str())
    .bind(node_id)
    .bind(token)
    .clock(db)
    .execute(db)
    .await
    .map_err(StoreError::query("release a runtime"))?;
    Ok(done == 1)
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
) -> Result<Option<RuntimeOwner>, StoreError> {
    let row = Query::new(
        "SELECT sandbox_id, node_id, epoch, token FROM runtime_owners WHERE sandbox_id = $1",
    )
    .bind(sandbox.as_str())
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("read a runtime's owner"))?;
    row.as_ref().map(owner_from_row).transpose()
}

pub(crate) async fn list<D: Dialect>(db: &D) -> Result<Vec<RuntimeOwner>, StoreError> {
    let rows = Query::new(
        "SELECT sandbox_id, node_id, epoch, token FROM runtime_owners \
         WHERE node_id IS NOT NULL ORDER BY sandbox_id",
    )
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list runtime owners"))?;
    rows.iter().map(owner_from_row).collect()
}

/// `Ok` when `fence` still holds the runtime (the write it guarded failed for another
/// reason), [`StoreError::NotOwner`] otherwise.
pub(crate) async fn refuse_unless_owner<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    fence: &crate::OwnerFence,
) -> Result<(), StoreError> {
    match get(db, sandbox).await? {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(node: Option<&str>, epoch: i64, token: i64) -> RuntimeOwner {
        RuntimeOwner {
            sandbox_id: SandboxId::derive(
                &warren_core::Uid::new("u").unwrap(),
                &warren_core::RuntimeScope::new("s").unwrap(),
            ),
            node_id: node.map(str::to_owned),
            epoch,
            token,
        }
    }

    #[test]
    fn the_claim_rule_keeps_takes_defers_and_takes_over() {
        assert_eq!(
            claim_step(&owner(None, 0, 0), "a", 1, false),
            ClaimStep::Take
        );
        assert_eq!(
            claim_step(&owner(None, 3, 7), "a", 1, false),
            ClaimStep::Take
        );
        assert_eq!(
            claim_step(&owner(Some("a"), 1, 2), "a", 1, true),
            ClaimStep::Keep
        );
        assert_eq!(
            claim_step(&owner(Some("b"), 4, 2), "a", 1, true),
            ClaimStep::Elsewhere
        );
        assert_eq!(
            claim_step(&owner(Some("b"), 4, 2), "a", 1, false),
            ClaimStep::TakeOver
        );
        // Our own older epoch is a node that is gone: its runtime is taken over too.
        assert_eq!(
            claim_step(&owner(Some("a"), 1, 2), "a", 2, false),
            ClaimStep::TakeOver
        );
    }
}
