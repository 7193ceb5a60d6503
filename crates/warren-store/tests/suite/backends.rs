//! The store backends the behaviour suite runs against.

use std::path::PathBuf;
use std::sync::Arc;

use warren_store::{SqliteStore, StateStore};

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
