//! Directory watches: `WatchDir` (a server stream) and the watchers of `CreateWatcher` /
//! `GetWatcherEvents` / `RemoveWatcher`.
//!
//! **inotify, by descriptor.** envd watches with inotify (through fsnotify), and so does
//! warren, without ever resolving a client's path as a host path string (I1, I2): the
//! provisioner resolves the virtual path like a read and hands back the directory's
//! descriptor ([`warren_provisioner::Provisioner::open_watch_dir`]: `openat2` beneath the
//! mount, no link in any component, no `..`, no mount crossing). The watch is added on
//! `/proc/self/fd/<n>` of that descriptor: the kernel resolves the magic link to the very
//! directory the descriptor holds, so what is watched is what was resolved, whatever the
//! path has become since. A recursive watch adds one watch per subdirectory, each opened by
//! its name from its parent's descriptor ([`warren_fs::open_child_dir`]: a symlink, even to
//! a directory, is never entered, so its target's changes are never reported), and so are
//! directories created or moved in later; a directory removed or moved away takes its
//! watches with it. Only the watched directory's own descriptor is kept: a parent is
//! reopened beneath it by descriptor when a child appears, so a watch of a large tree holds
//! one descriptor, not one per directory.
//!
//! **Events** are envd's (fsnotify's mapping of inotify, [`event_types`]): `IN_CREATE` and
//! `IN_MOVED_TO` are `CREATE`, `IN_MODIFY` is `WRITE`, `IN_DELETE` is `REMOVE`,
//! `IN_MOVED_FROM` is `RENAME` of the old name, `IN_ATTRIB` is `CHMOD`; `name` is the path
//! relative to the watched directory. Two things differ on purpose: warren's own atomic
//! writes (a temporary file renamed over the target, [`warren_fs::TEMP_PREFIX`]) are shown
//! as what the client did (`CREATE` and, when there are bytes, `WRITE` of the target) with
//! the temporary name hidden; and the entries already inside a directory by the time its
//! watch is added (created right after the `mkdir`) are reported as `CREATE`d, where
//! fsnotify would miss them (one may then be reported twice). Consecutive identical events
//! are merged (one `WRITE` for a burst of writes to one file).
//!
//! **Polling fallback.** When inotify cannot be had (the server's `max_user_instances` or
//! `max_user_watches` is used up, `/proc` is not mounted), a watch falls back, with a
//! warning, to listing the directory by its descriptor every tick and diffing snapshots
//! ([`super::fs::diff`]); so does a watch that runs out of inotify watches while it grows.
//! Polling is also what a sandbox whose files live on another host would need (inotify only
//! sees changes made through this host's kernel): no backend or replica does that today (the
//! runtimes of every backend write to this host's workspace directory, and an E2B sandbox's
//! envd is served where its requests land), so polling is only the fallback. A polled watch
//! misses a change undone within one tick.
//!
//! **Bounds.** At most [`MAX_WATCHES_PER_SANDBOX`] watches (streams and watchers) per
//! sandbox at once, each with at most [`MAX_DIR_WATCHES`] watched directories (then the watch
//! ends with a clear error) no deeper than a listing goes ([`warren_fs::MAX_WALK_DEPTH`]),
//! one inotify instance each (past the server's `max_user_instances`, polling); a watcher keeps at most [`MAX_BACKLOG`] undelivered events (the
//! oldest go first); a watcher nobody polled for [`WATCHER_IDLE`], or whose sandbox is no
//! longer live, is forgotten. A watch ends when its sandbox is no longer live or when the
//! watched directory is removed or moved. Neither watching nor a watcher's poll counts as
//! sandbox activity: only what a client does through the API does.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::response::Response;
use futures::{FutureExt, StreamExt};
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::{mpsc, oneshot};
use warren_core::VirtualPath;
use warren_fs::{Entry, FsError, Kind, WorkspaceRoot};
use warren_provisioner::ProvisionerError;

use super::connect::{Call, Code, ConnectError};
use super::fs::diff::{diff, Change, Snapshot};
use super::fs::entry::entry_info;
use super::fs::{connect_error, expand_home};
use super::proto::filesystem::{
    watch_dir_response, CreateWatcherRequest, CreateWatcherResponse, EventType, FilesystemEvent,
    GetWatcherEventsRequest, GetWatcherEventsResponse, RemoveWatcherRequest, RemoveWatcherResponse,
    WatchDirRequest, WatchDirResponse,
};
use super::EnvdContext;

/// How often a polled `WatchDir` stream lists its directory (the fallback only).
pub(crate) const STREAM_TICK: Duration = Duration::from_millis(250);

/// How often a polled watcher lists its directory between polls (the fallback only).
/// `GetWatcherEvents` lists once more before answering, so a change finished before the
/// poll is always in its answer.
pub(crate) const WATCHER_TICK: Duration = Duration::from_millis(500);

/// The most entries a polled watch lists per tick (a recursive watch's whole tree), and the
/// most entries of a new directory reported as created when its watch is added.
pub(crate) const MAX_WATCHED_ENTRIES: usize = 10_000;

/// The most directories one recursive inotify watch watches (one inotify watch each).
pub(crate) const MAX_DIR_WATCHES: usize = 10_000;

/// The most watches one sandbox holds at once, streams and watchers together.
pub(crate) const MAX_WATCHES_PER_SANDBOX: usize = 8;

/// The most undelivered events a watcher keeps.
pub(crate) const MAX_BACKLOG: usize = 4096;

/// How long a watcher lives without a poll.
pub(crate) const WATCHER_IDLE: Duration = Duration::from_secs(10 * 60);

/// How often a watch checks that its sandbox is still live.
const LIVENESS_EVERY: Duration = Duration::from_secs(5);

/// How long `GetWatcherEvents` waits for its watcher to take in what the kernel holds.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long a flush waits for one more inotify event before it is done.
const FLUSH_QUIET: Duration = Duration::from_millis(10);

