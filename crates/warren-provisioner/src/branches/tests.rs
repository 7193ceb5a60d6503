//! Branches and the merger on a fixture (the ScriptedBackend runs nothing; files go
//! through the file API). Branches are overlay mounts: these tests need root, which the
//! suite runs as.

use std::time::Duration;

use warren_core::{BranchName, RuntimeScope, Uid, Workdir};
use warren_fs::{ByteRange, WriteOptions};

use crate::testing::Fixture;
use crate::{FenceToken, MergeRequest, Provisioner, ProvisionerError, SandboxRequest};

fn name(text: &str) -> BranchName {
    BranchName::new(text).unwrap()
}

async fn write(provisioner: &Provisioner, id: &warren_core::SandboxId, path: &str, text: &str) {
    provisioner
        .write(
            id,
            path,
            text.as_bytes().to_vec(),
            WriteOptions::default(),
            false,
        )
        .await
        .unwrap();
}

async fn read(
    provisioner: &Provisioner,
    id: &warren_core::SandboxId,
    path: &str,
) -> Option<String> {
    let read = provisioner.read(id, path, ByteRange::FULL).await.ok()?;
    Some(String::from_utf8(read.value.bytes).unwrap())
}

/// A sandbox of alice bound to `branch` of `workdir`.
async fn on_branch(
    f: &Fixture,
    scope: &str,
    workdir: &str,
    branch: &str,
) -> warren_core::SandboxId {
    let (record, _) = f
        .provisioner
        .create_sandbox(SandboxRequest {
            workdir: Some(workdir.into()),
            branch: Some(branch.into()),
            ..SandboxRequest::new(
                Uid::plain("alice").unwrap(),
                RuntimeScope::new(scope).unwrap(),
            )
        })
        .await
        .unwrap();
    assert_eq!(record.binding.branch, Some(name(branch)));
    record.id
}

async fn merge(
    provisioner: &Provisioner,
    id: &warren_core::SandboxId,
    branches: &[&str],
    dry_run: bool,
) -> Result<crate::MergeOutcome, ProvisionerError> {
    let guard = provisioner
        .acquire_guard(id, "merger", Duration::from_secs(60))
        .await
        .unwrap();
    let token = FenceToken::parse(&guard.token.to_string()).unwrap();
    let permit = provisioner.fence(id, Some(token)).await.unwrap();
    let outcome = provisioner
        .merge_branches(
            id,
            MergeRequest {
                branches: branches.iter().map(|b| name(b)).collect(),
                dry_run,
            },
            &permit,
        )
        .await;
    drop(permit);
    provisioner.release_guard(id, guard.token).await.unwrap();
    outcome
}

