//! Applying layers into the staging root by file descriptor (see the crate docs).

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use crate::layout::{HashingReader, ImageLayout, Layer};
use crate::{ImageError, ImportReport};

pub(crate) fn apply_layers(
    layout: &ImageLayout,
    staging: &Path,
) -> Result<ImportReport, ImageError> {
    let root = rustix::fs::open(
        staging,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| write_error("", e))?;
    let mut report = ImportReport::default();
    for layer in &layout.layers {
        apply_layer(layout, layer, root.as_fd(), &mut report)?;
        report.layers += 1;
    }
    Ok(report)
}

fn apply_layer(
    layout: &ImageLayout,
    layer: &Layer,
    root: BorrowedFd<'_>,
    report: &mut ImportReport,
) -> Result<(), ImageError> {
    let path = std::path::PathBuf::from(&layer.digest);
    let file = layout.open_blob(&layer.digest)?;
    let mut hashing = HashingReader {
        inner: std::io::BufReader::new(file),
        hasher: Sha256::new(),
    };
    let read_error = |source| ImageError::Read {
        path: path.clone(),
        source,
    };
    {
        let media = layer.media_type.as_str();
        let mut decoded: Box<dyn Read + '_> =
            if media.ends_with("+gzip") || media.ends_with(".tar.gzip") {
                Box::new(flate2::read::GzDecoder::new(&mut hashing))
            } else if media.ends_with("+zstd") {
                Box::new(zstd::stream::read::Decoder::new(&mut hashing).map_err(read_error)?)
            } else if media.ends_with(".tar") || media.ends_with(".tar.v1") || media.is_empty() {
                Box::new(&mut hashing)
            } else {
                return Err(ImageError::UnsupportedLayer {
                    digest: layer.digest.clone(),
                    media_type: layer.media_type.clone(),
                });
            };
        Extractor {
            root,
            layer: &layer.digest,
            created: HashSet::new(),
        }
        .extract(&mut decoded, report)?;
        // Whatever follows the tar's end still belongs to the blob and its digest.
        std::io::copy(&mut decoded, &mut std::io::sink()).map_err(read_error)?;
    }
    std::io::copy(&mut hashing, &mut std::io::sink()).map_err(read_error)?;
    let actual = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
    if actual != layer.digest.to_ascii_lowercase() {
        return Err(ImageError::DigestMismatch {
            digest: layer.digest.clone(),
        });
    }
    Ok(())
}

fn write_error(path: &str, errno: Errno) -> ImageError {
    ImageError::Write {
        path: path.to_owned(),
        source: errno.into(),
    }
}

struct Extractor<'a> {
    root: BorrowedFd<'a>,
    layer: &'a str,
    /// Paths this layer wrote, which its own opaque whiteouts must not remove.
    created: HashSet<String>,
}

