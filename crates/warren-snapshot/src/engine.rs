//! Taking, comparing and restoring snapshots of a tree beneath a [`WorkspaceRoot`].

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use std::borrow::Cow;

use fastcdc::v2020::{FastCDC, StreamCDC};
use serde::Serialize;
use warren_fs::{Entry, FsError, Kind, WorkspaceRoot, MAX_WALK_DEPTH};

use crate::fetch::{with_feed, ChunkFeed, Plan};
use crate::manifest::{ChunkRef, Hole};
use crate::pack::{save_index, PackIndex, PackWriter};
use crate::{EntryKind, Manifest, ManifestEntry, ObjectStore, SnapshotError};

/// Chunk sizes (restic's order of magnitude): an edit re-stores at most a few hundred KiB,
/// and a large file is a few chunks per MiB, not dozens. Chunks are gathered into packs
/// (`pack.rs`), so their number is no longer the number of objects the store creates.
const MIN_CHUNK: usize = 128 * 1024;
const AVG_CHUNK: usize = 512 * 1024;
const MAX_CHUNK: usize = 2 * 1024 * 1024;
/// zstd level 1: the fast end, as `zstd -1`; chunks that do not compress cost little.
const ZSTD_LEVEL: i32 = 1;
/// Files with at most this much data are read whole and cut in memory; larger ones are
/// streamed through a buffer of the largest chunk.
const WHOLE_FILE: u64 = 8 * 1024 * 1024;
/// Packs one index object names (the last index of a snapshot may name fewer): a snapshot
/// stopped midway leaves at most this many packs unindexed, so unused by the next one.
const PACKS_PER_INDEX: usize = 4;
/// Most entries one tree may have.
const MAX_ENTRIES: usize = 5_000_000;
/// Most bytes of file data (holes not counted) one snapshot reads unless told otherwise:
/// the order of a generous workspace. Beyond it a snapshot costs minutes of a server
/// thread and as much store space; the operator raises it in `[snapshots] max_bytes`.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// Holes shorter than this are read as zeros rather than recorded: the manifest stays
/// short whatever the file's layout, at the cost of reading at most this much per data
/// extent.
const MIN_HOLE: u64 = 64 * 1024;
/// How many data extents are looked up between two checks of the cancel flag.
const EXTENTS_PER_CHECK: usize = 1024;

/// A flag that stops snapshots and restores at their next chunk: set it, and the work
/// fails with [`SnapshotError::Cancelled`] within a chunk's time. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag; work watching it stops.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether it was set.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What bounds one snapshot, diff or restore: the data it may read, a flag that stops it
/// (server shutdown), and a deadline (the reaper's, per sandbox). Blocking threads check
/// them between chunks, so they never outlive a cancel by more than a chunk's work.
#[derive(Debug, Clone)]
pub struct SnapshotLimits {
    /// Most bytes of file data a snapshot reads or reuses, holes not counted; over it the
    /// snapshot fails with [`SnapshotError::TooLarge`].
    pub max_bytes: u64,
    /// Stops the work when set.
    pub cancel: Option<CancelFlag>,
    /// Stops the work when passed.
    pub deadline: Option<Instant>,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            cancel: None,
            deadline: None,
        }
    }
}

impl SnapshotLimits {
    /// Fails once the work must stop.
    fn check(&self) -> Result<(), SnapshotError> {
        if self.cancel.as_ref().is_some_and(CancelFlag::is_cancelled) {
            return Err(SnapshotError::Cancelled {
                reason: "the server is shutting down",
            });
        }
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(SnapshotError::Cancelled {
                reason: "its deadline passed",
            });
        }
        Ok(())
    }
}

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

