//! Taking, comparing and restoring snapshots of a tree beneath a [`WorkspaceRoot`].

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};

use fastcdc::v2020::StreamCDC;
use serde::Serialize;
use warren_fs::{Entry, FsError, Kind, WorkspaceRoot, MAX_WALK_DEPTH};

use crate::manifest::ChunkRef;
use crate::{EntryKind, Manifest, ManifestEntry, ObjectStore, SnapshotError};

/// Chunk sizes: small enough that an edit re-stores little, large enough that a tree of
/// small files does not drown in objects.
const MIN_CHUNK: usize = 16 * 1024;
const AVG_CHUNK: usize = 64 * 1024;
const MAX_CHUNK: usize = 256 * 1024;
/// zstd level: level 3 is zstd's default balance of speed and ratio.
const ZSTD_LEVEL: i32 = 3;
/// Most entries one tree may have.
const MAX_ENTRIES: usize = 5_000_000;

/// What a snapshot did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SnapshotStats {
    /// Regular files (hard links counted once).
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Entries that cannot be kept (sockets, fifos, devices), skipped.
    pub skipped: u64,
    /// Bytes read from the tree.
    pub bytes_read: u64,
    /// Compressed bytes newly written to the store (deduplicated chunks cost nothing).
    pub bytes_stored: u64,
    /// Chunks the files were cut into.
    pub chunks: u64,
    /// Of those, how many were new to the store.
    pub chunks_new: u64,
}

fn chunk_key(hash: &str) -> String {
    format!("chunks/{hash}")
}

/// The entries under `base` with paths relative to it, parents first; the base itself
/// comes first with the empty path.
fn walk(root: &WorkspaceRoot, base: &str) -> Result<Vec<(String, Entry)>, SnapshotError> {
    let top = root.stat(base)?;
    let listing = root.list(base, MAX_WALK_DEPTH, MAX_ENTRIES)?;
    if listing.truncated {
        return Err(SnapshotError::File(FsError::TooDeep {
            path: base.to_owned(),
            limit: MAX_ENTRIES as u32,
        }));
    }
    let prefix = if base.is_empty() {
        String::new()
    } else {
        format!("{base}/")
    };
    let mut entries = vec![(String::new(), top)];
    for entry in listing.entries {
        if entry.path.contains('\u{FFFD}') {
            return Err(SnapshotError::NonUtf8Name(entry.path));
        }
        let relative = entry
            .path
            .strip_prefix(&prefix)
            .unwrap_or(&entry.path)
            .to_owned();
        entries.push((relative, entry));
    }
    Ok(entries)
}

fn join(base: &str, relative: &str) -> String {
    match (base.is_empty(), relative.is_empty()) {
        (true, _) => relative.to_owned(),
        (false, true) => base.to_owned(),
        (false, false) => format!("{base}/{relative}"),
    }
}

/// Cuts the file at `path` into chunks, storing the new ones (when `store` is given) and
/// returning the chunk list and the bytes read.
fn chunk_file(
    root: &WorkspaceRoot,
    path: &str,
    shown: &str,
    store: Option<(&dyn ObjectStore, &mut SnapshotStats)>,
) -> Result<Vec<ChunkRef>, SnapshotError> {
    let file = root.open_file(path)?;
    let mut chunks = Vec::new();
    let mut store = store;
    for chunk in StreamCDC::new(file, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
        let chunk = chunk.map_err(|error| SnapshotError::Io {
            path: shown.to_owned(),
            source: std::io::Error::other(error.to_string()),
        })?;
        let hash = blake3::hash(&chunk.data).to_hex().to_string();
        if let Some((store, stats)) = store.as_mut() {
            stats.bytes_read += chunk.data.len() as u64;
            stats.chunks += 1;
            let key = chunk_key(&hash);
            if !store.contains(&key)? {
                let compressed = zstd::bulk::compress(&chunk.data, ZSTD_LEVEL)
                    .map_err(|e| SnapshotError::store("compress a chunk", e))?;
                if store.put(&key, &compressed)? {
                    stats.chunks_new += 1;
                    stats.bytes_stored += compressed.len() as u64;
                }
            }
        }
        chunks.push(ChunkRef {
            hash,
            len: u32::try_from(chunk.length).unwrap_or(u32::MAX),
        });
    }
    Ok(chunks)
}

