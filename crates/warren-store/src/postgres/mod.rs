//! The PostgreSQL implementation of [`StateStore`], for warren servers that share one
//! database (issue 13, the seeds' "任意节点都能 resume").
//!
//! The schema and the rules are those of the SQLite store (one behaviour suite runs
//! against both); what differs is how atomicity is had under *several processes*:
//!
//! - a claim inserts with `ON CONFLICT DO NOTHING`, then locks the row (`FOR UPDATE`) to
//!   decide, so two claimers of one identity serialise on the row and only one creates or
//!   reclaims it;
//! - a write that first counts (the agent environment's limit) takes a transaction-scoped
//!   advisory lock on its uid, released at commit or rollback, never held by a session;
//! - guards and leases judge expiry by the database's clock (see [`guard`]), the same for
//!   every process.
//!
//! A database that cannot be reached is [`StoreError::Unavailable`]; the pool hands out
//! only connections that answer, so service resumes by itself when the server is back.

mod aliases;
mod guard;
mod migrations;
mod nodes;
mod owners;
mod records;
mod server_lock;

pub use server_lock::ServerLock;

use std::time::Duration;

use sqlx::error::ErrorKind;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use warren_core::{AgentEnvVar, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

use self::guard::NOW_MS;
use crate::error::violation;
use crate::rows::{millis_to_time, Columns};
use crate::{
    AgentEnvRecord, Artifact, Checkpoint, FenceCheck, Guard, GuardAcquire, NewRun, NewSandbox,
    RunOutcome, RunPage, RunQuery, RunRecord, RunScope, RunStatus, RuntimeSnapshot, SandboxClaim,
    SandboxRecord, SandboxState, StateStore, StoreError, WorkdirRecord,
};

/// The schema, embedded at build time.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// The columns of a sandbox row.
const SANDBOX_COLUMNS: &str = "id, uid, runtime_scope, workdir, network, backend, state, \
     generation, created_at, last_active_at, updated_at, inherit_env, ephemeral, \
     seed_snapshot, image, layout, extra_mounts, isolation, labels, deadline_at, on_deadline";

/// The columns of a run row.
const RUN_COLUMNS: &str = "id, sandbox_id, generation, command, cwd, requested_by, kind, tag, \
     pty, status, started_at, finished_at, exit_code, signal, timed_out, duration_ms, \
     cpu_user_ms, cpu_system_ms, peak_memory_bytes, failure_reason";

/// The columns of an artifact row.
const ARTIFACT_COLUMNS: &str = "id, sandbox_id, uid, path, size, sha256, media_type, created_at";

const CHECKPOINT_COLUMNS: &str = "id, sandbox_id, workdir, manifest, files, bytes, created_at";

const SNAPSHOT_COLUMNS: &str =
    "id, sandbox_id, generation, cow_manifest, home_manifest, bytes, reason, created_at";

/// How the store connects.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Connections the pool may hold.
    pub max_connections: u32,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
        }
    }
}

/// A [`StateStore`] on a PostgreSQL database, shareable by many warren processes.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// How long a request waits for a pooled connection before the store reports itself
    /// unavailable: short, so a database that is down answers 503 quickly instead of
    /// holding every request. A shorter outage only delays the requests that meet it.
    pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

    /// Connects to the database at `url` (`postgres://user:password@host:port/database`),
    /// then brings its schema up to date.
    ///
    /// Migrations run under sqlx's migration lock, so several warren processes may start
    /// against one fresh database at once. A database whose schema is newer than this
    /// binary knows is refused with [`StoreError::SchemaTooNew`] and left untouched.
    pub async fn connect(url: &str, options: &PostgresOptions) -> Result<Self, StoreError> {
        let connect: PgConnectOptions = url.parse().map_err(StoreError::Open)?;
        let connect = connect.application_name("warren");
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(Self::ACQUIRE_TIMEOUT)
            // Every connection handed out has just answered: one broken while the server
            // restarted is dropped here instead of failing a request.
            .test_before_acquire(true)
            .connect_with(connect)
            .await
            .map_err(StoreError::Open)?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// Takes the database's one-server lock for a `warren serve` (see [`ServerLock`]);
    /// [`StoreError::DatabaseInUse`] when another server holds it.
    pub async fn hold_server_lock(url: &str) -> Result<ServerLock, StoreError> {
        server_lock::hold(url).await
    }

    /// Closes every connection, waiting for statements in flight. Later calls fail.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// The newest schema version this binary knows.
    pub fn schema_version() -> i64 {
        MIGRATOR
            .iter()
            .map(|migration| migration.version)
            .max()
            .unwrap_or(0)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let has_history: bool =
            sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::query("read the schema version"))?;
        if has_history {
            let found: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
                    .fetch_one(&self.pool)
                    .await
                    .map_err(StoreError::query("read the schema version"))?;
            let known = Self::schema_version();
            if let Some(found) = found.filter(|found| *found > known) {
                return Err(StoreError::SchemaTooNew { found, known });
            }
        }
        MIGRATOR.run(&self.pool).await.map_err(StoreError::Migrate)
    }

    async fn fetch_run(
        &self,
        run_id: &str,
        operation: &'static str,
    ) -> Result<Option<RunRecord>, StoreError> {
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"))
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::query(operation))?;
        row.as_ref().map(run_from_row).transpose()
    }
}

