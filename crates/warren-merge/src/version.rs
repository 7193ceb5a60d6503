//! Each side of a conflict as a [`Version`]: small UTF-8 files as their text, other files
//! by size and hash, links by their target text (never followed), directories by mode.

use crate::error::MergeError;
use crate::model::{to_hex, Kind, Version, TEXT_MAX};
use crate::ours::Bytes;
use crate::read::{is_text, Tree};

/// Where a file's bytes are read from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src<'a> {
    /// The file at this path of a tree.
    Tree(Tree<'a>, &'a str),
    /// What a state of ours says (the target's file, a branch's, or merged text).
    Bytes(Option<&'a Bytes>),
}

/// Reads a file's bytes, checked against the hash they are known by.
pub(crate) trait Load {
    /// The content at `src`, which must hash to `hash`.
    fn load(&self, src: Src<'_>, hash: &[u8; 32], size: u64) -> Result<Vec<u8>, MergeError>;
}

/// `kind` at `src` as a conflict shows it. Only files of at most [`TEXT_MAX`] bytes are read.
pub(crate) fn version(
    loader: &impl Load,
    kind: Option<&Kind>,
    src: Src<'_>,
) -> Result<Version, MergeError> {
    Ok(match kind {
        None => Version::Absent,
        Some(Kind::Dir { mode }) => Version::Dir { mode: *mode },
        Some(Kind::Symlink { target }) => Version::Symlink {
            target: target.clone(),
        },
        Some(Kind::File { mode, size, hash }) => {
            if *size <= TEXT_MAX {
                let bytes = loader.load(src, hash, *size)?;
                if is_text(&bytes) {
                    // `is_text` checked the bytes are UTF-8.
                    if let Ok(text) = String::from_utf8(bytes) {
                        return Ok(Version::Text { text, mode: *mode });
                    }
                }
            }
            Version::Binary {
                size: *size,
                hash: to_hex(hash),
                mode: *mode,
            }
        }
    })
}
