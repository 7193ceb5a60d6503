//! The manifest of a tree: every entry's kind, normalised mode, time and content hash,
//! hashed into one digest, so that a copy can be proved equal to its source (I36).
//!
//! A tree is read only through [`WorkspaceRoot`]: listed by descriptor beneath the root,
//! nothing followed (I2). Both the source (while [`crate::copy`] copies it) and the copy
//! (when it is verified) are described by the very same walk, [`Tree::scan`], so the two
//! manifests agree on what is in, what is left out and which names are hard links.
//!
//! What a manifest compares: paths (as exact bytes), kinds, file sizes and SHA-256, symlink
//! targets (as stored), which names are hard links of which, normalised modes
//! ([`normalised_mode`]), and the modification times of files and symlinks to the
//! nanosecond (as `cp -a` keeps them). Not compared: owners (checked separately by [`manifest_of`]), directory times (any rename
//! inside a directory moves them) and link counts to names outside the tree.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use rustix::fs::{statat, AtFlags, FileType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use warren_fs::{Entry, FsError, Kind, WorkspaceRoot, MAX_WALK_DEPTH};

use crate::MigrateError;

/// What one entry of a tree is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file: its size and the SHA-256 of its content.
    File {
        /// Bytes.
        size: u64,
        /// SHA-256 of the content.
        sha256: [u8; 32],
    },
    /// A symbolic link, with its target as stored (never resolved).
    Symlink {
        /// The target's exact bytes.
        target: OsString,
    },
    /// Another name of a file listed earlier in the same tree (same inode).
    HardLink {
        /// The path of that file, relative to the tree root: the first name of the inode in
        /// path-byte order.
        to: OsString,
    },
}

/// One entry of a [`Manifest`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Relative to the tree root, as exact bytes; the root itself is the entry with an empty
    /// path.
    pub path: OsString,
    /// What it is.
    pub kind: EntryKind,
    /// [`normalised_mode`] of its permission bits; 0 for symlinks and hard links.
    pub mode: u32,
    /// Modification time in nanoseconds since the epoch: `Some` for files and symlinks,
    /// `None` for directories and hard links.
    pub modified_unix_ns: Option<i64>,
}

/// Everything a tree holds, entry by entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Manifest {
    /// Sorted by path bytes.
    pub entries: Vec<ManifestEntry>,
    /// Regular files, counted per name: a file with three names (hard links) in the tree
    /// counts 3, as `find -type f | wc -l` and the plan count them.
    pub files: u64,
    /// Bytes of file content, a file with several names counted once.
    pub bytes: u64,
}

impl Manifest {
    /// A manifest of `entries` (sorted by path bytes), with the counts they make.
    pub(crate) fn from_entries(entries: Vec<ManifestEntry>) -> Self {
        let mut manifest = Self {
            entries,
            files: 0,
            bytes: 0,
        };
        for entry in &manifest.entries {
            match entry.kind {
                EntryKind::File { size, .. } => {
                    manifest.files += 1;
                    manifest.bytes += size;
                }
                // Another name of a file counted above: one file more, no bytes.
                EntryKind::HardLink { .. } => manifest.files += 1,
                EntryKind::Dir | EntryKind::Symlink { .. } => {}
            }
        }
        manifest
    }