/// The most inotify events taken in one look without waiting (more wait for the next).
const MAX_EVENTS_AT_ONCE: usize = 4096;

/// The keepalive interval when the client names none (the SDKs send 50 s).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

/// The header the SDKs name their keepalive interval in, in seconds.
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

/// Bytes read from an inotify descriptor at once: room for hundreds of events (each at
/// most 16 bytes plus a 256-byte name).
const READ_BUFFER: usize = 64 * 1024;

/// How many renames of warren's temporary files are remembered until their `IN_MOVED_TO`.
const MAX_TEMP_COOKIES: usize = 64;

// ----- what inotify says, as envd says it -----

/// What each watched directory is watched for: fsnotify's set (envd's), plus `ONLYDIR` (the
/// descriptor's target must be a directory) and `EXCL_UNLINK` (no events of a file already
/// unlinked but still open). `IN_CLOSE_WRITE` is left out as fsnotify leaves it out: a
/// write would be reported twice (`IN_MODIFY`, then the close). No `DONT_FOLLOW`: the path
/// given is the `/proc/self/fd/<n>` magic link, which must resolve to the descriptor's
/// directory (nothing else is ever followed: the descriptor was opened with no link, I2).
fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::EXCL_UNLINK
}

/// The events envd sends for an inotify event about an entry of a watched directory, in
/// envd's order (fsnotify's `Create`, `Rename`, `Chmod`, `Write`, `Remove`). The watched
/// directory's own events (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`) end a watch
/// instead and map to nothing here.
pub(crate) fn event_types(mask: EventMask) -> Vec<EventType> {
    let mut types = Vec::with_capacity(1);
    if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        types.push(EventType::Create);
    }
    if mask.contains(EventMask::MOVED_FROM) {
        types.push(EventType::Rename);
    }
    if mask.contains(EventMask::ATTRIB) {
        types.push(EventType::Chmod);
    }
    // CLOSE_WRITE is never asked for (see `watch_mask`); should it come, it is a write.
    if mask.intersects(EventMask::MODIFY | EventMask::CLOSE_WRITE) {
        types.push(EventType::Write);
    }
    if mask.contains(EventMask::DELETE) {
        types.push(EventType::Remove);
    }
    types
}

/// Whether a name is one of warren's temporary files (an atomic write in progress).
fn is_temp(name: &OsStr) -> bool {
    name.as_bytes()
        .starts_with(warren_fs::TEMP_PREFIX.as_bytes())
}

/// `dir/name`, or `name` under the watched directory itself.
fn join_os(dir: &OsStr, name: &OsStr) -> OsString {
    if dir.is_empty() {
        return name.to_owned();
    }
    let mut joined = dir.to_owned().into_vec();
    joined.push(b'/');
    joined.extend_from_slice(name.as_bytes());
    OsString::from_vec(joined)
}

/// Whether `path` is `dir` or lies beneath it.
fn within(path: &[u8], dir: &[u8]) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b'/'))
}

/// Queues an event unless it repeats the last one: a burst of writes is one `WRITE`.
fn push_change(out: &mut Vec<Change>, change: Change) {
    if out
        .last()
        .is_some_and(|last| last.name == change.name && last.kind == change.kind)
    {
        return;
    }
    out.push(change);
}

/// What a watch learned in one look: its events, and why it ends, if it does.
#[derive(Default)]
struct Batch {
    changes: Vec<Change>,
    end: Option<ConnectError>,
}

/// Why the inotify side cannot go on.
enum Stop {
    /// The watch is over: the client is told why.
    End(ConnectError),
    /// inotify ran out (`ENOSPC`: `max_user_watches`): polling takes over.
    Exhausted(std::io::Error),
}

/// The watch's own messages about its directory.
fn directory_gone(base: &str) -> ConnectError {
    ConnectError::new(
        Code::NotFound,
        format!("{base}: the watched directory was removed or moved"),
    )
}

fn too_many_directories(base: &str) -> ConnectError {
    ConnectError::new(
        Code::ResourceExhausted,
        format!(
            "{base}: more than {MAX_DIR_WATCHES} directories to watch; watch a smaller directory or not recursively"
        ),
    )
}

/// A file error on the watched directory, with its virtual path (I1).
fn file_error(base: &str, source: FsError) -> ConnectError {
    connect_error(ProvisionerError::File {
        path: base.to_owned(),
        source,
    })
}

// ----- the inotify side -----

/// One watched directory of a recursive watch.
struct WatchedDir {
    /// Its path relative to the watched directory, as exact bytes (empty for the directory
    /// itself).
    rel: OsString,
    wd: WatchDescriptor,
}

/// The state of an inotify watch that does not need the async reactor: which directory
/// each watch descriptor is, and how events become envd's.
struct Watched {
    watches: Watches,
    /// The watched directory, by its descriptor, as a read-only root: entries are stat'ed and
    /// parents of new subdirectories reopened beneath it (I2).
    view: Arc<WorkspaceRoot>,
    /// The virtual path, for messages (I1).
    base: String,
    recursive: bool,
    include_entry: bool,
    root_wd: i32,
    dirs: HashMap<i32, WatchedDir>,
    /// The same, by relative path, for dropping a whole subtree.
    by_rel: BTreeMap<OsString, i32>,
    /// Cookies of renames away from a temporary name, awaiting their `IN_MOVED_TO`.
    temp_cookies: VecDeque<u32>,
}

/// Why an inotify watch could not start.
enum Start {
    /// The client's request fails (a too large tree, a directory gone meanwhile).
    Refused(ConnectError),
    /// inotify cannot be had here: poll the directory instead.
    Unavailable {
        view: Arc<WorkspaceRoot>,
        reason: std::io::Error,
    },
}

