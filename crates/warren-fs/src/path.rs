//! Textual checks on relative path strings, done before any syscall (defence in depth, I2).
//!
//! The kernel-side resolvers would refuse `..` and links on their own; refusing them here as
//! well means a bug or a missing kernel feature in one layer is not enough to escape, and it
//! gives agents precise messages.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::error::{shorten, FsError, InvalidPathReason};

/// The longest accepted component, in bytes (`NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;
/// The longest accepted path string, in bytes (`PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;

/// A checked relative path: its components, none of them empty, `.` or `..`.
///
/// No component contains `/` or NUL, so each one names exactly one directory entry.
/// Components are raw bytes: a name need not be UTF-8 (Linux names are bytes, and a
/// checkpoint must bring back exactly the names it found). `&str` paths are parsed by the
/// very same rules, as the bytes they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelPath<'a> {
    comps: Vec<&'a OsStr>,
    display: String,
}

impl<'a> RelPath<'a> {
    /// Checks `raw` and splits it into components. Empty and `.` components are dropped, so
    /// `a//b/./c` is `a/b/c` and both `""` and `"."` name the root.
    pub(crate) fn parse(raw: &'a (impl AsRef<OsStr> + ?Sized)) -> Result<Self, FsError> {
        let raw = raw.as_ref();
        let bytes = raw.as_bytes();
        let refuse = |reason| FsError::InvalidPath {
            path: shorten(&raw.to_string_lossy()),
            reason,
        };
        if bytes.len() > MAX_PATH_LEN {
            return Err(refuse(InvalidPathReason::PathTooLong));
        }
        if bytes.contains(&0) {
            return Err(refuse(InvalidPathReason::NulByte));
        }
        if bytes.first() == Some(&b'/') {
            return Err(refuse(InvalidPathReason::Absolute));
        }
        let mut comps = Vec::new();
        for comp in bytes.split(|b| *b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => return Err(refuse(InvalidPathReason::ParentComponent)),
                c if c.len() > MAX_COMPONENT_LEN => {
                    return Err(refuse(InvalidPathReason::ComponentTooLong))
                }
                c => comps.push(OsStr::from_bytes(c)),
            }
        }
        let display = comps
            .iter()
            .map(|c| c.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        Ok(Self { comps, display })
    }

    /// The components, root to leaf.
    pub(crate) fn comps(&self) -> &[&'a OsStr] {
        &self.comps
    }

    /// The normalised form (`a/b/c`, empty for the root), used in results and messages;
    /// names that are not UTF-8 are shown lossily.
    pub(crate) fn as_str(&self) -> &str {
        &self.display
    }

    /// The normalised form as the exact bytes.
    pub(crate) fn to_os_string(&self) -> OsString {
        join_all(&self.comps)
    }

    /// The parent components and the last one; `None` for the root.
    pub(crate) fn split_leaf(&self) -> Option<(&[&'a OsStr], &'a OsStr)> {
        self.comps
            .split_last()
            .map(|(leaf, parents)| (parents, *leaf))
    }
}

fn join_all(comps: &[&OsStr]) -> OsString {
    let mut out = OsString::new();
    for (i, comp) in comps.iter().enumerate() {
        if i > 0 {
            out.push("/");
        }
        out.push(comp);
    }
    out
}

/// Joins a root-relative directory path and an entry name, as exact bytes.
pub(crate) fn join_os(dir: &OsStr, name: &OsStr) -> OsString {
    if dir.is_empty() {
        name.to_owned()
    } else {
        join_all(&[dir, name])
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
            .map(|c| c.to_str().unwrap().to_owned())
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
    fn names_that_are_not_utf8_keep_their_bytes_under_the_same_rules() {
        let raw = OsStr::from_bytes(b"caf\xe9//./d\xff");
        let p = RelPath::parse(raw).unwrap();
        assert_eq!(
            p.comps(),
            [OsStr::from_bytes(b"caf\xe9"), OsStr::from_bytes(b"d\xff")]
        );
        assert_eq!(p.as_str(), "caf\u{FFFD}/d\u{FFFD}");
        assert_eq!(p.to_os_string().as_bytes(), b"caf\xe9/d\xff");
        let table: &[(&[u8], InvalidPathReason)] = &[
            (b"\xff/..", InvalidPathReason::ParentComponent),
            (b"../\xff", InvalidPathReason::ParentComponent),
            (b"/\xff", InvalidPathReason::Absolute),
            (b"\xff\0x", InvalidPathReason::NulByte),
            (&[0xff; 256], InvalidPathReason::ComponentTooLong),
        ];
        for (raw, want) in table {
            match RelPath::parse(OsStr::from_bytes(raw)) {
                Err(FsError::InvalidPath { reason, .. }) => assert_eq!(reason, *want, "{raw:?}"),
                other => panic!("{raw:?} should be refused, got {other:?}"),
            }
        }
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
        assert_eq!(join_os(OsStr::new(""), OsStr::new("x")), "x");
        assert_eq!(join_os(OsStr::new("a/b"), OsStr::new("x")), "a/b/x");
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("a/b", "x"), "a/b/x");
    }
}
