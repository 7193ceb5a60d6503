//! File operations anywhere in a runtime (`/tmp`, the home, the image's own tree), served
//! by the runtime's own agent as the sandbox user, and their wire form (issue 42).
//!
//! The persistent mounts are read and written on the host by descriptor (`warren-fs`); a
//! path outside them exists only inside the runtime, so its agent resolves it there, as
//! uid 1000, beneath the runtime's root with no link followed out of it
//! ([`warren_fs::walk_in_root`]), and runs the same `warren-fs` operation a host-side path
//! gets. What comes back is the same result, carried here as data: [`FileAnswer`] for a
//! success, [`FileFailure`] for the `FsError` it stands for, converted both ways in this one
//! place so a refusal inside a runtime reaches a client with the same code and status as
//! one on the host. Bytes travel beside the frames (a pipe, or data frames over TCP).

use serde::{Deserialize, Serialize};
use warren_fs::{
    EditResult, Entry, Etag, FsError, GrepMatch, GrepResult, InvalidPathReason, Kind, Listing,
    ReadResult, WriteResult,
};

/// One file operation, on absolute paths of the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FileOp {
    /// The entry at `path`, a link described, not followed.
    Describe {
        /// The runtime's path.
        path: String,
    },
    /// Bytes `start..=end` (to the end when `None`), or the last `suffix` bytes, of the
    /// file at `path`, at most `cap`.
    Read {
        /// The runtime's path.
        path: String,
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: Option<u64>,
        /// The last this many bytes instead.
        suffix: Option<u64>,
        /// Most bytes returned.
        cap: u64,
    },
    /// Writes the bytes that follow atomically (or appends them).
    Write {
        /// The runtime's path.
        path: String,
        /// Append instead of replacing.
        append: bool,
        /// Only if the current content has this ETag.
        if_match: Option<String>,
        /// Only if nothing exists there.
        if_none_match_any: bool,
        /// Make missing parents.
        create_parents: bool,
        /// Permission bits.
        mode: Option<u32>,
        /// Most bytes accepted.
        cap: u64,
    },
    /// Replaces exact text.
    Edit {
        /// The runtime's path.
        path: String,
        /// The text replaced.
        old: String,
        /// Its replacement.
        new: String,
        /// Every occurrence, not exactly one.
        replace_all: bool,
        /// Only if the current content has this ETag.
        if_match: Option<String>,
    },
    /// Makes a directory and its missing parents.
    Mkdir {
        /// The runtime's path.
        path: String,
    },
    /// Lists a directory `depth` levels down, at most `limit` entries.
    List {
        /// The runtime's path.
        path: String,
        /// Levels.
        depth: u32,
        /// Most entries.
        limit: usize,
    },
    /// Entries under `path` matching `pattern`.
    Glob {
        /// The runtime's path.
        path: String,
        /// The glob.
        pattern: String,
        /// Most entries.
        limit: usize,
    },
    /// Lines under `path` matching a regular expression.
    Grep {
        /// The runtime's path.
        path: String,
        /// The expression.
        pattern: String,
        /// Only files matching this glob.
        glob: Option<String>,
        /// Case-insensitively.
        case_insensitive: bool,
        /// Most matching lines.
        max_matches: usize,
        /// Files larger are skipped.
        max_file_size: u64,
    },
    /// Removes a file, a link, or (`recursive`) a tree, never across a mount.
    Remove {
        /// The runtime's path.
        path: String,
        /// A whole tree.
        recursive: bool,
    },
    /// Moves an entry.
    Rename {
        /// The runtime's path moved.
        from: String,
        /// Where to.
        to: String,
        /// Replace what is there.
        overwrite: bool,
    },
}

impl FileOp {
    /// A read of `range` of `path`.
    pub fn read(path: String, range: warren_fs::ByteRange, cap: u64) -> Self {
        match range {
            warren_fs::ByteRange::Span {
                start,
                end_inclusive,
            } => Self::Read {
                path,
                start,
                end: end_inclusive,
                suffix: None,
                cap,
            },
            warren_fs::ByteRange::Suffix { len } => Self::Read {
                path,
                start: 0,
                end: None,
                suffix: Some(len),
                cap,
            },
        }
    }

