//! warren's state store: workdirs, sandboxes and run records.
//!
//! Every command's result, exit status and resource use is recorded here (I22), and the
//! sandbox table is the single arbiter of which runtime belongs to which (uid, runtime scope)
//! (I5). Callers talk to the object-safe [`StateStore`] trait, implemented once by
//! [`SqlStore`] over a dialect: [`SqliteStore`] (the embedded default, one file) and
//! [`PostgresStore`] (one database shared by many warren processes). Each aggregate's
//! statements are written once, in its module; a dialect holds only what the engines do
//! differently. One behaviour suite holds both to the same rules.

mod agent_env;
mod aliases;
mod artifacts;
mod branches;
mod checkpoints;
mod egress;
mod error;
mod guard;
mod leases;
pub mod migrations;
mod model;
mod nodes;
mod objects;
mod owners;
mod postgres;
mod records;
mod rows;
mod runs;
mod sandboxes;
mod skills;
mod sql;
mod sqlite;
mod store;
mod workdirs;

pub use aliases::SandboxAlias;
pub use error::StoreError;
pub use guard::{FenceCheck, FenceHold, Guard, GuardAcquire, ManualClock};
pub use migrations::{
    ItemState, ItemUpdate, MigrationItem, MigrationRecord, MigrationState, NewMigration,
    NewMigrationItem,
};
pub use model::{
    BranchRecord, DeadlineAction, NewRun, NewSandbox, ParseEnumError, RunKind, RunOutcome,
    RunRecord, RunStatus, SandboxClaim, SandboxRecord, SandboxSettings, SandboxState,
    WorkdirRecord,
};
pub use nodes::{NodeRecord, NodeState};
pub use owners::{OwnerFence, RuntimeClaim, RuntimeOwner, TakenOver, NODE_LOST};
pub use postgres::{PostgresDialect, PostgresOptions, PostgresStore, ServerLock};
pub use records::{RecordWrite, TransportRecord, MAX_RECORD_KEY, MAX_RECORD_VALUE};
pub use runs::{RunCursor, RunPage, RunQuery, RunScope};
pub use sqlite::{SqliteDialect, SqliteStore};
pub use store::SqlStore;

/// A lease on one sandbox generation (I25).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Lease {
    /// The lease's id.
    pub id: String,
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// The generation it holds.
    pub generation: i64,
    /// Who holds it (a run id).
    pub holder: String,
    /// When it was taken.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it lapses unless renewed.
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// A file an agent presented as a result (I26).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Artifact {
    /// `art-<uuid>`.
    pub id: String,
    /// The sandbox that presented it.
    pub sandbox_id: SandboxId,
    /// The workspace owner; the bytes live in this uid's artifact store.
    pub uid: Uid,
    /// The virtual path it was presented from.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the bytes, lowercase hex; also the blob's name in the artifact store.
    pub sha256: String,
    /// Its media type, from the file name.
    pub media_type: String,
    /// When it was presented.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A recorded runtime snapshot (I30).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeSnapshot {
    /// `snap-<uuid>`.
    pub id: String,
    /// The sandbox whose runtime it records.
    pub sandbox_id: SandboxId,
    /// The generation it was taken in.
    pub generation: i64,
    /// The manifest of the copy-on-write layers.
    pub cow_manifest: String,
    /// The manifest of `/home/gem`.
    pub home_manifest: String,
    /// Bytes read.
    pub bytes: u64,
    /// Why it was taken: `api`, `reap`.
    pub reason: String,
    /// When it was taken.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A recorded workdir checkpoint (I28).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Checkpoint {
    /// `ckpt-<uuid>`.
    pub id: String,
    /// The sandbox whose workdir it records.
    pub sandbox_id: SandboxId,
    /// The workdir it records.
    pub workdir: Workdir,
    /// The manifest id in the uid's snapshot store.
    pub manifest: String,
    /// Regular files recorded.
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// When it was taken.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// One stored variable of a uid's agent environment (I14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEnvRecord {
    /// The variable.
    pub var: AgentEnvVar,
    /// When it was last set.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// One stored egress secret (issue 38): the uid's own (`sandbox` None, presented for every
