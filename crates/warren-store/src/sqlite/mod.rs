//! The SQLite implementation of [`StateStore`].
//!
//! One database file holds everything. It is opened in WAL mode so readers never wait for
//! the writer, with a generous busy timeout so concurrent writers (other tasks, other
//! processes) queue instead of failing. A write that first reads ([`StateStore::claim_sandbox`],
//! the agent environment's replace and set) runs in a `BEGIN IMMEDIATE` transaction: the
//! write lock is taken before the read, so two claimers can never both see "no sandbox" (or
//! both see "terminated") and both create one, nor two setters both pass the size limit.

use std::fs::{OpenOptions, Permissions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::error::ErrorKind;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row};
use warren_core::{AgentEnvVar, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

mod aliases;
mod guard;
mod migrations;
mod nodes;
mod owners;
mod records;

use crate::error::violation;
use crate::rows::{millis_to_time, Columns};
use crate::{
    AgentEnvRecord, Artifact, Checkpoint, FenceCheck, Guard, GuardAcquire, ManualClock, NewRun,
    NewSandbox, RunOutcome, RunPage, RunQuery, RunRecord, RunScope, RunStatus, RuntimeSnapshot,
    SandboxClaim, SandboxRecord, SandboxState, StateStore, StoreError, WorkdirRecord,
};

/// The schema, embedded at build time so the binary and its schema cannot drift apart.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a statement waits for another writer before giving up. Claims and run records
/// are tiny transactions; a wait this long means something is wedged, not merely busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The columns of a sandbox row, in the order [`sandbox_from_row`] expects them named.
macro_rules! sandbox_columns {
    () => {
        "id, uid, runtime_scope, workdir, network, backend, state, generation, created_at, \
         last_active_at, updated_at, inherit_env, ephemeral, seed_snapshot, image, layout, \
         extra_mounts, isolation, labels, deadline_at, on_deadline"
    };
}

/// The columns of a run row, in the order [`run_from_row`] expects them named.
macro_rules! run_columns {
    () => {
        "id, sandbox_id, generation, command, cwd, requested_by, kind, tag, pty, status, \
         started_at, finished_at, exit_code, signal, timed_out, duration_ms, cpu_user_ms, \
         cpu_system_ms, peak_memory_bytes, failure_reason"
    };
}

/// The columns of an artifact row, in the order [`artifact_from_row`] expects them named.
macro_rules! artifact_columns {
    () => {
        "id, sandbox_id, uid, path, size, sha256, media_type, created_at"
    };
}

/// A [`StateStore`] backed by one SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The clock guard expiry is judged by: the process clock unless a test set one.
    clock: Option<ManualClock>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` and brings its schema up to
    /// date.
    ///
    /// A new file is created with mode 0600: it is private state. The database runs in WAL
    /// mode with `synchronous=NORMAL`, a busy timeout of 10 s and foreign keys enforced.
    /// Migrations run under the database's write lock, so several processes may open the
    /// same file at once. A database whose schema is newer than this binary knows is refused
    /// with [`StoreError::SchemaTooNew`] and left untouched.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        create_private_file(path)?;
        let base = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        switch_to_wal(&base).await?;
        // The mode is stored in the file, so each pooled connection's pragma is now a no-op
        // that only guards against someone having switched the file back.
        let options = base
            .journal_mode(SqliteJournalMode::Wal)
            // WAL with NORMAL: a commit survives any crash of warren itself (I22); only an
            // OS crash or power loss can lose the last few commits, never corrupt the file.
            // FULL would add an fsync (~0.2 ms here) to every run start and finish, the
            // hottest path warren has; runs lost that way are closed as failed by restart
            // recovery, like any run in flight.
            .synchronous(SqliteSynchronous::Normal);
        let pool = SqlitePoolOptions::new()
            .connect_with(options)
            .await
            .map_err(StoreError::Open)?;
        let store = Self { pool, clock: None };
        store.migrate().await?;
        Ok(store)
    }

    /// Opens a private in-memory database whose guards expire by `clock`, for tests that
    /// move time by hand.
    pub async fn open_in_memory_with_clock(clock: ManualClock) -> Result<Self, StoreError> {
        let mut store = Self::open_in_memory().await?;
        store.clock = Some(clock);
        Ok(store)
    }

    /// Now, by the clock guards expire by.
    fn guard_now(&self) -> i64 {
        self.clock
            .as_ref()
            .map_or_else(now_millis, ManualClock::now_millis)
    }

    /// Opens a private in-memory database, for tests.
    ///
    /// Every SQLite connection to `:memory:` is a database of its own, so the pool holds
    /// exactly one connection and never retires it; closing the store discards the data.
    pub async fn open_in_memory() -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .in_memory(true)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(StoreError::Open)?;
        let store = Self { pool, clock: None };
        store.migrate().await?;
        Ok(store)
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

    /// Refuses a database from the future, then applies the migrations it lacks.
    ///
    /// Both happen inside one `BEGIN IMMEDIATE` transaction: it serialises concurrent
    /// openers (sqlx's SQLite migrator takes no lock of its own), and each migration runs in
    /// a savepoint within it, so a failure leaves the schema as it was.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::Open)?;
        let has_history: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master \
             WHERE type = 'table' AND name = '_sqlx_migrations')",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::query("read the schema version"))?;
        if has_history {
            let found: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(StoreError::query("read the schema version"))?;
            let known = Self::schema_version();
            if let Some(found) = found.filter(|found| *found > known) {
                return Err(StoreError::SchemaTooNew { found, known });
            }
        }
        MIGRATOR
            .run_direct(&mut *tx)
            .await
            .map_err(StoreError::Migrate)?;
        tx.commit()
            .await
            .map_err(StoreError::query("commit the schema migrations"))
    }

    async fn fetch_sandbox(
        &self,
        id: &SandboxId,
        operation: &'static str,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            sandbox_columns!(),
            " FROM sandboxes WHERE id = ?1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query(operation))?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    async fn fetch_run(
        &self,
        run_id: &str,
        operation: &'static str,
    ) -> Result<Option<RunRecord>, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE id = ?1"
        ))
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query(operation))?;
        row.as_ref().map(run_from_row).transpose()
    }
}

/// Puts the database into WAL mode, once, before the pool opens.
///
/// Changing the journal mode needs an exclusive lock, and SQLite does not wait for that lock
/// through the busy timeout: when several processes open a fresh file at once, all but one
/// would fail with "database is locked". So the switch is retried here, within the same
/// time budget a busy statement gets.
async fn switch_to_wal(options: &SqliteConnectOptions) -> Result<(), StoreError> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        let attempt = async {
            let mut connection = options.connect().await?;
            let result = sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&mut connection)
                .await;
            // A connection that fails to close is gone either way; the pragma decides.
            let _ = connection.close().await;
            result
        };
        match attempt.await {
            Ok(_) => return Ok(()),
            Err(error) if is_busy(&error) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => return Err(StoreError::Open(error)),
        }
    }
}

/// Whether SQLite refused because another connection holds a lock (SQLITE_BUSY and its
/// extended codes), which is worth waiting out.
fn is_busy(error: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    match error {
        sqlx::Error::Database(database) => database
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| code & 0xff == SQLITE_BUSY),
        _ => false,
    }
}

/// Creates the database file with mode 0600 if it does not exist yet.
///
/// SQLite would create it with the process umask (typically 0644); creating it first keeps
/// the file private from its first byte. SQLite gives the `-wal` and `-shm` files the mode
/// of the database file. An existing file is left as its owner set it.
fn create_private_file(path: &Path) -> Result<(), StoreError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        // The umask may have removed bits from 0600; set it exactly.
        Ok(file) => file
            .set_permissions(Permissions::from_mode(0o600))
            .map_err(StoreError::CreateFile),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(StoreError::CreateFile(error)),
    }
}

/// The current time as stored: unix milliseconds, UTC.
fn now_millis() -> i64 {
    Utc::now().timestamp_millis()
}

crate::rows::row_decoders!(SqliteRow);

#[async_trait::async_trait]
impl StateStore for SqliteStore {
    async fn record_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError> {
        let now = now_millis();
        let result = sqlx::query(
            "INSERT INTO workdirs (uid, workdir, created_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (uid, workdir) DO NOTHING",
        )
        .bind(uid.as_str())
        .bind(workdir.as_str())
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("record a workdir"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn workdir(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<Option<WorkdirRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT uid, workdir, created_at FROM workdirs WHERE uid = ?1 AND workdir = ?2",
        )
        .bind(uid.as_str())
        .bind(workdir.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a workdir"))?;
        row.as_ref().map(workdir_from_row).transpose()
    }

    async fn forget_workdir(&self, uid: &Uid, workdir: &Workdir) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM workdirs WHERE uid = ?1 AND workdir = ?2")
            .bind(uid.as_str())
            .bind(workdir.as_str())
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("forget a workdir"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn list_workdirs(&self, uid: &Uid) -> Result<Vec<WorkdirRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT uid, workdir, created_at FROM workdirs WHERE uid = ?1 \
             ORDER BY created_at, workdir",
        )
        .bind(uid.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list workdirs"))?;
        rows.iter().map(workdir_from_row).collect()
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
        // IMMEDIATE takes the write lock now (waiting up to the busy timeout), so the row
        // read below cannot change before this transaction writes or ends.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query(OPERATION))?;
        let current = sqlx::query(concat!(
            "SELECT ",
            sandbox_columns!(),
            " FROM sandboxes WHERE id = ?1"
        ))
        .bind(new.id.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        let current = current.as_ref().map(sandbox_from_row).transpose()?;

        let now = now_millis();
        let network = crate::rows::json_column("sandboxes", "network", &new.binding.network)?;
        let extra_mounts =
            crate::rows::json_column("sandboxes", "extra_mounts", &new.binding.extra_mounts)?;
        let labels = crate::rows::json_column("sandboxes", "labels", &new.settings.labels)?;
        let deadline = new.settings.deadline.map(|time| time.timestamp_millis());
        let row = match current {
            Some(record) if record.state != SandboxState::Terminated => {
                // Nothing to write; ending the transaction now releases the write lock
                // without waiting for the connection to go back to the pool.
                tx.rollback().await.map_err(StoreError::query(OPERATION))?;
                return Ok(SandboxClaim::join_or_conflict(record, new));
            }
            Some(_terminated) => {
                sqlx::query(concat!(
                    "UPDATE sandboxes SET workdir = ?2, backend = ?3, state = ?4, \
                     generation = generation + 1, created_at = ?5, last_active_at = ?5, \
                     updated_at = ?5, network = ?6, inherit_env = ?7, ephemeral = ?8, \
                     seed_snapshot = ?9, image = ?10, layout = ?11, extra_mounts = ?12, \
                     isolation = ?13, labels = ?14, deadline_at = ?15, on_deadline = ?16 \
                     WHERE id = ?1 RETURNING ",
                    sandbox_columns!()
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
            }
            None => {
                sqlx::query(concat!(
                    "INSERT INTO sandboxes (id, uid, runtime_scope, workdir, backend, state, \
                     generation, created_at, last_active_at, updated_at, network, inherit_env, \
                     ephemeral, seed_snapshot, image, layout, extra_mounts, isolation, labels, \
                     deadline_at, on_deadline) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?7, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
                     ?15, ?16, ?17, ?18) RETURNING ",
                    sandbox_columns!()
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
                .fetch_one(&mut *tx)
                .await
            }
        }
        .map_err(StoreError::query(OPERATION))?;
        let record = sandbox_from_row(&row)?;
        tx.commit().await.map_err(StoreError::query(OPERATION))?;
        Ok(SandboxClaim::Created(record))
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        self.fetch_sandbox(id, "read a sandbox").await
    }

    async fn list_sandboxes(&self, uid: Option<&Uid>) -> Result<Vec<SandboxRecord>, StoreError> {
        const OPERATION: &str = "list sandboxes";
        let rows = match uid {
            Some(uid) => {
                sqlx::query(concat!(
                    "SELECT ",
                    sandbox_columns!(),
                    " FROM sandboxes WHERE uid = ?1 ORDER BY created_at, id"
                ))
                .bind(uid.as_str())
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query(concat!(
                    "SELECT ",
                    sandbox_columns!(),
                    " FROM sandboxes ORDER BY created_at, id"
                ))
                .fetch_all(&self.pool)
                .await
            }
        }
        .map_err(StoreError::query(OPERATION))?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        generation: i64,
        from: SandboxState,
        to: SandboxState,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let now = now_millis();
        // The generation and state tests are part of the UPDATE itself: no race.
        let row = sqlx::query(concat!(
            "UPDATE sandboxes SET state = ?4, updated_at = ?5 \
             WHERE id = ?1 AND generation = ?2 AND state = ?3 RETURNING ",
            sandbox_columns!()
        ))
        .bind(id.as_str())
        .bind(generation)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(now)
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
        let row = sqlx::query(concat!(
            "UPDATE sandboxes SET labels = ?3, deadline_at = ?4, on_deadline = ?5, \
             updated_at = ?6 WHERE id = ?1 AND generation = ?2 RETURNING ",
            sandbox_columns!()
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
        let rows = sqlx::query(concat!(
            "SELECT ",
            sandbox_columns!(),
            " FROM sandboxes WHERE deadline_at IS NOT NULL AND deadline_at <= ?1 \
             AND state IN ('created', 'running', 'stopped') ORDER BY deadline_at, id LIMIT ?2"
        ))
        .bind(now.timestamp_millis())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list sandboxes past their deadline"))?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn touch_sandbox(&self, id: &SandboxId) -> Result<(), StoreError> {
        let now = now_millis();
        let result = sqlx::query("UPDATE sandboxes SET last_active_at = ?2 WHERE id = ?1")
            .bind(id.as_str())
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("touch a sandbox"))?;
        if result.rows_affected() == 0 {
            return Err(StoreError::UnknownSandbox { id: id.clone() });
        }
        Ok(())
    }

    async fn start_run(&self, new: &NewRun) -> Result<RunRecord, StoreError> {
        let now = now_millis();
        // A fenced run is written only while its node still owns the runtime (issue 14):
        // the check and the insert are one statement.
        let row = sqlx::query(concat!(
            "INSERT INTO runs (id, sandbox_id, generation, command, cwd, requested_by, status, \
             started_at, timed_out, node_id, kind, tag, pty) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?9, ?11, ?12, ?13 \
             WHERE ?10 IS NULL OR EXISTS (SELECT 1 FROM runtime_owners \
             WHERE sandbox_id = ?2 AND node_id = ?9 AND token = ?10) RETURNING ",
            run_columns!()
        ))
        .bind(&new.id)
        .bind(new.sandbox_id.as_str())
        .bind(new.generation)
        .bind(&new.command)
        .bind(&new.cwd)
        .bind(&new.requested_by)
        .bind(RunStatus::Running.as_str())
        .bind(now)
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
        let now = now_millis();
        let status = if outcome.failure.is_some() {
            RunStatus::Failed
        } else {
            RunStatus::Finished
        };
        // Only a running run can finish: an outcome already recorded is never overwritten.
        let row = sqlx::query(concat!(
            "UPDATE runs SET status = ?2, finished_at = ?3, exit_code = ?4, signal = ?5, \
             timed_out = ?6, duration_ms = ?7, cpu_user_ms = ?8, cpu_system_ms = ?9, \
             peak_memory_bytes = ?10, failure_reason = ?11 \
             WHERE id = ?1 AND status = 'running' RETURNING ",
            run_columns!()
        ))
        .bind(run_id)
        .bind(status.as_str())
        .bind(now)
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
            // Tell the two misses apart for the caller; the record cannot return to
            // running, so this second read cannot contradict the update.
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
        macro_rules! page {
            ($scope:literal) => {
                concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE ",
                    $scope,
                    " AND (?2 IS NULL OR status = ?2) AND started_at >= ?3 \
                     AND (started_at, id) < (?4, ?5) \
                     ORDER BY started_at DESC, id DESC LIMIT ?6"
                )
            };
        }
        let statement = match &query.scope {
            RunScope::Sandbox(_) => page!("sandbox_id = ?1"),
            RunScope::Uid(_) => page!("sandbox_id IN (SELECT id FROM sandboxes WHERE uid = ?1)"),
        };
        let (after_started, after_id) = query.after_key();
        let rows = sqlx::query(statement)
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

    async fn create_lease(
        &self,
        sandbox: &SandboxId,
        generation: i64,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<crate::Lease, StoreError> {
        let now = now_millis();
        let expires = now.saturating_add(crate::guard::ttl_millis(ttl));
        let id = format!("lease-{}", uuid::Uuid::new_v4().simple());
        sqlx::query(
            "INSERT INTO leases (id, sandbox_id, generation, holder, created_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .bind(&id)
        .bind(sandbox.as_str())
        .bind(generation)
        .bind(holder)
        .bind(now)
        .bind(expires)
        .execute(&self.pool)
        .await
        .map_err(StoreError::on_sandbox("create a lease", sandbox))?;
        Ok(crate::Lease {
            id,
            sandbox_id: sandbox.clone(),
            generation,
            holder: holder.to_owned(),
            created_at: millis_to_time(now),
            expires_at: millis_to_time(expires),
        })
    }

    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        lease: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<crate::Lease>, StoreError> {
        let now = now_millis();
        let expires = now.saturating_add(crate::guard::ttl_millis(ttl));
        let row = sqlx::query(
            "UPDATE leases SET expires_at = ?3 WHERE id = ?1 AND sandbox_id = ?2 \
             AND expires_at > ?4 RETURNING generation, holder, created_at",
        )
        .bind(lease)
        .bind(sandbox.as_str())
        .bind(expires)
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("renew a lease"))?;
        Ok(row.map(|row| crate::Lease {
            id: lease.to_owned(),
            sandbox_id: sandbox.clone(),
            generation: row.get("generation"),
            holder: row.get("holder"),
            created_at: millis_to_time(row.get("created_at")),
            expires_at: millis_to_time(expires),
        }))
    }

    async fn release_lease(&self, sandbox: &SandboxId, lease: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM leases WHERE id = ?1 AND sandbox_id = ?2")
            .bind(lease)
            .bind(sandbox.as_str())
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("release a lease"))?;
        Ok(result.rows_affected() > 0)
    }

    async fn live_leases(&self, sandbox: &SandboxId, generation: i64) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM leases WHERE sandbox_id = ?1 AND generation = ?2 \
             AND expires_at > ?3",
        )
        .bind(sandbox.as_str())
        .bind(generation)
        .bind(now_millis())
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::query("count live leases"))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn fail_running_runs(&self, node_id: &str, reason: &str) -> Result<u64, StoreError> {
        let now = now_millis();
        let result = sqlx::query(
            "UPDATE runs SET status = 'failed', finished_at = ?1, failure_reason = ?2 \
             WHERE status = 'running' AND (node_id = ?3 OR node_id IS NULL)",
        )
        .bind(now)
        .bind(reason)
        .bind(node_id)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("fail running runs"))?;
        Ok(result.rows_affected())
    }

    async fn agent_env(&self, uid: &Uid) -> Result<Vec<AgentEnvRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, value, secret, updated_at FROM agent_env WHERE uid = ?1 ORDER BY name",
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
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query(OPERATION))?;
        sqlx::query("DELETE FROM agent_env WHERE uid = ?1")
            .bind(uid.as_str())
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        for var in vars {
            sqlx::query(
                "INSERT INTO agent_env (uid, name, value, secret, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
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
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query(OPERATION))?;
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM agent_env WHERE uid = ?1 AND name = ?2)",
        )
        .bind(uid.as_str())
        .bind(&var.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
        if !exists {
            let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM agent_env WHERE uid = ?1")
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
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (uid, name) DO UPDATE SET \
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

    async fn record_artifact(&self, artifact: &Artifact) -> Result<Artifact, StoreError> {
        const OPERATION: &str = "record an artifact";
        let size = i64::try_from(artifact.size).map_err(|_| StoreError::Corrupt {
            table: "artifacts",
            column: "size",
            detail: format!("{} bytes is out of range", artifact.size),
        })?;
        let row = sqlx::query(concat!(
            "INSERT INTO artifacts (id, sandbox_id, uid, path, size, sha256, media_type, \
             created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING ",
            artifact_columns!()
        ))
        .bind(&artifact.id)
        .bind(artifact.sandbox_id.as_str())
        .bind(artifact.uid.as_str())
        .bind(&artifact.path)
        .bind(size)
        .bind(&artifact.sha256)
        .bind(&artifact.media_type)
        .bind(now_millis())
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::on_sandbox(OPERATION, &artifact.sandbox_id))?;
        artifact_from_row(&row)
    }

    async fn list_artifacts(&self, sandbox: &SandboxId) -> Result<Vec<Artifact>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            artifact_columns!(),
            " FROM artifacts WHERE sandbox_id = ?1 ORDER BY created_at, id"
        ))
        .bind(sandbox.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list artifacts"))?;
        rows.iter().map(artifact_from_row).collect()
    }

    async fn record_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Checkpoint, StoreError> {
        let to_i64 = |value: u64, column: &'static str| {
            i64::try_from(value).map_err(|_| StoreError::Corrupt {
                table: "checkpoints",
                column,
                detail: format!("{value} is out of range"),
            })
        };
        let row = sqlx::query(
            "INSERT INTO checkpoints (id, sandbox_id, workdir, manifest, files, bytes, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             RETURNING id, sandbox_id, workdir, manifest, files, bytes, created_at",
        )
        .bind(&checkpoint.id)
        .bind(checkpoint.sandbox_id.as_str())
        .bind(checkpoint.workdir.as_str())
        .bind(&checkpoint.manifest)
        .bind(to_i64(checkpoint.files, "files")?)
        .bind(to_i64(checkpoint.bytes, "bytes")?)
        .bind(now_millis())
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::on_sandbox("record a checkpoint", &checkpoint.sandbox_id))?;
        checkpoint_from_row(&row)
    }

    async fn list_checkpoints(&self, sandbox: &SandboxId) -> Result<Vec<Checkpoint>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, sandbox_id, workdir, manifest, files, bytes, created_at FROM checkpoints \
             WHERE sandbox_id = ?1 ORDER BY created_at, id",
        )
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
        let row = sqlx::query(
            "INSERT INTO runtime_snapshots (id, sandbox_id, generation, cow_manifest, \
             home_manifest, bytes, reason, created_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 WHERE ?10 IS NULL OR EXISTS (SELECT 1 \
             FROM runtime_owners WHERE sandbox_id = ?2 AND node_id = ?9 AND token = ?10) \
             RETURNING id, sandbox_id, generation, cow_manifest, home_manifest, bytes, reason, \
             created_at",
        )
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
        let row = sqlx::query(
            "SELECT id, sandbox_id, generation, cow_manifest, home_manifest, bytes, reason, \
             created_at FROM runtime_snapshots WHERE id = ?1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a runtime snapshot"))?;
        row.as_ref().map(runtime_snapshot_from_row).transpose()
    }

    async fn delete_runtime_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM runtime_snapshots WHERE id = ?1")
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
        let rows = sqlx::query(
            "SELECT id, sandbox_id, generation, cow_manifest, home_manifest, bytes, reason, \
             created_at FROM runtime_snapshots WHERE sandbox_id = ?1 ORDER BY created_at, id",
        )
        .bind(sandbox.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list runtime snapshots"))?;
        rows.iter().map(runtime_snapshot_from_row).collect()
    }

    async fn checkpoint_manifests_of_uid(&self, uid: &Uid) -> Result<Vec<String>, StoreError> {
        // Runtime snapshots' manifests are live too: one garbage collector serves both.
        sqlx::query_scalar(
            "SELECT c.manifest FROM checkpoints c JOIN sandboxes s ON s.id = c.sandbox_id \
             WHERE s.uid = ?1 \
             UNION SELECT r.cow_manifest FROM runtime_snapshots r JOIN sandboxes s ON s.id = r.sandbox_id \
             WHERE s.uid = ?1 \
             UNION SELECT r.home_manifest FROM runtime_snapshots r JOIN sandboxes s ON s.id = r.sandbox_id \
             WHERE s.uid = ?1 ORDER BY 1",
        )
        .bind(uid.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list live manifests"))
    }

    async fn delete_checkpoint(&self, id: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM checkpoints WHERE id = ?1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("delete a checkpoint"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn put_object(&self, owner: &str, key: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO snapshot_objects (owner, key, bytes, created_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (owner, key) DO NOTHING",
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
        sqlx::query_scalar("SELECT bytes FROM snapshot_objects WHERE owner = ?1 AND key = ?2")
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
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let millis: Option<i64> = sqlx::query_scalar(
            "SELECT created_at FROM snapshot_objects WHERE owner = ?1 AND key = ?2",
        )
        .bind(owner)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read a snapshot object's age"))?;
        Ok(millis.map(millis_to_time))
    }

    async fn list_objects(&self, owner: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        // A range on the primary key instead of LIKE: keys never need escaping.
        let mut upper = prefix.to_owned();
        upper.push(char::MAX);
        sqlx::query_scalar(
            "SELECT key FROM snapshot_objects WHERE owner = ?1 AND key >= ?2 AND key < ?3 \
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
        sqlx::query("DELETE FROM snapshot_objects WHERE owner = ?1 AND key = ?2")
            .bind(owner)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("delete a snapshot object"))?;
        Ok(())
    }

    async fn grant_skill(&self, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO skill_grants (uid, slug, granted_at) VALUES (?1, ?2, ?3) \
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
        let result = sqlx::query("DELETE FROM skill_grants WHERE uid = ?1 AND slug = ?2")
            .bind(uid.as_str())
            .bind(slug)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("revoke a skill"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn granted_skills(&self, uid: &Uid) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT slug FROM skill_grants WHERE uid = ?1 ORDER BY slug")
            .bind(uid.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::query("list granted skills"))
    }

    async fn list_artifacts_of_uid(&self, uid: &Uid) -> Result<Vec<Artifact>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            artifact_columns!(),
            " FROM artifacts WHERE uid = ?1 ORDER BY created_at, id"
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
        let row = sqlx::query(concat!(
            "SELECT ",
            artifact_columns!(),
            " FROM artifacts WHERE sandbox_id = ?1 AND id = ?2"
        ))
        .bind(sandbox.as_str())
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("read an artifact"))?;
        row.as_ref().map(artifact_from_row).transpose()
    }

    async fn remove_agent_env_var(&self, uid: &Uid, name: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM agent_env WHERE uid = ?1 AND name = ?2")
            .bind(uid.as_str())
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("remove an agent environment variable"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn acquire_guard(
        &self,
        sandbox: &SandboxId,
        holder: &str,
        ttl: Duration,
    ) -> Result<GuardAcquire, StoreError> {
        guard::acquire(&self.pool, self.guard_now(), sandbox, holder, ttl).await
    }

    async fn renew_guard(
        &self,
        sandbox: &SandboxId,
        token: i64,
        ttl: Option<Duration>,
    ) -> Result<Option<Guard>, StoreError> {
        guard::renew(&self.pool, self.guard_now(), sandbox, token, ttl).await
    }

    async fn release_guard(&self, sandbox: &SandboxId, token: i64) -> Result<bool, StoreError> {
        guard::release(&self.pool, self.guard_now(), sandbox, token).await
    }

    async fn current_guard(&self, sandbox: &SandboxId) -> Result<Option<Guard>, StoreError> {
        guard::current(&self.pool, self.guard_now(), sandbox).await
    }

    async fn check_fence(&self, sandbox: &SandboxId, token: i64) -> Result<FenceCheck, StoreError> {
        guard::check_fence(&self.pool, sandbox, token).await
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
        nodes::register(&self.pool, self.guard_now(), node_id, advertise, ttl).await
    }

    async fn renew_node(
        &self,
        node_id: &str,
        epoch: i64,
        ttl: Duration,
    ) -> Result<Option<crate::NodeRecord>, StoreError> {
        nodes::renew(&self.pool, self.guard_now(), node_id, epoch, ttl).await
    }

    async fn leave_node(&self, node_id: &str, epoch: i64) -> Result<bool, StoreError> {
        nodes::leave(&self.pool, self.guard_now(), node_id, epoch).await
    }

    async fn list_nodes(&self) -> Result<Vec<crate::NodeRecord>, StoreError> {
        nodes::list(&self.pool, self.guard_now()).await
    }

    async fn claim_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
        sole: bool,
    ) -> Result<crate::RuntimeClaim, StoreError> {
        owners::claim(&self.pool, self.guard_now(), sandbox, node_id, epoch, sole).await
    }

    async fn adopt_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        epoch: i64,
    ) -> Result<Option<i64>, StoreError> {
        owners::adopt(&self.pool, self.guard_now(), sandbox, node_id, epoch).await
    }

    async fn release_runtime(
        &self,
        sandbox: &SandboxId,
        node_id: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        owners::release(&self.pool, self.guard_now(), sandbox, node_id, token).await
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
        let row = sqlx::query(concat!(
            "UPDATE sandboxes SET state = ?3, updated_at = ?4 \
             WHERE id = ?1 AND generation = ?2 AND state = ?7 AND EXISTS (SELECT 1 \
             FROM runtime_owners WHERE sandbox_id = ?1 AND node_id = ?5 AND token = ?6) \
             RETURNING ",
            sandbox_columns!()
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

    fn claim(uid: &str, scope: &str, workdir: &str) -> NewSandbox {
        NewSandbox::new(
            Uid::new(uid).unwrap(),
            RuntimeScope::new(scope).unwrap(),
            Workdir::new(workdir).unwrap(),
            warren_core::BackendKind::Local,
        )
    }

    #[tokio::test]
    async fn each_in_memory_store_is_a_database_of_its_own() {
        let a = SqliteStore::open_in_memory().await.unwrap();
        let b = SqliteStore::open_in_memory().await.unwrap();
        a.claim_sandbox(&claim("alice", "t", "projects/a"))
            .await
            .unwrap();
        assert_eq!(a.list_sandboxes(None).await.unwrap().len(), 1);
        assert!(b.list_sandboxes(None).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_stored_value_that_breaks_its_type_is_reported_as_corrupt() {
        let store = SqliteStore::open_in_memory().await.unwrap();
        let new = claim("alice", "t", "projects/a");
        store.claim_sandbox(&new).await.unwrap();
        // `agents/` is reserved (I9): no Workdir can hold it, so reading it back must fail.
        sqlx::query("UPDATE sandboxes SET workdir = 'agents/x'")
            .execute(&store.pool)
            .await
            .unwrap();
        let err = store.get_sandbox(&new.id).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Corrupt {
                    table: "sandboxes",
                    column: "workdir",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("sandboxes.workdir"), "{err}");
    }

    #[tokio::test]
    async fn a_time_outside_the_calendar_is_reported_as_corrupt() {
        let store = SqliteStore::open_in_memory().await.unwrap();
        let uid = Uid::new("alice").unwrap();
        store
            .record_workdir(&uid, &Workdir::new("projects/a").unwrap())
            .await
            .unwrap();
        sqlx::query("UPDATE workdirs SET created_at = ?1")
            .bind(i64::MAX)
            .execute(&store.pool)
            .await
            .unwrap();
        let err = store.list_workdirs(&uid).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Corrupt {
                    column: "created_at",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn the_schema_refuses_an_unknown_sandbox_state() {
        let store = SqliteStore::open_in_memory().await.unwrap();
        store
            .claim_sandbox(&claim("alice", "t", "projects/a"))
            .await
            .unwrap();
        let result = sqlx::query("UPDATE sandboxes SET state = 'asleep'")
            .execute(&store.pool)
            .await;
        assert!(matches!(
            violation(&result.unwrap_err()),
            Some(ErrorKind::CheckViolation)
        ));
        // The states a migration added to the constraint are taken.
        for state in ["pausing", "paused", "created"] {
            sqlx::query("UPDATE sandboxes SET state = ?1")
                .bind(state)
                .execute(&store.pool)
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn records_returned_by_a_write_equal_the_same_records_read_back() {
        let store = SqliteStore::open_in_memory().await.unwrap();
        let new = claim("alice", "t", "projects/a");
        let created = store.claim_sandbox(&new).await.unwrap().into_record();
        assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(created));
    }

    #[tokio::test]
    async fn a_migration_item_whose_uid_breaks_its_type_is_reported_as_corrupt() {
        let store = SqliteStore::open_in_memory().await.unwrap();
        let migration = crate::NewMigration {
            id: "m-1".to_owned(),
            kind: "deerflow".to_owned(),
            source: "/srv/deerflow".to_owned(),
            plan_digest: "d".to_owned(),
            plan: "{}".to_owned(),
        };
        let item = crate::NewMigrationItem {
            key: "a".to_owned(),
            kind: "workdir".to_owned(),
            source: "threads/a".to_owned(),
            uid: Some(Uid::new("alice").unwrap()),
            target: "projects/a".to_owned(),
        };
        store.begin_migration(&migration, &[item]).await.unwrap();
        sqlx::query("UPDATE migration_items SET uid = ''")
            .execute(&store.pool)
            .await
            .unwrap();
        let err = store.migration_items("m-1").await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Corrupt {
                    table: "migration_items",
                    column: "uid",
                    ..
                }
            ),
            "{err:?}"
        );
        let result = sqlx::query("UPDATE migration_items SET state = 'moved'")
            .execute(&store.pool)
            .await;
        assert!(matches!(
            violation(&result.unwrap_err()),
            Some(ErrorKind::CheckViolation)
        ));
    }

    #[test]
    fn the_embedded_schema_has_a_version() {
        assert!(SqliteStore::schema_version() >= 1);
    }
}
