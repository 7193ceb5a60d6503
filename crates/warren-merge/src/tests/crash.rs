//! Crash safety: an apply killed at any point ends, after recovery, in the old tree or the
//! merged tree exactly, with no staging directory or journal left.
//!
//! The test binary runs itself again (`--exact <this test>`) with an environment variable
//! that makes the test play the child: it applies the merge and aborts at the k-th progress
//! call, for every k from the first staged file to the last step.

use std::path::Path;
use std::process::Command;

use warren_fs::WorkspaceRoot;

use super::{baseline, numbered, Trees};
use crate::{
    apply_with, discard_staging, plan, recover, tree_changes, BranchInput, MergeError, Phase,
};

/// Set on the child only: `<trees dir>|<k>|<target name>`.
const CHILD: &str = "WARREN_MERGE_CRASH_CHILD";
const TEST: &str = "tests::crash::a_crash_anywhere_leaves_the_old_or_the_merged_tree";

/// Branch edits that make every kind of step: new, modified, merged and deleted files, a
/// removed directory, new directories, modes, links, and type changes both ways.
fn scenario(trees: &Trees) {
    baseline(trees, "pristine");
    trees.write("pristine", "old/a.txt", "a\n");
    trees.write("pristine", "old/deep/b.txt", "b\n");
    trees.write("pristine", "become-dir", "file\n");
    trees.write("pristine", "become-file/x", "x\n");
    trees.copy("pristine", "a");
    trees.copy("pristine", "b");
    trees.write(
        "a",
        "src/main.rs",
        numbered(10).replace("line 1\n", "first\n"),
    );
    trees.write(
        "b",
        "src/main.rs",
        numbered(10).replace("line 10\n", "last\n"),
    );
    trees.write("a", "new/one.txt", "one\n");
    trees.write("a", "new/nested/two.txt", "two\n");
    trees.remove("a", "old");
    trees.chmod("a", "src/lib.rs", 0o700);
    trees.remove("b", "current");
    trees.link("b", "current", "docs");
    trees.remove("b", "become-dir");
    trees.write("b", "become-dir/inside", "in\n");
    trees.remove("b", "become-file");
    trees.write("b", "become-file", "now a file\n");
    trees.remove("b", "README.md");
}

/// Opens the trees named in `dir`, plans branches `a` and `b` into `target` (which is also
/// the base), and applies with `progress`.
fn run(dir: &Path, target: &str, progress: &mut dyn FnMut(Phase, usize)) -> Result<(), MergeError> {
    let root = |name: &str| WorkspaceRoot::open(&dir.join(name)).unwrap();
    let (tree, a, b) = (root(target), root("a"), root("b"));
    let inputs = [("a", &a), ("b", &b)].map(|(name, branch)| BranchInput {
        name: name.to_owned(),
        tree: branch,
        changes: tree_changes(&tree, branch).unwrap(),
    });
    let plan = plan(&tree, &tree, &inputs)?;
    assert!(plan.is_clean(), "{:?}", plan.conflicts);
    let journal = dir.join(format!("journal-{target}"));
    apply_with(&tree, &plan, &journal, "crash", target, progress).map(|_| ())
}

fn child(spec: &str) {
    let mut parts = spec.split('|');
    let (dir, k, target) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let k: usize = k.parse().unwrap();
    // No core file for an abort that is the point of the test.
    let no_core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    let _ = rustix::process::setrlimit(rustix::process::Resource::Core, no_core);
    let mut calls = 0;
    run(Path::new(dir), target, &mut |_, _| {
        calls += 1;
        if calls == k {
            std::process::abort();
        }
    })
    .unwrap();
}