    /// SHA-256 hex over a canonical, unambiguous encoding of every entry (length-prefixed
    /// fields, a tag per kind, integers little-endian), then the counts.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"warren-migrate manifest v2\0");
        hasher.update((self.entries.len() as u64).to_le_bytes());
        let field = |hasher: &mut Sha256, bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        for entry in &self.entries {
            field(&mut hasher, entry.path.as_bytes());
            match &entry.kind {
                EntryKind::Dir => hasher.update([0u8]),
                EntryKind::File { size, sha256 } => {
                    hasher.update([1u8]);
                    hasher.update(size.to_le_bytes());
                    hasher.update(sha256);
                }
                EntryKind::Symlink { target } => {
                    hasher.update([2u8]);
                    field(&mut hasher, target.as_bytes());
                }
                EntryKind::HardLink { to } => {
                    hasher.update([3u8]);
                    field(&mut hasher, to.as_bytes());
                }
            }
            hasher.update(entry.mode.to_le_bytes());
            match entry.modified_unix_ns {
                None => hasher.update([0u8]),
                Some(ns) => {
                    hasher.update([1u8]);
                    hasher.update(ns.to_le_bytes());
                }
            }
        }
        hasher.update(self.files.to_le_bytes());
        hasher.update(self.bytes.to_le_bytes());
        hex::encode(hasher.finalize())
    }

    /// The first difference between `self` (the source) and `other` (the copy), in path
    /// order, for error messages: `workspace/a.txt: content differs`, `outputs/x: missing
    /// in the copy`, `a.txt: mode 0644 in the source, 0755 in the copy`. Paths are relative
    /// to the tree root (`.` for the root), shown lossily with control characters escaped;
    /// never a host path. `None` when the manifests are equal.
    pub fn first_difference(&self, other: &Manifest) -> Option<String> {
        let (mut mine, mut theirs) = (self.entries.iter().peekable(), other.entries.iter());
        let mut theirs_next = theirs.next();
        loop {
            match (mine.peek(), theirs_next) {
                (None, None) => break,
                (Some(a), None) => return Some(format!("{}: missing in the copy", show(&a.path))),
                (None, Some(b)) => return Some(format!("{}: not in the source", show(&b.path))),
                (Some(a), Some(b)) => match a.path.as_bytes().cmp(b.path.as_bytes()) {
                    std::cmp::Ordering::Less => {
                        return Some(format!("{}: missing in the copy", show(&a.path)))
                    }
                    std::cmp::Ordering::Greater => {
                        return Some(format!("{}: not in the source", show(&b.path)))
                    }
                    std::cmp::Ordering::Equal => {
                        if let Some(difference) = entry_difference(a, b) {
                            return Some(format!("{}: {difference}", show(&a.path)));
                        }
                        mine.next();
                        theirs_next = theirs.next();
                    }
                },
            }
        }
        if (self.files, self.bytes) != (other.files, other.bytes) {
            return Some(format!(
                "{} files of {} bytes in the source, {} files of {} bytes in the copy",
                self.files, self.bytes, other.files, other.bytes
            ));
        }
        None
    }
}

/// How two entries of the same path differ, if they do.
fn entry_difference(a: &ManifestEntry, b: &ManifestEntry) -> Option<String> {
    let kinds = match (&a.kind, &b.kind) {
        (EntryKind::Dir, EntryKind::Dir) => None,
        (
            EntryKind::File {
                size: a_size,
                sha256: a_sha,
            },
            EntryKind::File {
                size: b_size,
                sha256: b_sha,
            },
        ) => {
            if a_size != b_size {
                Some(format!("size {a_size} in the source, {b_size} in the copy"))
            } else if a_sha != b_sha {
                Some("content differs".to_owned())
            } else {
                None
            }
        }
        (EntryKind::Symlink { target: x }, EntryKind::Symlink { target: y }) => {
            (x != y).then(|| {
                format!(
                    "a link to {} in the source, to {} in the copy",
                    show(x),
                    show(y)
                )
            })
        }
        (EntryKind::HardLink { to: x }, EntryKind::HardLink { to: y }) => (x != y).then(|| {
            format!(
                "another name of {} in the source, of {} in the copy",
                show(x),
                show(y)
            )
        }),
        (x, y) => Some(format!(
            "{} in the source, {} in the copy",
            describe(x),
            describe(y)
        )),
    };
    if kinds.is_some() {
        return kinds;
    }
    if a.mode != b.mode {
        return Some(format!(
            "mode {:04o} in the source, {:04o} in the copy",
            a.mode, b.mode
        ));
    }
    if a.modified_unix_ns != b.modified_unix_ns {
        return Some(format!(
            "modified {} in the source, {} in the copy",
            show_time(a.modified_unix_ns),
            show_time(b.modified_unix_ns)
        ));
    }
    None
}