#[tokio::test]
async fn two_branches_edit_different_lines_and_the_merge_holds_both() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let uid = Uid::plain("alice").unwrap();
    let workdir = Workdir::new("projects/p").unwrap();
    let merger = f.sandbox("alice", "merger", "projects/p").await.id;
    write(p, &merger, "a.txt", "one\ntwo\nthree\nfour\nfive\n").await;

    p.create_branch(&uid, &workdir, name("b1"), None)
        .await
        .unwrap();
    p.create_branch(&uid, &workdir, name("b2"), None)
        .await
        .unwrap();
    let dup = p.create_branch(&uid, &workdir, name("b1"), None).await;
    assert!(
        matches!(dup, Err(ProvisionerError::BranchExists { .. })),
        "{dup:?}"
    );

    // The baseline is read-only for everyone while branched.
    let refused = p
        .write(
            &merger,
            "a.txt",
            b"x".to_vec(),
            WriteOptions::default(),
            false,
        )
        .await;
    assert!(
        matches!(refused, Err(ProvisionerError::WorkdirBranched { .. })),
        "{refused:?}"
    );
    let refused = p.remove(&merger, ".", true).await;
    assert!(refused.is_err(), "{refused:?}");

    let one = on_branch(&f, "agent-1", "projects/p", "b1").await;
    let two = on_branch(&f, "agent-2", "projects/p", "b2").await;
    write(p, &one, "a.txt", "ONE\ntwo\nthree\nfour\nfive\n").await;
    write(p, &one, "new-1.txt", "from b1").await;
    write(p, &two, "a.txt", "one\ntwo\nthree\nfour\nFIVE\n").await;
    write(p, &two, "new-2.txt", "from b2").await;
    // Each sees its own branch; the baseline is as it was.
    assert_eq!(read(p, &one, "new-2.txt").await, None);
    assert_eq!(read(p, &two, "new-1.txt").await, None);
    assert_eq!(
        read(p, &merger, "a.txt").await.unwrap(),
        "one\ntwo\nthree\nfour\nfive\n"
    );

    let diff = p.branch_diff(&uid, &workdir, &name("b1")).await.unwrap();
    let paths: Vec<&str> = diff.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["a.txt", "new-1.txt"]);

    // Without the guard's token a merge is refused; a dry run changes nothing.
    let unfenced = p
        .merge_branches(
            &merger,
            MergeRequest {
                branches: vec![name("b1")],
                dry_run: false,
            },
            &crate::FencePermit::unfenced(),
        )
        .await;
    assert!(
        matches!(unfenced, Err(ProvisionerError::BadRequest(_))),
        "{unfenced:?}"
    );
    let dry = merge(p, &merger, &["b1", "b2"], true).await.unwrap();
    assert!(!dry.applied && dry.conflicts.is_empty(), "{dry:?}");
    assert_eq!(read(p, &merger, "new-1.txt").await, None);

    // Every unmerged branch of the workdir goes at once: the workdir is their common
    // baseline, and a branch left out would later compare against the merged tree.
    let partial = merge(p, &merger, &["b1"], false).await;
    assert!(
        matches!(partial, Err(ProvisionerError::MergeIncomplete { .. })),
        "{partial:?}"
    );
    let merged = merge(p, &merger, &["b1", "b2"], false).await.unwrap();
    assert!(merged.applied);
    assert!(merged.checkpoint.is_some());
    assert_eq!(
        read(p, &merger, "a.txt").await.unwrap(),
        "ONE\ntwo\nthree\nfour\nFIVE\n"
    );
    assert_eq!(read(p, &merger, "new-1.txt").await.unwrap(), "from b1");
    assert_eq!(read(p, &merger, "new-2.txt").await.unwrap(), "from b2");
    // A merged branch is never merged again (its baseline changed under it).
    let again = merge(p, &merger, &["b1", "b2"], false).await;
    assert!(
        matches!(again, Err(ProvisionerError::BranchMerged { .. })),
        "{again:?}"
    );

    // A branch is deleted only when no live sandbox is bound to it; then the workdir is
    // writable again.
    let busy = p.delete_branch(&uid, &workdir, &name("b1")).await;
    assert!(
        matches!(busy, Err(ProvisionerError::BranchInUse { .. })),
        "{busy:?}"
    );
    for (id, branch) in [(&one, "b1"), (&two, "b2")] {
        p.terminate_sandbox(id, Duration::ZERO).await.unwrap();
        p.delete_branch(&uid, &workdir, &name(branch))
            .await
            .unwrap();
    }
    assert!(p
        .list_branches(&uid, Some(&workdir))
        .await
        .unwrap()
        .is_empty());
    write(p, &merger, "a.txt", "writable again").await;
}

#[tokio::test]
async fn a_conflicting_edit_is_reported_with_three_versions_and_nothing_applies() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let uid = Uid::plain("alice").unwrap();
    let workdir = Workdir::new("projects/c").unwrap();
    let merger = f.sandbox("alice", "merger", "projects/c").await.id;
    write(p, &merger, "a.txt", "one\n").await;
    p.create_branch(&uid, &workdir, name("x"), None)
        .await
        .unwrap();
    p.create_branch(&uid, &workdir, name("y"), None)
        .await
        .unwrap();
    let x = on_branch(&f, "x", "projects/c", "x").await;
    let y = on_branch(&f, "y", "projects/c", "y").await;
    write(p, &x, "a.txt", "from x\n").await;
    write(p, &x, "only-x.txt", "x").await;
    write(p, &y, "a.txt", "from y\n").await;

    let refused = merge(p, &merger, &["x", "y"], false).await;
    let Err(ProvisionerError::MergeConflict { conflicts }) = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(conflicts.len(), 1);
    let conflict = &conflicts[0];
    assert_eq!(
        (conflict.path.as_str(), conflict.branch.as_str()),
        ("a.txt", "y")
    );
    let text = |v: &warren_merge::Version| match v {
        warren_merge::Version::Text { text, .. } => text.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (
            text(&conflict.base),
            text(&conflict.ours),
            text(&conflict.theirs)
        ),
        ("one\n".into(), "from x\n".into(), "from y\n".into())
    );
    // Nothing applied, not even x's clean change.
    assert_eq!(read(p, &merger, "a.txt").await.unwrap(), "one\n");
    assert_eq!(read(p, &merger, "only-x.txt").await, None);
}

