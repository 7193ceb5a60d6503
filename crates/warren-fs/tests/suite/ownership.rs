//! Ownership of created files and directories (I11): 1000:1000 when the server runs as root.

use std::os::unix::fs::MetadataExt;

use warren_fs::{Owner, Resolver, WriteOptions};

use super::support::Fixture;

fn owner_of(f: &Fixture, rel: &str) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(f.path(rel)).unwrap();
    (meta.uid(), meta.gid())
}

/// These tests change file ownership, which needs root; the suite runs as root (CI does), and
/// a run without it fails here rather than skipping silently.
fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: it checks that files are chowned to 1000:1000 (I11)"
    );
}

fn files_and_directories_created_as_root_belong_to_the_workspace_user(r: Resolver) {
    require_root();
    let f = Fixture::new();
    let ws = f.ws(r);
    let parents = WriteOptions {
        create_parents: true,
        ..Default::default()
    };
    ws.write("a/b/file.txt", b"x", parents.clone()).unwrap();
    ws.append("a/log.txt", b"x", WriteOptions::default())
        .unwrap();
    ws.mkdir_p("m/n").unwrap();
    for rel in ["a", "a/b", "a/b/file.txt", "a/log.txt", "m", "m/n"] {
        assert_eq!(owner_of(&f, rel), (1000, 1000), "{rel}");
    }
    // Replacing a file the host created keeps it in the workspace user's hands too.
    f.file("host.txt", "x");
    assert_eq!(owner_of(&f, "host.txt"), (0, 0));
    ws.write("host.txt", b"y", WriteOptions::default()).unwrap();
    assert_eq!(owner_of(&f, "host.txt"), (1000, 1000));
    ws.edit("host.txt", "y", "z", false, None).unwrap();
    assert_eq!(owner_of(&f, "host.txt"), (1000, 1000));
}

fn the_owner_policy_can_be_changed_or_disabled(r: Resolver) {
    require_root();
    let f = Fixture::new();
    let custom = f.ws(r).with_owner(Some(Owner {
        uid: 2000,
        gid: 3000,
    }));
    custom
        .write("custom.txt", b"x", WriteOptions::default())
        .unwrap();
    assert_eq!(owner_of(&f, "custom.txt"), (2000, 3000));
    let none = f.ws(r).with_owner(None);
    none.write("plain.txt", b"x", WriteOptions::default())
        .unwrap();
    none.mkdir_p("plain-dir").unwrap();
    assert_eq!(owner_of(&f, "plain.txt"), (0, 0));
    assert_eq!(owner_of(&f, "plain-dir"), (0, 0));
}

for_both_resolvers!(
    files_and_directories_created_as_root_belong_to_the_workspace_user,
    the_owner_policy_can_be_changed_or_disabled,
);