crate::rows::row_decoders!(PgRow);

/// The current time as stored: unix milliseconds, UTC.
fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn to_i64(value: u64, table: &'static str, column: &'static str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Corrupt {
        table,
        column,
        detail: format!("{value} is out of range"),
    })
}

/// A lock key for the transaction-scoped advisory lock of one uid's agent environment.
const AGENT_ENV_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('agent_env:' || $1, 0))";

#[async_trait::async_trait]
impl StateStore for PostgresStore {
    async fn record_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO workdirs (uid, workdir, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (uid, workdir) DO NOTHING",
        )
        .bind(uid.as_str())
        .bind(workdir.as_str())
        .bind(now_millis())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("record a workdir"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn list_workdirs(&self, uid: &Uid) -> Result<Vec<WorkdirRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT uid, workdir, created_at FROM workdirs WHERE uid = $1 \
             ORDER BY created_at, workdir",
        )
        .bind(uid.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list workdirs"))?;
        rows.iter().map(workdir_from_row).collect()
    }

    async fn workdir(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<Option<WorkdirRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT uid, workdir, created_at FROM workdirs WHERE uid = $1 AND workdir = $2",
        )
        .bind(uid.as_str())
        .bind(workdir.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a workdir"))?;
        row.as_ref().map(workdir_from_row).transpose()
    }