/// Snapshots the tree `base` (relative to `root`; empty for the whole root) into `store`
/// and returns the manifest's id. Chunks go first, the manifest last: until it is written,
/// nothing of this snapshot is visible.
pub fn snapshot(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
) -> Result<(String, SnapshotStats), SnapshotError> {
    let mut stats = SnapshotStats::default();
    let mut manifest_entries = Vec::new();
    // (dev is one per root) inode → the first path of a file with several links.
    let mut first_link: HashMap<u64, String> = HashMap::new();
    for (relative, entry) in walk(root, base)? {
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
            size: entry.size,
            target: None,
            link_to: None,
            chunks: Vec::new(),
        };
        match kind {
            EntryKind::Dir => stats.dirs += 1,
            EntryKind::Symlink => {
                stats.symlinks += 1;
                record.target = entry.symlink_target.clone();
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
                record.chunks = chunk_file(
                    root,
                    &join(base, &relative),
                    &relative,
                    Some((store, &mut stats)),
                )?;
            }
        }
        manifest_entries.push(record);
    }
    let manifest = Manifest {
        version: Manifest::VERSION,
        created_unix_ms: now_ms(),
        entries: manifest_entries,
    };
    let id = manifest.save(store)?;
    Ok((id, stats))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

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
/// identical file is not reported.
pub fn diff(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
) -> Result<Diff, SnapshotError> {
    let manifest = Manifest::load(store, id)?;
    let before: BTreeMap<&str, &ManifestEntry> = manifest
        .entries
        .iter()
        .map(|entry| (entry.path.as_str(), entry))
        .collect();
    let now = walk(root, base)?;
    let mut result = Diff::default();
    let mut seen = std::collections::HashSet::new();
    for (relative, entry) in &now {
        if relative.is_empty() || entry.kind == Kind::Other {
            continue;
        }
        seen.insert(relative.as_str());
        let Some(old) = before.get(relative.as_str()) else {
            result.added.push(relative.clone());
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
                EntryKind::Symlink => old.target != entry.symlink_target,
                EntryKind::File => {
                    let chunks = match &old.link_to {
                        Some(first) => before.get(first.as_str()).map(|e| &e.chunks),
                        None => Some(&old.chunks),
                    };
                    old.mode != entry.mode
                        || old.size != entry.size
                        || (old.modified_unix_ms != entry.modified_unix_ms
                            && chunks.is_none_or(|chunks| {
                                chunk_file(root, &join(base, relative), relative, None)
                                    .map(|now| &now != chunks)
                                    .unwrap_or(true)
                            }))
                }
            }
        };
        if changed {
            result.changed.push(relative.clone());
        }
    }
    for entry in &manifest.entries {
        if !entry.path.is_empty() && !seen.contains(entry.path.as_str()) {
            result.removed.push(entry.path.clone());
        }
    }
    Ok(result)
}

/// Puts the tree `base` back as the snapshot `id` recorded it.
///
/// Everything is built in a temporary directory next to `base` (every chunk's hash
/// checked as it is written), then swapped in with one `RENAME_EXCHANGE`, and the old tree
/// removed. On any error the temporary directory is removed and `base` is untouched.
pub fn restore(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    id: &str,
) -> Result<(), SnapshotError> {
    let manifest = Manifest::load(store, id)?;
    let (parent, name) = base.rsplit_once('/').unwrap_or(("", base));
    let staging = join(
        parent,
        &format!(".{name}.warren-restore-{}", uuid::Uuid::new_v4().simple()),
    );
    root.mkdir_p(&staging)?;
    let built = build(root, &staging, store, &manifest);
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
) -> Result<(), SnapshotError> {
    let by_path: HashMap<&str, &ManifestEntry> = manifest
        .entries
        .iter()
        .map(|entry| (entry.path.as_str(), entry))
        .collect();
    // Parents come before children in a manifest, so one pass creates everything.
    for entry in &manifest.entries {
        if entry.path.is_empty() {
            continue;
        }
        let path = join(staging, &entry.path);
        match entry.kind {
            EntryKind::Dir => {
                root.mkdir_p(&path)?;
            }
            EntryKind::Symlink => {
                root.create_symlink(&path, entry.target.as_deref().unwrap_or_default())?;
            }
            EntryKind::File => match &entry.link_to {
                Some(first) if by_path.contains_key(first.as_str()) => {
                    root.create_hardlink(&join(staging, first), &path)?;
                }
                _ => write_file(root, &path, &entry.path, entry, store)?,
            },
        }
    }
    // Attributes last, children before parents: a read-only directory is made read-only
    // only once nothing more is written into it, and no write disturbs a parent's time.
    for entry in manifest.entries.iter().rev() {
        let path = join(staging, &entry.path);
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
    path: &str,
    shown: &str,
    entry: &ManifestEntry,
    store: &dyn ObjectStore,
) -> Result<(), SnapshotError> {
    let mut file = root.create_file(path, 0o600)?;
    for chunk in &entry.chunks {
        let compressed =
            store
                .get(&chunk_key(&chunk.hash))?
                .ok_or_else(|| SnapshotError::MissingChunk {
                    hash: chunk.hash.clone(),
                    path: shown.to_owned(),
                })?;
        let corrupt = || SnapshotError::Corrupt {
            what: "chunk",
            hash: chunk.hash.clone(),
        };
        let mut bytes = Vec::with_capacity(chunk.len as usize);
        zstd::stream::Decoder::new(compressed.as_slice())
            .and_then(|mut decoder| decoder.read_to_end(&mut bytes))
            .map_err(|_| corrupt())?;
        if blake3::hash(&bytes).to_hex().as_str() != chunk.hash {
            return Err(corrupt());
        }
        file.write_all(&bytes).map_err(|source| SnapshotError::Io {
            path: shown.to_owned(),
            source,
        })?;
    }
    file.sync_all().map_err(|source| SnapshotError::Io {
        path: shown.to_owned(),
        source,
    })
}
