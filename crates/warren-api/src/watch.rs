//! `GET /v1/sandboxes/{id}/watch`: the provisioner's directory watch as a stream of
//! [`WatchEvent`] (NDJSON, or server-sent events with `Accept: text/event-stream`).
//!
//! The watch is [`warren_provisioner::Provisioner::watch_dir`]'s: the directory resolved by
//! descriptor like a read, links never followed, inotify or polling, bounded per sandbox.
//! The stream ends with an `error` event when the directory goes away or the sandbox no
//! longer runs; a client that goes away ends the watch.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use warren_protocol::{ErrorDetail, WatchEvent};
use warren_provisioner::{DirWatch, ProvisionerError, WatchChange, WatchKind};

use crate::extract::{ApiQuery, SandboxPath};
use crate::stream::{streaming, StreamFormat};
use crate::{ApiError, ApiState};

/// How long a watch stays silent before a `keepalive` event.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// How often a watch lists its directory where inotify cannot be had.
const POLL_TICK: Duration = Duration::from_millis(250);

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WatchQuery {
    /// The directory, as a virtual path (relative: under the workdir). An absolute path
    /// outside the persistent mounts is the runtime's own tree, polled through its agent.
    path: String,
    /// Whether to watch the directories beneath it too.
    #[serde(default)]
    recursive: bool,
}

/// Watches a directory of the sandbox: a `start` event, then what happens to its entries
/// (`create`, `write`, `remove`, `rename`, `chmod`) as it happens, a `keepalive` after 15
/// s of quiet. Refused (429 `too_many_watches`) beyond the sandbox's bound of watches. A
/// watch of the runtime's own tree (`/tmp`) starts the runtime and ends with a
/// `runtime_stopped` error event when the runtime stops.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/watch", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WatchQuery),
    responses(
        (status = 200, body = WatchEvent, content_type = "application/x-ndjson", description = "A stream of WatchEvent, one per line; server-sent events instead with Accept: text/event-stream"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, not_found: no such directory"),
        (status = 403, body = warren_protocol::ErrorBody, description = "symlink_refused: a link in the path; permission_denied: in the runtime, the sandbox user may not list it"),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_terminated: a runtime path of a sandbox that no longer runs"),
        (status = 429, body = warren_protocol::ErrorBody, description = "too_many_watches"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn watch(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let format = StreamFormat::from_accept(&headers).unwrap_or(StreamFormat::NdJson);
    let (base, watch) = state
        .provisioner
        .watch_dir(&id, &query.path, query.recursive, false, POLL_TICK)
        .await?;
    let stream = Stream {
        watch,
        pending: VecDeque::from([WatchEvent::Start {
            path: base.to_string(),
        }]),
        ended: false,
        last_sent: Instant::now(),
    };
    let body = futures::stream::unfold(Some((stream, format)), |next| async move {
        let (mut stream, format) = next?;
        let (event, last) = stream.next().await;
        let frame = format.watch_frame(&event);
        Some((
            Ok::<_, Infallible>(frame),
            (!last).then_some((stream, format)),
        ))
    });
    Ok(streaming(format, Body::from_stream(body)))
}

/// A watch between two events.
struct Stream {
    watch: DirWatch,
    pending: VecDeque<WatchEvent>,
    ended: bool,
    last_sent: Instant,
}

impl Stream {
    /// The next event, and whether it is the last.
    async fn next(&mut self) -> (WatchEvent, bool) {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.last_sent = Instant::now();
                let last = matches!(event, WatchEvent::Error { .. });
                return (event, last);
            }
            // The watch itself ends when its sandbox stops running (paused, ended).
            let wait = KEEPALIVE.saturating_sub(self.last_sent.elapsed());
            let batch = self.watch.next(wait).await;
            self.pending.extend(batch.changes.into_iter().map(event));
            if let Some(error) = batch.end {
                self.end(error);
            }
            if self.pending.is_empty() && self.last_sent.elapsed() >= KEEPALIVE {
                self.pending.push_back(WatchEvent::Keepalive);
            }
        }
    }

    fn end(&mut self, error: ProvisionerError) {
        if !self.ended {
            self.ended = true;
            self.pending.push_back(error_event(error.into()));
        }
    }
}

fn error_event(error: ApiError) -> WatchEvent {
    WatchEvent::Error {
        error: ErrorDetail::new(error.code(), error.message()),
    }
}

/// A change as the wire shows it.
fn event(change: WatchChange) -> WatchEvent {
    let name = change.name;
    match change.kind {
        WatchKind::Create => WatchEvent::Create { name },
        WatchKind::Write => WatchEvent::Write { name },
        WatchKind::Remove => WatchEvent::Remove { name },
        WatchKind::Rename => WatchEvent::Rename { name },
        WatchKind::Chmod => WatchEvent::Chmod { name },
    }
}

impl StreamFormat {
    fn watch_frame(self, event: &WatchEvent) -> Bytes {
        // Strings only: serialising cannot fail.
        let json = serde_json::to_string(event).unwrap_or_default();
        match self {
            Self::NdJson => Bytes::from(json + "\n"),
            Self::EventStream => {
                let name = match event {
                    WatchEvent::Start { .. } => "start",
                    WatchEvent::Create { .. } => "create",
                    WatchEvent::Write { .. } => "write",
                    WatchEvent::Remove { .. } => "remove",
                    WatchEvent::Rename { .. } => "rename",
                    WatchEvent::Chmod { .. } => "chmod",
                    WatchEvent::Keepalive => "keepalive",
                    WatchEvent::Error { .. } => "error",
                };
                Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
            }
        }
    }
}
