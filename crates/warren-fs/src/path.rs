//! Textual checks on relative path strings, done before any syscall (defence in depth, I2).
//!
//! The kernel-side resolvers would refuse `..` and links on their own; refusing them here as
//! well means a bug or a missing kernel feature in one layer is not enough to escape, and it
//! gives agents precise messages.

use crate::error::{shorten, FsError, InvalidPathReason};

/// The longest accepted component, in bytes (`NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;
/// The longest accepted path string, in bytes (`PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;

/// A checked relative path: its components, none of them empty, `.` or `..`.
///
/// No component contains `/` or NUL, so each one names exactly one directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelPath<'a> {
    comps: Vec<&'a str>,
    display: String,
}

impl<'a> RelPath<'a> {
    /// Checks `raw` and splits it into components. Empty and `.` components are dropped, so
    /// `a//b/./c` is `a/b/c` and both `""` and `"."` name the root.
    pub(crate) fn parse(raw: &'a str) -> Result<Self, FsError> {
        let refuse = |reason| FsError::InvalidPath {
            path: shorten(raw),
            reason,
        };
        if raw.len() > MAX_PATH_LEN {
            return Err(refuse(InvalidPathReason::PathTooLong));
        }
        if raw.contains('\0') {
            return Err(refuse(InvalidPathReason::NulByte));
        }
        if raw.starts_with('/') {
            return Err(refuse(InvalidPathReason::Absolute));
        }
        let mut comps = Vec::new();
        for comp in raw.split('/') {
            match comp {
                "" | "." => {}
                ".." => return Err(refuse(InvalidPathReason::ParentComponent)),
                c if c.len() > MAX_COMPONENT_LEN => {
                    return Err(refuse(InvalidPathReason::ComponentTooLong))
                }
                c => comps.push(c),
            }
        }
        let display = comps.join("/");
        Ok(Self { comps, display })
    }

    /// The components, root to leaf.
    pub(crate) fn comps(&self) -> &[&'a str] {
        &self.comps
    }

    /// The normalised form (`a/b/c`, empty for the root), used in results and messages.
    pub(crate) fn as_str(&self) -> &str {
        &self.display
    }

    /// The parent components and the last one; `None` for the root.
    pub(crate) fn split_leaf(&self) -> Option<(&[&'a str], &'a str)> {
        self.comps
            .split_last()
            .map(|(leaf, parents)| (parents, *leaf))
    }
}

/// Joins a root-relative directory path and an entry name.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(raw: &str) -> Vec<String> {
        RelPath::parse(raw)
            .unwrap()
            .comps()
            .iter()
            .map(|c| (*c).to_owned())
            .collect()
    }

    fn reason(raw: &str) -> InvalidPathReason {
        match RelPath::parse(raw) {
            Err(FsError::InvalidPath { reason, .. }) => reason,
            other => panic!("{raw:?} should be refused, got {other:?}"),
        }
    }

    #[test]
    fn empty_and_dot_components_are_ignored() {
        assert_eq!(comps("a//b/./c"), ["a", "b", "c"]);
        assert_eq!(comps("a/b/"), ["a", "b"]);
        assert_eq!(comps("./a"), ["a"]);
        assert_eq!(RelPath::parse("a//b/./c").unwrap().as_str(), "a/b/c");
    }

    #[test]
    fn empty_path_and_dot_name_the_root() {
        for raw in ["", ".", "./", ".//."] {
            let p = RelPath::parse(raw).unwrap();
            assert!(p.comps().is_empty(), "{raw:?}");
            assert_eq!(p.as_str(), "");
            assert!(p.split_leaf().is_none());
        }
    }

    #[test]
    fn refused_paths_name_the_rule_that_refused_them() {
        let long_comp = "x".repeat(256);
        let long_path = "a/".repeat(2500);
        let table: &[(&str, &str, InvalidPathReason)] = &[
            ("absolute", "/etc/passwd", InvalidPathReason::Absolute),
            ("lone dotdot", "..", InvalidPathReason::ParentComponent),
            ("dotdot first", "../x", InvalidPathReason::ParentComponent),
            (
                "dotdot middle",
                "a/../b",
                InvalidPathReason::ParentComponent,
            ),
            ("dotdot last", "a/..", InvalidPathReason::ParentComponent),
            ("nul", "a\0b", InvalidPathReason::NulByte),
            (
                "long component",
                &long_comp,
                InvalidPathReason::ComponentTooLong,
            ),
            ("long path", &long_path, InvalidPathReason::PathTooLong),
        ];
        for (what, raw, want) in table {
            assert_eq!(reason(raw), *want, "{what}");
        }
    }

    #[test]
    fn limits_are_inclusive() {
        assert!(RelPath::parse(&"x".repeat(255)).is_ok());
        let path = format!("{}/", "x".repeat(255)).repeat(16);
        assert_eq!(path.len(), MAX_PATH_LEN);
        assert_eq!(RelPath::parse(&path).unwrap().comps().len(), 16);
        let err = RelPath::parse(&format!("{path}y")).unwrap_err();
        assert!(matches!(
            err,
            FsError::InvalidPath {
                reason: InvalidPathReason::PathTooLong,
                ..
            }
        ));
    }

    #[test]
    fn dots_inside_names_are_ordinary_names() {
        assert_eq!(comps("..."), ["..."]);
        assert_eq!(comps("..a/b.."), ["..a", "b.."]);
    }

    #[test]
    fn split_leaf_separates_parents_from_the_last_component() {
        let p = RelPath::parse("a/b/c").unwrap();
        let (parents, leaf) = p.split_leaf().unwrap();
        assert_eq!(parents, ["a", "b"]);
        assert_eq!(leaf, "c");
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("a/b", "x"), "a/b/x");
    }
}
