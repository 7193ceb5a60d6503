//! Plain request and result types of the workspace API.
//!
//! They carry no serde derives on purpose: the protocol crate owns the wire format and maps
//! these types to it.

use std::ffi::OsString;

use crate::etag::Etag;

/// Recursive walks (listing, glob, grep, recursive removal) stop descending at this depth;
/// each level holds one open descriptor, so the bound also bounds descriptor use.
pub const MAX_WALK_DEPTH: u32 = 256;
/// The largest file [`crate::WorkspaceRoot::edit`] loads (16 MiB).
pub const EDIT_MAX_SIZE: u64 = 16 * 1024 * 1024;
/// Grep match lines are cut to this many characters.
pub const GREP_LINE_MAX_CHARS: usize = 500;

/// What kind of object a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (listed, never followed).
    Symlink,
    /// Anything else: fifo, socket, device.
    Other,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 4] = [Kind::File, Kind::Dir, Kind::Symlink, Kind::Other];

    /// The name clients read: `file`, `dir`, `symlink` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }

    /// The kind [`Kind::as_str`] names; `None` for any other name.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// Metadata of one object in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the workspace root, `/`-joined, no leading slash; empty for the root.
    /// Names that are not UTF-8 are converted lossily: this is the form shown to clients.
    pub path: String,
    /// The same path as the exact bytes of its names: what copies, checkpoints and
    /// snapshots use, so a name that is not UTF-8 comes back as it was.
    pub os_path: OsString,
    /// What the object is.
    pub kind: Kind,
    /// Size in bytes (for a symlink: the length of its target).
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Last modification time, in milliseconds since the Unix epoch.
    pub modified_unix_ms: i64,
    /// The same time to the nanosecond (saturating), as `cp -a` keeps it: what a copy
    /// that must be exact sets with [`crate::WorkspaceRoot::set_attributes_ns`].
    pub modified_unix_ns: i64,
    /// Owning user id.
    pub uid: u32,
    /// Owning group id.
    pub gid: u32,
    /// For symlinks, the link's target as stored (never resolved), lossily if it is not
    /// UTF-8.
    pub symlink_target: Option<String>,
    /// For symlinks, the link's target as the exact bytes stored.
    pub os_symlink_target: Option<OsString>,
    /// The inode number: with `links > 1`, entries sharing it are hard links of one file.
    pub inode: u64,
    /// How many hard links the object has.
    pub links: u64,
    /// Last status change (ctime), nanoseconds since the epoch: every write moves it and
    /// no caller can set it, so an unchanged (inode, size, mtime, ctime) means unchanged
    /// content.
    pub changed_unix_ns: i64,
}

/// Which bytes of a file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// From `start` to `end_inclusive` (clamped to the file), or to the end when `None`.
    Span {
        /// First byte offset.
        start: u64,
        /// Last byte offset, inclusive.
        end_inclusive: Option<u64>,
    },
    /// The last `len` bytes (the whole file if it is shorter).
    Suffix {
        /// How many bytes from the end.
        len: u64,
    },
}

impl ByteRange {
    /// The whole file.
    pub const FULL: ByteRange = ByteRange::Span {
        start: 0,
        end_inclusive: None,
    };
}

impl Default for ByteRange {
    fn default() -> Self {
        Self::FULL
    }
}

/// The result of [`crate::WorkspaceRoot::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// The requested bytes.
    pub bytes: Vec<u8>,
    /// The size of the whole file.
    pub total_size: u64,
    /// The ETag of the whole file (not of the range).
    pub etag: Etag,
    /// Offset of `bytes[0]` in the file.
    pub range_start: u64,
}

/// Options of [`crate::WorkspaceRoot::write`] and [`crate::WorkspaceRoot::append`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Only write if the file exists and its current ETag is this one (I27).
    pub if_match: Option<Etag>,
    /// Only write if the file does not exist yet (`If-None-Match: *`).
    pub if_none_match_any: bool,
    /// Create missing parent directories (owned by the workspace owner, I11).
    pub create_parents: bool,
    /// Permission bits for the file (at most `0o777`); default: keep the existing file's,
    /// `0o644` for a new file.
    pub mode: Option<u32>,
}

/// The result of a write or append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteResult {
    /// The ETag of the file's full new content.
    pub etag: Etag,
    /// Whether the file did not exist before.
    pub created: bool,
    /// The file's new size.
    pub size: u64,
}

/// The result of [`crate::WorkspaceRoot::edit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditResult {
    /// The ETag of the file's full new content.
    pub etag: Etag,
    /// How many occurrences were replaced.
    pub replacements: usize,
}

/// Entries found by a listing or a glob.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The entries, sorted by path component by component (a directory's descendants follow
    /// it directly).
    pub entries: Vec<Entry>,
    /// Whether more entries matched than the limit allowed.
    pub truncated: bool,
}

/// Options of [`crate::WorkspaceRoot::grep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepOptions {
    /// Only search files matching this glob. A pattern without `/` is matched against the file
    /// name, one with `/` against the path relative to the search base.
    pub glob: Option<String>,
    /// Match case-insensitively.
    pub case_insensitive: bool,
    /// Stop after this many matching lines.
    pub max_matches: usize,
    /// Skip files larger than this many bytes.
    pub max_file_size: u64,
}

impl Default for GrepOptions {
    fn default() -> Self {
        Self {
            glob: None,
            case_insensitive: false,
            max_matches: 200,
            max_file_size: 4 * 1024 * 1024,
        }
    }
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepMatch {
    /// The file, relative to the workspace root.
    pub path: String,
    /// 1-based line number.
    pub line_number: u64,
    /// The line without its line ending, lossily decoded, cut to [`GREP_LINE_MAX_CHARS`].
    pub line: String,
}

/// The result of [`crate::WorkspaceRoot::grep`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrepResult {
    /// Matching lines in path order.
    pub matches: Vec<GrepMatch>,
    /// Whether the search stopped at `max_matches` with more matches left.
    pub truncated: bool,
    /// How many files were searched (binary and oversized files are skipped, not counted).
    pub files_scanned: u64,
}
