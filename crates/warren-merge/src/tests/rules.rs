//! The merge rules, one sentence each: what is taken, what is merged, what conflicts.

use std::os::unix::fs::MetadataExt;

use pretty_assertions::assert_eq;

use super::{baseline, numbered, Trees};
use crate::{Action, Kind, MergeError, Version};

/// A baseline in `base`, the target a copy of it, and branches `a` and `b` copies of it.
fn setup() -> Trees {
    let trees = Trees::new();
    baseline(&trees, "base");
    for name in ["target", "a", "b"] {
        trees.copy("base", name);
    }
    trees
}

/// Runs `check` once for a target that is the base itself and once for a copy of it.
fn for_both_targets(check: impl Fn(&Trees, &str)) {
    let trees = setup();
    check(&trees, "target");
    let trees = setup();
    trees.remove("target", "");
    check(&trees, "base");
}

#[test]
fn different_files_changed_in_two_branches_are_both_applied() {
    for_both_targets(|trees, target| {
        trees.write("a", "README.md", "# project\n\nintro by a\n");
        trees.write("b", "src/lib.rs", "pub fn lib() { b() }\n");
        trees.write("b", "src/new.rs", "new\n");
        let plan = trees.merge("base", target, &["a", "b"]);
        assert_eq!(trees.read(target, "README.md"), "# project\n\nintro by a\n");
        assert_eq!(trees.read(target, "src/lib.rs"), "pub fn lib() { b() }\n");
        assert_eq!(trees.read(target, "src/new.rs"), "new\n");
        let froms: Vec<_> = plan
            .steps
            .iter()
            .map(|s| (s.path.as_str(), s.from.clone()))
            .collect();
        assert_eq!(
            froms,
            [
                ("README.md", vec!["a".to_owned()]),
                ("src/lib.rs", vec!["b".to_owned()]),
                ("src/new.rs", vec!["b".to_owned()]),
            ]
        );
    });
}

#[test]
fn different_regions_of_one_text_file_are_merged_line_by_line() {
    for_both_targets(|trees, target| {
        trees.write(
            "a",
            "src/main.rs",
            numbered(10).replace("line 2\n", "line two\n"),
        );
        trees.write(
            "b",
            "src/main.rs",
            numbered(10).replace("line 9\n", "line nine\n"),
        );
        let plan = trees.merge("base", target, &["a", "b"]);
        let want = numbered(10)
            .replace("line 2\n", "line two\n")
            .replace("line 9\n", "line nine\n");
        assert_eq!(trees.read(target, "src/main.rs"), want);
        let step = &plan.steps[0];
        assert_eq!(
            (step.path.as_str(), step.action, step.merged_lines),
            ("src/main.rs", Action::Write, true)
        );
        assert_eq!(step.from, ["a", "b"]);
    });
}

#[test]
fn the_same_lines_changed_differently_conflict_and_nothing_is_applied() {
    let trees = setup();
    trees.write(
        "a",
        "src/main.rs",
        numbered(10).replace("line 5\n", "five by a\n"),
    );
    trees.write("a", "README.md", "changed by a too\n");
    trees.write(
        "b",
        "src/main.rs",
        numbered(10).replace("line 5\n", "five by b\n"),
    );
    let plan = trees.plan("base", "target", &["a", "b"]).unwrap();
    assert_eq!(plan.conflicts.len(), 1);
    let conflict = &plan.conflicts[0];
    assert_eq!(
        (
            conflict.path.as_str(),
            conflict.branch.as_str(),
            conflict.reason
        ),
        ("src/main.rs", "b", "both changed the same lines")
    );
    let text = |t: String| Version::Text {
        text: t,
        mode: 0o644,
    };
    assert_eq!(conflict.base, text(numbered(10)));
    assert_eq!(
        conflict.ours,
        text(numbered(10).replace("line 5\n", "five by a\n"))
    );
    assert_eq!(
        conflict.theirs,
        text(numbered(10).replace("line 5\n", "five by b\n"))
    );
    let error = trees.apply("target", &plan, "m1").unwrap_err();
    assert!(
        matches!(error, MergeError::Conflicts { count: 1 }),
        "{error}"
    );
    assert!(trees.same("base", "target"), "nothing was applied");
    trees.assert_no_leftovers("target");
}

