//! Taking, comparing and restoring snapshots of a tree beneath a [`WorkspaceRoot`].

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use fastcdc::v2020::StreamCDC;
use serde::Serialize;
use warren_fs::{Entry, FsError, Kind, WorkspaceRoot, MAX_WALK_DEPTH};

use crate::manifest::ChunkRef;
use crate::{EntryKind, Manifest, ManifestEntry, ObjectStore, SnapshotError};

/// Chunk sizes (restic's order of magnitude): an edit re-stores at most a few hundred KiB,
/// and a large file is a few objects per MiB, not dozens. Each object is a file in the
/// local store, and creating files, not hashing or compressing, is what a full snapshot
/// spends its time on; smaller chunks made it several times slower.
const MIN_CHUNK: usize = 128 * 1024;
const AVG_CHUNK: usize = 512 * 1024;
const MAX_CHUNK: usize = 2 * 1024 * 1024;
/// zstd level 1: the fast end, as `zstd -1`; chunks that do not compress cost little.
const ZSTD_LEVEL: i32 = 1;
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
    /// Files found unchanged since the parent snapshot (same inode, size, times) whose
    /// chunks were reused without reading them.
    pub files_unchanged: u64,
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
        return Err(SnapshotError::File(FsError::TooManyEntries {
            path: base.to_owned(),
            limit: MAX_ENTRIES,
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

/// A chunk on its way to the store: compressed and written by the uploader thread while
/// the walker reads on.
struct Upload {
    key: String,
    data: Vec<u8>,
}

/// Cuts the file at `path` into chunks and returns the chunk list. With `upload`, chunks
/// the store lacks are sent to the uploader.
fn chunk_file(
    root: &WorkspaceRoot,
    path: &str,
    shown: &str,
    upload: Option<(
        &dyn ObjectStore,
        &std::sync::mpsc::SyncSender<Upload>,
        &mut SnapshotStats,
    )>,
) -> Result<Vec<ChunkRef>, SnapshotError> {
    let file = root.open_file(path)?;
    let mut chunks = Vec::new();
    let mut upload = upload;
    for chunk in StreamCDC::new(file, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
        let chunk = chunk.map_err(|error| SnapshotError::Io {
            path: shown.to_owned(),
            source: std::io::Error::other(error.to_string()),
        })?;
        let hash = blake3::hash(&chunk.data).to_hex().to_string();
        let length = u32::try_from(chunk.length).unwrap_or(u32::MAX);
        if let Some((store, sender, stats)) = upload.as_mut() {
            stats.bytes_read += chunk.data.len() as u64;
            stats.chunks += 1;
            let key = chunk_key(&hash);
            if !store.contains(&key)? {
                // A closed channel means the uploader failed; its error is reported at
                // the end.
                if sender
                    .send(Upload {
                        key,
                        data: chunk.data,
                    })
                    .is_err()
                {
                    return Err(SnapshotError::store(
                        "write chunks",
                        std::io::Error::other("the uploader stopped"),
                    ));
                }
            }
        }
        chunks.push(ChunkRef { hash, len: length });
    }
    Ok(chunks)
}

/// Compresses and stores chunks until the channel closes; returns (chunks written,
/// compressed bytes written).
fn uploader(
    store: &dyn ObjectStore,
    receiver: std::sync::mpsc::Receiver<Upload>,
) -> Result<(u64, u64), SnapshotError> {
    let mut written = (0u64, 0u64);
    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)
        .map_err(|e| SnapshotError::store("start compressing", e))?;
    for upload in receiver {
        let compressed = compressor
            .compress(&upload.data)
            .map_err(|e| SnapshotError::store("compress a chunk", e))?;
        if store.put(&upload.key, &compressed)? {
            written.0 += 1;
            written.1 += compressed.len() as u64;
        }
    }
    Ok(written)
}

/// The parent snapshot's entries by path, for reusing unchanged files' chunk lists.
fn parent_entries(store: &dyn ObjectStore, parent: Option<&str>) -> HashMap<String, ManifestEntry> {
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
    store: &dyn ObjectStore,
    parent: &HashMap<String, ManifestEntry>,
    relative: &str,
    entry: &Entry,
) -> Result<Option<Vec<ChunkRef>>, SnapshotError> {
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
    for chunk in &old.chunks {
        if !store.contains(&chunk_key(&chunk.hash))? {
            return Ok(None);
        }
    }
    Ok(Some(old.chunks.clone()))
}

/// Snapshots the tree `base` (relative to `root`; empty for the whole root) into `store`
/// and returns the manifest's id. With a `parent` snapshot of the same tree, files whose
/// inode, size, modification and status-change times are unchanged are not read again.
///
/// Chunks go first, the manifest last (after a sync): until it is written, nothing of this
/// snapshot is visible. The walker reads, cuts and hashes while a second thread compresses
/// and writes, through a bounded channel, so memory stays within a few chunks.
pub fn snapshot(
    root: &WorkspaceRoot,
    base: &str,
    store: &dyn ObjectStore,
    parent: Option<&str>,
) -> Result<(String, SnapshotStats), SnapshotError> {
    let parent = parent_entries(store, parent);
    let entries = walk(root, base)?;
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Upload>(8);
    let (walked, uploaded) = std::thread::scope(|scope| {
        let upload = scope.spawn(move || uploader(store, receiver));
        let walked = record_entries(root, base, store, &parent, entries, sender);
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
    store: &dyn ObjectStore,
    parent: &HashMap<String, ManifestEntry>,
    entries: Vec<(String, Entry)>,
    sender: std::sync::mpsc::SyncSender<Upload>,
) -> Result<(Vec<ManifestEntry>, SnapshotStats), SnapshotError> {
    let mut stats = SnapshotStats::default();
    let mut manifest_entries = Vec::with_capacity(entries.len());
    // inode → the first path of a file with several links (one device per root).
    let mut first_link: HashMap<u64, String> = HashMap::new();
    for (relative, entry) in entries {
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
                record.chunks = match unchanged_chunks(store, parent, &relative, &entry)? {
                    Some(chunks) => {
                        stats.files_unchanged += 1;
                        stats.chunks += chunks.len() as u64;
                        chunks
                    }
                    None => chunk_file(
                        root,
                        &join(base, &relative),
                        &relative,
                        Some((store, &sender, &mut stats)),
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
    // Durable before it is swapped in: a crash after the swap must not leave a tree of
    // empty files.
    let built = build(root, &staging, store, &manifest).and_then(|()| Ok(root.sync_filesystem()?));
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
    let mut restorer = Restorer::new()?;
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
                _ => write_file(root, &path, &entry.path, entry, store, &mut restorer)?,
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
    scratch: &mut Restorer,
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
        let bytes = scratch.decompress(&compressed, chunk)?;
        file.write_all(bytes).map_err(|source| SnapshotError::Io {
            path: shown.to_owned(),
            source,
        })?;
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