/// Adds an inotify watch on the directory `dir` holds, through its `/proc/self/fd` link.
fn add_watch(watches: &mut Watches, dir: BorrowedFd<'_>) -> std::io::Result<WatchDescriptor> {
    watches.add(format!("/proc/self/fd/{}", dir.as_raw_fd()), watch_mask())
}

impl Watched {
    /// Watches the directory `fd` holds and, when `recursive`, every directory beneath it
    /// (blocking: run off the async threads). The inotify instance comes back beside.
    fn build(
        fd: OwnedFd,
        base: String,
        recursive: bool,
        include_entry: bool,
    ) -> Result<(Self, Inotify), Start> {
        let unavailable = |fd: OwnedFd, reason| match WorkspaceRoot::from_dir_fd(fd) {
            Ok(view) => Start::Unavailable {
                view: Arc::new(view),
                reason,
            },
            Err(error) => Start::Refused(file_error(&base, error)),
        };
        // EMFILE here is `max_user_instances` (128 by default), shared by the whole server.
        let inotify = match Inotify::init() {
            Ok(inotify) => inotify,
            Err(reason) => return Err(unavailable(fd, reason)),
        };
        let mut watches = inotify.watches();
        let root_wd = match add_watch(&mut watches, fd.as_fd()) {
            Ok(wd) => wd,
            Err(reason) => return Err(unavailable(fd, reason)),
        };
        let view = Arc::new(
            WorkspaceRoot::from_dir_fd(fd).map_err(|e| Start::Refused(file_error(&base, e)))?,
        );
        let root_id = root_wd.get_watch_descriptor_id();
        let mut watched = Self {
            watches,
            view: view.clone(),
            base,
            recursive,
            include_entry,
            root_wd: root_id,
            dirs: HashMap::from([(
                root_id,
                WatchedDir {
                    rel: OsString::new(),
                    wd: root_wd,
                },
            )]),
            by_rel: BTreeMap::from([(OsString::new(), root_id)]),
            temp_cookies: VecDeque::new(),
        };
        if recursive {
            let root = view
                .open_dir("")
                .map_err(|e| Start::Refused(file_error(&watched.base, e)))?;
            let mut ignored = Vec::new();
            match watched.add_children(root.as_fd(), OsStr::new(""), false, &mut ignored) {
                Ok(()) => {}
                Err(Stop::End(error)) => return Err(Start::Refused(error)),
                Err(Stop::Exhausted(reason)) => return Err(Start::Unavailable { view, reason }),
            }
        }
        Ok((watched, inotify))
    }

    /// Watches the directory `name` of `parent` (at `rel`) and everything beneath it; with
    /// `report`, what is already inside is reported as created (it came after the `mkdir`
    /// the caller is handling, before the new watch could see it).
    fn add_tree(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        rel: &OsStr,
        report: bool,
        out: &mut Vec<Change>,
    ) -> Result<(), Stop> {
        // As deep as a listing goes, and no deeper: this walk holds one descriptor per level.
        let depth = rel.as_bytes().iter().filter(|b| **b == b'/').count() + 1;
        if depth > warren_fs::MAX_WALK_DEPTH as usize {
            tracing::debug!(base = %self.base, "not watching a directory deeper than a listing goes");
            return Ok(());
        }
        // By name from the parent's descriptor: a symlink, a file or a mount point is not
        // entered (I2), and one gone meanwhile has nothing left to watch.
        let dir = match warren_fs::open_child_dir(parent, name) {
            Ok(dir) => dir,
            Err(error) => {
                tracing::debug!(%error, "not watching a directory that changed while it was added");
                return Ok(());
            }
        };
        if self.dirs.len() >= MAX_DIR_WATCHES {
            return Err(Stop::End(too_many_directories(&self.base)));
        }
        let wd = match add_watch(&mut self.watches, dir.as_fd()) {
            Ok(wd) => wd,
            // ENOSPC: `max_user_watches`, shared by every watch of the server's user.
            Err(error) if error.kind() == std::io::ErrorKind::StorageFull => {
                return Err(Stop::Exhausted(error))
            }
            Err(error) => {
                tracing::debug!(%error, "not watching a directory inotify refused");
                return Ok(());
            }
        };
        let id = wd.get_watch_descriptor_id();
        // The same inode watched already (it moved, and its old name was not dropped yet):
        // one descriptor, now under its new name.
        if let Some(old) = self.dirs.insert(
            id,
            WatchedDir {
                rel: rel.to_owned(),
                wd,
            },
        ) {
            self.by_rel.remove(&old.rel);
        }
        self.by_rel.insert(rel.to_owned(), id);
        self.add_children(dir.as_fd(), rel, report, out)
    }

    /// Watches the subdirectories of `dir` (at `rel`), reporting its entries when `report`.
    fn add_children(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &OsStr,
        report: bool,
        out: &mut Vec<Change>,
    ) -> Result<(), Stop> {
        let children: Vec<OsString> = if report {
            // The new directory as a root of its own, listed by its descriptor (I2).
            let listing = dir
                .try_clone_to_owned()
                .ok()
                .and_then(|fd| WorkspaceRoot::from_dir_fd(fd).ok())
                .and_then(|view| view.list("", 1, MAX_WATCHED_ENTRIES).ok());
            let Some(listing) = listing else {
                return Ok(()); // gone meanwhile
            };
            let mut children = Vec::new();
            for entry in listing.entries {
                let child = join_os(rel, &entry.os_path);
                self.report_new(&child, &entry, out);
                if entry.kind == Kind::Dir {
                    children.push(entry.os_path);
                }
            }
            children
        } else {
            match warren_fs::child_dirs(dir) {
                Ok(children) => children,
                Err(error) => {
                    tracing::debug!(%error, "not listing a directory that changed while it was added");
                    return Ok(());
                }
            }
        };
        for name in children {
            let child = join_os(rel, &name);
            self.add_tree(dir, &name, &child, report, out)?;
        }
        Ok(())
    }

