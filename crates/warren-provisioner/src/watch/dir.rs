//! The mechanism of a directory watch (see the module above): inotify on descriptors,
//! a recursive tree of watches kept as directories come and go, and the polling fallback.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use warren_core::{SandboxId, VirtualPath};
use warren_fs::{Entry, FsError, Kind, WorkspaceRoot};

use super::poll::{Lister, Poller};
use super::{WatchChange, WatchKind};
use crate::{Provisioner, ProvisionerError};

/// The most entries a polled watch lists per tick (a recursive watch's whole tree), and the
/// most entries of a new directory reported as created when its watch is added.
pub const MAX_WATCHED_ENTRIES: usize = 10_000;

/// The most directories one recursive inotify watch watches (one inotify watch each).
pub const MAX_DIR_WATCHES: usize = 10_000;

/// How long a flush may take in all.
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// How long a flush waits for one more inotify event before it is done.
const FLUSH_QUIET: Duration = Duration::from_millis(10);

/// The most inotify events taken in one look without waiting (more wait for the next).
const MAX_EVENTS_AT_ONCE: usize = 4096;

/// Bytes read from an inotify descriptor at once: room for hundreds of events (each at
/// most 16 bytes plus a 256-byte name).
const READ_BUFFER: usize = 64 * 1024;

/// How many renames of warren's temporary files are remembered until their `IN_MOVED_TO`.
const MAX_TEMP_COOKIES: usize = 64;