    /// The range a read asks for.
    pub fn range(start: u64, end: Option<u64>, suffix: Option<u64>) -> warren_fs::ByteRange {
        match suffix {
            Some(len) => warren_fs::ByteRange::Suffix { len },
            None => warren_fs::ByteRange::Span {
                start,
                end_inclusive: end,
            },
        }
    }

    /// Whether bytes go to the runtime with this operation.
    pub fn sends_data(&self) -> bool {
        matches!(self, Self::Write { .. })
    }

    /// The path it concerns (the source of a rename).
    pub fn path(&self) -> &str {
        match self {
            Self::Describe { path }
            | Self::Read { path, .. }
            | Self::Write { path, .. }
            | Self::Edit { path, .. }
            | Self::Mkdir { path }
            | Self::List { path, .. }
            | Self::Glob { path, .. }
            | Self::Grep { path, .. }
            | Self::Remove { path, .. } => path,
            Self::Rename { from, .. } => from,
        }
    }
}

/// One entry, its path relative to the path the operation named (empty for that path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path below the operation's path.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modified, ms since the epoch.
    pub modified_unix_ms: i64,
    /// Modified, ns since the epoch.
    pub modified_unix_ns: i64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// A link's target, as stored.
    pub symlink_target: Option<String>,
    /// Inode.
    pub inode: u64,
    /// Hard links.
    pub links: u64,
    /// Changed (ctime), ns since the epoch.
    pub changed_unix_ns: i64,
}

impl FileEntry {
    /// The wire form of `entry`, shown at `path`.
    pub fn of(entry: &Entry, path: String) -> Self {
        Self {
            path,
            kind: entry.kind.as_str().to_owned(),
            size: entry.size,
            mode: entry.mode,
            modified_unix_ms: entry.modified_unix_ms,
            modified_unix_ns: entry.modified_unix_ns,
            uid: entry.uid,
            gid: entry.gid,
            symlink_target: entry.symlink_target.clone(),
            inode: entry.inode,
            links: entry.links,
            changed_unix_ns: entry.changed_unix_ns,
        }
    }

    /// The entry, its path `base` joined with this one's.
    pub fn into_entry(self, base: &str) -> Entry {
        let path = match (base.is_empty(), self.path.is_empty()) {
            (_, true) => base.to_owned(),
            (true, false) => self.path,
            (false, false) => format!("{base}/{}", self.path),
        };
        Entry {
            os_path: path.clone().into(),
            path,
            kind: Kind::from_name(&self.kind).unwrap_or(Kind::Other),
            size: self.size,
            mode: self.mode,
            modified_unix_ms: self.modified_unix_ms,
            modified_unix_ns: self.modified_unix_ns,
            uid: self.uid,
            gid: self.gid,
            os_symlink_target: self.symlink_target.clone().map(Into::into),
            symlink_target: self.symlink_target,
            inode: self.inode,
            links: self.links,
            changed_unix_ns: self.changed_unix_ns,
        }
    }
}

/// What a file operation returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum FileAnswer {
    /// An entry.
    Entry(FileEntry),
    /// A read: `length` bytes follow.
    Read {
        /// The whole file's size.
        total_size: u64,
        /// The whole file's ETag.
        etag: String,
        /// Offset of the first byte.
        range_start: u64,
        /// Bytes that follow.
        length: u64,
    },
    /// A write.
    Written {
        /// The new content's ETag.
        etag: String,
        /// Nothing was there before.
        created: bool,
        /// The new size.
        size: u64,
    },
    /// An edit.
    Edited {
        /// The new content's ETag.
        etag: String,
        /// Occurrences replaced.
        replacements: usize,
    },
    /// A directory made (or there already).
    Made {
        /// It was not there.
        created: bool,
    },
    /// A listing or a glob.
    Listing {
        /// The entries, paths below the operation's path.
        entries: Vec<FileEntry>,
        /// More matched than the limit.
        truncated: bool,
    },
    /// A search.
    Grep {
        /// (path below the operation's path, line number, line).
        matches: Vec<(String, u64, String)>,
        /// More matched than asked for.
        truncated: bool,
        /// Files searched.
        files_scanned: u64,
    },
    /// Removed or moved.
    Done,
}

