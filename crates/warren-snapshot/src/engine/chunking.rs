//! Reading a file's data extents (holes skipped) and cutting them into content-defined
//! chunks, sent on to the uploader when a snapshot is taken.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use fastcdc::v2020::{FastCDC, StreamCDC};
use warren_fs::WorkspaceRoot;

use super::{
    Budget, SnapshotLimits, SnapshotStats, AVG_CHUNK, EXTENTS_PER_CHECK, MAX_CHUNK, MIN_CHUNK,
    MIN_HOLE, WHOLE_FILE,
};
use crate::manifest::{ChunkRef, Hole};
use crate::pack::PackIndex;
use crate::{ManifestEntry, SnapshotError};

/// A chunk on its way to the store: compressed and packed by the uploader thread while
/// the walker reads on.
pub(super) struct Upload {
    pub(super) hash: String,
    pub(super) data: Vec<u8>,
}

/// What one snapshot knows is stored already: the store's index as it was read at the
/// start, and the chunks this snapshot has sent since (a tree may hold a chunk twice).
pub(super) struct Known {
    pub(super) index: PackIndex,
    pub(super) sent: std::collections::HashSet<String>,
}

/// The data extents `(offset, length)` of a file of `size` bytes, in order, found with
/// `SEEK_DATA`/`SEEK_HOLE`: everything outside them reads as zeros. Holes shorter than
/// [`MIN_HOLE`] count as data. A filesystem that knows no holes reports one extent.
fn data_extents(
    file: &File,
    size: u64,
    shown: &str,
    limits: &SnapshotLimits,
) -> Result<Vec<(u64, u64)>, SnapshotError> {
    use rustix::fs::{seek, SeekFrom};
    use rustix::io::Errno;
    let io = |errno: Errno| SnapshotError::Io {
        path: shown.to_owned(),
        source: errno.into(),
    };
    let mut extents: Vec<(u64, u64)> = Vec::new();
    let mut position = 0u64;
    let mut lookups = 0usize;
    while position < size {
        lookups += 1;
        if lookups.is_multiple_of(EXTENTS_PER_CHECK) {
            limits.check()?;
        }
        let start = match seek(file, SeekFrom::Data(position)) {
            Ok(start) => start,
            // No data at or after `position`: the rest is a hole.
            Err(Errno::NXIO) => break,
            // A filesystem without SEEK_DATA: the whole file is data.
            Err(Errno::INVAL) if position == 0 => return Ok(vec![(0, size)]),
            Err(errno) => return Err(io(errno)),
        };
        if start >= size {
            break;
        }
        let end = match seek(file, SeekFrom::Hole(start)) {
            Ok(end) => end.min(size),
            Err(Errno::NXIO) => size,
            Err(errno) => return Err(io(errno)),
        };
        if end <= start {
            break;
        }
        let previous_end = extents.last().map_or(0, |&(offset, len)| offset + len);
        if start - previous_end < MIN_HOLE {
            // Too short a hole to record (or a short one at the start): read it as data.
            match extents.last_mut() {
                Some(last) => last.1 = end - last.0,
                None => extents.push((0, end)),
            }
        } else {
            extents.push((start, end - start));
        }
        position = end;
    }
    if let Some(last) = extents.last_mut() {
        if size - (last.0 + last.1) < MIN_HOLE {
            last.1 = size - last.0;
        }
    } else if size < MIN_HOLE {
        extents.push((0, size));
    }
    extents.retain(|&(_, len)| len > 0);
    Ok(extents)
}

/// The holes between `extents` in a file of `size` bytes.
fn holes_between(extents: &[(u64, u64)], size: u64) -> Vec<Hole> {
    let mut holes = Vec::new();
    let mut position = 0;
    for &(offset, len) in extents {
        if offset > position {
            holes.push(Hole {
                offset: position,
                len: offset - position,
            });
        }
        position = offset + len;
    }
    if size > position {
        holes.push(Hole {
            offset: position,
            len: size - position,
        });
    }
    holes
}

/// The data extents of a recorded file: what its holes leave of `[0, size)`. `None` when
/// the holes are out of order, overlap or pass the end (a damaged manifest).
pub(super) fn extents_between(holes: &[Hole], size: u64) -> Option<Vec<(u64, u64)>> {
    let mut extents = Vec::new();
    let mut position = 0u64;
    for hole in holes {
        let end = hole.offset.checked_add(hole.len)?;
        if hole.offset < position || end > size {
            return None;
        }
        if hole.offset > position {
            extents.push((position, hole.offset - position));
        }
        position = end;
    }
    if size > position {
        extents.push((position, size - position));
    }
    Some(extents)
}

