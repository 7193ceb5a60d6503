//! The snapshot engine on real trees: round trips of every kind of entry, deduplication,
//! diffs, and restores that fail cleanly on a corrupt or missing chunk or an interrupted
//! snapshot.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use warren_snapshot::{
    collect_garbage, diff, restore, snapshot, LocalStore, Manifest, ObjectStore, SnapshotError,
};

use warren_test_support::workload::Noise;

use super::{describe, TestStore, Tree};

/// A tree with one of everything a workdir can hold.
fn plant(wd: &Path) {
    std::fs::create_dir_all(wd.join("src/deep/er")).unwrap();
    std::fs::create_dir(wd.join("empty")).unwrap();
    std::fs::write(wd.join("src/main.rs"), "fn main() {}\n").unwrap();
    // A file large enough for several chunks, with content that does not repeat.
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(wd.join("src/deep/er/blob.bin"), &big).unwrap();
    std::fs::write(wd.join("odd name with spaces.txt"), "s").unwrap();
    std::fs::write(wd.join("new\nline"), "n").unwrap();
    std::fs::write(wd.join("-leading-dash"), "d").unwrap();
    std::fs::write(wd.join("ünïcødé ✓.md"), "u").unwrap();
    std::fs::write(wd.join("script.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(wd.join("script.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(wd.join("secret.key"), "k").unwrap();
    std::fs::set_permissions(wd.join("secret.key"), PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::create_dir(wd.join("locked")).unwrap();
    std::fs::write(wd.join("locked/inside.txt"), "i").unwrap();
    std::fs::set_permissions(wd.join("locked"), PermissionsExt::from_mode(0o555)).unwrap();
    symlink("src/main.rs", wd.join("rel-link")).unwrap();
    symlink("/etc/passwd", wd.join("abs-link")).unwrap();
    symlink("does/not/exist", wd.join("dangling")).unwrap();
    std::fs::write(wd.join("hard-a"), "shared inode").unwrap();
    std::fs::hard_link(wd.join("hard-a"), wd.join("src/hard-b")).unwrap();
}

fn unlock(dir: &Path) {
    let _ = std::fs::set_permissions(dir.join("locked"), PermissionsExt::from_mode(0o755));
}

#[test]
fn a_restore_brings_back_every_kind_of_entry_exactly() {
    let tree = Tree::new();
    plant(&tree.wd());
    let before = describe(&tree.wd());
    let store = tree.store();
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(stats.symlinks, 3);
    assert!(stats.chunks >= 10, "{stats:?}");

    // Wreck the tree every way, then restore.
    unlock(&tree.wd());
    std::fs::remove_dir_all(tree.wd().join("src")).unwrap();
    std::fs::write(tree.wd().join("hard-a"), "changed").unwrap();
    std::fs::write(tree.wd().join("added.txt"), "new").unwrap();
    std::fs::remove_file(tree.wd().join("rel-link")).unwrap();
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(describe(&tree.wd()), before);
    // Nothing left beside the workdir.
    let siblings: Vec<_> = std::fs::read_dir(tree.root.join("projects"))
        .unwrap()
        .collect();
    assert_eq!(siblings.len(), 1, "a staging directory was left behind");
    unlock(&tree.wd());
}

#[test]
fn a_second_snapshot_of_a_barely_changed_tree_stores_only_the_change() {
    let tree = Tree::new();
    plant(&tree.wd());
    let store = tree.store();
    let (_, first) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let (old, new) = ("fn main() {}\n", "fn main() { println!(); }\n");
    std::fs::write(tree.wd().join("src/main.rs"), new).unwrap();
    let (_, second) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(
        second.bytes_read,
        first.bytes_read + (new.len() - old.len()) as u64
    );
    assert_eq!(second.chunks_new, 1, "{second:?}");
    assert!(second.bytes_stored < 200, "{second:?}");
    unlock(&tree.wd());
}

#[test]
fn with_a_parent_unchanged_files_are_not_read_again() {
    let tree = Tree::new();
    plant(&tree.wd());
    let store = tree.store();
    let (parent, first) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    std::fs::write(tree.wd().join("src/main.rs"), "fn main() { changed(); }\n").unwrap();
    let (id, second) = snapshot(&tree.ws(), "projects/a", &store, Some(&parent)).unwrap();
    assert_eq!(second.files_unchanged, first.files - 1, "{second:?}");
    assert_eq!(second.bytes_read, "fn main() { changed(); }\n".len() as u64);
    // The result is the same tree a full read would record.
    std::fs::write(tree.wd().join("src/main.rs"), "overwritten").unwrap();
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(
        std::fs::read_to_string(tree.wd().join("src/main.rs")).unwrap(),
        "fn main() { changed(); }\n"
    );
    // A missing parent is not an error: every file is read.
    let (_, third) = snapshot(&tree.ws(), "projects/a", &store, Some("0000")).unwrap();
    assert_eq!(third.files_unchanged, 0);
    unlock(&tree.wd());
}

#[test]
fn a_diff_names_what_was_added_removed_and_changed_and_ignores_a_mere_touch() {
    let tree = Tree::new();
    plant(&tree.wd());
    let store = tree.store();
    let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    std::fs::write(tree.wd().join("added.txt"), "new").unwrap();
    std::fs::remove_file(tree.wd().join("odd name with spaces.txt")).unwrap();
    std::fs::write(tree.wd().join("src/main.rs"), "fn main() { changed(); }\n").unwrap();
    std::fs::set_permissions(
        tree.wd().join("secret.key"),
        PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    std::fs::remove_file(tree.wd().join("rel-link")).unwrap();
    symlink("elsewhere", tree.wd().join("rel-link")).unwrap();
    // Same bytes, new time: not a change.
    let blob = tree.wd().join("src/deep/er/blob.bin");
    let bytes = std::fs::read(&blob).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&blob, &bytes).unwrap();
    let found = diff(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(found.added, ["added.txt"]);
    assert_eq!(found.removed, ["odd name with spaces.txt"]);
    let mut changed = found.changed.clone();
    changed.sort();
    assert_eq!(changed, ["rel-link", "secret.key", "src/main.rs"]);
    unlock(&tree.wd());
}

#[test]
fn a_corrupt_or_missing_chunk_fails_the_restore_and_leaves_the_tree_alone() {
    for damage in ["corrupt", "missing"] {
        let tree = Tree::new();
        plant(&tree.wd());
        let store = tree.store();
        let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
        std::fs::write(tree.wd().join("after.txt"), "written after the snapshot").unwrap();
        let current = describe(&tree.wd());
        let packs = store.list("packs/").unwrap();
        assert_eq!(packs.len(), 1, "a small tree is one pack");
        let victim = &packs[0];
        match damage {
            "corrupt" => {
                // One byte in the middle of the pack: whichever chunk holds it fails its
                // hash (or does not even decompress).
                let path = tree.store_dir.path().join(victim);
                let mut bytes = std::fs::read(&path).unwrap();
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x55;
                std::fs::write(path, bytes).unwrap();
            }
            _ => store.delete(victim).unwrap(),
        }
        let error = restore(&tree.ws(), "projects/a", &store, &id).unwrap_err();
        match damage {
            "corrupt" => assert!(
                matches!(error, SnapshotError::Corrupt { what: "chunk", .. }),
                "{error}"
            ),
            _ => assert!(
                matches!(error, SnapshotError::MissingChunk { .. }),
                "{error}"
            ),
        }
        assert!(error.to_string().contains("cannot be restored"), "{error}");
        assert_eq!(
            describe(&tree.wd()),
            current,
            "a failed restore changed the tree"
        );
        let siblings: Vec<_> = std::fs::read_dir(tree.root.join("projects"))
            .unwrap()
            .collect();
        assert_eq!(
            siblings.len(),
            1,
            "a failed restore left its staging directory"
        );
        unlock(&tree.wd());
    }
}

/// A tree of about `packs` packs' worth (8 MiB each) of incompressible data.
fn plant_packs(wd: &Path, packs: usize) {
    let mut noise = Noise(0x2545_f491_4f6c_dd1d);
    for file in 0..packs * 2 {
        let mut bytes = vec![0u8; 4 * 1024 * 1024];
        noise.fill(&mut bytes);
        std::fs::write(wd.join(format!("blob{file}")), bytes).unwrap();
    }
}

#[test]
fn an_interrupted_snapshot_is_never_visible_whenever_it_stops() {
    let tree = Tree::new();
    plant_packs(&tree.wd(), 5);
    // Every write a whole snapshot makes: five packs, an index after the fourth and after
    // the fifth, the manifest.
    let writes = {
        let probe = tempfile::tempdir().unwrap();
        let store = TestStore::new(LocalStore::open(probe.path()).unwrap());
        snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
        store.counts().0
    };
    assert!(writes >= 8, "five packs, two indexes, a manifest: {writes}");
    // Stop after 0, 1, half and all but the last write (the manifest itself).
    for stop in [0, 1, writes / 2, writes - 1] {
        let fresh = tempfile::tempdir().unwrap();
        let store = TestStore::failing_after(LocalStore::open(fresh.path()).unwrap(), stop);
        assert!(
            snapshot(&tree.ws(), "projects/a", &store, None).is_err(),
            "{stop}"
        );
        assert!(
            store.list("manifests/").unwrap().is_empty(),
            "stopping after {stop} writes left a manifest"
        );
    }
    // What was packed and indexed before a stop is reused by the next complete snapshot.
    let (_, whole) = {
        let probe = tempfile::tempdir().unwrap();
        snapshot(
            &tree.ws(),
            "projects/a",
            &LocalStore::open(probe.path()).unwrap(),
            None,
        )
        .unwrap()
    };
    // Stopped after the first index: the four packs it names are reused.
    let halfway = TestStore::failing_after(tree.store(), writes - 3);
    assert!(snapshot(&tree.ws(), "projects/a", &halfway, None).is_err());
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &tree.store(), None).unwrap();
    assert!(
        stats.chunks_new < whole.chunks_new,
        "{stats:?} vs {whole:?}"
    );
    assert!(stats.chunks_new > 0, "{stats:?}");
    std::fs::remove_file(tree.wd().join("blob0")).unwrap();
    let before = describe(&tree.wd());
    restore(&tree.ws(), "projects/a", &tree.store(), &id).unwrap();
    assert_ne!(describe(&tree.wd()), before, "blob0 came back");
    assert_eq!(
        std::fs::metadata(tree.wd().join("blob0")).unwrap().len(),
        4 << 20
    );
}

#[test]
fn a_tampered_manifest_is_refused() {
    let tree = Tree::new();
    plant(&tree.wd());
    let store = tree.store();
    let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let path = tree
        .store_dir
        .path()
        .join("manifests")
        .join(&id[..2])
        .join(&id);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let error = restore(&tree.ws(), "projects/a", &store, &id).unwrap_err();
    assert!(
        matches!(
            error,
            SnapshotError::Corrupt {
                what: "manifest",
                ..
            }
        ),
        "{error}"
    );
    unlock(&tree.wd());
}

#[test]
fn a_restore_never_follows_a_link_planted_where_the_tree_was() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("file.txt"), "mine").unwrap();
    let store = tree.store();
    let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::remove_dir_all(tree.wd()).unwrap();
    symlink(outside.path(), tree.wd()).unwrap();
    // The link itself is swapped out (or the restore refused): nothing lands outside.
    if restore(&tree.ws(), "projects/a", &store, &id).is_ok() {
        let meta = std::fs::symlink_metadata(tree.wd()).unwrap();
        assert!(
            meta.is_dir(),
            "the restored workdir is not a real directory"
        );
        assert_eq!(
            std::fs::read_to_string(tree.wd().join("file.txt")).unwrap(),
            "mine"
        );
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "written outside"
    );
    assert!(outside.path().exists());
}

#[test]
fn garbage_collection_removes_only_what_no_live_snapshot_needs() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("kept.txt"), "in both snapshots").unwrap();
    std::fs::write(
        tree.wd().join("dropped.txt"),
        "only in the first snapshot, and longer than the file both keep",
    )
    .unwrap();
    let store = tree.store();
    let (first, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    std::fs::remove_file(tree.wd().join("dropped.txt")).unwrap();
    std::fs::write(tree.wd().join("new.txt"), "only in the second").unwrap();
    let (second, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    // Two packs (one per snapshot) with an index each; no chunk stored on its own.
    assert_eq!(store.list("packs/").unwrap().len(), 2);
    assert_eq!(store.list("indexes/").unwrap().len(), 2);
    assert!(store.list("chunks/").unwrap().is_empty());

    // Within the grace period nothing goes, live or not: an upload may be in flight.
    let spared = collect_garbage(
        &store,
        std::slice::from_ref(&second),
        std::time::Duration::from_secs(3600),
    )
    .unwrap();
    assert_eq!(
        (
            spared.chunks_removed,
            spared.manifests_removed,
            spared.packs_removed
        ),
        (0, 0, 0),
        "{spared:?}"
    );

    let swept = collect_garbage(
        &store,
        std::slice::from_ref(&second),
        std::time::Duration::ZERO,
    )
    .unwrap();
    // The first pack holds "kept" (needed) and "dropped" (not): half dead, so its needed
    // chunk moves to a new pack and "dropped" goes with the old one.
    assert_eq!(
        (swept.chunks_removed, swept.manifests_removed),
        (1, 1),
        "{swept:?}"
    );
    assert_eq!(swept.chunks_kept, 2, "{swept:?}");
    assert_eq!(swept.packs_repacked, 1, "{swept:?}");
    assert_eq!(
        store.list("indexes/").unwrap().len(),
        1,
        "the indexes are folded into one"
    );
    assert_eq!(store.list("packs/").unwrap().len(), 2);
    assert!(Manifest::load(&store, &first).is_err());
    // The live snapshot still restores whole.
    std::fs::write(tree.wd().join("kept.txt"), "overwritten").unwrap();
    restore(&tree.ws(), "projects/a", &store, &second).unwrap();
    assert_eq!(
        std::fs::read_to_string(tree.wd().join("kept.txt")).unwrap(),
        "in both snapshots"
    );
    assert_eq!(
        std::fs::read_to_string(tree.wd().join("new.txt")).unwrap(),
        "only in the second"
    );
    assert!(!tree.wd().join("dropped.txt").exists());

    // Once no snapshot is live, every pack goes.
    let emptied = collect_garbage(&store, &[], std::time::Duration::ZERO).unwrap();
    assert_eq!(emptied.packs_removed, 2, "{emptied:?}");
    assert!(store.list("packs/").unwrap().is_empty());
    assert!(store.list("indexes/").unwrap().is_empty());

    // An unreadable live manifest stops the collection before it removes anything.
    let (third, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let error = collect_garbage(&store, &["f".repeat(64)], std::time::Duration::ZERO).unwrap_err();
    assert!(
        matches!(error, SnapshotError::ManifestNotFound(_)),
        "{error}"
    );
    assert!(Manifest::load(&store, &third).is_ok());
    assert_eq!(store.list("packs/").unwrap().len(), 1);
}
