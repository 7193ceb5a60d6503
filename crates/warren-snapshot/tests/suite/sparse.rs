//! Sparse and huge files: holes are recorded and recreated, never read or written as zeros;
//! a tree over the data limit fails before it is read; a cancelled or overdue snapshot
//! stops; manifests of version 1 (no holes) still restore.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

use warren_snapshot::{
    restore, snapshot, snapshot_with, CancelFlag, Manifest, ObjectStore, SnapshotError,
    SnapshotLimits,
};

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

use super::{put_legacy_chunk, put_manifest, Tree};

/// Bytes that do not repeat (so no chunk deduplicates against another).
fn noise(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Writes `size` bytes as holes except the listed `(offset, bytes)` pieces.
fn make_sparse(path: &Path, size: u64, pieces: &[(u64, Vec<u8>)]) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
    for (offset, bytes) in pieces {
        file.write_all_at(bytes, *offset).unwrap();
    }
}

/// Bytes the file occupies on disk.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// Restores the snapshot over the workdir after removing it, so the file is new.
fn restore_fresh(tree: &Tree, id: &str) {
    std::fs::remove_dir_all(tree.wd()).unwrap();
    restore(&tree.ws(), "projects/a", &tree.store(), id).unwrap();
}

#[test]
fn a_huge_sparse_file_round_trips_as_sparse_without_reading_its_holes() {
    let tree = Tree::new();
    let path = tree.wd().join("sparse");
    let head = noise(300_000, 1);
    let middle = noise(200_000, 2);
    // 8 TiB: within what ext4 and tmpfs allow one file to be; a dense read would take hours.
    let size = 8 * 1024 * GIB;
    make_sparse(&path, size, &[(0, head.clone()), (5 * GIB, middle.clone())]);
    let store = tree.store();
    let started = Instant::now();
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the snapshot read holes: {:?}",
        started.elapsed()
    );
    assert!(
        stats.bytes_read < 2 * MIB,
        "read {} bytes",
        stats.bytes_read
    );
    let manifest = Manifest::load(&store, &id).unwrap();
    let entry = manifest
        .entries
        .iter()
        .find(|e| e.path == "sparse")
        .unwrap();
    assert_eq!(entry.size, size);
    assert!(!entry.holes.is_empty(), "no holes recorded: {entry:?}");

    restore_fresh(&tree, &id);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), size);
    assert!(
        allocated(&path) < 4 * MIB,
        "restored dense: {} bytes allocated",
        allocated(&path)
    );
    let file = std::fs::File::open(&path).unwrap();
    let mut back = vec![0u8; head.len()];
    file.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, head);
    let mut back = vec![0u8; middle.len()];
    file.read_exact_at(&mut back, 5 * GIB).unwrap();
    assert_eq!(back, middle);
    let mut zeros = vec![1u8; 4096];
    file.read_exact_at(&mut zeros, 3 * GIB).unwrap();
    assert!(zeros.iter().all(|&b| b == 0), "a hole came back with data");
}

#[test]
fn every_layout_of_data_and_holes_comes_back_byte_for_byte() {
    // (name, size, data pieces, whether a hole must be recorded)
    type Layout = (&'static str, u64, Vec<(u64, Vec<u8>)>, bool);
    let layouts: Vec<Layout> = vec![
        (
            "dense",
            3 * MIB,
            vec![(0, noise(3 * MIB as usize, 3))],
            false,
        ),
        ("only-a-hole", 64 * MIB, vec![], true),
        (
            "leading-hole",
            40 * MIB,
            vec![(32 * MIB, noise(500_000, 4))],
            true,
        ),
        (
            "trailing-hole",
            40 * MIB,
            vec![(0, noise(500_000, 5))],
            true,
        ),
        (
            "data-hole-data",
            50 * MIB,
            vec![(0, noise(100_000, 6)), (45 * MIB, noise(700_000, 7))],
            true,
        ),
        (
            // Holes shorter than 64 KiB are read as zeros, not recorded.
            "small-holes",
            60 * 1024,
            vec![
                (0, noise(4096, 8)),
                (16 * 1024, noise(4096, 9)),
                (40 * 1024, noise(4096, 10)),
            ],
            false,
        ),
        ("empty", 0, vec![], false),
    ];
    let tree = Tree::new();
    for (name, size, pieces, _) in &layouts {
        make_sparse(&tree.wd().join(name), *size, pieces);
    }
    let wanted: Vec<Vec<u8>> = layouts
        .iter()
        .map(|(name, ..)| std::fs::read(tree.wd().join(name)).unwrap())
        .collect();
    let store = tree.store();
    let (id, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    let manifest = Manifest::load(&store, &id).unwrap();
    for (name, _, _, holey) in &layouts {
        let entry = manifest.entries.iter().find(|e| e.path == *name).unwrap();
        assert_eq!(!entry.holes.is_empty(), *holey, "{name}: {:?}", entry.holes);
    }
    restore_fresh(&tree, &id);
    for ((name, size, _, holey), want) in layouts.iter().zip(&wanted) {
        let path = tree.wd().join(name);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), *size, "{name}");
        assert!(
            std::fs::read(&path).unwrap() == *want,
            "{name}: other bytes"
        );
        if *holey {
            assert!(
                allocated(&path) < 2 * MIB,
                "{name}: restored dense ({} bytes allocated)",
                allocated(&path)
            );
        }
    }
}

