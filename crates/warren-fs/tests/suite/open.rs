//! Opening a workspace root, and `stat`.

use std::os::unix::fs::symlink;

use warren_fs::{FsError, Kind, Owner, Resolver, WorkspaceRoot};

use super::support::Fixture;

#[test]
fn open_picks_openat2_exactly_when_the_kernel_offers_it() {
    let f = Fixture::new();
    let kernel_has_openat2 = rustix::fs::openat2(
        rustix::fs::CWD,
        &f.root,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS,
    )
    .is_ok();
    let want = if kernel_has_openat2 {
        Resolver::Openat2
    } else {
        Resolver::NoFollowWalk
    };
    assert_eq!(WorkspaceRoot::open(&f.root).unwrap().resolver(), want);
    // The probe is cached: a second root gets the same answer.
    assert_eq!(WorkspaceRoot::open(&f.outside).unwrap().resolver(), want);
}

#[test]
fn a_root_that_is_a_symlink_is_refused_without_naming_the_host_path() {
    let f = Fixture::new();
    let link = f.base.join("root-link");
    symlink(&f.root, &link).unwrap();
    let err = WorkspaceRoot::open(&link).unwrap_err();
    assert!(matches!(err, FsError::RootUnavailable { .. }), "{err:?}");
    assert!(!err.to_string().contains(f.base.to_string_lossy().as_ref()));
}

#[test]
fn a_root_that_is_a_file_or_missing_is_refused() {
    let f = Fixture::new();
    let file = f.outside.join("secret.txt");
    for path in [file, f.base.join("missing")] {
        for r in Resolver::ALL {
            let err = WorkspaceRoot::open_with(&path, r).unwrap_err();
            assert!(matches!(err, FsError::RootUnavailable { .. }), "{err:?}");
        }
    }
}

#[test]
fn default_owner_is_the_workspace_user_only_when_running_as_root() {
    let f = Fixture::new();
    let ws = WorkspaceRoot::open(&f.root).unwrap();
    let as_root = rustix::process::geteuid().is_root();
    assert_eq!(ws.owner(), as_root.then_some(Owner::WORKSPACE));
    assert_eq!(ws.with_owner(None).owner(), None);
}

fn stat_of_the_empty_path_and_dot_is_the_root(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    for path in ["", ".", "./", ".//."] {
        let entry = ws.stat(path).unwrap();
        assert_eq!(entry.path, "");
        assert_eq!(entry.kind, Kind::Dir);
    }
}

fn stat_reports_kind_size_mode_and_normalised_path(r: Resolver) {
    let f = Fixture::new();
    f.file("a/b.txt", "hello");
    let ws = f.ws(r);
    let entry = ws.stat("a//./b.txt").unwrap();
    assert_eq!(entry.path, "a/b.txt");
    assert_eq!(entry.kind, Kind::File);
    assert_eq!(entry.size, 5);
    assert_eq!(entry.symlink_target, None);
    let host = std::fs::metadata(f.path("a/b.txt")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(entry.mode, host.mode() & 0o7777);
    assert_eq!(entry.uid, host.uid());
    assert_eq!(entry.modified_unix_ms / 1000, host.mtime());
    assert_eq!(ws.stat("a").unwrap().kind, Kind::Dir);
}

fn stat_of_a_missing_path_is_not_found(r: Resolver) {
    let f = Fixture::new();
    let err = f.ws(r).stat("nope/x").unwrap_err();
    assert!(
        matches!(err, FsError::NotFound { ref path } if path == "nope/x"),
        "{err:?}"
    );
}

fn a_file_used_as_a_directory_is_not_a_directory(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "x");
    let err = f.ws(r).stat("f.txt/x").unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
}

fn a_symlink_as_last_component_is_refused_by_stat(r: Resolver) {
    let f = Fixture::new();
    f.file("real.txt", "x");
    f.symlink("alias.txt", "real.txt");
    let err = f.ws(r).stat("alias.txt").unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
}

fn read_only_workspaces_refuse_every_mutation(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "x");
    f.dir("d");
    let ws = f.ws(r).read_only();
    assert!(ws.is_read_only());
    let results = [
        ws.write("f.txt", b"y", Default::default()).err(),
        ws.append("f.txt", b"y", Default::default()).err(),
        ws.edit("f.txt", "x", "y", false, None).err(),
        ws.mkdir_p("new").err(),
        ws.rename("f.txt", "g.txt", false).err(),
        ws.remove("f.txt", false).err(),
        ws.remove("d", true).err(),
    ];
    for err in results {
        assert!(matches!(err, Some(FsError::ReadOnly { .. })), "{err:?}");
    }
    assert_eq!(f.read("f.txt"), "x");
    assert!(f.path("d").exists());
    // Reads still work.
    assert_eq!(
        ws.read("f.txt", Default::default(), 10).unwrap().bytes,
        b"x"
    );
}

for_both_resolvers!(
    stat_of_the_empty_path_and_dot_is_the_root,
    stat_reports_kind_size_mode_and_normalised_path,
    stat_of_a_missing_path_is_not_found,
    a_file_used_as_a_directory_is_not_a_directory,
    a_symlink_as_last_component_is_refused_by_stat,
    read_only_workspaces_refuse_every_mutation,
);

fn a_subroot_is_resolved_without_following_anything(r: Resolver) {
    let f = Fixture::new();
    f.dir("projects/a");
    f.file("projects/a/notes.txt", "inside");
    symlink(&f.outside, f.path("projects/link")).unwrap();
    symlink(&f.outside, f.path("top-link")).unwrap();
    let ws = f.ws(r);
    for (rel, want_symlink) in [
        ("projects/link", true),
        ("top-link/sub", true),
        ("../outside", false),
        ("/etc", false),
        ("projects/a/notes.txt", false),
    ] {
        let err = ws
            .subroot(rel)
            .err()
            .unwrap_or_else(|| panic!("{rel} was opened"));
        assert_eq!(
            matches!(err, FsError::SymlinkRefused { .. }),
            want_symlink,
            "{rel}: {err:?}"
        );
    }
    let sub = ws.subroot("projects/a").unwrap();
    assert_eq!(
        sub.read("notes.txt", warren_fs::ByteRange::FULL, 100)
            .unwrap()
            .bytes,
        b"inside"
    );
    assert!(sub
        .read("../a/notes.txt", warren_fs::ByteRange::FULL, 100)
        .is_err());
}

fn a_subroot_stays_on_its_directory_when_the_path_is_swapped_for_a_link(r: Resolver) {
    let f = Fixture::new();
    f.dir("projects/a");
    f.file("projects/a/notes.txt", "inside");
    let sub = f.ws(r).subroot("projects/a").unwrap();
    // The workdir is moved away and a link to the outside put in its place.
    std::fs::rename(f.path("projects/a"), f.path("projects/moved")).unwrap();
    symlink(&f.outside, f.path("projects/a")).unwrap();
    let listing = sub.list("", 1, 100).unwrap();
    let names: Vec<_> = listing.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(names, ["notes.txt"], "the subroot followed the swap");
    assert!(sub
        .read("secret.txt", warren_fs::ByteRange::FULL, 100)
        .is_err());
}

for_both_resolvers!(
    a_subroot_is_resolved_without_following_anything,
    a_subroot_stays_on_its_directory_when_the_path_is_swapped_for_a_link,
);
