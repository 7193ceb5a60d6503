//! [`crate::branch_changes`] against a real overlay mount, held to the full comparison.

use std::ffi::CString;
use std::io::Write;
use std::path::PathBuf;

use pretty_assertions::assert_eq;
use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};

use super::{baseline, numbered, Trees};
use crate::{branch_changes, tree_changes, Change, Kind};

/// A baseline with something for every kind of overlay change to act on.
fn lower(trees: &Trees) {
    baseline(trees, "lower");
    trees.write("lower", "old/a.txt", "a\n");
    trees.write("lower", "old/deep/b.txt", "b\n");
    trees.write("lower", "opaque/a.txt", "a\n");
    trees.write("lower", "opaque/sub/b.txt", "b\n");
    trees.write("lower", "notes.txt", "notes\n");
    trees.write("lower", "conf/a", "a\n");
    trees.write("lower", "keep/same.txt", "same\n");
    trees.write("lower", "keep/moved.txt", "moved\n");
}

/// The branch's edits, made through the merged view at `merged` (host paths: a test's).
fn edit(merged: &std::path::Path) {
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};
    fs::write(
        merged.join("src/main.rs"),
        numbered(10).replace("line 3\n", "three\n"),
    )
    .unwrap();
    fs::remove_file(merged.join("docs/guide.md")).unwrap();
    fs::remove_dir_all(merged.join("old")).unwrap();
    fs::remove_dir_all(merged.join("opaque")).unwrap();
    fs::create_dir(merged.join("opaque")).unwrap();
    fs::write(merged.join("opaque/c.txt"), "c\n").unwrap();
    fs::set_permissions(merged.join("src/lib.rs"), fs::Permissions::from_mode(0o755)).unwrap();
    // Copied up with nothing changed: opened for writing, rewritten with the same bytes.
    fs::OpenOptions::new()
        .append(true)
        .open(merged.join("README.md"))
        .unwrap()
        .flush()
        .unwrap();
    fs::write(merged.join("data.bin"), [0u8, 1, 2, 3, 0, 255]).unwrap();
    fs::create_dir_all(merged.join("new/deep")).unwrap();
    fs::write(merged.join("new/deep/x.txt"), "x\n").unwrap();
    fs::remove_file(merged.join("current")).unwrap();
    symlink("docs", merged.join("current")).unwrap();
    fs::remove_file(merged.join("notes.txt")).unwrap();
    fs::create_dir(merged.join("notes.txt")).unwrap();
    fs::write(merged.join("notes.txt/today"), "today\n").unwrap();
    fs::remove_dir_all(merged.join("conf")).unwrap();
    fs::write(merged.join("conf"), "now a file\n").unwrap();
    fs::rename(
        merged.join("keep/moved.txt"),
        merged.join("keep/renamed.txt"),
    )
    .unwrap();
}

/// What the edits change, path by path: (path, before, after) as kind names.
fn expected() -> Vec<(&'static str, Option<&'static str>, Option<&'static str>)> {
    vec![
        ("conf", Some("dir"), Some("file")),
        ("conf/a", Some("file"), None),
        ("current", Some("symlink"), Some("symlink")),
        ("docs/guide.md", Some("file"), None),
        ("keep/moved.txt", Some("file"), None),
        ("keep/renamed.txt", None, Some("file")),
        ("new", None, Some("dir")),
        ("new/deep", None, Some("dir")),
        ("new/deep/x.txt", None, Some("file")),
        ("notes.txt", Some("file"), Some("dir")),
        ("notes.txt/today", None, Some("file")),
        ("old", Some("dir"), None),
        ("old/a.txt", Some("file"), None),
        ("old/deep", Some("dir"), None),
        ("old/deep/b.txt", Some("file"), None),
        ("opaque/a.txt", Some("file"), None),
        ("opaque/c.txt", None, Some("file")),
        ("opaque/sub", Some("dir"), None),
        ("opaque/sub/b.txt", Some("file"), None),
        ("src/lib.rs", Some("file"), Some("file")),
        ("src/main.rs", Some("file"), Some("file")),
    ]
}

fn summary(changes: &[Change]) -> Vec<(&str, Option<&'static str>, Option<&'static str>)> {
    let name = |k: &Kind| match k {
        Kind::File { .. } => "file",
        Kind::Symlink { .. } => "symlink",
        Kind::Dir { .. } => "dir",
    };
    changes
        .iter()
        .map(|c| {
            (
                c.path.as_str(),
                c.before.as_ref().map(name),
                c.after.as_ref().map(name),
            )
        })
        .collect()
}

/// Unmounts on drop, so a failing assertion leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = unmount(&self.0, UnmountFlags::DETACH);
    }
}

#[test]
fn branch_changes_equal_tree_changes_for_a_real_overlay() {
    let trees = Trees::new();
    lower(&trees);
    if !rustix::process::geteuid().is_root() {
        // No overlay without root: the full comparison still runs, on a plain copy.
        trees.copy("lower", "merged");
        edit(&trees.path("merged"));
        assert_eq!(summary(&trees.changes("lower", "merged")), expected());
        return;
    }
    for dir in ["upper", "work", "merged"] {
        trees.mkdir(dir, "");
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        trees.path("lower").display(),
        trees.path("upper").display(),
        trees.path("work").display()
    );
    let options = CString::new(options).unwrap();
    mount(
        "overlay",
        trees.path("merged"),
        "overlay",
        MountFlags::empty(),
        options.as_c_str(),
    )
    .expect("root mounts an overlay");
    let _mounted = Mounted(trees.path("merged"));
    edit(&trees.path("merged"));

    let (lower, upper, merged) = (
        trees.root("lower"),
        trees.root("upper"),
        trees.root("merged"),
    );
    let changes = branch_changes(&lower, &upper, &merged).unwrap();
    assert_eq!(changes, tree_changes(&lower, &merged).unwrap());
    assert_eq!(summary(&changes), expected());

    // Merged back into (a copy of) the baseline, the branch's tree comes out exactly.
    trees.copy("lower", "target");
    let plan = crate::plan(
        &lower,
        &trees.root("target"),
        &[crate::BranchInput {
            name: "branch".into(),
            tree: &merged,
            changes,
        }],
    )
    .unwrap();
    crate::apply(
        &trees.root("target"),
        &plan,
        &trees.journal(),
        "overlay",
        "target",
    )
    .unwrap();
    assert_eq!(tree_changes(&merged, &trees.root("target")).unwrap(), []);
}
