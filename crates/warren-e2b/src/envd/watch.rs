//! Directory watches as envd serves them: `WatchDir` (a server stream) and the watchers of
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`.
//!
//! The watch itself is the provisioner's ([`warren_provisioner::Provisioner::watch_dir`]):
//! the directory resolved by descriptor like a read, inotify on that descriptor (never a
//! host path, I1, I2), a recursive tree of watches kept as directories come and go, links
//! never entered, warren's own atomic writes shown as what the client did, and polling
//! with a warning where inotify cannot be had. Here its events become envd's
//! (`CREATE`, `WRITE`, `REMOVE`, `RENAME`, `CHMOD`, `name` relative to the watched
//! directory, the entry when asked), and the watches are bounded per sandbox.
//!
//! **Bounds.** At most [`MAX_WATCHES_PER_SANDBOX`] watches (streams and watchers) per
//! sandbox at once; a watcher keeps at most [`MAX_BACKLOG`] undelivered events (the oldest
//! go first); a watcher nobody polled for [`WATCHER_IDLE`], or whose sandbox is no longer
//! live, is forgotten. A watch ends when its sandbox is no longer live or when the watched
//! directory is removed or moved. Neither watching nor a watcher's poll counts as sandbox
//! activity: only what a client does through the API does.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::response::Response;

use tokio::sync::{mpsc, oneshot};
use warren_core::VirtualPath;
use warren_provisioner::{DirWatch, WatchBatch, WatchChange, WatchKind};

use super::connect::{Call, Code, ConnectError};
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

/// The keepalive interval when the client names none (the SDKs send 50 s).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

/// The header the SDKs name their keepalive interval in, in seconds.
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

/// envd's name for what happened.
fn event_type(kind: WatchKind) -> EventType {
    match kind {
        WatchKind::Create => EventType::Create,
        WatchKind::Write => EventType::Write,
        WatchKind::Remove => EventType::Remove,
        WatchKind::Rename => EventType::Rename,
        WatchKind::Chmod => EventType::Chmod,
    }
}

/// Opens the provisioner's watch of the directory a client named.
async fn open_source(
    ctx: &EnvdContext,
    path: &str,
    recursive: bool,
    include_entry: bool,
    tick: Duration,
) -> Result<(VirtualPath, DirWatch), ConnectError> {
    ctx.shared
        .provisioner
        .watch_dir(
            &ctx.sandbox.warren_id,
            &expand_home(path),
            recursive,
            include_entry,
            tick,
        )
        .await
        .map_err(connect_error)
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
    fn event(&self, change: WatchChange) -> FilesystemEvent {
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
            r#type: event_type(change.kind) as i32,
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
    fn deliver(&mut self, target: &Target, batch: WatchBatch) {
        for change in batch.changes {
            if self.backlog.len() >= MAX_BACKLOG {
                // Bounded: the newest events are the ones a late poller needs.
                self.backlog.pop_front();
            }
            self.backlog.push_back(target.event(change));
        }
        if self.failed.is_none() {
            self.failed = batch.end.map(connect_error);
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
    mut source: DirWatch,
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
    source: DirWatch,
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
        state.ended = batch.end.map(connect_error);
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
