//! Atomic writes, preconditions (I27), appends, `mkdir_p` and rename.

use std::os::unix::fs::PermissionsExt;

use warren_fs::{Etag, FsError, Kind, Resolver, WriteOptions};

use super::support::{host_names, Fixture};

fn if_match(etag: &Etag) -> WriteOptions {
    WriteOptions {
        if_match: Some(etag.clone()),
        ..Default::default()
    }
}

/// No `.warren-tmp-*` file may be left behind in `dir`.
fn assert_no_temp_files(f: &Fixture, dir: &str) {
    let names = host_names(&f.path(dir));
    assert!(
        names.iter().all(|n| !n.starts_with(".warren-tmp-")),
        "temp files left: {names:?}"
    );
}

fn write_creates_then_replaces_and_reports_etag_and_size(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let first = ws.write("a.txt", b"one", WriteOptions::default()).unwrap();
    assert!(first.created);
    assert_eq!(first.size, 3);
    assert_eq!(first.etag, Etag::of(b"one"));
    let second = ws.write("a.txt", b"two!", WriteOptions::default()).unwrap();
    assert!(!second.created);
    assert_eq!(second.etag, Etag::of(b"two!"));
    assert_eq!(f.read("a.txt"), "two!");
    assert_eq!(ws.etag("a.txt").unwrap(), second.etag);
    assert_no_temp_files(&f, "");
}

fn write_with_stale_if_match_fails_and_keeps_the_newer_content(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let v1 = ws
        .write("f.txt", b"v1", WriteOptions::default())
        .unwrap()
        .etag;
    let v2 = ws.write("f.txt", b"v2", if_match(&v1)).unwrap().etag;
    let err = ws.write("f.txt", b"stale", if_match(&v1)).unwrap_err();
    match err {
        FsError::PreconditionFailed { path, current } => {
            assert_eq!(path, "f.txt");
            assert_eq!(current, Some(v2));
        }
        other => panic!("expected PreconditionFailed, got {other:?}"),
    }
    assert_eq!(f.read("f.txt"), "v2");
    assert_no_temp_files(&f, "");
}

fn if_match_on_a_missing_file_fails_with_no_current_version(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let err = ws
        .write("f.txt", b"x", if_match(&Etag::of(b"x")))
        .unwrap_err();
    assert!(
        matches!(err, FsError::PreconditionFailed { current: None, .. }),
        "{err:?}"
    );
    assert!(!f.path("f.txt").exists());
}

fn if_none_match_any_only_creates(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let create_only = WriteOptions {
        if_none_match_any: true,
        ..Default::default()
    };
    assert!(
        ws.write("f.txt", b"first", create_only.clone())
            .unwrap()
            .created
    );
    let err = ws.write("f.txt", b"second", create_only).unwrap_err();
    assert!(
        matches!(err, FsError::PreconditionFailed { current: Some(ref e), .. } if *e == Etag::of(b"first")),
        "{err:?}"
    );
    assert_eq!(f.read("f.txt"), "first");
}

