//! Reading trees for a merge, only through [`WorkspaceRoot`]: every path is resolved beneath
//! the root's descriptor by warren-fs (no link followed, no `..`, no mount crossed), links
//! are described and never followed, and special files are refused, never opened.

use std::io::Read;

use warren_fs::{Entry, FsError, Kind as FsKind, WorkspaceRoot, MAX_WALK_DEPTH};

use crate::error::MergeError;
use crate::model::{Kind, MODE_BITS};

/// The most entries one walk of a tree takes (as warren-fs's whole-tree copy).
pub(crate) const LIST_LIMIT: usize = 5_000_000;

/// Streaming buffer size.
const CHUNK: usize = 64 * 1024;

/// One tree and the name its errors carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tree<'a> {
    pub(crate) root: &'a WorkspaceRoot,
    pub(crate) name: &'static str,
}

impl<'a> Tree<'a> {
    pub(crate) fn new(root: &'a WorkspaceRoot, name: &'static str) -> Self {
        Self { root, name }
    }

    /// The entry at `path` as a listing shows it (a link described, not followed), or
    /// `None` when nothing is there as a tree entry: missing, or beneath a file or a link.
    pub(crate) fn describe(&self, path: &str) -> Result<Option<Entry>, MergeError> {
        match self.root.describe(path) {
            Ok(entry) => Ok(Some(entry)),
            Err(
                FsError::NotFound { .. }
                | FsError::NotADirectory { .. }
                | FsError::SymlinkRefused { .. },
            ) => Ok(None),
            Err(e) => Err(MergeError::read(self.name)(e)),
        }
    }

    /// The [`Kind`] of a described entry, hashing a file's content.
    pub(crate) fn kind_of(&self, entry: &Entry) -> Result<Kind, MergeError> {
        let path = || entry.path.clone();
        if entry.os_path.to_str().is_none() {
            return Err(MergeError::NotUtf8 {
                tree: self.name,
                path: path(),
            });
        }
        Ok(match entry.kind {
            FsKind::File => {
                let (hash, size) = self.hash_file(&entry.path)?;
                Kind::File {
                    mode: entry.mode & MODE_BITS,
                    size,
                    hash,
                }
            }
            FsKind::Dir => Kind::Dir {
                mode: entry.mode & MODE_BITS,
            },
            FsKind::Symlink => {
                let target = entry.os_symlink_target.as_deref().unwrap_or_default();
                let Some(target) = target.to_str() else {
                    return Err(MergeError::NotUtf8 {
                        tree: self.name,
                        path: path(),
                    });
                };
                Kind::Symlink {
                    target: target.to_owned(),
                }
            }
            FsKind::Other => {
                return Err(MergeError::SpecialFile {
                    tree: self.name,
                    path: path(),
                })
            }
        })
    }

    /// The [`Kind`] at `path`, or `None` when nothing is there.
    pub(crate) fn kind_at(&self, path: &str) -> Result<Option<Kind>, MergeError> {
        self.describe(path)?
            .map(|entry| self.kind_of(&entry))
            .transpose()
    }

    /// BLAKE3 and size of the regular file at `path`, streamed.
    pub(crate) fn hash_file(&self, path: &str) -> Result<([u8; 32], u64), MergeError> {
        let mut file = self
            .root
            .open_file(path)
            .map_err(MergeError::read(self.name))?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; CHUNK];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(|e| self.io(path, &e))?;
            if n == 0 {
                return Ok((*hasher.finalize().as_bytes(), size));
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
    }

    /// The whole content of the file at `path`, or `None` when it is larger than `cap`.
    pub(crate) fn read_capped(&self, path: &str, cap: u64) -> Result<Option<Vec<u8>>, MergeError> {
        let file = self
            .root
            .open_file(path)
            .map_err(MergeError::read(self.name))?;
        let mut bytes = Vec::new();
        file.take(cap.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| self.io(path, &e))?;
        Ok((bytes.len() as u64 <= cap).then_some(bytes))
    }

    /// Every entry beneath the directory `path` (not `path` itself), parents before
    /// children. A tree deeper than one walk goes is walked on from where it stopped.
    pub(crate) fn walk(&self, path: &str) -> Result<Vec<Entry>, MergeError> {
        let listing = self
            .root
            .list(path, MAX_WALK_DEPTH, LIST_LIMIT)
            .map_err(MergeError::read(self.name))?;
        if listing.truncated {
            return Err(MergeError::TooManyEntries {
                tree: self.name,
                path: path.to_owned(),
                limit: LIST_LIMIT,
            });
        }
        let base_depth = depth(path);
        let mut out = Vec::with_capacity(listing.entries.len());
        for entry in listing.entries {
            let deep = entry.kind == FsKind::Dir
                && depth(&entry.path) - base_depth >= MAX_WALK_DEPTH as usize;
            let path = entry.path.clone();
            out.push(entry);
            if deep {
                out.extend(self.walk(&path)?);
            }
        }
        Ok(out)
    }

    /// The entries directly in the directory `path`; none when it is not a directory here.
    pub(crate) fn children(&self, path: &str) -> Result<Vec<Entry>, MergeError> {
        match self.describe(path)? {
            Some(entry) if entry.kind == FsKind::Dir => {}
            _ => return Ok(Vec::new()),
        }
        let listing = self
            .root
            .list(path, 1, LIST_LIMIT)
            .map_err(MergeError::read(self.name))?;
        if listing.truncated {
            return Err(MergeError::TooManyEntries {
                tree: self.name,
                path: path.to_owned(),
                limit: LIST_LIMIT,
            });
        }
        Ok(listing.entries)
    }

    fn io(&self, path: &str, error: &std::io::Error) -> MergeError {
        MergeError::Read {
            tree: self.name,
            source: FsError::Read {
                path: path.to_owned(),
                errno: std::io::Error::new(error.kind(), error.to_string()),
            },
        }
    }
}

/// How many components a relative path has.
fn depth(path: &str) -> usize {
    if path.is_empty() {
        0
    } else {
        path.split('/').count()
    }
}

/// Whether `bytes` is text a line merge can take: UTF-8 without NUL.
pub(crate) fn is_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}
