//! The SQLite engine: the embedded default, one database file.
//!
//! The file is opened in WAL mode so readers never wait for the writer, with a generous
//! busy timeout so concurrent writers (other tasks, other processes) queue instead of
//! failing. A writing transaction begins `IMMEDIATE`: the write lock is taken before the
//! first read, so two claimers can never both see "no sandbox" (or both see "terminated")
//! and both create one, nor two setters both pass a size limit. Expiry (guards, leases,
//! nodes, owners) is judged by this process's clock: one process owns the file.

use std::fs::{OpenOptions, Permissions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row, Sqlite, Transaction};

use crate::sql::{bind_args, dialect, Clock, Query, Record};
use crate::{FenceCheck, FenceHold, ManualClock, SqlStore, StoreError};

/// The schema, embedded at build time so the binary and its schema cannot drift apart.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a statement waits for another writer before giving up. Claims and run records
/// are tiny transactions; a wait this long means something is wedged, not merely busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`crate::StateStore`] backed by one SQLite database.
pub type SqliteStore = SqlStore<SqliteDialect>;

/// The SQLite engine under a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteDialect {
    pub(crate) pool: SqlitePool,
    /// The clock guard expiry is judged by: the process clock unless a test set one.
    clock: Option<ManualClock>,
}

impl SqlStore<SqliteDialect> {
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
        Self::on(pool, None).await
    }

    /// Opens a private in-memory database whose guards expire by `clock`, for tests that
    /// move time by hand.
    pub async fn open_in_memory_with_clock(clock: ManualClock) -> Result<Self, StoreError> {
        let mut store = Self::open_in_memory().await?;
        store.db.clock = Some(clock);
        Ok(store)
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
        Self::on(pool, None).await
    }

    async fn on(pool: SqlitePool, clock: Option<ManualClock>) -> Result<Self, StoreError> {
        let store = Self {
            db: SqliteDialect { pool, clock },
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Closes every connection, waiting for statements in flight. Later calls fail.
    pub async fn close(&self) {
        self.db.pool.close().await;
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
            .db
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
}

dialect! {impl for SqliteDialect, row SqliteRow, tx Transaction<'static, Sqlite> {
    const FOR_UPDATE: &'static str = "";
    const BYTEWISE: &'static str = "";

    /// `IMMEDIATE` takes the write lock now (waiting up to the busy timeout), so nothing the
    /// transaction reads can change before it writes or ends.
    async fn begin(&self) -> Result<Self::Tx, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// The transaction already holds the file's write lock.
    async fn lock(_tx: &mut Self::Tx, _key: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }

    async fn now(&self, _tx: &mut Self::Tx) -> Result<i64, sqlx::Error> {
        Ok(self.process_clock_now())
    }

    fn clock(&self) -> Clock {
        Clock::Process(self.process_clock_now())
    }

    /// One process owns the file; its own fence gate is exact, so nothing is held.
    async fn hold_fence(
        &self,
        sandbox: &warren_core::SandboxId,
        token: i64,
    ) -> Result<(FenceCheck, Option<FenceHold>), StoreError> {
        Ok((crate::guard::check_fence(self, sandbox, token).await?, None))
    }
}}

impl SqliteDialect {
    fn process_clock_now(&self) -> i64 {
        self.clock
            .as_ref()
            .map_or_else(crate::now_millis, ManualClock::now_millis)
    }
}

impl Record for SqliteRow {
    fn int(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(column)
    }

    fn text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(column)
    }

    fn boolean(&self, column: &str) -> Result<Option<bool>, sqlx::Error> {
        self.try_get(column)
    }

    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.try_get(column)
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

#[cfg(test)]
mod tests {
    use sqlx::error::ErrorKind;
    use warren_core::{RuntimeScope, Uid, Workdir};

    use super::*;
    use crate::error::violation;
    use crate::{NewSandbox, StateStore};

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
            .execute(&store.db.pool)
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
            .execute(&store.db.pool)
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
            .execute(&store.db.pool)
            .await;
        assert!(matches!(
            violation(&result.unwrap_err()),
            Some(ErrorKind::CheckViolation)
        ));
        // The states a migration added to the constraint are taken.
        for state in ["pausing", "paused", "created"] {
            sqlx::query("UPDATE sandboxes SET state = ?1")
                .bind(state)
                .execute(&store.db.pool)
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
            .execute(&store.db.pool)
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
            .execute(&store.db.pool)
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