fn etag(value: &str) -> Etag {
    value.parse().unwrap_or_else(|_| Etag::unmatchable())
}

impl FileAnswer {
    /// A read's result, with the bytes that came beside it; any other answer given back.
    pub fn into_read(self, bytes: Vec<u8>) -> Result<ReadResult, Box<Self>> {
        match self {
            Self::Read {
                total_size,
                etag: tag,
                range_start,
                ..
            } => Ok(ReadResult {
                bytes,
                total_size,
                etag: etag(&tag),
                range_start,
            }),
            other => Err(Box::new(other)),
        }
    }

    /// A write's result.
    pub fn into_written(self) -> Result<WriteResult, Box<Self>> {
        match self {
            Self::Written {
                etag: tag,
                created,
                size,
            } => Ok(WriteResult {
                etag: etag(&tag),
                created,
                size,
            }),
            other => Err(Box::new(other)),
        }
    }

    /// An edit's result.
    pub fn into_edited(self) -> Result<EditResult, Box<Self>> {
        match self {
            Self::Edited {
                etag: tag,
                replacements,
            } => Ok(EditResult {
                etag: etag(&tag),
                replacements,
            }),
            other => Err(Box::new(other)),
        }
    }

    /// A listing's entries, their paths `base` joined with theirs.
    pub fn into_listing(self, base: &str) -> Result<Listing, Box<Self>> {
        match self {
            Self::Listing { entries, truncated } => Ok(Listing {
                entries: entries.into_iter().map(|e| e.into_entry(base)).collect(),
                truncated,
            }),
            other => Err(Box::new(other)),
        }
    }

    /// A search's result, its paths `base` joined with theirs.
    pub fn into_grep(self, base: &str) -> Result<GrepResult, Box<Self>> {
        match self {
            Self::Grep {
                matches,
                truncated,
                files_scanned,
            } => Ok(GrepResult {
                matches: matches
                    .into_iter()
                    .map(|(path, line_number, line)| GrepMatch {
                        path: match (base.is_empty(), path.is_empty()) {
                            (_, true) => base.to_owned(),
                            (true, false) => path,
                            (false, false) => format!("{base}/{path}"),
                        },
                        line_number,
                        line,
                    })
                    .collect(),
                truncated,
                files_scanned,
            }),
            other => Err(Box::new(other)),
        }
    }
}

/// Why a file operation inside a runtime failed: the [`FsError`] it stands for, with every
/// path the runtime's own (never a host path, I1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum FileFailure {
    /// A refusal without more to it than its path: the variant is [`FsError`]'s, by name.
    Refused {
        /// `not_found`, `permission_denied`, ... (see [`FileFailure::from_fs`]).
        kind: String,
        /// The path.
        path: String,
    },
    /// The path's text was refused.
    InvalidPath {
        /// The path.
        path: String,
        /// Which rule.
        reason: String,
    },
    /// A root itself may not be changed so.
    RootRefused {
        /// `remove`, `rename`, `replace`.
        action: String,
    },
    /// More bytes than allowed.
    TooLarge {
        /// The path.
        path: String,
        /// Bytes asked for.
        size: u64,
        /// The limit.
        cap: u64,
    },
    /// The range lies outside the file.
    RangeNotSatisfiable {
        /// The path.
        path: String,
        /// The file's size.
        size: u64,
    },
    /// The content changed (I27).
    PreconditionFailed {
        /// The path.
        path: String,
        /// The current ETag, when the file exists.
        current: Option<String>,
    },
    /// An edit's text occurs more than once.
    EditAmbiguous {
        /// The path.
        path: String,
        /// Occurrences.
        count: usize,
    },
    /// A mode with more than permission bits.
    InvalidMode {
        /// The path.
        path: String,
        /// The mode.
        mode: u32,
    },
    /// A pattern that does not compile (`glob` or `regex`).
    InvalidPattern {
        /// Which language.
        language: String,
        /// The pattern.
        pattern: String,
        /// Why.
        reason: String,
    },
    /// A tree deeper or larger than an operation takes.
    TreeLimit {
        /// `depth` or `entries`.
        limit_of: String,
        /// The tree.
        path: String,
        /// The limit.
        limit: u64,
    },
    /// The kernel said no for a reason without a variant of its own.
    Os {
        /// What was being done: `open`, `stat`, `read`, `write`, `lock`, `create`,
        /// `set_attributes`, `remove`, `list`, or `rename` (then `to` is set).
        op: String,
        /// The path.
        path: String,
        /// A rename's destination.
        to: Option<String>,
        /// The errno.
        errno: i32,
    },
}