    /// Reports an entry found in a new directory: created, and written if it has bytes.
    fn report_new(&self, rel: &OsStr, entry: &Entry, out: &mut Vec<Change>) {
        let written = entry.kind == Kind::File && entry.size > 0;
        let entry = self.include_entry.then(|| Entry {
            path: rel.to_string_lossy().into_owned(),
            os_path: rel.to_owned(),
            ..entry.clone()
        });
        self.push(out, rel, EventType::Create, entry.clone());
        if written {
            self.push(out, rel, EventType::Write, entry);
        }
    }

    /// Stops watching `rel` and everything beneath it (removed or moved away).
    fn drop_tree(&mut self, rel: &OsStr) {
        let gone: Vec<(OsString, i32)> = self
            .by_rel
            .range(rel.to_owned()..)
            .take_while(|(path, _)| path.as_bytes().starts_with(rel.as_bytes()))
            .filter(|(path, _)| within(path.as_bytes(), rel.as_bytes()))
            .map(|(path, id)| (path.clone(), *id))
            .collect();
        for (path, id) in gone {
            self.by_rel.remove(&path);
            if let Some(dir) = self.dirs.remove(&id) {
                // A removed directory's watch is gone already (EINVAL): nothing to undo.
                let _ = self.watches.remove(dir.wd);
            }
        }
    }

    /// Turns what the kernel reported into envd's events.
    fn take(&mut self, event: EventOwned, out: &mut Vec<Change>) -> Result<(), Stop> {
        let id = event.wd.get_watch_descriptor_id();
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            tracing::warn!(
                base = %self.base,
                "a directory watch's inotify queue overflowed: some events were lost"
            );
            return Ok(());
        }
        if id == self.root_wd
            && event
                .mask
                .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED)
        {
            return Err(Stop::End(directory_gone(&self.base)));
        }
        if event.mask.contains(EventMask::IGNORED) {
            // A subdirectory's watch went with it; its parent reported the removal.
            if let Some(dir) = self.dirs.remove(&id) {
                self.by_rel.remove(&dir.rel);
            }
            return Ok(());
        }
        // A subdirectory's own events (DELETE_SELF, MOVE_SELF) have no name: its parent
        // reports them as REMOVE or RENAME of its name.
        let Some(name) = event.name else {
            return Ok(());
        };
        let Some(parent) = self.dirs.get(&id) else {
            return Ok(()); // a watch being dropped
        };
        let rel = join_os(&parent.rel, &name);
        self.entry_event(id, &name, &rel, event.mask, event.cookie, out)
    }

    fn entry_event(
        &mut self,
        parent_id: i32,
        name: &OsStr,
        rel: &OsStr,
        mask: EventMask,
        cookie: u32,
        out: &mut Vec<Change>,
    ) -> Result<(), Stop> {
        if is_temp(name) {
            // An atomic write in progress: only where it lands is what the client did.
            if mask.contains(EventMask::MOVED_FROM) {
                if self.temp_cookies.len() >= MAX_TEMP_COOKIES {
                    self.temp_cookies.pop_front();
                }
                self.temp_cookies.push_back(cookie);
            }
            return Ok(());
        }
        let landed = mask.contains(EventMask::MOVED_TO)
            && self
                .temp_cookies
                .iter()
                .position(|c| *c == cookie)
                .map(|at| self.temp_cookies.remove(at))
                .is_some();
        if landed {
            let entry = self.entry(rel);
            let nonempty = match &entry {
                Some(entry) => entry.kind == Kind::File && entry.size > 0,
                None => entry_is_nonempty_file(&self.view, rel),
            };
            self.push(out, rel, EventType::Create, entry.clone());
            if nonempty {
                self.push(out, rel, EventType::Write, entry);
            }
            return Ok(());
        }
        for kind in event_types(mask) {
            let entry = match kind {
                EventType::Create | EventType::Write | EventType::Chmod => self.entry(rel),
                _ => None,
            };
            self.push(out, rel, kind, entry);
        }
        if self.recursive && mask.contains(EventMask::ISDIR) {
            if mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM) {
                self.drop_tree(rel);
            }
            if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                let Some(parent_rel) = self.dirs.get(&parent_id).map(|d| d.rel.clone()) else {
                    return Ok(());
                };
                // The parent, reopened by descriptor beneath the watched directory (I2).
                let Ok(parent) = self.view.open_dir(&parent_rel) else {
                    return Ok(());
                };
                // A directory moved in brings its entries along silently, as inotify does;
                // one just made may already hold entries its watch could not see.
                let report = mask.contains(EventMask::CREATE);
                self.add_tree(parent.as_fd(), name, rel, report, out)?;
            }
        }
        Ok(())
    }

    /// `out`, or `out` and the end of the watch when the watched directory is gone.
    ///
    /// inotify reports a directory's own removal (`IN_DELETE_SELF`) only once the last
    /// reference to it goes, and this watch holds one (its descriptor), as may a process
    /// whose working directory it is: so a removal is also seen here, as no link left.
    fn check_root(&self, out: Vec<Change>) -> Result<Vec<Change>, (Vec<Change>, Stop)> {
        let gone = match self.view.stat("") {
            Ok(this) => this.links == 0,
            Err(FsError::NotFound { .. }) => true,
            Err(_) => false,
        };
        if gone {
            return Err((out, Stop::End(directory_gone(&self.base))));
        }
        Ok(out)
    }

    /// The entry at `rel` now, when the watch includes entries.
    fn entry(&self, rel: &OsStr) -> Option<Entry> {
        if !self.include_entry {
            return None;
        }
        self.view.stat(rel).ok()
    }

    fn push(&self, out: &mut Vec<Change>, rel: &OsStr, kind: EventType, entry: Option<Entry>) {
        push_change(
            out,
            Change {
                name: rel.to_string_lossy().into_owned(),
                kind,
                entry,
            },
        );
    }
}