/// The entries under `base` with paths relative to it (the exact bytes of their names),
/// parents first; the base itself comes first with the empty path.
fn walk(root: &WorkspaceRoot, base: &str) -> Result<Vec<(OsString, Entry)>, SnapshotError> {
    let top = root.stat(base)?;
    let listing = root.list(base, MAX_WALK_DEPTH, MAX_ENTRIES)?;
    if listing.truncated {
        return Err(SnapshotError::File(FsError::TooManyEntries {
            path: base.to_owned(),
            limit: MAX_ENTRIES,
        }));
    }
    // Listed paths start with the base as the file layer normalises it (`top.os_path`).
    let mut prefix = top.os_path.as_bytes().to_vec();
    if !prefix.is_empty() {
        prefix.push(b'/');
    }
    let mut entries = vec![(OsString::new(), top)];
    for entry in listing.entries {
        let bytes = entry.os_path.as_bytes();
        let relative = OsStr::from_bytes(bytes.strip_prefix(prefix.as_slice()).unwrap_or(bytes));
        entries.push((relative.to_owned(), entry));
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

/// [`join`] for a relative path that need not be UTF-8.
fn join_os(base: &str, relative: &OsStr) -> OsString {
    let mut out = OsString::from(base);
    if !base.is_empty() && !relative.is_empty() {
        out.push("/");
    }
    out.push(relative);
    out
}

/// A relative path as messages and diffs show it.
fn shown(relative: &OsStr) -> String {
    relative.to_string_lossy().into_owned()
}

/// A chunk on its way to the store: compressed and packed by the uploader thread while
/// the walker reads on.
struct Upload {
    hash: String,
    data: Vec<u8>,
}

/// What one snapshot knows is stored already: the store's index as it was read at the
/// start, and the chunks this snapshot has sent since (a tree may hold a chunk twice).
struct Known {
    index: PackIndex,
    sent: std::collections::HashSet<String>,
}

/// The data extents `(offset, length)` of a file of `size` bytes, in order, found with
/// `SEEK_DATA`/`SEEK_HOLE`: everything outside them reads as zeros. Holes shorter than
/// [`MIN_HOLE`] count as data. A filesystem that knows no holes reports one extent.
fn data_extents(
    file: &File,
    size: u64,
    shown: &str,
    limits: &SnapshotLimits,
) -> Result<Vec<(u64, u64)>, SnapshotError> {
    use rustix::fs::{seek, SeekFrom};
    use rustix::io::Errno;
    let io = |errno: Errno| SnapshotError::Io {
        path: shown.to_owned(),
        source: errno.into(),
    };
    let mut extents: Vec<(u64, u64)> = Vec::new();
    let mut position = 0u64;
    let mut lookups = 0usize;
    while position < size {
        lookups += 1;
        if lookups.is_multiple_of(EXTENTS_PER_CHECK) {
            limits.check()?;
        }
        let start = match seek(file, SeekFrom::Data(position)) {
            Ok(start) => start,
            // No data at or after `position`: the rest is a hole.
            Err(Errno::NXIO) => break,
            // A filesystem without SEEK_DATA: the whole file is data.
            Err(Errno::INVAL) if position == 0 => return Ok(vec![(0, size)]),
            Err(errno) => return Err(io(errno)),
        };
        if start >= size {
            break;
        }
        let end = match seek(file, SeekFrom::Hole(start)) {
            Ok(end) => end.min(size),
            Err(Errno::NXIO) => size,
            Err(errno) => return Err(io(errno)),
        };
        if end <= start {
            break;
        }
        let previous_end = extents.last().map_or(0, |&(offset, len)| offset + len);
        if start - previous_end < MIN_HOLE {
            // Too short a hole to record (or a short one at the start): read it as data.
            match extents.last_mut() {
                Some(last) => last.1 = end - last.0,
                None => extents.push((0, end)),
            }
        } else {
            extents.push((start, end - start));
        }
        position = end;
    }
    if let Some(last) = extents.last_mut() {
        if size - (last.0 + last.1) < MIN_HOLE {
            last.1 = size - last.0;
        }
    } else if size < MIN_HOLE {
        extents.push((0, size));
    }
    extents.retain(|&(_, len)| len > 0);
    Ok(extents)
}

/// The holes between `extents` in a file of `size` bytes.
fn holes_between(extents: &[(u64, u64)], size: u64) -> Vec<Hole> {
    let mut holes = Vec::new();
    let mut position = 0;
    for &(offset, len) in extents {
        if offset > position {
            holes.push(Hole {
                offset: position,
                len: offset - position,
            });
        }
        position = offset + len;
    }
    if size > position {
        holes.push(Hole {
            offset: position,
            len: size - position,
        });
    }
    holes
}

/// The data extents of a recorded file: what its holes leave of `[0, size)`. `None` when
/// the holes are out of order, overlap or pass the end (a damaged manifest).
fn extents_between(holes: &[Hole], size: u64) -> Option<Vec<(u64, u64)>> {
    let mut extents = Vec::new();
    let mut position = 0u64;
    for hole in holes {
        let end = hole.offset.checked_add(hole.len)?;
        if hole.offset < position || end > size {
            return None;
        }
        if hole.offset > position {
            extents.push((position, hole.offset - position));
        }
        position = end;
    }
    if size > position {
        extents.push((position, size - position));
    }
    Some(extents)
}

/// Bytes of data of a recorded file (its size less its holes).
fn recorded_data_bytes(entry: &ManifestEntry) -> u64 {
    let holes: u64 = entry.holes.iter().map(|hole| hole.len).sum();
    entry.size.saturating_sub(holes)
}

/// Reads a file's data extents one after another, never its holes. A file that shrank
/// meanwhile reads as zeros where its bytes are gone, so the stream is always exactly as
/// long as the extents the manifest will describe.
struct ExtentReader<'f> {
    file: &'f File,
    extents: Vec<(u64, u64)>,
    index: usize,
    done: u64,
}

impl Read for ExtentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(&(offset, len)) = self.extents.get(self.index) {
            if self.done == len {
                self.index += 1;
                self.done = 0;
                continue;
            }
            let want = usize::try_from(len - self.done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let mut read = self.file.read_at(&mut buf[..want], offset + self.done)?;
            if read == 0 {
                buf[..want].fill(0);
                read = want;
            }
            self.done += read as u64;
            return Ok(read);
        }
        Ok(0)
    }
}