#[cfg(test)]
const REFUSALS: [&str; 16] = [
    "not_found",
    "link_loop",
    "not_a_directory",
    "is_a_directory",
    "not_a_file",
    "already_exists",
    "directory_not_empty",
    "permission_denied",
    "read_only",
    "symlink_refused",
    "mount_crossing_refused",
    "edit_no_match",
    "edit_empty_old",
    "not_utf8",
    "busy",
    "invalid_etag",
];

const REASONS: [(&str, InvalidPathReason); 6] = [
    ("absolute", InvalidPathReason::Absolute),
    ("parent_component", InvalidPathReason::ParentComponent),
    ("nul_byte", InvalidPathReason::NulByte),
    ("component_too_long", InvalidPathReason::ComponentTooLong),
    ("path_too_long", InvalidPathReason::PathTooLong),
    ("not_one_name", InvalidPathReason::NotOneName),
];

fn errno_of(error: &std::io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc_eio())
}

const fn libc_eio() -> i32 {
    5
}

impl FileFailure {
    /// The wire form of `error`, every path in it replaced by `shown` (the runtime's path
    /// the client named; a rename's destination by `to`).
    pub fn from_fs(error: &FsError, shown: &str, to: Option<&str>) -> Self {
        let path = shown.to_owned();
        let refused = |kind: &str| Self::Refused {
            kind: kind.to_owned(),
            path: shown.to_owned(),
        };
        let os = |op: &str, errno: &std::io::Error| Self::Os {
            op: op.to_owned(),
            path: shown.to_owned(),
            to: None,
            errno: errno_of(errno),
        };
        match error {
            FsError::NotFound { .. } => refused("not_found"),
            FsError::LinkLoop { .. } => refused("link_loop"),
            FsError::NotADirectory { .. } => refused("not_a_directory"),
            FsError::IsADirectory { .. } => refused("is_a_directory"),
            FsError::NotAFile { .. } => refused("not_a_file"),
            FsError::AlreadyExists { .. } => refused("already_exists"),
            FsError::DirectoryNotEmpty { .. } => refused("directory_not_empty"),
            FsError::PermissionDenied { .. } => refused("permission_denied"),
            FsError::ReadOnly { .. } => refused("read_only"),
            FsError::SymlinkRefused { .. } => refused("symlink_refused"),
            FsError::MountCrossingRefused { .. } => refused("mount_crossing_refused"),
            FsError::EditNoMatch { .. } => refused("edit_no_match"),
            FsError::EditEmptyOld { .. } => refused("edit_empty_old"),
            FsError::NotUtf8 { .. } => refused("not_utf8"),
            FsError::Busy { .. } => refused("busy"),
            FsError::InvalidEtag { .. } => refused("invalid_etag"),
            FsError::InvalidPath { reason, .. } => Self::InvalidPath {
                path,
                reason: REASONS
                    .iter()
                    .find(|(_, r)| r == reason)
                    .map_or("path_too_long", |(name, _)| name)
                    .to_owned(),
            },
            FsError::RootRefused { action } => Self::RootRefused {
                action: (*action).to_owned(),
            },
            FsError::TooLarge { size, cap, .. } => Self::TooLarge {
                path,
                size: *size,
                cap: *cap,
            },
            FsError::RangeNotSatisfiable { size, .. } => {
                Self::RangeNotSatisfiable { path, size: *size }
            }
            FsError::PreconditionFailed { current, .. } => Self::PreconditionFailed {
                path,
                current: current.as_ref().map(|e| e.as_str().to_owned()),
            },
            FsError::EditAmbiguous { count, .. } => Self::EditAmbiguous {
                path,
                count: *count,
            },
            FsError::InvalidMode { mode, .. } => Self::InvalidMode { path, mode: *mode },
            FsError::InvalidGlob { pattern, reason } => Self::InvalidPattern {
                language: "glob".into(),
                pattern: pattern.clone(),
                reason: reason.clone(),
            },
            FsError::InvalidRegex { pattern, reason } => Self::InvalidPattern {
                language: "regex".into(),
                pattern: pattern.clone(),
                reason: reason.clone(),
            },
            FsError::TooDeep { limit, .. } => Self::TreeLimit {
                limit_of: "depth".into(),
                path,
                limit: u64::from(*limit),
            },
            FsError::TooManyEntries { limit, .. } => Self::TreeLimit {
                limit_of: "entries".into(),
                path,
                limit: *limit as u64,
            },
            FsError::Open { errno, .. }
            | FsError::RootUnavailable { errno }
            | FsError::SharedDirUnsupported { errno, .. } => os("open", errno),
            FsError::Stat { errno, .. } => os("stat", errno),
            FsError::Read { errno, .. } => os("read", errno),
            FsError::Write { errno, .. } => os("write", errno),
            FsError::Lock { errno, .. } => os("lock", errno),
            FsError::Create { errno, .. } => os("create", errno),
            FsError::SetAttributes { errno, .. } => os("set_attributes", errno),
            FsError::Remove { errno, .. } => os("remove", errno),
            FsError::List { errno, .. } => os("list", errno),
            FsError::Io { op, errno, .. } => os(op, errno),
            FsError::Rename { errno, .. } => Self::Os {
                op: "rename".into(),
                path,
                to: Some(to.unwrap_or(shown).to_owned()),
                errno: errno_of(errno),
            },
        }
    }

