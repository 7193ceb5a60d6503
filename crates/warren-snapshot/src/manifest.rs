//! The manifest: everything needed to rebuild a tree, itself stored by its hash.
//!
//! Names are bytes (Linux file names and symlink targets need not be UTF-8). In the JSON a
//! name that is UTF-8 is a string under its field (`path`, `target`, `link_to`), exactly as
//! in versions 1 and 2; one that is not is stored, instead, as lowercase hex of its bytes
//! under the same field name with `_hex` appended. A reader of version 2 requires `path` and
//! so refuses such a manifest as corrupt rather than restoring a wrong name.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use serde::{Deserialize, Serialize, Serializer};

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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "WireEntry<'static>")]
pub struct ManifestEntry {
    /// Path relative to the tree's root, `/`-joined, as the exact bytes of its names; empty
    /// for the root itself.
    pub path: OsString,
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
    pub inode: u64,
    /// See `inode`.
    pub changed_unix_ns: i64,
    /// Size in bytes (files).
    pub size: u64,
    /// For a symlink, its target as stored, byte for byte.
    pub target: Option<OsString>,
    /// For a hard link, the path of the first entry of the same file.
    pub link_to: Option<OsString>,
    /// For a file that is not a hard link of an earlier one, its chunks in order.
    pub chunks: Vec<ChunkRef>,
    /// For a sparse file, its holes in order: ranges that read as zeros and were neither
    /// read nor stored. The chunks hold the bytes outside them, in order, and a restore
    /// recreates the holes, so a sparse file comes back sparse. Empty for a dense file
    /// (and in manifests of version 1, which never recorded holes).
    pub holes: Vec<Hole>,
}

/// A [`ManifestEntry`] as its JSON has it: fields in the order of versions 1 and 2, each
/// name either a string or (not UTF-8) hex under `<field>_hex`.
#[derive(Serialize, Deserialize)]
struct WireEntry<'a> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_hex: Option<String>,
    kind: EntryKind,
    mode: u32,
    uid: u32,
    gid: u32,
    modified_unix_ms: i64,
    #[serde(default)]
    inode: u64,
    #[serde(default)]
    changed_unix_ns: i64,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_hex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    link_to: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    link_to_hex: Option<String>,
    #[serde(default, skip_serializing_if = "<[ChunkRef]>::is_empty")]
    chunks: Cow<'a, [ChunkRef]>,
    #[serde(default, skip_serializing_if = "<[Hole]>::is_empty")]
    holes: Cow<'a, [Hole]>,
}

impl Serialize for ManifestEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (path, path_hex) = split_name(&self.path);
        let (target, target_hex) = self.target.as_deref().map_or((None, None), split_name);
        let (link_to, link_to_hex) = self.link_to.as_deref().map_or((None, None), split_name);
        WireEntry {
            path,
            path_hex,
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            modified_unix_ms: self.modified_unix_ms,
            inode: self.inode,
            changed_unix_ns: self.changed_unix_ns,
            size: self.size,
            target,
            target_hex,
            link_to,
            link_to_hex,
            chunks: Cow::Borrowed(&self.chunks),
            holes: Cow::Borrowed(&self.holes),
        }
        .serialize(serializer)
    }
}

impl TryFrom<WireEntry<'_>> for ManifestEntry {
    type Error = String;

    fn try_from(wire: WireEntry<'_>) -> Result<Self, String> {
        Ok(Self {
            path: join_name("path", wire.path, wire.path_hex)?
                .ok_or("an entry has neither path nor path_hex")?,
            kind: wire.kind,
            mode: wire.mode,
            uid: wire.uid,
            gid: wire.gid,
            modified_unix_ms: wire.modified_unix_ms,
            inode: wire.inode,
            changed_unix_ns: wire.changed_unix_ns,
            size: wire.size,
            target: join_name("target", wire.target, wire.target_hex)?,
            link_to: join_name("link_to", wire.link_to, wire.link_to_hex)?,
            chunks: wire.chunks.into_owned(),
            holes: wire.holes.into_owned(),
        })
    }
}

/// A name as the wire has it: the string when it is UTF-8, otherwise its hex.
fn split_name(name: &OsStr) -> (Option<Cow<'_, str>>, Option<String>) {
    match name.to_str() {
        Some(text) => (Some(Cow::Borrowed(text)), None),
        None => (None, Some(to_hex(name.as_bytes()))),
    }
}

