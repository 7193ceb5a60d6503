//! Pack files (issue 14): many chunks in one stored object, so a snapshot of thousands of
//! small files is a few dozen objects, not thousands, and a resume from object storage is
//! a few large range reads, not a request per chunk.
//!
//! A pack (`packs/<id>`) is compressed chunks back to back; its id is the BLAKE3 of its
//! bytes. Where each chunk lies is recorded in index objects (`indexes/<id>`, zstd JSON,
//! named by the BLAKE3 of their bytes like manifests): the snapshot that writes a pack writes
//! an index naming it right after, so the chunks of a snapshot stopped halfway are found
//! and reused by the next one; the garbage collector folds every index into one. Manifests
//! name chunks by hash only, never by place, so the collector may move a chunk to another
//! pack without touching a manifest. Every chunk is still checked against its hash when it
//! is read, and the manifest is still written last: packs change where bytes live, not
//! what commits a snapshot.
//!
//! Chunks stored one object each (`chunks/<hash>`) by earlier versions are still read and
//! collected; new chunks always go into packs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{ObjectStore, SnapshotError};

/// A pack is written once it holds this many compressed bytes: large enough that object
/// storage sees few requests (a 200 MiB environment is a few dozen), small enough that the
/// writer's buffer keeps a snapshot within its memory budget (64 MiB peak, measured by the
/// snapshot benchmark).
pub(crate) const PACK_TARGET: usize = 8 * 1024 * 1024;

/// The largest chunk a pack is sized for up front (the engine cuts at most 2 MiB).
const MAX_CHUNK_BOUND: usize = 2 * 1024 * 1024;

/// The key of a chunk stored as an object of its own (before packs).
pub(crate) fn chunk_key(hash: &str) -> String {
    format!("chunks/{hash}")
}

pub(crate) fn pack_key(id: &str) -> String {
    format!("packs/{id}")
}

fn index_key(id: &str) -> String {
    format!("indexes/{id}")
}

/// One chunk inside a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PackedChunk {
    /// BLAKE3 of the chunk's uncompressed bytes.
    pub(crate) hash: String,
    /// Where its compressed bytes start in the pack.
    pub(crate) offset: u64,
    /// How many compressed bytes it takes.
    pub(crate) stored: u32,
    /// Its uncompressed length.
    pub(crate) len: u32,
}

/// One pack and the chunks in it, as an index lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PackRecord {
    /// The pack's id (BLAKE3 of its bytes).
    pub(crate) id: String,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// Its chunks in the order they lie.
    pub(crate) chunks: Vec<PackedChunk>,
}

#[derive(Serialize, Deserialize)]
struct IndexFile {
    version: u32,
    packs: Vec<PackRecord>,
}

const INDEX_VERSION: u32 = 1;

/// Where a chunk's compressed bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// `stored` bytes at `offset` of the pack `pack`.
    Packed {
        pack: Arc<str>,
        offset: u64,
        stored: u32,
    },
    /// An object of its own, `chunks/<hash>` (written before packs).
    Object,
}

/// Every index object of a store read at once: where each chunk is.
#[derive(Debug, Default)]
pub(crate) struct PackIndex {
    locations: HashMap<String, (Arc<str>, u64, u32)>,
    legacy: HashSet<String>,
    /// The index objects read (keys), with the packs each listed.
    pub(crate) files: Vec<(String, Vec<PackRecord>)>,
    /// Index objects whose bytes do not match their name.
    pub(crate) corrupt: Vec<String>,
}

enum IndexRead {
    Packs(Vec<PackRecord>),
    Gone,
    Corrupt,
}

fn read_index(store: &dyn ObjectStore, key: &str) -> Result<IndexRead, SnapshotError> {
    let Some(bytes) = store.get(key)? else {
        return Ok(IndexRead::Gone);
    };
    let id = key.trim_start_matches("indexes/");
    if blake3::hash(&bytes).to_hex().as_str() != id {
        return Ok(IndexRead::Corrupt);
    }
    let parsed = zstd::stream::decode_all(bytes.as_slice())
        .ok()
        .and_then(|json| serde_json::from_slice::<IndexFile>(&json).ok());
    Ok(match parsed {
        Some(file) if file.version == INDEX_VERSION => IndexRead::Packs(file.packs),
        _ => IndexRead::Corrupt,
    })
}

