//! The tree primitives checkpoints and snapshots use: every one refuses to act through a
//! link and never changes anything outside the workspace.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use warren_fs::{FsError, Resolver};

use super::support::{Fixture, SECRET};

fn created_files_symlinks_and_hardlinks_are_made_as_themselves(r: Resolver) {
    let f = Fixture::new();
    f.dir("d");
    let ws = f.ws(r);
    let mut file = ws.create_file("d/new.txt", 0o640).unwrap();
    file.write_all(b"streamed").unwrap();
    drop(file);
    assert_eq!(f.read("d/new.txt"), "streamed");
    assert_eq!(
        std::fs::metadata(f.path("d/new.txt")).unwrap().mode() & 0o777,
        0o640
    );
    ws.create_symlink("d/link", "/etc/passwd").unwrap();
    assert_eq!(
        std::fs::read_link(f.path("d/link")).unwrap().to_str(),
        Some("/etc/passwd")
    );
    ws.create_hardlink("d/new.txt", "d/hard.txt").unwrap();
    assert_eq!(std::fs::metadata(f.path("d/new.txt")).unwrap().nlink(), 2);
    // An existing name is never replaced.
    assert!(matches!(
        ws.create_file("d/new.txt", 0o600),
        Err(FsError::AlreadyExists { .. })
    ));
    assert!(ws.create_symlink("d/link", "x").is_err());
}

fn nothing_is_created_through_a_linked_parent(r: Resolver) {
    let f = Fixture::new();
    f.symlink("out", &f.outside);
    let before = f.snapshot_outside();
    let ws = f.ws(r);
    assert!(matches!(
        ws.create_file("out/x", 0o600),
        Err(FsError::SymlinkRefused { .. })
    ));
    assert!(matches!(
        ws.create_symlink("out/y", "z"),
        Err(FsError::SymlinkRefused { .. })
    ));
    assert!(ws.create_hardlink("out/secret.txt", "stolen").is_err());
    assert_eq!(f.snapshot_outside(), before);
    assert!(!f.path("stolen").exists());
}

fn a_hardlink_to_a_link_or_through_one_is_refused(r: Resolver) {
    let f = Fixture::new();
    f.symlink("to-secret", f.outside.join("secret.txt"));
    let ws = f.ws(r);
    let error = ws.create_hardlink("to-secret", "copy").unwrap_err();
    assert!(matches!(error, FsError::NotAFile { .. }), "{error:?}");
    assert!(!f.path("copy").exists());
}

fn attributes_are_set_on_a_link_itself_never_its_target(r: Resolver) {
    let f = Fixture::new();
    f.symlink("to-secret", f.outside.join("secret.txt"));
    let secret = f.outside.join("secret.txt");
    let mode_before = std::fs::metadata(&secret).unwrap().mode();
    let mtime_before = std::fs::metadata(&secret).unwrap().mtime();
    let ws = f.ws(r);
    // A mode cannot be given to a link (it has none): refused, not applied to the target.
    assert!(matches!(
        ws.set_attributes("to-secret", Some(0o777), 1_000),
        Err(FsError::SymlinkRefused { .. })
    ));
    ws.set_attributes("to-secret", None, 1_000).unwrap();
    assert_eq!(std::fs::metadata(&secret).unwrap().mode(), mode_before);
    assert_eq!(std::fs::metadata(&secret).unwrap().mtime(), mtime_before);
    assert_eq!(
        std::fs::symlink_metadata(f.path("to-secret"))
            .unwrap()
            .mtime(),
        1
    );
    f.file("plain.txt", "p");
    ws.set_attributes("plain.txt", Some(0o600), 2_000).unwrap();
    let meta = std::fs::metadata(f.path("plain.txt")).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o777, meta.mtime()),
        (0o600, 2)
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), SECRET);
}

fn an_exchange_swaps_two_trees_beneath_the_root_only(r: Resolver) {
    let f = Fixture::new();
    f.file("a/one.txt", "1");
    f.file("b/two.txt", "2");
    f.symlink("out", &f.outside);
    let ws = f.ws(r);
    ws.exchange("a", "b").unwrap();
    assert_eq!(f.read("a/two.txt"), "2");
    assert_eq!(f.read("b/one.txt"), "1");
    let before = f.snapshot_outside();
    assert!(matches!(
        ws.exchange("a", "out/x"),
        Err(FsError::SymlinkRefused { .. })
    ));
    assert!(ws.exchange("a", "../outside").is_err());
    assert_eq!(f.snapshot_outside(), before);
}

fn a_streamed_read_refuses_links_and_directories(r: Resolver) {
    let f = Fixture::new();
    f.symlink("to-secret", f.outside.join("secret.txt"));
    f.dir("d");
    let ws = f.ws(r);
    assert!(matches!(
        ws.open_file("to-secret"),
        Err(FsError::SymlinkRefused { .. })
    ));
    assert!(matches!(
        ws.open_file("d"),
        Err(FsError::IsADirectory { .. })
    ));
}

fn a_tree_copy_takes_links_as_links_and_overwrites_nothing(r: Resolver) {
    let f = Fixture::new();
    f.file("src/a.txt", "a");
    f.file("src/deep/b.txt", "b");
    f.symlink("src/out", &f.outside);
    f.dir("dst");
    let ws = f.ws(r);
    let source = ws.subroot("src").unwrap();
    let stats = ws.copy_tree_from(&source, "", "dst/copy").unwrap();
    assert_eq!((stats.files, stats.symlinks), (2, 1));
    assert_eq!(f.read("dst/copy/deep/b.txt"), "b");
    assert!(std::fs::symlink_metadata(f.path("dst/copy/out"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        std::fs::read_link(f.path("dst/copy/out")).unwrap(),
        f.outside
    );
    // Copying again onto the same place fails on the first existing file, changing nothing.
    std::fs::write(f.path("dst/copy/a.txt"), "mine").unwrap();
    assert!(ws.copy_tree_from(&source, "", "dst/copy").is_err());
    assert_eq!(f.read("dst/copy/a.txt"), "mine");
    // A destination reached through a link is refused.
    f.symlink("dst/link", &f.outside);
    let before = f.snapshot_outside();
    assert!(ws.copy_tree_from(&source, "", "dst/link/x").is_err());
    assert_eq!(f.snapshot_outside(), before);
}

for_both_resolvers!(
    a_tree_copy_takes_links_as_links_and_overwrites_nothing,
    created_files_symlinks_and_hardlinks_are_made_as_themselves,
    nothing_is_created_through_a_linked_parent,
    a_hardlink_to_a_link_or_through_one_is_refused,
    attributes_are_set_on_a_link_itself_never_its_target,
    an_exchange_swaps_two_trees_beneath_the_root_only,
    a_streamed_read_refuses_links_and_directories,
);
