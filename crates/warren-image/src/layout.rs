//! Reading an OCI image layout: `index.json` → manifest → layers, every blob verified.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::ImageError;

/// An OCI image layout on disk, resolved to one image's layers.
#[derive(Debug)]
pub struct ImageLayout {
    root: PathBuf,
    /// Unpacked from an archive into a temporary directory, removed on drop.
    _unpacked: Option<TempDir>,
    /// The layers, bottom first.
    pub layers: Vec<Layer>,
}

/// One layer blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// `sha256:<hex>`.
    pub digest: String,
    /// The OCI or Docker media type.
    pub media_type: String,
}

#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    layers: Vec<Descriptor>,
}

const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

impl ImageLayout {
    /// Opens a layout directory, or unpacks a layout archive next to nothing shared.
    pub fn open(source: &Path) -> Result<Self, ImageError> {
        let meta = std::fs::metadata(source).map_err(|e| read_error(source, e))?;
        let (root, unpacked) = if meta.is_dir() {
            (source.to_owned(), None)
        } else {
            // A fresh, private (0700, unguessable) directory: a predictable one could be
            // swapped by another local user between its removal and its creation.
            let dir = tempfile::Builder::new()
                .prefix("warren-image-")
                .tempdir()
                .map_err(|e| read_error(&std::env::temp_dir(), e))?
                .keep();
            let guard = TempDir(dir.clone());
            let file = std::fs::File::open(source).map_err(|e| read_error(source, e))?;
            // The tar crate refuses entries that would land outside `dir`; the layout's
            // own content is only read, by digest, below.
            tar::Archive::new(file)
                .unpack(&dir)
                .map_err(|e| read_error(source, e))?;
            (dir, Some(guard))
        };
        let index: Index = serde_json::from_slice(&read_all(&root, "index.json")?)
            .map_err(|e| ImageError::Layout(format!("index.json: {e}")))?;
        let top = pick(&index.manifests)?;
        let mut digest = top.digest.clone();
        // One level of nested index (an image index pointing at per-platform manifests).
        if INDEX_TYPES.contains(&top.media_type.as_str()) {
            let nested: Index = serde_json::from_slice(&read_blob(&root, &top.digest)?)
                .map_err(|e| ImageError::Layout(format!("nested index: {e}")))?;
            digest = pick(&nested.manifests)?.digest.clone();
        }
        let manifest: Manifest = serde_json::from_slice(&read_blob(&root, &digest)?)
            .map_err(|e| ImageError::Layout(format!("manifest {digest}: {e}")))?;
        let layers = manifest
            .layers
            .into_iter()
            .map(|l| Layer {
                digest: l.digest,
                media_type: l.media_type,
            })
            .collect();
        Ok(Self {
            root,
            _unpacked: unpacked,
            layers,
        })
    }

    /// Opens a blob for reading, after checking the digest's shape.
    pub(crate) fn open_blob(&self, digest: &str) -> Result<std::fs::File, ImageError> {
        open_in(&self.root, &blob_relative(digest)?)
    }
}

fn read_error(path: &Path, source: std::io::Error) -> ImageError {
    ImageError::Read {
        path: path.to_owned(),
        source,
    }
}

/// Opens a regular file of the layout, resolved beneath its root without following any
/// link: an archive may plant symlinks in `blobs/` pointing at host files.
fn open_in(root: &Path, relative: &str) -> Result<std::fs::File, ImageError> {
    let error = |e: rustix::io::Errno| read_error(&root.join(relative), e.into());
    let dir = rustix::fs::open(
        root,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(error)?;
    let fd = rustix::fs::openat2(
        &dir,
        relative,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::BENEATH
            | rustix::fs::ResolveFlags::NO_SYMLINKS
            | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(error)?;
    let stat = rustix::fs::fstat(&fd).map_err(error)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(ImageError::Layout(format!(
            "{relative} is not a regular file"
        )));
    }
    Ok(std::fs::File::from(fd))
}

fn read_all(root: &Path, relative: &str) -> Result<Vec<u8>, ImageError> {
    let mut bytes = Vec::new();
    open_in(root, relative)?
        .read_to_end(&mut bytes)
        .map_err(|e| read_error(&root.join(relative), e))?;
    Ok(bytes)
}

/// The manifest for this machine: linux on its architecture, or the only one there is.
fn pick(manifests: &[Descriptor]) -> Result<&Descriptor, ImageError> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let matching = manifests.iter().find(|m| {
        m.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == arch)
    });
    match (matching, manifests) {
        (Some(m), _) => Ok(m),
        (None, [only]) => Ok(only),
        (None, []) => Err(ImageError::Layout("index.json lists no manifest".into())),
        (None, _) => Err(ImageError::Layout(format!(
            "index.json lists several manifests and none for linux/{arch}"
        ))),
    }
}

fn blob_relative(digest: &str) -> Result<String, ImageError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ImageError::Layout(format!("unsupported digest {digest:?}")))?;
    Ok(format!("blobs/sha256/{}", hex.to_ascii_lowercase()))
}

/// Reads a small blob whole and verifies it.
fn read_blob(root: &Path, digest: &str) -> Result<Vec<u8>, ImageError> {
    let bytes = read_all(root, &blob_relative(digest)?)?;
    if format!("sha256:{}", hex::encode(Sha256::digest(&bytes))) != digest.to_ascii_lowercase() {
        return Err(ImageError::DigestMismatch {
            digest: digest.to_owned(),
        });
    }
    Ok(bytes)
}

/// A reader that hashes what passes through, for verifying a layer while it streams.
pub(crate) struct HashingReader<R> {
    pub inner: R,
    pub hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}
