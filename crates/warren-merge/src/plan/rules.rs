//! The three-way rules per path, as [`Planner`] methods: what is taken, what is merged,
//! what conflicts (the module above lists them).

use std::sync::Arc;

use crate::error::MergeError;
use crate::lines::{merge_text, TextMerge};
use crate::model::{ancestors, is_beneath, path_order, Action, Change, Kind};
use crate::ours::{Bytes, State};
use crate::read::is_text;
use crate::version::{Load, Src};

use super::{check_path, merge_mode, Planner, Work, MERGE_TEXT_MAX};

impl Planner<'_> {
    /// Merges one branch's changes: additions and modifications parents first, then
    /// directories it removed (or turned into something else) children first.
    pub(super) fn branch(&mut self, branch: usize) -> Result<(), MergeError> {
        let mut changes: Vec<&Change> = self.branches[branch].changes.iter().collect();
        changes.sort_by(|a, b| path_order(&a.path, &b.path));
        let mut blocked: Vec<String> = Vec::new();
        let mut removed_dirs = Vec::new();
        for change in changes {
            check_path(&change.path)?;
            if blocked.iter().any(|dir| is_beneath(&change.path, dir)) {
                continue;
            }
            let was_dir = change.before.as_ref().is_some_and(Kind::is_dir);
            if was_dir && !change.after.as_ref().is_some_and(Kind::is_dir) {
                removed_dirs.push(change);
                continue;
            }
            self.change(branch, change, &mut blocked)?;
        }
        for change in removed_dirs.into_iter().rev() {
            if !blocked.iter().any(|dir| is_beneath(&change.path, dir)) {
                self.removed_dir(branch, change, &mut blocked)?;
            }
        }
        Ok(())
    }

    fn change(
        &mut self,
        branch: usize,
        change: &Change,
        blocked: &mut Vec<String>,
    ) -> Result<(), MergeError> {
        let path = change.path.as_str();
        let (base, theirs) = (change.before.as_ref(), change.after.as_ref());
        if base == theirs {
            return Ok(());
        }
        if theirs.is_some() && !self.parents(branch, path, blocked)? {
            return Ok(());
        }
        let ours = self.ours.look(path)?.state;
        let ours_kind = ours.as_ref().map(|s| &s.kind);
        if ours_kind == theirs {
            self.also_from(path, branch);
            return Ok(());
        }
        if ours_kind == base {
            return self.take(branch, path, ours.as_ref(), theirs);
        }
        if let Some(state) = &ours {
            let sides = (
                FileSide::of(base),
                FileSide::of(Some(&state.kind)),
                FileSide::of(theirs),
            );
            if let (Some(b), Some(o), Some(t)) = sides {
                let state = state.clone();
                return self.files(branch, change, &state, [b, o, t], blocked);
            }
        }
        let reason = match (base, ours.as_ref(), theirs) {
            (
                _,
                Some(State {
                    kind: Kind::Dir { mode: o },
                    ..
                }),
                Some(Kind::Dir { mode: t }),
            ) => {
                let base_mode = base.filter(|b| b.is_dir()).and_then(Kind::mode);
                let mode = merge_mode(base_mode, *o, *t);
                let state = State {
                    kind: Kind::Dir { mode },
                    bytes: None,
                };
                return self.push(
                    path,
                    Action::Chmod,
                    Work::Chmod { mode },
                    branch,
                    false,
                    Some(state),
                );
            }
            (None, Some(_), Some(_)) => "both added different files",
            (Some(_), None, Some(_)) => "deleted here, changed there",
            (Some(_), Some(_), None) => "changed here, deleted there",
            (
                Some(Kind::Symlink { .. }),
                Some(State {
                    kind: Kind::Symlink { .. },
                    ..
                }),
                Some(Kind::Symlink { .. }),
            ) => "both changed the link target",
            _ => "type changed",
        };
        self.conflict(branch, path, reason, base, ours.as_ref(), theirs)?;
        blocked.push(path.to_owned());
        Ok(())
    }

    /// A file both sides changed: `b`, `o` and `t` are base, ours and theirs.
    fn files(
        &mut self,
        branch: usize,
        change: &Change,
        ours: &State,
        [b, o, t]: [FileSide; 3],
        blocked: &mut Vec<String>,
    ) -> Result<(), MergeError> {
        let path = change.path.as_str();
        let mode = merge_mode(Some(b.mode), o.mode, t.mode);
        if o.hash == t.hash || t.hash == b.hash {
            // The content is ours already: at most the mode changes.
            if mode != o.mode {
                let kind = Kind::File {
                    mode,
                    size: o.size,
                    hash: o.hash,
                };
                let state = State {
                    kind,
                    bytes: ours.bytes.clone(),
                };
                self.push(
                    path,
                    Action::Chmod,
                    Work::Chmod { mode },
                    branch,
                    false,
                    Some(state),
                )?;
            }
            return Ok(());
        }
        if o.hash == b.hash {
            let bytes = Bytes::Branch(branch, path.to_owned());
            return self.write(branch, path, mode, t.size, t.hash, bytes, false);
        }
        let reason = if [b.size, o.size, t.size]
            .iter()
            .any(|size| *size > MERGE_TEXT_MAX)
        {
            "too large to merge"
        } else {
            let tree = self.tree(branch);
            let base_text = self.load(Src::Tree(self.base, path), &b.hash, b.size)?;
            let ours_text = self.load(Src::Bytes(ours.bytes.as_ref()), &o.hash, o.size)?;
            let theirs_text = self.load(Src::Tree(tree, path), &t.hash, t.size)?;
            match (text(&base_text), text(&ours_text), text(&theirs_text)) {
                (Some(base), Some(ours), Some(theirs)) => match merge_text(base, ours, theirs) {
                    TextMerge::Merged(merged) => {
                        let merged = merged.into_bytes();
                        let hash = *blake3::hash(&merged).as_bytes();
                        let size = merged.len() as u64;
                        let bytes = Bytes::Memory(Arc::new(merged));
                        return self.write(branch, path, mode, size, hash, bytes, true);
                    }
                    TextMerge::Conflict(reason) => reason,
                },
                _ => "binary changed on both sides",
            }
        };
        self.conflict(
            branch,
            path,
            reason,
            change.before.as_ref(),
            Some(ours),
            change.after.as_ref(),
        )?;
        blocked.push(path.to_owned());
        Ok(())
    }

    /// A directory the branch removed or turned into a file or link, after its entries.
    fn removed_dir(
        &mut self,
        branch: usize,
        change: &Change,
        blocked: &mut Vec<String>,
    ) -> Result<(), MergeError> {
        let path = change.path.as_str();
        let theirs = change.after.as_ref();
        let ours = self.ours.look(path)?.state;
        match ours.as_ref().map(|s| &s.kind) {
            None if theirs.is_none() => Ok(()),
            None => {
                if self.parents(branch, path, blocked)? {
                    self.take(branch, path, None, theirs)?;
                }
                Ok(())
            }
            Some(Kind::Dir { .. }) if self.ours.is_empty(path)? => {
                self.take(branch, path, ours.as_ref(), theirs)
            }
            // Something is left in it (the target's or an earlier branch's): it stays.
            Some(Kind::Dir { .. }) if theirs.is_none() => Ok(()),
            Some(kind) if Some(kind) == theirs => {
                self.also_from(path, branch);
                Ok(())
            }
            Some(kind) => {
                let reason = match (kind, theirs) {
                    (Kind::Dir { .. }, _) => "type changed",
                    (_, None) => "changed here, deleted there",
                    (_, Some(_)) => "type changed",
                };
                self.conflict(
                    branch,
                    path,
                    reason,
                    change.before.as_ref(),
                    ours.as_ref(),
                    theirs,
                )?;
                blocked.push(path.to_owned());
                Ok(())
            }
        }
    }

    /// Makes sure every ancestor of `path` is a directory in ours, making again (with the
    /// branch's mode) one the target removed. A file or link where the branch has a
    /// directory is a conflict at that ancestor, and the branch's paths beneath it wait.
    fn parents(
        &mut self,
        branch: usize,
        path: &str,
        blocked: &mut Vec<String>,
    ) -> Result<bool, MergeError> {
        for dir in ancestors(path) {
            let ours = self.ours.look(dir)?.state;
            match ours.as_ref().map(|s| &s.kind) {
                Some(Kind::Dir { .. }) => {}
                None => {
                    let Some(Kind::Dir { mode }) = self.tree(branch).kind_at(dir)? else {
                        return Err(MergeError::ChangedWhilePlanning {
                            tree: "branch",
                            path: dir.to_owned(),
                        });
                    };
                    let state = State {
                        kind: Kind::Dir { mode },
                        bytes: None,
                    };
                    self.push(
                        dir,
                        Action::Mkdir,
                        Work::Mkdir { mode },
                        branch,
                        false,
                        Some(state),
                    )?;
                }
                Some(_) => {
                    let base = self.base.kind_at(dir)?;
                    let theirs = self.tree(branch).kind_at(dir)?;
                    self.conflict(
                        branch,
                        dir,
                        "type changed",
                        base.as_ref(),
                        ours.as_ref(),
                        theirs.as_ref(),
                    )?;
                    blocked.push(dir.to_owned());
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Takes the branch's side at `path`, where ours is still the base.
    fn take(
        &mut self,
        branch: usize,
        path: &str,
        ours: Option<&State>,
        theirs: Option<&Kind>,
    ) -> Result<(), MergeError> {
        let ours_kind = ours.map(|s| &s.kind);
        let ours_dir = ours_kind.is_some_and(Kind::is_dir);
        let theirs_dir = theirs.is_some_and(Kind::is_dir);
        // A directory and anything else never replace each other by a rename.
        if let Some(kind) = ours_kind.filter(|_| theirs.is_none() || ours_dir != theirs_dir) {
            let work = Work::Delete {
                expect: kind.clone(),
            };
            self.push(path, Action::Delete, work, branch, false, None)?;
        }
        let Some(theirs) = theirs else {
            return Ok(());
        };
        let state = Some(State {
            kind: theirs.clone(),
            bytes: None,
        });
        match theirs {
            Kind::File { mode, size, hash } => match ours {
                Some(State {
                    kind:
                        Kind::File {
                            hash: ours_hash, ..
                        },
                    bytes,
                }) if ours_hash == hash => {
                    let state = State {
                        kind: theirs.clone(),
                        bytes: bytes.clone(),
                    };
                    let work = Work::Chmod { mode: *mode };
                    self.push(path, Action::Chmod, work, branch, false, Some(state))
                }
                _ => {
                    let bytes = Bytes::Branch(branch, path.to_owned());
                    self.write(branch, path, *mode, *size, *hash, bytes, false)
                }
            },
            Kind::Symlink { target } => {
                let work = Work::Symlink {
                    target: target.clone(),
                };
                self.push(path, Action::Symlink, work, branch, false, state)
            }
            Kind::Dir { mode } if ours_dir => self.push(
                path,
                Action::Chmod,
                Work::Chmod { mode: *mode },
                branch,
                false,
                state,
            ),
            Kind::Dir { mode } => self.push(
                path,
                Action::Mkdir,
                Work::Mkdir { mode: *mode },
                branch,
                false,
                state,
            ),
        }
    }
}

/// The text of `bytes` when a line merge can take it.
fn text(bytes: &[u8]) -> Option<&str> {
    is_text(bytes)
        .then(|| std::str::from_utf8(bytes).ok())
        .flatten()
}

/// A file's mode, size and hash.
#[derive(Debug, Clone, Copy)]
struct FileSide {
    mode: u32,
    size: u64,
    hash: [u8; 32],
}

impl FileSide {
    fn of(kind: Option<&Kind>) -> Option<Self> {
        match kind {
            Some(Kind::File { mode, size, hash }) => Some(Self {
                mode: *mode,
                size: *size,
                hash: *hash,
            }),
            _ => None,
        }
    }
}