impl PackIndex {
    /// Reads every index object of `store`, and the names of the chunks it holds as objects
    /// of their own. An index can vanish between the listing and its read (the collector
    /// folded it into a newer one, written before the old was deleted): then the listing is
    /// read again, so nothing the store holds is missed.
    pub(crate) fn load(store: &dyn ObjectStore) -> Result<Self, SnapshotError> {
        let mut attempts = 0;
        let mut index = loop {
            attempts += 1;
            let mut index = Self::default();
            let mut vanished = false;
            for key in store.list("indexes/")? {
                match read_index(store, &key)? {
                    IndexRead::Packs(packs) => index.files.push((key, packs)),
                    IndexRead::Gone => vanished = true,
                    IndexRead::Corrupt => {
                        tracing::warn!(%key, "a snapshot index is corrupt; its packs are not used");
                        index.corrupt.push(key);
                    }
                }
            }
            if !vanished || attempts >= 5 {
                break index;
            }
        };
        // Only packs that exist place chunks: an index can name a pack that is gone (two
        // collectors at once, one folding in what the other deleted), and a chunk placed
        // there would be reused by a snapshot that then cannot be restored.
        let present: HashSet<String> = store
            .list("packs/")?
            .into_iter()
            .filter_map(|key| key.strip_prefix("packs/").map(str::to_owned))
            .collect();
        let files = std::mem::take(&mut index.files);
        for (_, packs) in &files {
            let existing: Vec<PackRecord> = packs
                .iter()
                .filter(|pack| present.contains(&pack.id))
                .cloned()
                .collect();
            index.add(&existing);
        }
        index.files = files;
        index.legacy = store
            .list("chunks/")?
            .into_iter()
            .filter_map(|key| key.strip_prefix("chunks/").map(str::to_owned))
            .collect();
        Ok(index)
    }

    /// Records the chunks of `packs` (the first place a chunk was seen wins).
    pub(crate) fn add(&mut self, packs: &[PackRecord]) {
        for pack in packs {
            let id: Arc<str> = Arc::from(pack.id.as_str());
            for chunk in &pack.chunks {
                self.locations
                    .entry(chunk.hash.clone())
                    .or_insert_with(|| (id.clone(), chunk.offset, chunk.stored));
            }
        }
    }

    /// Where the chunk `hash` is, if the store holds it.
    pub(crate) fn locate(&self, hash: &str) -> Option<Location> {
        if let Some((pack, offset, stored)) = self.locations.get(hash) {
            return Some(Location::Packed {
                pack: pack.clone(),
                offset: *offset,
                stored: *stored,
            });
        }
        self.legacy.contains(hash).then_some(Location::Object)
    }

    /// Whether the store holds the chunk `hash`.
    pub(crate) fn contains(&self, hash: &str) -> bool {
        self.locations.contains_key(hash) || self.legacy.contains(hash)
    }
}

/// Writes an index object naming `packs`; returns its key.
pub(crate) fn save_index(
    store: &dyn ObjectStore,
    packs: Vec<PackRecord>,
) -> Result<String, SnapshotError> {
    let json = serde_json::to_vec(&IndexFile {
        version: INDEX_VERSION,
        packs,
    })
    .expect("an index serialises");
    let bytes =
        zstd::bulk::compress(&json, 3).map_err(|e| SnapshotError::store("compress an index", e))?;
    let key = index_key(&blake3::hash(&bytes).to_hex());
    store.put(&key, &bytes)?;
    Ok(key)
}

/// Gathers compressed chunks into packs and writes each when it is full.
pub(crate) struct PackWriter<'s> {
    store: &'s dyn ObjectStore,
    buffer: Vec<u8>,
    chunks: Vec<PackedChunk>,
    /// Chunks written so far.
    pub(crate) chunks_written: u64,
    /// Compressed bytes written so far.
    pub(crate) bytes_written: u64,
}

impl<'s> PackWriter<'s> {
    pub(crate) fn new(store: &'s dyn ObjectStore) -> Self {
        Self {
            store,
            buffer: Vec::new(),
            chunks: Vec::new(),
            chunks_written: 0,
            bytes_written: 0,
        }
    }