#[tokio::test]
async fn a_branch_of_a_workdir_with_a_running_writer_is_refused() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let uid = Uid::plain("alice").unwrap();
    let record = f.sandbox("alice", "writer", "projects/w").await;
    p.exec(&record.id, crate::testing::shell("true"), None)
        .await
        .unwrap();
    let refused = p
        .create_branch(&uid, &Workdir::new("projects/w").unwrap(), name("b"), None)
        .await;
    assert!(
        matches!(refused, Err(ProvisionerError::WorkdirInUse { .. })),
        "{refused:?}"
    );
    // Nothing of it is left behind.
    assert!(p.list_branches(&uid, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn another_uid_never_finds_a_branch_and_a_branch_name_is_never_a_path() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    f.sandbox("alice", "s", "projects/a").await;
    let alice = Uid::plain("alice").unwrap();
    let workdir = Workdir::new("projects/a").unwrap();
    p.create_branch(&alice, &workdir, name("b"), None)
        .await
        .unwrap();
    f.sandbox("bob", "s", "projects/a").await;
    let bob = Uid::plain("bob").unwrap();
    let missing = p.branch_diff(&bob, &workdir, &name("b")).await;
    assert!(
        matches!(missing, Err(ProvisionerError::BranchNotFound { .. })),
        "{missing:?}"
    );
    let bound = p
        .create_sandbox(SandboxRequest {
            workdir: Some("projects/a".into()),
            branch: Some("b".into()),
            ..SandboxRequest::new(bob, RuntimeScope::new("t").unwrap())
        })
        .await;
    assert!(
        matches!(bound, Err(ProvisionerError::BranchNotFound { .. })),
        "{bound:?}"
    );
    for bad in ["../x", "a/b", ".hidden", ""] {
        assert!(BranchName::new(bad).is_err(), "{bad:?}");
    }
}

#[tokio::test]
async fn three_forks_each_write_their_own_branch_and_never_the_source_s() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let source = f.sandbox("alice", "source", "projects/f").await.id;
    write(p, &source, "base.txt", "from the source").await;
    p.exec(&source, crate::testing::shell("true"), None)
        .await
        .unwrap();

    let forked = p
        .fork_sandbox(&source, 3, crate::SettingsChange::default())
        .await
        .unwrap();
    assert_eq!(forked.forks.len(), 3);
    // The source now writes a branch of its own, in a runtime started again from the
    // snapshot the forks start from.
    assert!(forked.source.binding.branch.is_some());
    assert_eq!(forked.source.state, warren_store::SandboxState::Running);
    for fork in &forked.forks {
        assert_eq!(fork.uid, forked.source.uid);
        assert_eq!(fork.binding.workdir, forked.source.binding.workdir);
        assert_ne!(fork.binding.branch, forked.source.binding.branch);
        assert_eq!(
            read(p, &fork.id, "base.txt").await.unwrap(),
            "from the source"
        );
    }
    let [one, two, three] = [
        &forked.forks[0].id,
        &forked.forks[1].id,
        &forked.forks[2].id,
    ];
    write(p, one, "mine.txt", "fork one").await;
    write(p, &source, "later.txt", "the source, after").await;
    assert_eq!(read(p, two, "mine.txt").await, None);
    assert_eq!(read(p, three, "mine.txt").await, None);
    assert_eq!(read(p, &source, "mine.txt").await, None);
    assert_eq!(read(p, one, "later.txt").await, None);
    assert_eq!(
        read(p, &source, "later.txt").await.unwrap(),
        "the source, after"
    );

    // A fork of a source bound to a branch starts with what that branch changed.
    let again = p
        .fork_sandbox(one, 1, crate::SettingsChange::default())
        .await
        .unwrap();
    let grandchild = &again.forks[0].id;
    assert_eq!(read(p, grandchild, "mine.txt").await.unwrap(), "fork one");
    write(p, grandchild, "mine.txt", "changed in the grandchild").await;
    assert_eq!(read(p, one, "mine.txt").await.unwrap(), "fork one");
    // Every fork's branch is a branch of the same workdir: a merger can bring them back.
    let uid = Uid::plain("alice").unwrap();
    let branches = p
        .list_branches(&uid, Some(&Workdir::new("projects/f").unwrap()))
        .await
        .unwrap();
    assert_eq!(branches.len(), 5, "{branches:?}");
}

#[tokio::test]
async fn a_merge_never_changes_the_baseline_of_a_workdir_it_holds() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let uid = Uid::plain("alice").unwrap();
    let merger = f.sandbox("alice", "merger", "projects/outer").await.id;
    p.create_workdir(&uid, Some("projects/outer/inner"))
        .await
        .unwrap();
    write(p, &merger, "inner/a.txt", "inner\n").await;
    let outer = Workdir::new("projects/outer").unwrap();
    let inner = Workdir::new("projects/outer/inner").unwrap();
    p.create_branch(&uid, &inner, name("deep"), None)
        .await
        .unwrap();
    p.create_branch(&uid, &outer, name("top"), None)
        .await
        .unwrap();
    let top = on_branch(&f, "top", "projects/outer", "top").await;
    write(p, &top, "inner/a.txt", "changed from the outer branch\n").await;
    let refused = merge(p, &merger, &["top"], false).await;
    assert!(
        matches!(&refused, Err(ProvisionerError::MergeIncomplete { workdir, .. }) if workdir == "projects/outer/inner"),
        "{refused:?}"
    );
    assert_eq!(read(p, &merger, "inner/a.txt").await.unwrap(), "inner\n");
}

