//! How a restore gets its chunks' bytes: a read plan made before anything is written, and
//! a thread that performs it ahead of the writer.
//!
//! The chunks a restore needs, in the order it writes them, become as few reads as
//! possible: neighbouring chunks of one pack are fetched in one range read of at most
//! [`MAX_READ`] bytes (a whole pack), skipping gaps of at most [`MAX_GAP`] (a snapshot
//! stores a tree's chunks in the order a restore writes them, so a fresh snapshot's
//! restore reads its packs straight through, one request each). Fetching threads work
//! ahead of the writer while it decompresses, checks and writes, so the store's latency
//! and the disk's overlap: one, [`READS_AHEAD`] reads ahead, for a store that answers from
//! a local disk, and as many as the store says pay off in parallel
//! ([`ObjectStore::parallel_reads`]: object storage over HTTP), each one read ahead. A
//! chunk the plan cannot place fails the restore before anything is written.
//!
//! A pack can vanish under a running restore when the collector moves its live chunks to
//! a new pack; the index is then read again once and the chunks fetched from their new
//! place.

use std::ffi::OsStr;
use std::sync::mpsc::{Receiver, SyncSender};

use crate::manifest::ChunkRef;
use crate::pack::{chunk_key, pack_key, Location, PackIndex};
use crate::{ObjectStore, SnapshotError};

/// The most bytes one read fetches: a whole pack (which ends at most one compressed chunk
/// past its target size) in one request.
const MAX_READ: u64 = crate::pack::PACK_TARGET as u64 + 4 * 1024 * 1024;
/// The most unneeded bytes a read fetches rather than start another.
const MAX_GAP: u64 = 1024 * 1024;
/// Reads one fetching thread keeps ahead of the writer besides the one it is fetching
/// (each at most [`MAX_READ`] bytes in memory).
const READS_AHEAD: usize = 1;

/// One request to the store.
#[derive(Debug)]
struct Read {
    key: String,
    /// `None`: the whole object (a chunk stored on its own).
    range: Option<(u64, u64)>,
}

/// One chunk of the plan: which read holds it, and where in that read's bytes.
#[derive(Debug)]
struct Planned {
    hash: String,
    read: usize,
    at: u64,
    stored: u64,
}

/// Every read a restore makes, in order, and the chunks each serves.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    reads: Vec<Read>,
    chunks: Vec<Planned>,
}

impl Plan {
    /// The plan for `chunks` (each with the path of the file that needs it), in the order
    /// they will be asked for.
    pub(crate) fn new<'m>(
        index: &PackIndex,
        chunks: impl Iterator<Item = (&'m ChunkRef, &'m OsStr)>,
    ) -> Result<Self, SnapshotError> {
        let mut plan = Self::default();
        // The open read: its pack, where it starts and ends.
        let mut open: Option<(std::sync::Arc<str>, u64, u64)> = None;
        for (chunk, path) in chunks {
            match index.locate(&chunk.hash) {
                Some(Location::Packed {
                    pack,
                    offset,
                    stored,
                }) => {
                    let end = offset + u64::from(stored);
                    let extends = open.as_ref().is_some_and(|(id, start, last)| {
                        *id == pack
                            && offset >= *last
                            && offset - *last <= MAX_GAP
                            && end - *start <= MAX_READ
                    });
                    if extends {
                        let (_, start, last) = open.as_mut().expect("checked above");
                        *last = end;
                        let read = plan.reads.len() - 1;
                        plan.reads[read].range = Some((*start, end - *start));
                        plan.chunks.push(Planned {
                            hash: chunk.hash.clone(),
                            read,
                            at: offset - *start,
                            stored: u64::from(stored),
                        });
                    } else {
                        plan.reads.push(Read {
                            key: pack_key(&pack),
                            range: Some((offset, u64::from(stored))),
                        });
                        plan.chunks.push(Planned {
                            hash: chunk.hash.clone(),
                            read: plan.reads.len() - 1,
                            at: 0,
                            stored: u64::from(stored),
                        });
                        open = Some((pack, offset, end));
                    }
                }
                Some(Location::Object) => {
                    plan.reads.push(Read {
                        key: chunk_key(&chunk.hash),
                        range: None,
                    });
                    plan.chunks.push(Planned {
                        hash: chunk.hash.clone(),
                        read: plan.reads.len() - 1,
                        at: 0,
                        stored: u64::MAX,
                    });
                    open = None;
                }
                None => {
                    // A chunk only a damaged index could place is named as that damage.
                    if let Some(key) = index.corrupt.first() {
                        return Err(SnapshotError::Corrupt {
                            what: "index",
                            hash: key.trim_start_matches("indexes/").to_owned(),
                        });
                    }
                    return Err(SnapshotError::MissingChunk {
                        hash: chunk.hash.clone(),
                        path: path.to_string_lossy().into_owned(),
                    });
                }
            }
        }
        Ok(plan)
    }

    /// How many requests the plan makes.
    #[cfg(test)]
    pub(crate) fn reads(&self) -> usize {
        self.reads.len()
    }
}

