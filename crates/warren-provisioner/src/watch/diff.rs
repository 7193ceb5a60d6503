//! Directory snapshots and the events between two of them, for the polling fallback of a
//! directory watch (a watch polls only where inotify cannot be had).
//!
//! The events are the ones envd's inotify watch (through fsnotify) reports for the same
//! change, as far as two snapshots can tell them apart:
//! - a new entry is `CREATE`, and a new non-empty file also `WRITE` (inotify sees the
//!   create, then the write);
//! - a file whose inode, size, mtime or ctime changed is `WRITE` (warren's own writes
//!   replace the file atomically, so a new inode under the same name is a write);
//! - permission or owner changes are `CHMOD`;
//! - an entry gone is `REMOVE`, a tree's children before the directory itself;
//! - an entry that left one name and appeared under another with the same inode is
//!   `RENAME` of the old name then `CREATE` of the new one (fsnotify's pair for a move
//!   within the watch); the children of a renamed directory move with it silently.
//!
//! What a diff cannot see: changes undone between two snapshots (a temporary file made
//! and removed within one tick), several writes within one tick (one `WRITE`), and the
//! order of changes within a tick, which is reconstructed, not observed. warren's own
//! temporary files ([`warren_fs::TEMP_PREFIX`], an atomic write in progress) are left out of
//! snapshots, as the inotify watch leaves them out: the write shows as its target changing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use warren_fs::{Entry, Kind};

use super::{WatchChange, WatchKind};

/// A directory's entries, keyed by their path relative to the watched directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Snapshot {
    entries: BTreeMap<String, Entry>,
}

impl Snapshot {
    /// The snapshot of a listing of the directory whose tree-relative path is `base`
    /// (entry paths are tree-relative too; `warren-fs` reports them so), without warren's
    /// temporary files.
    pub(crate) fn of_listing(base: &str, entries: Vec<Entry>) -> Self {
        let entries = entries
            .into_iter()
            .filter_map(|entry| {
                let name = relative_to(base, &entry.path)?;
                let leaf = name.rsplit('/').next().unwrap_or(name);
                if leaf.starts_with(warren_fs::TEMP_PREFIX) {
                    return None;
                }
                Some((name.to_owned(), entry))
            })
            .collect();
        Self { entries }
    }

    /// How many entries it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// `path` below `base`, or `None` for `base` itself or a path outside it.
fn relative_to<'a>(base: &str, path: &'a str) -> Option<&'a str> {
    let rest = if base.is_empty() {
        path
    } else {
        path.strip_prefix(base)?.strip_prefix('/')?
    };
    (!rest.is_empty()).then_some(rest)
}

/// Whether an entry was replaced by another object under the same name (a different
/// kind, or a new directory): reported as remove and create, not as a change.
fn replaced(old: &Entry, new: &Entry) -> bool {
    old.kind != new.kind || (new.kind == Kind::Dir && old.inode != new.inode)
}

