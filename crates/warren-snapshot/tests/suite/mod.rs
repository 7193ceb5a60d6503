mod engine;
mod names;
mod sparse;
mod stores;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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

/// Everything about a tree a restore must bring back, entry by entry, by the exact bytes
/// of each name and symlink target: kind, mode, modification time, link count, and a
/// file's length and BLAKE3.
pub(crate) fn describe(dir: &Path) -> Vec<(Vec<u8>, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let what = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap().into_os_string();
                format!("link -> {:?}", target.as_bytes())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o} {}", meta.mode() & 0o7777, meta.mtime())
            } else {
                let bytes = std::fs::read(&path).unwrap();
                format!(
                    "file {:o} {} {} links={} {}",
                    meta.mode() & 0o7777,
                    meta.mtime(),
                    bytes.len(),
                    meta.nlink(),
                    blake3::hash(&bytes).to_hex()
                )
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}