#[test]
fn a_binary_file_changed_on_both_sides_conflicts() {
    let trees = setup();
    trees.write("a", "data.bin", [0u8, 1, 2, 3, 0, 1]);
    trees.write("b", "data.bin", [0u8, 1, 2, 3, 0, 2]);
    let plan = trees.plan("base", "target", &["a", "b"]).unwrap();
    let conflict = &plan.conflicts[0];
    assert_eq!(conflict.reason, "binary changed on both sides");
    let hex = |bytes: &[u8]| blake3::hash(bytes).to_hex().to_string();
    let binary = |bytes: &[u8]| Version::Binary {
        size: 6,
        hash: hex(bytes),
        mode: 0o644,
    };
    assert_eq!(conflict.base, binary(&[0, 1, 2, 3, 0, 255]));
    assert_eq!(conflict.ours, binary(&[0, 1, 2, 3, 0, 1]));
    assert_eq!(conflict.theirs, binary(&[0, 1, 2, 3, 0, 2]));
}

#[test]
fn a_file_modified_on_one_side_and_deleted_on_the_other_conflicts() {
    let trees = setup();
    trees.write("a", "docs/guide.md", "better guide\n");
    trees.remove("b", "docs/guide.md");
    let plan = trees.plan("base", "target", &["a", "b"]).unwrap();
    let reasons: Vec<_> = plan
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), c.reason))
        .collect();
    assert_eq!(reasons, [("docs/guide.md", "changed here, deleted there")]);
    assert_eq!(plan.conflicts[0].theirs, Version::Absent);

    let plan = trees.plan("base", "target", &["b", "a"]).unwrap();
    let reasons: Vec<_> = plan
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), c.reason))
        .collect();
    assert_eq!(reasons, [("docs/guide.md", "deleted here, changed there")]);
    assert_eq!(plan.conflicts[0].ours, Version::Absent);
}

#[test]
fn the_same_file_added_by_two_branches_merges_cleanly_and_different_ones_conflict() {
    let trees = setup();
    trees.write("a", "notes/todo.txt", "same\n");
    trees.write("b", "notes/todo.txt", "same\n");
    let plan = trees.merge("base", "target", &["a", "b"]);
    assert_eq!(trees.read("target", "notes/todo.txt"), "same\n");
    let todo = plan
        .steps
        .iter()
        .find(|s| s.path == "notes/todo.txt")
        .unwrap();
    assert_eq!(todo.from, ["a", "b"]);

    let trees = setup();
    trees.write("a", "notes/todo.txt", "from a\n");
    trees.write("b", "notes/todo.txt", "from b\n");
    let plan = trees.plan("base", "target", &["a", "b"]).unwrap();
    let reasons: Vec<_> = plan
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), c.reason))
        .collect();
    assert_eq!(reasons, [("notes/todo.txt", "both added different files")]);
    assert_eq!(plan.conflicts[0].base, Version::Absent);
}

#[test]
fn a_delete_on_one_side_is_applied_and_a_removed_directory_goes_with_its_files() {
    for_both_targets(|trees, target| {
        trees.remove("a", "README.md");
        trees.remove("b", "docs");
        trees.merge("base", target, &["a", "b"]);
        assert!(!trees.exists(target, "README.md"));
        assert!(!trees.exists(target, "docs"));
        assert!(trees.exists(target, "src/main.rs"));
    });
}

#[test]
fn a_directory_the_branch_removed_stays_when_the_target_added_to_it() {
    let trees = setup();
    trees.write("target", "docs/mine.md", "kept\n");
    trees.remove("a", "docs");
    trees.merge("base", "target", &["a"]);
    assert!(!trees.exists("target", "docs/guide.md"));
    assert_eq!(trees.read("target", "docs/mine.md"), "kept\n");
}

#[test]
fn a_directory_the_target_removed_is_made_again_for_what_a_branch_added_in_it() {
    let trees = setup();
    trees.remove("target", "docs");
    trees.write("a", "docs/new.md", "new\n");
    trees.merge("base", "target", &["a"]);
    assert_eq!(trees.read("target", "docs/new.md"), "new\n");
    assert!(
        !trees.exists("target", "docs/guide.md"),
        "the target's delete stays"
    );
}