/// Data bytes seen so far by one snapshot or diff, against its limit.
struct Budget<'l> {
    limits: &'l SnapshotLimits,
    used: u64,
}

impl Budget<'_> {
    fn spend(&mut self, bytes: u64, shown: &str) -> Result<(), SnapshotError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limits.max_bytes {
            return Err(SnapshotError::TooLarge {
                path: shown.to_owned(),
                limit: self.limits.max_bytes,
            });
        }
        Ok(())
    }
}

/// Cuts the file at `path` (of `size` bytes when it was listed) into chunks and returns
/// the chunk list and its holes. Only data extents are read; holes are recorded. With
/// `upload`, chunks the store lacks are sent to the uploader.
fn chunk_file(
    root: &WorkspaceRoot,
    path: &OsStr,
    shown: &str,
    size: u64,
    budget: &mut Budget<'_>,
    scratch: &mut Vec<u8>,
    upload: Option<(
        &mut Known,
        &std::sync::mpsc::SyncSender<Upload>,
        &mut SnapshotStats,
    )>,
) -> Result<(Vec<ChunkRef>, Vec<Hole>), SnapshotError> {
    let file = root.open_file(path)?;
    let extents = data_extents(&file, size, shown, budget.limits)?;
    budget.spend(extents.iter().map(|&(_, len)| len).sum(), shown)?;
    let data_len: u64 = extents.iter().map(|&(_, len)| len).sum();
    let holes = holes_between(&extents, size);
    let mut reader = ExtentReader {
        file: &file,
        extents,
        index: 0,
        done: 0,
    };
    let mut chunks = Vec::new();
    let mut upload = upload;
    let mut take = |data: Cow<'_, [u8]>| -> Result<(), SnapshotError> {
        budget.limits.check()?;
        let hash = blake3::hash(&data).to_hex().to_string();
        let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if let Some((known, sender, stats)) = upload.as_mut() {
            stats.bytes_read += data.len() as u64;
            stats.chunks += 1;
            if !known.index.contains(&hash) && known.sent.insert(hash.clone()) {
                // A closed channel means the uploader failed; its error is reported at
                // the end.
                if sender
                    .send(Upload {
                        hash: hash.clone(),
                        data: data.into_owned(),
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
        Ok(())
    };
    let io = |error: std::io::Error| SnapshotError::Io {
        path: shown.to_owned(),
        source: error,
    };
    if data_len <= WHOLE_FILE {
        // Read whole into the walk's buffer and cut in place: the same cut points as the
        // stream below, without its buffer of the largest chunk zeroed for every file.
        scratch.clear();
        scratch.resize(usize::try_from(data_len).unwrap_or(usize::MAX), 0);
        reader.read_exact(scratch).map_err(io)?;
        for chunk in FastCDC::new(scratch, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            take(Cow::Borrowed(
                &scratch[chunk.offset..chunk.offset + chunk.length],
            ))?;
        }
    } else {
        for chunk in StreamCDC::new(reader, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            let chunk = chunk.map_err(|error| io(std::io::Error::other(error.to_string())))?;
            take(Cow::Owned(chunk.data))?;
        }
    }
    Ok((chunks, holes))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_whole_is_cut_exactly_where_the_stream_cuts_it() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..5 * 1024 * 1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let whole: Vec<(usize, usize)> = FastCDC::new(&data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
            .map(|chunk| (chunk.offset, chunk.length))
            .collect();
        let streamed: Vec<(usize, usize)> =
            StreamCDC::new(data.as_slice(), MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
                .map(|chunk| {
                    let chunk = chunk.unwrap();
                    (chunk.offset as usize, chunk.length)
                })
                .collect();
        assert!(whole.len() > 3, "{whole:?}");
        assert_eq!(whole, streamed);
    }
}