type Fetched = Result<Option<Vec<u8>>, SnapshotError>;

/// Performs every `step`th of the plan's reads from `first`, in order; stops when the
/// writer is gone or a read failed.
fn prefetch(
    store: &dyn ObjectStore,
    reads: &[Read],
    first: usize,
    step: usize,
    sender: SyncSender<Fetched>,
) {
    for read in reads.iter().skip(first).step_by(step) {
        let fetched = match read.range {
            Some((offset, len)) => store.get_range(&read.key, offset, len),
            None => store.get(&read.key),
        };
        let failed = fetched.is_err();
        if sender.send(fetched).is_err() || failed {
            return;
        }
    }
}

/// Runs `work` with a [`ChunkFeed`] serving `plan`'s chunks, fetched on other threads.
pub(crate) fn with_feed<T>(
    store: &dyn ObjectStore,
    plan: Plan,
    work: impl FnOnce(&mut ChunkFeed<'_>) -> Result<T, SnapshotError>,
) -> Result<T, SnapshotError> {
    let Plan { reads, chunks } = plan;
    let threads = store.parallel_reads().clamp(1, 8).min(reads.len().max(1));
    // One thread keeps a few reads ahead; several each keep the one it fetched until the
    // writer takes it, so memory stays within one read per thread.
    let ahead = if threads == 1 { READS_AHEAD } else { 0 };
    std::thread::scope(|scope| {
        let reads = &reads;
        let receivers = (0..threads)
            .map(|first| {
                let (sender, receiver) = std::sync::mpsc::sync_channel(ahead);
                scope.spawn(move || prefetch(store, reads, first, threads, sender));
                receiver
            })
            .collect();
        let mut feed = ChunkFeed {
            store,
            receivers,
            chunks,
            next: 0,
            current: None,
            fallback: Vec::new(),
            reloaded: None,
        };
        // The feed (and its receivers) goes when `work` returns, which ends the fetchers.
        work(&mut feed)
    })
}

/// The compressed bytes of a restore's chunks, one after another, in the plan's order.
pub(crate) struct ChunkFeed<'s> {
    store: &'s dyn ObjectStore,
    /// The fetching threads' answers: read `n` comes from `receivers[n % len]`.
    receivers: Vec<Receiver<Fetched>>,
    chunks: Vec<Planned>,
    next: usize,
    /// The read being served: its number and bytes (`None`: the object is gone).
    current: Option<(usize, Option<Vec<u8>>)>,
    fallback: Vec<u8>,
    reloaded: Option<PackIndex>,
}

