//! Taking a snapshot: the walker records every entry and cuts changed files into chunks
//! while an uploader thread compresses and packs them; the manifest is written last.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};

use warren_fs::{Entry, Kind, WorkspaceRoot};

use super::chunking::{chunk_file, recorded_data_bytes, Known, Upload};
use super::{
    join_os, shown, walk, Budget, SnapshotLimits, SnapshotStats, PACKS_PER_INDEX, ZSTD_LEVEL,
};
use crate::pack::{save_index, PackIndex, PackWriter};
use crate::{EntryKind, Manifest, ManifestEntry, ObjectStore, SnapshotError};

/// Compresses chunks into packs until the channel closes, writing each pack and, every
/// [`PACKS_PER_INDEX`] packs and at the end, an index naming them (so a snapshot stopped
/// later still leaves reusable chunks); returns (chunks written, compressed bytes written).
fn uploader(
    store: &dyn ObjectStore,
    receiver: std::sync::mpsc::Receiver<Upload>,
) -> Result<(u64, u64), SnapshotError> {
    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)
        .map_err(|e| SnapshotError::store("start compressing", e))?;
    let mut packs = PackWriter::new(store);
    // Packs written since the last index: one index per few packs, not per pack (each is
    // an object to create), and every pack indexed before the manifest.
    let mut unindexed = Vec::new();
    for upload in receiver {
        let len = u32::try_from(upload.data.len()).unwrap_or(u32::MAX);
        let packed = packs.add_with(upload.hash, len, upload.data.len(), |pack| {
            compressor.compress_to_buffer(&upload.data, pack)
        })?;
        unindexed.extend(packed);
        if unindexed.len() >= PACKS_PER_INDEX {
            save_index(store, std::mem::take(&mut unindexed))?;
        }
    }
    unindexed.extend(packs.flush()?);
    if !unindexed.is_empty() {
        save_index(store, unindexed)?;
    }
    Ok((packs.chunks_written, packs.bytes_written))
}

/// The parent snapshot's entries by path, for reusing unchanged files' chunk lists.
fn parent_entries(
    store: &dyn ObjectStore,
    parent: Option<&str>,
) -> HashMap<OsString, ManifestEntry> {
    let Some(id) = parent else {
        return HashMap::new();
    };
    match Manifest::load(store, id) {
        Ok(manifest) => manifest
            .entries
            .into_iter()
            .filter(|entry| entry.kind == EntryKind::File && entry.link_to.is_none())
            .map(|entry| (entry.path.clone(), entry))
            .collect(),
        Err(error) => {
            tracing::warn!(%error, "the parent snapshot cannot be read; reading every file");
            HashMap::new()
        }
    }
}

/// The parent's chunk list for a file that has not changed since, if its chunks are all
/// still in the store.
fn unchanged_chunks(
    known: &Known,
    parent: &HashMap<OsString, ManifestEntry>,
    relative: &OsStr,
    entry: &Entry,
) -> Result<Option<ManifestEntry>, SnapshotError> {
    let Some(old) = parent.get(relative) else {
        return Ok(None);
    };
    let same = old.size == entry.size
        && old.modified_unix_ms == entry.modified_unix_ms
        && old.inode == entry.inode
        && old.changed_unix_ns == entry.changed_unix_ns
        && old.changed_unix_ns != 0;
    if !same {
        return Ok(None);
    }
    if !old
        .chunks
        .iter()
        .all(|chunk| known.index.contains(&chunk.hash))
    {
        return Ok(None);
    }
    Ok(Some(old.clone()))
}

/// Snapshots the tree `base` (relative to `root`; empty for the whole root) into `store`
/// and returns the manifest's id. With a `parent` snapshot of the same tree, files whose
/// inode, size, modification and status-change times are unchanged are not read again.
///
/// Chunks go first, the manifest last (after a sync): until it is written, nothing of this
/// snapshot is visible. The walker reads, cuts and hashes while a second thread compresses
/// and writes, through a bounded channel, so memory stays within a few chunks.
///
/// Holes of sparse files are recorded, not read. Bounded by the default
/// [`SnapshotLimits`]; see [`snapshot_with`].
pub fn snapshot(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    parent: Option<&str>,
) -> Result<(String, SnapshotStats), SnapshotError> {
    snapshot_with(root, base, store, parent, &SnapshotLimits::default())
}

