//! Removal: files, links as themselves, directories, recursion that never follows a link.

use warren_fs::{FsError, Resolver};

use super::support::{Fixture, SECRET};

fn remove_deletes_files_and_empty_directories(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "x");
    f.dir("empty");
    let ws = f.ws(r);
    ws.remove("f.txt", false).unwrap();
    ws.remove("empty", false).unwrap();
    assert!(!f.path("f.txt").exists());
    assert!(!f.path("empty").exists());
    let err = ws.remove("f.txt", false).unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
}

fn a_non_empty_directory_needs_recursive(r: Resolver) {
    let f = Fixture::new();
    f.file("d/f.txt", "x");
    let ws = f.ws(r);
    let err = ws.remove("d", false).unwrap_err();
    assert!(
        matches!(err, FsError::DirectoryNotEmpty { ref path } if path == "d"),
        "{err:?}"
    );
    assert!(f.path("d/f.txt").exists());
    ws.remove("d", true).unwrap();
    assert!(!f.path("d").exists());
}

fn recursive_removal_unlinks_symlinks_and_never_follows_them(r: Resolver) {
    let f = Fixture::new();
    f.file("tree/a/b/c.txt", "c");
    f.file("tree/keep-target.txt", "t");
    f.symlink("tree/out-dir", &f.outside);
    f.symlink("tree/a/out-rel", "../../../outside");
    f.symlink("tree/a/b/secret-file", f.outside.join("secret.txt"));
    f.symlink("tree/other", &f.other);
    f.file("sibling.txt", "stays");
    let before = f.snapshot_outside();
    f.ws(r).remove("tree", true).unwrap();
    assert!(!f.path("tree").exists());
    assert_eq!(
        f.snapshot_outside(),
        before,
        "outside must survive untouched"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        SECRET
    );
    assert_eq!(f.read("sibling.txt"), "stays");
}

fn removing_a_symlink_removes_only_the_link(r: Resolver) {
    let f = Fixture::new();
    f.symlink("out", &f.outside);
    f.ws(r).remove("out", true).unwrap();
    assert!(std::fs::symlink_metadata(f.path("out")).is_err());
    assert!(f.outside.join("secret.txt").exists());
}

fn the_root_itself_is_never_removed(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "x");
    let ws = f.ws(r);
    for path in ["", ".", "./"] {
        let err = ws.remove(path, true).unwrap_err();
        assert!(
            matches!(err, FsError::RootRefused { action: "remove" }),
            "{err:?}"
        );
    }
    assert!(f.path("f.txt").exists());
}

fn removal_through_a_symlinked_parent_is_refused(r: Resolver) {
    let f = Fixture::new();
    f.symlink("link", &f.outside);
    let err = f.ws(r).remove("link/secret.txt", false).unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
    assert!(f.outside.join("secret.txt").exists());
}

for_both_resolvers!(
    remove_deletes_files_and_empty_directories,
    a_non_empty_directory_needs_recursive,
    recursive_removal_unlinks_symlinks_and_never_follows_them,
    removing_a_symlink_removes_only_the_link,
    the_root_itself_is_never_removed,
    removal_through_a_symlinked_parent_is_refused,
);
