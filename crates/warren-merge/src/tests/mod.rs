//! Tests of the whole crate through its public API: merge rules, overlays, crashes,
//! attacks. Each test builds small trees in a temporary directory.

mod attack;
mod crash;
mod overlay;
mod rules;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use tempfile::TempDir;
use warren_fs::WorkspaceRoot;

use crate::{apply, plan, tree_changes, Applied, BranchInput, Change, MergeError, Plan};

/// A temporary directory holding named trees (`base`, `a`, `b`, `target`...) and a journal
/// directory.
pub(crate) struct Trees {
    dir: TempDir,
}

impl Trees {
    pub(crate) fn new() -> Self {
        let trees = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(trees.journal()).unwrap();
        trees
    }

    /// The host path of tree `name` (tests may use host paths; the crate never does).
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn journal(&self) -> PathBuf {
        self.dir.path().join("journal")
    }

    /// Writes `content` at `rel` in tree `name`, making parents.
    pub(crate) fn write(&self, name: &str, rel: &str, content: impl AsRef<[u8]>) {
        let path = self.path(name).join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    pub(crate) fn mkdir(&self, name: &str, rel: &str) {
        std::fs::create_dir_all(self.path(name).join(rel)).unwrap();
    }

    pub(crate) fn link(&self, name: &str, rel: &str, target: &str) {
        let path = self.path(name).join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
    }

    pub(crate) fn chmod(&self, name: &str, rel: &str, mode: u32) {
        let path = self.path(name).join(rel);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    pub(crate) fn remove(&self, name: &str, rel: &str) {
        let path = self.path(name).join(rel);
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }

    pub(crate) fn read(&self, name: &str, rel: &str) -> String {
        std::fs::read_to_string(self.path(name).join(rel)).unwrap()
    }

    pub(crate) fn exists(&self, name: &str, rel: &str) -> bool {
        std::fs::symlink_metadata(self.path(name).join(rel)).is_ok()
    }

    pub(crate) fn mode(&self, name: &str, rel: &str) -> u32 {
        std::fs::symlink_metadata(self.path(name).join(rel))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// Copies tree `from` to a new tree `to`, exactly (`cp -a`: modes, links as links).
    pub(crate) fn copy(&self, from: &str, to: &str) {
        copy_tree(&self.path(from), &self.path(to));
    }

    pub(crate) fn root(&self, name: &str) -> WorkspaceRoot {
        WorkspaceRoot::open(&self.path(name)).unwrap()
    }

    /// What tree `name` changed against tree `base`.
    pub(crate) fn changes(&self, base: &str, name: &str) -> Vec<Change> {
        tree_changes(&self.root(base), &self.root(name)).unwrap()
    }

    /// Plans merging `branches` (tree names, also their branch names) into `target`.
    pub(crate) fn plan(
        &self,
        base: &str,
        target: &str,
        branches: &[&str],
    ) -> Result<Plan, MergeError> {
        let roots: Vec<WorkspaceRoot> = branches.iter().map(|b| self.root(b)).collect();
        let inputs: Vec<BranchInput<'_>> = branches
            .iter()
            .zip(&roots)
            .map(|(name, tree)| BranchInput {
                name: (*name).to_owned(),
                tree,
                changes: self.changes(base, name),
            })
            .collect();
        plan(&self.root(base), &self.root(target), &inputs)
    }

    pub(crate) fn apply(&self, target: &str, plan: &Plan, id: &str) -> Result<Applied, MergeError> {
        apply(&self.root(target), plan, &self.journal(), id, target)
    }

    /// Plans and applies, expecting a clean merge.
    pub(crate) fn merge(&self, base: &str, target: &str, branches: &[&str]) -> Plan {
        let plan = self.plan(base, target, branches).unwrap();
        assert_eq!(plan.conflicts, [], "the merge should be clean");
        if let Err(e) = self.apply(target, &plan, "m1") {
            panic!("{e}: {:#?}", plan.steps);
        }
        self.assert_no_leftovers(target);
        plan
    }

    /// Whether tree `a` and tree `b` hold exactly the same entries.
    pub(crate) fn same(&self, a: &str, b: &str) -> bool {
        self.changes(a, b).is_empty()
    }

    /// No staging directory in `target`, no journal.
    pub(crate) fn assert_no_leftovers(&self, target: &str) {
        let staged: Vec<_> = std::fs::read_dir(self.path(target))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(crate::STAGING_PREFIX)
            })
            .collect();
        assert!(staged.is_empty(), "staging left: {staged:?}");
        let journals: Vec<_> = std::fs::read_dir(self.journal()).unwrap().collect();
        assert!(journals.is_empty(), "journal left: {journals:?}");
    }
}

/// A byte-exact copy of a tree (modes, links as links), by the host paths of a test.
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A baseline most tests start from: a few text files, a directory, a link.
pub(crate) fn baseline(trees: &Trees, name: &str) {
    trees.write(name, "README.md", "# project\n\nintro\n");
    trees.write(name, "src/main.rs", numbered(10));
    trees.write(name, "src/lib.rs", "pub fn lib() {}\n");
    trees.write(name, "docs/guide.md", "guide\n");
    trees.write(name, "data.bin", [0u8, 1, 2, 3, 0, 255]);
    trees.link(name, "current", "src");
}

/// `n` numbered lines.
pub(crate) fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}