#[test]
fn a_crash_anywhere_leaves_the_old_or_the_merged_tree() {
    if let Ok(spec) = std::env::var(CHILD) {
        return child(&spec);
    }
    let trees = Trees::new();
    scenario(&trees);

    // The merged tree, and where the commit falls among the progress calls.
    trees.copy("pristine", "merged");
    std::fs::create_dir(trees.path("journal-merged")).unwrap();
    let mut phases = Vec::new();
    run(&trees.path(""), "merged", &mut |phase, _| {
        phases.push(phase)
    })
    .unwrap();
    let commit = phases.iter().position(|p| *p == Phase::Committed).unwrap() + 1;
    assert!(commit > 3, "several files are staged: {phases:?}");
    assert!(
        phases.len() > commit + 5,
        "several steps are applied: {phases:?}"
    );
    assert!(!trees.same("pristine", "merged"));

    for k in 1..=phases.len() + 1 {
        let target = format!("t{k}");
        trees.copy("pristine", &target);
        let journal = trees.path(&format!("journal-{target}"));
        std::fs::create_dir(&journal).unwrap();
        let spec = format!("{}|{k}|{target}", trees.path("").display());
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD, spec)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.success(), k > phases.len(), "k = {k}: {status}");

        let recovered = recover(&journal, |key| {
            assert_eq!(key, target);
            Ok(WorkspaceRoot::open(&trees.path(key)).unwrap())
        })
        .unwrap();
        let root = trees.root(&target);
        if recovered.is_empty() {
            discard_staging(&root).unwrap();
        }
        let want = if k >= commit { "merged" } else { "pristine" };
        let diff = tree_changes(&trees.root(want), &root).unwrap();
        assert!(
            diff.is_empty(),
            "k = {k} ({:?}): not the {want} tree: {diff:?}",
            phases.get(k - 1)
        );
        assert_eq!(
            recovered.len(),
            usize::from(k >= commit && k <= phases.len()),
            "k = {k}"
        );
        let left: Vec<_> = std::fs::read_dir(&journal).unwrap().collect();
        assert!(left.is_empty(), "k = {k}: journal left");
        assert_eq!(discard_staging(&root).unwrap(), 0, "k = {k}: staging left");
    }
}

/// Unwinds out of a progress callback without the panic hook (no message): a crash that
/// leaves the process alive, so the test can go on with what the crash left.
fn stop() -> ! {
    std::panic::resume_unwind(Box::new("stop"))
}

#[test]
fn a_recovery_cut_short_anywhere_is_finished_by_the_next() {
    let trees = Trees::new();
    scenario(&trees);
    trees.copy("pristine", "merged");
    std::fs::create_dir(trees.path("journal-merged")).unwrap();
    let mut steps = 0;
    run(&trees.path(""), "merged", &mut |phase, _| {
        steps += usize::from(phase == Phase::Applying);
    })
    .unwrap();

    for cut in 1..=steps {
        let target = format!("t{cut}");
        trees.copy("pristine", &target);
        let journal_dir = trees.path(&format!("journal-{target}"));
        std::fs::create_dir(&journal_dir).unwrap();
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&trees.path(""), &target, &mut |phase, _| {
                if phase == Phase::Committed {
                    stop();
                }
            })
        }));
        assert!(committed.is_err(), "the apply stops at its commit");

        // A first recovery dies after `cut` steps...
        let root = trees.root(&target);
        let bytes = std::fs::read(crate::journal::journal_path(&journal_dir, "crash")).unwrap();
        let journal: crate::journal::Journal = serde_json::from_slice(&bytes).unwrap();
        let staging = crate::journal::open_staging(&root, "crash").unwrap();
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::journal::replay(&root, &journal, staging.as_ref(), &mut |_, done| {
                if done == cut {
                    stop();
                }
            })
        }));
        assert!(first.is_err());
        drop(staging);

        // ...and the next one finishes the merge exactly.
        let recovered = recover(&journal_dir, |key| {
            Ok(WorkspaceRoot::open(&trees.path(key)).unwrap())
        })
        .unwrap();
        assert_eq!(recovered.len(), 1);
        let diff = tree_changes(&trees.root("merged"), &root).unwrap();
        assert!(diff.is_empty(), "cut after {cut} steps: {diff:?}");
        assert_eq!(discard_staging(&root).unwrap(), 0);
    }
}

#[test]
fn journals_are_named_by_a_checked_id_and_never_overwritten() {
    let trees = Trees::new();
    baseline(&trees, "base");
    trees.copy("base", "a");
    trees.write("a", "new.txt", "new\n");
    let plan = trees.plan("base", "base", &["a"]).unwrap();
    for id in ["", "../x", "a/b", "a b", &"x".repeat(65)] {
        let error = trees.apply("base", &plan, id).unwrap_err();
        assert!(
            matches!(error, MergeError::InvalidId { .. }),
            "{id:?}: {error}"
        );
    }
    std::fs::write(trees.journal().join("m1.json"), "{}").unwrap();
    let error = trees.apply("base", &plan, "m1").unwrap_err();
    assert!(matches!(error, MergeError::JournalExists { .. }), "{error}");
    assert!(!trees.exists("base", "new.txt"));

    // A journal that cannot be read stops recovery loudly; a temporary one (never
    // committed) is simply removed.
    let error = recover(&trees.journal(), |_| unreachable!()).unwrap_err();
    assert!(
        matches!(error, MergeError::JournalCorrupt { .. }),
        "{error}"
    );
    std::fs::remove_file(trees.journal().join("m1.json")).unwrap();
    std::fs::write(trees.journal().join("m2.json.tmp"), "{").unwrap();
    assert_eq!(recover(&trees.journal(), |_| unreachable!()).unwrap(), []);
    trees.assert_no_leftovers("base");
}
