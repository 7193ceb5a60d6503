//! The one error type of this crate, [`FsError`], and the mapping from `errno` to it.
//!
//! Every variant carries the *relative* path (or pattern) involved and never a host path,
//! because callers may show messages to agents (I1). Refusals (a symlink, a mount crossing, a
//! failed precondition...) have their own variants; a failure the kernel reports for no reason
//! we can name is still tied to the operation that failed (one variant per operation), so
//! there is no catch-all.

use std::fmt;
use std::io;

use rustix::io::Errno;

use crate::etag::Etag;

/// Why a relative path string was refused before any syscall was made (I2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidPathReason {
    /// The path starts with `/`; only paths relative to the workspace root are accepted.
    Absolute,
    /// The path has a `..` component.
    ParentComponent,
    /// The path contains a NUL byte.
    NulByte,
    /// One component is longer than [`crate::MAX_COMPONENT_LEN`] bytes.
    ComponentTooLong,
    /// The whole path is longer than [`crate::MAX_PATH_LEN`] bytes.
    PathTooLong,
    /// One directory entry's name was expected (a child of a directory descriptor), and the
    /// string is empty, `.`, or has a `/`.
    NotOneName,
}

impl fmt::Display for InvalidPathReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Absolute => {
                "absolute paths are not allowed, use a path relative to the workspace"
            }
            Self::ParentComponent => "`..` components are not allowed",
            Self::NulByte => "paths may not contain a nul byte",
            Self::ComponentTooLong => "a path component is longer than 255 bytes",
            Self::PathTooLong => "the path is longer than 4096 bytes",
            Self::NotOneName => "one name was expected, not a path",
        })
    }
}

