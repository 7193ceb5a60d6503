//! Mark and sweep over one store: every object no live manifest needs goes, except young
//! ones, which may belong to a snapshot still uploading its chunks (its manifest, the
//! commit point, comes last).
//!
//! Packs are swept whole: a pack none of whose chunks is needed goes; one that is mostly
//! garbage has its needed chunks copied into a new pack first (so space comes back without
//! a manifest changing: manifests name chunks, not places). Every index is then folded
//! into one, written before the old ones and the packs they named are deleted, so a reader
//! always finds each needed chunk in some index.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::pack::{pack_key, save_index, PackIndex, PackRecord, PackWriter};
use crate::{Manifest, ObjectStore, SnapshotError};

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcStats {
    /// Manifests kept (the live ones).
    pub manifests_kept: u64,
    /// Manifests removed.
    pub manifests_removed: u64,
    /// Chunks kept (needed, or too young to judge), in packs or on their own.
    pub chunks_kept: u64,
    /// Chunks removed: objects of their own, and chunks dropped with their pack.
    pub chunks_removed: u64,
    /// Packs kept.
    pub packs_kept: u64,
    /// Packs removed, none of their chunks needed (or never indexed: left by a crash).
    pub packs_removed: u64,
    /// Packs rewritten: their needed chunks copied to a new pack, the rest dropped.
    pub packs_repacked: u64,
}

/// What to do with one pack.
enum Verdict {
    Keep,
    Remove,
    Repack,
}

/// Removes every manifest not in `live` and every chunk no live manifest names, sparing
/// objects younger than `grace`. A live manifest or an index that cannot be read stops the
/// collection before anything is removed: without it, needed chunks cannot be told apart
/// from garbage.
pub fn collect_garbage(
    store: &dyn ObjectStore,
    live: &[String],
    grace: Duration,
) -> Result<GcStats, SnapshotError> {
    let mut stats = GcStats::default();
    let young = |key: &str| -> Result<bool, SnapshotError> {
        Ok(store.age(key)?.is_some_and(|age| age < grace))
    };
    // Kept: the live manifests, and young ones (a snapshot whose record is being written).
    // Every chunk a kept manifest names is needed, even an old one a new snapshot reused.
    let mut kept: Vec<String> = live.to_vec();
    let live_keys: HashSet<String> = live.iter().map(|id| Manifest::key(id)).collect();
    let mut doomed = Vec::new();
    for key in store.list("manifests/")? {
        if live_keys.contains(&key) {
            continue;
        }
        if young(&key)? {
            kept.push(key.trim_start_matches("manifests/").to_owned());
        } else {
            doomed.push(key);
        }
    }
    let mut needed = HashSet::new();
    for id in &kept {
        let manifest = match Manifest::load(store, id) {
            Ok(manifest) => manifest,
            // A live manifest that cannot be read stops everything: its chunks cannot be
            // told from garbage.
            Err(error) if live.contains(id) => return Err(error),
            Err(_) => continue,
        };
        for entry in &manifest.entries {
            for chunk in &entry.chunks {
                needed.insert(chunk.hash.clone());
            }
        }
    }
    // So does an index that cannot be read: the packs it names would look unindexed.
    let index = PackIndex::load(store)?;
    if let Some(key) = index.corrupt.first() {
        return Err(SnapshotError::Corrupt {
            what: "index",
            hash: key.trim_start_matches("indexes/").to_owned(),
        });
    }
    stats.manifests_kept = kept.len() as u64;
    for key in doomed {
        store.delete(&key)?;
        stats.manifests_removed += 1;
    }
    for key in store.list("chunks/")? {
        if needed.contains(key.trim_start_matches("chunks/")) || young(&key)? {
            stats.chunks_kept += 1;
        } else {
            store.delete(&key)?;
            stats.chunks_removed += 1;
        }
    }
    sweep_packs(store, &index, &needed, &young, &mut stats)?;
    Ok(stats)
}