#[test]
fn a_mode_change_is_applied_and_merges_with_a_content_change() {
    for_both_targets(|trees, target| {
        trees.chmod("a", "src/lib.rs", 0o755);
        trees.chmod("a", "docs", 0o700);
        trees.write("b", "src/lib.rs", "pub fn lib() { b() }\n");
        let plan = trees.merge("base", target, &["a", "b"]);
        assert_eq!(trees.mode(target, "src/lib.rs"), 0o755);
        assert_eq!(trees.mode(target, "docs"), 0o700);
        assert_eq!(trees.read(target, "src/lib.rs"), "pub fn lib() { b() }\n");
        let lib = plan.steps.iter().find(|s| s.path == "src/lib.rs").unwrap();
        assert_eq!(
            (lib.action, lib.from.clone()),
            (Action::Write, vec!["a".into(), "b".into()])
        );
    });
}

#[test]
fn symlinks_are_merged_as_their_target_text_and_never_followed() {
    let trees = setup();
    trees.remove("a", "current");
    trees.link("a", "current", "docs");
    trees.link("a", "etc", "/etc");
    trees.remove("b", "docs/guide.md");
    trees.link("b", "docs/guide.md", "/etc/passwd");
    trees.merge("base", "target", &["a", "b"]);
    for (path, want) in [
        ("current", "docs"),
        ("etc", "/etc"),
        ("docs/guide.md", "/etc/passwd"),
    ] {
        let link = trees.path("target").join(path);
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{path}"
        );
        assert_eq!(
            std::fs::read_link(&link).unwrap().to_str(),
            Some(want),
            "{path}"
        );
    }

    // A branch that made a file a link to /etc/passwd while another changed the file: the
    // conflict shows the link's text, and nothing reads what it points at.
    let trees = setup();
    trees.remove("a", "docs/guide.md");
    trees.link("a", "docs/guide.md", "/etc/passwd");
    trees.write("b", "docs/guide.md", "guide by b\n");
    trees.remove("b", "current");
    trees.link("b", "current", "/etc");
    trees.remove("target", "current");
    trees.link("target", "current", "/root");
    let plan = trees.plan("base", "target", &["a", "b"]).unwrap();
    let guide = plan
        .conflicts
        .iter()
        .find(|c| c.path == "docs/guide.md")
        .unwrap();
    assert_eq!(guide.reason, "type changed");
    assert_eq!(
        guide.ours,
        Version::Symlink {
            target: "/etc/passwd".into()
        }
    );
    let current = plan.conflicts.iter().find(|c| c.path == "current").unwrap();
    assert_eq!(current.reason, "both changed the link target");
    assert_eq!(
        current.ours,
        Version::Symlink {
            target: "/root".into()
        }
    );
    assert_eq!(
        current.theirs,
        Version::Symlink {
            target: "/etc".into()
        }
    );
}

#[test]
fn a_type_change_between_file_and_directory_is_applied() {
    for_both_targets(|trees, target| {
        trees.remove("a", "README.md");
        trees.write("a", "README.md/index.md", "now a directory\n");
        trees.remove("b", "docs");
        trees.write("b", "docs", "now a file\n");
        trees.merge("base", target, &["a", "b"]);
        assert_eq!(
            trees.read(target, "README.md/index.md"),
            "now a directory\n"
        );
        assert_eq!(trees.read(target, "docs"), "now a file\n");
    });
}

#[test]
fn a_rename_is_a_delete_and_an_add() {
    for_both_targets(|trees, target| {
        std::fs::rename(
            trees.path("a").join("src/lib.rs"),
            trees.path("a").join("src/core.rs"),
        )
        .unwrap();
        std::fs::rename(trees.path("b").join("docs"), trees.path("b").join("manual")).unwrap();
        trees.merge("base", target, &["a", "b"]);
        assert!(!trees.exists(target, "src/lib.rs"));
        assert_eq!(trees.read(target, "src/core.rs"), "pub fn lib() {}\n");
        assert!(!trees.exists(target, "docs"));
        assert_eq!(trees.read(target, "manual/guide.md"), "guide\n");
    });
}

#[test]
fn the_merged_target_equals_a_branch_when_only_that_branch_changed() {
    let trees = setup();
    trees.write("a", "x/y/z.txt", "deep\n");
    trees.chmod("a", "x/y", 0o750);
    trees.remove("a", "current");
    trees.write("a", "current", "a file now\n");
    trees.merge("base", "target", &["a"]);
    assert!(
        trees.same("a", "target"),
        "{:?}",
        trees.changes("a", "target")
    );
}