fn describe(kind: &EntryKind) -> String {
    match kind {
        EntryKind::Dir => "a directory".to_owned(),
        EntryKind::File { .. } => "a file".to_owned(),
        EntryKind::Symlink { target } => format!("a symlink to {}", show(target)),
        EntryKind::HardLink { to } => format!("another name (hard link) of {}", show(to)),
    }
}

/// A time to the nanosecond, in UTC: `2023-11-14T22:13:20.123456789Z`.
fn show_time(ns: Option<i64>) -> String {
    match ns {
        None => "at no recorded time".to_owned(),
        Some(ns) => chrono::DateTime::from_timestamp_nanos(ns)
            .format("%Y-%m-%dT%H:%M:%S%.9fZ")
            .to_string(),
    }
}

/// A relative path for messages: lossy UTF-8, control characters (a newline in a name)
/// escaped so a name cannot forge a line of a log, `.` for the empty path.
pub(crate) fn show(path: &OsStr) -> String {
    if path.is_empty() {
        return ".".to_owned();
    }
    let lossy = path.to_string_lossy();
    if !lossy.chars().any(char::is_control) {
        return lossy.into_owned();
    }
    lossy
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The mode a copy gets: permission bits without world-write and set-id bits (sticky
/// kept): `mode & 0o1775`.
pub fn normalised_mode(mode: u32) -> u32 {
    mode & 0o1775
}

/// Hashes the tree `at` beneath `root` (`at` itself a directory).
///
/// With `owner` `Some((uid, gid))`, an entry owned by anyone else is an error
/// ([`MigrateError::VerifyFailed`] naming it). Fifos, sockets and devices are left out (the
/// copy skips them too); a subdirectory on another mount is not entered and left out. A
/// file that changes while it is hashed is an error.
pub fn manifest_of(
    root: &WorkspaceRoot,
    at: &OsStr,
    owner: Option<(u32, u32)>,
) -> Result<Manifest, MigrateError> {
    let tree = Tree::scan(root, at)?;
    let mut buffer = vec![0u8; BUFFER_SIZE];
    let mut entries = Vec::with_capacity(tree.items.len());
    for item in &tree.items {
        let entry = &item.entry;
        if let Some((uid, gid)) = owner {
            if (entry.uid, entry.gid) != (uid, gid) {
                return Err(MigrateError::VerifyFailed {
                    what: show(&tree.base),
                    detail: format!(
                        "{} is owned by {}:{}, not {uid}:{gid}",
                        show(&item.rel),
                        entry.uid,
                        entry.gid
                    ),
                });
            }
        }
        let sha256 = if item.is_content() {
            let what = || format!("hash {}", show(&entry.os_path));
            let file = root
                .open_file(&entry.os_path)
                .map_err(MigrateError::fs(what()))?;
            let sha256 = stream(&file, entry, None, &mut buffer).map_err(|e| match e {
                StreamError::Read(e) | StreamError::Write(e) => MigrateError::io(what())(e),
                StreamError::Changed(how) => MigrateError::VerifyFailed {
                    what: show(&tree.base),
                    detail: format!("{} {how}", show(&item.rel)),
                },
            })?;
            Some(sha256)
        } else {
            None
        };
        entries.push(item.manifest_entry(sha256));
    }
    Ok(Manifest::from_entries(entries))
}

/// The streaming buffer: files are read (and written) 1 MiB at a time, never whole.
pub(crate) const BUFFER_SIZE: usize = 1 << 20;

/// The most entries a tree may have: the listing is the one thing held in memory.
const MAX_ENTRIES: usize = 5_000_000;

/// A tree as listed beneath a root: what is in (sorted by path bytes, hard links found)
/// and what is left out.
#[derive(Debug)]
pub(crate) struct Tree {
    /// The tree root's normalised path beneath the root, as exact bytes.
    pub(crate) base: OsString,
    /// The root first, then every entry, sorted by `rel` bytes (a parent before its
    /// children).
    pub(crate) items: Vec<Item>,
    /// Entries left out: fifos, sockets, devices, directories on another mount.
    pub(crate) left_out: Vec<LeftOut>,
}

/// One entry kept in a [`Tree`].
#[derive(Debug)]
pub(crate) struct Item {
    /// Relative to the tree root (empty for the root).
    pub(crate) rel: OsString,
    /// As listed (its `os_path` is relative to the workspace root).
    pub(crate) entry: Entry,
    /// For a regular file that is not the first name of its inode in the tree: that first
    /// name's `rel`.
    pub(crate) link_to: Option<OsString>,
    /// For the first name of a regular file: how many names the inode has in the tree.
    pub(crate) names_in_tree: u64,
}

impl Item {
    /// A regular file whose content is read (the first name of its inode).
    pub(crate) fn is_content(&self) -> bool {
        self.entry.kind == Kind::File && self.link_to.is_none()
    }

    /// The manifest entry of this item; `sha256` is that of the content for
    /// [`Item::is_content`].
    pub(crate) fn manifest_entry(&self, sha256: Option<[u8; 32]>) -> ManifestEntry {
        let entry = &self.entry;
        let (kind, mode, modified_unix_ns) = match (&entry.kind, &self.link_to) {
            (Kind::File, Some(to)) => (EntryKind::HardLink { to: to.clone() }, 0, None),
            (Kind::File, None) => (
                EntryKind::File {
                    size: entry.size,
                    sha256: sha256.unwrap_or_default(),
                },
                normalised_mode(entry.mode),
                Some(entry.modified_unix_ns),
            ),
            (Kind::Symlink, _) => (
                EntryKind::Symlink {
                    target: entry.os_symlink_target.clone().unwrap_or_default(),
                },
                0,
                Some(entry.modified_unix_ns),
            ),
            (Kind::Dir | Kind::Other, _) => (EntryKind::Dir, normalised_mode(entry.mode), None),
        };
        ManifestEntry {
            path: self.rel.clone(),
            kind,
            mode,
            modified_unix_ns,
        }
    }
}

/// An entry a tree leaves out.
#[derive(Debug)]
pub(crate) struct LeftOut {
    /// Relative to the tree root.
    pub(crate) rel: OsString,
    /// What it is: `a fifo`, `a socket`, `a device`, `a directory on another mount`.
    pub(crate) what: &'static str,
}

impl Tree {
    /// Lists the directory `at` beneath `root` whole (refusing a tree too large or too deep
    /// to list completely: a cut listing would be a silently partial copy), leaves out what
    /// is neither a directory, a file nor a symlink and the directories on another mount,
    /// sorts by path bytes and finds the hard links.
    pub(crate) fn scan(root: &WorkspaceRoot, at: &OsStr) -> Result<Self, MigrateError> {
        let what = || format!("list {}", show(at));
        let top = root.stat(at).map_err(MigrateError::fs(what()))?;
        if top.kind != Kind::Dir {
            return Err(MigrateError::fs(what())(FsError::NotADirectory {
                path: top.path,
            }));
        }
        let listing = root
            .list(at, MAX_WALK_DEPTH, MAX_ENTRIES)
            .map_err(MigrateError::fs(what()))?;
        if listing.truncated {
            return Err(MigrateError::fs(what())(FsError::TooManyEntries {
                path: top.path,
                limit: MAX_ENTRIES,
            }));
        }
        let base = top.os_path.clone();
        let mut items = vec![Item {
            rel: OsString::new(),
            entry: top,
            link_to: None,
            names_in_tree: 1,
        }];
        let mut left_out = Vec::new();
        for entry in listing.entries {
            let rel = relative(&base, &entry.os_path);
            match entry.kind {
                Kind::Other => left_out.push(LeftOut {
                    what: special_kind(root, &entry.os_path),
                    rel,
                }),
                Kind::Dir if !Self::entered(root, &entry, &rel)? => left_out.push(LeftOut {
                    what: "a directory on another mount",
                    rel,
                }),
                Kind::Dir | Kind::File | Kind::Symlink => items.push(Item {
                    rel,
                    entry,
                    link_to: None,
                    names_in_tree: 1,
                }),
            }
        }
        items.sort_unstable_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
        find_hard_links(&mut items);
        Ok(Self {
            base,
            items,
            left_out,
        })
    }

    /// Whether the listing entered the directory `entry`: `false` for one on another mount
    /// (the walk lists it but does not enter it); any other reason the walk would have
    /// passed it by (unreadable, replaced, deeper than the walk goes) is an error, never a
    /// silently missing subtree.
    fn entered(root: &WorkspaceRoot, entry: &Entry, rel: &OsStr) -> Result<bool, MigrateError> {
        let what = || format!("list {}", show(&entry.os_path));
        match root.open_dir(&entry.os_path) {
            Ok(_) => {}
            Err(FsError::MountCrossingRefused { .. }) => return Ok(false),
            Err(e) => return Err(MigrateError::fs(what())(e)),
        }
        let depth = rel.as_bytes().split(|b| *b == b'/').count();
        if depth >= MAX_WALK_DEPTH as usize {
            let inside = root
                .list(&entry.os_path, 1, 1)
                .map_err(MigrateError::fs(what()))?;
            if !inside.entries.is_empty() {
                return Err(MigrateError::fs(what())(FsError::TooDeep {
                    path: entry.path.clone(),
                    limit: MAX_WALK_DEPTH,
                }));
            }
        }
        Ok(true)
    }
}

/// `path` (beneath the workspace root) relative to `base`, a directory it is listed under.
fn relative(base: &OsStr, path: &OsStr) -> OsString {
    let rest = path
        .as_bytes()
        .strip_prefix(base.as_bytes())
        .map(|rest| rest.strip_prefix(b"/").unwrap_or(rest))
        .unwrap_or(path.as_bytes());
    OsStr::from_bytes(rest).to_owned()
}

/// Marks every later name of a multiply linked file (in `items`' order) as a link to its
/// first name, and counts each first name's names in the tree.
fn find_hard_links(items: &mut [Item]) {
    let mut first: HashMap<u64, usize> = HashMap::new();
    for index in 0..items.len() {
        let entry = &items[index].entry;
        if entry.kind != Kind::File || entry.links < 2 {
            continue;
        }
        match first.get(&entry.inode) {
            None => {
                first.insert(entry.inode, index);
            }
            Some(&head) => {
                items[head].names_in_tree += 1;
                items[index].link_to = Some(items[head].rel.clone());
            }
        }
    }
}

/// What a listed entry that is neither a directory, a file nor a symlink is. Its parent is
/// opened by descriptor beneath the root (I2) and the name itself `lstat`ed, not followed.
fn special_kind(root: &WorkspaceRoot, os_path: &OsStr) -> &'static str {
    const UNKNOWN: &str = "a special file (a fifo, a socket or a device)";
    let bytes = os_path.as_bytes();
    let (parent, name) = match bytes.iter().rposition(|b| *b == b'/') {
        Some(slash) => (&bytes[..slash], &bytes[slash + 1..]),
        None => (&b""[..], bytes),
    };
    let Ok(dir) = root.open_dir(OsStr::from_bytes(parent)) else {
        return UNKNOWN;
    };
    match statat(
        dir.as_fd(),
        OsStr::from_bytes(name),
        AtFlags::SYMLINK_NOFOLLOW,
    ) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Fifo => "a fifo",
            FileType::Socket => "a socket",
            FileType::CharacterDevice | FileType::BlockDevice => "a device",
            _ => UNKNOWN,
        },
        Err(_) => UNKNOWN,
    }
}

