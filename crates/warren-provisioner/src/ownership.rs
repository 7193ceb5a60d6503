//! One owner per runtime (issue 14): which node runs a sandbox's runtime, and what this
//! node does about the runtimes it owns.
//!
//! The store decides ownership (`claim_runtime`, one transaction; see warren-store's
//! `owners.rs`); this module keeps the tokens this node holds, so the hot path (an exec in
//! a runtime this node owns) asks the store nothing more than before, and names its token
//! in every write about the runtime (`OwnerFence`), which the store refuses once another
//! node took the runtime over. A runtime owned by a live node elsewhere is reached through
//! a [`PeerLink`]: runtime operations are forwarded to the owner, never run here.
//!
//! **Self-fencing.** A node that cannot renew its lease by [`FENCE_AFTER`] of the TTL
//! after the last renewal it sent kills every runtime it hosts, before any other node may
//! take one over (that needs the whole TTL to pass on the store's clock since the renewal
//! arrived, which is later than it was sent). So two runtimes of one sandbox never run at
//! once, even across a partition. It then joins again with a new epoch and owns nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use warren_backend::OutputSink;
use warren_core::SandboxId;
use warren_store::{OwnerFence, RuntimeClaim};

use futures::stream::BoxStream;

use crate::{
    ExecInput, ExecReport, OutputEvent, ProcessAnswer, ProcessCall, Provisioner, ProvisionerError,
};

/// The part of the node lease TTL after which a node that could not renew fences itself:
/// the rest of the TTL is the margin for killing its runtimes before anyone may take over.
pub const FENCE_AFTER: (u32, u32) = (2, 3);

/// Another node of the cluster, as runtime operations are forwarded to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerNode {
    /// Its node id.
    pub node_id: String,
    /// Its internal URL (`--advertise`).
    pub advertise: String,
}

/// How runtime operations reach the node that owns the runtime. Implemented by the
/// transport that links replicas (warren-api's node-to-node client); the owner serves
/// each call with the `*_as_owner` methods of [`Provisioner`].
#[async_trait::async_trait]
pub trait PeerLink: Send + Sync + 'static {
    /// Runs `input` in the owner's runtime of `sandbox`, streaming output to `sink`, fenced
    /// by the caller's execution guard token (checked by the owner). Dropping the future
    /// ends the call, and the owner kills the command (I24).
    async fn exec(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
        fence: Option<crate::FenceToken>,
    ) -> Result<ExecReport, ProvisionerError>;

    /// Has the owner snapshot its runtime of `sandbox` (I30); the id of the snapshot it
    /// recorded in the shared store.
    async fn snapshot_runtime(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        reason: &str,
    ) -> Result<String, ProvisionerError>;

    /// Has the owner run one file operation in its runtime of `sandbox`
    /// ([`Provisioner::runtime_file_as_owner`]), `data` being what a write sends: its
    /// answer, and a read's bytes.
    async fn runtime_file(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        op: &warren_backend::FileOp,
        data: Vec<u8>,
    ) -> Result<warren_backend::FileReply, ProvisionerError>;

    /// Kills the processes of the owner's runtime of `sandbox`.
    async fn kill_processes(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
    ) -> Result<u64, ProvisionerError>;

    /// Ends the owner's runtime of `sandbox`, after at most `grace` for its commands.
    async fn end_runtime(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        grace: Duration,
    ) -> Result<(), ProvisionerError>;

    /// Has the owner serve a call on the processes of its runtime of `sandbox`
    /// ([`Provisioner::process_call_as_owner`]).
    async fn process_call(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        call: ProcessCall,
    ) -> Result<ProcessAnswer, ProvisionerError>;

    /// Follows the output of a process of the owner's runtime of `sandbox` from offset
    /// `from` ([`Provisioner::follow_process_as_owner`]). The stream ends without
    /// [`OutputEvent::End`] when the owner cannot be reached any more.
    async fn follow_process(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        pid: i32,
        from: u64,
    ) -> Result<BoxStream<'static, OutputEvent>, ProvisionerError>;

    /// Streams `chunks` to the stdin of a process of the owner's runtime of `sandbox`, at
    /// the pace the process reads them ([`Provisioner::write_stdin_as_owner`]).
    async fn write_stdin(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        pid: i32,
        chunks: BoxStream<'static, std::io::Result<Vec<u8>>>,
        close: bool,
    ) -> Result<u64, ProvisionerError>;
}