/// The events that turn `old` into `new`.
pub(crate) fn diff(old: &Snapshot, new: &Snapshot) -> Vec<WatchChange> {
    let gone: Vec<&String> = old
        .entries
        .iter()
        .filter(|(name, entry)| {
            new.entries
                .get(*name)
                .is_none_or(|now| replaced(entry, now))
        })
        .map(|(name, _)| name)
        .collect();
    let mut arrived: BTreeSet<&String> = new
        .entries
        .iter()
        .filter(|(name, entry)| {
            old.entries
                .get(*name)
                .is_none_or(|was| replaced(was, entry))
        })
        .map(|(name, _)| name)
        .collect();

    // Pair moves by inode: a name that left and one that arrived holding the same object.
    let mut by_inode: HashMap<(u64, Kind), Vec<&String>> = HashMap::new();
    for name in &arrived {
        let entry = &new.entries[*name];
        if entry.inode != 0 {
            by_inode
                .entry((entry.inode, entry.kind))
                .or_default()
                .push(name);
        }
    }
    let mut moves: Vec<(&String, &String)> = Vec::new();
    for name in &gone {
        let entry = &old.entries[*name];
        if let Some(candidates) = by_inode.get_mut(&(entry.inode, entry.kind)) {
            if let Some(to) = candidates.pop() {
                moves.push((name, to));
            }
        }
    }
    let moved_from: BTreeSet<&String> = moves.iter().map(|(from, _)| *from).collect();
    for (_, to) in &moves {
        arrived.remove(*to);
    }
    // A renamed directory's children moved with it: inotify reports only the directory.
    let renamed_dirs: Vec<(&String, &String)> = moves
        .iter()
        .filter(|(from, _)| old.entries[*from].kind == Kind::Dir)
        .copied()
        .collect();
    let carried = |from: &str, to: &str| {
        renamed_dirs.iter().any(|(dir_from, dir_to)| {
            let (Some(rest_from), Some(rest_to)) =
                (relative_to(dir_from, from), relative_to(dir_to, to))
            else {
                return false;
            };
            rest_from == rest_to
        })
    };

    let mut changes = Vec::new();
    // Removals, deepest first (a tree's children go before the directory).
    for name in gone.iter().rev().filter(|name| !moved_from.contains(*name)) {
        changes.push(change(name, WatchKind::Remove, None));
    }
    for (from, to) in &moves {
        if carried(from, to) {
            continue;
        }
        changes.push(change(from, WatchKind::Rename, None));
        changes.push(change(to, WatchKind::Create, Some(&new.entries[*to])));
    }
    // Creations, parents first.
    for name in &arrived {
        let entry = &new.entries[*name];
        changes.push(change(name, WatchKind::Create, Some(entry)));
        if entry.kind == Kind::File && entry.size > 0 {
            changes.push(change(name, WatchKind::Write, Some(entry)));
        }
    }
    // Changes in place.
    for (name, now) in &new.entries {
        let Some(was) = old.entries.get(name) else {
            continue;
        };
        if replaced(was, now) {
            continue;
        }
        let attributes = was.mode != now.mode || was.uid != now.uid || was.gid != now.gid;
        let content = now.kind != Kind::Dir
            && (was.inode != now.inode
                || was.size != now.size
                || was.modified_unix_ms != now.modified_unix_ms
                || was.symlink_target != now.symlink_target
                // A ctime that moved alone is a write inside the mtime's granularity.
                || (!attributes && was.changed_unix_ns != now.changed_unix_ns));
        if content {
            changes.push(change(name, WatchKind::Write, Some(now)));
        }
        if attributes {
            changes.push(change(name, WatchKind::Chmod, Some(now)));
        }
    }
    changes
}