/// sandbox of theirs) or one sandbox's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressSecretRecord {
    /// The uid it belongs to.
    pub uid: Uid,
    /// The one sandbox it belongs to, if not all of the uid's.
    pub sandbox: Option<SandboxId>,
    /// The secret, its value included: never shown by an API.
    pub secret: EgressSecret,
    /// When it was last set.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// One recorded egress event (I22), with the id a reader pages after.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EgressRecord {
    /// Its id: ids only grow, per store.
    pub id: i64,
    /// The connection.
    pub event: EgressEvent,
}

use warren_core::{AgentEnvVar, EgressEvent, EgressSecret, SandboxId, SecretName, Uid, Workdir};

/// The current time as stored: unix milliseconds, UTC.
pub(crate) fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A count or size as its column stores it.
pub(crate) fn to_i64(
    value: u64,
    table: &'static str,
    column: &'static str,
) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Corrupt {
        table,
        column,
        detail: format!("{value} is out of range"),
    })
}

/// The operations warren needs from its state store.
///
/// Implementations must be safe to share between tasks and, where the storage allows it,
/// between processes: every method is atomic on its own, and [`StateStore::claim_sandbox`]
/// and [`StateStore::set_sandbox_state`] are the only ways to change a sandbox's binding or
/// state, so their conditions are checked inside the storage, not by the caller.
#[async_trait::async_trait]
pub trait StateStore: Send + Sync + 'static {
    /// Records that `workdir` was created for `uid` (idempotent). Returns true when newly
    /// recorded.
    async fn record_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError>;

    /// The workdirs recorded for `uid`, oldest first (ties broken by path).
    async fn list_workdirs(&self, uid: &Uid) -> Result<Vec<WorkdirRecord>, StoreError>;

    /// The record of one workdir of `uid`, if recorded.
    async fn workdir(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<Option<WorkdirRecord>, StoreError>;

    /// Forgets the record of a workdir (one whose creation was undone). Returns true when
    /// a record was removed.
    async fn forget_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError>;

    /// Records a branch of a workdir (I27). Returns false, recording nothing, when the
    /// workdir already has a branch of that name.
    async fn record_branch(&self, branch: &BranchRecord) -> Result<bool, StoreError>;

    /// The uid's branches, of `workdir` or of every workdir, oldest first.
    async fn list_branches(
        &self,
        uid: &Uid,
        workdir: Option<&Workdir>,
    ) -> Result<Vec<BranchRecord>, StoreError>;

    /// Marks a branch merged into its workdir. Returns false when it was already (or is
    /// not recorded).
    async fn mark_branch_merged(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &warren_core::BranchName,
    ) -> Result<bool, StoreError>;

    /// Forgets a branch. Returns true when a record was removed.
    async fn forget_branch(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &warren_core::BranchName,
    ) -> Result<bool, StoreError>;

    /// Atomically claims the sandbox of `(new.uid, new.runtime_scope)`; race-free under many
    /// concurrent callers and processes.
    ///
    /// - no sandbox with that id: one is recorded with generation 1 and state
    ///   [`SandboxState::Created`] → [`SandboxClaim::Created`];
    /// - a sandbox that is not terminated, on the same workdir, network, environment policy,
    ///   backend and image → [`SandboxClaim::Existing`]; a difference in any of them is the
    ///   matching conflict (a live runtime's binding never changes, I16);
    /// - a sandbox that is not terminated, on another workdir →
    ///   [`SandboxClaim::WorkdirConflict`]: a live runtime cannot be rebound (I5);
    /// - a terminated sandbox: the same row gets generation + 1, the new binding (workdir,
    ///   network, environment policy, backend, image),
    ///   state [`SandboxState::Created`] and fresh times → [`SandboxClaim::Created`].
    ///
    /// Fails with [`StoreError::SandboxIdMismatch`] when `new.id` is not the id derived from
    /// `new.uid` and `new.runtime_scope`.
    async fn claim_sandbox(&self, new: &NewSandbox) -> Result<SandboxClaim, StoreError>;

    /// The sandbox with this id, if one was ever claimed.
    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError>;

    /// The sandboxes of `uid`, or of everyone when `None`, oldest first (ties broken by id).
    async fn list_sandboxes(&self, uid: Option<&Uid>) -> Result<Vec<SandboxRecord>, StoreError>;

    /// Moves the sandbox from state `from` to `to` only if its current generation is
    /// `generation` and its state still `from` (compare-and-set), so a stale caller cannot
    /// touch a newer generation and of two callers making one move only one succeeds.
    /// Which moves are legal is the provisioner's transition table; the store only refuses
    /// a changed row. Returns the updated record, or `None` when the id, generation or
    /// state does not match.
    async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
    ) -> Result<Option<SandboxRecord>, StoreError>;

    /// Binds the sandbox's generation `generation` to `branch` of its workdir while it has
    /// no runtime (`created`, `stopped` or `paused`); `None` when the id, generation or
    /// state does not match.
    async fn set_sandbox_branch(
        &self,
        id: &SandboxId,
        generation: i64,
        branch: Option<&warren_core::BranchName>,
    ) -> Result<Option<SandboxRecord>, StoreError>;

    /// Replaces the labels and deadline of the sandbox's generation `generation`. Returns
    /// the updated record, or `None` when the id or generation does not match.
    async fn set_sandbox_settings(
        &self,
        id: &SandboxId,
        generation: i64,
        settings: &SandboxSettings,
    ) -> Result<Option<SandboxRecord>, StoreError>;

    /// The sandboxes whose deadline is `now` or earlier and which are still live for it
    /// (created, running or stopped: a paused, terminating or terminated one has nothing
    /// left to end), earliest deadline first, at most `limit`.
    async fn sandboxes_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<Vec<SandboxRecord>, StoreError>;

    /// Sets the sandbox's `last_active_at` to now. Fails with [`StoreError::UnknownSandbox`]
    /// when no such sandbox exists.
    async fn touch_sandbox(&self, id: &SandboxId) -> Result<(), StoreError>;

    /// Records the start of a run: status [`RunStatus::Running`], started now, with the id
    /// the caller generated. Starting (and finishing) a run also moves the sandbox's
    /// `last_active_at`, in the same transaction. Fails with [`StoreError::UnknownSandbox`] when the sandbox was
    /// never claimed and [`StoreError::DuplicateRun`] when the id is taken.
    async fn start_run(&self, new: &NewRun) -> Result<RunRecord, StoreError>;

    /// Records how a running run ended, finished now: [`RunStatus::Failed`] when
    /// `outcome.failure` is set, [`RunStatus::Finished`] otherwise. Fails with
    /// [`StoreError::UnknownRun`] or [`StoreError::RunAlreadyFinished`]; an outcome is never
    /// overwritten.
    async fn finish_run(&self, run_id: &str, outcome: &RunOutcome)
        -> Result<RunRecord, StoreError>;

    /// One page of runs, newest first by `(started_at, id)`: those of a sandbox (all its
    /// generations) or of every sandbox of a uid, filtered by status and start time, after
    /// the query's cursor (see [`RunQuery`]). One statement, so a page is consistent. An
    /// unknown sandbox or uid has no runs: an empty page.
    async fn query_runs(&self, query: &RunQuery) -> Result<RunPage, StoreError>;

    /// Closes every run still running on `node_id` (and every running run that names no
    /// node: from before runs recorded one) as [`RunStatus::Failed`] with `reason`, as after
    /// that node's provisioner restarted nobody is left to finish them; other nodes' runs
    /// are theirs. Returns how many were closed.
    async fn fail_running_runs(&self, node_id: &str, reason: &str) -> Result<u64, StoreError>;

    /// Records a lease on the sandbox's current `generation`, live for `ttl`. Fails with
    /// [`StoreError::UnknownSandbox`] for a sandbox never claimed.
    async fn create_lease(
        &self,
        sandbox: &SandboxId,
        generation: i64,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError>;

    /// Extends a live lease to `ttl` from now. `None` when the lease does not exist or
    /// already expired (its holder must take a new one).
    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        lease: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<Lease>, StoreError>;

    /// Ends a lease; `false` when there was none.
    async fn release_lease(&self, sandbox: &SandboxId, lease: &str) -> Result<bool, StoreError>;

    /// How many leases on the sandbox's `generation` are live now.
    async fn live_leases(&self, sandbox: &SandboxId, generation: i64) -> Result<u64, StoreError>;

    /// The agent environment of `uid`, sorted by name; empty when none was set.
    async fn agent_env(&self, uid: &Uid) -> Result<Vec<AgentEnvRecord>, StoreError>;

    /// Replaces the whole agent environment of `uid` in one transaction (an empty list
    /// clears it). The caller has checked the variables and their number.
    async fn replace_agent_env(&self, uid: &Uid, vars: &[AgentEnvVar]) -> Result<(), StoreError>;

    /// Sets one variable of `uid`'s agent environment; `true` when it is new. Fails with
    /// [`StoreError::AgentEnvFull`] when a new variable would make more than `max`.
    async fn set_agent_env_var(
        &self,
        uid: &Uid,
        var: &AgentEnvVar,
        max: usize,
    ) -> Result<bool, StoreError>;

    /// Removes one variable; `false` when there was none.
    async fn remove_agent_env_var(&self, uid: &Uid, name: &str) -> Result<bool, StoreError>;

    /// The egress secrets of `uid` (`sandbox` None) or of one sandbox of theirs, by name.
    async fn egress_secrets(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<EgressSecretRecord>, StoreError>;

    /// Sets one egress secret of `uid` (`sandbox` None) or of one sandbox of theirs, adding
    /// it or rotating it in place; `true` when it is new. Fails with
    /// [`StoreError::EgressSecretsFull`] when a new one would make more than `max` there,
    /// counted in the same transaction as the write.
    async fn set_egress_secret(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
        secret: &EgressSecret,
        max: usize,
    ) -> Result<bool, StoreError>;

    /// Removes one egress secret; `false` when there was none.
    async fn remove_egress_secret(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
        name: &SecretName,
    ) -> Result<bool, StoreError>;

    /// Removes every egress secret and the egress authority of a sandbox (when it is
    /// removed); its egress events stay, the audit outlives the runtime.
    async fn remove_sandbox_egress(&self, sandbox: &SandboxId) -> Result<(), StoreError>;

    /// The sandbox's egress certificate authority, `(cert PEM, key PEM)`: `fresh` is stored
    /// when it has none yet, then what is stored is returned, so two servers racing agree
    /// on one.
    async fn egress_authority(
        &self,
        sandbox: &SandboxId,
        fresh: (String, String),
    ) -> Result<(String, String), StoreError>;

    /// Appends egress events in one transaction, then keeps at most `keep` per sandbox
    /// touched, the oldest dropped.
    async fn record_egress(&self, events: &[EgressEvent], keep: usize) -> Result<(), StoreError>;

    /// A sandbox's egress events oldest first: those with an id above `after`, at most
    /// `limit`.
    async fn egress_events(
        &self,
        sandbox: &SandboxId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<EgressRecord>, StoreError>;

    /// Records an artifact (its `created_at` is ignored: now is used). Fails with
    /// [`StoreError::UnknownSandbox`] for a sandbox never claimed.
    async fn record_artifact(&self, artifact: &Artifact) -> Result<Artifact, StoreError>;

    /// The artifacts of a sandbox, oldest first.
    async fn list_artifacts(&self, sandbox: &SandboxId) -> Result<Vec<Artifact>, StoreError>;

    /// Records a checkpoint (its `created_at` is ignored: now is used).
    async fn record_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Checkpoint, StoreError>;

    /// The checkpoints of a sandbox, oldest first.
    async fn list_checkpoints(&self, sandbox: &SandboxId) -> Result<Vec<Checkpoint>, StoreError>;

    /// Records a runtime snapshot (its `created_at` is ignored: now is used). With an
    /// `owner` fence it is recorded only while that ownership holds the runtime
    /// ([`StoreError::NotOwner`] otherwise): a node that lost the runtime while it read it
    /// never leaves a snapshot a later resume would pick.
    async fn record_runtime_snapshot(
        &self,
        snapshot: &RuntimeSnapshot,
        owner: Option<&OwnerFence>,
    ) -> Result<RuntimeSnapshot, StoreError>;

    /// One runtime snapshot, whichever sandbox took it.
    async fn get_runtime_snapshot(&self, id: &str) -> Result<Option<RuntimeSnapshot>, StoreError>;

    /// Forgets a runtime snapshot; `false` when there was none.
    async fn delete_runtime_snapshot(&self, id: &str) -> Result<bool, StoreError>;

    /// The runtime snapshots of a sandbox, oldest first.
    async fn list_runtime_snapshots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<RuntimeSnapshot>, StoreError>;

    /// The manifests every checkpoint of every sandbox of `uid` names: what a garbage
    /// collection of that uid's store must keep.
    async fn checkpoint_manifests_of_uid(&self, uid: &Uid) -> Result<Vec<String>, StoreError>;

    /// Forgets a checkpoint; `false` when there was none.
    async fn delete_checkpoint(&self, id: &str) -> Result<bool, StoreError>;

    /// Stores a snapshot object of `owner` unless it exists; `true` when written now.
    async fn put_object(&self, owner: &str, key: &str, bytes: &[u8]) -> Result<bool, StoreError>;

    /// A snapshot object of `owner`.
    async fn get_object(&self, owner: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// When a snapshot object of `owner` was written, if it exists.
    async fn object_created_at(
        &self,
        owner: &str,
        key: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError>;

    /// The keys of `owner`'s snapshot objects starting with `prefix`, sorted.
    async fn list_objects(&self, owner: &str, prefix: &str) -> Result<Vec<String>, StoreError>;

    /// Removes a snapshot object; removing a missing one succeeds.
    async fn delete_object(&self, owner: &str, key: &str) -> Result<(), StoreError>;

    /// Grants the catalog skill `slug` to `uid`; `true` when newly granted.
    async fn grant_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError>;

    /// Revokes a granted skill; `false` when it was not granted.
    async fn revoke_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError>;

    /// The skills granted to `uid`, by name.
    async fn granted_skills(&self, uid: &Uid) -> Result<Vec<String>, StoreError>;

    /// The artifacts of every sandbox of `uid`, oldest first.
    async fn list_artifacts_of_uid(&self, uid: &Uid) -> Result<Vec<Artifact>, StoreError>;

    /// One artifact of a sandbox.
    async fn get_artifact(
        &self,
        sandbox: &SandboxId,
        id: &str,
    ) -> Result<Option<Artifact>, StoreError>;

    /// Takes the sandbox's execution guard for `holder`, live for `ttl` by the store's
    /// clock, unless another holder's guard is live ([`GuardAcquire::Held`], nothing
    /// changes). A new guard's token is the previous one plus one (1 for the first): tokens
    /// only ever grow per sandbox, across generations. Fails with
    /// [`StoreError::UnknownSandbox`] for a sandbox never claimed.
    async fn acquire_guard(
        &self,
        sandbox: &SandboxId,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<GuardAcquire, StoreError>;

    /// Extends the guard `token` to `ttl` from now (`None`: the lifetime it was last
    /// granted or renewed for); `None` unless it is the newest and still live (a lapsed
    /// holder must acquire again and gets a new token).
    async fn renew_guard(
        &self,
        sandbox: &SandboxId,
        token: i64,
        ttl: Option<std::time::Duration>,
    ) -> Result<Option<Guard>, StoreError>;

    /// Lets the live guard `token` lapse now, so the next holder need not wait out its TTL;
    /// `false` when it was not live. The token counter keeps its value.
    async fn release_guard(&self, sandbox: &SandboxId, token: i64) -> Result<bool, StoreError>;

    /// The live guard of a sandbox, if any.
    async fn current_guard(&self, sandbox: &SandboxId) -> Result<Option<Guard>, StoreError>;

    /// How `token` compares with the newest token issued for the sandbox.
    async fn check_fence(&self, sandbox: &SandboxId, token: i64) -> Result<FenceCheck, StoreError>;

    /// [`StateStore::check_fence`], and while the token is current a [`FenceHold`] that
    /// keeps every process from issuing a newer token until it is dropped. A store one
    /// process owns (SQLite) holds nothing: that process's own gate is exact.
    async fn hold_fence(
        &self,
        sandbox: &SandboxId,
        token: i64,
    ) -> Result<(FenceCheck, Option<FenceHold>), StoreError> {
        Ok((self.check_fence(sandbox, token).await?, None))
    }

    /// Records that `alias` in `namespace` names `sandbox` (idempotent) and returns the
    /// record. An alias already naming another sandbox is [`StoreError::AliasConflict`]
    /// and changes nothing; a sandbox never claimed is [`StoreError::UnknownSandbox`].
    async fn put_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
        sandbox: &SandboxId,
    ) -> Result<SandboxAlias, StoreError>;

    /// The sandbox `alias` names in `namespace`, if any.
    async fn get_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
    ) -> Result<Option<SandboxAlias>, StoreError>;

    /// Every alias of `namespace`, oldest first.
    async fn list_sandbox_aliases(&self, namespace: &str) -> Result<Vec<SandboxAlias>, StoreError>;

    /// A transport record ([`TransportRecord`]), if one exists.
    async fn get_record(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<TransportRecord>, StoreError>;

    /// Writes a transport record when it is as `expected` says, and returns its new
    /// version; [`StoreError::RecordConflict`] when it is not (created or changed since).
    async fn put_record(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expected: RecordWrite,
    ) -> Result<i64, StoreError>;

    /// Deletes a transport record, only at version `expected` when given; `false` when
    /// nothing was deleted.
    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<i64>,
    ) -> Result<bool, StoreError>;

    /// The transport records of `namespace` whose key starts with `prefix` (printable
    /// ASCII), sorted by key.
    async fn list_records(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<TransportRecord>, StoreError>;

    /// Registers `node_id` reachable at `advertise` with a lease of `ttl`: a new epoch,
    /// larger than every earlier one of that id, which supersedes them (issue 14).
    async fn register_node(
        &self,
        node_id: &str,
        advertise: &str,
        ttl: std::time::Duration,
    ) -> Result<NodeRecord, StoreError>;

    /// Renews the lease of `node_id` at `epoch` for `ttl` from now. `None` when that epoch
    /// was superseded, left, or let its lease lapse: the node must register again.
    async fn renew_node(
        &self,
        node_id: &str,
        epoch: i64,
        ttl: std::time::Duration,
    ) -> Result<Option<NodeRecord>, StoreError>;

    /// Ends the lease of `node_id` at `epoch` now (a node leaving cleanly); false when
    /// that epoch was superseded or had left already.
    async fn leave_node(&self, node_id: &str, epoch: i64) -> Result<bool, StoreError>;

    /// Every node that ever registered, by id, with its state by the store's clock.
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, StoreError>;

    /// Claims the runtime of `sandbox` for `node_id` at `epoch` (see `owners.rs`): kept
    /// or taken when free, deferred to a live owner, taken over from an owner whose epoch
    /// is not live (its runs in flight closed as [`NODE_LOST`], a running sandbox marked
    /// stopped), refused when the claimer's own epoch is not live. One atomic decision.
    /// With `sole` the claimer is the only server on the store (its `ServerLock` says
    /// so): every other node's ownership is stale and taken over at once.
    async fn claim_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
        sole: bool,
    ) -> Result<RuntimeClaim, StoreError>;

    /// Re-owns, at `epoch`, a runtime `node_id` found running at start-up: `Some(token)`
    /// when the store still names this node as its owner (at any epoch) or never named
    /// an owner; `None` when it was released or taken over meanwhile (the runtime is
    /// stale and must go).
    async fn adopt_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
    ) -> Result<Option<i64>, StoreError>;

    /// Gives up the runtime of `sandbox` (it was destroyed); false when `node_id` no
    /// longer owns it with `token`.
    async fn release_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        token: i64,
    ) -> Result<bool, StoreError>;

    /// The recorded ownership of a sandbox's runtime.
    async fn runtime_owner(&self, sandbox: &SandboxId) -> Result<Option<RuntimeOwner>, StoreError>;

    /// Every runtime some node owns, by sandbox id.
    async fn runtime_owners(&self) -> Result<Vec<RuntimeOwner>, StoreError>;

    /// Moves a sandbox's state like [`StateStore::set_sandbox_state`], under an ownership:
    /// refused with [`StoreError::NotOwner`] unless `fence` still holds the runtime.
    async fn set_runtime_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
        fence: &OwnerFence,
    ) -> Result<Option<SandboxRecord>, StoreError>;

    /// Begins a migration (I36, see [`migrations`]): writes it and all its items, state
    /// planned, in one transaction. If a migration with this id exists: the same
    /// `plan_digest` → `Ok(existing record)`, unchanged, its items untouched (a rerun
    /// resumes); another → [`StoreError::MigrationConflict`], nothing written: the source
    /// changed since it was planned. A migration without an id or plan digest, whose plan is
    /// not JSON or which names an item key twice is [`StoreError::MigrationInvalid`].
    async fn begin_migration(
        &self,
        migration: &NewMigration,
        items: &[NewMigrationItem],
    ) -> Result<MigrationRecord, StoreError>;

    /// A migration, if it was begun.
    async fn get_migration(&self, id: &str) -> Result<Option<MigrationRecord>, StoreError>;

    /// Every migration, oldest first (ties broken by id).
    async fn list_migrations(&self) -> Result<Vec<MigrationRecord>, StoreError>;

    /// The items of a migration, ordered by key; empty for a migration never begun.
    async fn migration_items(&self, id: &str) -> Result<Vec<MigrationItem>, StoreError>;

    /// Compare-and-set of one item's step: moves item `(id, key)` from `from` to `to` and
    /// writes `update` (its workdir record included) in one transaction. `Ok(false)`, with
    /// nothing written, when the item is not in state `from` or does not exist.
    async fn advance_migration_item(
        &self,
        id: &str,
        key: &str,
        from: ItemState,
        to: ItemState,
        update: ItemUpdate<'_>,
    ) -> Result<bool, StoreError>;

    /// Compare-and-set of a migration's own state: `Ok(false)`, with nothing written, when
    /// it is not in state `from` or does not exist.
    async fn set_migration_state(
        &self,
        id: &str,
        from: MigrationState,
        to: MigrationState,
    ) -> Result<bool, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_store_trait_can_be_used_as_a_shared_trait_object() {
        fn takes(_: std::sync::Arc<dyn StateStore>) {}
        let _ = takes;
    }
}