#[tokio::test]
async fn a_merge_into_a_branch_takes_another_branch_and_leaves_the_workdir_as_it_was() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let uid = Uid::plain("alice").unwrap();
    let workdir = Workdir::new("projects/into").unwrap();
    let keeper = f.sandbox("alice", "keeper", "projects/into").await.id;
    write(p, &keeper, "a.txt", "one\ntwo\nthree\n").await;
    for branch in ["lead", "helper"] {
        p.create_branch(&uid, &workdir, name(branch), None)
            .await
            .unwrap();
    }
    let lead = on_branch(&f, "lead", "projects/into", "lead").await;
    let helper = on_branch(&f, "helper", "projects/into", "helper").await;
    write(p, &lead, "a.txt", "ONE\ntwo\nthree\n").await;
    write(p, &helper, "a.txt", "one\ntwo\nTHREE\n").await;
    write(p, &helper, "help.txt", "from the helper").await;

    // Into itself: refused; into the lead's branch: both edits, the workdir untouched.
    let itself = merge(p, &lead, &["lead"], false).await;
    assert!(
        matches!(itself, Err(ProvisionerError::BadRequest(_))),
        "{itself:?}"
    );
    let merged = merge(p, &lead, &["helper"], false).await.unwrap();
    assert!(merged.applied && merged.checkpoint.is_some(), "{merged:?}");
    assert_eq!(read(p, &lead, "a.txt").await.unwrap(), "ONE\ntwo\nTHREE\n");
    assert_eq!(read(p, &lead, "help.txt").await.unwrap(), "from the helper");
    assert_eq!(
        read(p, &keeper, "a.txt").await.unwrap(),
        "one\ntwo\nthree\n"
    );
    assert_eq!(read(p, &keeper, "help.txt").await, None);
    // The helper's branch is not spent: its baseline did not change.
    let listed = p.list_branches(&uid, Some(&workdir)).await.unwrap();
    assert!(
        listed.iter().all(|branch| branch.merged_at.is_none()),
        "{listed:?}"
    );
    // The lead's branch, holding both, then goes into the workdir with the helper's.
    let back = merge(p, &keeper, &["lead", "helper"], false).await.unwrap();
    assert!(back.applied, "{back:?}");
    assert_eq!(
        read(p, &keeper, "a.txt").await.unwrap(),
        "ONE\ntwo\nTHREE\n"
    );
}

#[tokio::test]
async fn a_checkpoint_of_a_branch_records_the_branch_and_nothing_restores_over_a_baseline() {
    let f = Fixture::new().await;
    f.provisioner.join_cluster().await.unwrap();
    let p = &*f.provisioner;
    let uid = Uid::plain("alice").unwrap();
    let keeper = f.sandbox("alice", "keeper", "projects/ck").await.id;
    write(p, &keeper, "a.txt", "baseline").await;
    let (before, _) = p.create_checkpoint(&keeper).await.unwrap();
    let workdir = Workdir::new("projects/ck").unwrap();
    p.create_branch(&uid, &workdir, name("b"), None)
        .await
        .unwrap();
    let on = on_branch(&f, "on", "projects/ck", "b").await;
    write(p, &on, "a.txt", "in the branch").await;
    let (of_branch, _) = p.create_checkpoint(&on).await.unwrap();
    // Compared with the branch as it is now: nothing changed since.
    write(p, &on, "b.txt", "later").await;
    let diff = p.checkpoint_diff(&on, &of_branch.id).await.unwrap();
    assert_eq!(
        (diff.added, diff.removed, diff.changed),
        (vec!["b.txt".to_owned()], vec![], vec![])
    );
    // A branch made from it holds the branch's file, not the baseline's.
    p.create_branch(&uid, &workdir, name("again"), Some(&of_branch.id))
        .await
        .unwrap();
    let again = on_branch(&f, "again", "projects/ck", "again").await;
    assert_eq!(read(p, &again, "a.txt").await.unwrap(), "in the branch");
    // Neither the branch nor the baseline is restored in place.
    let into_branch = p.restore_checkpoint(&on, &of_branch.id).await;
    assert!(
        matches!(into_branch, Err(ProvisionerError::BadRequest(_))),
        "{into_branch:?}"
    );
    let over_baseline = p.restore_checkpoint(&keeper, &before.id).await;
    assert!(
        matches!(over_baseline, Err(ProvisionerError::WorkdirBranched { .. })),
        "{over_baseline:?}"
    );
    assert_eq!(read(p, &keeper, "a.txt").await.unwrap(), "baseline");
}
