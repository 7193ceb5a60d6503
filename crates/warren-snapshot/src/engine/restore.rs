//! Restoring a snapshot: the tree is built beside the target, every chunk's hash checked,
//! then swapped in with one `RENAME_EXCHANGE`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;

use warren_fs::{FsError, WorkspaceRoot};

use super::chunking::extents_between;
use super::{join, join_os, shown, SnapshotLimits, MAX_CHUNK};
use crate::fetch::{with_feed, ChunkFeed, Plan};
use crate::manifest::ChunkRef;
use crate::pack::PackIndex;
use crate::{EntryKind, Manifest, ManifestEntry, ObjectStore, SnapshotError};

/// Puts the tree `base` back as the snapshot `id` recorded it.
///
/// Everything is built in a temporary directory next to `base` (every chunk's hash
/// checked as it is written), then swapped in with one `RENAME_EXCHANGE`, and the old tree
/// removed. On any error the temporary directory is removed and `base` is untouched.
/// Sparse files come back sparse: their holes are skipped, not written.
pub fn restore(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
) -> Result<(), SnapshotError> {
    restore_with(root, base, store, id, &SnapshotLimits::default())
}

/// [`restore`] that a cancel or passed deadline in `limits` stops (leaving `base` as it
/// was).
pub fn restore_with(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
    limits: &SnapshotLimits,
) -> Result<(), SnapshotError> {
    restore_tree(root, base, store, id, limits, Durability::Synced)
}

/// [`restore_with`] into a tree nothing relies on after a crash: a runtime's seed, which a
/// crash of the node makes useless (its runtime dies with it) and the next start restores
/// from the store again. The tree is not synced to disk before it is swapped in, so the
/// restore costs what fetching and writing cost, not the disk's write-back as well.
pub fn restore_transient_with(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
    limits: &SnapshotLimits,
) -> Result<(), SnapshotError> {
    restore_tree(root, base, store, id, limits, Durability::Transient)
}

/// Whether a restored tree is made durable before it is swapped in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    Synced,
    Transient,
}

fn restore_tree(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
    limits: &SnapshotLimits,
    durability: Durability,
) -> Result<(), SnapshotError> {
    limits.check()?;
    let manifest = Manifest::load(store, id)?;
    let (parent, name) = base.rsplit_once('/').unwrap_or(("", base));
    let staging = join(
        parent,
        &format!(".{name}.warren-restore-{}", uuid::Uuid::new_v4().simple()),
    );
    root.mkdir_p(&staging)?;
    // Durable before it is swapped in: a crash after the swap must not leave a tree of
    // empty files.
    let built = build(root, &staging, store, &manifest, limits).and_then(|()| {
        if durability == Durability::Synced {
            root.sync_filesystem()?;
        }
        Ok(())
    });
    if let Err(error) = built {
        let _ = root.remove(&staging, true);
        return Err(error);
    }
    let swapped = match root.stat(base) {
        Ok(_) => root.exchange(base, &staging),
        // The tree is gone altogether: the rebuilt one simply takes its place.
        Err(FsError::NotFound { .. }) => root.rename(&staging, base, false).map(|()| {
            let _ = root.mkdir_p(&staging);
        }),
        Err(error) => Err(error),
    };
    if let Err(error) = swapped {
        let _ = root.remove(&staging, true);
        return Err(error.into());
    }
    // `staging` now holds the old tree. The new one is in place whatever happens next.
    if let Err(error) = root.remove(&staging, true) {
        tracing::warn!(%error, "could not remove the replaced tree after a restore");
    }
    Ok(())
}

fn build(
    root: &WorkspaceRoot,
    staging: &str,
    store: &dyn ObjectStore,
    manifest: &Manifest,
    limits: &SnapshotLimits,
) -> Result<(), SnapshotError> {
    let by_path: HashMap<&OsStr, &ManifestEntry> = manifest
        .entries
        .iter()
        .map(|entry| (entry.path.as_os_str(), entry))
        .collect();
    // Every chunk is placed before anything is written: one the store lacks fails now.
    let writes_content = |entry: &ManifestEntry| {
        entry.kind == EntryKind::File
            && !entry
                .link_to
                .as_ref()
                .is_some_and(|first| by_path.contains_key(first.as_os_str()))
    };
    let needed = || {
        manifest
            .entries
            .iter()
            .filter(|entry| writes_content(entry))
            .flat_map(|entry| {
                entry
                    .chunks
                    .iter()
                    .map(|chunk| (chunk, entry.path.as_os_str()))
            })
    };
    let plan = match Plan::new(&PackIndex::load(store)?, needed()) {
        // A collector elsewhere may have moved a chunk to a new pack between this
        // restore's listing of the indexes and of the packs: look once more.
        Err(SnapshotError::MissingChunk { .. }) => Plan::new(&PackIndex::load(store)?, needed())?,
        plan => plan?,
    };
    with_feed(store, plan, |feed| {
        build_with(root, staging, manifest, &by_path, feed, limits)
    })
}