fn entry_is_nonempty_file(view: &WorkspaceRoot, rel: &OsStr) -> bool {
    view.stat(rel)
        .is_ok_and(|entry| entry.kind == Kind::File && entry.size > 0)
}

/// An inotify watch: the kernel's queue as the crate's tokio `EventStream`.
struct Tree {
    events: EventStream<Vec<u8>>,
    watched: Watched,
}

impl Tree {
    /// Waits up to `wait` for the kernel to report something, then takes what else it
    /// holds without waiting.
    async fn next(&mut self, wait: Duration) -> Result<Vec<Change>, (Vec<Change>, Stop)> {
        let mut out = Vec::new();
        // Cancel-safe: a stream's `next` consumes nothing until it returns an event, and
        // everything after it is synchronous.
        let first = match tokio::time::timeout(wait, self.events.next()).await {
            Err(_) => return self.watched.check_root(out),
            Ok(first) => first,
        };
        let mut event = first;
        for _ in 0..MAX_EVENTS_AT_ONCE {
            match event {
                Some(Ok(event)) => {
                    if let Err(stop) = self.watched.take(event, &mut out) {
                        return Err((out, stop));
                    }
                }
                Some(Err(error)) => return Err((out, Stop::End(read_failed(&error)))),
                None => return Err((out, Stop::End(read_closed()))),
            }
            match self.events.next().now_or_never() {
                Some(next) => event = next,
                None => break,
            }
        }
        Ok(out)
    }

    /// Takes everything the kernel holds now: events until none comes for
    /// [`FLUSH_QUIET`] (at most half of [`FLUSH_WAIT`] in all, so the poll waiting for it
    /// gets its answer). Waiting, not just looking, lets the
    /// reactor see the queue's readiness, which may lag behind the change that caused it.
    async fn flush(&mut self) -> Result<Vec<Change>, (Vec<Change>, Stop)> {
        let mut out = Vec::new();
        let until = Instant::now() + FLUSH_WAIT / 2;
        while Instant::now() < until {
            match tokio::time::timeout(FLUSH_QUIET, self.events.next()).await {
                Err(_) => break,
                Ok(Some(Ok(event))) => {
                    if let Err(stop) = self.watched.take(event, &mut out) {
                        return Err((out, stop));
                    }
                }
                Ok(Some(Err(error))) => return Err((out, Stop::End(read_failed(&error)))),
                Ok(None) => return Err((out, Stop::End(read_closed()))),
            }
        }
        self.watched.check_root(out)
    }
}

fn read_closed() -> ConnectError {
    tracing::warn!("a directory watch's inotify queue closed");
    ConnectError::new(Code::Internal, "the directory watch failed")
}

fn read_failed(error: &std::io::Error) -> ConnectError {
    tracing::warn!(%error, "reading a directory watch's inotify events failed");
    ConnectError::new(Code::Internal, "the directory watch failed")
}

// ----- the polling fallback -----

/// A watch that lists its directory by descriptor every tick and diffs the snapshots.
struct Poller {
    view: Arc<WorkspaceRoot>,
    base: String,
    depth: u32,
    tick: Duration,
    next_at: Instant,
    snapshot: Snapshot,
}

impl Poller {
    /// Takes the first snapshot (blocking). A tree too large to list fails here.
    fn open(
        view: Arc<WorkspaceRoot>,
        base: String,
        recursive: bool,
        tick: Duration,
    ) -> Result<Self, ConnectError> {
        let depth = if recursive {
            warren_fs::MAX_WALK_DEPTH
        } else {
            1
        };
        let snapshot = list(&view, &base, depth)?;
        Ok(Self {
            view,
            base,
            depth,
            tick,
            next_at: Instant::now() + tick,
            snapshot,
        })
    }

    /// Waits until the next tick (at most `wait`) and diffs, if the tick came.
    async fn next(&mut self, wait: Duration) -> Batch {
        let until = self.next_at.min(Instant::now() + wait);
        tokio::time::sleep_until(until.into()).await;
        if Instant::now() < self.next_at {
            return Batch::default();
        }
        self.poll().await
    }

    /// Lists now and diffs against the last snapshot.
    async fn poll(&mut self) -> Batch {
        self.next_at = Instant::now() + self.tick;
        let (view, base, depth) = (self.view.clone(), self.base.clone(), self.depth);
        let listed = tokio::task::spawn_blocking(move || list(&view, &base, depth))
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "a directory watch's listing was interrupted");
                Err(ConnectError::new(
                    Code::Internal,
                    "the directory watch failed",
                ))
            });
        match listed {
            Ok(now) => {
                let changes = diff(&self.snapshot, &now);
                self.snapshot = now;
                Batch { changes, end: None }
            }
            Err(error) => Batch {
                changes: Vec::new(),
                end: Some(error),
            },
        }
    }
}

/// Lists the watched directory to `depth` by its descriptor, at most
/// [`MAX_WATCHED_ENTRIES`]; a directory that was removed (no links left) ends the watch.
fn list(view: &WorkspaceRoot, base: &str, depth: u32) -> Result<Snapshot, ConnectError> {
    let this = view.stat("").map_err(|e| file_error(base, e))?;
    if this.links == 0 {
        return Err(directory_gone(base));
    }
    let listing = view
        .list("", depth, MAX_WATCHED_ENTRIES)
        .map_err(|e| file_error(base, e))?;
    if listing.truncated {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "{base}: more than {MAX_WATCHED_ENTRIES} entries to watch; watch a smaller directory{}",
                if depth > 1 { " or not recursively" } else { "" }
            ),
        ));
    }
    Ok(Snapshot::of_listing("", listing.entries))
}

// ----- one watch, whichever way it learns -----

/// How a watch learns of changes.
enum Source {
    Inotify(Tree),
    Poll(Poller),
}