    async fn forget_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM workdirs WHERE uid = $1 AND workdir = $2")
            .bind(uid.as_str())
            .bind(workdir.as_str())
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("forget a workdir"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn claim_sandbox(&self, new: &NewSandbox) -> Result<SandboxClaim, StoreError> {
        const OPERATION: &str = "claim a sandbox";
        if SandboxId::derive(&new.uid, &new.runtime_scope) != new.id {
            return Err(StoreError::SandboxIdMismatch {
                id: new.id.clone(),
                uid: new.uid.clone(),
                scope: new.runtime_scope.clone(),
            });
        }
        let network = crate::rows::json_column("sandboxes", "network", &new.binding.network)?;
        let extra_mounts =
            crate::rows::json_column("sandboxes", "extra_mounts", &new.binding.extra_mounts)?;
        let labels = crate::rows::json_column("sandboxes", "labels", &new.settings.labels)?;
        let deadline = new.settings.deadline.map(|time| time.timestamp_millis());
        let now = now_millis();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(StoreError::query(OPERATION))?;
        // A new identity: the insert wins or waits for the claimer that is inserting it,
        // then does nothing.
        let inserted = sqlx::query(&format!(
            "INSERT INTO sandboxes (id, uid, runtime_scope, workdir, backend, state, \
             generation, created_at, last_active_at, updated_at, network, inherit_env, \
             ephemeral, seed_snapshot, image, layout, extra_mounts, isolation, labels, \
             deadline_at, on_deadline) \
             VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
             $16, $17, $18) ON CONFLICT (id) DO NOTHING RETURNING {SANDBOX_COLUMNS}"
        ))
        .bind(new.id.as_str())
        .bind(new.uid.as_str())
        .bind(new.runtime_scope.as_str())
        .bind(new.binding.workdir.as_str())
        .bind(new.binding.backend.as_str())
        .bind(SandboxState::Created.as_str())
        .bind(now)
        .bind(&network)
        .bind(new.binding.inherit_env)
        .bind(new.binding.ephemeral)
        .bind(&new.seed_snapshot)
        .bind(&new.binding.image)
        .bind(new.binding.layout.as_str())
        .bind(&extra_mounts)
        .bind(new.binding.isolation.as_str())
        .bind(&labels)
        .bind(deadline)
        .bind(new.settings.on_deadline.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        if let Some(row) = inserted {
            let record = sandbox_from_row(&row)?;
            tx.commit().await.map_err(StoreError::query(OPERATION))?;
            return Ok(SandboxClaim::Created(record));
        }
        // The row exists: lock it, so the decision below and the reclaim are one step that
        // no other claimer can interleave with.
        let row = sqlx::query(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1 FOR UPDATE"
        ))
        .bind(new.id.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        let record = sandbox_from_row(&row)?;
        if record.state != SandboxState::Terminated {
            tx.rollback().await.map_err(StoreError::query(OPERATION))?;
            return Ok(SandboxClaim::join_or_conflict(record, new));
        }
        let row = sqlx::query(&format!(
            "UPDATE sandboxes SET workdir = $2, backend = $3, state = $4, \
             generation = generation + 1, created_at = $5, last_active_at = $5, \
             updated_at = $5, network = $6, inherit_env = $7, ephemeral = $8, \
             seed_snapshot = $9, image = $10, layout = $11, extra_mounts = $12, \
             isolation = $13, labels = $14, deadline_at = $15, on_deadline = $16 \
             WHERE id = $1 RETURNING {SANDBOX_COLUMNS}"
        ))
        .bind(new.id.as_str())
        .bind(new.binding.workdir.as_str())
        .bind(new.binding.backend.as_str())
        .bind(SandboxState::Created.as_str())
        .bind(now)
        .bind(&network)
        .bind(new.binding.inherit_env)
        .bind(new.binding.ephemeral)
        .bind(&new.seed_snapshot)
        .bind(&new.binding.image)
        .bind(new.binding.layout.as_str())
        .bind(&extra_mounts)
        .bind(new.binding.isolation.as_str())
        .bind(&labels)
        .bind(deadline)
        .bind(new.settings.on_deadline.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        let record = sandbox_from_row(&row)?;
        tx.commit().await.map_err(StoreError::query(OPERATION))?;
        Ok(SandboxClaim::Created(record))
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a sandbox"))?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    async fn list_sandboxes(&self, uid: Option<&Uid>) -> Result<Vec<SandboxRecord>, StoreError> {
        let rows = match uid {
            Some(uid) => {
                sqlx::query(&format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE uid = $1 \
                     ORDER BY created_at, id"
                ))
                .bind(uid.as_str())
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_at, id"
                ))
                .fetch_all(&self.pool)
                .await
            }
        }
        .map_err(StoreError::query("list sandboxes"))?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        // The generation and state tests are part of the UPDATE itself: no race.
        let row = sqlx::query(&format!(
            "UPDATE sandboxes SET state = $4, updated_at = $5 \
             WHERE id = $1 AND generation = $2 AND state = $3 RETURNING {SANDBOX_COLUMNS}"
        ))
        .bind(id.as_str())
        .bind(generation)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("set a sandbox state"))?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    async fn set_sandbox_settings(
        &self,
        id: &SandboxId,
        generation: i64,
        settings: &crate::SandboxSettings,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let labels = crate::rows::json_column("sandboxes", "labels", &settings.labels)?;
        let row = sqlx::query(&format!(
            "UPDATE sandboxes SET labels = $3, deadline_at = $4, on_deadline = $5, \
             updated_at = $6 WHERE id = $1 AND generation = $2 RETURNING {SANDBOX_COLUMNS}"
        ))
        .bind(id.as_str())
        .bind(generation)
        .bind(&labels)
        .bind(settings.deadline.map(|time| time.timestamp_millis()))
        .bind(settings.on_deadline.as_str())
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("set a sandbox's settings"))?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    async fn sandboxes_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE deadline_at IS NOT NULL \
             AND deadline_at <= $1 AND state IN ('created', 'running', 'stopped') \
             ORDER BY deadline_at, id LIMIT $2"
        ))
        .bind(now.timestamp_millis())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list sandboxes past their deadline"))?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn touch_sandbox(&self, id: &SandboxId) -> Result<(), StoreError> {
        // GREATEST: a touch from a replica whose clock runs behind never moves activity back.
        let result = sqlx::query(
            "UPDATE sandboxes SET last_active_at = GREATEST(last_active_at, $2) WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(now_millis())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("touch a sandbox"))?;
        if result.rows_affected() == 0 {
            return Err(StoreError::UnknownSandbox { id: id.clone() });
        }
        Ok(())
    }

    async fn start_run(&self, new: &NewRun) -> Result<RunRecord, StoreError> {
        // A fenced run is written only while its node still owns the runtime (issue 14):
        // the check and the insert are one statement.
        let row = sqlx::query(&format!(
            "INSERT INTO runs (id, sandbox_id, generation, command, cwd, requested_by, status, \
             started_at, timed_out, node_id, kind, tag, pty) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, FALSE, $9, $11, $12, $13 \
             WHERE $10::bigint IS NULL OR EXISTS (SELECT 1 FROM runtime_owners \
             WHERE sandbox_id = $2 AND node_id = $9 AND token = $10) \
             RETURNING {RUN_COLUMNS}"
        ))
        .bind(&new.id)
        .bind(new.sandbox_id.as_str())
        .bind(new.generation)
        .bind(&new.command)
        .bind(&new.cwd)
        .bind(&new.requested_by)
        .bind(RunStatus::Running.as_str())
        .bind(now_millis())
        .bind(new.owner.as_ref().map(|owner| owner.node_id.as_str()))
        .bind(new.owner.as_ref().map(|owner| owner.token))
        .bind(new.kind.as_str())
        .bind(new.tag.as_deref())
        .bind(new.pty)
        .fetch_optional(&self.pool)
        .await
        .map_err(|error| match violation(&error) {
            Some(ErrorKind::UniqueViolation) => StoreError::DuplicateRun {
                run_id: new.id.clone(),
            },
            _ => StoreError::on_sandbox("start a run", &new.sandbox_id)(error),
        })?;
        match row {
            Some(row) => run_from_row(&row),
            None => Err(StoreError::NotOwner {
                sandbox: new.sandbox_id.clone(),
                token: new.owner.as_ref().map_or(0, |owner| owner.token),
            }),
        }
    }

    async fn finish_run(
        &self,
        run_id: &str,
        outcome: &RunOutcome,
    ) -> Result<RunRecord, StoreError> {
        const OPERATION: &str = "finish a run";
        let status = if outcome.failure.is_some() {
            RunStatus::Failed
        } else {
            RunStatus::Finished
        };
        // Only a running run can finish: an outcome already recorded is never overwritten.
        let row = sqlx::query(&format!(
            "UPDATE runs SET status = $2, finished_at = $3, exit_code = $4, signal = $5, \
             timed_out = $6, duration_ms = $7, cpu_user_ms = $8, cpu_system_ms = $9, \
             peak_memory_bytes = $10, failure_reason = $11 \
             WHERE id = $1 AND status = 'running' RETURNING {RUN_COLUMNS}"
        ))
        .bind(run_id)
        .bind(status.as_str())
        .bind(now_millis())
        .bind(outcome.exit_code)
        .bind(outcome.signal)
        .bind(outcome.timed_out)
        .bind(outcome.duration_ms)
        .bind(outcome.cpu_user_ms)
        .bind(outcome.cpu_system_ms)
        .bind(outcome.peak_memory_bytes)
        .bind(outcome.failure.as_deref())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query(OPERATION))?;
        match row {
            Some(row) => run_from_row(&row),
            None => match self.fetch_run(run_id, OPERATION).await? {
                Some(_) => Err(StoreError::RunAlreadyFinished {
                    run_id: run_id.to_owned(),
                }),
                None => Err(StoreError::UnknownRun {
                    run_id: run_id.to_owned(),
                }),
            },
        }
    }

    async fn query_runs(&self, query: &RunQuery) -> Result<RunPage, StoreError> {
        // The scope picks the statement, so each can use its index; the cursor and `since`
        // are always bound (a cursor past every run, a time before all) to keep one shape.
        let scope = match &query.scope {
            RunScope::Sandbox(_) => "sandbox_id = $1",
            RunScope::Uid(_) => "sandbox_id IN (SELECT id FROM sandboxes WHERE uid = $1)",
        };
        let (after_started, after_id) = query.after_key();
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE {scope} \
             AND ($2::text IS NULL OR status = $2) AND started_at >= $3 \
             AND (started_at, id) < ($4, $5) \
             ORDER BY started_at DESC, id DESC LIMIT $6"
        ))
        .bind(query.scope_key())
        .bind(query.status.map(RunStatus::as_str))
        .bind(query.since_millis().unwrap_or(i64::MIN))
        .bind(after_started.unwrap_or(i64::MAX))
        .bind(after_id.unwrap_or(""))
        .bind(query.fetch())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list runs"))?;
        let runs = rows.iter().map(run_from_row).collect::<Result<_, _>>()?;
        Ok(query.page(runs))
    }

    async fn fail_running_runs(&self, node_id: &str, reason: &str) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "UPDATE runs SET status = 'failed', finished_at = $1, failure_reason = $2 \
             WHERE status = 'running' AND (node_id = $3 OR node_id IS NULL)",
        )
        .bind(now_millis())
        .bind(reason)
        .bind(node_id)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("fail running runs"))?;
        Ok(result.rows_affected())
    }

    // Leases expire by the database's clock, like guards: the same for every process that
    // shares the database.
    async fn create_lease(
        &self,
        sandbox: &SandboxId,
        generation: i64,
        holder: &str,
        ttl: Duration,
    ) -> Result<crate::Lease, StoreError> {
        let id = format!("lease-{}", uuid::Uuid::new_v4().simple());
        let row = sqlx::query(&format!(
            "INSERT INTO leases (id, sandbox_id, generation, holder, created_at, expires_at) \
             SELECT $1, $2, $3, $4, now_ms, now_ms + $5 FROM (SELECT {NOW_MS} AS now_ms) AS clock \
             RETURNING created_at, expires_at"
        ))
        .bind(&id)
        .bind(sandbox.as_str())
        .bind(generation)
        .bind(holder)
        .bind(crate::guard::ttl_millis(ttl))
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::on_sandbox("create a lease", sandbox))?;
        let columns = Columns {
            row: &row,
            table: "leases",
        };
        Ok(crate::Lease {
            id,
            sandbox_id: sandbox.clone(),
            generation,
            holder: holder.to_owned(),
            created_at: columns.time("created_at")?,
            expires_at: columns.time("expires_at")?,
        })
    }

    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        lease: &str,
        ttl: Duration,
    ) -> Result<Option<crate::Lease>, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE leases SET expires_at = {NOW_MS} + $3 WHERE id = $1 AND sandbox_id = $2 \
             AND expires_at > {NOW_MS} RETURNING generation, holder, created_at, expires_at"
        ))
        .bind(lease)
        .bind(sandbox.as_str())
        .bind(crate::guard::ttl_millis(ttl))
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("renew a lease"))?;
        row.map(|row| {
            let columns = Columns {
                row: &row,
                table: "leases",
            };
            Ok(crate::Lease {
                id: lease.to_owned(),
                sandbox_id: sandbox.clone(),
                generation: columns.get("generation")?,
                holder: columns.get("holder")?,
                created_at: columns.time("created_at")?,
                expires_at: columns.time("expires_at")?,
            })
        })
        .transpose()
    }

    async fn release_lease(&self, sandbox: &SandboxId, lease: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM leases WHERE id = $1 AND sandbox_id = $2")
            .bind(lease)
            .bind(sandbox.as_str())
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("release a lease"))?;
        Ok(result.rows_affected() > 0)
    }

    async fn live_leases(&self, sandbox: &SandboxId, generation: i64) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM leases WHERE sandbox_id = $1 AND generation = $2 \
             AND expires_at > {NOW_MS}"
        ))
        .bind(sandbox.as_str())
        .bind(generation)
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::query("count live leases"))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn agent_env(&self, uid: &Uid) -> Result<Vec<AgentEnvRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, value, secret, updated_at FROM agent_env WHERE uid = $1 ORDER BY name",
        )
        .bind(uid.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("read an agent environment"))?;
        rows.iter()
            .map(|row| {
                let columns = Columns {
                    row,
                    table: "agent_env",
                };
                let name: String = columns.get("name")?;
                let var = AgentEnvVar::new(
                    name,
                    columns.get::<String>("value")?,
                    columns.get("secret")?,
                )
                .map_err(|error| columns.corrupt("name", error))?;
                Ok(AgentEnvRecord {
                    var,
                    updated_at: columns.time("updated_at")?,
                })
            })
            .collect()
    }

    async fn replace_agent_env(&self, uid: &Uid, vars: &[AgentEnvVar]) -> Result<(), StoreError> {
        const OPERATION: &str = "replace an agent environment";
        let now = now_millis();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(StoreError::query(OPERATION))?;
        sqlx::query(AGENT_ENV_LOCK)
            .bind(uid.as_str())
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        sqlx::query("DELETE FROM agent_env WHERE uid = $1")
            .bind(uid.as_str())
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        for var in vars {
            sqlx::query(
                "INSERT INTO agent_env (uid, name, value, secret, updated_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(uid.as_str())
            .bind(&var.name)
            .bind(&var.value)
            .bind(var.secret)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        }
        tx.commit().await.map_err(StoreError::query(OPERATION))
    }

    async fn set_agent_env_var(
        &self,
        uid: &Uid,
        var: &AgentEnvVar,
        max: usize,
    ) -> Result<bool, StoreError> {
        const OPERATION: &str = "set an agent environment variable";
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(StoreError::query(OPERATION))?;
        // Serialises writers of this uid's environment so two setters cannot both pass
        // the limit; the lock ends with the transaction.
        sqlx::query(AGENT_ENV_LOCK)
            .bind(uid.as_str())
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM agent_env WHERE uid = $1 AND name = $2)",
        )
        .bind(uid.as_str())
        .bind(&var.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        if !exists {
            let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM agent_env WHERE uid = $1")
                .bind(uid.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query(OPERATION))?;
            if usize::try_from(count).unwrap_or(usize::MAX) >= max {
                return Err(StoreError::AgentEnvFull {
                    uid: uid.clone(),
                    max,
                });
            }
        }
        sqlx::query(
            "INSERT INTO agent_env (uid, name, value, secret, updated_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (uid, name) DO UPDATE SET \
             value = excluded.value, secret = excluded.secret, updated_at = excluded.updated_at",
        )
        .bind(uid.as_str())
        .bind(&var.name)
        .bind(&var.value)
        .bind(var.secret)
        .bind(now_millis())
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        tx.commit().await.map_err(StoreError::query(OPERATION))?;
        Ok(!exists)
    }

    async fn remove_agent_env_var(&self, uid: &Uid, name: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM agent_env WHERE uid = $1 AND name = $2")
            .bind(uid.as_str())
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("remove an agent environment variable"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn record_artifact(&self, artifact: &Artifact) -> Result<Artifact, StoreError> {
        let row = sqlx::query(&format!(
            "INSERT INTO artifacts (id, sandbox_id, uid, path, size, sha256, media_type, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {ARTIFACT_COLUMNS}"
        ))
        .bind(&artifact.id)
        .bind(artifact.sandbox_id.as_str())
        .bind(artifact.uid.as_str())
        .bind(&artifact.path)
        .bind(to_i64(artifact.size, "artifacts", "size")?)
        .bind(&artifact.sha256)
        .bind(&artifact.media_type)
        .bind(now_millis())
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::on_sandbox(
            "record an artifact",
            &artifact.sandbox_id,
        ))?;
        artifact_from_row(&row)
    }

    async fn list_artifacts(&self, sandbox: &SandboxId) -> Result<Vec<Artifact>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE sandbox_id = $1 \
             ORDER BY created_at, id"
        ))
        .bind(sandbox.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list artifacts"))?;
        rows.iter().map(artifact_from_row).collect()
    }

    async fn record_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Checkpoint, StoreError> {
        let row = sqlx::query(&format!(
            "INSERT INTO checkpoints ({CHECKPOINT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             RETURNING {CHECKPOINT_COLUMNS}"
        ))
        .bind(&checkpoint.id)
        .bind(checkpoint.sandbox_id.as_str())
        .bind(checkpoint.workdir.as_str())
        .bind(&checkpoint.manifest)
        .bind(to_i64(checkpoint.files, "checkpoints", "files")?)
        .bind(to_i64(checkpoint.bytes, "checkpoints", "bytes")?)
        .bind(now_millis())
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::on_sandbox(
            "record a checkpoint",
            &checkpoint.sandbox_id,
        ))?;
        checkpoint_from_row(&row)
    }

    async fn list_checkpoints(&self, sandbox: &SandboxId) -> Result<Vec<Checkpoint>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE sandbox_id = $1 \
             ORDER BY created_at, id"
        ))
        .bind(sandbox.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list checkpoints"))?;
        rows.iter().map(checkpoint_from_row).collect()
    }

    async fn record_runtime_snapshot(
        &self,
        snapshot: &RuntimeSnapshot,
        owner: Option<&crate::OwnerFence>,
    ) -> Result<RuntimeSnapshot, StoreError> {
        let row = sqlx::query(&format!(
            "INSERT INTO runtime_snapshots ({SNAPSHOT_COLUMNS}) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE $10::bigint IS NULL OR EXISTS \
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
        .bind(now_millis())
        .bind(owner.map(|owner| owner.node_id.as_str()))
        .bind(owner.map(|owner| owner.token))
        .fetch_optional(&self.pool)
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

    async fn get_runtime_snapshot(&self, id: &str) -> Result<Option<RuntimeSnapshot>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM runtime_snapshots WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a runtime snapshot"))?;
        row.as_ref().map(runtime_snapshot_from_row).transpose()
    }

    async fn delete_runtime_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM runtime_snapshots WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("delete a runtime snapshot"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn list_runtime_snapshots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<RuntimeSnapshot>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM runtime_snapshots WHERE sandbox_id = $1 \
             ORDER BY created_at, id"
        ))
        .bind(sandbox.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list runtime snapshots"))?;
        rows.iter().map(runtime_snapshot_from_row).collect()
    }

    async fn checkpoint_manifests_of_uid(&self, uid: &Uid) -> Result<Vec<String>, StoreError> {
        // Runtime snapshots' manifests are live too: one garbage collector serves both.
        sqlx::query_scalar(
            "SELECT c.manifest COLLATE \"C\" FROM checkpoints c \
             JOIN sandboxes s ON s.id = c.sandbox_id WHERE s.uid = $1 \
             UNION SELECT r.cow_manifest FROM runtime_snapshots r \
             JOIN sandboxes s ON s.id = r.sandbox_id WHERE s.uid = $1 \
             UNION SELECT r.home_manifest FROM runtime_snapshots r \
             JOIN sandboxes s ON s.id = r.sandbox_id WHERE s.uid = $1 ORDER BY 1",
        )
        .bind(uid.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list live manifests"))
    }

    async fn delete_checkpoint(&self, id: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM checkpoints WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("delete a checkpoint"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn put_object(&self, owner: &str, key: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO snapshot_objects (owner, key, bytes, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (owner, key) DO NOTHING",
        )
        .bind(owner)
        .bind(key)
        .bind(bytes)
        .bind(now_millis())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("write a snapshot object"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn get_object(&self, owner: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        sqlx::query_scalar("SELECT bytes FROM snapshot_objects WHERE owner = $1 AND key = $2")
            .bind(owner)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::query("read a snapshot object"))
    }

    async fn object_created_at(
        &self,
        owner: &str,
        key: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        let millis: Option<i64> = sqlx::query_scalar(
            "SELECT created_at FROM snapshot_objects WHERE owner = $1 AND key = $2",
        )
        .bind(owner)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a snapshot object's age"))?;
        Ok(millis.map(millis_to_time))
    }

    async fn list_objects(&self, owner: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        // A range on the primary key (bytewise: COLLATE "C") instead of LIKE: keys never
        // need escaping.
        let mut upper = prefix.to_owned();
        upper.push(char::MAX);
        sqlx::query_scalar(
            "SELECT key FROM snapshot_objects WHERE owner = $1 AND key >= $2 AND key < $3 \
             ORDER BY key",
        )
        .bind(owner)
        .bind(prefix)
        .bind(upper)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list snapshot objects"))
    }

    async fn delete_object(&self, owner: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM snapshot_objects WHERE owner = $1 AND key = $2")
            .bind(owner)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("delete a snapshot object"))?;
        Ok(())
    }

    async fn grant_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO skill_grants (uid, slug, granted_at) VALUES ($1, $2, $3) \
             ON CONFLICT (uid, slug) DO NOTHING",
        )
        .bind(uid.as_str())
        .bind(slug)
        .bind(now_millis())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("grant a skill"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn revoke_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM skill_grants WHERE uid = $1 AND slug = $2")
            .bind(uid.as_str())
            .bind(slug)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("revoke a skill"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn granted_skills(&self, uid: &Uid) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT slug FROM skill_grants WHERE uid = $1 ORDER BY slug")
            .bind(uid.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::query("list granted skills"))
    }

    async fn list_artifacts_of_uid(&self, uid: &Uid) -> Result<Vec<Artifact>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE uid = $1 ORDER BY created_at, id"
        ))
        .bind(uid.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list artifacts"))?;
        rows.iter().map(artifact_from_row).collect()
    }

    async fn get_artifact(
        &self,
        sandbox: &SandboxId,
        id: &str,
    ) -> Result<Option<Artifact>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE sandbox_id = $1 AND id = $2"
        ))
        .bind(sandbox.as_str())
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read an artifact"))?;
        row.as_ref().map(artifact_from_row).transpose()
    }

    async fn acquire_guard(
        &self,
        sandbox: &SandboxId,
        holder: &str,
        ttl: Duration,
    ) -> Result<GuardAcquire, StoreError> {
        guard::acquire(&self.pool, sandbox, holder, ttl).await
    }

    async fn renew_guard(
        &self,
        sandbox: &SandboxId,
        token: i64,
        ttl: Option<Duration>,
    ) -> Result<Option<Guard>, StoreError> {
        guard::renew(&self.pool, sandbox, token, ttl).await
    }

    async fn release_guard(&self, sandbox: &SandboxId, token: i64) -> Result<bool, StoreError> {
        guard::release(&self.pool, sandbox, token).await
    }

    async fn current_guard(&self, sandbox: &SandboxId) -> Result<Option<Guard>, StoreError> {
        guard::current(&self.pool, sandbox).await
    }

    async fn check_fence(&self, sandbox: &SandboxId, token: i64) -> Result<FenceCheck, StoreError> {
        guard::check_fence(&self.pool, sandbox, token).await
    }

    async fn hold_fence(
        &self,
        sandbox: &SandboxId,
        token: i64,
    ) -> Result<(crate::FenceCheck, Option<crate::FenceHold>), StoreError> {
        guard::hold_fence(&self.pool, sandbox, token).await
    }

    async fn put_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
        sandbox: &SandboxId,
    ) -> Result<crate::SandboxAlias, StoreError> {
        aliases::put(&self.pool, now_millis(), namespace, alias, sandbox).await
    }

    async fn get_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
    ) -> Result<Option<crate::SandboxAlias>, StoreError> {
        aliases::get(&self.pool, namespace, alias).await
    }

    async fn list_sandbox_aliases(
        &self,
        namespace: &str,
    ) -> Result<Vec<crate::SandboxAlias>, StoreError> {
        aliases::list(&self.pool, namespace).await
    }

    async fn get_record(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<crate::TransportRecord>, StoreError> {
        records::get(&self.pool, namespace, key).await
    }

    async fn put_record(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expected: crate::RecordWrite,
    ) -> Result<i64, StoreError> {
        records::put(&self.pool, now_millis(), namespace, key, value, expected).await
    }

    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<i64>,
    ) -> Result<bool, StoreError> {
        records::delete(&self.pool, namespace, key, expected).await
    }

    async fn list_records(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<crate::TransportRecord>, StoreError> {
        records::list(&self.pool, namespace, prefix).await
    }

    async fn register_node(
        &self,
        node_id: &str,
        advertise: &str,
        ttl: Duration,
    ) -> Result<crate::NodeRecord, StoreError> {
        nodes::register(&self.pool, node_id, advertise, ttl).await
    }

    async fn renew_node(
        &self,
        node_id: &str,
        epoch: i64,
        ttl: Duration,
    ) -> Result<Option<crate::NodeRecord>, StoreError> {
        nodes::renew(&self.pool, node_id, epoch, ttl).await
    }

    async fn leave_node(&self, node_id: &str, epoch: i64) -> Result<bool, StoreError> {
        nodes::leave(&self.pool, node_id, epoch).await
    }

    async fn list_nodes(&self) -> Result<Vec<crate::NodeRecord>, StoreError> {
        nodes::list(&self.pool).await
    }

    async fn claim_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
        sole: bool,
    ) -> Result<crate::RuntimeClaim, StoreError> {
        owners::claim(&self.pool, sandbox, node_id, epoch, sole).await
    }

    async fn adopt_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
    ) -> Result<Option<i64>, StoreError> {
        owners::adopt(&self.pool, sandbox, node_id, epoch).await
    }

    async fn release_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        owners::release(&self.pool, sandbox, node_id, token).await
    }

    async fn runtime_owner(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<crate::RuntimeOwner>, StoreError> {
        owners::get(&self.pool, sandbox).await
    }

    async fn runtime_owners(&self) -> Result<Vec<crate::RuntimeOwner>, StoreError> {
        owners::list(&self.pool).await
    }

    async fn set_runtime_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
        fence: &crate::OwnerFence,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE sandboxes SET state = $3, updated_at = $4 \
             WHERE id = $1 AND generation = $2 AND state = $7 AND EXISTS (SELECT 1 \
             FROM runtime_owners WHERE sandbox_id = $1 AND node_id = $5 AND token = $6) \
             RETURNING {SANDBOX_COLUMNS}"
        ))
        .bind(id.as_str())
        .bind(generation)
        .bind(to.as_str())
        .bind(now_millis())
        .bind(&fence.node_id)
        .bind(fence.token)
        .bind(from.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("set a runtime's state"))?;
        match row {
            Some(row) => sandbox_from_row(&row).map(Some),
            None => owners::refuse_unless_owner(&self.pool, id, fence)
                .await
                .map(|()| None),
        }
    }

    async fn begin_migration(
        &self,
        migration: &crate::NewMigration,
        items: &[crate::NewMigrationItem],
    ) -> Result<crate::MigrationRecord, StoreError> {
        migrations::begin(&self.pool, now_millis(), migration, items).await
    }

    async fn get_migration(&self, id: &str) -> Result<Option<crate::MigrationRecord>, StoreError> {
        migrations::get(&self.pool, id).await
    }

    async fn list_migrations(&self) -> Result<Vec<crate::MigrationRecord>, StoreError> {
        migrations::list(&self.pool).await
    }

    async fn migration_items(&self, id: &str) -> Result<Vec<crate::MigrationItem>, StoreError> {
        migrations::items(&self.pool, id).await
    }

    async fn advance_migration_item(
        &self,
        id: &str,
        key: &str,
        from: crate::ItemState,
        to: crate::ItemState,
        update: crate::ItemUpdate<'_>,
    ) -> Result<bool, StoreError> {
        migrations::advance_item(&self.pool, now_millis(), id, key, from, to, update).await
    }

    async fn set_migration_state(
        &self,
        id: &str,
        from: crate::MigrationState,
        to: crate::MigrationState,
    ) -> Result<bool, StoreError> {
        migrations::set_state(&self.pool, now_millis(), id, from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_schema_has_a_version() {
        assert!(PostgresStore::schema_version() >= 1);
    }

    #[tokio::test]
    async fn a_url_that_is_not_a_postgres_url_is_refused_when_opening() {
        let err = PostgresStore::connect("postgres://[::1", &PostgresOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Open(_)), "{err:?}");
    }
}
