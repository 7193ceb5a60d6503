//! Grep: matches, caps, filters, and files that are skipped.

use warren_fs::{FsError, GrepOptions, Resolver, GREP_LINE_MAX_CHARS};

use super::support::Fixture;

fn found(result: &warren_fs::GrepResult) -> Vec<(String, u64)> {
    result
        .matches
        .iter()
        .map(|m| (m.path.clone(), m.line_number))
        .collect()
}

fn tree(f: &Fixture) {
    f.file("src/a.rs", "fn alpha() {}\n// TODO first\nfn beta() {}\n");
    f.file("src/b.rs", "todo lower\r\nnothing\r\nTODO crlf\r\n");
    f.file("docs/notes.md", "TODO in docs\n");
    f.file("bin/data.bin", b"TODO\0binary".as_slice());
    f.symlink("src/secret-link.rs", f.outside.join("secret.txt"));
    f.symlink("outdir", &f.outside);
}

fn grep_finds_matching_lines_in_path_order(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let res = f.ws(r).grep("", "TODO", GrepOptions::default()).unwrap();
    assert_eq!(
        found(&res),
        [
            ("docs/notes.md".into(), 1),
            ("src/a.rs".into(), 2),
            ("src/b.rs".into(), 3)
        ]
    );
    assert_eq!(res.matches[1].line, "// TODO first");
    assert_eq!(
        res.matches[2].line, "TODO crlf",
        "line endings are stripped"
    );
    assert!(!res.truncated);
    assert_eq!(
        res.files_scanned, 3,
        "the binary file is skipped, links are not followed"
    );
}

fn grep_never_follows_symlinks_to_secrets(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let res = f.ws(r).grep("", "SECRET", GrepOptions::default()).unwrap();
    assert!(res.matches.is_empty(), "{res:?}");
}

fn grep_can_ignore_case(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let opts = GrepOptions {
        case_insensitive: true,
        ..Default::default()
    };
    let res = f.ws(r).grep("src", "todo", opts).unwrap();
    assert_eq!(
        found(&res),
        [
            ("src/a.rs".into(), 2),
            ("src/b.rs".into(), 1),
            ("src/b.rs".into(), 3)
        ]
    );
}

fn grep_stops_at_max_matches_and_says_so(r: Resolver) {
    let f = Fixture::new();
    f.file("many.txt", "hit\n".repeat(50));
    let ws = f.ws(r);
    let opts = GrepOptions {
        max_matches: 10,
        ..Default::default()
    };
    let res = ws.grep("", "hit", opts).unwrap();
    assert_eq!(res.matches.len(), 10);
    assert!(res.truncated);
    let opts = GrepOptions {
        max_matches: 50,
        ..Default::default()
    };
    assert!(!ws.grep("", "hit", opts).unwrap().truncated);
}

fn grep_skips_files_over_the_size_limit(r: Resolver) {
    let f = Fixture::new();
    f.file("small.txt", "needle\n");
    f.file("large.txt", format!("needle\n{}", "x".repeat(1000)));
    let opts = GrepOptions {
        max_file_size: 100,
        ..Default::default()
    };
    let res = f.ws(r).grep("", "needle", opts).unwrap();
    assert_eq!(found(&res), [("small.txt".into(), 1)]);
    assert_eq!(res.files_scanned, 1);
}

fn grep_glob_filters_by_name_or_by_path(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let by_name = GrepOptions {
        glob: Some("*.md".into()),
        ..Default::default()
    };
    assert_eq!(
        found(&ws.grep("", "TODO", by_name).unwrap()),
        [("docs/notes.md".into(), 1)]
    );
    let by_path = GrepOptions {
        glob: Some("src/*.rs".into()),
        ..Default::default()
    };
    assert_eq!(
        found(&ws.grep("", "TODO", by_path).unwrap()),
        [("src/a.rs".into(), 2), ("src/b.rs".into(), 3)]
    );
}

fn grep_truncates_long_lines(r: Resolver) {
    let f = Fixture::new();
    f.file(
        "long.txt",
        format!("{}needle{}\n", "é".repeat(400), "z".repeat(400)),
    );
    let res = f.ws(r).grep("", "needle", GrepOptions::default()).unwrap();
    assert_eq!(res.matches[0].line.chars().count(), GREP_LINE_MAX_CHARS);
}

fn grep_on_a_single_file_and_bad_input(r: Resolver) {
    let f = Fixture::new();
    tree(&f);
    let ws = f.ws(r);
    let res = ws.grep("src/a.rs", "fn", GrepOptions::default()).unwrap();
    assert_eq!(
        found(&res),
        [("src/a.rs".into(), 1), ("src/a.rs".into(), 3)]
    );
    let err = ws.grep("", "(", GrepOptions::default()).unwrap_err();
    assert!(matches!(err, FsError::InvalidRegex { .. }), "{err:?}");
    let err = ws
        .grep("outdir", "TOP", GrepOptions::default())
        .unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
}

for_both_resolvers!(
    grep_finds_matching_lines_in_path_order,
    grep_never_follows_symlinks_to_secrets,
    grep_can_ignore_case,
    grep_stops_at_max_matches_and_says_so,
    grep_skips_files_over_the_size_limit,
    grep_glob_filters_by_name_or_by_path,
    grep_truncates_long_lines,
    grep_on_a_single_file_and_bad_input,
);
