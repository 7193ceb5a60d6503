//! Trusted host-side access to the bytes of one UserWorkspace.
//!
//! A [`WorkspaceRoot`] is opened on a trusted host directory; every operation afterwards takes
//! a *relative* path beneath it: a `&str`, or for the tree operations that copies and
//! snapshots use (stat, list, open, create, link, attributes, mkdir, remove, rename,
//! exchange) any `OsStr`, so names that are not UTF-8 are handled as their exact bytes by the
//! very same checks. Paths are first checked textually (no absolute paths,
//! no `..`, no NUL, bounded lengths) and then resolved by the kernel one
//! file descriptor at a time, root to leaf, so that `..`, symlinks in any component (the last
//! one included), magic links and mount crossings are refused without a check-then-use race
//! (I2). Two resolvers implement that walk: `openat2(2)` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, and a portable
//! component-by-component `O_NOFOLLOW` walk for kernels without `openat2` ([`Resolver`]).
//!
//! Operations that change a name (create, rename, unlink) resolve the *parent* directory to a
//! descriptor and act on the final name with `*at` calls relative to it, so the last component
//! is never followed. Files and directories created here are handed to the workspace owner
//! (I11), and conditional writes are serialised per directory with `flock` so that ETag
//! preconditions never lose an update (I27).
//!
//! Error messages never contain a host path (I1): callers may show them to agents.
//!
//! [`ownership`] holds the one-time migration of a uid's subtree to the sandbox user (I11:
//! owner 1000:1000, no world-writable or setuid/setgid modes), walked by descriptor with the
//! same rules (I2); the Kubernetes init step and the storage migrator both run it.
//!
//! Hardlinks are out of scope for path resolution: a hardlink inside the workspace to a file
//! outside it is the same inode, and no resolver can tell. Keeping such links out is the job
//! of whoever can create them (the sandbox must not share a filesystem with secrets it can
//! link to).

mod dir;
mod error;
mod etag;
mod in_root;
pub mod ownership;
mod path;
mod remove;
mod resolve;
mod root;
mod shared;
mod tree;
mod types;
mod walk;
mod write;

pub use dir::{child_dirs, open_child_dir};
pub use error::{FsError, InvalidPathReason};
pub use etag::Etag;
pub use in_root::{walk_in_root, InRoot, MAX_LINKS};
pub use ownership::{
    give_tree, migrate_subtree_once, MountPlace, OwnershipReport, OWNERSHIP_MARKER, SANDBOX_ID,
};
pub use path::{MAX_COMPONENT_LEN, MAX_PATH_LEN};
pub use remove::rename_between;
pub use resolve::Resolver;
pub use root::{read_file, Owner, WorkspaceRoot};
pub use shared::check_shared_dir;
pub use tree::CopyStats;
pub use types::{
    ByteRange, EditResult, Entry, GrepMatch, GrepOptions, GrepResult, Kind, Listing, ReadResult,
    WriteOptions, WriteResult, EDIT_MAX_SIZE, GREP_LINE_MAX_CHARS, MAX_WALK_DEPTH,
};
pub use walk::describe_at;
pub use write::TEMP_PREFIX;