    /// The [`FsError`] this stands for.
    pub fn into_fs(self) -> FsError {
        match self {
            Self::Refused { kind, path } => match kind.as_str() {
                "not_found" => FsError::NotFound { path },
                "link_loop" => FsError::LinkLoop { path },
                "not_a_directory" => FsError::NotADirectory { path },
                "is_a_directory" => FsError::IsADirectory { path },
                "not_a_file" => FsError::NotAFile { path },
                "already_exists" => FsError::AlreadyExists { path },
                "directory_not_empty" => FsError::DirectoryNotEmpty { path },
                "permission_denied" => FsError::PermissionDenied { path },
                "read_only" => FsError::ReadOnly { path },
                "symlink_refused" => FsError::SymlinkRefused { path },
                "mount_crossing_refused" => FsError::MountCrossingRefused { path },
                "edit_no_match" => FsError::EditNoMatch { path },
                "edit_empty_old" => FsError::EditEmptyOld { path },
                "not_utf8" => FsError::NotUtf8 { path },
                "busy" => FsError::Busy { path },
                "invalid_etag" => FsError::InvalidEtag { value: path },
                _ => FsError::Open {
                    path,
                    errno: std::io::Error::from_raw_os_error(libc_eio()),
                },
            },
            Self::InvalidPath { path, reason } => FsError::InvalidPath {
                path,
                reason: REASONS
                    .iter()
                    .find(|(name, _)| *name == reason)
                    .map_or(InvalidPathReason::PathTooLong, |(_, r)| *r),
            },
            Self::RootRefused { action } => FsError::RootRefused {
                action: match action.as_str() {
                    "remove" => "remove",
                    "rename" => "rename",
                    "replace" => "replace",
                    _ => "change",
                },
            },
            Self::TooLarge { path, size, cap } => FsError::TooLarge { path, size, cap },
            Self::RangeNotSatisfiable { path, size } => FsError::RangeNotSatisfiable { path, size },
            Self::PreconditionFailed { path, current } => FsError::PreconditionFailed {
                path,
                current: current.map(|tag| etag(&tag)),
            },
            Self::EditAmbiguous { path, count } => FsError::EditAmbiguous { path, count },
            Self::InvalidMode { path, mode } => FsError::InvalidMode { path, mode },
            Self::InvalidPattern {
                language,
                pattern,
                reason,
            } => match language.as_str() {
                "glob" => FsError::InvalidGlob { pattern, reason },
                _ => FsError::InvalidRegex { pattern, reason },
            },
            Self::TreeLimit {
                limit_of,
                path,
                limit,
            } => match limit_of.as_str() {
                "depth" => FsError::TooDeep {
                    path,
                    limit: u32::try_from(limit).unwrap_or(u32::MAX),
                },
                _ => FsError::TooManyEntries {
                    path,
                    limit: usize::try_from(limit).unwrap_or(usize::MAX),
                },
            },
            Self::Os {
                op,
                path,
                to,
                errno,
            } => {
                let errno = std::io::Error::from_raw_os_error(errno);
                match op.as_str() {
                    "stat" => FsError::Stat { path, errno },
                    "read" => FsError::Read { path, errno },
                    "write" => FsError::Write { path, errno },
                    "lock" => FsError::Lock { path, errno },
                    "create" => FsError::Create { path, errno },
                    "set_attributes" => FsError::SetAttributes { path, errno },
                    "remove" => FsError::Remove { path, errno },
                    "list" => FsError::List { path, errno },
                    "rename" => FsError::Rename {
                        from: path.clone(),
                        to: to.unwrap_or(path),
                        errno,
                    },
                    _ => FsError::Open { path, errno },
                }
            }
        }
    }
}