/// A name back from the wire; both forms at once is a damaged entry.
fn join_name(
    field: &str,
    text: Option<Cow<'_, str>>,
    hex: Option<String>,
) -> Result<Option<OsString>, String> {
    match (text, hex) {
        (None, None) => Ok(None),
        (Some(text), None) => Ok(Some(OsString::from(text.into_owned()))),
        (None, Some(hex)) => from_hex(&hex)
            .map(|bytes| Some(OsString::from_vec(bytes)))
            .ok_or_else(|| format!("{field}_hex is not hex")),
        (Some(_), Some(_)) => Err(format!("an entry has both {field} and {field}_hex")),
    }
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
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
    /// 3 added names that are not UTF-8 (`path_hex`, `target_hex`, `link_to_hex`); a
    /// manifest of version 1 or 2 has none and reads as it always did.
    pub(crate) const VERSION: u32 = 3;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &[u8], target: Option<&[u8]>, link_to: Option<&[u8]>) -> ManifestEntry {
        ManifestEntry {
            path: OsString::from_vec(path.to_vec()),
            kind: EntryKind::File,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            modified_unix_ms: 1,
            inode: 2,
            changed_unix_ns: 3,
            size: 4,
            target: target.map(|t| OsString::from_vec(t.to_vec())),
            link_to: link_to.map(|l| OsString::from_vec(l.to_vec())),
            chunks: vec![ChunkRef {
                hash: "ab".into(),
                len: 4,
            }],
            holes: vec![Hole { offset: 8, len: 9 }],
        }
    }

    #[test]
    fn a_utf8_entry_serialises_exactly_as_in_version_2() {
        let json = serde_json::to_string(&entry(b"a/b", Some(b"t"), Some(b"l"))).unwrap();
        assert_eq!(
            json,
            r#"{"path":"a/b","kind":"file","mode":420,"uid":1000,"gid":1000,"modified_unix_ms":1,"inode":2,"changed_unix_ns":3,"size":4,"target":"t","link_to":"l","chunks":[{"hash":"ab","len":4}],"holes":[{"offset":8,"len":9}]}"#
        );
        let bare = ManifestEntry {
            target: None,
            link_to: None,
            chunks: Vec::new(),
            holes: Vec::new(),
            ..entry(b"", None, None)
        };
        assert_eq!(
            serde_json::to_string(&bare).unwrap(),
            r#"{"path":"","kind":"file","mode":420,"uid":1000,"gid":1000,"modified_unix_ms":1,"inode":2,"changed_unix_ns":3,"size":4}"#
        );
    }

    #[test]
    fn names_that_are_not_utf8_are_stored_as_hex_and_read_back_byte_for_byte() {
        let original = entry(b"caf\xe9", Some(b"/x/\xff"), Some(b"d\xfe/h"));
        let json = serde_json::to_value(&original).unwrap();
        assert_eq!(json["path_hex"], "636166e9");
        assert_eq!(json["target_hex"], "2f782fff");
        assert_eq!(json["link_to_hex"], "64fe2f68");
        for field in ["path", "target", "link_to"] {
            assert!(json.get(field).is_none(), "{field} written too: {json}");
        }
        let back: ManifestEntry = serde_json::from_value(json).unwrap();
        assert_eq!(back, original);
    }

    #[test]
    fn an_entry_with_both_forms_of_a_name_or_bad_hex_or_no_path_is_refused() {
        let mut json = serde_json::to_value(entry(b"a", None, None)).unwrap();
        json["path_hex"] = "61".into();
        assert!(serde_json::from_value::<ManifestEntry>(json.clone()).is_err());
        json.as_object_mut().unwrap().remove("path");
        json["path_hex"] = "6".into();
        assert!(serde_json::from_value::<ManifestEntry>(json.clone()).is_err());
        json["path_hex"] = "zz".into();
        assert!(serde_json::from_value::<ManifestEntry>(json.clone()).is_err());
        json.as_object_mut().unwrap().remove("path_hex");
        assert!(serde_json::from_value::<ManifestEntry>(json).is_err());
    }

    #[test]
    fn hex_round_trips_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(
            from_hex("ABCD"),
            None,
            "only lowercase is written, so only it is read"
        );
    }
}
