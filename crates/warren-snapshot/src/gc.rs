//! Mark and sweep over one store: every object no live manifest needs goes, except young
//! ones, which may belong to a snapshot still uploading its chunks (its manifest, the
//! commit point, comes last).

use std::collections::HashSet;
use std::time::Duration;

use serde::Serialize;

use crate::{Manifest, ObjectStore, SnapshotError};

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcStats {
    /// Manifests kept (the live ones).
    pub manifests_kept: u64,
    /// Manifests removed.
    pub manifests_removed: u64,
    /// Chunks kept (needed, or too young to judge).
    pub chunks_kept: u64,
    /// Chunks removed.
    pub chunks_removed: u64,
}

/// Removes every manifest not in `live` and every chunk no live manifest names, sparing
/// objects younger than `grace`. A live manifest that cannot be read stops the collection
/// before anything is removed: its chunks cannot be told apart from garbage.
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
                needed.insert(format!("chunks/{}", chunk.hash));
            }
        }
    }
    stats.manifests_kept = kept.len() as u64;
    for key in doomed {
        store.delete(&key)?;
        stats.manifests_removed += 1;
    }
    for key in store.list("chunks/")? {
        if needed.contains(&key) || young(&key)? {
            stats.chunks_kept += 1;
        } else {
            store.delete(&key)?;
            stats.chunks_removed += 1;
        }
    }
    Ok(stats)
}
