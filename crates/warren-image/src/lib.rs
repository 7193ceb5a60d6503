//! Unpacks OCI images into root filesystems for warren's runtimes.
//!
//! An image arrives as an OCI image layout (a directory with `index.json`, `blobs/sha256/…`,
//! or a tar archive of one, as `docker save` and `skopeo copy … oci-archive:` write). Every
//! blob is checked against its SHA-256 digest; layers (tar, gzip or zstd) are applied in
//! order into a staging directory with OCI whiteouts honoured, and the finished root
//! filesystem is renamed into place: an interrupted or refused import leaves nothing.
//!
//! **Architecture invariant:** extraction resolves every parent directory beneath the
//! staging root by file descriptor (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`)
//! and creates entries with `*at` calls, so no entry — `..`, an absolute path, a path through
//! a symlink the image planted, a hard link to a host file — can write outside the root
//! (I2). Device nodes are not created: a runtime's `/dev` is warren's own.

#![deny(missing_docs)]

mod layout;
mod unpack;

use std::path::{Path, PathBuf};

pub use layout::ImageLayout;

/// Why an image could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The source could not be read.
    #[error("cannot read the image at {path}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The layout's JSON is missing or malformed.
    #[error("invalid OCI image layout: {0}")]
    Layout(String),
    /// A blob's content does not match its digest.
    #[error("blob {digest} does not match its digest (corrupt or tampered image)")]
    DigestMismatch {
        /// The digest the manifest names.
        digest: String,
    },
    /// A layer's media type is not one warren unpacks.
    #[error("layer {digest} has an unsupported media type {media_type:?}")]
    UnsupportedLayer {
        /// The layer's digest.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// A layer entry would write outside the root filesystem, or is malformed.
    #[error("layer {layer}: refusing entry {path:?}: {reason}")]
    UnsafeEntry {
        /// The layer's digest.
        layer: String,
        /// The entry's path as the archive gives it.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Writing the root filesystem failed.
    #[error("cannot write {path:?} of the root filesystem")]
    Write {
        /// The path inside the root filesystem.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The target exists already.
    #[error("an image is already imported at {0}; remove it first")]
    Exists(PathBuf),
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Layers applied.
    pub layers: usize,
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Device nodes and other special files not created.
    pub skipped: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Imports the OCI image layout (directory or tar archive) at `source` as the root
/// filesystem `target`, which must not exist yet.
pub fn import(source: &Path, target: &Path) -> Result<ImportReport, ImageError> {
    if target.exists() {
        return Err(ImageError::Exists(target.to_owned()));
    }
    let staging_parent = target
        .parent()
        .ok_or_else(|| ImageError::Exists(target.to_owned()))?;
    std::fs::create_dir_all(staging_parent).map_err(|source| ImageError::Read {
        path: staging_parent.to_owned(),
        source,
    })?;
    let staging = staging_parent.join(format!(
        ".{}.partial-{}",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("rootfs"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    let result = (|| {
        let layout = ImageLayout::open(source)?;
        std::fs::create_dir(&staging).map_err(|source| ImageError::Write {
            path: String::new(),
            source,
        })?;
        let report = unpack::apply_layers(&layout, &staging)?;
        std::fs::rename(&staging, target).map_err(|source| ImageError::Write {
            path: String::new(),
            source,
        })?;
        Ok(report)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}