fn sweep_packs(
    store: &dyn ObjectStore,
    index: &PackIndex,
    needed: &HashSet<String>,
    young: &dyn Fn(&str) -> Result<bool, SnapshotError>,
    stats: &mut GcStats,
) -> Result<(), SnapshotError> {
    let mut indexed: HashMap<&str, &PackRecord> = HashMap::new();
    for (_, packs) in &index.files {
        for pack in packs {
            indexed.entry(pack.id.as_str()).or_insert(pack);
        }
    }
    let mut keep: Vec<PackRecord> = Vec::new();
    let mut gone: Vec<String> = Vec::new();
    let mut repack: Vec<&PackRecord> = Vec::new();
    for key in store.list("packs/")? {
        let id = key.trim_start_matches("packs/");
        let verdict = match indexed.get(id) {
            // A pack whose index is not written yet belongs to a snapshot in flight; an
            // old one was left by a crash between the two.
            None if young(&key)? => Verdict::Keep,
            None => Verdict::Remove,
            Some(_) if young(&key)? => Verdict::Keep,
            Some(pack) => {
                let (mut live, mut all) = (0u64, 0u64);
                for chunk in &pack.chunks {
                    all += u64::from(chunk.stored);
                    if needed.contains(&chunk.hash) {
                        live += u64::from(chunk.stored);
                    }
                }
                if live == 0 {
                    Verdict::Remove
                } else if live * 2 < all {
                    Verdict::Repack
                } else {
                    Verdict::Keep
                }
            }
        };
        let record = indexed.get(id).copied();
        let chunks = record.map_or(0, |pack| pack.chunks.len() as u64);
        match verdict {
            Verdict::Keep => {
                stats.packs_kept += 1;
                stats.chunks_kept += chunks;
                if let Some(pack) = record {
                    keep.push(pack.clone());
                }
            }
            Verdict::Remove => {
                stats.packs_removed += 1;
                stats.chunks_removed += chunks;
                gone.push(key);
            }
            Verdict::Repack => repack.push(record.expect("only indexed packs are repacked")),
        }
    }
    // Needed chunks of mostly dead packs move to new packs (each chunk once).
    let mut writer = PackWriter::new(store);
    let mut moved = HashSet::new();
    for pack in &repack {
        let key = pack_key(&pack.id);
        let bytes = store
            .get(&key)?
            .ok_or_else(|| SnapshotError::MissingChunk {
                hash: pack.id.clone(),
                path: "a pack being repacked".to_owned(),
            })?;
        for chunk in &pack.chunks {
            if !needed.contains(&chunk.hash) || !moved.insert(chunk.hash.clone()) {
                stats.chunks_removed += 1;
                continue;
            }
            let start = usize::try_from(chunk.offset).unwrap_or(usize::MAX);
            let piece = start
                .checked_add(chunk.stored as usize)
                .and_then(|end| bytes.get(start..end))
                .ok_or_else(|| SnapshotError::Corrupt {
                    what: "pack",
                    hash: pack.id.clone(),
                })?;
            stats.chunks_kept += 1;
            if let Some(new) = writer.add(chunk.hash.clone(), chunk.len, piece)? {
                keep.push(new);
            }
        }
        stats.packs_repacked += 1;
        gone.push(key);
    }
    if let Some(new) = writer.flush()? {
        keep.push(new);
    }
    // One index for everything kept, durable before any index or pack it replaces goes.
    if gone.is_empty() && index.files.len() <= 1 {
        return Ok(());
    }
    store.sync()?;
    let written = if keep.is_empty() {
        None
    } else {
        Some(save_index(store, keep)?)
    };
    store.sync()?;
    for (key, _) in &index.files {
        if Some(key) != written.as_ref() {
            store.delete(key)?;
        }
    }
    for key in gone {
        store.delete(&key)?;
    }
    Ok(())
}
