//! Branches of a workdir (I27): named, writable views over a read-only baseline, each
//! costing only what it changes; an explicit merger brings them back.

use std::fmt;

use crate::{shorten, CoreError};

/// A branch's name: 1 to 64 bytes of ASCII letters, digits, `.`, `_` and `-`, not starting
/// with `.` or `-`, unique among the branches of one workdir.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct BranchName(String);

impl BranchName {
    /// Longest branch name, in bytes.
    pub const MAX_BYTES: usize = 64;

    /// Validates a branch name given by a client.
    pub fn new(name: impl Into<String>) -> Result<Self, CoreError> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > Self::MAX_BYTES {
            Some("it is longer than 64 bytes")
        } else if name.starts_with(['.', '-']) {
            Some("it starts with '.' or '-'")
        } else if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            Some("only ASCII letters, digits, '.', '_' and '-' are allowed")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(CoreError::InvalidBranch {
                name: shorten(&name),
                reason,
            }),
            None => Ok(Self(name)),
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BranchName {
    type Error = CoreError;

    fn try_from(name: String) -> Result<Self, CoreError> {
        Self::new(name)
    }
}

impl From<BranchName> for String {
    fn from(name: BranchName) -> Self {
        name.0
    }
}

impl fmt::Display for BranchName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_branch_names() {
        for name in ["a", "agent-1", "fix_bug.2", "A9", &"x".repeat(64)] {
            assert_eq!(BranchName::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn names_that_could_be_paths_or_options_are_refused() {
        for (name, why) in [
            ("", "empty"),
            ("..", "starts with"),
            (".hidden", "starts with"),
            ("-rf", "starts with"),
            ("a/b", "only ASCII"),
            ("a b", "only ASCII"),
            ("a\0b", "only ASCII"),
            ("é", "only ASCII"),
        ] {
            let error = BranchName::new(name).expect_err(name).to_string();
            assert!(error.contains(why), "{name:?}: {error}");
        }
        assert!(BranchName::new("x".repeat(65)).is_err());
    }
}
