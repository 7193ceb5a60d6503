//! Pack files (issue 14): how many objects a snapshot writes and a restore reads, a
//! restore racing the collector, and stores written before packs.

use std::time::Duration;

use warren_snapshot::{collect_garbage, restore, snapshot, LocalStore, ObjectStore, SnapshotError};

use warren_test_support::workload::Noise;

use super::{describe, put_legacy_chunk, put_manifest, TestStore, Tree};

#[test]
fn thousands_of_small_files_are_a_handful_of_objects_written_and_read() {
    let tree = Tree::new();
    for dir in 0..20 {
        std::fs::create_dir_all(tree.wd().join(format!("d{dir}"))).unwrap();
        for file in 0..100 {
            std::fs::write(
                tree.wd().join(format!("d{dir}/f{file}.py")),
                format!("def f_{dir}_{file}():\n    return {file} * {dir}\n"),
            )
            .unwrap();
        }
    }
    let store = TestStore::new(tree.store());
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(stats.chunks_new, 2000, "{stats:?}");
    let (puts, _) = store.counts();
    // One pack, its index, the manifest: not one object per file.
    assert_eq!(puts, 3, "{stats:?}");
    let before = describe(&tree.wd());
    std::fs::remove_dir_all(tree.wd()).unwrap();
    std::fs::create_dir(tree.wd()).unwrap();
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(describe(&tree.wd()), before);
    let (_, reads) = store.counts();
    // The manifest, the index, and the pack in one range read.
    assert_eq!(reads, 3);
}

#[test]
fn a_restore_whose_pack_the_collector_moves_meanwhile_fetches_the_chunks_from_their_new_place() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("kept.txt"), "kept by the live snapshot").unwrap();
    let dead: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(tree.wd().join("dead.bin"), &dead).unwrap();
    let store = TestStore::new(tree.store());
    snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    std::fs::remove_file(tree.wd().join("dead.bin")).unwrap();
    let (live, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let before = describe(&tree.wd());
    std::fs::write(tree.wd().join("kept.txt"), "changed since").unwrap();
    // The restore has read the index and planned its reads when the collector, elsewhere,
    // drops the first snapshot and moves "kept" out of the mostly dead pack.
    let moved = live.clone();
    *store.before_first_range.lock().unwrap() = Some(Box::new(move |inner: &LocalStore| {
        let stats = collect_garbage(inner, &[moved], Duration::ZERO).unwrap();
        assert_eq!(stats.packs_repacked, 1, "{stats:?}");
    }));
    restore(&tree.ws(), "projects/a", &store, &live).unwrap();
    assert!(
        store.before_first_range.lock().unwrap().is_none(),
        "the collector never ran"
    );
    assert_eq!(describe(&tree.wd()), before);
}

#[test]
fn a_store_written_before_packs_still_restores_is_reused_and_is_collected() {
    let tree = Tree::new();
    let store = tree.store();
    let content = b"written as an object of its own";
    let hash = put_legacy_chunk(&store, content);
    let json = format!(
        r#"{{"version":3,"created_unix_ms":1700000000000,"entries":[
{{"path":"","kind":"dir","mode":493,"uid":0,"gid":0,"modified_unix_ms":1700000000000,"inode":1,"changed_unix_ns":1,"size":4096}},
{{"path":"old.txt","kind":"file","mode":420,"uid":0,"gid":0,"modified_unix_ms":1700000001000,"inode":2,"changed_unix_ns":1,"size":{},"chunks":[{{"hash":"{hash}","len":{}}}]}}
]}}"#,
        content.len(),
        content.len()
    );
    let old = put_manifest(&store, json.as_bytes());

    restore(&tree.ws(), "projects/a", &store, &old).unwrap();
    assert_eq!(std::fs::read(tree.wd().join("old.txt")).unwrap(), content);
    // The same content snapshotted now is found where it is: nothing new is stored.
    let (new, stats) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(stats.chunks_new, 0, "{stats:?}");
    let spared = collect_garbage(&store, std::slice::from_ref(&new), Duration::ZERO).unwrap();
    assert_eq!(
        (spared.chunks_kept, spared.manifests_removed),
        (1, 1),
        "{spared:?}"
    );
    let swept = collect_garbage(&store, &[], Duration::ZERO).unwrap();
    assert_eq!(swept.chunks_removed, 1, "{swept:?}");
    assert!(store.list("chunks/").unwrap().is_empty());
}

