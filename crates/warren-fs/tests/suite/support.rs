//! Shared fixture: a temp dir holding `root/` (the workspace), `outside/secret.txt` and
//! `other-user/workspace/secret.txt`, plus helpers to plant files and links and to snapshot
//! everything outside the workspace.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use tempfile::TempDir;
use warren_fs::{Resolver, WorkspaceRoot};

/// Content of the files the workspace must never reveal.
pub const SECRET: &str = "TOP-SECRET";

/// One test's directory layout.
pub struct Fixture {
    _tmp: TempDir,
    /// The temp dir holding everything.
    pub base: PathBuf,
    /// The workspace root.
    pub root: PathBuf,
    /// A directory next to the workspace, holding `secret.txt`.
    pub outside: PathBuf,
    /// Another user's workspace, holding `secret.txt`.
    pub other: PathBuf,
}

/// What a snapshot records for one path outside the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snap {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
}

impl Fixture {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        // Canonical, so absolute symlink targets and message checks use the real path.
        let base = tmp.path().canonicalize().expect("canonical temp dir");
        let root = base.join("root");
        let outside = base.join("outside");
        let other = base.join("other-user").join("workspace");
        for dir in [&root, &outside, &other] {
            fs::create_dir_all(dir).expect("create fixture dir");
        }
        fs::write(outside.join("secret.txt"), SECRET).expect("write secret");
        fs::write(other.join("secret.txt"), SECRET).expect("write other secret");
        Self {
            _tmp: tmp,
            base,
            root,
            outside,
            other,
        }
    }

    /// The workspace opened with `resolver`.
    pub fn ws(&self, resolver: Resolver) -> WorkspaceRoot {
        WorkspaceRoot::open_with(&self.root, resolver).expect("open workspace")
    }

    /// Host path of `rel` inside the workspace.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Creates a file inside the workspace (and its parents) directly on the host.
    pub fn file(&self, rel: &str, content: impl AsRef<[u8]>) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parents");
        }
        fs::write(path, content).expect("write fixture file");
    }

    /// Creates a directory inside the workspace directly on the host.
    pub fn dir(&self, rel: &str) {
        fs::create_dir_all(self.path(rel)).expect("create fixture dir");
    }

    /// Plants a symlink at `rel` inside the workspace.
    pub fn symlink(&self, rel: &str, target: impl AsRef<Path>) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parents");
        }
        symlink(target, path).expect("plant symlink");
    }

    /// Content of a file inside the workspace, read on the host.
    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).expect("read fixture file")
    }

    /// Everything under the temp dir except the workspace itself.
    pub fn snapshot_outside(&self) -> BTreeMap<PathBuf, Snap> {
        let mut out = BTreeMap::new();
        snapshot(&self.base, &self.root, &mut out);
        out
    }
}

fn snapshot(dir: &Path, skip: &Path, out: &mut BTreeMap<PathBuf, Snap>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path == skip {
            continue;
        }
        let meta = fs::symlink_metadata(&path).expect("lstat");
        if meta.file_type().is_symlink() {
            out.insert(
                path.clone(),
                Snap::Link(fs::read_link(&path).expect("readlink")),
            );
        } else if meta.is_dir() {
            out.insert(path.clone(), Snap::Dir);
            snapshot(&path, skip, out);
        } else {
            out.insert(path.clone(), Snap::File(fs::read(&path).expect("read")));
        }
    }
}

/// Names of the entries directly in `dir` on the host, sorted.
pub fn host_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