impl Extractor<'_> {
    fn unsafe_entry(&self, path: &str, reason: &'static str) -> ImageError {
        ImageError::UnsafeEntry {
            layer: self.layer.to_owned(),
            path: path.chars().take(300).collect(),
            reason,
        }
    }

    /// Splits an archive path into checked components: relative, no `..`, no NUL.
    fn components(&self, raw: &[u8]) -> Result<Vec<String>, ImageError> {
        let text = String::from_utf8_lossy(raw);
        if raw.starts_with(b"/") {
            return Err(self.unsafe_entry(&text, "absolute path"));
        }
        let mut out = Vec::new();
        for component in raw.split(|b| *b == b'/') {
            match component {
                b"" | b"." => {}
                b".." => return Err(self.unsafe_entry(&text, "'..' component")),
                name => {
                    if name.contains(&0) || name.len() > 255 {
                        return Err(self.unsafe_entry(&text, "malformed name"));
                    }
                    let name = std::str::from_utf8(name)
                        .map_err(|_| self.unsafe_entry(&text, "name is not UTF-8"))?;
                    out.push(name.to_owned());
                }
            }
        }
        Ok(out)
    }

    fn extract(
        &mut self,
        reader: &mut dyn Read,
        report: &mut ImportReport,
    ) -> Result<(), ImageError> {
        let mut archive = tar::Archive::new(reader);
        let entries = archive.entries().map_err(|source| ImageError::Read {
            path: self.layer.into(),
            source,
        })?;
        for entry in entries {
            let mut entry = entry.map_err(|source| ImageError::Read {
                path: self.layer.into(),
                source,
            })?;
            let raw = entry.path_bytes().into_owned();
            let components = self.components(&raw)?;
            let Some((name, parents)) = components.split_last() else {
                continue; // the root itself
            };
            let display = components.join("/");
            if name == ".wh..wh..opq" {
                let dir = self.directory(parents, &display)?;
                self.clear(dir.as_fd(), &parents.join("/"))?;
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                if matches!(hidden, "" | "." | "..") {
                    return Err(self.unsafe_entry(&display, "whiteout of '.', '..' or nothing"));
                }
                if let Some(dir) = self.existing_directory(parents, &display)? {
                    remove_any(dir.as_fd(), hidden).map_err(|e| write_error(&display, e))?;
                }
                continue;
            }
            let parent = self.directory(parents, &display)?;
            let header = entry.header();
            let mode = header.mode().unwrap_or(0o644) & 0o7777;
            let owner = (header.uid().ok(), header.gid().ok());
            match header.entry_type() {
                tar::EntryType::Directory => {
                    let dir = match open_dir(parent.as_fd(), name) {
                        Ok(dir) => dir,
                        Err(Errno::NOENT) => {
                            make_dir(parent.as_fd(), name).map_err(|e| write_error(&display, e))?
                        }
                        Err(_) => {
                            remove_any(parent.as_fd(), name)
                                .map_err(|e| write_error(&display, e))?;
                            make_dir(parent.as_fd(), name).map_err(|e| write_error(&display, e))?
                        }
                    };
                    set_owner_and_mode(dir.as_fd(), owner, mode)
                        .map_err(|e| write_error(&display, e))?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    remove_any(parent.as_fd(), name).map_err(|e| write_error(&display, e))?;
                    let fd = rustix::fs::openat(
                        parent.as_fd(),
                        name.as_str(),
                        OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::WRONLY
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                    )
                    .map_err(|e| write_error(&display, e))?;
                    let mut file = std::fs::File::from(fd);
                    report.bytes += std::io::copy(&mut entry, &mut file).map_err(|source| {
                        ImageError::Write {
                            path: display.clone(),
                            source,
                        }
                    })?;
                    set_owner_and_mode(file.as_fd(), owner, mode)
                        .map_err(|e| write_error(&display, e))?;
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .ok_or_else(|| self.unsafe_entry(&display, "symlink without a target"))?
                        .into_owned();
                    remove_any(parent.as_fd(), name).map_err(|e| write_error(&display, e))?;
                    // The link is created, never followed: its target means something only
                    // inside the runtime, after pivot_root.
                    rustix::fs::symlinkat(target.as_slice(), parent.as_fd(), name.as_str())
                        .map_err(|e| write_error(&display, e))?;
                    if let (Some(uid), Some(gid)) = owner {
                        let _ = rustix::fs::chownat(
                            parent.as_fd(),
                            name.as_str(),
                            Some(rustix::fs::Uid::from_raw(uid as u32)),
                            Some(rustix::fs::Gid::from_raw(gid as u32)),
                            AtFlags::SYMLINK_NOFOLLOW,
                        );
                    }
                }
                tar::EntryType::Link => {
                    let target = entry
                        .link_name_bytes()
                        .ok_or_else(|| self.unsafe_entry(&display, "hard link without a target"))?
                        .into_owned();
                    let target = self.components(&target)?;
                    let Some((target_name, target_parents)) = target.split_last() else {
                        return Err(self.unsafe_entry(&display, "hard link to the root"));
                    };
                    let target_dir = self
                        .existing_directory(target_parents, &display)?
                        .ok_or_else(|| {
                            self.unsafe_entry(&display, "hard link to a missing file")
                        })?;
                    remove_any(parent.as_fd(), name).map_err(|e| write_error(&display, e))?;
                    rustix::fs::linkat(
                        target_dir.as_fd(),
                        target_name.as_str(),
                        parent.as_fd(),
                        name.as_str(),
                        AtFlags::empty(),
                    )
                    .map_err(|e| write_error(&display, e))?;
                }
                _ => {
                    // Devices, fifos and the like: a runtime's /dev is warren's own.
                    report.skipped += 1;
                    continue;
                }
            }
            report.entries += 1;
            self.created.insert(display);
        }
        Ok(())
    }

    /// Opens (creating as needed) the directory `components` beneath the root, one
    /// component at a time and never through a symlink.
    fn directory(&self, components: &[String], entry: &str) -> Result<OwnedFd, ImageError> {
        let mut current = rustix::io::dup(self.root).map_err(|e| write_error(entry, e))?;
        for component in components {
            current = match open_dir(current.as_fd(), component) {
                Ok(dir) => dir,
                Err(Errno::NOENT) => {
                    make_dir(current.as_fd(), component).map_err(|e| write_error(entry, e))?
                }
                Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                    return Err(self.unsafe_entry(entry, "a parent is a symlink or not a directory"))
                }
                Err(e) => return Err(write_error(entry, e)),
            };
        }
        Ok(current)
    }

    /// Like [`Self::directory`] without creating anything; `None` when missing.
    fn existing_directory(
        &self,
        components: &[String],
        entry: &str,
    ) -> Result<Option<OwnedFd>, ImageError> {
        let mut current = rustix::io::dup(self.root).map_err(|e| write_error(entry, e))?;
        for component in components {
            current = match open_dir(current.as_fd(), component) {
                Ok(dir) => dir,
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                    return Err(self.unsafe_entry(entry, "a parent is a symlink or not a directory"))
                }
                Err(e) => return Err(write_error(entry, e)),
            };
        }
        Ok(Some(current))
    }

    /// An opaque whiteout: everything lower layers put in the directory goes.
    fn clear(&self, dir: BorrowedFd<'_>, prefix: &str) -> Result<(), ImageError> {
        for name in names(dir).map_err(|e| write_error(prefix, e))? {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            if !self.created.contains(&path) {
                remove_any(dir, &name).map_err(|e| write_error(&path, e))?;
            }
        }
        Ok(())
    }
}

fn open_dir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn make_dir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e),
    }
    open_dir(parent, name)
}

fn set_owner_and_mode(
    fd: BorrowedFd<'_>,
    owner: (Option<u64>, Option<u64>),
    mode: u32,
) -> Result<(), Errno> {
    if let (Some(uid), Some(gid)) = owner {
        // Unprivileged imports keep the importer's ownership.
        match rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid as u32)),
            Some(rustix::fs::Gid::from_raw(gid as u32)),
        ) {
            Ok(()) | Err(Errno::PERM) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))
}

fn names(dir: BorrowedFd<'_>) -> Result<Vec<String>, Errno> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(&fd)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            out.push(name);
        }
    }
    Ok(out)
}

/// Removes `name` in `dir` whatever it is, never following a link; missing is fine.
fn remove_any(dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {
            let child = match open_dir(dir, name) {
                Ok(child) => child,
                Err(Errno::NOENT) => return Ok(()),
                Err(e) => return Err(e),
            };
            for entry in names(child.as_fd())? {
                remove_any(child.as_fd(), &entry)?;
            }
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
        }
        Err(e) => Err(e),
    }
}