#[test]
fn a_tree_with_more_data_than_the_limit_fails_before_anything_is_recorded() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("small"), noise(100_000, 11)).unwrap();
    std::fs::write(tree.wd().join("big"), noise(3 * MIB as usize, 12)).unwrap();
    let store = tree.store();
    let limits = SnapshotLimits {
        max_bytes: 2 * MIB,
        ..SnapshotLimits::default()
    };
    let error = snapshot_with(&tree.ws(), "projects/a", &store, None, &limits).unwrap_err();
    match &error {
        SnapshotError::TooLarge { path, limit } => {
            assert_eq!(path, "big");
            assert_eq!(*limit, 2 * MIB);
        }
        other => panic!("not TooLarge: {other:?}"),
    }
    assert!(error.to_string().contains("max_bytes"), "{error}");
    assert!(store.list("manifests/").unwrap().is_empty());
    let stored: u64 = store
        .list("packs/")
        .unwrap()
        .iter()
        .map(|key| store.get(key).unwrap().unwrap().len() as u64)
        .sum();
    assert!(
        stored < 200_000,
        "the big file was read: {stored} bytes stored"
    );
    // A file far larger than the limit, all holes but a little data, fits: holes are not
    // data.
    std::fs::remove_file(tree.wd().join("big")).unwrap();
    make_sparse(
        &tree.wd().join("sparse"),
        100 * GIB,
        &[(GIB, noise(10_000, 13))],
    );
    snapshot_with(&tree.ws(), "projects/a", &store, None, &limits).unwrap();
}

#[test]
fn a_cancelled_or_overdue_snapshot_stops_without_a_manifest() {
    let tree = Tree::new();
    std::fs::write(tree.wd().join("f"), noise(MIB as usize, 14)).unwrap();
    let store = tree.store();
    let cancel = CancelFlag::new();
    cancel.cancel();
    let cancelled = SnapshotLimits {
        cancel: Some(cancel),
        ..SnapshotLimits::default()
    };
    let overdue = SnapshotLimits {
        deadline: Some(Instant::now()),
        ..SnapshotLimits::default()
    };
    for limits in [cancelled, overdue] {
        let error = snapshot_with(&tree.ws(), "projects/a", &store, None, &limits).unwrap_err();
        assert!(
            matches!(error, SnapshotError::Cancelled { .. }),
            "{error:?}"
        );
    }
    assert!(store.list("manifests/").unwrap().is_empty());
}

#[test]
fn a_manifest_of_version_1_without_holes_still_restores() {
    let tree = Tree::new();
    let store = tree.store();
    let content = noise(10_000, 15);
    let hash = put_legacy_chunk(&store, &content);
    let manifest = serde_json::json!({
        "version": 1,
        "created_unix_ms": 1_700_000_000_000i64,
        "entries": [
            {"path": "", "kind": "dir", "mode": 0o755, "uid": 0, "gid": 0,
             "modified_unix_ms": 1_700_000_000_000i64, "size": 4096},
            {"path": "old.bin", "kind": "file", "mode": 0o644, "uid": 0, "gid": 0,
             "modified_unix_ms": 1_700_000_000_000i64, "size": 10_000,
             "chunks": [{"hash": hash, "len": 10_000}]}
        ]
    });
    let id = put_manifest(&store, &serde_json::to_vec(&manifest).unwrap());
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(std::fs::read(tree.wd().join("old.bin")).unwrap(), content);
}