#[test]
fn the_collector_removes_an_old_pack_no_index_names_and_spares_a_young_one() {
    let tree = Tree::new();
    let store = tree.store();
    // What a crash between a pack and its index leaves.
    store
        .put(&format!("packs/{}", "ab".repeat(32)), b"orphan")
        .unwrap();
    let spared = collect_garbage(&store, &[], Duration::from_secs(3600)).unwrap();
    assert_eq!(
        (spared.packs_kept, spared.packs_removed),
        (1, 0),
        "{spared:?}"
    );
    let swept = collect_garbage(&store, &[], Duration::ZERO).unwrap();
    assert_eq!(swept.packs_removed, 1, "{swept:?}");
    assert!(store.list("packs/").unwrap().is_empty());
}

#[test]
fn a_corrupt_index_stops_the_collector_before_it_removes_anything() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("f.txt"), "content").unwrap();
    let store = tree.store();
    let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let index = store.list("indexes/").unwrap().remove(0);
    std::fs::write(tree.store_dir.path().join(&index), b"tampered").unwrap();
    let error = collect_garbage(&store, &[], Duration::ZERO).unwrap_err();
    assert!(
        matches!(error, SnapshotError::Corrupt { what: "index", .. }),
        "{error}"
    );
    assert_eq!(store.list("packs/").unwrap().len(), 1);
    assert_eq!(store.list("manifests/").unwrap().len(), 1);
    // And a restore that needs it says which index is damaged.
    let error = restore(&tree.ws(), "projects/a", &store, &id).unwrap_err();
    assert!(
        matches!(error, SnapshotError::Corrupt { what: "index", .. }),
        "{error}"
    );
}

#[test]
fn a_restore_fetching_several_packs_at_once_puts_every_byte_back_in_order() {
    let tree = Tree::new();
    // Five packs' worth of incompressible files between many small ones.
    let mut noise = Noise(0x0123_4567_89ab_cdef);
    for file in 0..12 {
        let mut bytes = vec![0u8; 3 * 1024 * 1024 + file * 1000];
        noise.fill(&mut bytes);
        std::fs::write(tree.wd().join(format!("blob{file}")), bytes).unwrap();
        std::fs::write(
            tree.wd().join(format!("note{file}.txt")),
            format!("note {file}"),
        )
        .unwrap();
    }
    let mut store = TestStore::new(tree.store());
    store.parallel = 3;
    let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert!(
        store.list("packs/").unwrap().len() >= 4,
        "too few packs to read at once"
    );
    let before = describe(&tree.wd());
    std::fs::remove_dir_all(tree.wd()).unwrap();
    std::fs::create_dir(tree.wd()).unwrap();
    store.counts();
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(describe(&tree.wd()), before);
    let (_, reads) = store.counts();
    let packs = store.list("packs/").unwrap().len();
    // The manifest, the indexes, and each pack in one read.
    let indexes = store.list("indexes/").unwrap().len();
    assert_eq!(reads, 1 + indexes + packs, "{packs} packs");
}

#[test]
fn an_index_naming_a_pack_that_is_gone_never_lets_a_snapshot_reuse_its_chunks() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("f.txt"), "kept somewhere that must exist").unwrap();
    let store = tree.store();
    snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    // What two collectors at once can leave: an index that names a deleted pack.
    for pack in store.list("packs/").unwrap() {
        store.delete(&pack).unwrap();
    }
    assert_eq!(store.list("indexes/").unwrap().len(), 1);
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(stats.chunks_new, 1, "the chunk was stored again: {stats:?}");
    std::fs::write(tree.wd().join("f.txt"), "changed").unwrap();
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(
        std::fs::read_to_string(tree.wd().join("f.txt")).unwrap(),
        "kept somewhere that must exist"
    );
}
