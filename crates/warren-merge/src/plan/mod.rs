//! Planning a merge: three ways per path (base, ours = the target with the plan's earlier
//! steps, theirs = the branch), one branch after another, into steps and conflicts.
//!
//! The rules, for each path a branch changed:
//! * ours already equals theirs: nothing to do (both changed it identically);
//! * ours equals base: only the branch changed it, take it (a file is checked by hash only,
//!   its content is not read until the apply streams it);
//! * both changed it: two text files (UTF-8, no NUL) are merged line by line with `diffy`;
//!   two directories or two files with the same content get the merged mode; anything else
//!   is a [`Conflict`] carrying all three [`crate::Version`]s. Never "last writer wins".
//!
//! A mode changed on one side only is taken; changed on both sides differently, the
//! branch's wins (the one exception: a mode is not content). A directory the branch removed
//! is removed only when nothing else is left in it; one the target removed is made again
//! when the branch adds something inside it.

mod rules;

use std::collections::HashMap;

use warren_fs::WorkspaceRoot;

use crate::error::MergeError;
use crate::model::{path_order, Action, Change, Conflict, Kind, Step};
use crate::ours::{Bytes, Ours, State};
use crate::read::Tree;
use crate::version::{version, Load, Src};

/// The name every merge's staging directory begins with, reserved at a target's top.
pub const STAGING_PREFIX: &str = ".warren-merge-";

/// The largest file merged line by line (8 MiB); larger ones changed on both sides conflict.
pub const MERGE_TEXT_MAX: u64 = 8 * 1024 * 1024;

/// One branch to merge: its name, its tree (the merged view) and what it changed.
#[derive(Debug)]
pub struct BranchInput<'a> {
    /// Shown in steps and conflicts.
    pub name: String,
    /// The branch's tree, where new content is read from.
    pub tree: &'a WorkspaceRoot,
    /// What it changed against the common base ([`crate::branch_changes`]).
    pub changes: Vec<Change>,
}

/// What a merge will do: its steps in order, or the conflicts that keep it from being
/// applied. It holds descriptors of the branches' trees, where [`crate::apply`] streams new
/// content from.
#[derive(Debug)]
pub struct Plan {
    /// The steps, in the order they are applied.
    pub steps: Vec<Step>,
    /// Paths the merge could not decide.
    pub conflicts: Vec<Conflict>,
    /// What each step needs, parallel to `steps`.
    pub(crate) work: Vec<Work>,
    /// The target's entries the plan read, as it read them.
    pub(crate) seen: Vec<(String, Option<Kind>)>,
    /// Each branch's name and tree.
    pub(crate) sources: Vec<(String, WorkspaceRoot)>,
}

impl Plan {
    /// Whether the plan can be applied.
    pub fn is_clean(&self) -> bool {
        self.conflicts.is_empty()
    }
}

/// What one step needs to be carried out.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    Write {
        mode: u32,
        size: u64,
        hash: [u8; 32],
        bytes: Bytes,
    },
    Symlink {
        target: String,
    },
    /// Removes what the plan expects there (a directory only when empty).
    Delete {
        expect: Kind,
    },
    Mkdir {
        mode: u32,
    },
    Chmod {
        mode: u32,
    },
}

/// Plans merging `branches`, in order, into `target`, all of them made from `base`.
///
/// `target` may be `base` itself (merging back into the baseline) or another tree. Ours at a
/// path is the target as the plan's earlier steps leave it, so later branches merge against
/// earlier ones. Paths are read beneath each root's descriptor; nothing is written.
pub fn plan(
    base: &WorkspaceRoot,
    target: &WorkspaceRoot,
    branches: &[BranchInput<'_>],
) -> Result<Plan, MergeError> {
    let mut planner = Planner {
        base: Tree::new(base, "base"),
        branches,
        ours: Ours::new(Tree::new(target, "target")),
        steps: Vec::new(),
        work: Vec::new(),
        conflicts: Vec::new(),
        last: HashMap::new(),
    };
    for index in 0..branches.len() {
        planner.branch(index)?;
    }
    let sources = branches
        .iter()
        .map(|b| {
            // A descriptor of the branch's top of our own, so the plan outlives the borrow.
            let tree = b.tree.subroot("").map_err(MergeError::read("branch"))?;
            Ok((b.name.clone(), tree))
        })
        .collect::<Result<Vec<_>, MergeError>>()?;
    let mut seen: Vec<_> = planner.ours.into_seen().into_iter().collect();
    seen.sort_by(|a, b| path_order(&a.0, &b.0));
    Ok(Plan {
        steps: planner.steps,
        conflicts: planner.conflicts,
        work: planner.work,
        seen,
        sources,
    })
}

struct Planner<'p> {
    base: Tree<'p>,
    branches: &'p [BranchInput<'p>],
    ours: Ours<'p>,
    steps: Vec<Step>,
    work: Vec<Work>,
    conflicts: Vec<Conflict>,
    /// The last step at each path, which a later one may fold into.
    last: HashMap<String, usize>,
}