fn change(name: &str, kind: WatchKind, entry: Option<&Entry>) -> WatchChange {
    WatchChange {
        name: name.to_owned(),
        kind,
        entry: entry.cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "e2b/abc/watched";

    fn entry(name: &str, kind: Kind, inode: u64, size: u64) -> Entry {
        let path = format!("{BASE}/{name}");
        Entry {
            os_path: path.clone().into(),
            path,
            kind,
            size,
            mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
            modified_unix_ms: 1_000,
            modified_unix_ns: 1_000_000_000,
            uid: 1000,
            gid: 1000,
            symlink_target: None,
            os_symlink_target: None,
            inode,
            links: 1,
            changed_unix_ns: 1_000_000_000,
        }
    }

    fn file(name: &str, inode: u64, size: u64) -> Entry {
        entry(name, Kind::File, inode, size)
    }

    fn dir(name: &str, inode: u64) -> Entry {
        entry(name, Kind::Dir, inode, 4096)
    }

    fn snapshot(entries: Vec<Entry>) -> Snapshot {
        Snapshot::of_listing(BASE, entries)
    }

    fn events(old: Vec<Entry>, new: Vec<Entry>) -> Vec<(String, WatchKind)> {
        diff(&snapshot(old), &snapshot(new))
            .into_iter()
            .map(|change| (change.name, change.kind))
            .collect()
    }

    fn ev(name: &str, kind: WatchKind) -> (String, WatchKind) {
        (name.to_owned(), kind)
    }

    #[test]
    fn an_unchanged_directory_has_no_events() {
        let entries = vec![file("a", 1, 3), dir("d", 2), file("d/b", 3, 0)];
        assert_eq!(events(entries.clone(), entries), vec![]);
    }

    #[test]
    fn a_new_file_is_created_and_written_and_an_empty_one_only_created() {
        assert_eq!(
            events(vec![], vec![file("a", 1, 3), file("e", 2, 0)]),
            vec![
                ev("a", WatchKind::Create),
                ev("a", WatchKind::Write),
                ev("e", WatchKind::Create)
            ]
        );
    }

    #[test]
    fn a_changed_file_is_written_and_a_new_mode_is_chmod() {
        let mut grown = file("a", 1, 9);
        grown.changed_unix_ns += 1;
        let replaced = file("b", 20, 3);
        let mut same_size_later = file("c", 3, 3);
        same_size_later.changed_unix_ns += 5;
        let mut chmodded = file("d", 4, 3);
        chmodded.mode = 0o600;
        chmodded.changed_unix_ns += 1;
        assert_eq!(
            events(
                vec![
                    file("a", 1, 3),
                    file("b", 2, 3),
                    file("c", 3, 3),
                    file("d", 4, 3)
                ],
                vec![grown, replaced, same_size_later, chmodded]
            ),
            vec![
                ev("a", WatchKind::Write),
                ev("b", WatchKind::Write),
                ev("c", WatchKind::Write),
                ev("d", WatchKind::Chmod)
            ]
        );
    }

    #[test]
    fn a_removed_tree_reports_children_before_the_directory() {
        assert_eq!(
            events(
                vec![
                    dir("d", 1),
                    file("d/x", 2, 1),
                    file("d/y", 3, 1),
                    file("keep", 4, 1)
                ],
                vec![file("keep", 4, 1)]
            ),
            vec![
                ev("d/y", WatchKind::Remove),
                ev("d/x", WatchKind::Remove),
                ev("d", WatchKind::Remove)
            ]
        );
    }

    #[test]
    fn a_move_is_rename_of_the_old_name_then_create_of_the_new() {
        assert_eq!(
            events(vec![file("old", 7, 3)], vec![file("new", 7, 3)]),
            vec![ev("old", WatchKind::Rename), ev("new", WatchKind::Create)]
        );
    }

    #[test]
    fn a_renamed_directory_carries_its_children_silently() {
        assert_eq!(
            events(
                vec![dir("a", 1), file("a/x", 2, 1)],
                vec![dir("b", 1), file("b/x", 2, 1)]
            ),
            vec![ev("a", WatchKind::Rename), ev("b", WatchKind::Create)]
        );
    }

    #[test]
    fn a_name_that_changes_kind_is_removed_and_created() {
        assert_eq!(
            events(vec![file("x", 1, 1)], vec![dir("x", 2)]),
            vec![ev("x", WatchKind::Remove), ev("x", WatchKind::Create)]
        );
    }

    #[test]
    fn the_entry_travels_with_events_where_the_name_still_exists() {
        let changes = diff(
            &snapshot(vec![file("a", 1, 1)]),
            &snapshot(vec![file("b", 2, 1)]),
        );
        assert_eq!(changes[0].kind, WatchKind::Remove);
        assert!(changes[0].entry.is_none());
        assert_eq!(changes[1].kind, WatchKind::Create);
        assert_eq!(changes[1].entry.as_ref().map(|e| e.inode), Some(2));
    }

    #[test]
    fn an_atomic_writes_temporary_file_is_not_an_entry() {
        let temp = format!("{}1-2-3", warren_fs::TEMP_PREFIX);
        assert_eq!(
            snapshot(vec![file(&temp, 1, 1), file("kept", 2, 1)]).len(),
            1
        );
    }

    #[test]
    fn the_listing_base_itself_is_not_an_entry() {
        let mut base = dir("", 9);
        base.path = BASE.to_owned();
        assert_eq!(snapshot(vec![base, file("a", 1, 1)]).len(), 1);
        let root = Snapshot::of_listing("", vec![file("a", 1, 1)]);
        assert!(root.entries.contains_key("e2b/abc/watched/a"));
    }
}