/// Where a sandbox's runtime runs, for one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Here: this node owns it, and writes about it name this fence.
    Here(OwnerFence),
    /// At a live node elsewhere.
    Elsewhere(PeerNode),
}

/// What this node knows of its own ownership.
#[derive(Debug, Default)]
pub(crate) struct Ownership {
    /// The runtimes this node owns, with their tokens.
    owned: Mutex<HashMap<SandboxId, i64>>,
    /// Set while the node is fenced: its lease could not be renewed in time, its runtimes
    /// were killed, and it must join again before it owns anything.
    fenced: AtomicBool,
    /// When the last renewal (or join) that succeeded was sent.
    renewed_at: Mutex<Option<Instant>>,
    /// Set when the node left the cluster: renewals stop.
    left: AtomicBool,
    /// Held for a whole fence, and by a join that lifts one: the kills finish before
    /// the node may own anything again, and a second fence waits for the first.
    pub(crate) fencing: tokio::sync::Mutex<()>,
    /// Where runtimes owned elsewhere were found, and when: a forward skips the claim for
    /// a third of the node TTL. Only a hint: the owner refuses what it no longer owns
    /// (`not_owner`), and a forward that fails forgets the entry.
    elsewhere: Mutex<HashMap<SandboxId, (PeerNode, Instant)>>,
}

impl Ownership {
    fn token(&self, sandbox: &SandboxId) -> Option<i64> {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.get(sandbox).copied()
    }

    pub(crate) fn insert(&self, sandbox: &SandboxId, token: i64) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.insert(sandbox.clone(), token);
    }

    fn remove(&self, sandbox: &SandboxId) -> Option<i64> {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.remove(sandbox)
    }

    fn take_all(&self) -> Vec<SandboxId> {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.drain().map(|(id, _)| id).collect()
    }

    fn remembered_owner(&self, sandbox: &SandboxId, valid: Duration) -> Option<PeerNode> {
        let elsewhere = self.elsewhere.lock().unwrap_or_else(|e| e.into_inner());
        elsewhere
            .get(sandbox)
            .filter(|(_, seen)| seen.elapsed() < valid)
            .map(|(owner, _)| owner.clone())
    }

    pub(crate) fn remember_owner(&self, sandbox: &SandboxId, owner: &PeerNode) {
        let mut elsewhere = self.elsewhere.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: entries past their validity go whenever the map grows large.
        if elsewhere.len() >= 4096 {
            elsewhere.retain(|_, (_, seen)| seen.elapsed() < Duration::from_secs(600));
        }
        elsewhere.insert(sandbox.clone(), (owner.clone(), Instant::now()));
    }

    pub(crate) fn forget_owner(&self, sandbox: &SandboxId) {
        let mut elsewhere = self.elsewhere.lock().unwrap_or_else(|e| e.into_inner());
        elsewhere.remove(sandbox);
    }

    pub(crate) fn owned_ids(&self) -> Vec<SandboxId> {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.keys().cloned().collect()
    }

    pub(crate) fn count(&self) -> usize {
        self.owned.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    pub(crate) fn leave(&self) {
        self.left.store(true, Ordering::SeqCst);
    }

    pub(crate) fn has_left(&self) -> bool {
        self.left.load(Ordering::SeqCst)
    }

    pub(crate) fn renewed(&self, sent: Instant) {
        let mut at = self.renewed_at.lock().unwrap_or_else(|e| e.into_inner());
        // A slow answer to an older renewal never moves the deadline back.
        if at.is_none_or(|previous| sent > previous) {
            *at = Some(sent);
        }
    }

    /// Whether the last renewal sent is older than `limit`.
    pub(crate) fn overdue(&self, limit: Duration) -> bool {
        let at = self.renewed_at.lock().unwrap_or_else(|e| e.into_inner());
        at.is_some_and(|sent| sent.elapsed() > limit)
    }
}

/// The local deadline of a node lease of `ttl`.
pub(crate) fn fence_deadline(ttl: Duration) -> Duration {
    ttl * FENCE_AFTER.0 / FENCE_AFTER.1
}

impl Provisioner {
    /// Installs the link runtime operations are forwarded over to other nodes.
    pub fn set_peer_link(&self, link: std::sync::Arc<dyn PeerLink>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        *peers = Some(link);
    }