/// Everything that can go wrong in this crate.
///
/// `path` fields are relative to the workspace root, `/`-joined, without a leading slash (the
/// root itself is the empty string).
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A directory meant to hold the UserWorkspaces lacks a semantic the file layer needs
    /// ([`crate::check_shared_dir`]).
    #[error("the workspace directory cannot {semantic}: {errno}")]
    SharedDirUnsupported {
        /// What it cannot do, in words.
        semantic: &'static str,
        /// What the kernel said.
        errno: io::Error,
    },
    /// The trusted host directory could not be opened as a workspace root.
    #[error("the workspace root cannot be opened: {errno}")]
    RootUnavailable {
        /// What the kernel said.
        errno: io::Error,
    },
    /// The path string was refused by the textual rules (I2).
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The refused path as given (shortened when very long).
        path: String,
        /// Which rule refused it.
        reason: InvalidPathReason,
    },
    /// A component of the path (possibly the last one) is a symlink or a magic link; no link
    /// is ever followed (I2).
    #[error("`{path}`: symlinks are not followed inside the workspace")]
    SymlinkRefused {
        /// The requested path.
        path: String,
    },
    /// Inside a runtime, where links are followed ([`crate::walk_in_root`]): more links than
    /// [`crate::MAX_LINKS`] on the way (a loop).
    #[error("`{path}`: too many levels of symbolic links")]
    LinkLoop {
        /// The requested path.
        path: String,
    },
    /// Resolving the path would cross into another mount (I2).
    #[error("`{path}`: the path crosses a mount point, which is not allowed")]
    MountCrossingRefused {
        /// The requested path.
        path: String,
    },
    /// The operation is not allowed on the workspace root itself.
    #[error("refusing to {action} a root directory itself (a workspace or a mount)")]
    RootRefused {
        /// What was attempted, as a verb (`remove`, `rename`...).
        action: &'static str,
    },
    /// The workspace was opened read-only, or the file system is mounted read-only (a
    /// runtime's image tree), and this operation would change it.
    #[error("`{path}`: read-only")]
    ReadOnly {
        /// The path the mutation was aimed at.
        path: String,
    },
    /// Nothing exists at the path (or one of its parents is missing).
    #[error("`{path}`: no such file or directory")]
    NotFound {
        /// The requested path.
        path: String,
    },
    /// A component used as a directory is not one.
    #[error("`{path}`: not a directory")]
    NotADirectory {
        /// The requested path.
        path: String,
    },
    /// The path names a directory where a file was expected.
    #[error("`{path}`: is a directory")]
    IsADirectory {
        /// The requested path.
        path: String,
    },
    /// The path names something that is neither a regular file nor a directory (a fifo, a
    /// socket, a device), which is never read or written.
    #[error("`{path}`: not a regular file")]
    NotAFile {
        /// The requested path.
        path: String,
    },
    /// The destination already exists.
    #[error("`{path}`: already exists")]
    AlreadyExists {
        /// The path that exists.
        path: String,
    },
    /// The directory is not empty (and the removal was not recursive).
    #[error("`{path}`: directory is not empty")]
    DirectoryNotEmpty {
        /// The directory.
        path: String,
    },
    /// The kernel refused access.
    #[error("`{path}`: permission denied")]
    PermissionDenied {
        /// The requested path.
        path: String,
    },
    /// The requested bytes exceed the caller's cap.
    #[error("`{path}`: {size} bytes requested, more than the limit of {cap}")]
    TooLarge {
        /// The requested path.
        path: String,
        /// How many bytes the request would have returned or processed.
        size: u64,
        /// The limit.
        cap: u64,
    },
    /// The byte range lies outside the file.
    #[error("`{path}`: the range is not satisfiable for a file of {size} bytes")]
    RangeNotSatisfiable {
        /// The requested path.
        path: String,
        /// The file's size.
        size: u64,
    },
    /// A conditional write found a different version than the one it was based on (I27).
    #[error("`{path}`: the file changed, current version is {}", current.as_ref().map_or_else(|| "absent".to_owned(), |e| format!("\"{e}\"")))]
    PreconditionFailed {
        /// The requested path.
        path: String,
        /// The ETag of the current content, `None` when the file does not exist.
        current: Option<Etag>,
    },
    /// An edit's `old` text does not occur in the file.
    #[error("`{path}`: the text to replace was not found")]
    EditNoMatch {
        /// The edited file.
        path: String,
    },
    /// An edit's `old` text occurs several times and `replace_all` was not set.
    #[error(
        "`{path}`: the text to replace occurs {count} times, give more context or replace all"
    )]
    EditAmbiguous {
        /// The edited file.
        path: String,
        /// How many non-overlapping occurrences there are.
        count: usize,
    },
    /// An edit's `old` text is empty, which would match everywhere.
    #[error("`{path}`: the text to replace is empty")]
    EditEmptyOld {
        /// The edited file.
        path: String,
    },
    /// A text operation met bytes that are not UTF-8.
    #[error("`{path}`: the file is not valid utf-8 text")]
    NotUtf8 {
        /// The file.
        path: String,
    },
    /// A requested file mode has bits other than the permission bits `0o777`.
    #[error("`{path}`: invalid mode {mode:#o}, only permission bits 0o777 are allowed")]
    InvalidMode {
        /// The file.
        path: String,
        /// The refused mode.
        mode: u32,
    },
    /// A string is not an ETag this crate produced.
    #[error("invalid etag {value:?}")]
    InvalidEtag {
        /// The refused value (shortened when very long).
        value: String,
    },
    /// A glob pattern does not compile.
    #[error("invalid glob pattern {pattern:?}: {reason}")]
    InvalidGlob {
        /// The pattern.
        pattern: String,
        /// What the glob compiler said.
        reason: String,
    },
    /// A regular expression does not compile.
    #[error("invalid regular expression {pattern:?}: {reason}")]
    InvalidRegex {
        /// The pattern.
        pattern: String,
        /// What the regex compiler said.
        reason: String,
    },
    /// A recursive operation met a tree deeper than [`crate::MAX_WALK_DEPTH`].
    #[error("`{path}`: the tree is deeper than {limit} levels")]
    TooDeep {
        /// The directory at which the limit was reached.
        path: String,
        /// The limit.
        limit: u32,
    },
    /// A tree with more entries than a whole-tree operation takes.
    #[error("`{path}`: the tree has more than {limit} entries")]
    TooManyEntries {
        /// The tree's root.
        path: String,
        /// The limit.
        limit: usize,
    },
    /// Opening the path failed for another reason.
    #[error("`{path}`: cannot open: {errno}")]
    Open {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Reading a file's metadata failed.
    #[error("`{path}`: cannot read metadata: {errno}")]
    Stat {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Reading a file failed.
    #[error("`{path}`: cannot read: {errno}")]
    Read {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Writing or syncing a file failed.
    #[error("`{path}`: cannot write: {errno}")]
    Write {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Taking the per-directory write lock failed.
    #[error("`{path}`: cannot lock the parent directory: {errno}")]
    Lock {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Another process holds the directory's lock (for longer than writers wait).
    #[error("`{path}`: the directory is locked by another writer; try again")]
    Busy {
        /// The requested path.
        path: String,
    },
    /// Creating a file or directory failed.
    #[error("`{path}`: cannot create: {errno}")]
    Create {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Setting owner or mode failed (I11).
    #[error("`{path}`: cannot set owner or mode: {errno}")]
    SetAttributes {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Renaming failed.
    #[error("cannot rename `{from}` to `{to}`: {errno}")]
    Rename {
        /// The source path.
        from: String,
        /// The destination path.
        to: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Removing failed.
    #[error("`{path}`: cannot remove: {errno}")]
    Remove {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Reading a directory failed.
    #[error("`{path}`: cannot list: {errno}")]
    List {
        /// The requested path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// A system call of the ownership migration ([`crate::migrate_subtree_once`],
    /// [`crate::give_tree`]) failed. Kept apart from the variants above, which read an
    /// `errno` as a refusal of a path a client asked for: here every failure is the walk's
    /// own, and which call failed (a `chmod` refused for want of `CAP_FOWNER`, say) is what
    /// the operator needs to know.
    #[error("`{path}`: cannot {op}: {errno}")]
    Io {
        /// The system call, as a verb: `open`, `stat`, `list`, `chown`, `chmod`, `create`,
        /// `write`, `sync`.
        op: &'static str,
        /// The entry, relative to the walked tree (`.` for its root).
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
}

/// Which operation an unexpected `errno` belongs to, so it lands in the matching variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Open,
    Stat,
    Read,
    Write,
    Lock,
    Create,
    SetAttributes,
    Remove,
    List,
}

impl FsError {
    /// Maps an `errno` met while working on `path` to the most precise variant.
    ///
    /// `ELOOP` only ever comes from a link (every open carries `O_NOFOLLOW` and the resolvers
    /// turn any link they meet into `ELOOP`), `EXDEV` only from a mount crossing (`..` is
    /// refused before any syscall, so `RESOLVE_BENEATH` has nothing else to refuse).
    pub(crate) fn from_errno(errno: Errno, path: &str, op: Op) -> Self {
        let path = path.to_owned();
        match errno {
            Errno::NOENT => Self::NotFound { path },
            Errno::NOTDIR => Self::NotADirectory { path },
            Errno::ISDIR => Self::IsADirectory { path },
            Errno::LOOP => Self::SymlinkRefused { path },
            Errno::XDEV => Self::MountCrossingRefused { path },
            Errno::EXIST => Self::AlreadyExists { path },
            Errno::NOTEMPTY => Self::DirectoryNotEmpty { path },
            Errno::ACCESS | Errno::PERM => Self::PermissionDenied { path },
            Errno::ROFS => Self::ReadOnly { path },
            // `open` of a UNIX socket (or of a device without a driver) fails with ENXIO
            // before anything could `fstat` it: it is not a regular file either way.
            Errno::NXIO if matches!(op, Op::Open) => Self::NotAFile { path },
            Errno::NAMETOOLONG => Self::InvalidPath {
                path,
                reason: InvalidPathReason::PathTooLong,
            },
            other => {
                let errno = io::Error::from(other);
                match op {
                    Op::Open => Self::Open { path, errno },
                    Op::Stat => Self::Stat { path, errno },
                    Op::Read => Self::Read { path, errno },
                    Op::Write => Self::Write { path, errno },
                    Op::Lock => Self::Lock { path, errno },
                    Op::Create => Self::Create { path, errno },
                    Op::SetAttributes => Self::SetAttributes { path, errno },
                    Op::Remove => Self::Remove { path, errno },
                    Op::List => Self::List { path, errno },
                }
            }
        }
    }

    /// What opening `path` failed with, read as every open of this crate reads it: for a
    /// caller that resolved the path itself (a runtime's agent, [`crate::walk_in_root`]).
    pub fn on_open(errno: Errno, path: &str) -> Self {
        Self::from_errno(errno, path, Op::Open)
    }

    /// Like [`FsError::from_errno`] for errors that std's `File` reports.
    pub(crate) fn from_io(err: &io::Error, path: &str, op: Op) -> Self {
        match err.raw_os_error() {
            Some(raw) => Self::from_errno(Errno::from_raw_os_error(raw), path, op),
            // std only makes up non-OS errors for short writes (`WriteZero`) and reads; keep
            // them in the operation's variant.
            None => Self::from_errno(Errno::IO, path, op),
        }
    }
}

/// Shortens an untrusted string for an error message, at a char boundary.
pub(crate) fn shorten(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lowercase_and_name_the_relative_path() {
        let err = FsError::from_errno(Errno::NOENT, "a/b.txt", Op::Read);
        assert_eq!(err.to_string(), "`a/b.txt`: no such file or directory");
        let err = FsError::from_errno(Errno::LOOP, "a/link", Op::Open);
        assert!(matches!(err, FsError::SymlinkRefused { .. }));
    }

    #[test]
    fn unexpected_errno_lands_in_the_variant_of_its_operation() {
        let err = FsError::from_errno(Errno::IO, "f", Op::Write);
        assert!(matches!(err, FsError::Write { .. }), "{err:?}");
        let err = FsError::from_errno(Errno::IO, "f", Op::List);
        assert!(matches!(err, FsError::List { .. }), "{err:?}");
    }

    #[test]
    fn precondition_failed_names_the_current_version_or_its_absence() {
        let err = FsError::PreconditionFailed {
            path: "f".into(),
            current: None,
        };
        assert_eq!(
            err.to_string(),
            "`f`: the file changed, current version is absent"
        );
        let etag = Etag::of(b"x");
        let err = FsError::PreconditionFailed {
            path: "f".into(),
            current: Some(etag.clone()),
        };
        assert!(err.to_string().ends_with(&format!("\"{etag}\"")));
    }

    #[test]
    fn long_strings_are_shortened_at_a_char_boundary() {
        let s = "é".repeat(300);
        let short = shorten(&s);
        assert!(short.len() <= 204);
        assert!(short.ends_with('…'));
    }
}
