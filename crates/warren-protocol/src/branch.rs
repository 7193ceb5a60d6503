//! Wire types of workdir branches and the merger (I27).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/users/{uid}/branches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBranch {
    /// The workdir to branch, relative to the user's workspace.
    pub workdir: String,
    /// The branch's name: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, not starting with
    /// `.` or `-`; unique among the workdir's branches.
    pub name: String,
    /// A checkpoint of the workdir (`ckpt-…`) to branch from; without one, the workdir as it
    /// is now, which is then read-only while the branch exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<String>,
}

/// A branch of a workdir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchInfo {
    /// The workdir it is a branch of.
    pub workdir: String,
    /// Its name.
    pub name: String,
    /// The checkpoint it was made from, if any (else the workdir as it was, its baseline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// When a merge brought it into its workdir (RFC 3339); a merged branch is never merged
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_at: Option<String>,
}

/// `GET /v1/users/{uid}/branches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchList {
    /// Oldest first.
    pub branches: Vec<BranchInfo>,
}

/// What one path is in one version of a tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryVersion {
    /// Nothing there.
    Absent,
    /// A UTF-8 text file (up to 256 KiB, no NUL byte), whole.
    Text {
        /// Its content.
        text: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Any other file: its size and BLAKE3 hash.
    Binary {
        /// Bytes.
        size: u64,
        /// Hex BLAKE3 of the content.
        hash: String,
        /// Its permission bits.
        mode: u32,
    },
    /// A symbolic link (never followed).
    Symlink {
        /// What it points to.
        target: String,
    },
    /// A directory.
    Dir {
        /// Its permission bits.
        mode: u32,
    },
}

/// One path a branch changed against its baseline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchChange {
    /// Relative to the workdir.
    pub path: String,
    /// `added`, `deleted` or `modified`.
    pub change: String,
    /// What it was in the baseline: `file`, `symlink`, `dir`, or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// What it is in the branch: `file`, `symlink`, `dir`, or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// `GET /v1/users/{uid}/branches/{name}/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchDiff {
    /// The workdir.
    pub workdir: String,
    /// The branch.
    pub name: String,
    /// Sorted by path.
    pub changes: Vec<BranchChange>,
}

/// `POST /v1/sandboxes/{id}/merge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeBranches {
    /// Branches of the sandbox's workdir, merged in this order into what the sandbox writes
    /// (its workdir, or its branch).
    pub branches: Vec<String>,
    /// List what would change and what conflicts, changing nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A path the merge cannot combine: the three versions, never resolved by "last writer wins".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MergeConflictInfo {
    /// Relative to the workdir.
    pub path: String,
    /// The branch whose change conflicts.
    pub branch: String,
    /// Why it cannot be combined.
    pub reason: String,
    /// The baseline's version.
    pub base: EntryVersion,
    /// The target's version (with the branches before this one merged).
    pub ours: EntryVersion,
    /// The branch's version.
    pub theirs: EntryVersion,
}

/// One change a merge makes to the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MergeStepInfo {
    /// Relative to the workdir.
    pub path: String,
    /// `write`, `delete`, `mkdir`, `symlink` or `chmod`.
    pub action: String,
    /// The branches that brought it.
    pub from: Vec<String>,
    /// Whether a text file's lines were merged from two sides.
    pub merged_lines: bool,
}

/// What a merge did, or (dry run) would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MergeResult {
    /// Whether the changes were applied (never with conflicts, never on a dry run).
    pub applied: bool,
    /// The checkpoint of the target taken before applying: restore it to undo the merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
    /// The changes, in the order applied.
    pub steps: Vec<MergeStepInfo>,
    /// What cannot be combined (a dry run lists them; a merge with any is refused).
    pub conflicts: Vec<MergeConflictInfo>,
}
