//! File names and symlink targets that are not UTF-8: snapshotted, diffed, reused from a
//! parent and restored as their exact bytes; manifests of version 2 (before such names
//! could be kept) still restore.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

use warren_snapshot::{diff, restore, snapshot, Manifest};

use super::{describe, put_legacy_chunk, put_manifest, Tree};

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

/// A tree whose names are not UTF-8 in every place one can be.
fn plant(wd: &Path) {
    std::fs::write(wd.join(os(b"caf\xe9")), "latin-1 name").unwrap();
    std::fs::create_dir(wd.join(os(b"d\xff\xfe"))).unwrap();
    std::fs::write(wd.join(os(b"d\xff\xfe/inner.txt")), "inside").unwrap();
    std::fs::create_dir(wd.join(os(b"d\xff\xfe/sub\xe9"))).unwrap();
    std::fs::write(wd.join(os(b"d\xff\xfe/sub\xe9/deep\xe9")), "deeper").unwrap();
    symlink(os(b"caf\xe9"), wd.join("link-to-cafe")).unwrap();
    symlink(os(b"/nowhere/\xff\xfe"), wd.join(os(b"l\xe9"))).unwrap();
    std::fs::write(wd.join(os(b"h\xe9-first")), "one inode").unwrap();
    std::fs::hard_link(
        wd.join(os(b"h\xe9-first")),
        wd.join(os(b"d\xff\xfe/h\xe9-second")),
    )
    .unwrap();
    // Two names a lossy conversion would make one.
    std::fs::write(wd.join(os(b"x\xfe")), "fe").unwrap();
    std::fs::write(wd.join(os(b"x\xff")), "ff").unwrap();
}

#[test]
fn names_that_are_not_utf8_are_restored_byte_for_byte() {
    let tree = Tree::new();
    plant(&tree.wd());
    let before = describe(&tree.wd());
    let store = tree.store();
    let (id, stats) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    assert_eq!(
        (stats.files, stats.dirs, stats.symlinks),
        (6, 3, 2),
        "{stats:?}"
    );
    let manifest = Manifest::load(&store, &id).unwrap();
    assert_eq!(manifest.version, 3);
    // Listed in byte order, `d\xff\xfe/...` comes before `h\xe9-first`: that is the link.
    let later = manifest
        .entries
        .iter()
        .find(|e| e.path == os(b"h\xe9-first"))
        .expect("the link is recorded by its bytes");
    assert_eq!(
        later.link_to.as_deref(),
        Some(os(b"d\xff\xfe/h\xe9-second"))
    );

    // Remove everything, then restore.
    for entry in std::fs::read_dir(tree.wd()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    assert_eq!(describe(&tree.wd()), before);
    assert_eq!(
        std::fs::metadata(tree.wd().join(os(b"d\xff\xfe/h\xe9-second")))
            .unwrap()
            .ino(),
        std::fs::metadata(tree.wd().join(os(b"h\xe9-first")))
            .unwrap()
            .ino(),
        "the hard link came back as one"
    );
}

#[test]
fn a_diff_and_a_parent_snapshot_tell_names_apart_by_their_bytes() {
    let tree = Tree::new();
    plant(&tree.wd());
    let store = tree.store();
    let (first, _) = snapshot(&tree.ws(), "projects/a", &store, None).unwrap();
    std::fs::write(tree.wd().join(os(b"x\xff")), "changed").unwrap();
    std::fs::remove_file(tree.wd().join(os(b"caf\xe9"))).unwrap();
    std::fs::write(tree.wd().join(os(b"new\xe9")), "added").unwrap();
    let found = diff(&tree.ws(), "projects/a", &store, &first).unwrap();
    // Shown lossily, as the API does; `x\xfe` is unchanged and not reported.
    assert_eq!(found.added, ["new\u{FFFD}"]);
    assert_eq!(found.removed, ["caf\u{FFFD}"]);
    assert_eq!(found.changed, ["x\u{FFFD}"]);

    // With the first as parent, every file but the changed and the new one is reused
    // unread: the one whose lossy name it shares included.
    let (second, stats) = snapshot(&tree.ws(), "projects/a", &store, Some(&first)).unwrap();
    assert_eq!(stats.files, 6);
    assert_eq!(stats.files_unchanged, 4, "{stats:?}");
    assert!(diff(&tree.ws(), "projects/a", &store, &second)
        .unwrap()
        .changed
        .is_empty());
}

/// A manifest exactly as version 2 wrote it (committed text: the format must not drift).
const VERSION_2: &str = r#"{"version":2,"created_unix_ms":1700000000000,"entries":[
{"path":"","kind":"dir","mode":493,"uid":0,"gid":0,"modified_unix_ms":1700000000000,"inode":1,"changed_unix_ns":1,"size":4096},
{"path":"dir","kind":"dir","mode":448,"uid":0,"gid":0,"modified_unix_ms":1700000000000,"inode":2,"changed_unix_ns":1,"size":4096},
{"path":"dir/sparse.bin","kind":"file","mode":384,"uid":0,"gid":0,"modified_unix_ms":1700000001000,"inode":3,"changed_unix_ns":1,"size":200006,"chunks":[{"hash":"HASH","len":6}],"holes":[{"offset":0,"len":100000},{"offset":100006,"len":100000}]},
{"path":"dir/hard.bin","kind":"file","mode":384,"uid":0,"gid":0,"modified_unix_ms":1700000001000,"inode":3,"changed_unix_ns":1,"size":200006,"link_to":"dir/sparse.bin"},
{"path":"link","kind":"symlink","mode":511,"uid":0,"gid":0,"modified_unix_ms":1700000002000,"inode":4,"changed_unix_ns":1,"size":14,"target":"dir/sparse.bin"}
]}"#;

#[test]
fn a_manifest_of_version_2_still_restores() {
    let tree = Tree::new();
    let store = tree.store();
    let content = b"middle";
    let hash = put_legacy_chunk(&store, content);
    let id = put_manifest(&store, VERSION_2.replace("HASH", &hash).as_bytes());

    let manifest = Manifest::load(&store, &id).unwrap();
    assert_eq!(manifest.version, 2);
    assert_eq!(
        manifest.entries[3].link_to,
        Some(OsString::from("dir/sparse.bin"))
    );
    restore(&tree.ws(), "projects/a", &store, &id).unwrap();
    let wd = tree.wd();
    let mut expected = vec![0u8; 200_006];
    expected[100_000..100_006].copy_from_slice(content);
    assert_eq!(std::fs::read(wd.join("dir/sparse.bin")).unwrap(), expected);
    let meta = std::fs::metadata(wd.join("dir/sparse.bin")).unwrap();
    assert_eq!(
        (meta.nlink(), meta.mode() & 0o777, meta.mtime()),
        (2, 0o600, 1_700_000_001)
    );
    assert_eq!(
        std::fs::read_link(wd.join("link"))
            .unwrap()
            .into_os_string(),
        OsString::from_vec(b"dir/sparse.bin".to_vec())
    );
    // A snapshot on top of it, with the old one as parent, is a version 3 manifest.
    let (next, _) = snapshot(&tree.ws(), "projects/a", &store, Some(&id)).unwrap();
    assert_eq!(Manifest::load(&store, &next).unwrap().version, 3);
}