// ----- what inotify says, as events -----

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
pub(crate) fn event_types(mask: EventMask) -> Vec<WatchKind> {
    let mut types = Vec::with_capacity(1);
    if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        types.push(WatchKind::Create);
    }
    if mask.contains(EventMask::MOVED_FROM) {
        types.push(WatchKind::Rename);
    }
    if mask.contains(EventMask::ATTRIB) {
        types.push(WatchKind::Chmod);
    }
    // CLOSE_WRITE is never asked for (see `watch_mask`); should it come, it is a write.
    if mask.intersects(EventMask::MODIFY | EventMask::CLOSE_WRITE) {
        types.push(WatchKind::Write);
    }
    if mask.contains(EventMask::DELETE) {
        types.push(WatchKind::Remove);
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
fn push_change(out: &mut Vec<WatchChange>, change: WatchChange) {
    if out
        .last()
        .is_some_and(|last| last.name == change.name && last.kind == change.kind)
    {
        return;
    }
    out.push(change);
}

/// What a watch learned in one look: its events, and why it ends, if it does.
#[derive(Debug, Default)]
pub struct WatchBatch {
    /// The events, in order.
    pub changes: Vec<WatchChange>,
    /// Why the watch ended, when it did: nothing more comes.
    pub end: Option<ProvisionerError>,
}

/// Why the inotify side cannot go on.
enum Stop {
    /// The watch is over: the client is told why.
    End(Box<ProvisionerError>),
    /// inotify ran out (`ENOSPC`: `max_user_watches`): polling takes over.
    Exhausted(std::io::Error),
}

/// The watch's own errors about its directory.
pub(super) fn directory_gone(base: &str) -> ProvisionerError {
    ProvisionerError::WatchedDirGone {
        path: base.to_owned(),
    }
}

fn too_many_directories(base: &str) -> ProvisionerError {
    ProvisionerError::WatchTooLarge {
        path: base.to_owned(),
        reason: format!(
            "more than {MAX_DIR_WATCHES} directories to watch; watch a smaller directory or not recursively"
        ),
    }
}

/// A file error on the watched directory, with its virtual path (I1).
pub(super) fn file_error(base: &str, source: FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: base.to_owned(),
        source,
    }
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
    Refused(ProvisionerError),
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
                Err(Stop::End(error)) => return Err(Start::Refused(*error)),
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
        out: &mut Vec<WatchChange>,
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
            return Err(Stop::End(Box::new(too_many_directories(&self.base))));
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
        out: &mut Vec<WatchChange>,
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
    fn report_new(&self, rel: &OsStr, entry: &Entry, out: &mut Vec<WatchChange>) {
        let written = entry.kind == Kind::File && entry.size > 0;
        let entry = self.include_entry.then(|| Entry {
            path: rel.to_string_lossy().into_owned(),
            os_path: rel.to_owned(),
            ..entry.clone()
        });
        self.push(out, rel, WatchKind::Create, entry.clone());
        if written {
            self.push(out, rel, WatchKind::Write, entry);
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
    fn take(&mut self, event: EventOwned, out: &mut Vec<WatchChange>) -> Result<(), Stop> {
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
            return Err(Stop::End(Box::new(directory_gone(&self.base))));
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
        out: &mut Vec<WatchChange>,
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
            // What a plain write shows (envd's, which E2B's own SDK tests count): made, its
            // owner and mode set (warren's file layer sets both), then its bytes, if any.
            self.push(out, rel, WatchKind::Create, entry.clone());
            self.push(out, rel, WatchKind::Chmod, entry.clone());
            if nonempty {
                self.push(out, rel, WatchKind::Write, entry);
            }
            return Ok(());
        }
        for kind in event_types(mask) {
            let entry = match kind {
                WatchKind::Create | WatchKind::Write | WatchKind::Chmod => self.entry(rel),
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
    fn check_root(
        &self,
        out: Vec<WatchChange>,
    ) -> Result<Vec<WatchChange>, (Vec<WatchChange>, Stop)> {
        let gone = match self.view.stat("") {
            Ok(this) => this.links == 0,
            Err(FsError::NotFound { .. }) => true,
            Err(_) => false,
        };
        if gone {
            return Err((out, Stop::End(Box::new(directory_gone(&self.base)))));
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

    fn push(&self, out: &mut Vec<WatchChange>, rel: &OsStr, kind: WatchKind, entry: Option<Entry>) {
        push_change(
            out,
            WatchChange {
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
    async fn next(&mut self, wait: Duration) -> Result<Vec<WatchChange>, (Vec<WatchChange>, Stop)> {
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
                Some(Err(error)) => return Err((out, Stop::End(Box::new(read_failed(&error))))),
                None => return Err((out, Stop::End(Box::new(read_closed())))),
            }
            match self.events.next().now_or_never() {
                Some(next) => event = next,
                None => break,
            }
        }
        Ok(out)
    }

    /// Takes everything the kernel holds now: events until none comes for
    /// [`FLUSH_QUIET`] (at most [`FLUSH_WAIT`] in all). Waiting, not just looking, lets the
    /// reactor see the queue's readiness, which may lag behind the change that caused it.
    async fn flush(&mut self) -> Result<Vec<WatchChange>, (Vec<WatchChange>, Stop)> {
        let mut out = Vec::new();
        let until = Instant::now() + FLUSH_WAIT;
        while Instant::now() < until {
            match tokio::time::timeout(FLUSH_QUIET, self.events.next()).await {
                Err(_) => break,
                Ok(Some(Ok(event))) => {
                    if let Err(stop) = self.watched.take(event, &mut out) {
                        return Err((out, stop));
                    }
                }
                Ok(Some(Err(error))) => {
                    return Err((out, Stop::End(Box::new(read_failed(&error)))))
                }
                Ok(None) => return Err((out, Stop::End(Box::new(read_closed())))),
            }
        }
        self.watched.check_root(out)
    }
}

fn read_closed() -> ProvisionerError {
    tracing::warn!("a directory watch's inotify queue closed");
    ProvisionerError::WatchFailed
}

fn read_failed(error: &std::io::Error) -> ProvisionerError {
    tracing::warn!(%error, "reading a directory watch's inotify events failed");
    ProvisionerError::WatchFailed
}

// ----- one watch, whichever way it learns -----

/// How a watch learns of changes.
enum Source {
    Inotify(Tree),
    Poll(Poller),
}

/// A watch of one directory of a sandbox (and, when recursive, everything beneath it):
/// inotify on descriptors warren resolved, or polling where inotify cannot be had. It holds
/// one inotify instance and the watched directory's descriptor; dropping it ends it.
pub struct DirWatch {
    source: Source,
    /// How often it lists the directory when it polls.
    tick: Duration,
    /// One of its sandbox's watch slots, held while it lives.
    _slot: super::WatchSlot,
    /// Asks now and then whether its sandbox still runs: a watch ends with the reason
    /// when it no longer does, whichever transport reads it.
    liveness: super::Liveness,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match &self.source {
            Source::Inotify(_) => "inotify",
            Source::Poll(poller) if poller.in_runtime() => "polling the runtime",
            Source::Poll(_) => "polling",
        };
        f.debug_struct("DirWatch").field("source", &how).finish()
    }
}

impl DirWatch {
    /// The watch's next events, waiting at most `wait` for some.
    ///
    /// It also ends, with the reason a command would be refused with (paused, being
    /// ended, gone), once its sandbox no longer runs: that is asked at most every
    /// [`LIVENESS_EVERY`](super::LIVENESS_EVERY), and `wait` is cut to the next ask.
    pub async fn next(&mut self, wait: Duration) -> WatchBatch {
        let wait = wait.min(self.liveness.due_in());
        let mut batch = match &mut self.source {
            Source::Inotify(tree) => {
                let taken = tree.next(wait).await;
                self.settle(taken)
            }
            Source::Poll(poller) => poller.next(wait).await,
        };
        if batch.end.is_none() {
            batch.end = self.liveness.check().await;
        }
        batch
    }

    /// Whether it ended because its sandbox no longer runs.
    pub fn sandbox_stopped(&self) -> bool {
        self.liveness.stopped()
    }

    /// Everything that happened until now: what the kernel holds is taken in (waiting up
    /// to about a second for it), or the directory is listed once more.
    pub async fn flush(&mut self) -> WatchBatch {
        match &mut self.source {
            Source::Inotify(tree) => {
                let taken = tree.flush().await;
                self.settle(taken)
            }
            Source::Poll(poller) => poller.poll().await,
        }
    }

    /// The events of an inotify look; when inotify ran out of watches, polling from here on.
    fn settle(&mut self, taken: Result<Vec<WatchChange>, (Vec<WatchChange>, Stop)>) -> WatchBatch {
        let (changes, stop) = match taken {
            Ok(changes) => return WatchBatch { changes, end: None },
            Err(failed) => failed,
        };
        let reason = match stop {
            Stop::End(error) => {
                return WatchBatch {
                    changes,
                    end: Some(*error),
                }
            }
            Stop::Exhausted(reason) => reason,
        };
        let Source::Inotify(tree) = &self.source else {
            return WatchBatch { changes, end: None };
        };
        let (view, base) = (tree.watched.view.clone(), tree.watched.base.clone());
        tracing::warn!(
            %base, %reason,
            "out of inotify watches (fs.inotify.max_user_watches): this directory watch polls from now on"
        );
        // Listed here, not on a blocking thread: this happens once per watch at most, and
        // the switch must not be lost to a cancelled await.
        match Poller::open_host_here(view, base, tree.watched.recursive, self.tick) {
            Ok(poller) => {
                self.source = Source::Poll(poller);
                WatchBatch { changes, end: None }
            }
            Err(error) => WatchBatch {
                changes,
                end: Some(error),
            },
        }
    }
}

impl Provisioner {
    /// Watches the directory `path` of the sandbox `id`, recursively or not, with each
    /// event's entry when `include_entry`. Its virtual path comes back beside it. It holds
    /// one of the sandbox's [`MAX_WATCHES_PER_SANDBOX`](super::MAX_WATCHES_PER_SANDBOX)
    /// slots.
    ///
    /// A directory of a persistent mount is resolved by descriptor like a read
    /// ([`Provisioner::open_watch_dir`]) and watched with inotify, or polled every `tick`
    /// (with a warning) when inotify cannot be had. One of the runtime's own tree is
    /// polled every `tick` through the runtime's agent (`poll.rs`): watching it starts the
    /// runtime, and the watch ends when the runtime stops.
    pub async fn watch_dir(
        self: &Arc<Self>,
        id: &SandboxId,
        path: &str,
        recursive: bool,
        include_entry: bool,
        tick: Duration,
    ) -> Result<(VirtualPath, DirWatch), ProvisionerError> {
        let slot = self.watches.acquire(id)?;
        let roots = self.roots_of(&self.sandbox(id).await?).await?;
        let resolved = roots.resolve_anywhere(path)?;
        let source = if resolved.is_runtime() {
            let lister = Lister::Runtime {
                provisioner: Arc::clone(self),
                sandbox: id.clone(),
                path: resolved.clone(),
            };
            Source::Poll(Poller::open(lister, resolved.to_string(), recursive, tick).await?)
        } else {
            let fd = self.open_resolved_dir(roots, resolved.clone()).await?;
            self.inotify_or_poll(fd, resolved.to_string(), recursive, include_entry, tick)
                .await?
        };
        Ok((
            resolved,
            DirWatch {
                source,
                tick,
                _slot: slot,
                liveness: super::Liveness::new(Arc::clone(&self.store), id.clone()),
            },
        ))
    }

    /// A watch of a persistent mount's directory, opened as `fd`: inotify, or polling
    /// where inotify cannot be had.
    async fn inotify_or_poll(
        &self,
        fd: OwnedFd,
        shown: String,
        recursive: bool,
        include_entry: bool,
        tick: Duration,
    ) -> Result<Source, ProvisionerError> {
        let built = blocking({
            let shown = shown.clone();
            move || Ok(Watched::build(fd, shown, recursive, include_entry))
        })
        .await?;
        match built {
            Ok((watched, inotify)) => {
                let events = inotify
                    .into_event_stream(vec![0; READ_BUFFER])
                    .map_err(|error| read_failed(&error))?;
                Ok(Source::Inotify(Tree { events, watched }))
            }
            Err(Start::Refused(error)) => Err(error),
            Err(Start::Unavailable { view, reason }) => {
                tracing::warn!(
                    base = %shown, %reason,
                    "inotify is unavailable (fs.inotify.max_user_instances or max_user_watches used up?): polling the directory instead"
                );
                let poller = Poller::open(Lister::Host(view), shown, recursive, tick).await?;
                Ok(Source::Poll(poller))
            }
        }
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ProvisionerError> + Send + 'static,
) -> Result<T, ProvisionerError> {
    tokio::task::spawn_blocking(work).await.map_err(|error| {
        tracing::warn!(%error, "opening a directory watch was interrupted");
        ProvisionerError::WatchFailed
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inotify_events_map_to_fsnotifys_events() {
        use WatchKind::*;
        let table: &[(EventMask, &[WatchKind])] = &[
            (EventMask::CREATE, &[Create]),
            (EventMask::CREATE | EventMask::ISDIR, &[Create]),
            (EventMask::MOVED_TO, &[Create]),
            (EventMask::MODIFY, &[Write]),
            (EventMask::CLOSE_WRITE, &[Write]),
            (EventMask::DELETE, &[Remove]),
            (EventMask::DELETE | EventMask::ISDIR, &[Remove]),
            (EventMask::MOVED_FROM, &[Rename]),
            (EventMask::ATTRIB, &[Chmod]),
            // The watched directory's own events end the watch; they are no entry's.
            (EventMask::DELETE_SELF, &[]),
            (EventMask::MOVE_SELF, &[]),
            (EventMask::IGNORED, &[]),
            (EventMask::ACCESS, &[]),
            // fsnotify's order when one mask says several things.
            (
                EventMask::CREATE | EventMask::MODIFY | EventMask::ATTRIB,
                &[Create, Chmod, Write],
            ),
        ];
        for (mask, want) in table {
            assert_eq!(event_types(*mask), *want, "{mask:?}");
        }
    }

    #[test]
    fn warrens_temporary_files_are_told_apart_and_bursts_merge() {
        assert!(is_temp(OsStr::new(".warren-tmp-12-3-456")));
        assert!(!is_temp(OsStr::new("warren-tmp-12")));
        assert!(!is_temp(OsStr::new("notes.txt")));
        let change = |name: &str, kind| WatchChange {
            name: name.to_owned(),
            kind,
            entry: None,
        };
        let mut out = Vec::new();
        push_change(&mut out, change("a", WatchKind::Create));
        push_change(&mut out, change("a", WatchKind::Write));
        push_change(&mut out, change("a", WatchKind::Write));
        push_change(&mut out, change("b", WatchKind::Write));
        push_change(&mut out, change("a", WatchKind::Write));
        let got: Vec<(&str, WatchKind)> = out.iter().map(|c| (c.name.as_str(), c.kind)).collect();
        assert_eq!(
            got,
            [
                ("a", WatchKind::Create),
                ("a", WatchKind::Write),
                ("b", WatchKind::Write),
                ("a", WatchKind::Write)
            ]
        );
    }

    #[test]
    fn subtrees_are_told_by_whole_components() {
        assert!(within(b"a", b"a"));
        assert!(within(b"a/b", b"a"));
        assert!(!within(b"ab", b"a"));
        assert!(!within(b"a-b/c", b"a"));
        assert_eq!(
            join_os(OsStr::new(""), OsStr::new("x")),
            OsString::from("x")
        );
        assert_eq!(
            join_os(OsStr::new("a/b"), OsStr::new("x")),
            OsString::from("a/b/x")
        );
    }
}