/// Bytes of data of a recorded file (its size less its holes).
pub(super) fn recorded_data_bytes(entry: &ManifestEntry) -> u64 {
    let holes: u64 = entry.holes.iter().map(|hole| hole.len).sum();
    entry.size.saturating_sub(holes)
}

/// Reads a file's data extents one after another, never its holes. A file that shrank
/// meanwhile reads as zeros where its bytes are gone, so the stream is always exactly as
/// long as the extents the manifest will describe.
struct ExtentReader<'f> {
    file: &'f File,
    extents: Vec<(u64, u64)>,
    index: usize,
    done: u64,
}

impl Read for ExtentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(&(offset, len)) = self.extents.get(self.index) {
            if self.done == len {
                self.index += 1;
                self.done = 0;
                continue;
            }
            let want = usize::try_from(len - self.done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let mut read = self.file.read_at(&mut buf[..want], offset + self.done)?;
            if read == 0 {
                buf[..want].fill(0);
                read = want;
            }
            self.done += read as u64;
            return Ok(read);
        }
        Ok(0)
    }
}

/// Cuts the file at `path` (of `size` bytes when it was listed) into chunks and returns
/// the chunk list and its holes. Only data extents are read; holes are recorded. With
/// `upload`, chunks the store lacks are sent to the uploader.
pub(super) fn chunk_file(
    root: &WorkspaceRoot,
    path: &OsStr,
    shown: &str,
    size: u64,
    budget: &mut Budget<'_>,
    scratch: &mut Vec<u8>,
    upload: Option<(
        &mut Known,
        &std::sync::mpsc::SyncSender<Upload>,
        &mut SnapshotStats,
    )>,
) -> Result<(Vec<ChunkRef>, Vec<Hole>), SnapshotError> {
    let file = root.open_file(path)?;
    let extents = data_extents(&file, size, shown, budget.limits)?;
    budget.spend(extents.iter().map(|&(_, len)| len).sum(), shown)?;
    let data_len: u64 = extents.iter().map(|&(_, len)| len).sum();
    let holes = holes_between(&extents, size);
    let mut reader = ExtentReader {
        file: &file,
        extents,
        index: 0,
        done: 0,
    };
    let mut chunks = Vec::new();
    let mut upload = upload;
    let mut take = |data: Cow<'_, [u8]>| -> Result<(), SnapshotError> {
        budget.limits.check()?;
        let hash = blake3::hash(&data).to_hex().to_string();
        let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if let Some((known, sender, stats)) = upload.as_mut() {
            stats.bytes_read += data.len() as u64;
            stats.chunks += 1;
            if !known.index.contains(&hash) && known.sent.insert(hash.clone()) {
                // A closed channel means the uploader failed; its error is reported at
                // the end.
                if sender
                    .send(Upload {
                        hash: hash.clone(),
                        data: data.into_owned(),
                    })
                    .is_err()
                {
                    return Err(SnapshotError::store(
                        "write chunks",
                        std::io::Error::other("the uploader stopped"),
                    ));
                }
            }
        }
        chunks.push(ChunkRef { hash, len: length });
        Ok(())
    };
    let io = |error: std::io::Error| SnapshotError::Io {
        path: shown.to_owned(),
        source: error,
    };
    if data_len <= WHOLE_FILE {
        // Read whole into the walk's buffer and cut in place: the same cut points as the
        // stream below, without its buffer of the largest chunk zeroed for every file.
        scratch.clear();
        scratch.resize(usize::try_from(data_len).unwrap_or(usize::MAX), 0);
        reader.read_exact(scratch).map_err(io)?;
        for chunk in FastCDC::new(scratch, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            take(Cow::Borrowed(
                &scratch[chunk.offset..chunk.offset + chunk.length],
            ))?;
        }
    } else {
        for chunk in StreamCDC::new(reader, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            let chunk = chunk.map_err(|error| io(std::io::Error::other(error.to_string())))?;
            take(Cow::Owned(chunk.data))?;
        }
    }
    Ok((chunks, holes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_whole_is_cut_exactly_where_the_stream_cuts_it() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..5 * 1024 * 1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let whole: Vec<(usize, usize)> = FastCDC::new(&data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
            .map(|chunk| (chunk.offset, chunk.length))
            .collect();
        let streamed: Vec<(usize, usize)> =
            StreamCDC::new(data.as_slice(), MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
                .map(|chunk| {
                    let chunk = chunk.unwrap();
                    (chunk.offset as usize, chunk.length)
                })
                .collect();
        assert!(whole.len() > 3, "{whole:?}");
        assert_eq!(whole, streamed);
    }
}
