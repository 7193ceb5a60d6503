//! Attacks a merge must not fall for: links planted in the target, a staging directory the
//! sandbox user could reach.

use std::os::unix::fs::MetadataExt;

use super::{baseline, Trees};
use crate::{apply_with, MergeError, Phase};

/// Whether the directory "outside" the trees is still empty.
fn untouched(outside: &std::path::Path) -> bool {
    std::fs::read_dir(outside).unwrap().next().is_none()
}

#[test]
fn a_symlinked_directory_in_the_target_never_leads_a_write_outside() {
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().to_str().unwrap();

    // The base and the branch have a directory `sub`; the target made it a link outside.
    let trees = Trees::new();
    baseline(&trees, "base");
    trees.mkdir("base", "sub");
    trees.copy("base", "target");
    trees.copy("base", "a");
    trees.write("a", "sub/file", "payload\n");
    trees.remove("target", "sub");
    trees.link("target", "sub", out);
    let plan = trees.plan("base", "target", &["a"]).unwrap();
    let conflicts: Vec<_> = plan
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), c.reason))
        .collect();
    assert_eq!(conflicts, [("sub", "type changed")]);
    assert!(matches!(
        trees.apply("target", &plan, "m1"),
        Err(MergeError::Conflicts { .. })
    ));
    assert!(untouched(outside.path()));

    // The branch adds `sub/`; the target has a link of that name.
    let trees = Trees::new();
    baseline(&trees, "base");
    trees.copy("base", "target");
    trees.copy("base", "a");
    trees.write("a", "sub/file", "payload\n");
    trees.link("target", "sub", out);
    let plan = trees.plan("base", "target", &["a"]).unwrap();
    let conflicts: Vec<_> = plan
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), c.reason))
        .collect();
    assert_eq!(conflicts, [("sub", "both added different files")]);
    assert!(untouched(outside.path()));

    // The target's `sub/` is swapped for a link between planning and applying.
    let trees = Trees::new();
    baseline(&trees, "base");
    trees.mkdir("base", "sub");
    trees.copy("base", "target");
    trees.copy("base", "a");
    trees.write("a", "sub/file", "payload\n");
    trees.write("a", "sub/deeper/file", "payload\n");
    let plan = trees.plan("base", "target", &["a"]).unwrap();
    assert!(plan.is_clean());
    trees.remove("target", "sub");
    trees.link("target", "sub", out);
    let error = trees.apply("target", &plan, "m1").unwrap_err();
    assert!(
        matches!(&error, MergeError::TargetChanged { path } if path == "sub"),
        "{error}"
    );
    assert!(untouched(outside.path()));
    trees.assert_no_leftovers("target");
}

#[test]
fn the_staging_directory_is_closed_to_the_sandbox_user() {
    let trees = Trees::new();
    baseline(&trees, "base");
    trees.copy("base", "a");
    trees.write("a", "new.txt", "new\n");
    let plan = trees.plan("base", "base", &["a"]).unwrap();
    let staging = trees.path("base").join(".warren-merge-m1");
    let euid = rustix::process::geteuid().as_raw();
    let target = trees.root("base");
    let owner = target.owner().map_or(euid, |o| o.uid);
    let mut looked = false;
    apply_with(
        &target,
        &plan,
        &trees.journal(),
        "m1",
        "base",
        &mut |phase, _| {
            if phase == Phase::Staging {
                let meta = std::fs::symlink_metadata(&staging).unwrap();
                assert!(meta.is_dir());
                assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o700, euid));
                let staged = std::fs::symlink_metadata(staging.join("s0")).unwrap();
                assert_eq!(
                    staged.uid(),
                    owner,
                    "staged content already belongs to the owner"
                );
                looked = true;
            }
        },
    )
    .unwrap();
    assert!(looked);
    trees.assert_no_leftovers("base");
}

#[test]
fn a_change_naming_the_staging_directory_is_refused() {
    let trees = Trees::new();
    baseline(&trees, "base");
    trees.copy("base", "a");
    trees.write("a", ".warren-merge-x/evil", "x\n");
    let error = trees.plan("base", "base", &["a"]).unwrap_err();
    assert!(matches!(error, MergeError::ReservedName { .. }), "{error}");
}
