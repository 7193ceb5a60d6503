mod engine;
mod names;
mod sparse;
mod stores;

use warren_fs::WorkspaceRoot;
use warren_snapshot::LocalStore;

/// A workspace root with an empty workdir `projects/a`, and a local store beside it.
pub(crate) struct Tree {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    store_dir: tempfile::TempDir,
}

impl Tree {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("projects/a")).unwrap();
        Self {
            _dir: dir,
            root,
            store_dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn wd(&self) -> std::path::PathBuf {
        self.root.join("projects/a")
    }

    pub(crate) fn ws(&self) -> WorkspaceRoot {
        WorkspaceRoot::open(&self.root).unwrap()
    }

    pub(crate) fn store(&self) -> LocalStore {
        LocalStore::open(self.store_dir.path()).unwrap()
    }
}
