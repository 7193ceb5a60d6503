//! What a tree changed against its baseline: [`tree_changes`] compares two whole trees,
//! [`branch_changes`] looks only where an overlay's upper directory says something may have
//! changed, and both give the same answer for an overlay (the tests hold them to it).

use std::collections::{BTreeMap, BTreeSet};

use warren_fs::{Entry, Kind as FsKind, WorkspaceRoot};

use crate::error::MergeError;
use crate::model::{path_order, Change};
use crate::read::Tree;

/// Each path's entry in the baseline and in the other tree.
type Pairs = BTreeMap<String, (Option<Entry>, Option<Entry>)>;

/// Every difference between `base` and `other`, sorted by path ([`path_order`]): files whose
/// content (BLAKE3), mode or type differ, links whose target differs, and directories added,
/// removed or with another mode. A removed directory's files are listed too, and so are an
/// added one's. Both trees are read whole and every file is hashed: this is the fallback
/// when no overlay narrows the question, and the oracle of [`branch_changes`].
pub fn tree_changes(
    base: &WorkspaceRoot,
    other: &WorkspaceRoot,
) -> Result<Vec<Change>, MergeError> {
    let base = Tree::new(base, "base");
    let other = Tree::new(other, "other");
    let mut pairs = Pairs::new();
    for entry in base.walk("")? {
        let path = entry.path.clone();
        pairs.entry(path).or_default().0 = Some(entry);
    }
    for entry in other.walk("")? {
        let path = entry.path.clone();
        pairs.entry(path).or_default().1 = Some(entry);
    }
    compare(&base, &other, pairs)
}

/// What `branch` (an overlay's merged view) changed against `base` (its lower directory),
/// looking only where `upper` (its upper directory) says something may have changed.
///
/// Every entry of `upper` is a candidate, whiteouts included (they are read as names only).
/// For every directory of `upper` (and its top), the listings of `base` and `branch` there
/// are compared too, which finds removals (whiteouts) and opaque directories without reading
/// overlay attributes. A directory that appears (or disappears) is walked whole in the tree
/// that has it, which also covers a directory renamed with `redirect_dir`. A candidate that is
/// equal in both trees (a copy-up that changed nothing) is not a change. Sorted by path.
pub fn branch_changes(
    base: &WorkspaceRoot,
    upper: &WorkspaceRoot,
    branch: &WorkspaceRoot,
) -> Result<Vec<Change>, MergeError> {
    let base = Tree::new(base, "base");
    let upper = Tree::new(upper, "upper");
    let branch = Tree::new(branch, "branch");

    let mut candidates = BTreeSet::new();
    let mut dirs = vec![String::new()];
    for entry in upper.walk("")? {
        if entry.os_path.to_str().is_none() {
            return Err(MergeError::NotUtf8 {
                tree: upper.name,
                path: entry.path,
            });
        }
        if entry.kind == FsKind::Dir {
            dirs.push(entry.path.clone());
        }
        candidates.insert(entry.path);
    }
    for dir in &dirs {
        let names = |tree: &Tree<'_>| -> Result<BTreeSet<String>, MergeError> {
            Ok(tree.children(dir)?.into_iter().map(|e| e.path).collect())
        };
        let (in_base, in_branch) = (names(&base)?, names(&branch)?);
        candidates.extend(in_base.symmetric_difference(&in_branch).cloned());
    }

    // A string order puts every directory before its descendants, so a directory that
    // appeared or disappeared is expanded before any of its entries is looked at alone.
    let mut pairs = Pairs::new();
    for path in candidates {
        if pairs.contains_key(&path) {
            continue;
        }
        let before = base.describe(&path)?;
        let after = branch.describe(&path)?;
        let is_dir = |e: &Option<Entry>| e.as_ref().is_some_and(|e| e.kind == FsKind::Dir);
        if is_dir(&before) && !is_dir(&after) {
            for entry in base.walk(&path)? {
                pairs
                    .entry(entry.path.clone())
                    .or_insert((Some(entry), None));
            }
        }
        if is_dir(&after) && !is_dir(&before) {
            for entry in branch.walk(&path)? {
                pairs
                    .entry(entry.path.clone())
                    .or_insert((None, Some(entry)));
            }
        }
        pairs.insert(path, (before, after));
    }
    compare(&base, &branch, pairs)
}

/// The changes among `pairs`: each side's [`crate::Kind`] (files hashed), kept when they
/// differ.
fn compare(base: &Tree<'_>, other: &Tree<'_>, pairs: Pairs) -> Result<Vec<Change>, MergeError> {
    let mut changes = Vec::new();
    for (path, (before, after)) in pairs {
        let before = before.map(|e| base.kind_of(&e)).transpose()?;
        let after = after.map(|e| other.kind_of(&e)).transpose()?;
        if before != after {
            changes.push(Change {
                path,
                before,
                after,
            });
        }
    }
    changes.sort_by(|a, b| path_order(&a.path, &b.path));
    Ok(changes)
}