fn modes_are_kept_on_replace_defaulted_on_create_and_validated(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let mode_of = |rel: &str| std::fs::metadata(f.path(rel)).unwrap().permissions().mode() & 0o7777;
    ws.write("new.txt", b"x", WriteOptions::default()).unwrap();
    assert_eq!(mode_of("new.txt"), 0o644);
    ws.write(
        "script.sh",
        b"#!/bin/sh",
        WriteOptions {
            mode: Some(0o750),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(mode_of("script.sh"), 0o750);
    ws.write("script.sh", b"#!/bin/sh\necho", WriteOptions::default())
        .unwrap();
    assert_eq!(mode_of("script.sh"), 0o750, "replacing keeps the mode");
    let err = ws
        .write(
            "x",
            b"x",
            WriteOptions {
                mode: Some(0o4755),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, FsError::InvalidMode { mode: 0o4755, .. }),
        "{err:?}"
    );
}

fn missing_parents_are_created_only_when_asked(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let err = ws
        .write("a/b/c.txt", b"x", WriteOptions::default())
        .unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
    let opts = WriteOptions {
        create_parents: true,
        ..Default::default()
    };
    assert!(ws.write("a/b/c.txt", b"x", opts).unwrap().created);
    assert_eq!(f.read("a/b/c.txt"), "x");
    assert_eq!(ws.stat("a/b").unwrap().kind, Kind::Dir);
}

fn writing_to_a_directory_or_the_root_is_refused(r: Resolver) {
    let f = Fixture::new();
    f.dir("d");
    let ws = f.ws(r);
    for path in ["d", "", "."] {
        let err = ws.write(path, b"x", WriteOptions::default()).unwrap_err();
        assert!(
            matches!(err, FsError::IsADirectory { .. }),
            "{path:?}: {err:?}"
        );
        let err = ws.append(path, b"x", WriteOptions::default()).unwrap_err();
        assert!(
            matches!(err, FsError::IsADirectory { .. }),
            "{path:?}: {err:?}"
        );
    }
    assert_no_temp_files(&f, "");
}

fn writing_through_a_file_as_parent_is_not_a_directory(r: Resolver) {
    let f = Fixture::new();
    f.file("f", "x");
    let ws = f.ws(r);
    let err = ws.write("f/g", b"x", WriteOptions::default()).unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
    let opts = WriteOptions {
        create_parents: true,
        ..Default::default()
    };
    let err = ws.write("f/g", b"x", opts).unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
}

fn append_creates_then_appends_and_returns_the_whole_file_etag(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    let first = ws
        .append("log.txt", b"a\n", WriteOptions::default())
        .unwrap();
    assert!(first.created);
    assert_eq!(first.etag, Etag::of(b"a\n"));
    let second = ws.append("log.txt", b"b\n", if_match(&first.etag)).unwrap();
    assert!(!second.created);
    assert_eq!(second.size, 4);
    assert_eq!(second.etag, Etag::of(b"a\nb\n"));
    let err = ws
        .append("log.txt", b"c\n", if_match(&first.etag))
        .unwrap_err();
    assert!(matches!(err, FsError::PreconditionFailed { .. }), "{err:?}");
    let err = ws
        .append("other.txt", b"c\n", if_match(&first.etag))
        .unwrap_err();
    assert!(
        matches!(err, FsError::PreconditionFailed { current: None, .. }),
        "{err:?}"
    );
    assert!(!f.path("other.txt").exists());
    assert_eq!(f.read("log.txt"), "a\nb\n");
}

fn mkdir_p_creates_missing_components_and_reports_whether_it_did(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    assert!(ws.mkdir_p("a/b/c").unwrap());
    assert!(!ws.mkdir_p("a/b/c").unwrap());
    assert!(!ws.mkdir_p("").unwrap());
    assert!(ws.mkdir_p("a/b/d").unwrap());
    let mode = std::fs::metadata(f.path("a/b/d"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o755);
}

fn mkdir_p_refuses_files_and_symlinks_on_the_way(r: Resolver) {
    let f = Fixture::new();
    f.file("file", "x");
    f.dir("real");
    f.symlink("link", "real");
    let ws = f.ws(r);
    let err = ws.mkdir_p("file/sub").unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
    let err = ws.mkdir_p("file").unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
    let err = ws.mkdir_p("link/sub").unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
    let err = ws.mkdir_p("link").unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
    assert!(!f.path("real/sub").exists());
}

fn rename_refuses_to_replace_unless_overwrite(r: Resolver) {
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.file("b.txt", "b");
    let ws = f.ws(r);
    let err = ws.rename("a.txt", "b.txt", false).unwrap_err();
    assert!(
        matches!(err, FsError::AlreadyExists { ref path } if path == "b.txt"),
        "{err:?}"
    );
    assert_eq!(f.read("b.txt"), "b");
    ws.rename("a.txt", "b.txt", true).unwrap();
    assert_eq!(f.read("b.txt"), "a");
    assert!(!f.path("a.txt").exists());
}

fn rename_moves_between_directories_and_reports_missing_sources(r: Resolver) {
    let f = Fixture::new();
    f.file("a/x.txt", "x");
    f.dir("b");
    let ws = f.ws(r);
    ws.rename("a/x.txt", "b/y.txt", false).unwrap();
    assert_eq!(f.read("b/y.txt"), "x");
    let err = ws.rename("a/x.txt", "b/z.txt", false).unwrap_err();
    assert!(
        matches!(err, FsError::NotFound { ref path } if path == "a/x.txt"),
        "{err:?}"
    );
    let err = ws.rename("b/y.txt", "missing/z.txt", false).unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
}

fn rename_moves_a_symlink_as_a_link(r: Resolver) {
    let f = Fixture::new();
    f.symlink("link", &f.outside);
    let ws = f.ws(r);
    ws.rename("link", "moved", false).unwrap();
    let target = std::fs::read_link(f.path("moved")).unwrap();
    assert_eq!(target, f.outside);
    assert!(f.outside.join("secret.txt").exists());
}

fn the_root_cannot_be_renamed_or_replaced(r: Resolver) {
    let f = Fixture::new();
    f.file("a", "x");
    let ws = f.ws(r);
    let err = ws.rename("", "x", false).unwrap_err();
    assert!(
        matches!(err, FsError::RootRefused { action: "rename" }),
        "{err:?}"
    );
    let err = ws.rename("a", ".", true).unwrap_err();
    assert!(matches!(err, FsError::RootRefused { .. }), "{err:?}");
}

for_both_resolvers!(
    write_creates_then_replaces_and_reports_etag_and_size,
    write_with_stale_if_match_fails_and_keeps_the_newer_content,
    if_match_on_a_missing_file_fails_with_no_current_version,
    if_none_match_any_only_creates,
    modes_are_kept_on_replace_defaulted_on_create_and_validated,
    missing_parents_are_created_only_when_asked,
    writing_to_a_directory_or_the_root_is_refused,
    writing_through_a_file_as_parent_is_not_a_directory,
    append_creates_then_appends_and_returns_the_whole_file_etag,
    mkdir_p_creates_missing_components_and_reports_whether_it_did,
    mkdir_p_refuses_files_and_symlinks_on_the_way,
    rename_refuses_to_replace_unless_overwrite,
    rename_moves_between_directories_and_reports_missing_sources,
    rename_moves_a_symlink_as_a_link,
    the_root_cannot_be_renamed_or_replaced,
);
