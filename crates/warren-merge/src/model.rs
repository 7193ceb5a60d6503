//! The values merges speak: what an entry is ([`Kind`]), what changed ([`Change`]), what a
//! plan does ([`Step`]) and what it could not decide ([`Conflict`], with each side's
//! [`Version`]).

use std::cmp::Ordering;

use serde::{Serialize, Serializer};

/// The mode bits merges compare and carry: the permission bits. Set-id and sticky bits are
/// neither compared nor ever written (content a branch wrote gains no privilege).
pub const MODE_BITS: u32 = 0o777;

/// What one tree entry is, as far as a merge cares. Owners and times are not compared.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    /// A regular file.
    File {
        /// Permission bits ([`MODE_BITS`]).
        mode: u32,
        /// Size in bytes.
        size: u64,
        /// BLAKE3 of the content (hex when serialised).
        #[serde(serialize_with = "hex_hash")]
        hash: [u8; 32],
    },
    /// A symbolic link: its target text, never followed.
    Symlink {
        /// The stored target.
        target: String,
    },
    /// A directory.
    Dir {
        /// Permission bits ([`MODE_BITS`]).
        mode: u32,
    },
}

impl Kind {
    /// The kind's name on the wire: `file`, `symlink` or `dir`.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::File { .. } => "file",
            Kind::Symlink { .. } => "symlink",
            Kind::Dir { .. } => "dir",
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self, Kind::Dir { .. })
    }

    /// The permission bits, for files and directories.
    pub fn mode(&self) -> Option<u32> {
        match self {
            Kind::File { mode, .. } | Kind::Dir { mode } => Some(*mode),
            Kind::Symlink { .. } => None,
        }
    }
}

fn hex_hash<S: Serializer>(hash: &[u8; 32], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&to_hex(hash))
}

/// A content hash as lowercase hex.
pub(crate) fn to_hex(hash: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*hash).to_hex().to_string()
}

/// One path that differs between two trees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Relative, `/`-separated.
    pub path: String,
    /// What the path was in the baseline; `None` when absent.
    pub before: Option<Kind>,
    /// What it is in the other tree; `None` when absent.
    pub after: Option<Kind>,
}

impl Change {
    /// What the change is: `added`, `deleted` or `modified`.
    pub fn what(&self) -> &'static str {
        match (&self.before, &self.after) {
            (None, _) => "added",
            (_, None) => "deleted",
            _ => "modified",
        }
    }
}

/// One side of a conflict, as a person deciding it would look at it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Version {
    /// Nothing at this path.
    Absent,
    /// A UTF-8 file without NUL of at most [`TEXT_MAX`] bytes.
    Text {
        /// The whole content.
        text: String,
        /// Permission bits.
        mode: u32,
    },
    /// Any other file.
    Binary {
        /// Size in bytes.
        size: u64,
        /// BLAKE3 of the content, hex.
        hash: String,
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link.
    Symlink {
        /// Its target text.
        target: String,
    },
    /// A directory.
    Dir {
        /// Permission bits.
        mode: u32,
    },
}

/// The largest file a [`Version::Text`] holds (256 KiB).
pub const TEXT_MAX: u64 = 256 * 1024;

/// A path a branch changed that the merge cannot decide alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// The path.
    pub path: String,
    /// The branch whose change conflicts with the target.
    pub branch: String,
    /// Why, in words: `both changed the same lines`, `changed here, deleted there`,
    /// `deleted here, changed there`, `both added different files`, `binary changed on both
    /// sides`, `both changed the link target`, `type changed`, `too large to merge`,
    /// `changed too much to merge line by line`.
    pub reason: &'static str,
    /// The path in the common baseline.
    pub base: Version,
    /// The path in the target, with the plan's earlier steps applied.
    pub ours: Version,
    /// The path in the branch.
    pub theirs: Version,
}

/// What one step does to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// New file content (an addition or a modification), renamed into place.
    Write,
    /// Removes a file, a link or an empty directory.
    Delete,
    /// Creates a directory.
    Mkdir,
    /// Places a symbolic link.
    Symlink,
    /// Changes the permission bits of a file or directory.
    Chmod,
}

impl Action {
    /// The action's name on the wire, as it serialises.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Write => "write",
            Action::Delete => "delete",
            Action::Mkdir => "mkdir",
            Action::Symlink => "symlink",
            Action::Chmod => "chmod",
        }
    }
}

/// One step of a plan, in the order it is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The path it acts on.
    pub path: String,
    /// What it does.
    pub action: Action,
    /// The branches that brought it, in merge order.
    pub from: Vec<String>,
    /// Whether a text file's lines were merged from two sides.
    pub merged_lines: bool,
}

/// Orders paths component by component, so a directory's descendants follow it directly
/// (`a`, `a/b`, `a-b`): the order changes and plans use.
pub fn path_order(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

/// The parent of a relative path (`""` for a top-level name).
pub(crate) fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(parent, _)| parent)
}

/// The proper ancestors of `path`, top down (`a`, `a/b` for `a/b/c`).
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

/// Whether `path` is strictly beneath `dir`.
pub(crate) fn is_beneath(path: &str, dir: &str) -> bool {
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_sort_with_a_directory_followed_by_its_descendants() {
        let mut paths = vec!["a-b", "a/b", "a", "b", "a/b/c", "a.txt"];
        paths.sort_by(|a, b| path_order(a, b));
        assert_eq!(paths, ["a", "a/b", "a/b/c", "a-b", "a.txt", "b"]);
    }

    #[test]
    fn ancestors_run_top_down_and_parents_stop_at_the_top() {
        assert_eq!(ancestors("a/b/c").collect::<Vec<_>>(), ["a", "a/b"]);
        assert_eq!(ancestors("a").count(), 0);
        assert_eq!(parent("a/b/c"), "a/b");
        assert_eq!(parent("a"), "");
        assert!(is_beneath("a/b", "a"));
        assert!(!is_beneath("ab", "a"));
        assert!(!is_beneath("a", "a"));
    }
}
