//! Directory watches as envd serves them: `WatchDir` (a server stream) and the watchers of
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`.
//!
//! The watches are the provisioner's ([`warren_provisioner::Provisioner::watch_dir`] and
//! its watchers): the directory resolved by descriptor like a read, inotify on that
//! descriptor (never a host path, I1, I2), a recursive tree of watches kept as directories
//! come and go, links never entered, warren's own atomic writes shown as what the client
//! did, polling with a warning where inotify cannot be had, a path of the runtime's own
//! tree (`/tmp`) polled through its agent, and the bounds per sandbox.
//! Here their events become envd's (`CREATE`, `WRITE`, `REMOVE`, `RENAME`, `CHMOD`, `name`
//! relative to the watched directory, the entry when asked), and a `WatchDir` stream gets
//! its keepalives. A watch ends when its sandbox no longer runs or when the watched
//! directory is removed or moved.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::response::Response;

use warren_core::VirtualPath;
use warren_provisioner::{DirWatch, WatchChange, WatchKind};

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

/// The keepalive interval when the client names none (the SDKs send 50 s).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

/// The longest keepalive interval a client may ask for.
const MAX_KEEPALIVE: Duration = Duration::from_secs(300);

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
) -> Result<(VirtualPath, DirWatch), ConnectError> {
    ctx.shared
        .provisioner
        .watch_dir(
            &ctx.sandbox.warren_id,
            &expand_home(path),
            recursive,
            include_entry,
            STREAM_TICK,
        )
        .await
        .map_err(connect_error)
}

/// What one watch reports about: a directory of a sandbox.
struct Target {
    include_entry: bool,
    /// The directory as the provisioner resolved it, for in-runtime entry paths (I1).
    base: VirtualPath,
}

impl Target {
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

// ----- the methods -----

/// `CreateWatcher`: starts a watcher.
pub(crate) async fn create_watcher(
    ctx: EnvdContext,
    request: CreateWatcherRequest,
) -> Result<CreateWatcherResponse, ConnectError> {
    let watcher_id = ctx
        .shared
        .provisioner
        .create_watcher(
            &ctx.sandbox.warren_id,
            &expand_home(&request.path),
            request.recursive,
            request.include_entry,
        )
        .await
        .map_err(connect_error)?;
    Ok(CreateWatcherResponse { watcher_id })
}

/// `GetWatcherEvents`: what changed since the last poll.
pub(crate) async fn get_watcher_events(
    ctx: EnvdContext,
    request: GetWatcherEventsRequest,
) -> Result<GetWatcherEventsResponse, ConnectError> {
    let taken = ctx
        .shared
        .provisioner
        .watcher_changes(&ctx.sandbox.warren_id, &request.watcher_id)
        .await
        .map_err(connect_error)?;
    // The changes carry entries only when the watcher was asked for them.
    let target = Target {
        include_entry: true,
        base: taken.base,
    };
    Ok(GetWatcherEventsResponse {
        events: taken
            .changes
            .into_iter()
            .map(|change| target.event(change))
            .collect(),
    })
}

/// `RemoveWatcher`: forgets a watcher (its task and watch end with it).
pub(crate) async fn remove_watcher(
    ctx: EnvdContext,
    request: RemoveWatcherRequest,
) -> Result<RemoveWatcherResponse, ConnectError> {
    ctx.shared
        .provisioner
        .remove_watcher(&ctx.sandbox.warren_id, &request.watcher_id)
        .map_err(connect_error)?;
    Ok(RemoveWatcherResponse {})
}

/// `WatchDir`: a start event, then the directory's events as they happen, with a
/// keepalive when nothing happened for the client's interval. The stream ends when the
/// client goes away (dropping it ends the watch) or when its deadline passes; a sandbox
/// that no longer runs or a directory that goes away ends it with the error.
pub(crate) async fn watch_dir(ctx: EnvdContext, mut call: Call) -> Response {
    let request: WatchDirRequest = match call.message().await {
        Ok(request) => request,
        Err(error) => return call.error(error),
    };
    let opened = open_source(
        &ctx,
        &request.path,
        request.recursive,
        request.include_entry,
    )
    .await;
    let (base, source) = match opened {
        Ok(opened) => opened,
        Err(error) => return call.error(error),
    };
    let keepalive = call.keepalive(DEFAULT_KEEPALIVE, MAX_KEEPALIVE);
    let deadline = call.timeout().map(|timeout| Instant::now() + timeout);
    let start = WatchDirResponse {
        event: Some(watch_dir_response::Event::Start(
            watch_dir_response::StartEvent {},
        )),
    };
    let stream = StreamState {
        target: Target {
            include_entry: request.include_entry,
            base,
        },
        source,
        pending: VecDeque::from([start]),
        ended: None,
        last_sent: Instant::now(),
        keepalive,
        deadline,
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
        // Wake for the keepalive or the deadline, whichever is first.
        let mut wait = state.keepalive.saturating_sub(state.last_sent.elapsed());
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
        // The provisioner's watch ends when its sandbox no longer runs, with the reason.
        state.ended = batch.end.map(connect_error);
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

#[cfg(test)]
mod tests;

/// Watches end to end over a real provisioner (SQLite in memory, the memory backend, a
/// workspace in a temporary directory): the watcher trio and the watch itself, with the
/// changes made on the workspace directly, as a runtime makes them.
#[cfg(test)]
mod integration;