/// Merges two modes: the side that changed it; the branch's when both did.
fn merge_mode(base: Option<u32>, ours: u32, theirs: u32) -> u32 {
    if base == Some(theirs) {
        ours
    } else {
        theirs
    }
}

impl<'p> Planner<'p> {
    fn tree(&self, branch: usize) -> Tree<'p> {
        Tree::new(self.branches[branch].tree, "branch")
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        branch: usize,
        path: &str,
        mode: u32,
        size: u64,
        hash: [u8; 32],
        bytes: Bytes,
        merged: bool,
    ) -> Result<(), MergeError> {
        let state = State {
            kind: Kind::File { mode, size, hash },
            bytes: Some(bytes.clone()),
        };
        let work = Work::Write {
            mode,
            size,
            hash,
            bytes,
        };
        self.push(path, Action::Write, work, branch, merged, Some(state))
    }

    /// Records a step, folding it into the last one at the same path when one replaces
    /// the other (new content over new content, a mode over new content), and lays its
    /// result over ours.
    fn push(
        &mut self,
        path: &str,
        action: Action,
        work: Work,
        branch: usize,
        merged: bool,
        state: Option<State>,
    ) -> Result<(), MergeError> {
        use Action::{Chmod, Mkdir, Symlink, Write};
        let name = &self.branches[branch].name;
        let fold = self.last.get(path).copied().filter(|&i| {
            matches!(
                (self.steps[i].action, action),
                (Write | Symlink | Chmod, Write | Symlink) | (Write | Chmod | Mkdir, Chmod)
            )
        });
        match fold {
            Some(i) => {
                match (&mut self.work[i], work) {
                    (
                        Work::Write { mode, .. } | Work::Mkdir { mode },
                        Work::Chmod { mode: new },
                    ) => {
                        *mode = new;
                    }
                    (slot, work) => {
                        *slot = work;
                        self.steps[i].action = action;
                    }
                }
                let step = &mut self.steps[i];
                step.merged_lines |= merged;
                if !step.from.contains(name) {
                    step.from.push(name.clone());
                }
            }
            None => {
                self.last.insert(path.to_owned(), self.steps.len());
                self.steps.push(Step {
                    path: path.to_owned(),
                    action,
                    from: vec![name.clone()],
                    merged_lines: merged,
                });
                self.work.push(work);
            }
        }
        self.ours.set(path, state)
    }

    /// A branch that made the very change an earlier branch's step makes: it brought it too.
    fn also_from(&mut self, path: &str, branch: usize) {
        if !self.ours.is_planned(path) {
            return;
        }
        if let Some(&i) = self.last.get(path) {
            let name = &self.branches[branch].name;
            if !self.steps[i].from.contains(name) {
                self.steps[i].from.push(name.clone());
            }
        }
    }

    fn conflict(
        &mut self,
        branch: usize,
        path: &str,
        reason: &'static str,
        base: Option<&Kind>,
        ours: Option<&State>,
        theirs: Option<&Kind>,
    ) -> Result<(), MergeError> {
        let tree = self.tree(branch);
        let conflict = Conflict {
            path: path.to_owned(),
            branch: self.branches[branch].name.clone(),
            reason,
            base: version(self, base, Src::Tree(self.base, path))?,
            ours: version(
                self,
                ours.map(|s| &s.kind),
                Src::Bytes(ours.and_then(|s| s.bytes.as_ref())),
            )?,
            theirs: version(self, theirs, Src::Tree(tree, path))?,
        };
        self.conflicts.push(conflict);
        Ok(())
    }

    fn ours_tree(&self) -> Tree<'p> {
        self.ours.target()
    }
}

impl Load for Planner<'_> {
    /// The content at `src`, checked against the hash the plan knows it by.
    fn load(&self, src: Src<'_>, hash: &[u8; 32], size: u64) -> Result<Vec<u8>, MergeError> {
        let (tree, path) = match src {
            Src::Bytes(Some(Bytes::Memory(bytes))) => return Ok(bytes.as_ref().clone()),
            Src::Bytes(Some(Bytes::Target(path))) => (self.ours_tree(), path.as_str()),
            Src::Bytes(Some(Bytes::Branch(branch, path))) => (self.tree(*branch), path.as_str()),
            Src::Tree(tree, path) => (tree, path),
            // Every file state is made with its bytes' place (`Planner::write`, `Ours::look`).
            Src::Bytes(None) => unreachable!("a file's state always says where its bytes are"),
        };
        let bytes = tree.read_capped(path, size)?.unwrap_or_default();
        if blake3::hash(&bytes).as_bytes() != hash {
            return Err(MergeError::ChangedWhilePlanning {
                tree: tree.name,
                path: path.to_owned(),
            });
        }
        Ok(bytes)
    }
}

/// Refuses a change path no tree entry can have, and the reserved staging names.
fn check_path(path: &str) -> Result<(), MergeError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\0'));
    if bad {
        return Err(MergeError::InvalidChange {
            path: path.chars().take(200).collect(),
        });
    }
    if path.starts_with(STAGING_PREFIX) {
        return Err(MergeError::ReservedName {
            path: path.to_owned(),
        });
    }
    Ok(())
}