    /// Adds a chunk's compressed bytes; returns the pack just written when this one
    /// filled it.
    pub(crate) fn add(
        &mut self,
        hash: String,
        len: u32,
        compressed: &[u8],
    ) -> Result<Option<PackRecord>, SnapshotError> {
        self.add_with(hash, len, compressed.len(), |pack| {
            pack.get_mut().extend_from_slice(compressed);
            Ok(compressed.len())
        })
    }

    /// Adds a chunk whose compressed bytes `write` appends at the cursor (at most
    /// `zstd`'s bound for `bound_of` bytes), straight into the pack: no copy of the
    /// compressed chunk. Returns the pack just written when this one filled it.
    pub(crate) fn add_with(
        &mut self,
        hash: String,
        len: u32,
        bound_of: usize,
        write: impl FnOnce(&mut std::io::Cursor<&mut Vec<u8>>) -> std::io::Result<usize>,
    ) -> Result<Option<PackRecord>, SnapshotError> {
        // Room for a whole pack and one more chunk from the start, and the same buffer
        // for every pack: growing it, or a fresh one per pack, cost a copy or fresh pages
        // of memory for every pack written.
        let bound = zstd::zstd_safe::compress_bound(bound_of);
        if self.buffer.capacity() == 0 {
            self.buffer
                .reserve_exact(PACK_TARGET + zstd::zstd_safe::compress_bound(MAX_CHUNK_BOUND));
        }
        self.buffer.reserve(bound);
        let offset = self.buffer.len();
        let mut cursor = std::io::Cursor::new(&mut self.buffer);
        cursor.set_position(offset as u64);
        let stored = write(&mut cursor).map_err(|e| SnapshotError::store("compress a chunk", e))?;
        debug_assert_eq!(self.buffer.len(), offset + stored);
        self.chunks.push(PackedChunk {
            hash,
            offset: offset as u64,
            stored: u32::try_from(stored).unwrap_or(u32::MAX),
            len,
        });
        if self.buffer.len() >= PACK_TARGET {
            return self.flush();
        }
        Ok(None)
    }

    /// Writes the pack being gathered, if it holds anything.
    pub(crate) fn flush(&mut self) -> Result<Option<PackRecord>, SnapshotError> {
        if self.chunks.is_empty() {
            return Ok(None);
        }
        let id = blake3::hash(&self.buffer).to_hex().to_string();
        let size = self.buffer.len() as u64;
        self.store.put(&pack_key(&id), &self.buffer)?;
        self.buffer.clear();
        self.chunks_written += self.chunks.len() as u64;
        self.bytes_written += size;
        Ok(Some(PackRecord {
            id,
            size,
            chunks: std::mem::take(&mut self.chunks),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;

    #[test]
    fn chunks_gathered_into_a_pack_are_found_where_its_index_says() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let mut writer = PackWriter::new(&store);
        assert!(writer.add("aa".into(), 3, b"one").unwrap().is_none());
        assert!(writer.add("bb".into(), 3, b"two!").unwrap().is_none());
        let pack = writer.flush().unwrap().unwrap();
        assert!(
            writer.flush().unwrap().is_none(),
            "an empty pack is never written"
        );
        save_index(&store, vec![pack.clone()]).unwrap();
        let index = PackIndex::load(&store).unwrap();
        let Some(Location::Packed {
            pack: id,
            offset,
            stored,
        }) = index.locate("bb")
        else {
            panic!("bb not found");
        };
        assert_eq!(&*id, pack.id.as_str());
        let bytes = store
            .get_range(&pack_key(&id), offset, u64::from(stored))
            .unwrap()
            .unwrap();
        assert_eq!(bytes, b"two!");
        assert_eq!(index.locate("cc"), None);
        assert_eq!((writer.chunks_written, writer.bytes_written), (2, 7));
    }

    #[test]
    fn a_corrupt_index_is_named_and_its_packs_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let record = PackRecord {
            id: "00ff".into(),
            size: 1,
            chunks: vec![PackedChunk {
                hash: "aa".into(),
                offset: 0,
                stored: 1,
                len: 1,
            }],
        };
        let key = save_index(&store, vec![record]).unwrap();
        std::fs::write(dir.path().join(&key), b"tampered").unwrap();
        let index = PackIndex::load(&store).unwrap();
        assert_eq!(index.corrupt, [key]);
        assert!(!index.contains("aa"));
    }
}
