mod engine;
mod names;
mod packs;
mod sparse;
mod stores;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use warren_fs::WorkspaceRoot;
use warren_snapshot::{LocalStore, ObjectStore, SnapshotError};

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

/// Something to run against the inner store before the first range read.
pub(crate) type Hook<'h> = Box<dyn FnOnce(&LocalStore) + Send + 'h>;

/// A local store that counts requests, may fail after a number of writes (like a process
/// killed mid-upload), may say it reads in parallel, and may run a hook before its first
/// range read (the collector running elsewhere, say).
pub(crate) struct TestStore<'h> {
    pub(crate) inner: LocalStore,
    /// Writes that succeed before every later one fails.
    pub(crate) writes_left: AtomicUsize,
    pub(crate) parallel: usize,
    pub(crate) before_first_range: Mutex<Option<Hook<'h>>>,
    puts: AtomicUsize,
    reads: AtomicUsize,
}

impl TestStore<'_> {
    pub(crate) fn new(inner: LocalStore) -> Self {
        Self::failing_after(inner, usize::MAX)
    }

    pub(crate) fn failing_after(inner: LocalStore, writes: usize) -> Self {
        Self {
            inner,
            writes_left: writes.into(),
            parallel: 1,
            before_first_range: Mutex::new(None),
            puts: AtomicUsize::new(0),
            reads: AtomicUsize::new(0),
        }
    }

    /// (writes, reads) since the last call.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (
            self.puts.swap(0, Ordering::SeqCst),
            self.reads.swap(0, Ordering::SeqCst),
        )
    }
}

impl ObjectStore for TestStore<'_> {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<bool, SnapshotError> {
        if self.writes_left.fetch_sub(1, Ordering::SeqCst) == 0 {
            self.writes_left.store(0, Ordering::SeqCst);
            return Err(SnapshotError::Store {
                operation: "write an object",
                source: std::io::Error::other("the process died here"),
            });
        }
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }
    fn get_range(
        &self,
        key: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, SnapshotError> {
        let hook = self.before_first_range.lock().unwrap().take();
        if let Some(hook) = hook {
            hook(&self.inner);
        }
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get_range(key, offset, len)
    }
    fn parallel_reads(&self) -> usize {
        self.parallel
    }
    fn contains(&self, key: &str) -> Result<bool, SnapshotError> {
        self.inner.contains(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, SnapshotError> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), SnapshotError> {
        self.inner.delete(key)
    }
    fn sync(&self) -> Result<(), SnapshotError> {
        self.inner.sync()
    }
    fn age(&self, key: &str) -> Result<Option<Duration>, SnapshotError> {
        self.inner.age(key)
    }
}

/// Stores `content` as a chunk object of its own, as versions before packs did; returns
/// its hash.
pub(crate) fn put_legacy_chunk(store: &dyn ObjectStore, content: &[u8]) -> String {
    let hash = blake3::hash(content).to_hex().to_string();
    store
        .put(
            &format!("chunks/{hash}"),
            &zstd::bulk::compress(content, 1).unwrap(),
        )
        .unwrap();
    hash
}

/// Stores a manifest's JSON the way the engine does (zstd, named by the BLAKE3 of those
/// bytes); returns its id.
pub(crate) fn put_manifest(store: &dyn ObjectStore, json: &[u8]) -> String {
    let bytes = zstd::bulk::compress(json, 3).unwrap();
    let id = blake3::hash(&bytes).to_hex().to_string();
    store.put(&format!("manifests/{id}"), &bytes).unwrap();
    id
}
