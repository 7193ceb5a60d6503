//! Three-way merges of directory trees, resolved by descriptor.
//!
//! A workdir branch is an overlay: its lower directory is the baseline (read-only while
//! branched), its upper directory holds the branch's own changes, and its merged view is
//! the branch's tree. This crate does the tree work of merging branches back:
//!
//! * [`branch_changes`] says what a branch changed against its baseline, looking only where
//!   the upper directory says something may have changed; [`tree_changes`] compares two
//!   whole trees (no overlay, and the tests' oracle).
//! * [`plan`] merges branches, in order, into a target (the baseline itself or another
//!   tree), three ways per path: a clean step, or a [`Conflict`] with all three versions.
//! * [`apply`] carries a plan without conflicts out all or nothing, through a journal;
//!   [`recover`] rolls committed journals forward at start-up and [`discard_staging`]
//!   throws away what an apply that never committed had staged.
//!
//! Mounts, storage and HTTP are the provisioner's; this crate only reads and writes trees.
//!
//! ```no_run
//! # fn main() -> Result<(), warren_merge::MergeError> {
//! use std::path::Path;
//! use warren_fs::WorkspaceRoot;
//! use warren_merge::{apply, branch_changes, plan, BranchInput};
//!
//! let open = |path: &str| WorkspaceRoot::open(Path::new(path)).expect("trusted host paths");
//! let (base, upper, view) = (open("/data/w/base"), open("/data/b1/upper"), open("/data/b1/view"));
//! let changes = branch_changes(&base, &upper, &view)?;
//! let branches = [BranchInput { name: "b1".into(), tree: &view, changes }];
//! let plan = plan(&base, &base, &branches)?;
//! if plan.is_clean() {
//!     apply(&base, &plan, Path::new("/var/lib/warren/merges"), "m-1", "workdir:w")?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Invariants
//!
//! * **Every path is resolved beneath a root's descriptor** ([`warren_fs::WorkspaceRoot`]):
//!   no symlink is followed in any component, no `..`, no mount crossed. No host path built
//!   from a tree's names is ever handed to a system call; the only host paths used are the
//!   caller's journal directory and the journal files in it, named by a checked id.
//! * **Links are values.** A symlink is its target text: compared, merged and written as a
//!   link, never followed, never read through.
//! * **Special files are refused.** A fifo, socket or device met in any tree stops the
//!   merge with an error naming it; none is ever opened or created. (An overlay's whiteouts
//!   in the upper directory are read as names only.)
//! * **Never "last writer wins" for content.** Both sides changing a path the same way is
//!   taken; differently, it is merged line by line when both are text, and a conflict
//!   otherwise. Modes changed on one side are taken; on both, the branch's.
//! * **All or nothing.** An apply stages every new file in a 0700 directory of its own
//!   inside the target (the same filesystem, so renames are atomic), checks that the target
//!   is still what the plan read, then commits by writing its journal durably. A crash
//!   before the commit leaves the target as it was; after it, recovery replays the
//!   journal's idempotent steps to the merged tree. Never a mix.
//! * **Ownership.** What an apply creates in the target belongs to the target root's owner
//!   ([`warren_fs::WorkspaceRoot::owner`], 1000:1000 when warren runs as root); modes carry
//!   the permission bits only, never set-id or sticky bits.
//! * **Messages name relative paths only**, never a host path.
//!
//! Names and link targets must be UTF-8 (a merge speaks `/`-separated strings); others are
//! refused. Owners and times are not compared. The mode of a tree's top is not merged.

mod apply;
mod changes;
mod error;
mod journal;
mod lines;
mod model;
mod ours;
mod plan;
mod read;
mod version;

#[cfg(test)]
mod tests;

pub use apply::{apply, apply_with, Applied, Phase};
pub use changes::{branch_changes, tree_changes};
pub use error::MergeError;
pub use journal::{discard_staging, recover, Recovered};
pub use lines::MERGE_COST_MAX;
pub use model::{path_order, Action, Change, Conflict, Kind, Step, Version, MODE_BITS, TEXT_MAX};
pub use plan::{plan, BranchInput, Plan, MERGE_TEXT_MAX, STAGING_PREFIX};
