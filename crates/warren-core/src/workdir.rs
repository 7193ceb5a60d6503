//! The Workdir: a conversation's cwd and file view, as a relative POSIX directory inside the
//! UserWorkspace (I4, I8).

use std::fmt;

use crate::{component_problem, shorten, CoreError, MAX_PATH_BYTES};

/// A relative POSIX directory inside the UserWorkspace, e.g. `projects/<uuid>`.
///
/// Construction enforces the textual rules of I4: not absolute, no `..`, `.` or empty
/// component, not under the reserved `agents/` tree (I9). That the directory *exists* and
/// that no component is a symlink is checked by `warren-fs` when it is opened, by file
/// descriptor, never by string.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct Workdir(String);

impl Workdir {
    /// The reserved top-level tree for personal skills and agent state (I9).
    pub const RESERVED_TREE: &'static str = "agents";

    /// Validates a workdir given by a client.
    pub fn new(path: impl Into<String>) -> Result<Self, CoreError> {
        let path = path.into();
        match Self::problem(&path) {
            Some(reason) => Err(CoreError::InvalidWorkdir {
                path: shorten(&path),
                reason,
            }),
            None => Ok(Self(path)),
        }
    }

    /// A fresh default workdir, `projects/<uuid>` (I8).
    pub fn new_project() -> Self {
        Self(format!("projects/{}", uuid::Uuid::new_v4()))
    }

    fn problem(path: &str) -> Option<&'static str> {
        if path.is_empty() {
            return Some("it is empty");
        }
        if path.len() > MAX_PATH_BYTES {
            return Some("it is longer than 4096 bytes");
        }
        if path.starts_with('/') {
            return Some("it must be relative to the user workspace, not absolute");
        }
        let mut components = path.split('/');
        if components.clone().next() == Some(Self::RESERVED_TREE) {
            return Some("the agents/ tree is reserved");
        }
        components.find_map(|component| match component {
            "" => Some("it has an empty component (a doubled or trailing slash)"),
            "." => Some("it has a '.' component"),
            ".." => Some("it has a '..' component"),
            other => component_problem(other),
        })
    }

    /// The workdir as a relative path.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the workspace path `path` is this workdir or lies inside it.
    pub fn holds(&self, path: &str) -> bool {
        within(&self.0, path)
    }

    /// Whether one of the two workdirs holds the other: a change of either reaches both.
    pub fn overlaps(&self, other: &Workdir) -> bool {
        self.holds(other.as_str()) || other.holds(self.as_str())
    }
}

/// Whether the relative path `inner` is `outer` or lies inside it, component-wise
/// (`projects/a` holds `projects/a/b`, not `projects/ab`); the empty path holds everything.
pub fn within(outer: &str, inner: &str) -> bool {
    outer.is_empty()
        || inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl TryFrom<String> for Workdir {
    type Error = CoreError;

    fn try_from(path: String) -> Result<Self, CoreError> {
        Self::new(path)
    }
}

impl From<Workdir> for String {
    fn from(workdir: Workdir) -> Self {
        workdir.0
    }
}

impl fmt::Display for Workdir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_relative_directories_are_workdirs() {
        for path in [
            "projects/x",
            "a",
            "projects/2f1c.d/sub",
            "agentsx/y",
            "x/agents",
        ] {
            assert_eq!(Workdir::new(path).unwrap().as_str(), path);
        }
    }

    #[test]
    fn workdir_rules_refuse_each_bad_form() {
        let cases = [
            ("", "empty"),
            ("/projects/x", "absolute"),
            ("projects/../x", "'..'"),
            ("..", "'..'"),
            ("projects/./x", "'.'"),
            ("projects//x", "empty component"),
            ("projects/x/", "empty component"),
            ("agents", "reserved"),
            ("agents/skills/foo", "reserved"),
            ("a\0b", "NUL"),
        ];
        for (path, why) in cases {
            let err = Workdir::new(path).expect_err(path).to_string();
            assert!(err.contains(why), "{path:?}: {err}");
        }
        assert!(Workdir::new("a".repeat(256)).is_err());
        assert!(Workdir::new(["a"; 3000].join("/")).is_err());
    }

    #[test]
    fn a_workdir_holds_what_lies_inside_it_by_whole_components() {
        let a = Workdir::new("projects/a").unwrap();
        assert!(a.holds("projects/a") && a.holds("projects/a/b/c"));
        assert!(!a.holds("projects/ab") && !a.holds("projects") && !a.holds(""));
        assert!(a.overlaps(&Workdir::new("projects/a/b").unwrap()));
        assert!(a.overlaps(&Workdir::new("projects").unwrap()));
        assert!(!a.overlaps(&Workdir::new("projects/b").unwrap()));
        assert!(within("", "anything"));
    }

    #[test]
    fn default_workdirs_are_fresh_projects() {
        let a = Workdir::new_project();
        let b = Workdir::new_project();
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("projects/"));
        assert_eq!(Workdir::new(a.as_str()).unwrap(), a);
    }
}
