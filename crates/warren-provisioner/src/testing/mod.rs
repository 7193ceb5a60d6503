//! Test fixtures for library-level tests of the provisioner's rules (lifecycle, reaper,
//! guard, ownership), here and in crates that embed it: a provisioner on a private data
//! directory and an in-memory SQLite store, over a [`ScriptedBackend`].
//!
//! Compiled for this crate's tests and, with the `testing` feature, for other crates' tests.

mod backend;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use backend::{Call, Gate, Op, ScriptedBackend};
use warren_core::{RuntimeScope, Uid};
use warren_store::{SandboxRecord, SqliteStore, StateStore};

use crate::{ExecInput, ProgramSpec, Provisioner, ProvisionerConfig, SandboxRequest};

/// A provisioner, its store and its backend double, on a data directory removed when the
/// fixture is dropped.
pub struct Fixture {
    /// The provisioner under test.
    pub provisioner: Arc<Provisioner>,
    /// Its backend: script it, read its calls.
    pub backend: Arc<ScriptedBackend>,
    /// Its state store.
    pub store: Arc<dyn StateStore>,
    data_dir: PathBuf,
}

/// A change a test makes to the provisioner's configuration.
type ConfigChange = Box<dyn FnOnce(&mut ProvisionerConfig)>;

/// How a [`Fixture`] is made: [`Fixture::builder`].
#[derive(Default)]
pub struct FixtureBuilder {
    configure: Vec<ConfigChange>,
    store: Option<Arc<dyn StateStore>>,
    backend: Option<ScriptedBackend>,
}

impl FixtureBuilder {
    /// Changes the provisioner's configuration (made by [`ProvisionerConfig::new`] on the
    /// fixture's data directory).
    pub fn configure(mut self, change: impl FnOnce(&mut ProvisionerConfig) + 'static) -> Self {
        self.configure.push(Box::new(change));
        self
    }

    /// Uses `store` instead of a fresh in-memory SQLite store.
    pub fn store(mut self, store: Arc<dyn StateStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Uses `backend` instead of a fresh [`ScriptedBackend`].
    pub fn backend(mut self, backend: ScriptedBackend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Makes the data directory and the provisioner.
    pub async fn build(self) -> Fixture {
        let data_dir =
            std::env::temp_dir().join(format!("warren-provisioner-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&data_dir).expect("a data directory");
        let mut config = ProvisionerConfig::new(&data_dir);
        for change in self.configure {
            change(&mut config);
        }
        let store = match self.store {
            Some(store) => store,
            None => Arc::new(
                SqliteStore::open_in_memory()
                    .await
                    .expect("an in-memory store"),
            ),
        };
        let backend = Arc::new(self.backend.unwrap_or_default());
        Fixture {
            provisioner: Arc::new(Provisioner::new(config, store.clone(), backend.clone())),
            backend,
            store,
            data_dir,
        }
    }
}

impl Fixture {
    /// A fixture with the default configuration, store and backend.
    pub async fn new() -> Self {
        Self::builder().build().await
    }

    /// A fixture made another way.
    pub fn builder() -> FixtureBuilder {
        FixtureBuilder::default()
    }

    /// The data directory (the workspace directory too).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Creates `uid`'s workdir `workdir` and the sandbox of (`uid`, `scope`) bound to it.
    pub async fn sandbox(&self, uid: &str, scope: &str, workdir: &str) -> SandboxRecord {
        let uid = Uid::plain(uid).expect("a plain uid");
        self.provisioner
            .create_workdir(&uid, Some(workdir))
            .await
            .expect("the workdir");
        let (record, _) = self
            .provisioner
            .create_sandbox(SandboxRequest {
                workdir: Some(workdir.into()),
                ..SandboxRequest::new(uid, RuntimeScope::new(scope).expect("a runtime scope"))
            })
            .await
            .expect("the sandbox");
        record
    }

    /// A provisioner as a restarted server makes it: the same configuration, store and
    /// backend, nothing of this one's memory.
    pub fn restarted(&self) -> Provisioner {
        Provisioner::new(
            self.provisioner.config().clone(),
            self.store.clone(),
            self.backend.clone(),
        )
    }
}

/// An exec of the shell command line `line` with nothing else set, as a client asks it.
pub fn shell(line: &str) -> ExecInput {
    ExecInput {
        program: ProgramSpec::Shell(line.to_owned()),
        cwd: None,
        env: BTreeMap::new(),
        timeout: None,
        stdin: Vec::new(),
        requested_by: "test".to_owned(),
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        crate::unmount_branches(&self.data_dir);
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