impl Source {
    /// The watch's next events, waiting at most `wait` for some.
    async fn next(&mut self, wait: Duration) -> Batch {
        match self {
            Source::Inotify(tree) => {
                let taken = tree.next(wait).await;
                self.settle(taken)
            }
            Source::Poll(poller) => poller.next(wait).await,
        }
    }

    /// Everything that happened until now (a `GetWatcherEvents` answers after it).
    async fn flush(&mut self) -> Batch {
        match self {
            Source::Inotify(tree) => {
                let taken = tree.flush().await;
                self.settle(taken)
            }
            Source::Poll(poller) => poller.poll().await,
        }
    }

    /// The events of an inotify look; when inotify ran out of watches, polling from here on.
    fn settle(&mut self, taken: Result<Vec<Change>, (Vec<Change>, Stop)>) -> Batch {
        let (changes, stop) = match taken {
            Ok(changes) => return Batch { changes, end: None },
            Err(failed) => failed,
        };
        let reason = match stop {
            Stop::End(error) => {
                return Batch {
                    changes,
                    end: Some(error),
                }
            }
            Stop::Exhausted(reason) => reason,
        };
        let Source::Inotify(tree) = self else {
            return Batch { changes, end: None };
        };
        let (view, base) = (tree.watched.view.clone(), tree.watched.base.clone());
        tracing::warn!(
            %base, %reason,
            "out of inotify watches (fs.inotify.max_user_watches): this directory watch polls from now on"
        );
        // Listed here, not on a blocking thread: this happens once per watch at most, and
        // the switch must not be lost to a cancelled await.
        match Poller::open(view, base, tree.watched.recursive, WATCHER_TICK) {
            Ok(poller) => {
                *self = Source::Poll(poller);
                Batch { changes, end: None }
            }
            Err(error) => Batch {
                changes,
                end: Some(error),
            },
        }
    }
}

/// Opens a watch on the directory a client named: by descriptor through the provisioner,
/// then inotify, or polling when inotify cannot be had.
async fn open_source(
    ctx: &EnvdContext,
    path: &str,
    recursive: bool,
    include_entry: bool,
    tick: Duration,
) -> Result<(VirtualPath, Source), ConnectError> {
    let path = expand_home(path);
    let (base, fd) = ctx
        .shared
        .provisioner
        .open_watch_dir(&ctx.sandbox.warren_id, &path)
        .await
        .map_err(connect_error)?;
    let shown = base.to_string();
    let built = blocking({
        let shown = shown.clone();
        move || Ok(Watched::build(fd, shown, recursive, include_entry))
    })
    .await?;
    let source = match built {
        Ok((watched, inotify)) => {
            let events = inotify
                .into_event_stream(vec![0; READ_BUFFER])
                .map_err(|error| read_failed(&error))?;
            Source::Inotify(Tree { events, watched })
        }
        Err(Start::Refused(error)) => return Err(error),
        Err(Start::Unavailable { view, reason }) => {
            tracing::warn!(
                base = %shown, %reason,
                "inotify is unavailable (fs.inotify.max_user_instances or max_user_watches used up?): polling the directory instead"
            );
            let poller = blocking(move || Poller::open(view, shown, recursive, tick)).await?;
            Source::Poll(poller)
        }
    };
    Ok((base, source))
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ConnectError> + Send + 'static,
) -> Result<T, ConnectError> {
    tokio::task::spawn_blocking(work).await.map_err(|error| {
        tracing::warn!(%error, "opening a directory watch was interrupted");
        ConnectError::new(Code::Internal, "opening the directory watch failed")
    })?
}

/// What one watch reports about: a directory of a sandbox.
struct Target {
    ctx: EnvdContext,
    include_entry: bool,
    /// The directory as the provisioner resolved it, for in-runtime entry paths (I1).
    base: VirtualPath,
    last_liveness: Instant,
}

impl Target {
    /// Whether the sandbox still runs, asked at most every [`LIVENESS_EVERY`]. A store
    /// that cannot answer keeps the watch: it is forgotten later, not on a hiccup.
    async fn alive(&mut self) -> bool {
        if self.last_liveness.elapsed() < LIVENESS_EVERY {
            return true;
        }
        self.last_liveness = Instant::now();
        !matches!(
            crate::control::live_sandbox(&self.ctx.shared, &self.ctx.sandbox.sandbox_id).await,
            Ok(None)
        )
    }

    /// A change as the SDKs read it: `name` relative to the watched directory, the entry's
    /// path the runtime's (I1).
    fn event(&self, change: Change) -> FilesystemEvent {
        let entry = match (self.include_entry, change.entry) {
            (true, Some(mut entry)) => {
                // Entries are relative to the watched directory; `entry_info` rebases a
                // path relative to the mount's tree.
                entry.path = self.base.join(&entry.path).relative().to_owned();
                Some(entry_info(&self.base, &entry))
            }
            _ => None,
        };
        FilesystemEvent {
            name: change.name,
            r#type: change.kind as i32,
            entry,
        }
    }
}

// ----- the registry -----

/// Every watch of the server: the watchers by id, and how many watches each sandbox holds.
pub(crate) struct Watchers {
    inner: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    watchers: HashMap<String, Arc<Watcher>>,
    active: HashMap<String, usize>,
}

/// The server's watches. A process-wide registry, like the sandboxes' processes: a watch
/// belongs to its sandbox, and sandbox ids are unique on the server.
static WATCHERS: LazyLock<Watchers> = LazyLock::new(Watchers::new);

