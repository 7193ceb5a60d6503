//! "Ours" while planning: the target as it is now with the plan's earlier steps laid over
//! it, without touching the target.
//!
//! The target is read lazily, one path at a time, and every read is remembered (`seen`): the
//! apply checks those very paths again before it commits, so a target that changed since
//! the plan was made is refused rather than merged blindly.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::error::MergeError;
use crate::model::{parent, Kind};
use crate::read::Tree;

/// Where a file's bytes are.
#[derive(Debug, Clone)]
pub(crate) enum Bytes {
    /// The target's own file at this path.
    Target(String),
    /// Branch number `.0`'s file at path `.1`.
    Branch(usize, String),
    /// Merged text made by the plan.
    Memory(Arc<Vec<u8>>),
}

/// What a path holds, and for a file where its bytes are.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) kind: Kind,
    pub(crate) bytes: Option<Bytes>,
}

/// One path as ours sees it.
#[derive(Debug, Clone)]
pub(crate) struct Look {
    pub(crate) state: Option<State>,
    /// Whether the target's real entries beneath this path are still there (a real
    /// directory, not one the plan removed or made anew).
    real_below: bool,
}

/// A planned result at one path.
#[derive(Debug)]
struct Over {
    state: Option<State>,
    real_below: bool,
}

/// The target with the plan laid over it.
pub(crate) struct Ours<'t> {
    target: Tree<'t>,
    seen: HashMap<String, Option<Kind>>,
    over: HashMap<String, Over>,
    /// Planned paths by their parent, to tell whether a directory ends up empty.
    children: HashMap<String, BTreeSet<String>>,
}

impl<'t> Ours<'t> {
    pub(crate) fn new(target: Tree<'t>) -> Self {
        Self {
            target,
            seen: HashMap::new(),
            over: HashMap::new(),
            children: HashMap::new(),
        }
    }

    /// What `path` holds in ours. A path beneath something that is not a directory, or
    /// beneath a directory the plan made anew, holds nothing unless the plan put it there.
    pub(crate) fn look(&mut self, path: &str) -> Result<Look, MergeError> {
        if let Some(over) = self.over.get(path) {
            return Ok(Look {
                state: over.state.clone(),
                real_below: over.real_below,
            });
        }
        let up = parent(path);
        if !up.is_empty() {
            let above = self.look(up)?;
            let is_dir = above.state.as_ref().is_some_and(|s| s.kind.is_dir());
            if !is_dir || !above.real_below {
                return Ok(Look {
                    state: None,
                    real_below: false,
                });
            }
        }
        let kind = self.real(path)?;
        Ok(Look {
            real_below: kind.as_ref().is_some_and(Kind::is_dir),
            state: kind.map(|kind| State {
                bytes: matches!(kind, Kind::File { .. }).then(|| Bytes::Target(path.to_owned())),
                kind,
            }),
        })
    }

    /// Lays a planned result over `path`.
    pub(crate) fn set(&mut self, path: &str, state: Option<State>) -> Result<(), MergeError> {
        let before = self.look(path)?;
        // Only a directory that stays the real one (a mode change) keeps its real entries.
        let real_below = before.real_below && state.as_ref().is_some_and(|s| s.kind.is_dir());
        self.over
            .insert(path.to_owned(), Over { state, real_below });
        self.children
            .entry(parent(path).to_owned())
            .or_default()
            .insert(path.to_owned());
        Ok(())
    }

    /// The target itself.
    pub(crate) fn target(&self) -> Tree<'t> {
        self.target
    }

    /// Whether the plan has laid something over `path`.
    pub(crate) fn is_planned(&self, path: &str) -> bool {
        self.over.contains_key(path)
    }

    /// Whether the directory `path` holds nothing in ours (names only: nothing is hashed).
    pub(crate) fn is_empty(&mut self, path: &str) -> Result<bool, MergeError> {
        let look = self.look(path)?;
        let mut names: BTreeSet<String> = self.children.get(path).cloned().unwrap_or_default();
        if look.real_below {
            names.extend(self.target.children(path)?.into_iter().map(|e| e.path));
        }
        Ok(names.iter().all(|name| match self.over.get(name) {
            Some(over) => over.state.is_none(),
            None => false,
        }))
    }

    /// The target's real entry at `path`, read once and remembered.
    fn real(&mut self, path: &str) -> Result<Option<Kind>, MergeError> {
        if let Some(kind) = self.seen.get(path) {
            return Ok(kind.clone());
        }
        let kind = self.target.kind_at(path)?;
        self.seen.insert(path.to_owned(), kind.clone());
        Ok(kind)
    }

    /// Every real entry the plan read, for the apply to check again.
    pub(crate) fn into_seen(self) -> HashMap<String, Option<Kind>> {
        self.seen
    }
}
