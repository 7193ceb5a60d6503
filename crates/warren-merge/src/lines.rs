//! Line-by-line three-way merges of text, with a bound on the work.
//!
//! `diffy` diffs the base against each side with Myers' algorithm, whose time grows with the
//! lines times the lines that differ: two files rewritten wholesale would take minutes
//! (40,000 lines: about 20 s optimised, far more in a debug build). A branch's content is
//! the sandbox's to choose, so each side's distance from the base is measured first with
//! the same algorithm stopped at a budget, and a side past it conflicts instead.

use std::collections::HashMap;

/// The work one side may cost: lines of the base and the side times the lines that differ
/// between them. About 0.2 s for `diffy` in an optimised build.
pub const MERGE_COST_MAX: usize = 50_000_000;

/// What a line merge came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TextMerge {
    /// Clean: the merged text.
    Merged(String),
    /// A conflict, and why.
    Conflict(&'static str),
}

/// Merges `ours` and `theirs`, both made from `base`, line by line.
pub(crate) fn merge_text(base: &str, ours: &str, theirs: &str) -> TextMerge {
    let mut ids = HashMap::new();
    let mut lines = |text: &'_ str| -> Vec<usize> {
        text.split_inclusive('\n')
            .map(|line| {
                let next = ids.len();
                *ids.entry(line.to_owned()).or_insert(next)
            })
            .collect()
    };
    let (b, o, t) = (lines(base), lines(ours), lines(theirs));
    for side in [&o, &t] {
        let budget = MERGE_COST_MAX / (b.len() + side.len()).max(1);
        if !within_distance(&b, side, budget) {
            return TextMerge::Conflict("changed too much to merge line by line");
        }
    }
    match diffy::merge(base, ours, theirs) {
        Ok(merged) => TextMerge::Merged(merged),
        Err(_) => TextMerge::Conflict("both changed the same lines"),
    }
}

/// Whether `b` is at most `max` line insertions and deletions away from `a`: Myers' greedy
/// algorithm, stopped once the distance passes `max`, so its time is bounded by
/// `(a.len() + b.len()) * max` whatever the input.
fn within_distance(a: &[usize], b: &[usize], max: usize) -> bool {
    let (n, m) = (a.len(), b.len());
    let max = max.min(n + m);
    // `v[k + offset]`: the furthest x reached on diagonal k (y = x - k).
    let offset = max + 1;
    let mut v = vec![0usize; 2 * max + 3];
    for d in 0..=max {
        for step in 0..=d {
            // k runs -d, -d + 2, ..., d; as an index, k + offset.
            let index = offset + 2 * step - d;
            let down = step == 0 || (step != d && v[index - 1] < v[index + 1]);
            let mut x = if down { v[index + 1] } else { v[index - 1] + 1 };
            // y = x - k = x + offset - index, never negative on a reachable diagonal.
            let Some(mut y) = (x + offset).checked_sub(index) else {
                continue;
            };
            while x < n && y < m && a[x] == b[y] {
                x += 1;
                y += 1;
            }
            v[index] = x;
            if x >= n && y >= m {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<usize> {
        text.bytes().map(usize::from).collect()
    }

    #[test]
    fn the_distance_is_the_insertions_and_deletions_between_two_sequences() {
        let table: &[(&str, &str, usize)] = &[
            ("", "", 0),
            ("abc", "abc", 0),
            ("abc", "", 3),
            ("", "ab", 2),
            ("abc", "abd", 2),
            ("abcabba", "cbabac", 5),
            ("abcdef", "xabcdefy", 2),
        ];
        for (a, b, distance) in table {
            let (a, b) = (ids(a), ids(b));
            assert!(
                within_distance(&a, &b, *distance),
                "{a:?} {b:?} within {distance}"
            );
            if *distance > 0 {
                assert!(
                    !within_distance(&a, &b, distance - 1),
                    "{a:?} {b:?} not within {}",
                    distance - 1
                );
            }
        }
    }

    #[test]
    fn a_wholesale_rewrite_on_both_sides_conflicts_without_a_long_diff() {
        let text =
            |word: &str| -> String { (0..40_000).map(|i| format!("{word} {i}\n")).collect() };
        let started = std::time::Instant::now();
        let merged = merge_text(&text("base"), &text("ours"), &text("theirs"));
        assert_eq!(
            merged,
            TextMerge::Conflict("changed too much to merge line by line")
        );
        // Not a timing assertion: a guard against the quadratic diff coming back.
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn edits_in_different_places_merge_and_in_the_same_place_conflict() {
        let base = "a\nb\nc\nd\n";
        assert_eq!(
            merge_text(base, "A\nb\nc\nd\n", "a\nb\nc\nD\n"),
            TextMerge::Merged("A\nb\nc\nD\n".to_owned())
        );
        assert_eq!(
            merge_text(base, "a\nX\nc\nd\n", "a\nY\nc\nd\n"),
            TextMerge::Conflict("both changed the same lines")
        );
    }
}