impl Watchers {
    fn new() -> Self {
        Self {
            inner: Mutex::new(Registry::default()),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves plain maps behind: still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes one of the sandbox's watch slots, refused when all are taken.
    fn acquire(&'static self, sandbox_id: &str) -> Result<Slot, ConnectError> {
        let mut registry = self.registry();
        let count = registry.active.entry(sandbox_id.to_owned()).or_default();
        if *count >= MAX_WATCHES_PER_SANDBOX {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "the sandbox already has {MAX_WATCHES_PER_SANDBOX} directory watches; stop one first"
                ),
            ));
        }
        *count += 1;
        Ok(Slot {
            watchers: self,
            sandbox_id: sandbox_id.to_owned(),
        })
    }

    /// The sandbox's watcher `id`; another sandbox's is not found.
    fn get(&self, sandbox_id: &str, id: &str) -> Option<Arc<Watcher>> {
        self.registry()
            .watchers
            .get(id)
            .filter(|watcher| watcher.sandbox_id == sandbox_id)
            .cloned()
    }

    /// Forgets the sandbox's watcher `id`; whether it existed.
    fn remove(&self, sandbox_id: &str, id: &str) -> bool {
        let mut registry = self.registry();
        let owned = registry
            .watchers
            .get(id)
            .is_some_and(|watcher| watcher.sandbox_id == sandbox_id);
        let removed = if owned {
            registry.watchers.remove(id)
        } else {
            None
        };
        // The lock goes before the watcher: the watcher's slot takes the lock to give
        // itself back when it is dropped.
        drop(registry);
        let existed = removed.is_some();
        drop(removed);
        existed
    }
}

/// One of a sandbox's watch slots, given back when dropped.
struct Slot {
    watchers: &'static Watchers,
    sandbox_id: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut registry = self.watchers.registry();
        if let Some(count) = registry.active.get_mut(&self.sandbox_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                registry.active.remove(&self.sandbox_id);
            }
        }
    }
}

/// A watcher of the trio: its events wait in an inbox until a poll takes them. Its task
/// owns the watch and ends when the watcher is dropped (its `flush` sender with it).
struct Watcher {
    sandbox_id: String,
    inbox: Arc<Mutex<Inbox>>,
    /// Asks the task to take in everything the watch holds now, answering when it has.
    flush: mpsc::Sender<oneshot::Sender<()>>,
    _slot: Slot,
}

struct Inbox {
    backlog: VecDeque<FilesystemEvent>,
    /// Why the watch ended (the directory went away); answered once the backlog is drained.
    failed: Option<ConnectError>,
    last_polled: Instant,
}

impl Inbox {
    fn deliver(&mut self, target: &Target, batch: Batch) {
        for change in batch.changes {
            if self.backlog.len() >= MAX_BACKLOG {
                // Bounded: the newest events are the ones a late poller needs.
                self.backlog.pop_front();
            }
            self.backlog.push_back(target.event(change));
        }
        if self.failed.is_none() {
            self.failed = batch.end;
        }
    }
}

fn lock(inbox: &Mutex<Inbox>) -> std::sync::MutexGuard<'_, Inbox> {
    // Plain data behind the lock: usable after a panic.
    inbox
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs a watcher's watch until the watcher is removed, idle, or its sandbox is no longer
/// live: events go to the inbox as the kernel (or a polling tick) reports them, and a
/// poll's flush request takes in everything there is before it is answered.
async fn run_watcher(
    id: String,
    sandbox_id: String,
    mut target: Target,
    mut source: Source,
    inbox: Arc<Mutex<Inbox>>,
    mut flush: mpsc::Receiver<oneshot::Sender<()>>,
) {
    let mut ended = false;
    loop {
        tokio::select! {
            biased;
            request = flush.recv() => {
                let Some(reply) = request else {
                    return; // the watcher was removed
                };
                if !ended {
                    let batch = source.flush().await;
                    ended = batch.end.is_some();
                    lock(&inbox).deliver(&target, batch);
                }
                let _ = reply.send(());
            }
            batch = source.next(LIVENESS_EVERY), if !ended => {
                ended = batch.end.is_some();
                lock(&inbox).deliver(&target, batch);
            }
            () = tokio::time::sleep(LIVENESS_EVERY), if ended => {}
        }
        let idle = lock(&inbox).last_polled.elapsed() >= WATCHER_IDLE;
        if idle || !target.alive().await {
            WATCHERS.remove(&sandbox_id, &id);
            return;
        }
    }
}

// ----- the methods -----

/// `CreateWatcher`: starts a watcher.
pub(crate) async fn create_watcher(
    ctx: EnvdContext,
    request: CreateWatcherRequest,
) -> Result<CreateWatcherResponse, ConnectError> {
    let slot = WATCHERS.acquire(&ctx.sandbox.sandbox_id)?;
    let sandbox_id = ctx.sandbox.sandbox_id.clone();
    let (base, source) = open_source(
        &ctx,
        &request.path,
        request.recursive,
        request.include_entry,
        WATCHER_TICK,
    )
    .await?;
    let target = Target {
        ctx,
        include_entry: request.include_entry,
        base,
        last_liveness: Instant::now(),
    };
    let id = format!("{:032x}", rand::random::<u128>());
    let inbox = Arc::new(Mutex::new(Inbox {
        backlog: VecDeque::new(),
        failed: None,
        last_polled: Instant::now(),
    }));
    let (flush, requests) = mpsc::channel(8);
    let watcher = Arc::new(Watcher {
        sandbox_id: sandbox_id.clone(),
        inbox: inbox.clone(),
        flush,
        _slot: slot,
    });
    WATCHERS.registry().watchers.insert(id.clone(), watcher);
    tokio::spawn(run_watcher(
        id.clone(),
        sandbox_id,
        target,
        source,
        inbox,
        requests,
    ));
    Ok(CreateWatcherResponse { watcher_id: id })
}

