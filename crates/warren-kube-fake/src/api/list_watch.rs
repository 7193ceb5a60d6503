//! Lists (with paging) and watches (from a resourceVersion, with bookmarks and 410s).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use http::StatusCode;
use serde_json::{json, Value};

use super::error::{ApiError, FieldError};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{EventType, Key, Kind, Shared, Store};
use super::{lock, DEFAULT_WATCH_TIMEOUT};

/// An object as a list item: the real server leaves `kind` and `apiVersion` out.
pub(super) fn list_item(object: &Value) -> Value {
    let mut item = object.clone();
    if let Some(map) = item.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    item
}

pub(super) fn list(
    store: &Store,
    kind: Kind,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(kind, query.get("fieldSelector").map_or("", String::as_str))?;
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => None,
        Some(Ok(0)) => None,
        Some(Ok(limit)) => Some(limit),
        Some(Err(_)) => return Err(ApiError::bad_request("limit must be an integer")),
    };
    // A continue token: `<resourceVersion>/<namespace>/<name>` of the last item served.
    let (list_rv, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        None => (store.rv, None),
        Some(token) => {
            let mut parts = token.splitn(3, '/');
            let (Some(rv), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(ApiError::bad_request("continue key is not valid"));
            };
            let rv = rv
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            if rv < store.compacted {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some((ns.to_owned(), name.to_owned())))
        }
    };
    let matching: Vec<(&Key, &Value)> = store
        .objects
        .iter()
        .filter(|((k, ns, name), object)| {
            *k == kind
                && namespace.is_none_or(|n| n == ns)
                && after
                    .as_ref()
                    .is_none_or(|(a_ns, a_name)| (ns, name) > (a_ns, a_name))
                && labels.matches(object)
                && fields.matches(kind, object)
        })
        .collect();
    let served = limit.map_or(matching.len(), |limit| limit.min(matching.len()));
    let items: Vec<Value> = matching[..served]
        .iter()
        .map(|(_, object)| list_item(object))
        .collect();
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if served < matching.len() {
        let ((_, ns, name), _) = matching[served - 1];
        metadata["continue"] = json!(format!("{list_rv}/{ns}/{name}"));
        if !query.contains_key("labelSelector") && !query.contains_key("fieldSelector") {
            metadata["remainingItemCount"] = json!(matching.len() - served);
        }
    }
    Ok(json!({
        "kind": format!("{}List", kind.name()),
        "apiVersion": kind.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

struct Watch {
    shared: Arc<Shared>,
    changed: tokio::sync::watch::Receiver<u64>,
    kind: Kind,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    /// The resourceVersion up to which events were sent.
    cursor: u64,
    epoch: u64,
    pending: VecDeque<Bytes>,
    deadline: tokio::time::Instant,
    done: bool,
}

fn watch_line(kind_of_change: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind_of_change, "object": object}))
        .expect("JSON serializes");
    line.push(b'\n');
    Bytes::from(line)
}

fn too_old(rv: u64, oldest: u64) -> Bytes {
    watch_line(
        "ERROR",
        &ApiError::expired(format!("too old resource version: {rv} ({oldest})")).status(),
    )
}

impl Watch {
    fn relevant(&self, namespace: &str, object: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
            && self.labels.matches(object)
            && self.fields.matches(self.kind, object)
    }

    /// Queues the events after the cursor (or the ERROR that ends the watch).
    fn catch_up(&mut self) {
        let shared = self.shared.clone();
        let store = lock(&shared.store);
        if store.epoch != self.epoch || self.cursor < store.compacted {
            self.pending
                .push_back(too_old(self.cursor, store.compacted + 1));
            self.done = true;
            return;
        }
        let start = store
            .history
            .partition_point(|event| event.rv <= self.cursor);
        for event in store.history.range(start..) {
            if event.kind != self.kind {
                continue;
            }
            let now = self.relevant(&event.namespace, &event.object);
            let before = event
                .previous
                .as_ref()
                .is_some_and(|previous| self.relevant(&event.namespace, previous));
            let kind_of_change = match (event.kind_of_change, before, now) {
                (EventType::Modified, true, true) => "MODIFIED",
                (EventType::Modified, false, true) => "ADDED",
                (EventType::Modified, true, false) => "DELETED",
                (kind_of_change, _, true) if kind_of_change != EventType::Modified => {
                    kind_of_change.as_str()
                }
                _ => continue,
            };
            self.pending
                .push_back(watch_line(kind_of_change, &event.object));
        }
        self.cursor = self.cursor.max(store.rv);
    }

    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(line);
            }
            if self.done {
                return None;
            }
            self.changed.borrow_and_update();
            self.catch_up();
            if !self.pending.is_empty() || self.done {
                continue;
            }
            tokio::select! {
                changed = self.changed.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = tokio::time::sleep_until(self.deadline) => return None,
            }
        }
    }
}

pub(super) fn watch(
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(kind, query.get("fieldSelector").map_or("", String::as_str))?;
    let timeout = match query.get("timeoutSeconds") {
        None => DEFAULT_WATCH_TIMEOUT,
        Some(seconds) => Duration::from_secs(
            seconds
                .parse()
                .map_err(|_| ApiError::bad_request("timeoutSeconds must be an integer"))?,
        ),
    };
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let send_initial = query.get("sendInitialEvents").is_some_and(|s| s == "true");
    if send_initial && !bookmarks {
        return Err(ApiError::invalid(
            kind,
            "",
            vec![FieldError::forbidden(
                "allowWatchBookmarks",
                "allowWatchBookmarks required when sendInitialEvents is set",
            )],
        ));
    }
    let from = match query.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let mut watch = Watch {
        shared: shared.clone(),
        changed: shared.changed.subscribe(),
        kind,
        namespace,
        labels,
        fields,
        cursor: 0,
        epoch: 0,
        pending: VecDeque::new(),
        deadline: tokio::time::Instant::now() + timeout,
        done: false,
    };
    {
        let store = lock(&shared.store);
        watch.epoch = store.epoch;
        match from {
            Some(rv) if !send_initial => watch.cursor = rv,
            _ => {
                // "Start at most recent" with the current state as synthetic ADDED events.
                for ((k, ns, _), object) in &store.objects {
                    if *k == kind && watch.relevant(ns, object) {
                        watch.pending.push_back(watch_line("ADDED", object));
                    }
                }
                watch.cursor = store.rv;
                if send_initial {
                    watch.pending.push_back(watch_line(
                        "BOOKMARK",
                        &json!({
                            "kind": kind.name(),
                            "apiVersion": kind.api_version(),
                            "metadata": {
                                "resourceVersion": store.rv.to_string(),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        }),
                    ));
                }
            }
        }
    }
    let stream = futures::stream::unfold(watch, |mut watch| async move {
        watch
            .next()
            .await
            .map(|line| (Ok::<_, Infallible>(line), watch))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("a watch response"))
}
