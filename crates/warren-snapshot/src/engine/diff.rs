//! Comparing a tree with a snapshot of it: paths added, removed and changed.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use serde::Serialize;
use warren_fs::{Kind, WorkspaceRoot};

use super::chunking::chunk_file;
use super::{join_os, shown, walk, Budget, SnapshotLimits};
use crate::{EntryKind, Manifest, ManifestEntry, ObjectStore, SnapshotError};

/// What changed in a tree since a snapshot, as paths relative to the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Diff {
    /// In the tree now, not in the snapshot.
    pub added: Vec<String>,
    /// In the snapshot, not in the tree now.
    pub removed: Vec<String>,
    /// In both, with other content, type, mode or link target.
    pub changed: Vec<String>,
}

/// Compares the tree `base` with the snapshot `id`. A file whose size and time match is
/// taken as unchanged; otherwise its content is chunked and compared, so a touched but
/// identical file is not reported. Bounded by the default [`SnapshotLimits`].
pub fn diff(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
) -> Result<Diff, SnapshotError> {
    diff_with(root, base, store, id, &SnapshotLimits::default())
}

/// [`diff`] within `limits`: the content it reads to compare counts against
/// `limits.max_bytes`, and a cancel or passed deadline stops it.
pub fn diff_with(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
    limits: &SnapshotLimits,
) -> Result<Diff, SnapshotError> {
    limits.check()?;
    let mut budget = Budget { limits, used: 0 };
    let mut scratch = Vec::new();
    let manifest = Manifest::load(store, id)?;
    let before: BTreeMap<&OsStr, &ManifestEntry> = manifest
        .entries
        .iter()
        .map(|entry| (entry.path.as_os_str(), entry))
        .collect();
    let now = walk(root, base)?;
    let mut result = Diff::default();
    let mut seen = std::collections::HashSet::new();
    for (relative, entry) in &now {
        if relative.is_empty() || entry.kind == Kind::Other {
            continue;
        }
        seen.insert(relative.as_os_str());
        let Some(old) = before.get(relative.as_os_str()) else {
            result.added.push(shown(relative));
            continue;
        };
        let same_kind = matches!(
            (old.kind, entry.kind),
            (EntryKind::File, Kind::File)
                | (EntryKind::Dir, Kind::Dir)
                | (EntryKind::Symlink, Kind::Symlink)
        );
        let changed = if !same_kind {
            true
        } else {
            match old.kind {
                EntryKind::Dir => old.mode != entry.mode,
                EntryKind::Symlink => old.target != entry.os_symlink_target,
                EntryKind::File => {
                    let recorded = match &old.link_to {
                        Some(first) => before.get(first.as_os_str()).copied(),
                        None => Some(*old),
                    };
                    if old.mode != entry.mode || old.size != entry.size {
                        true
                    } else if old.modified_unix_ms == entry.modified_unix_ms {
                        false
                    } else {
                        match recorded {
                            None => true,
                            Some(recorded) => match chunk_file(
                                root,
                                &join_os(base, relative),
                                &shown(relative),
                                entry.size,
                                &mut budget,
                                &mut scratch,
                                None,
                            ) {
                                Ok((chunks, holes)) => {
                                    chunks != recorded.chunks || holes != recorded.holes
                                }
                                // Too much to compare, or stopped: that is the answer.
                                Err(
                                    error @ (SnapshotError::TooLarge { .. }
                                    | SnapshotError::Cancelled { .. }),
                                ) => return Err(error),
                                Err(_) => true,
                            },
                        }
                    }
                }
            }
        };
        if changed {
            result.changed.push(shown(relative));
        }
    }
    for entry in &manifest.entries {
        if !entry.path.is_empty() && !seen.contains(entry.path.as_os_str()) {
            result.removed.push(shown(&entry.path));
        }
    }
    Ok(result)
}
