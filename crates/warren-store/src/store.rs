//! The one [`StateStore`]: every operation written once over a [`Dialect`], each in the
//! module of its aggregate (workdirs, sandboxes, runs, leases, guards, ...).

use warren_core::{AgentEnvVar, EgressEvent, EgressSecret, SandboxId, SecretName, Uid, Workdir};

use crate::sql::Dialect;
use crate::{
    AgentEnvRecord, Artifact, Checkpoint, EgressRecord, EgressSecretRecord, FenceCheck, Guard,
    GuardAcquire, NewRun, NewSandbox, RunOutcome, RunPage, RunQuery, RunRecord, RuntimeSnapshot,
    SandboxClaim, SandboxRecord, SandboxState, StateStore, StoreError, WorkdirRecord,
};

/// The state store on one SQL engine: [`crate::SqliteStore`] or [`crate::PostgresStore`].
#[derive(Debug, Clone)]
pub struct SqlStore<D> {
    pub(crate) db: D,
}

#[async_trait::async_trait]
impl<D: Dialect> StateStore for SqlStore<D> {
    async fn record_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError> {
        crate::workdirs::record(&self.db, uid, workdir).await
    }

    async fn list_workdirs(&self, uid: &Uid) -> Result<Vec<WorkdirRecord>, StoreError> {
        crate::workdirs::list(&self.db, uid).await
    }

    async fn workdir(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<Option<WorkdirRecord>, StoreError> {
        crate::workdirs::get(&self.db, uid, workdir).await
    }

    async fn forget_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError> {
        crate::workdirs::forget(&self.db, uid, workdir).await
    }

    async fn record_branch(&self, branch: &crate::BranchRecord) -> Result<bool, StoreError> {
        crate::branches::record(&self.db, branch).await
    }

    async fn list_branches(
        &self,
        uid: &Uid,
        workdir: Option<&Workdir>,
    ) -> Result<Vec<crate::BranchRecord>, StoreError> {
        crate::branches::list(&self.db, uid, workdir).await
    }

    async fn mark_branch_merged(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &warren_core::BranchName,
    ) -> Result<bool, StoreError> {
        crate::branches::mark_merged(&self.db, uid, workdir, name).await
    }

    async fn forget_branch(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        name: &warren_core::BranchName,
    ) -> Result<bool, StoreError> {
        crate::branches::forget(&self.db, uid, workdir, name).await
    }

    async fn claim_sandbox(&self, new: &NewSandbox) -> Result<SandboxClaim, StoreError> {
        crate::sandboxes::claim(&self.db, new).await
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        crate::sandboxes::get(&self.db, id).await
    }

    async fn list_sandboxes(&self, uid: Option<&Uid>) -> Result<Vec<SandboxRecord>, StoreError> {
        crate::sandboxes::list(&self.db, uid).await
    }

    async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        crate::sandboxes::set_state(&self.db, id, generation, from, to).await
    }

    async fn set_sandbox_branch(
        &self,
        id: &SandboxId,
        generation: i64,
        branch: Option<&warren_core::BranchName>,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        crate::sandboxes::set_branch(&self.db, id, generation, branch).await
    }

    async fn set_sandbox_settings(
        &self,
        id: &SandboxId,
        generation: i64,
        settings: &crate::SandboxSettings,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        crate::sandboxes::set_settings(&self.db, id, generation, settings).await
    }