/// Why streaming a file failed.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// Reading the source failed.
    Read(std::io::Error),
    /// Writing the copy failed.
    Write(std::io::Error),
    /// The file is not what was listed: it changed while it was read (how, in words).
    Changed(String),
}

/// Reads the open regular file `file` (listed as `listed`) to its end through `buffer`,
/// writing every chunk to `out` if given, and returns the SHA-256 of the bytes read.
///
/// The file must be what was listed, before and after: the same inode, exactly
/// `listed.size` bytes (reading stops as soon as there are more) and the same modification
/// time, to the nanosecond; anything else is [`StreamError::Changed`].
pub(crate) fn stream(
    mut file: &File,
    listed: &Entry,
    mut out: Option<&mut File>,
    buffer: &mut [u8],
) -> Result<[u8; 32], StreamError> {
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    loop {
        let n = match file.read(buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(StreamError::Read(e)),
        };
        total += n as u64;
        if total > listed.size {
            return Err(StreamError::Changed(format!(
                "grew while it was read ({} bytes listed, more read)",
                listed.size
            )));
        }
        hasher.update(&buffer[..n]);
        if let Some(out) = out.as_deref_mut() {
            out.write_all(&buffer[..n]).map_err(StreamError::Write)?;
        }
    }
    if total != listed.size {
        return Err(StreamError::Changed(format!(
            "shrank while it was read ({} bytes listed, {total} read)",
            listed.size
        )));
    }
    let now = file.metadata().map_err(StreamError::Read)?;
    let modified_ns = now
        .mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(now.mtime_nsec());
    if now.ino() != listed.inode {
        return Err(StreamError::Changed(
            "was replaced by another file after it was listed".to_owned(),
        ));
    }
    if now.len() != listed.size || modified_ns != listed.modified_unix_ns {
        return Err(StreamError::Changed(
            "was modified while it was read".to_owned(),
        ));
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_entry(path: &str, content: &[u8], ns: i64) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind: EntryKind::File {
                size: content.len() as u64,
                sha256: Sha256::digest(content).into(),
            },
            mode: 0o644,
            modified_unix_ns: Some(ns),
        }
    }

    fn sample() -> Manifest {
        Manifest::from_entries(vec![
            ManifestEntry {
                path: "".into(),
                kind: EntryKind::Dir,
                mode: 0o755,
                modified_unix_ns: None,
            },
            file_entry("a.txt", b"hello", 1_700_000_000_123_456_789),
            ManifestEntry {
                path: "b".into(),
                kind: EntryKind::HardLink { to: "a.txt".into() },
                mode: 0,
                modified_unix_ns: None,
            },
            ManifestEntry {
                path: "l".into(),
                kind: EntryKind::Symlink {
                    target: "a.txt".into(),
                },
                mode: 0,
                modified_unix_ns: Some(5),
            },
        ])
    }

    #[test]
    fn a_manifest_counts_files_per_name_and_bytes_once_per_inode() {
        // `a.txt` and its other name `b`: two files, five bytes.
        let manifest = sample();
        assert_eq!((manifest.files, manifest.bytes), (2, 5));
        let mut three_names = sample();
        three_names.entries.push(ManifestEntry {
            path: "c".into(),
            kind: EntryKind::HardLink { to: "a.txt".into() },
            mode: 0,
            modified_unix_ns: None,
        });
        let three_names = Manifest::from_entries(three_names.entries);
        assert_eq!((three_names.files, three_names.bytes), (3, 5));
    }

    #[test]
    fn the_digest_is_stable_and_changes_with_any_field() {
        let manifest = sample();
        assert_eq!(manifest.digest(), sample().digest());
        assert_eq!(manifest.digest().len(), 64);
        let mut changed = vec![];
        let mut one_byte = sample();
        one_byte.entries[1] = file_entry("a.txt", b"hellp", 1_700_000_000_123_456_789);
        changed.push(one_byte);
        let mut mode = sample();
        mode.entries[1].mode = 0o664;
        changed.push(mode);
        let mut time = sample();
        time.entries[3].modified_unix_ns = Some(6);
        changed.push(time);
        let mut target = sample();
        target.entries[3].kind = EntryKind::Symlink { target: "b".into() };
        changed.push(target);
        // Moving bytes between adjacent fields must not collide (length prefixes).
        let mut shifted = sample();
        shifted.entries[3].path = "lb".into();
        shifted.entries[3].kind = EntryKind::Symlink { target: "".into() };
        let mut unshifted = sample();
        unshifted.entries[3].kind = EntryKind::Symlink { target: "b".into() };
        assert_ne!(shifted.digest(), unshifted.digest());
        for other in changed {
            assert_ne!(other.digest(), manifest.digest(), "{other:?}");
        }
    }

    #[test]
    fn the_first_difference_names_the_path_and_what_differs() {
        let source = sample();
        assert_eq!(source.first_difference(&sample()), None);
        let mut content = sample();
        content.entries[1] = file_entry("a.txt", b"hellp", 1_700_000_000_123_456_789);
        assert_eq!(
            source.first_difference(&content).unwrap(),
            "a.txt: content differs"
        );
        let mut size = sample();
        size.entries[1] = file_entry("a.txt", b"hello!", 1_700_000_000_123_456_789);
        assert_eq!(
            source.first_difference(&size).unwrap(),
            "a.txt: size 5 in the source, 6 in the copy"
        );
        let mut missing = sample();
        missing.entries.remove(2);
        assert_eq!(
            source.first_difference(&missing).unwrap(),
            "b: missing in the copy"
        );
        let mut extra = sample();
        extra.entries.push(file_entry("z\nz", b"", 0));
        assert_eq!(
            source.first_difference(&extra).unwrap(),
            "z\\nz: not in the source"
        );
        let mut mode = sample();
        mode.entries[0].mode = 0o775;
        assert_eq!(
            source.first_difference(&mode).unwrap(),
            ".: mode 0755 in the source, 0775 in the copy"
        );
        let mut time = sample();
        time.entries[1].modified_unix_ns = Some(1_700_000_000_123_456_790);
        assert_eq!(
            source.first_difference(&time).unwrap(),
            "a.txt: modified 2023-11-14T22:13:20.123456789Z in the source, \
             2023-11-14T22:13:20.123456790Z in the copy"
        );
        let mut before_1970 = sample();
        before_1970.entries[1].modified_unix_ns = Some(-1);
        assert_eq!(
            source.first_difference(&before_1970).unwrap(),
            "a.txt: modified 2023-11-14T22:13:20.123456789Z in the source, \
             1969-12-31T23:59:59.999999999Z in the copy"
        );
        let mut kind = sample();
        kind.entries[2] = file_entry("b", b"hello", 1);
        assert_eq!(
            source.first_difference(&kind).unwrap(),
            "b: another name (hard link) of a.txt in the source, a file in the copy"
        );
    }

    #[test]
    fn normalising_a_mode_drops_world_write_and_set_id_bits_and_keeps_sticky() {
        for (mode, want) in [
            (0o644, 0o644),
            (0o666, 0o664),
            (0o777, 0o775),
            (0o4755, 0o755),
            (0o2775, 0o775),
            (0o1777, 0o1775),
            (0o100644, 0o644),
        ] {
            assert_eq!(normalised_mode(mode), want, "{mode:o}");
        }
    }

    #[test]
    fn a_path_is_shown_lossily_with_control_characters_escaped() {
        use std::os::unix::ffi::OsStringExt;
        assert_eq!(show(OsStr::new("")), ".");
        assert_eq!(show(OsStr::new("a b/c")), "a b/c");
        assert_eq!(show(OsStr::new("new\nline")), "new\\nline");
        assert_eq!(
            show(&OsString::from_vec(b"caf\xe9".to_vec())),
            "caf\u{fffd}"
        );
    }
}