#[test]
fn special_files_are_refused_with_their_path() {
    let trees = setup();
    let fifo = trees.path("a").join("src/pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let error = crate::tree_changes(&trees.root("base"), &trees.root("a")).unwrap_err();
    match &error {
        MergeError::SpecialFile { tree, path } => {
            assert_eq!((*tree, path.as_str()), ("other", "src/pipe"))
        }
        other => panic!("{other}"),
    }
    assert!(error.to_string().contains("`src/pipe`"), "{error}");

    // One in the target where a branch changed something is refused too, never opened.
    let trees = setup();
    trees.remove("target", "docs/guide.md");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        trees.path("target").join("docs/guide.md"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    trees.write("a", "docs/guide.md", "guide by a\n");
    let error = trees.plan("base", "target", &["a"]).unwrap_err();
    assert!(
        matches!(&error, MergeError::SpecialFile { tree: "target", path } if path == "docs/guide.md"),
        "{error}"
    );
}

#[test]
fn a_target_changed_after_planning_is_refused_before_anything_is_applied() {
    let trees = setup();
    trees.write("a", "src/lib.rs", "by a\n");
    trees.write("a", "README.md", "by a\n");
    let plan = trees.plan("base", "target", &["a"]).unwrap();
    trees.write("target", "src/lib.rs", "changed meanwhile\n");
    let error = trees.apply("target", &plan, "m1").unwrap_err();
    assert!(
        matches!(&error, MergeError::TargetChanged { path } if path == "src/lib.rs"),
        "{error}"
    );
    assert_eq!(trees.read("target", "README.md"), "# project\n\nintro\n");
    trees.assert_no_leftovers("target");
}

#[test]
fn applied_entries_belong_to_the_target_owner() {
    let trees = setup();
    trees.write("a", "new/file.txt", "x\n");
    trees.link("a", "new/link", "file.txt");
    trees.write("a", "README.md", "changed\n");
    trees.merge("base", "target", &["a"]);
    let root = trees.root("target");
    let want = root
        .owner()
        .map_or(rustix::process::geteuid().as_raw(), |o| o.uid);
    for path in ["new", "new/file.txt", "new/link", "README.md"] {
        let meta = std::fs::symlink_metadata(trees.path("target").join(path)).unwrap();
        assert_eq!(meta.uid(), want, "{path}");
    }
}

#[test]
fn a_thousand_files_merge() {
    let trees = Trees::new();
    for i in 0..1000 {
        trees.write("base", &format!("d{}/f{i}.txt", i % 10), format!("{i}\n"));
    }
    trees.copy("base", "a");
    trees.copy("base", "b");
    for i in 0..1000 {
        let (branch, path) = (["a", "b"][i % 2], format!("d{}/f{i}.txt", i % 10));
        trees.write(branch, &path, format!("{i} changed\n"));
        trees.write(branch, &format!("new/{branch}{i}.txt"), "new\n");
    }
    let plan = trees.merge("base", "base", &["a", "b"]);
    assert_eq!(
        plan.steps.len(),
        2001,
        "1000 writes, 1000 additions and one directory"
    );
    assert_eq!(trees.read("base", "d3/f3.txt"), "3 changed\n");
    assert_eq!(trees.read("base", "new/b999.txt"), "new\n");
}

#[test]
fn changes_list_what_differs_and_nothing_else() {
    let trees = setup();
    trees.write("a", "src/main.rs", "x\n");
    trees.remove("a", "docs");
    trees.chmod("a", "src", 0o700);
    let changes = trees.changes("base", "a");
    let summary: Vec<_> = changes
        .iter()
        .map(|c| {
            (
                c.path.as_str(),
                c.before.as_ref().map(kind_name),
                c.after.as_ref().map(kind_name),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("docs", Some("dir"), None),
            ("docs/guide.md", Some("file"), None),
            ("src", Some("dir"), Some("dir")),
            ("src/main.rs", Some("file"), Some("file")),
        ]
    );
}

fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::File { .. } => "file",
        Kind::Symlink { .. } => "symlink",
        Kind::Dir { .. } => "dir",
    }
}