/// What the runtime answered a file operation: the answer or the refusal, and the bytes
/// that came beside it (a read's).
#[derive(Debug)]
pub struct FileReply {
    /// The answer.
    pub answer: Result<FileAnswer, FileFailure>,
    /// A read's bytes.
    pub data: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_comes_back_as_the_error_it_was() {
        for kind in REFUSALS {
            let failure = FileFailure::Refused {
                kind: kind.to_owned(),
                path: "/tmp/x".into(),
            };
            let error = failure.clone().into_fs();
            assert_eq!(
                FileFailure::from_fs(&error, "/tmp/x", None),
                failure,
                "{kind}"
            );
        }
        for (reason, _) in REASONS {
            let failure = FileFailure::InvalidPath {
                path: "/tmp/x".into(),
                reason: reason.to_owned(),
            };
            assert_eq!(
                FileFailure::from_fs(&failure.clone().into_fs(), "/tmp/x", None),
                failure
            );
        }
        let os = FileFailure::Os {
            op: "rename".into(),
            path: "/tmp/a".into(),
            to: Some("/tmp/b".into()),
            errno: 16,
        };
        assert_eq!(
            FileFailure::from_fs(&os.clone().into_fs(), "/tmp/a", Some("/tmp/b")),
            os
        );
    }

    #[test]
    fn a_failure_names_the_runtime_path_not_the_agent_s() {
        let error = FsError::PermissionDenied {
            path: "passwd".into(),
        };
        let failure = FileFailure::from_fs(&error, "/etc/passwd", None);
        assert_eq!(
            failure.into_fs().to_string(),
            "`/etc/passwd`: permission denied"
        );
    }

    #[test]
    fn listed_entries_are_shown_under_the_path_asked_for() {
        let entry = FileEntry {
            path: "a/b".into(),
            kind: "file".into(),
            size: 3,
            mode: 0o644,
            modified_unix_ms: 1,
            modified_unix_ns: 1_000_000,
            uid: 1000,
            gid: 1000,
            symlink_target: None,
            inode: 7,
            links: 1,
            changed_unix_ns: 1,
        };
        let listing = FileAnswer::Listing {
            entries: vec![entry],
            truncated: false,
        }
        .into_listing("tmp/dir")
        .unwrap();
        assert_eq!(listing.entries[0].path, "tmp/dir/a/b");
        assert_eq!(listing.entries[0].kind, Kind::File);
    }
}