impl ChunkFeed<'_> {
    /// The next chunk's compressed bytes; `chunk` must be the one the plan has next.
    pub(crate) fn next(&mut self, chunk: &ChunkRef, path: &str) -> Result<&[u8], SnapshotError> {
        let Some(planned) = self.chunks.get(self.next) else {
            return Err(SnapshotError::store(
                "read chunks",
                std::io::Error::other("the restore asked for more chunks than it planned"),
            ));
        };
        if planned.hash != chunk.hash {
            return Err(SnapshotError::store(
                "read chunks",
                std::io::Error::other("the restore asked for chunks out of the planned order"),
            ));
        }
        let wanted = planned.read;
        let (at, stored) = (planned.at, planned.stored);
        self.next += 1;
        while self.current.as_ref().map(|(read, _)| *read) != Some(wanted) {
            let number = self.current.as_ref().map_or(0, |(read, _)| read + 1);
            let fetched = self.receivers[number % self.receivers.len()]
                .recv()
                .map_err(|_| {
                    SnapshotError::store(
                        "read chunks",
                        std::io::Error::other("the fetcher stopped"),
                    )
                })??;
            self.current = Some((number, fetched));
        }
        if !matches!(self.current, Some((_, Some(_)))) {
            // The pack went (the collector moved its chunks): fetch this one from its
            // new place.
            return self.refetch(path);
        }
        // The pack is shorter than its index says: the chunk's bytes are not there.
        let corrupt = || SnapshotError::Corrupt {
            what: "chunk",
            hash: chunk.hash.clone(),
        };
        let Some((_, Some(bytes))) = &self.current else {
            unreachable!("checked above");
        };
        let start = usize::try_from(at).unwrap_or(usize::MAX);
        let end = if stored == u64::MAX {
            bytes.len()
        } else {
            usize::try_from(at.saturating_add(stored)).unwrap_or(usize::MAX)
        };
        bytes.get(start..end).ok_or_else(corrupt)
    }

    /// The chunk just planned, fetched on its own from where a fresh read of the index
    /// places it.
    fn refetch(&mut self, path: &str) -> Result<&[u8], SnapshotError> {
        let planned = &self.chunks[self.next - 1];
        let missing = || SnapshotError::MissingChunk {
            hash: planned.hash.clone(),
            path: path.to_owned(),
        };
        if self.reloaded.is_none() {
            self.reloaded = Some(PackIndex::load(self.store)?);
        }
        let index = self.reloaded.as_ref().expect("loaded above");
        let fetched = match index.locate(&planned.hash) {
            Some(Location::Packed {
                pack,
                offset,
                stored,
            }) => self
                .store
                .get_range(&pack_key(&pack), offset, u64::from(stored))?,
            Some(Location::Object) => self.store.get(&chunk_key(&planned.hash))?,
            None => None,
        };
        self.fallback = fetched.ok_or_else(missing)?;
        Ok(&self.fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{PackRecord, PackedChunk};

    fn chunk(hash: &str) -> ChunkRef {
        ChunkRef {
            hash: hash.into(),
            len: 1,
        }
    }

    fn packed(hash: &str, offset: u64, stored: u32) -> PackedChunk {
        PackedChunk {
            hash: hash.into(),
            offset,
            stored,
            len: 1,
        }
    }

    fn index() -> PackIndex {
        let mut index = PackIndex::default();
        let mib = 1024 * 1024;
        index.add(&[
            PackRecord {
                id: "p1".into(),
                size: 20 * mib,
                chunks: vec![
                    packed("a", 0, 100),
                    packed("b", 100, 100),
                    // A gap the next read does not bridge.
                    packed("c", 2 * mib, 100),
                    // Past the most one read fetches from c.
                    packed("d", 2 * mib + 100, MAX_READ as u32),
                ],
            },
            PackRecord {
                id: "p2".into(),
                size: 100,
                chunks: vec![packed("e", 0, 100)],
            },
        ]);
        index
    }

    fn plan(hashes: &[&str]) -> Result<Plan, SnapshotError> {
        let chunks: Vec<ChunkRef> = hashes.iter().map(|hash| chunk(hash)).collect();
        let path = OsStr::new("f");
        Plan::new(&index(), chunks.iter().map(|chunk| (chunk, path)))
    }

    #[test]
    fn neighbouring_chunks_of_a_pack_are_one_read() {
        let plan = plan(&["a", "b"]).unwrap();
        assert_eq!(plan.reads(), 1);
        assert_eq!(plan.reads[0].range, Some((0, 200)));
        assert_eq!((plan.chunks[1].at, plan.chunks[1].stored), (100, 100));
    }

    #[test]
    fn a_wide_gap_a_full_read_another_pack_or_a_step_back_start_a_new_read() {
        assert_eq!(plan(&["a", "c"]).unwrap().reads(), 2, "gap");
        assert_eq!(
            plan(&["c", "d"]).unwrap().reads(),
            2,
            "over the most one read takes"
        );
        assert_eq!(
            plan(&["a", "e", "b"]).unwrap().reads(),
            3,
            "another pack between"
        );
        assert_eq!(plan(&["b", "a"]).unwrap().reads(), 2, "backwards");
    }

    #[test]
    fn a_chunk_no_index_places_fails_the_plan_naming_its_file() {
        match plan(&["a", "zz"]) {
            Err(SnapshotError::MissingChunk { hash, path }) => {
                assert_eq!((hash.as_str(), path.as_str()), ("zz", "f"));
            }
            other => panic!("{other:?}"),
        }
    }
}
