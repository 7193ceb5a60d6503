//! The snapshot engine on real trees: round trips of every kind of entry, deduplication,
//! diffs, and restores that fail cleanly on a corrupt or missing chunk or an interrupted
//! snapshot.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use warren_snapshot::{
    collect_garbage, diff, restore, snapshot, LocalStore, Manifest, ObjectStore, SnapshotError,
};

use super::{describe, Tree};

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
        let chunks = store.list("chunks/").unwrap();
        let victim = &chunks[chunks.len() / 2];
        match damage {
            "corrupt" => {
                let bytes = zstd::bulk::compress(b"not what the hash says", 3).unwrap();
                let path = tree
                    .store_dir
                    .path()
                    .join("chunks")
                    .join(&victim["chunks/".len().."chunks/".len() + 2])
                    .join(&victim["chunks/".len()..]);
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

/// A store that fails after a number of writes, like a process killed mid-upload.
struct FailingStore {
    inner: LocalStore,
    writes_left: std::sync::atomic::AtomicUsize,
}

impl ObjectStore for FailingStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<bool, SnapshotError> {
        use std::sync::atomic::Ordering;
        if self.writes_left.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err(SnapshotError::Store {
                operation: "write an object",
                source: std::io::Error::other("the process died here"),
            });
        }
        self.inner.put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        self.inner.get(key)
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
    fn age(&self, key: &str) -> Result<Option<std::time::Duration>, SnapshotError> {
        self.inner.age(key)
    }
}

#[test]
fn an_interrupted_snapshot_is_never_visible_whenever_it_stops() {
    let tree = Tree::new();
    plant(&tree.wd());
    let chunks = {
        let probe = tempfile::tempdir().unwrap();
        let store = LocalStore::open(probe.path()).unwrap();
        snapshot(&tree.ws(), "projects/a", &store, None)
            .unwrap()
            .1
            .chunks_new as usize
    };
    // Stop after 0, 1, half and all of the chunk writes (the last case fails on the
    // manifest itself).
    for writes in [0, 1, chunks / 2, chunks] {
        let fresh = tempfile::tempdir().unwrap();
        let store = FailingStore {
            inner: LocalStore::open(fresh.path()).unwrap(),
            writes_left: writes.into(),
        };
        assert!(
            snapshot(&tree.ws(), "projects/a", &store, None).is_err(),
            "{writes}"
        );
        assert!(
            store.list("manifests/").unwrap().is_empty(),
            "stopping after {writes} writes left a manifest"
        );
    }
    // What was uploaded before the stop is reused by the next complete snapshot.
    let halfway = FailingStore {
        inner: tree.store(),
        writes_left: (chunks / 2).into(),
    };
    assert!(snapshot(&tree.ws(), "projects/a", &halfway, None).is_err());
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &tree.store(), None).unwrap();
    assert!(stats.chunks_new < chunks as u64, "{stats:?}");
    assert!(Manifest::load(&tree.store(), &id).is_ok());
    unlock(&tree.wd());
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
    std::fs::write(tree.wd().join("dropped.txt"), "only in the first").unwrap();
    let store = tree.store();
    let (first, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    std::fs::remove_file(tree.wd().join("dropped.txt")).unwrap();
    std::fs::write(tree.wd().join("new.txt"), "only in the second").unwrap();
    let (second, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(store.list("chunks/").unwrap().len(), 3);

    // Within the grace period nothing goes, live or not: an upload may be in flight.
    let spared = collect_garbage(
        &store,
        std::slice::from_ref(&second),
        std::time::Duration::from_secs(3600),
    )
    .unwrap();
    assert_eq!((spared.chunks_removed, spared.manifests_removed), (0, 0));

    let swept = collect_garbage(
        &store,
        std::slice::from_ref(&second),
        std::time::Duration::ZERO,
    )
    .unwrap();
    assert_eq!(
        (swept.chunks_removed, swept.manifests_removed),
        (1, 1),
        "{swept:?}"
    );
    assert_eq!(swept.chunks_kept, 2);
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

    // An unreadable live manifest stops the collection before it removes anything.
    let error = collect_garbage(&store, &["f".repeat(64)], std::time::Duration::ZERO).unwrap_err();
    assert!(
        matches!(error, SnapshotError::ManifestNotFound(_)),
        "{error}"
    );
    assert_eq!(store.list("chunks/").unwrap().len(), 2);
}