    async fn sandboxes_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        crate::sandboxes::due(&self.db, now, limit).await
    }

    async fn touch_sandbox(&self, id: &SandboxId) -> Result<(), StoreError> {
        crate::sandboxes::touch(&self.db, id).await
    }

    async fn start_run(&self, new: &NewRun) -> Result<RunRecord, StoreError> {
        crate::runs::start(&self.db, new).await
    }

    async fn finish_run(
        &self,
        run_id: &str,
        outcome: &RunOutcome,
    ) -> Result<RunRecord, StoreError> {
        crate::runs::finish(&self.db, run_id, outcome).await
    }

    async fn query_runs(&self, query: &RunQuery) -> Result<RunPage, StoreError> {
        crate::runs::query(&self.db, query).await
    }

    async fn fail_running_runs(&self, node_id: &str, reason: &str) -> Result<u64, StoreError> {
        crate::runs::fail_running(&self.db, node_id, reason).await
    }

    async fn create_lease(
        &self,
        sandbox: &SandboxId,
        generation: i64,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<crate::Lease, StoreError> {
        crate::leases::create(&self.db, sandbox, generation, holder, ttl).await
    }

    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        lease: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<crate::Lease>, StoreError> {
        crate::leases::renew(&self.db, sandbox, lease, ttl).await
    }

    async fn release_lease(&self, sandbox: &SandboxId, lease: &str) -> Result<bool, StoreError> {
        crate::leases::release(&self.db, sandbox, lease).await
    }

    async fn live_leases(&self, sandbox: &SandboxId, generation: i64) -> Result<u64, StoreError> {
        crate::leases::live(&self.db, sandbox, generation).await
    }

    async fn agent_env(&self, uid: &Uid) -> Result<Vec<AgentEnvRecord>, StoreError> {
        crate::agent_env::list(&self.db, uid).await
    }

    async fn replace_agent_env(&self, uid: &Uid, vars: &[AgentEnvVar]) -> Result<(), StoreError> {
        crate::agent_env::replace(&self.db, uid, vars).await
    }

    async fn set_agent_env_var(
        &self,
        uid: &Uid,
        var: &AgentEnvVar,
        max: usize,
    ) -> Result<bool, StoreError> {
        crate::agent_env::set(&self.db, uid, var, max).await
    }

    async fn remove_agent_env_var(&self, uid: &Uid, name: &str) -> Result<bool, StoreError> {
        crate::agent_env::remove(&self.db, uid, name).await
    }

    async fn egress_secrets(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<EgressSecretRecord>, StoreError> {
        crate::egress::secrets(&self.db, uid, sandbox).await
    }

    async fn set_egress_secret(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
        secret: &EgressSecret,
        max: usize,
    ) -> Result<bool, StoreError> {
        crate::egress::set_secret(&self.db, uid, sandbox, secret, max).await
    }

    async fn remove_egress_secret(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
        name: &SecretName,
    ) -> Result<bool, StoreError> {
        crate::egress::remove_secret(&self.db, uid, sandbox, name).await
    }

    async fn remove_sandbox_egress(&self, sandbox: &SandboxId) -> Result<(), StoreError> {
        crate::egress::remove_sandbox(&self.db, sandbox).await
    }

    async fn egress_authority(
        &self,
        sandbox: &SandboxId,
        fresh: (String, String),
    ) -> Result<(String, String), StoreError> {
        crate::egress::authority(&self.db, sandbox, fresh).await
    }

    async fn record_egress(&self, events: &[EgressEvent], keep: usize) -> Result<(), StoreError> {
        crate::egress::record(&self.db, events, keep).await
    }

    async fn egress_events(
        &self,
        sandbox: &SandboxId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<EgressRecord>, StoreError> {
        crate::egress::events(&self.db, sandbox, after, limit).await
    }

    async fn record_artifact(&self, artifact: &Artifact) -> Result<Artifact, StoreError> {
        crate::artifacts::record(&self.db, artifact).await
    }

    async fn list_artifacts(&self, sandbox: &SandboxId) -> Result<Vec<Artifact>, StoreError> {
        crate::artifacts::list(&self.db, sandbox).await
    }

    async fn record_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Checkpoint, StoreError> {
        crate::checkpoints::record(&self.db, checkpoint).await
    }

    async fn list_checkpoints(&self, sandbox: &SandboxId) -> Result<Vec<Checkpoint>, StoreError> {
        crate::checkpoints::list(&self.db, sandbox).await
    }

    async fn record_runtime_snapshot(
        &self,
        snapshot: &RuntimeSnapshot,
        owner: Option<&crate::OwnerFence>,
    ) -> Result<RuntimeSnapshot, StoreError> {
        crate::checkpoints::record_snapshot(&self.db, snapshot, owner).await
    }

    async fn get_runtime_snapshot(&self, id: &str) -> Result<Option<RuntimeSnapshot>, StoreError> {
        crate::checkpoints::get_snapshot(&self.db, id).await
    }

    async fn delete_runtime_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        crate::checkpoints::delete_snapshot(&self.db, id).await
    }

    async fn list_runtime_snapshots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<RuntimeSnapshot>, StoreError> {
        crate::checkpoints::list_snapshots(&self.db, sandbox).await
    }

    async fn checkpoint_manifests_of_uid(&self, uid: &Uid) -> Result<Vec<String>, StoreError> {
        crate::checkpoints::live_manifests(&self.db, uid).await
    }

    async fn delete_checkpoint(&self, id: &str) -> Result<bool, StoreError> {
        crate::checkpoints::delete(&self.db, id).await
    }

    async fn put_object(&self, owner: &str, key: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        crate::objects::put(&self.db, owner, key, bytes).await
    }

    async fn get_object(&self, owner: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        crate::objects::get(&self.db, owner, key).await
    }

    async fn object_created_at(
        &self,
        owner: &str,
        key: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        crate::objects::created_at(&self.db, owner, key).await
    }

    async fn list_objects(&self, owner: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        crate::objects::list(&self.db, owner, prefix).await
    }

    async fn delete_object(&self, owner: &str, key: &str) -> Result<(), StoreError> {
        crate::objects::delete(&self.db, owner, key).await
    }

    async fn grant_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
        crate::skills::grant(&self.db, uid, slug).await
    }

    async fn revoke_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
        crate::skills::revoke(&self.db, uid, slug).await
    }

    async fn granted_skills(&self, uid: &Uid) -> Result<Vec<String>, StoreError> {
        crate::skills::granted(&self.db, uid).await
    }

    async fn list_artifacts_of_uid(&self, uid: &Uid) -> Result<Vec<Artifact>, StoreError> {
        crate::artifacts::list_of_uid(&self.db, uid).await
    }

    async fn get_artifact(
        &self,
        sandbox: &SandboxId,
        id: &str,
    ) -> Result<Option<Artifact>, StoreError> {
        crate::artifacts::get(&self.db, sandbox, id).await
    }

    async fn acquire_guard(
        &self,
        sandbox: &SandboxId,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<GuardAcquire, StoreError> {
        crate::guard::acquire(&self.db, sandbox, holder, ttl).await
    }

    async fn renew_guard(
        &self,
        sandbox: &SandboxId,
        token: i64,
        ttl: Option<std::time::Duration>,
    ) -> Result<Option<Guard>, StoreError> {
        crate::guard::renew(&self.db, sandbox, token, ttl).await
    }

    async fn release_guard(&self, sandbox: &SandboxId, token: i64) -> Result<bool, StoreError> {
        crate::guard::release(&self.db, sandbox, token).await
    }

    async fn current_guard(&self, sandbox: &SandboxId) -> Result<Option<Guard>, StoreError> {
        crate::guard::current(&self.db, sandbox).await
    }

    async fn check_fence(&self, sandbox: &SandboxId, token: i64) -> Result<FenceCheck, StoreError> {
        crate::guard::check_fence(&self.db, sandbox, token).await
    }

    async fn hold_fence(
        &self,
        sandbox: &SandboxId,
        token: i64,
    ) -> Result<(crate::FenceCheck, Option<crate::FenceHold>), StoreError> {
        self.db.hold_fence(sandbox, token).await
    }

    async fn put_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
        sandbox: &SandboxId,
    ) -> Result<crate::SandboxAlias, StoreError> {
        crate::aliases::put(&self.db, namespace, alias, sandbox).await
    }

    async fn get_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
    ) -> Result<Option<crate::SandboxAlias>, StoreError> {
        crate::aliases::get(&self.db, namespace, alias).await
    }

    async fn list_sandbox_aliases(
        &self,
        namespace: &str,
    ) -> Result<Vec<crate::SandboxAlias>, StoreError> {
        crate::aliases::list(&self.db, namespace).await
    }

    async fn get_record(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<crate::TransportRecord>, StoreError> {
        crate::records::get(&self.db, namespace, key).await
    }

    async fn put_record(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expected: crate::RecordWrite,
    ) -> Result<i64, StoreError> {
        crate::records::put(&self.db, namespace, key, value, expected).await
    }

    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<i64>,
    ) -> Result<bool, StoreError> {
        crate::records::delete(&self.db, namespace, key, expected).await
    }

    async fn list_records(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<crate::TransportRecord>, StoreError> {
        crate::records::list(&self.db, namespace, prefix).await
    }

    async fn register_node(
        &self,
        node_id: &str,
        advertise: &str,
        ttl: std::time::Duration,
    ) -> Result<crate::NodeRecord, StoreError> {
        crate::nodes::register(&self.db, node_id, advertise, ttl).await
    }

    async fn renew_node(
        &self,
        node_id: &str,
        epoch: i64,
        ttl: std::time::Duration,
    ) -> Result<Option<crate::NodeRecord>, StoreError> {
        crate::nodes::renew(&self.db, node_id, epoch, ttl).await
    }

    async fn leave_node(&self, node_id: &str, epoch: i64) -> Result<bool, StoreError> {
        crate::nodes::leave(&self.db, node_id, epoch).await
    }

    async fn list_nodes(&self) -> Result<Vec<crate::NodeRecord>, StoreError> {
        crate::nodes::list(&self.db).await
    }

    async fn claim_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
        sole: bool,
    ) -> Result<crate::RuntimeClaim, StoreError> {
        crate::owners::claim(&self.db, sandbox, node_id, epoch, sole).await
    }

    async fn adopt_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
    ) -> Result<Option<i64>, StoreError> {
        crate::owners::adopt(&self.db, sandbox, node_id, epoch).await
    }

    async fn release_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        crate::owners::release(&self.db, sandbox, node_id, token).await
    }

    async fn runtime_owner(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<crate::RuntimeOwner>, StoreError> {
        crate::owners::get(&self.db, sandbox).await
    }

    async fn runtime_owners(&self) -> Result<Vec<crate::RuntimeOwner>, StoreError> {
        crate::owners::list(&self.db).await
    }

    async fn set_runtime_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
        fence: &crate::OwnerFence,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        crate::sandboxes::set_runtime_state(&self.db, id, generation, from, to, fence).await
    }

    async fn begin_migration(
        &self,
        migration: &crate::NewMigration,
        items: &[crate::NewMigrationItem],
    ) -> Result<crate::MigrationRecord, StoreError> {
        crate::migrations::begin(&self.db, migration, items).await
    }

    async fn get_migration(&self, id: &str) -> Result<Option<crate::MigrationRecord>, StoreError> {
        crate::migrations::get(&self.db, id).await
    }

    async fn list_migrations(&self) -> Result<Vec<crate::MigrationRecord>, StoreError> {
        crate::migrations::list(&self.db).await
    }

    async fn migration_items(&self, id: &str) -> Result<Vec<crate::MigrationItem>, StoreError> {
        crate::migrations::items(&self.db, id).await
    }

    async fn advance_migration_item(
        &self,
        id: &str,
        key: &str,
        from: crate::ItemState,
        to: crate::ItemState,
        update: crate::ItemUpdate<'_>,
    ) -> Result<bool, StoreError> {
        crate::migrations::advance_item(&self.db, id, key, from, to, update).await
    }

    async fn set_migration_state(
        &self,
        id: &str,
        from: crate::MigrationState,
        to: crate::MigrationState,
    ) -> Result<bool, StoreError> {
        crate::migrations::set_state(&self.db, id, from, to).await
    }
}
