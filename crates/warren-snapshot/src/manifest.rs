//! The manifest: everything needed to rebuild a tree, itself stored by its hash.

use serde::{Deserialize, Serialize};

use crate::{ObjectStore, SnapshotError};

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
}

/// One chunk of a file: its BLAKE3 hash and length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// Lowercase hex BLAKE3 of the chunk's bytes.
    pub hash: String,
    /// The chunk's length in bytes.
    pub len: u32,
}

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path relative to the tree's root, `/`-joined; empty for the root itself.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Modification time, milliseconds since the epoch.
    pub modified_unix_ms: i64,
    /// Inode and status-change time when recorded: with size and time, how the next
    /// snapshot knows a file is unchanged without reading it.
    #[serde(default)]
    pub inode: u64,
    /// See `inode`.
    #[serde(default)]
    pub changed_unix_ns: i64,
    /// Size in bytes (files).
    pub size: u64,
    /// For a symlink, its target as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// For a hard link, the path of the first entry of the same file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_to: Option<String>,
    /// For a file that is not a hard link of an earlier one, its chunks in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<ChunkRef>,
    /// For a sparse file, its holes in order: ranges that read as zeros and were neither
    /// read nor stored. The chunks hold the bytes outside them, in order, and a restore
    /// recreates the holes, so a sparse file comes back sparse. Empty for a dense file
    /// (and in manifests of version 1, which never recorded holes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holes: Vec<Hole>,
}

/// A range of a file that reads as zeros and occupies no space on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hole {
    /// Its first byte's offset.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// A whole tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub version: u32,
    /// When it was taken, milliseconds since the epoch.
    pub created_unix_ms: i64,
    /// Every entry, parents before children.
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    /// 2 added holes; a manifest of version 1 reads as one whose files are all dense.
    pub(crate) const VERSION: u32 = 2;

    pub(crate) fn key(id: &str) -> String {
        format!("manifests/{id}")
    }

    /// Stores the manifest (zstd JSON) and returns its id, the BLAKE3 of those bytes.
    pub(crate) fn save(&self, store: &dyn ObjectStore) -> Result<String, SnapshotError> {
        let json = serde_json::to_vec(self).expect("a manifest serialises");
        let bytes = zstd::bulk::compress(&json, 3)
            .map_err(|e| SnapshotError::store("compress a manifest", e))?;
        let id = blake3::hash(&bytes).to_hex().to_string();
        // Every chunk is durable before the manifest that names them exists.
        store.sync()?;
        store.put(&Self::key(&id), &bytes)?;
        store.sync()?;
        Ok(id)
    }

    /// Loads and checks the manifest `id`.
    pub fn load(store: &dyn ObjectStore, id: &str) -> Result<Self, SnapshotError> {
        let bytes = store
            .get(&Self::key(id))?
            .ok_or_else(|| SnapshotError::ManifestNotFound(id.to_owned()))?;
        if blake3::hash(&bytes).to_hex().as_str() != id {
            return Err(SnapshotError::Corrupt {
                what: "manifest",
                hash: id.to_owned(),
            });
        }
        let json =
            zstd::stream::decode_all(bytes.as_slice()).map_err(|_| SnapshotError::Corrupt {
                what: "manifest",
                hash: id.to_owned(),
            })?;
        serde_json::from_slice(&json).map_err(|_| SnapshotError::Corrupt {
            what: "manifest",
            hash: id.to_owned(),
        })
    }
}
