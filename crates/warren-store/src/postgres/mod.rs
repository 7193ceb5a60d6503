//! The PostgreSQL engine, for warren servers that share one database (issue 13, the
//! seeds' "任意节点都能 resume").
//!
//! The statements and the rules are the SQLite store's; what differs is how atomicity is
//! had under *several processes*:
//!
//! - a transaction that reads to decide locks what it read (`FOR UPDATE`) or a
//!   transaction-scoped advisory key (a claimed identity, a uid's agent environment),
//!   released at commit or rollback, never held by a session;
//! - guards, leases, nodes and owners judge expiry by the database's clock, the same for
//!   every process;
//! - a fenced write can hold the guard row ([`crate::StateStore::hold_fence`]).
//!
//! A database that cannot be reached is [`StoreError::Unavailable`]; the pool hands out
//! only connections that answer, so service resumes by itself when the server is back.

mod server_lock;

pub use server_lock::ServerLock;

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Column, Postgres, Row, Transaction, TypeInfo};
use warren_core::SandboxId;

use crate::sql::{bind_args, dialect, Clock, Query, Record};
use crate::{FenceCheck, FenceHold, SqlStore, StoreError};

/// The schema, embedded at build time.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

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

/// A [`crate::StateStore`] on a PostgreSQL database, shareable by many warren processes.
pub type PostgresStore = SqlStore<PostgresDialect>;

/// The PostgreSQL engine under a [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PostgresDialect {
    pool: PgPool,
}

/// The database's current time in unix milliseconds, as SQL. `clock_timestamp()` moves
/// within a transaction, unlike `now()`, so a long transaction never judges by a stale time.
/// Truncated, as every other clock of warren's is (`timestamp_millis`): a bare `::bigint`
/// rounds to the nearest millisecond, which puts a time up to half a millisecond in the
/// future, so a guard granted for 40 s could be seen to last a little over 40 s.
const NOW_MS: &str = "floor(extract(epoch from clock_timestamp()) * 1000)::bigint";

impl SqlStore<PostgresDialect> {
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
        let store = Self {
            db: PostgresDialect { pool },
        };
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

    async fn migrate(&self) -> Result<(), StoreError> {
        let pool = &self.db.pool;
        let has_history: bool =
            sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                .fetch_one(pool)
                .await
                .map_err(StoreError::query("read the schema version"))?;
        if has_history {
            let found: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
                    .fetch_one(pool)
                    .await
                    .map_err(StoreError::query("read the schema version"))?;
            let known = Self::schema_version();
            if let Some(found) = found.filter(|found| *found > known) {
                return Err(StoreError::SchemaTooNew { found, known });
            }
        }
        MIGRATOR.run(pool).await.map_err(StoreError::Migrate)
    }
}

dialect! {impl for PostgresDialect, row PgRow, tx Transaction<'static, Postgres> {
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const BYTEWISE: &'static str = " COLLATE \"C\"";

    async fn begin(&self) -> Result<Self::Tx, sqlx::Error> {
        self.pool.begin().await
    }

    /// A transaction-scoped advisory lock on the key's hash: released at commit or
    /// rollback, never held by a session.
    async fn lock(tx: &mut Self::Tx, key: &str) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(key)
            .execute(&mut **tx)
            .await
            .map(drop)
    }

    async fn now(&self, tx: &mut Self::Tx) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&mut **tx)
            .await
    }

    fn clock(&self) -> Clock {
        Clock::Database(NOW_MS)
    }

    /// [`check_fence`] that keeps the guard row locked `FOR SHARE` in a transaction of its own
    /// while the token is current, so an acquisition on any replica (its upsert updates the
    /// row) waits until the hold is dropped: the fenced write and the check are one critical
    /// section across processes, as the fence gate makes them within one.
    async fn hold_fence(
        &self,
        sandbox: &SandboxId,
        token: i64,
    ) -> Result<(FenceCheck, Option<FenceHold>), StoreError> {
        const OPERATION: &str = "hold a fencing token";
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(StoreError::query(OPERATION))?;
        let newest: Option<i64> =
            sqlx::query_scalar("SELECT token FROM guards WHERE sandbox_id = $1 FOR SHARE")
                .bind(sandbox.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OPERATION))?;
        let check = FenceCheck::of(token, newest);
        let hold = (check == FenceCheck::Current).then(|| FenceHold::new(tx));
        Ok((check, hold))
    }
}}

impl Record for PgRow {
    /// Integers of every width the schema uses (`INTEGER` exit codes, `BIGINT` elsewhere).
    fn int(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        let width = self
            .try_column(column)
            .map(|found| found.type_info().name().to_owned())?;
        match width.as_str() {
            "INT2" => Ok(self.try_get::<Option<i16>, _>(column)?.map(i64::from)),
            "INT4" => Ok(self.try_get::<Option<i32>, _>(column)?.map(i64::from)),
            _ => self.try_get(column),
        }
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
