//! Text edits: exact-match replacement, ambiguity, preconditions and the size cap.

use warren_fs::{Etag, FsError, Resolver, EDIT_MAX_SIZE};

use super::support::Fixture;

fn edit_replaces_a_unique_occurrence(r: Resolver) {
    let f = Fixture::new();
    f.file("f.rs", "fn main() {\n    old();\n}\n");
    let ws = f.ws(r);
    let res = ws.edit("f.rs", "old()", "new()", false, None).unwrap();
    assert_eq!(res.replacements, 1);
    let want = "fn main() {\n    new();\n}\n";
    assert_eq!(f.read("f.rs"), want);
    assert_eq!(res.etag, Etag::of(want.as_bytes()));
}

/// What an edit case must produce.
#[derive(Debug)]
enum Outcome {
    /// Success with this many replacements and this new content.
    Replaced(usize, &'static str),
    NoMatch,
    Ambiguous(usize),
    EmptyOld,
}

/// One edit case: replace `old` by `"b"` in a file holding `content`.
struct EditCase {
    what: &'static str,
    content: &'static str,
    old: &'static str,
    replace_all: bool,
    outcome: Outcome,
}

fn edit_cases_follow_the_match_count(r: Resolver) {
    use Outcome::*;
    let case = |what, content, old, replace_all, outcome| EditCase {
        what,
        content,
        old,
        replace_all,
        outcome,
    };
    let table = [
        case("no match", "abc", "x", false, NoMatch),
        case("no match with replace_all", "abc", "x", true, NoMatch),
        case("ambiguous", "a-a", "a", false, Ambiguous(2)),
        case("replace all", "a-a-a", "a", true, Replaced(3, "b-b-b")),
        case(
            "unique with replace_all",
            "a-b",
            "a",
            true,
            Replaced(1, "b-b"),
        ),
        case("unique", "xay", "a", false, Replaced(1, "xby")),
        case("empty old", "abc", "", true, EmptyOld),
        case("overlaps count once", "aaa", "aa", false, Replaced(1, "ba")),
    ];
    for c in table {
        let f = Fixture::new();
        f.file("f.txt", c.content);
        let res = f.ws(r).edit("f.txt", c.old, "b", c.replace_all, None);
        let expected_content = match (&c.outcome, &res) {
            (Replaced(n, want), Ok(e)) if e.replacements == *n => want,
            (NoMatch, Err(FsError::EditNoMatch { .. }))
            | (EmptyOld, Err(FsError::EditEmptyOld { .. })) => c.content,
            (Ambiguous(n), Err(FsError::EditAmbiguous { count, .. })) if count == n => c.content,
            _ => panic!("{}: expected {:?}, got {res:?}", c.what, c.outcome),
        };
        assert_eq!(f.read("f.txt"), *expected_content, "{}", c.what);
    }
}

fn edit_honours_if_match(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "hello world");
    let ws = f.ws(r);
    let stale = Etag::of(b"something else");
    let err = ws
        .edit("f.txt", "world", "there", false, Some(&stale))
        .unwrap_err();
    assert!(
        matches!(err, FsError::PreconditionFailed { current: Some(ref c), .. } if *c == Etag::of(b"hello world")),
        "{err:?}"
    );
    let fresh = ws.etag("f.txt").unwrap();
    ws.edit("f.txt", "world", "there", false, Some(&fresh))
        .unwrap();
    assert_eq!(f.read("f.txt"), "hello there");
}

fn edit_refuses_non_utf8_missing_and_oversized_files(r: Resolver) {
    let f = Fixture::new();
    f.file("bin", [0xffu8, 0xfe, b'a']);
    let big = vec![b'a'; usize::try_from(EDIT_MAX_SIZE).unwrap() + 1];
    f.file("big.txt", &big);
    let ws = f.ws(r);
    let err = ws.edit("bin", "a", "b", false, None).unwrap_err();
    assert!(matches!(err, FsError::NotUtf8 { .. }), "{err:?}");
    let err = ws.edit("missing", "a", "b", false, None).unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
    let err = ws.edit("big.txt", "a", "b", true, None).unwrap_err();
    assert!(
        matches!(
            err,
            FsError::TooLarge {
                cap: EDIT_MAX_SIZE,
                ..
            }
        ),
        "{err:?}"
    );
}

fn edit_keeps_the_file_mode(r: Resolver) {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    f.file("run.sh", "echo old");
    std::fs::set_permissions(f.path("run.sh"), std::fs::Permissions::from_mode(0o700)).unwrap();
    f.ws(r).edit("run.sh", "old", "new", false, None).unwrap();
    let mode = std::fs::metadata(f.path("run.sh"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

for_both_resolvers!(
    edit_replaces_a_unique_occurrence,
    edit_cases_follow_the_match_count,
    edit_honours_if_match,
    edit_refuses_non_utf8_missing_and_oversized_files,
    edit_keeps_the_file_mode,
);
