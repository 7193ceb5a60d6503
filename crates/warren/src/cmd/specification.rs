//! The check that `SPECIFICATION.md` names only tests and benchmarks that exist: every code
//! span starting with `crates/` is a reference, `` `crates/….rs::name` `` to a function the
//! file defines (a test, or a rule a suite runs as tests) and `` `crates/…` `` alone to a
//! file or directory (a benchmark, a test program). A test renamed, moved or deleted without
//! the specification fails the suite, naming the reference.

use std::path::Path;

/// The specification.
const SPECIFICATION: &str = include_str!("../../../../SPECIFICATION.md");

/// What a reference starts with; anything else in backticks is not a reference.
const PREFIX: &str = "crates/";

/// One reference of the document: a path from the repository's root and, for a test, the
/// function it names.
#[derive(Debug, PartialEq, Eq)]
struct Reference<'a> {
    /// The reference as written, between its backticks.
    text: &'a str,
    path: &'a str,
    function: Option<&'a str>,
}

/// The references of `document`, in order: every code span that starts with [`PREFIX`].
fn references(document: &str) -> Vec<Reference<'_>> {
    let opening = format!("`{PREFIX}");
    let mut found = Vec::new();
    let mut rest = document;
    while let Some(start) = rest.find(&opening) {
        let span = &rest[start + 1..];
        let Some(end) = span.find('`') else {
            break;
        };
        let text = &span[..end];
        let (path, function) = match text.split_once("::") {
            Some((path, function)) => (path, Some(function)),
            None => (text, None),
        };
        found.push(Reference {
            text,
            path,
            function,
        });
        rest = &span[end + 1..];
    }
    found
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What is wrong with each reference of `document` that does not hold in the tree under
/// `root`, one line per reference, naming it.
fn problems(document: &str, root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for reference in references(document) {
        let file = root.join(reference.path);
        let Some(function) = reference.function else {
            if !file.exists() {
                found.push(format!("`{}`: no such file", reference.text));
            }
            continue;
        };
        if !is_identifier(function) {
            found.push(format!(
                "`{}`: `{function}` is not a function name",
                reference.text
            ));
            continue;
        }
        let Ok(source) = std::fs::read_to_string(&file) else {
            found.push(format!("`{}`: no such file", reference.text));
            continue;
        };
        let defined = [format!("fn {function}("), format!("fn {function}<")]
            .iter()
            .any(|definition| source.contains(definition.as_str()));
        if !defined {
            found.push(format!(
                "`{}`: {} has no `fn {function}`",
                reference.text, reference.path
            ));
        }
    }
    found
}

/// The repository's root: this crate is `crates/warren`.
fn repository() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn every_test_and_benchmark_the_specification_names_exists() {
    let problems = problems(SPECIFICATION, repository());
    assert!(
        problems.is_empty(),
        "SPECIFICATION.md names what does not exist:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_specification_names_its_promises_tests_in_the_checked_form() {
    // A change of format that made every reference invisible would pass the check above.
    let found = references(SPECIFICATION);
    let tests = found.iter().filter(|r| r.function.is_some()).count();
    assert!(tests >= 100, "only {tests} test references: {found:?}");
    assert!(
        found.iter().any(|r| r.path.contains("/benches/")),
        "no benchmark reference: {found:?}"
    );
}

#[test]
fn a_made_up_reference_is_named_and_a_real_one_is_not() {
    let document = "\
- real: `crates/warren/src/cmd/specification.rs::a_made_up_reference_is_named_and_a_real_one_is_not`
- a test never written: `crates/warren/src/cmd/specification.rs::a_test_nobody_wrote`
- a file never written: `crates/warren/tests/suite/nowhere.rs::anything`
- a benchmark never written: `crates/warren/benches/nowhere.rs`
- not a name: `crates/warren/src/cmd/specification.rs::<rule>`
- not a reference: `cargo test -p warren`
";
    assert_eq!(
        problems(document, repository()),
        [
            "`crates/warren/src/cmd/specification.rs::a_test_nobody_wrote`: \
             crates/warren/src/cmd/specification.rs has no `fn a_test_nobody_wrote`",
            "`crates/warren/tests/suite/nowhere.rs::anything`: no such file",
            "`crates/warren/benches/nowhere.rs`: no such file",
            "`crates/warren/src/cmd/specification.rs::<rule>`: `<rule>` is not a function name",
        ]
    );
}

#[test]
fn a_reference_is_read_with_its_path_and_function() {
    assert_eq!(
        references("see `crates/a/b.rs::c_d` and `crates/e/benches/f.rs`, not `g`"),
        [
            Reference {
                text: "crates/a/b.rs::c_d",
                path: "crates/a/b.rs",
                function: Some("c_d"),
            },
            Reference {
                text: "crates/e/benches/f.rs",
                path: "crates/e/benches/f.rs",
                function: None,
            },
        ]
    );
}
