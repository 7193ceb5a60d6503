//! The store backends the behaviour suite runs against.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use warren_store::{PostgresOptions, PostgresStore, SqliteStore, StateStore};
use warren_test_support::PostgresServer;

/// A way to open stores of one kind.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Opens a store handle.
    async fn open(&self) -> Arc<dyn StateStore>;

    /// Whether handles opened from this backend share their data (a file, a server), as
    /// opposed to each being a private database (memory). Checks about several handles or
    /// reopening only make sense when they do.
    fn is_shared(&self) -> bool;
}

/// A fresh private in-memory SQLite database per handle.
pub struct SqliteInMemory;

#[async_trait::async_trait]
impl Backend for SqliteInMemory {
    async fn open(&self) -> Arc<dyn StateStore> {
        Arc::new(SqliteStore::open_in_memory().await.expect("open in memory"))
    }

    fn is_shared(&self) -> bool {
        false
    }
}

/// One SQLite file in a temporary directory; every handle opens the same file.
pub struct SqliteFile {
    // Kept so the directory outlives the test's stores.
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl SqliteFile {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("state.db");
        Self { _dir: dir, path }
    }
}

#[async_trait::async_trait]
impl Backend for SqliteFile {
    async fn open(&self) -> Arc<dyn StateStore> {
        Arc::new(
            SqliteStore::open(&self.path)
                .await
                .expect("open file store"),
        )
    }

    fn is_shared(&self) -> bool {
        true
    }
}

/// The PostgreSQL server this test binary shares: one cluster, started on first use and
/// stopped when the process exits (see [`PostgresServer`]).
pub fn postgres_server() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start)
}

/// A fresh database on the shared PostgreSQL server; every handle connects to it.
pub struct Postgres {
    url: String,
}

impl Postgres {
    pub fn new() -> Self {
        Self {
            url: postgres_server().fresh_database(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

#[async_trait::async_trait]
impl Backend for Postgres {
    async fn open(&self) -> Arc<dyn StateStore> {
        Arc::new(
            PostgresStore::connect(&self.url, &PostgresOptions::default())
                .await
                .expect("connect to the PostgreSQL store"),
        )
    }

    fn is_shared(&self) -> bool {
        true
    }
}
