//! The one error type of this crate, [`MergeError`].
//!
//! Every variant names the failed operation or the refusal, with paths relative to the trees
//! (never a host path: the journal directory is named by the merge's id only), so a caller
//! may show the message to an agent. Failures of the file layer keep their [`FsError`],
//! which follows the same rule.

use std::io;

use warren_fs::FsError;

/// Everything that can go wrong while comparing, planning, applying or recovering a merge.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// Reading one of the trees failed (`tree` is `base`, `upper`, `branch`, `other` or
    /// `target`).
    #[error("reading the {tree}: {source}")]
    Read {
        /// Which tree.
        tree: &'static str,
        /// What the file layer said.
        source: FsError,
    },
    /// Changing the target failed.
    #[error("writing the target: {source}")]
    Write {
        /// What the file layer said.
        source: FsError,
    },
    /// A fifo, socket or device was met: such entries are never read, merged or created.
    #[error(
        "`{path}` in the {tree} is a special file (fifo, socket or device), which is never merged"
    )]
    SpecialFile {
        /// Which tree.
        tree: &'static str,
        /// The entry.
        path: String,
    },
    /// A name or a link target that is not UTF-8: merges speak `/`-separated UTF-8 paths.
    #[error(
        "`{path}` in the {tree} has a name or link target that is not utf-8, which is not merged"
    )]
    NotUtf8 {
        /// Which tree.
        tree: &'static str,
        /// The entry, shown lossily.
        path: String,
    },
    /// A tree holds more entries than one comparison takes.
    #[error("`{path}` in the {tree} has more than {limit} entries")]
    TooManyEntries {
        /// Which tree.
        tree: &'static str,
        /// The directory walked.
        path: String,
        /// The limit.
        limit: usize,
    },
    /// A change names a path no tree entry can have (empty, absolute, with `.` or `..`).
    #[error("`{path}`: not a relative path of a tree entry")]
    InvalidChange {
        /// The path as given.
        path: String,
    },
    /// A change names the merge's own staging directory, which is reserved.
    #[error("`{path}`: names beginning with `.warren-merge-` are reserved for merges")]
    ReservedName {
        /// The path.
        path: String,
    },
    /// A tree's content no longer matches what the changes recorded while planning.
    #[error("`{path}` in the {tree} changed while the merge was being planned")]
    ChangedWhilePlanning {
        /// Which tree.
        tree: &'static str,
        /// The file.
        path: String,
    },
    /// A branch's file no longer has the content the plan was made with.
    #[error("`{path}` in branch `{branch}` changed after the merge was planned")]
    BranchChanged {
        /// The branch's name.
        branch: String,
        /// The file.
        path: String,
    },
    /// The target no longer is what the plan saw at this path; nothing was applied.
    #[error("`{path}` in the target changed after the merge was planned; nothing was applied")]
    TargetChanged {
        /// The path.
        path: String,
    },
    /// The plan has conflicts; a plan is applied only when it has none.
    #[error("the merge has {count} conflicts; nothing was applied")]
    Conflicts {
        /// How many.
        count: usize,
    },
    /// A merge id must be 1 to 64 of `A-Z a-z 0-9 _ -`.
    #[error("invalid merge id {id:?}: use 1 to 64 letters, digits, `_` or `-`")]
    InvalidId {
        /// The refused id (shortened).
        id: String,
    },
    /// A journal for this id exists already: recover it before applying again.
    #[error("a journal for merge `{id}` exists already; recover it first")]
    JournalExists {
        /// The merge id.
        id: String,
    },
    /// Creating, syncing or reading the staging directory failed.
    #[error("staging merge `{id}`: cannot {op}: {errno}")]
    Staging {
        /// The merge id.
        id: String,
        /// The operation, as a verb.
        op: &'static str,
        /// What the kernel said.
        errno: io::Error,
    },
    /// The staging directory is not the one the merge made (another owner or mode): it is
    /// not used.
    #[error("the staging directory of merge `{id}` is not the merge's own; refusing to use it")]
    StagingTampered {
        /// The merge id.
        id: String,
    },
    /// Setting a mode in the target failed.
    #[error("`{path}`: cannot set the mode: {errno}")]
    SetMode {
        /// The path.
        path: String,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Writing, syncing, reading or removing a journal failed.
    #[error("journal of merge `{id}`: cannot {op}: {errno}")]
    Journal {
        /// The merge id (or the journal file's name).
        id: String,
        /// The operation, as a verb.
        op: &'static str,
        /// What the system said.
        errno: io::Error,
    },
    /// A journal file could not be understood.
    #[error("journal of merge `{id}` is not readable: {reason}")]
    JournalCorrupt {
        /// The merge id (or the journal file's name).
        id: String,
        /// What the parser said.
        reason: String,
    },
}

impl MergeError {
    /// A reader for `map_err`: a failure reading `tree`.
    pub(crate) fn read(tree: &'static str) -> impl FnOnce(FsError) -> MergeError {
        move |source| MergeError::Read { tree, source }
    }

    /// A failure writing the target.
    pub(crate) fn write(source: FsError) -> MergeError {
        MergeError::Write { source }
    }
}
