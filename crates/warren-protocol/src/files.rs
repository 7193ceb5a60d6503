//! Wire types of a sandbox's file operations (list, write, edit, glob, grep, mkdir, move)
//! and of directory watches.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{strict, ErrorDetail};

/// One file system entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    /// Virtual path.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits, e.g. 420 for 0644.
    pub mode: u32,
    /// Last modification (RFC 3339).
    pub modified: String,
}

/// `GET /v1/sandboxes/{id}/files/list`, and the answer of `glob`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    /// The directory listed or searched, as a virtual path.
    pub path: String,
    /// Entries sorted by path.
    pub entries: Vec<FileEntry>,
    /// More entries exist than were returned.
    pub truncated: bool,
}

/// The answer of a write, append or edit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WriteResult {
    /// Virtual path.
    pub path: String,
    /// The new ETag (also in the `ETag` header).
    pub etag: String,
    /// New size in bytes.
    pub size: u64,
    /// The file did not exist before.
    pub created: bool,
}

/// `POST /v1/sandboxes/{id}/files/edit`: exact string replacement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFile {
    /// Virtual path of a UTF-8 text file.
    pub path: String,
    /// Text to find; must match exactly once unless `replace_all`.
    pub old: String,
    /// Replacement text.
    pub new: String,
    /// Replace every match.
    #[serde(default)]
    pub replace_all: bool,
    /// Apply only if the file's ETag still is this one (also accepted as `If-Match`).
    #[serde(default)]
    pub if_match: Option<String>,
}

/// The answer of an edit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EditResult {
    /// Virtual path.
    pub path: String,
    /// The new ETag.
    pub etag: String,
    /// How many matches were replaced.
    pub replacements: u64,
}

/// `POST /v1/sandboxes/{id}/files/glob`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobFiles {
    /// Glob pattern relative to `path`, e.g. `**/*.py`.
    pub pattern: String,
    /// Directory to search (virtual path); default: the workdir.
    #[serde(default)]
    pub path: Option<String>,
    /// Most entries returned (default 1000, at most 10000).
    #[serde(default, deserialize_with = "strict::whole_count")]
    pub limit: Option<usize>,
}

/// `POST /v1/sandboxes/{id}/files/grep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepFiles {
    /// Regular expression (Rust `regex` syntax).
    pub pattern: String,
    /// Directory or file to search (virtual path); default: the workdir.
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files whose path matches this glob.
    #[serde(default)]
    pub glob: Option<String>,
    /// Match without regard to case.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Most matches returned (default 200, at most 10000).
    #[serde(default, deserialize_with = "strict::whole_count")]
    pub max_matches: Option<usize>,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrepMatch {
    /// Virtual path of the file.
    pub path: String,
    /// 1-based line number.
    pub line_number: u64,
    /// The line (long lines are shortened).
    pub line: String,
}

/// The answer of a grep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrepResult {
    /// Matches in path and line order.
    pub matches: Vec<GrepMatch>,
    /// More matches exist than were returned.
    pub truncated: bool,
    /// How many files were searched.
    pub files_scanned: u64,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDirectory {
    /// Virtual path; missing parents are created too.
    pub path: String,
}

/// The answer of a mkdir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MakeDirectoryResult {
    /// Virtual path.
    pub path: String,
    /// The directory did not exist before.
    pub created: bool,
}

/// `POST /v1/sandboxes/{id}/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveFile {
    /// Virtual path to move.
    pub from: String,
    /// Virtual destination path.
    pub to: String,
    /// Replace an existing destination.
    #[serde(default)]
    pub overwrite: bool,
}

/// The answer of a move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MoveResult {
    /// Virtual source path.
    pub from: String,
    /// Virtual destination path.
    pub to: String,
}

/// One event of a directory watch (`GET /v1/sandboxes/{id}/watch`): NDJSON lines, or SSE
/// events named by `type`. `name` is the entry's path relative to the watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The watch runs; the first event.
    Start {
        /// The watched directory, as a virtual path.
        path: String,
    },
    /// An entry was made, or moved in.
    Create {
        /// Relative to the watched directory.
        name: String,
    },
    /// A file was written.
    Write {
        /// Relative to the watched directory.
        name: String,
    },
    /// An entry was removed.
    Remove {
        /// Relative to the watched directory.
        name: String,
    },
    /// An entry was moved away (its old name).
    Rename {
        /// Relative to the watched directory.
        name: String,
    },
    /// An entry's permissions changed.
    Chmod {
        /// Relative to the watched directory.
        name: String,
    },
    /// Nothing happened for a while; the watch still runs.
    Keepalive,
    /// The watch ended (the directory went away, the sandbox stopped running); nothing
    /// follows.
    Error {
        /// Why.
        error: ErrorDetail,
    },
}
