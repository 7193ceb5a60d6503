//! A store inside warren's state store (I31): chunks and manifests as rows, for
//! deployments whose only shared storage is the SQL database. Each owner (uid) has its
//! own namespace. Best for small workspaces: every object is one row.

use std::sync::Arc;
use std::time::Duration;

use warren_store::StateStore;

use crate::store::check_key;
use crate::{ObjectStore, SnapshotError};

/// Objects of one owner in a [`StateStore`].
pub struct SqlStore {
    state: Arc<dyn StateStore>,
    owner: String,
    runtime: tokio::runtime::Handle,
}

fn sql_error(operation: &'static str, error: warren_store::StoreError) -> SnapshotError {
    SnapshotError::store(operation, std::io::Error::other(error.to_string()))
}

impl SqlStore {
    /// The objects of `owner` in `state`, waiting for queries on `runtime`.
    pub fn new(state: Arc<dyn StateStore>, owner: &str, runtime: tokio::runtime::Handle) -> Self {
        Self {
            state,
            owner: owner.to_owned(),
            runtime,
        }
    }
}

impl ObjectStore for SqlStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<bool, SnapshotError> {
        check_key(key)?;
        self.runtime
            .block_on(self.state.put_object(&self.owner, key, bytes))
            .map_err(|e| sql_error("write an object", e))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        check_key(key)?;
        self.runtime
            .block_on(self.state.get_object(&self.owner, key))
            .map_err(|e| sql_error("read an object", e))
    }

    fn contains(&self, key: &str) -> Result<bool, SnapshotError> {
        Ok(self.age(key)?.is_some())
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, SnapshotError> {
        self.runtime
            .block_on(self.state.list_objects(&self.owner, prefix))
            .map_err(|e| sql_error("list the store", e))
    }

    fn delete(&self, key: &str) -> Result<(), SnapshotError> {
        check_key(key)?;
        self.runtime
            .block_on(self.state.delete_object(&self.owner, key))
            .map_err(|e| sql_error("delete an object", e))
    }

    fn age(&self, key: &str) -> Result<Option<Duration>, SnapshotError> {
        check_key(key)?;
        let created = self
            .runtime
            .block_on(self.state.object_created_at(&self.owner, key))
            .map_err(|e| sql_error("read an object's age", e))?;
        Ok(created.map(|at| (chrono::Utc::now() - at).to_std().unwrap_or_default()))
    }

    fn sync(&self) -> Result<(), SnapshotError> {
        // A committed row is as durable as the state store itself.
        Ok(())
    }
}
