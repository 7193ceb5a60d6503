//! Strong ETags: `b3-` followed by the first 128 bits of the BLAKE3 hash of the whole content,
//! in lowercase hex.
//!
//! The value is derived from the bytes alone (not from inode, size or mtime), so two files with
//! the same content have the same tag and a tag survives the atomic replace that every write
//! does. Conditional writes compare these values under the directory lock (I27).

use std::fmt;
use std::str::FromStr;

use crate::error::{shorten, FsError};

const PREFIX: &str = "b3-";
/// Hex digits kept from the hash: 128 bits is far beyond accidental collisions.
const HEX_LEN: usize = 32;

/// A strong entity tag of a file's full content, without surrounding quotes.
///
/// `Display` prints the bare value (`b3-…`); [`Etag::quoted`] gives the HTTP header form.
/// Parsing accepts both forms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Etag(String);

impl Etag {
    /// The ETag of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let mut hasher = EtagHasher::new();
        hasher.update(bytes);
        hasher.finish()
    }

    /// A tag no content has. An `If-Match` that names only tags warren never issued
    /// compares as this one, so its precondition fails where preconditions are evaluated,
    /// once the target is found (412, RFC 9110 §13.1.1), not as a malformed request.
    pub fn unmatchable() -> Self {
        Self("unmatchable".to_owned())
    }

    /// The bare value, e.g. `b3-0123…`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value in double quotes, as an HTTP `ETag` header carries it.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Etag {
    type Err = FsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || FsError::InvalidEtag { value: shorten(s) };
        let bare = match s.strip_prefix('"') {
            Some(rest) => rest.strip_suffix('"').ok_or_else(invalid)?,
            None => s,
        };
        let hex = bare.strip_prefix(PREFIX).ok_or_else(invalid)?;
        let well_formed = hex.len() == HEX_LEN
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(invalid());
        }
        Ok(Self(bare.to_owned()))
    }
}

/// Streams content into an [`Etag`], so large files are hashed while they are read, never
/// loaded twice.
pub(crate) struct EtagHasher(blake3::Hasher);

impl EtagHasher {
    pub(crate) fn new() -> Self {
        Self(blake3::Hasher::new())
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub(crate) fn finish(self) -> Etag {
        let hex = self.0.finalize().to_hex();
        // `to_hex` of a 32-byte hash is 64 ASCII hex digits, so slicing the first 32 bytes is
        // in bounds and on a char boundary.
        Etag(format!("{PREFIX}{}", &hex.as_str()[..HEX_LEN]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_has_prefix_and_128_bits_of_hex() {
        let tag = Etag::of(b"hello");
        assert!(tag.as_str().starts_with("b3-"));
        assert_eq!(tag.as_str().len(), 3 + 32);
        assert_ne!(tag, Etag::of(b"hello!"));
        assert_eq!(tag, Etag::of(b"hello"));
    }

    #[test]
    fn streaming_hash_equals_one_shot_hash() {
        let mut h = EtagHasher::new();
        h.update(b"hel");
        h.update(b"lo");
        assert_eq!(h.finish(), Etag::of(b"hello"));
    }

    #[test]
    fn parse_accepts_bare_and_quoted_values() {
        let tag = Etag::of(b"x");
        assert_eq!(tag.as_str().parse::<Etag>().unwrap(), tag);
        assert_eq!(tag.quoted().parse::<Etag>().unwrap(), tag);
        assert_eq!(tag.to_string(), tag.as_str());
    }

    #[test]
    fn parse_refuses_malformed_values() {
        let tag = Etag::of(b"x");
        let cases = [
            "".to_owned(),
            "\"".to_owned(),
            "b3-".to_owned(),
            format!("W/{}", tag.quoted()),
            format!("\"{tag}"),
            tag.as_str().to_uppercase(),
            format!("{tag}0"),
            tag.as_str().replace("b3-", "md5-"),
        ];
        for case in cases {
            assert!(
                matches!(case.parse::<Etag>(), Err(FsError::InvalidEtag { .. })),
                "{case:?} should be refused"
            );
        }
    }
}

/// What identifies one version of a file's content cheaply: device, inode, size and the
/// modification and change times in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FileVersion([i64; 7]);

impl FileVersion {
    pub(crate) fn of(file: &std::fs::File) -> Option<Self> {
        let stat = rustix::fs::fstat(file).ok()?;
        Some(Self([
            stat.st_dev as i64,
            stat.st_ino as i64,
            stat.st_size,
            stat.st_mtime,
            stat.st_mtime_nsec as i64,
            stat.st_ctime,
            stat.st_ctime_nsec as i64,
        ]))
    }
}

/// ETags of file versions already hashed, so a ranged read of a large file does not hash
/// all of it again each time.
///
/// Only reads use it. Timestamps can be coarse, so two writes in one clock tick could leave
/// the same version with other content; a read may then report an older ETag, and a write
/// conditioned on it fails with 412 (writes always hash the file under the lock). Stale,
/// never a lost update.
static KNOWN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<FileVersion, Etag>>> =
    std::sync::LazyLock::new(Default::default);

/// Most versions remembered; the table starts over when full.
const KNOWN_MAX: usize = 16_384;

pub(crate) fn known(version: FileVersion) -> Option<Etag> {
    KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&version)
        .cloned()
}

pub(crate) fn remember(version: FileVersion, etag: &Etag) {
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if known.len() >= KNOWN_MAX {
        known.clear();
    }
    known.insert(version, etag.clone());
}
