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