/// [`snapshot`] within `limits`: more file data than `limits.max_bytes` fails with
/// [`SnapshotError::TooLarge`] before it is read, and a cancel or passed deadline stops it
/// within a chunk with [`SnapshotError::Cancelled`]. Either way no manifest is written.
pub fn snapshot_with(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    parent: Option<&str>,
    limits: &SnapshotLimits,
) -> Result<(String, SnapshotStats), SnapshotError> {
    limits.check()?;
    let parent = parent_entries(store, parent);
    let mut known = Known {
        index: PackIndex::load(store)?,
        sent: std::collections::HashSet::new(),
    };
    let entries = walk(root, base)?;
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Upload>(4);
    let (walked, uploaded) = std::thread::scope(|scope| {
        let upload = scope.spawn(move || uploader(store, receiver));
        let walked = record_entries(root, base, &mut known, &parent, entries, sender, limits);
        let uploaded = upload.join().unwrap_or_else(|_| {
            Err(SnapshotError::store(
                "write chunks",
                std::io::Error::other("the uploader panicked"),
            ))
        });
        (walked, uploaded)
    });
    let (entries, mut stats) = walked?;
    let (chunks_new, bytes_stored) = uploaded?;
    stats.chunks_new = chunks_new;
    stats.bytes_stored = bytes_stored;
    let manifest = Manifest {
        version: Manifest::VERSION,
        created_unix_ms: now_ms(),
        entries,
    };
    let id = manifest.save(store)?;
    Ok((id, stats))
}

/// The walker's half of [`snapshot`]: every entry recorded, file contents sent on.
fn record_entries(
    root: &WorkspaceRoot,
    base: &str,
    known: &mut Known,
    parent: &HashMap<OsString, ManifestEntry>,
    entries: Vec<(OsString, Entry)>,
    sender: std::sync::mpsc::SyncSender<Upload>,
    limits: &SnapshotLimits,
) -> Result<(Vec<ManifestEntry>, SnapshotStats), SnapshotError> {
    let mut stats = SnapshotStats::default();
    let mut budget = Budget { limits, used: 0 };
    let mut scratch = Vec::new();
    let mut manifest_entries = Vec::with_capacity(entries.len());
    // inode → the first path of a file with several links (one device per root).
    let mut first_link: HashMap<u64, OsString> = HashMap::new();
    for (relative, entry) in entries {
        limits.check()?;
        let kind = match entry.kind {
            Kind::Dir => EntryKind::Dir,
            Kind::File => EntryKind::File,
            Kind::Symlink => EntryKind::Symlink,
            Kind::Other => {
                stats.skipped += 1;
                continue;
            }
        };
        let mut record = ManifestEntry {
            path: relative.clone(),
            kind,
            mode: entry.mode,
            uid: entry.uid,
            gid: entry.gid,
            modified_unix_ms: entry.modified_unix_ms,
            inode: entry.inode,
            changed_unix_ns: entry.changed_unix_ns,
            size: entry.size,
            target: None,
            link_to: None,
            chunks: Vec::new(),
            holes: Vec::new(),
        };
        match kind {
            EntryKind::Dir => stats.dirs += 1,
            EntryKind::Symlink => {
                stats.symlinks += 1;
                record.target = entry.os_symlink_target.clone();
            }
            EntryKind::File => {
                if entry.links > 1 {
                    if let Some(first) = first_link.get(&entry.inode) {
                        record.link_to = Some(first.clone());
                        manifest_entries.push(record);
                        continue;
                    }
                    first_link.insert(entry.inode, relative.clone());
                }
                stats.files += 1;
                (record.chunks, record.holes) =
                    match unchanged_chunks(known, parent, &relative, &entry)? {
                        Some(old) => {
                            // Not read again, but still this tree's data: the limit is
                            // the same whatever the parent.
                            budget.spend(recorded_data_bytes(&old), &shown(&relative))?;
                            stats.files_unchanged += 1;
                            stats.chunks += old.chunks.len() as u64;
                            (old.chunks, old.holes)
                        }
                        None => chunk_file(
                            root,
                            &join_os(base, &relative),
                            &shown(&relative),
                            entry.size,
                            &mut budget,
                            &mut scratch,
                            Some((known, &sender, &mut stats)),
                        )?,
                    };
            }
        }
        manifest_entries.push(record);
    }
    Ok((manifest_entries, stats))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