/// `GetWatcherEvents`: what changed since the last poll, everything the kernel holds
/// taken in first.
pub(crate) async fn get_watcher_events(
    ctx: EnvdContext,
    request: GetWatcherEventsRequest,
) -> Result<GetWatcherEventsResponse, ConnectError> {
    let watcher = WATCHERS
        .get(&ctx.sandbox.sandbox_id, &request.watcher_id)
        .ok_or_else(|| watcher_not_found(&request.watcher_id))?;
    lock(&watcher.inbox).last_polled = Instant::now();
    let (reply, flushed) = oneshot::channel();
    // A busy or finished task answers with what the inbox holds.
    let _ = tokio::time::timeout(FLUSH_WAIT, async {
        if watcher.flush.send(reply).await.is_ok() {
            let _ = flushed.await;
        }
    })
    .await;
    let mut inbox = lock(&watcher.inbox);
    let events: Vec<FilesystemEvent> = inbox.backlog.drain(..).collect();
    if events.is_empty() {
        if let Some(error) = inbox.failed.clone() {
            return Err(error);
        }
    }
    Ok(GetWatcherEventsResponse { events })
}

/// `RemoveWatcher`: forgets a watcher (its task and watch end with it).
pub(crate) async fn remove_watcher(
    ctx: EnvdContext,
    request: RemoveWatcherRequest,
) -> Result<RemoveWatcherResponse, ConnectError> {
    if WATCHERS.remove(&ctx.sandbox.sandbox_id, &request.watcher_id) {
        Ok(RemoveWatcherResponse {})
    } else {
        Err(watcher_not_found(&request.watcher_id))
    }
}

fn watcher_not_found(id: &str) -> ConnectError {
    ConnectError::new(
        Code::NotFound,
        format!(
            "watcher {:?} not found (stopped, or forgotten after {} minutes without a poll)",
            crate::error::shorten(id),
            WATCHER_IDLE.as_secs() / 60
        ),
    )
}

/// `WatchDir`: a start event, then the directory's events as they happen, with a
/// keepalive when nothing happened for the client's interval. The stream ends when the
/// client goes away (dropping it ends the watch), when its deadline passes, or when the
/// sandbox is no longer live; a directory that goes away ends it with the error.
pub(crate) async fn watch_dir(ctx: EnvdContext, mut call: Call) -> Response {
    let request: WatchDirRequest = match call.message().await {
        Ok(request) => request,
        Err(error) => return call.error(error),
    };
    let slot = match WATCHERS.acquire(&ctx.sandbox.sandbox_id) {
        Ok(slot) => slot,
        Err(error) => return call.error(error),
    };
    let opened = open_source(
        &ctx,
        &request.path,
        request.recursive,
        request.include_entry,
        STREAM_TICK,
    )
    .await;
    let (base, source) = match opened {
        Ok(opened) => opened,
        Err(error) => return call.error(error),
    };
    let keepalive = keepalive_interval(call.headers());
    let deadline = call.timeout().map(|timeout| Instant::now() + timeout);
    let start = WatchDirResponse {
        event: Some(watch_dir_response::Event::Start(
            watch_dir_response::StartEvent {},
        )),
    };
    let stream = StreamState {
        target: Target {
            ctx,
            include_entry: request.include_entry,
            base,
            last_liveness: Instant::now(),
        },
        source,
        pending: VecDeque::from([start]),
        ended: None,
        last_sent: Instant::now(),
        keepalive,
        deadline,
        _slot: slot,
    };
    call.stream(futures::stream::unfold(Some(stream), next_stream_item))
}

/// A `WatchDir` stream between two messages.
struct StreamState {
    target: Target,
    source: Source,
    pending: VecDeque<WatchDirResponse>,
    /// Why the watch ended, sent once `pending` is.
    ended: Option<ConnectError>,
    last_sent: Instant,
    keepalive: Duration,
    deadline: Option<Instant>,
    _slot: Slot,
}

/// The stream's next message: a queued one, or what the watch reports next.
async fn next_stream_item(
    state: Option<StreamState>,
) -> Option<(Result<WatchDirResponse, ConnectError>, Option<StreamState>)> {
    let mut state = state?;
    loop {
        if let Some(message) = state.pending.pop_front() {
            state.last_sent = Instant::now();
            return Some((Ok(message), Some(state)));
        }
        if let Some(error) = state.ended.take() {
            return Some((Err(error), None));
        }
        let now = Instant::now();
        if state.deadline.is_some_and(|at| now >= at) {
            let error = ConnectError::new(Code::DeadlineExceeded, "the watch's deadline passed");
            return Some((Err(error), None));
        }
        // Wake for the keepalive, the liveness check or the deadline, whichever is first.
        let mut wait = state
            .keepalive
            .saturating_sub(state.last_sent.elapsed())
            .min(LIVENESS_EVERY);
        if let Some(at) = state.deadline {
            wait = wait.min(at.saturating_duration_since(now));
        }
        let batch = state.source.next(wait).await;
        for change in batch.changes {
            let event = state.target.event(change);
            state.pending.push_back(WatchDirResponse {
                event: Some(watch_dir_response::Event::Filesystem(event)),
            });
        }
        state.ended = batch.end;
        if !state.target.alive().await {
            return None;
        }
        if state.pending.is_empty()
            && state.ended.is_none()
            && state.last_sent.elapsed() >= state.keepalive
        {
            state.pending.push_back(WatchDirResponse {
                event: Some(watch_dir_response::Event::Keepalive(
                    watch_dir_response::KeepAlive {},
                )),
            });
        }
    }
}

/// The client's keepalive interval (`Keepalive-Ping-Interval`, seconds), 1 s to 5 min.
fn keepalive_interval(headers: &axum::http::HeaderMap) -> Duration {
    headers
        .get(KEEPALIVE_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(|seconds| Duration::from_secs(seconds.clamp(1, 300)))
        .unwrap_or(DEFAULT_KEEPALIVE)
}

#[cfg(test)]
mod tests;

/// Watches end to end over a real provisioner (SQLite in memory, the memory backend, a
/// workspace in a temporary directory): the watcher trio and the watch itself, with the
/// changes made on the workspace directly, as a runtime makes them.
#[cfg(test)]
mod integration;