    pub(crate) fn peer_link(&self) -> Result<std::sync::Arc<dyn PeerLink>, ProvisionerError> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.clone().ok_or(ProvisionerError::NoPeerLink)
    }

    /// The link to forward an operation on `sandbox` to its `owner` over, counted; without
    /// one (a lone server) the runtime is elsewhere for good.
    pub(crate) fn forwarding_to(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
    ) -> Result<std::sync::Arc<dyn PeerLink>, ProvisionerError> {
        let link = self
            .peer_link()
            .map_err(|_| ProvisionerError::RuntimeElsewhere {
                sandbox: sandbox.clone(),
                node: owner.node_id.clone(),
            })?;
        self.metrics.forwarded();
        Ok(link)
    }

    /// A forwarded operation's result, forgetting where the runtime was thought to be
    /// when the owner could not be reached or no longer owns it.
    pub(crate) fn after_forward<T>(
        &self,
        sandbox: &SandboxId,
        result: Result<T, ProvisionerError>,
    ) -> Result<T, ProvisionerError> {
        if let Err(ProvisionerError::PeerUnreachable { .. } | ProvisionerError::Forwarded { .. }) =
            &result
        {
            self.ownership.forget_owner(sandbox);
        }
        result
    }

    /// Whether this node is one replica of several (it has a link to the others).
    pub(crate) fn is_clustered(&self) -> bool {
        self.peer_link().is_ok()
    }

    /// Re-owns, at the current epoch, every runtime this node owns (a lone server whose
    /// lease lapsed and who joined again); one the store gives no more is destroyed.
    pub(crate) async fn readopt_owned(&self) -> Result<(), ProvisionerError> {
        for sandbox in self.ownership.owned_ids() {
            match self
                .store
                .adopt_runtime(&sandbox, &self.config.node.node_id, self.node_epoch())
                .await?
            {
                Some(token) => self.ownership.insert(&sandbox, token),
                None => self.drop_stale_runtime(&sandbox).await,
            }
        }
        Ok(())
    }

    /// The fence of a runtime this node owns, if it does (no store round trip).
    pub(crate) fn owner_fence(&self, sandbox: &SandboxId) -> Option<OwnerFence> {
        self.ownership.token(sandbox).map(|token| OwnerFence {
            node_id: self.config.node.node_id.clone(),
            token,
        })
    }

    /// Refuses runtime work while this node is fenced.
    pub(crate) fn refuse_if_fenced(&self) -> Result<(), ProvisionerError> {
        if self.ownership.is_fenced() {
            return Err(ProvisionerError::NodeFenced {
                node: self.config.node.node_id.clone(),
            });
        }
        Ok(())
    }

    /// The node this one last found owning `sandbox`'s runtime, within a third of the
    /// node TTL: a hint, which the owner checks (it refuses what it no longer owns).
    pub(crate) fn remembered_owner(&self, sandbox: &SandboxId) -> Option<PeerNode> {
        self.ownership
            .remembered_owner(sandbox, self.config.node.ttl / 3)
    }

    /// Where the runtime of `sandbox` runs: here (claimed now if nobody owns it, or taken
    /// over from a node whose lease lapsed), or at its live owner.
    pub(crate) async fn place_runtime(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Placement, ProvisionerError> {
        self.refuse_if_fenced()?;
        if let Some(fence) = self.owner_fence(sandbox) {
            return Ok(Placement::Here(fence));
        }
        if let Some(owner) = self.remembered_owner(sandbox) {
            return Ok(Placement::Elsewhere(owner));
        }
        for _ in 0..2 {
            let epoch = self.node_epoch();
            // Without a link to other replicas this is the only server on the store (one
            // PostgreSQL database, one server, held by its lock; or a SQLite file): any
            // other node's ownership is a dead server's.
            let sole = !self.is_clustered();
            match self
                .store
                .claim_runtime(sandbox, &self.config.node.node_id, epoch, sole)
                .await?
            {
                RuntimeClaim::Owned { token, took_over } => {
                    self.ownership.forget_owner(sandbox);
                    if let Some(lost) = took_over {
                        tracing::warn!(
                            %sandbox,
                            from = %lost.node_id,
                            from_epoch = lost.epoch,
                            token,
                            lost_runs = lost.lost_runs,
                            "took over a runtime whose node's lease lapsed; its runs in flight are recorded as node_lost and the runtime starts here from its latest snapshot"
                        );
                        self.metrics.took_over();
                    }
                    // A fence that went up meanwhile wins: the claim is given back.
                    if self.ownership.is_fenced() {
                        let _ = self
                            .store
                            .release_runtime(sandbox, &self.config.node.node_id, token)
                            .await;
                        self.refuse_if_fenced()?;
                    }
                    self.ownership.insert(sandbox, token);
                    return Ok(Placement::Here(OwnerFence {
                        node_id: self.config.node.node_id.clone(),
                        token,
                    }));
                }
                RuntimeClaim::Elsewhere {
                    node_id, advertise, ..
                } => {
                    let owner = PeerNode { node_id, advertise };
                    self.ownership.remember_owner(sandbox, &owner);
                    return Ok(Placement::Elsewhere(owner));
                }
                RuntimeClaim::NotMember => {
                    // Our epoch is not live (lapsed or superseded). The membership loop
                    // joins again, fencing first where replicas could take over; nothing
                    // here waits for it, since a caller may hold a lifecycle lock the
                    // fence takes. A join that happened meanwhile is tried once more.
                    if self.node_epoch() == epoch {
                        break;
                    }
                }
            }
        }
        Err(ProvisionerError::NodeFenced {
            node: self.config.node.node_id.clone(),
        })
    }

    /// Gives up a runtime this node destroyed.
    pub(crate) async fn release_runtime(&self, sandbox: &SandboxId) {
        if let Some(token) = self.ownership.remove(sandbox) {
            if let Err(error) = self
                .store
                .release_runtime(sandbox, &self.config.node.node_id, token)
                .await
            {
                // The row stays ours at this epoch; the next claim keeps or re-releases it.
                tracing::warn!(%sandbox, %error, "could not record giving up a runtime");
            }
        }
    }

    /// Forgets a runtime this node no longer owns, without touching the backend.
    pub(crate) fn ownership_lost(&self, sandbox: &SandboxId) {
        self.ownership.remove(sandbox);
    }

    /// Forgets a runtime another node took over (a write was refused as `NotOwner`): the
    /// runtime here is stale and goes.
    pub(crate) async fn drop_stale_runtime(&self, sandbox: &SandboxId) {
        self.ownership.remove(sandbox);
        tracing::warn!(%sandbox, "another node owns this runtime now; destroying the stale one here");
        let lock = self.lifecycle_lock(sandbox);
        let _held = lock.lock().await;
        if let Err(error) = self.backend.destroy(sandbox).await {
            tracing::error!(%sandbox, %error, "could not destroy a stale runtime");
        }
    }

    /// Kills every runtime this node hosts and refuses runtime work until it joined again:
    /// its lease could not be renewed in time, so another node may soon take its runtimes
    /// over.
    pub(crate) async fn fence_self(&self) {
        let _fencing = self.ownership.fencing.lock().await;
        if self.ownership.fenced.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut sandboxes = self.ownership.take_all();
        match self.backend.discover().await {
            Ok(found) => sandboxes.extend(found.into_iter().map(|runtime| runtime.spec.sandbox)),
            Err(error) => tracing::error!(%error, "self-fencing could not list the runtimes here"),
        }
        sandboxes.sort();
        sandboxes.dedup();
        tracing::error!(
            node = %self.config.node.node_id,
            runtimes = sandboxes.len(),
            "this node could not renew its lease in time: fencing itself, killing every runtime it hosts before another node may take them over"
        );
        self.metrics.self_fenced();
        for sandbox in sandboxes {
            // Under the lifecycle lock: a runtime being started now is seen by its starter
            // to be fenced, and destroyed there.
            let lock = self.lifecycle_lock(&sandbox);
            let _held = lock.lock().await;
            if let Err(error) = self.backend.destroy(&sandbox).await {
                tracing::error!(%sandbox, %error, "self-fencing could not destroy a runtime");
            }
        }
    }

    /// Lifts the fence after joining again with a new epoch.
    pub(crate) fn unfence(&self) {
        if self.ownership.fenced.swap(false, Ordering::SeqCst) {
            tracing::warn!(node = %self.config.node.node_id, epoch = self.node_epoch(), "joined the cluster again after fencing; this node owns no runtime until it claims one");
        }
    }

    /// Whether this node is fenced now.
    pub fn is_fenced(&self) -> bool {
        self.ownership.is_fenced()
    }

    /// How many runtimes this node owns.
    pub fn owned_runtimes(&self) -> usize {
        self.ownership.count()
    }
}