fn build_with(
    root: &WorkspaceRoot,
    staging: &str,
    manifest: &Manifest,
    by_path: &HashMap<&OsStr, &ManifestEntry>,
    feed: &mut ChunkFeed<'_>,
    limits: &SnapshotLimits,
) -> Result<(), SnapshotError> {
    let mut restorer = Restorer::new()?;
    // Parents come before children in a manifest, so one pass creates everything.
    for entry in &manifest.entries {
        if entry.path.is_empty() {
            continue;
        }
        limits.check()?;
        let path = join_os(staging, &entry.path);
        match entry.kind {
            EntryKind::Dir => {
                root.mkdir_p(&path)?;
            }
            EntryKind::Symlink => {
                root.create_symlink(&path, entry.target.as_deref().unwrap_or_default())?;
            }
            EntryKind::File => match &entry.link_to {
                Some(first) if by_path.contains_key(first.as_os_str()) => {
                    root.create_hardlink(&join_os(staging, first), &path)?;
                }
                _ => write_file(
                    root,
                    &path,
                    &shown(&entry.path),
                    entry,
                    feed,
                    &mut restorer,
                    limits,
                )?,
            },
        }
    }
    // Attributes last, children before parents: a read-only directory is made read-only
    // only once nothing more is written into it, and no write disturbs a parent's time.
    for entry in manifest.entries.iter().rev() {
        let path = join_os(staging, &entry.path);
        let mode = (entry.kind != EntryKind::Symlink).then_some(entry.mode);
        if entry.link_to.is_some() {
            continue;
        }
        root.set_attributes(&path, mode, entry.modified_unix_ms)?;
    }
    Ok(())
}

fn write_file(
    root: &WorkspaceRoot,
    path: &OsStr,
    shown: &str,
    entry: &ManifestEntry,
    feed: &mut ChunkFeed<'_>,
    scratch: &mut Restorer,
    limits: &SnapshotLimits,
) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: shown.to_owned(),
        source,
    };
    let file = root.create_file(path, 0o600)?;
    // A dense file (every manifest of version 1) is one extent from 0, as long as its
    // chunks; a sparse one's chunks fill the extents between its holes.
    let mut extents = if entry.holes.is_empty() {
        vec![(0, u64::MAX)]
    } else {
        extents_between(&entry.holes, entry.size).ok_or_else(|| SnapshotError::Corrupt {
            what: "manifest entry",
            hash: shown.to_owned(),
        })?
    }
    .into_iter();
    let mut extent = extents.next();
    for chunk in &entry.chunks {
        limits.check()?;
        let compressed = feed.next(chunk, shown)?;
        let mut bytes = scratch.decompress(compressed, chunk)?;
        while !bytes.is_empty() {
            let Some((offset, len)) = extent.as_mut() else {
                return Err(SnapshotError::Corrupt {
                    what: "manifest entry",
                    hash: shown.to_owned(),
                });
            };
            let take = usize::try_from(*len).unwrap_or(usize::MAX).min(bytes.len());
            file.write_all_at(&bytes[..take], *offset).map_err(io)?;
            *offset += take as u64;
            *len -= take as u64;
            bytes = &bytes[take..];
            if *len == 0 {
                extent = extents.next();
            }
        }
    }
    if !entry.holes.is_empty() {
        // A trailing hole is only a length.
        file.set_len(entry.size).map_err(io)?;
    }
    Ok(())
}

/// One decompression context and one output buffer for a whole restore: chunks are
/// decompressed into the same memory, checked, written, and the memory reused.
pub(crate) struct Restorer {
    decompressor: zstd::bulk::Decompressor<'static>,
    buffer: Vec<u8>,
}

impl Restorer {
    fn new() -> Result<Self, SnapshotError> {
        Ok(Self {
            decompressor: zstd::bulk::Decompressor::new()
                .map_err(|e| SnapshotError::store("start decompressing", e))?,
            buffer: Vec::with_capacity(MAX_CHUNK),
        })
    }

    /// The chunk's bytes, if they decompress to exactly its length and hash.
    fn decompress(&mut self, compressed: &[u8], chunk: &ChunkRef) -> Result<&[u8], SnapshotError> {
        let corrupt = || SnapshotError::Corrupt {
            what: "chunk",
            hash: chunk.hash.clone(),
        };
        self.buffer.clear();
        self.buffer.reserve(chunk.len as usize);
        let written = self
            .decompressor
            .decompress_to_buffer(compressed, &mut self.buffer)
            .map_err(|_| corrupt())?;
        if written != chunk.len as usize
            || blake3::hash(&self.buffer).to_hex().as_str() != chunk.hash
        {
            return Err(corrupt());
        }
        Ok(&self.buffer)
    }
}
