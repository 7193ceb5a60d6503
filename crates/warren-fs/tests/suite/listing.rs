//! Listings and globs: depth, order, limits, and symlinks shown but never entered.

use warren_fs::{FsError, Kind, Resolver};

use super::support::Fixture;

fn paths(listing: &warren_fs::Listing) -> Vec<&str> {
    listing.entries.iter().map(|e| e.path.as_str()).collect()
}

fn tree(f: &Fixture) {
    f.file("b.txt", "b");
    f.file("a/x.rs", "x");
    f.file("a/deep/y.rs", "y");
    f.file("a-z/z.rs", "z");
    f.file("src/lib.rs", "lib");
    f.symlink("a/out", &f.outside);
}

fn list_depth_one_gives_direct_children_sorted(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let listing = f.ws(r).list("", 1, 100).unwrap();
    assert_eq!(paths(&listing), ["a", "a-z", "b.txt", "src"]);
    assert!(!listing.truncated);
    assert_eq!(listing.entries[2].kind, Kind::File);
    assert_eq!(listing.entries[2].size, 1);
}

fn list_descends_to_the_requested_depth_component_by_component(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let listing = ws.list("", 2, 100).unwrap();
    assert_eq!(
        paths(&listing),
        [
            "a",
            "a/deep",
            "a/out",
            "a/x.rs",
            "a-z",
            "a-z/z.rs",
            "b.txt",
            "src",
            "src/lib.rs"
        ]
    );
    let listing = ws.list("a", 5, 100).unwrap();
    assert_eq!(
        paths(&listing),
        ["a/deep", "a/deep/y.rs", "a/out", "a/x.rs"]
    );
    assert_eq!(ws.list("", 0, 100).unwrap(), ws.list("", 1, 100).unwrap());
}

fn symlinks_are_listed_with_their_target_but_never_entered(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let listing = f.ws(r).list("a", 10, 100).unwrap();
    let link = listing.entries.iter().find(|e| e.path == "a/out").unwrap();
    assert_eq!(link.kind, Kind::Symlink);
    assert_eq!(
        link.symlink_target.as_deref(),
        Some(f.outside.to_str().unwrap())
    );
    assert!(listing.entries.iter().all(|e| !e.path.contains("secret")));
}

fn list_stops_at_the_limit_and_says_so(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let listing = ws.list("", 3, 3).unwrap();
    assert_eq!(paths(&listing), ["a", "a/deep", "a/deep/y.rs"]);
    assert!(listing.truncated);
    let listing = ws.list("src", 1, 1).unwrap();
    assert!(!listing.truncated, "exactly the limit is not truncated");
}

fn listing_a_file_or_a_missing_path_fails(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let err = ws.list("b.txt", 1, 10).unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
    let err = ws.list("nope", 1, 10).unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
}

fn glob_double_star_finds_files_at_any_depth(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let listing = ws.glob("", "**/*.rs", 100).unwrap();
    assert_eq!(
        paths(&listing),
        ["a/deep/y.rs", "a/x.rs", "a-z/z.rs", "src/lib.rs"]
    );
    let listing = ws.glob("a", "**/*.rs", 100).unwrap();
    assert_eq!(paths(&listing), ["a/deep/y.rs", "a/x.rs"]);
}

fn glob_single_star_stays_within_one_component(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    assert_eq!(paths(&ws.glob("", "*.txt", 100).unwrap()), ["b.txt"]);
    assert_eq!(
        paths(&ws.glob("", "*/*.rs", 100).unwrap()),
        ["a/x.rs", "a-z/z.rs", "src/lib.rs"]
    );
    assert_eq!(paths(&ws.glob("a", "*.rs", 100).unwrap()), ["a/x.rs"]);
}

fn glob_never_enters_symlinked_directories(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    f.symlink("inner_link", "a");
    let listing = f.ws(r).glob("", "**", 100).unwrap();
    assert!(paths(&listing).contains(&"inner_link"));
    assert!(paths(&listing)
        .iter()
        .all(|p| !p.starts_with("inner_link/") && !p.starts_with("a/out/")));
}

fn glob_limits_and_rejects_bad_patterns(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let listing = ws.glob("", "**/*.rs", 2).unwrap();
    assert_eq!(listing.entries.len(), 2);
    assert!(listing.truncated);
    let err = ws.glob("", "a[", 10).unwrap_err();
    assert!(matches!(err, FsError::InvalidGlob { .. }), "{err:?}");
}

for_both_resolvers!(
    list_depth_one_gives_direct_children_sorted,
    list_descends_to_the_requested_depth_component_by_component,
    symlinks_are_listed_with_their_target_but_never_entered,
    list_stops_at_the_limit_and_says_so,
    listing_a_file_or_a_missing_path_fails,
    glob_double_star_finds_files_at_any_depth,
    glob_single_star_stays_within_one_component,
    glob_never_enters_symlinked_directories,
    glob_limits_and_rejects_bad_patterns,
);
