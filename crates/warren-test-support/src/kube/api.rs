//! A FAKE Kubernetes API server: small, stateful, in-process, over real HTTP on loopback,
//! for tests where no kube-apiserver can run. The real `kube::Client` talks to it.
//!
//! It serves the subset of the API the Kubernetes backend uses, with the real API's
//! semantics where it serves anything at all:
//!
//! - core/v1 `pods` (with `pods/status`), `services` (with `services/status`) and
//!   networking.k8s.io/v1 `networkpolicies`, namespaced (any namespace exists), plus
//!   cluster-wide list and watch (`/api/v1/pods`);
//! - create (`metadata.uid`, one global increasing `resourceVersion`, `creationTimestamp`,
//!   `generation`, `generateName`; a `clusterIP` from 10.96.0.0/16 and `nodePort`s from
//!   30000-32767 for services; a pod starts `Pending`), get, list (label selectors in every
//!   form, `metadata.name`/`metadata.namespace` field selectors and a few pod fields,
//!   `limit` + `continue`), watch (from a resourceVersion, with a bounded history, `410
//!   Expired` ERROR events for a compacted one, bookmarks for `sendInitialEvents`,
//!   `timeoutSeconds`), replace (resourceVersion precondition), merge, strategic-merge (merge
//!   with merge keys for the common lists) and JSON patches, delete and delete-collection
//!   (uid and resourceVersion preconditions), `dryRun=All`;
//! - validation that matters to callers: names (DNS-1123 subdomain for pods and network
//!   policies, DNS-1035 label for services, as the real server), label keys and values,
//!   pod containers, service ports, pod spec immutability, service IP immutability; every
//!   error is a real `Status` object, so kube maps it to `kube::Error::Api`;
//! - a kubelet hook ([`Kubelet`]) told of every pod created and deleted, reporting statuses
//!   back; error injection ([`Fault`]) and a request log.
//!
//! Not modelled: authentication and authorization, admission, defaulting beyond the few
//! fields above, graceful deletion (an object goes at once: no `deletionTimestamp`, no
//! finalizers, no garbage collection of dependents), server-side apply (answered `415`),
//! `fieldValidation=Strict` (unknown fields are dropped silently, as the default does),
//! consistent snapshots for paged or exact-resourceVersion lists (pages are of the current
//! state), periodic watch bookmarks, namespaces as objects, `PartialObjectMetadata`,
//! protobuf and tables, and every other resource and subresource (`exec`, `log`, ...).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{HeaderMap, Method, StatusCode, Uri};
use k8s_openapi::api::core::v1::{Pod, PodStatus, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{json, Value};

use super::{Kubelet, StatusReporter};

/// How many change events the server keeps for watches; older ones are compacted away.
const HISTORY_LIMIT: usize = 1024;
/// A watch without `timeoutSeconds` ends after this long (the real server picks 30-60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// The service CIDR clusterIPs come from (10.96.0.0/16; never routed, only a value).
const SERVICE_CIDR_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
/// The node port range of a default cluster.
const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// An error the server answers instead of handling a request, for the next `times`
/// requests that match. State is not touched.
#[derive(Clone, Debug)]
pub struct Fault {
    /// The method to match; `None` matches every method.
    pub method: Option<Method>,
    /// A substring of the request's path and query (`/api/v1/namespaces/ns/pods?watch=true`).
    pub path_contains: String,
    /// The HTTP status: 403, 409, 410, 422, 429, 500, 503, ... The `Status` body carries the
    /// matching reason (`Forbidden`, `Conflict`, `Gone`, `Invalid`, `TooManyRequests`,
    /// `InternalError`, `ServiceUnavailable`, ...).
    pub status: u16,
    /// How many matching requests fail.
    pub times: usize,
    /// A `Retry-After` header (and `details.retryAfterSeconds`), in seconds.
    pub retry_after: Option<u32>,
}

impl Fault {
    /// A fault answering `status` once to any method whose path and query contain
    /// `path_contains`.
    pub fn new(status: u16, path_contains: &str) -> Self {
        Self {
            method: None,
            path_contains: path_contains.to_owned(),
            status,
            times: 1,
            retry_after: None,
        }
    }
}

/// A FAKE Kubernetes API server on a free loopback port, served by a thread and runtime of
/// its own (so it works from `#[tokio::test]` and from plain tests alike). Stops when
/// dropped; dropping it does not tell the kubelet about the pods it still holds.
pub struct FakeApiServer {
    url: String,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts a server with no objects. `kubelet`, when given, is told of every pod created
    /// and deleted, and reports pod statuses back.
    pub fn start(kubelet: Option<Arc<dyn Kubelet>>) -> Self {
        let listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let url = format!("http://{}", listener.local_addr().expect("a local address"));
        let (changed, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new_cyclic(|weak| Shared {
            store: Mutex::new(Store::new()),
            changed,
            kubelet,
            faults: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            weak: weak.clone(),
        });
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fake-kube-apiserver".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a runtime for the fake API server");
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                    let app = Router::new().fallback(handle).with_state(state);
                    tokio::select! {
                        _ = axum::serve(listener, app) => {}
                        _ = stopped => {}
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("spawn the fake API server's thread");
        Self {
            url,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A `kube::Config` for this server: plain HTTP, no credentials, namespace `default`.
    /// kube's default retry of 429/503/504 (up to 15 times, honouring `Retry-After`) is on,
    /// as it is for real clusters; set `default_retry = false` to see every injected fault.
    pub fn config(&self) -> kube::Config {
        kube::Config::new(self.url.parse().expect("a valid URL"))
    }

    /// A `kube::Client` for [`FakeApiServer::config`]. Must be called inside a tokio
    /// runtime (the client spawns its request buffer there).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("a kube client for the fake API server")
    }

    /// Makes the next `fault.times` requests that match `fault` fail with its status.
    pub fn inject(&self, fault: Fault) {
        lock(&self.shared.faults).push(fault);
    }

    /// Every request received so far, in order: its method and its path with the query.
    pub fn requests(&self) -> Vec<(Method, String)> {
        lock(&self.shared.requests).clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }

    /// Drops the whole watch history, as etcd compaction does: a watch or a `continue`
    /// token from any earlier resourceVersion is then answered `410 Expired`.
    pub fn compact(&self) {
        let mut store = lock(&self.shared.store);
        store.history.clear();
        store.compacted = store.rv;
    }

    /// Ends every open watch with an ERROR event `410 Expired`, as the real server does
    /// when a watcher falls behind a compaction; watches started later are not affected.
    pub fn expire_watches(&self) {
        lock(&self.shared.store).epoch += 1;
        self.shared.notify();
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> String {
        lock(&self.shared.store).rv.to_string()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------------
// Resources

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Pod,
    Service,
    NetworkPolicy,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Pod, Kind::Service, Kind::NetworkPolicy];

    fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Service => "services",
            Kind::NetworkPolicy => "networkpolicies",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::NetworkPolicy => "NetworkPolicy",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Kind::Pod | Kind::Service => "",
            Kind::NetworkPolicy => "networking.k8s.io",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::Pod | Kind::Service => "v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
        }
    }

    fn has_status(self) -> bool {
        matches!(self, Kind::Pod | Kind::Service)
    }

    /// `pods`, `networkpolicies.networking.k8s.io`: how the real server names a resource in
    /// its messages.
    fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_owned(),
            group => format!("{}.{group}", self.plural()),
        }
    }

    fn details(self, name: &str) -> Value {
        let mut details = json!({"name": name, "kind": self.plural()});
        if !self.group().is_empty() {
            details["group"] = json!(self.group());
        }
        details
    }

    /// Decodes `object` as this kind and encodes it back: type errors become `400`, unknown
    /// fields are dropped (as the real server does without `fieldValidation=Strict`).
    fn round_trip(self, object: Value) -> Result<Value, ApiError> {
        fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
            kind: Kind,
            object: Value,
        ) -> Result<Value, ApiError> {
            let decoded: T = serde_json::from_value(object).map_err(|error| {
                ApiError::bad_request(format!(
                    "{kind} in version \"{version}\" cannot be handled as a {kind}: {error}",
                    kind = kind.name(),
                    version = kind.api_version().rsplit('/').next().unwrap_or("v1"),
                ))
            })?;
            Ok(serde_json::to_value(decoded).expect("a k8s-openapi object serializes"))
        }
        match self {
            Kind::Pod => typed::<Pod>(self, object),
            Kind::Service => typed::<Service>(self, object),
            Kind::NetworkPolicy => typed::<NetworkPolicy>(self, object),
        }
    }
}

type Key = (Kind, String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

struct Event {
    rv: u64,
    kind: Kind,
    namespace: String,
    kind_of_change: EventType,
    object: Arc<Value>,
    /// The object before a MODIFIED change (for selector transitions).
    previous: Option<Arc<Value>>,
}

struct Store {
    /// The latest resourceVersion handed out.
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    /// Every event up to this resourceVersion is gone; a watch from an older one gets 410.
    compacted: u64,
    /// Bumped by `expire_watches`.
    epoch: u64,
    next_ip: u32,
    next_port: u16,
}

impl Store {
    fn new() -> Self {
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 1,
            epoch: 0,
            next_ip: 10,
            next_port: *NODE_PORTS.start(),
        }
    }

    /// Stores `object` (or removes the object when `None`) under a new resourceVersion and
    /// records the change; returns the object as stored.
    fn commit(&mut self, key: &Key, object: Option<Value>, kind_of_change: EventType) -> Value {
        self.rv += 1;
        let rv = self.rv;
        let previous = self.objects.get(key).cloned();
        let mut object = match object {
            Some(object) => object,
            None => previous.clone().expect("a deleted object existed"),
        };
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if kind_of_change == EventType::Deleted {
            self.objects.remove(key);
        } else {
            self.objects.insert(key.clone(), object.clone());
        }
        self.history.push_back(Event {
            rv,
            kind: key.0,
            namespace: key.1.clone(),
            kind_of_change,
            object: Arc::new(object.clone()),
            previous: match kind_of_change {
                EventType::Modified => previous.map(Arc::new),
                _ => None,
            },
        });
        while self.history.len() > HISTORY_LIMIT {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.rv;
            }
        }
        object
    }
}

struct Shared {
    store: Mutex<Store>,
    /// Bumped after every change, waking the watches.
    changed: tokio::sync::watch::Sender<u64>,
    kubelet: Option<Arc<dyn Kubelet>>,
    faults: Mutex<Vec<Fault>>,
    requests: Mutex<Vec<(Method, String)>>,
    /// For the kubelet's reporters, which must not keep the server alive.
    weak: Weak<Shared>,
}

impl Shared {
    fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn take_fault(&self, method: &Method, path: &str) -> Option<Fault> {
        let mut faults = lock(&self.faults);
        let index = faults.iter().position(|fault| {
            fault.times > 0
                && fault.method.as_ref().is_none_or(|m| m == method)
                && path.contains(&fault.path_contains)
        })?;
        faults[index].times -= 1;
        let fault = faults[index].clone();
        if faults[index].times == 0 {
            faults.remove(index);
        }
        Some(fault)
    }

    fn reporter(&self, namespace: &str, name: &str, uid: &str) -> StatusReporter {
        let shared = self.weak.clone();
        let (namespace, name, uid) = (namespace.to_owned(), name.to_owned(), uid.to_owned());
        StatusReporter::new(move |status: PodStatus| {
            if let Some(shared) = shared.upgrade() {
                shared.set_pod_status(&namespace, &name, &uid, status);
            }
        })
    }

    /// A kubelet's report: replaces the pod's status if the pod (that uid) still exists.
    fn set_pod_status(&self, namespace: &str, name: &str, uid: &str, status: PodStatus) {
        let status = serde_json::to_value(status).expect("a PodStatus serializes");
        let key = (Kind::Pod, namespace.to_owned(), name.to_owned());
        let mut store = lock(&self.store);
        let Some(current) = store.objects.get(&key) else {
            return;
        };
        if current["metadata"]["uid"] != json!(uid) || current["status"] == status {
            return;
        }
        let mut updated = current.clone();
        updated["status"] = status;
        store.commit(&key, Some(updated), EventType::Modified);
        drop(store);
        self.notify();
    }
}

// ---------------------------------------------------------------------------------------
// Errors

/// A failure answered as a `Status` object.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
    retry_after: Option<u32>,
}

/// One cause of a `422 Invalid`.
struct FieldError {
    field: String,
    reason: &'static str,
    message: String,
}

impl FieldError {
    fn invalid(field: impl Into<String>, value: &str, detail: impl AsRef<str>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value:?}: {}", detail.as_ref()),
        }
    }

    fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueRequired",
            message: "Required value".to_owned(),
        }
    }

    fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {}", detail.into()),
        }
    }

    fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueDuplicate",
            message: format!("Duplicate value: {value:?}"),
        }
    }
}

impl ApiError {
    fn new(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason_for(code),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    fn not_found(kind: Kind, name: &str) -> Self {
        Self {
            details: Some(kind.details(name)),
            ..Self::new(404, format!("{} {name:?} not found", kind.qualified()))
        }
    }

    fn no_such_resource() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(404, "the server could not find the requested resource")
        }
    }

    fn already_exists(kind: Kind, name: &str) -> Self {
        Self {
            reason: "AlreadyExists",
            details: Some(kind.details(name)),
            ..Self::new(409, format!("{} {name:?} already exists", kind.qualified()))
        }
    }

    fn conflict(kind: Kind, name: &str, why: &str) -> Self {
        Self {
            details: Some(kind.details(name)),
            ..Self::new(
                409,
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: {why}",
                    kind.qualified()
                ),
            )
        }
    }

    fn modified(kind: Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    fn invalid(kind: Kind, name: &str, causes: Vec<FieldError>) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let summary = match summary.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        Self {
            details: Some(json!({
                "name": name,
                "group": kind.group(),
                "kind": kind.name(),
                "causes": causes.iter().map(|c| json!({
                    "reason": c.reason, "message": c.message, "field": c.field,
                })).collect::<Vec<_>>(),
            })),
            ..Self::new(
                422,
                format!("{} {name:?} is invalid: {summary}", kind.name()),
            )
        }
    }

    fn expired(message: impl Into<String>) -> Self {
        Self {
            reason: "Expired",
            ..Self::new(410, message)
        }
    }

    fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        if let Some(seconds) = self.retry_after {
            if !status["details"].is_object() {
                status["details"] = json!({});
            }
            status["details"]["retryAfterSeconds"] = json!(seconds);
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &self.status(),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).expect("JSON serializes"),
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------
// Routing

enum Target {
    Collection {
        kind: Kind,
        namespace: Option<String>,
    },
    Object {
        kind: Kind,
        namespace: String,
        name: String,
        status: bool,
    },
    Discovery(Value),
}

fn route(path: &str, url: &str) -> Result<Target, ApiError> {
    let path = path.trim_end_matches('/');
    let (group, rest) = if let Some(rest) = path.strip_prefix("/api/v1") {
        ("", rest)
    } else if let Some(rest) = path.strip_prefix("/apis/networking.k8s.io/v1") {
        ("networking.k8s.io", rest)
    } else {
        return discovery(path, url)
            .map(Target::Discovery)
            .ok_or_else(ApiError::no_such_resource);
    };
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    let kind_of = |plural: &str| {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.plural() == plural && kind.group() == group)
            .ok_or_else(ApiError::no_such_resource)
    };
    match segments.as_slice() {
        [] => Ok(Target::Discovery(resource_list(group))),
        [plural] => Ok(Target::Collection {
            kind: kind_of(plural)?,
            namespace: None,
        }),
        ["namespaces", namespace, plural] => Ok(Target::Collection {
            kind: kind_of(plural)?,
            namespace: Some((*namespace).to_owned()),
        }),
        ["namespaces", namespace, plural, name] => Ok(Target::Object {
            kind: kind_of(plural)?,
            namespace: (*namespace).to_owned(),
            name: (*name).to_owned(),
            status: false,
        }),
        ["namespaces", namespace, plural, name, "status"] => {
            let kind = kind_of(plural)?;
            if !kind.has_status() {
                return Err(ApiError::no_such_resource());
            }
            Ok(Target::Object {
                kind,
                namespace: (*namespace).to_owned(),
                name: (*name).to_owned(),
                status: true,
            })
        }
        _ => Err(ApiError::no_such_resource()),
    }
}

fn discovery(path: &str, url: &str) -> Option<Value> {
    let address = url.trim_start_matches("http://");
    match path {
        "/api" => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        })),
        "/apis" => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [{
                "name": "networking.k8s.io",
                "versions": [{"groupVersion": "networking.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "networking.k8s.io/v1", "version": "v1"},
            }],
        })),
        "/version" => Some(json!({
            "major": "1",
            "minor": "37",
            "gitVersion": "v1.37.0-fake",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.25",
            "compiler": "gc",
            "platform": "linux/amd64",
        })),
        _ => None,
    }
}

fn resource_list(group: &str) -> Value {
    let verbs = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let mut resources = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
        resources.push(json!({
            "name": kind.plural(), "singularName": kind.name().to_lowercase(),
            "namespaced": true, "kind": kind.name(), "verbs": verbs,
        }));
        if kind.has_status() {
            resources.push(json!({
                "name": format!("{}/status", kind.plural()), "singularName": "",
                "namespaced": true, "kind": kind.name(), "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = match group {
        "" => "v1".to_owned(),
        group => format!("{group}/v1"),
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path_and_query = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
    lock(&shared.requests).push((method.clone(), path_and_query.clone()));
    if let Some(fault) = shared.take_fault(&method, &path_and_query) {
        return ApiError {
            retry_after: fault.retry_after,
            ..ApiError::new(
                fault.status,
                format!("injected fault: {method} {path_and_query}"),
            )
        }
        .into_response();
    }
    match serve(&shared, &method, &uri, &headers, &body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn serve(
    shared: &Arc<Shared>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let query: HashMap<String, String> = Query::try_from_uri(uri)
        .map(|Query(query)| query)
        .map_err(|error| ApiError::bad_request(format!("invalid query: {error}")))?;
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
    let not_allowed = || {
        ApiError::new(
            405,
            format!("the server does not allow this method on the requested resource: {method}"),
        )
    };
    match route(uri.path(), &host_url(headers))? {
        Target::Discovery(document) => match *method {
            Method::GET => Ok(json_response(StatusCode::OK, &document)),
            _ => Err(not_allowed()),
        },
        Target::Collection { kind, namespace } => match *method {
            Method::GET => {
                if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                    watch(shared, kind, namespace, &query)
                } else {
                    let list = list(&lock(&shared.store), kind, namespace.as_deref(), &query)?;
                    Ok(json_response(StatusCode::OK, &list))
                }
            }
            Method::POST => {
                let namespace = namespace.ok_or_else(not_allowed)?;
                let body = parse_body(body)?;
                let created = create(shared, kind, &namespace, body, dry_run)?;
                if kind == Kind::Pod && !dry_run {
                    if let Some(kubelet) = &shared.kubelet {
                        let pod: Pod =
                            serde_json::from_value(created.clone()).expect("a stored pod decodes");
                        let uid = created["metadata"]["uid"].as_str().unwrap_or_default();
                        let name = created["metadata"]["name"].as_str().unwrap_or_default();
                        kubelet.pod_created(pod, shared.reporter(&namespace, name, uid));
                    }
                }
                Ok(json_response(StatusCode::CREATED, &created))
            }
            Method::DELETE => {
                let namespace = namespace.ok_or_else(not_allowed)?;
                let options = DeleteOptions::parse(body, &query)?;
                let (list, deleted) =
                    delete_collection(shared, kind, &namespace, &query, &options)?;
                for name in deleted {
                    pod_deleted(shared, &namespace, &name);
                }
                Ok(json_response(StatusCode::OK, &list))
            }
            _ => Err(not_allowed()),
        },
        Target::Object {
            kind,
            namespace,
            name,
            status,
        } => {
            let key = (kind, namespace.clone(), name.clone());
            match *method {
                Method::GET => {
                    let store = lock(&shared.store);
                    let object = store
                        .objects
                        .get(&key)
                        .ok_or_else(|| ApiError::not_found(kind, &name))?;
                    Ok(json_response(StatusCode::OK, object))
                }
                Method::PUT => {
                    let body = parse_body(body)?;
                    let updated = update(shared, &key, body, status, dry_run)?;
                    Ok(json_response(StatusCode::OK, &updated))
                }
                Method::PATCH => {
                    let content_type = headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .split(';')
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_owned();
                    let patched = patch(shared, &key, &content_type, body, status, dry_run)?;
                    Ok(json_response(StatusCode::OK, &patched))
                }
                Method::DELETE if !status => {
                    let options = DeleteOptions::parse(body, &query)?;
                    let response = delete(shared, &key, &options)?;
                    if kind == Kind::Pod && !options.dry_run {
                        pod_deleted(shared, &namespace, &name);
                    }
                    Ok(json_response(StatusCode::OK, &response))
                }
                _ => Err(not_allowed()),
            }
        }
    }
}

fn host_url(headers: &HeaderMap) -> String {
    headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| format!("http://{h}"))
        .unwrap_or_default()
}

fn pod_deleted(shared: &Shared, namespace: &str, name: &str) {
    if let Some(kubelet) = &shared.kubelet {
        kubelet.pod_deleted(namespace, name);
    }
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        ApiError::bad_request(format!(
            "the body of the request is not valid JSON: {error}"
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(value)
}

// ---------------------------------------------------------------------------------------
// Create, update, patch, delete

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Checks the body's `apiVersion`, `kind` and namespace against the request and fills them.
fn check_type(kind: Kind, namespace: &str, object: &mut Value) -> Result<(), ApiError> {
    for (field, expected) in [("apiVersion", kind.api_version()), ("kind", kind.name())] {
        match object.get(field).and_then(Value::as_str) {
            None | Some("") => object[field] = json!(expected),
            Some(given) if given == expected => {}
            Some(given) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({given}) does not match the expected {field} ({expected})"
                )))
            }
        }
    }
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    match object["metadata"].get("namespace").and_then(Value::as_str) {
        None | Some("") => object["metadata"]["namespace"] = json!(namespace),
        Some(given) if given == namespace => {}
        Some(_) => return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
    }
    Ok(())
}

fn create(
    shared: &Shared,
    kind: Kind,
    namespace: &str,
    mut object: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    check_type(kind, namespace, &mut object)?;
    let mut object = kind.round_trip(object)?;
    let metadata = object["metadata"]
        .as_object_mut()
        .expect("metadata is an object");
    for server_set in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "selfLink",
        "managedFields",
    ] {
        metadata.remove(server_set);
    }
    let given_name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let generate_name = metadata
        .get("generateName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if given_name.is_empty() && generate_name.is_empty() {
        return Err(ApiError::invalid(
            kind,
            "",
            vec![FieldError {
                field: "metadata.name".into(),
                reason: "FieldValueRequired",
                message: "Required value: name or generateName is required".into(),
            }],
        ));
    }
    match kind {
        Kind::Pod => {
            let qos = qos_class(&object["spec"]);
            object["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        Kind::Service => object["status"] = json!({"loadBalancer": {}}),
        Kind::NetworkPolicy => {}
    }

    let mut store = lock(&shared.store);
    let name = if given_name.is_empty() {
        loop {
            let candidate = format!("{generate_name}{}", random_suffix());
            if !store
                .objects
                .contains_key(&(kind, namespace.to_owned(), candidate.clone()))
            {
                break candidate;
            }
        }
    } else {
        given_name
    };
    object["metadata"]["name"] = json!(name);
    validate(kind, &object)?;
    if kind == Kind::Service {
        allocate_service(&mut store, &name, namespace, &mut object, None)?;
    }
    let key = (kind, namespace.to_owned(), name.clone());
    if store.objects.contains_key(&key) {
        return Err(ApiError::already_exists(kind, &name));
    }
    object["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
    object["metadata"]["creationTimestamp"] = json!(now());
    object["metadata"]["generation"] = json!(1);
    if dry_run {
        object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        return Ok(object);
    }
    let created = store.commit(&key, Some(object), EventType::Added);
    drop(store);
    shared.notify();
    Ok(created)
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// The pod's QoS class from its containers' requests and limits, as the real server does.
fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for container in &containers {
        let requests = &container["resources"]["requests"];
        let limits = &container["resources"]["limits"];
        for resource in ["cpu", "memory"] {
            let (request, limit) = (&requests[resource], &limits[resource]);
            if !request.is_null() || !limit.is_null() {
                any = true;
            }
            if limit.is_null() || (!request.is_null() && request != limit) {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed && !containers.is_empty()) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Replaces an object (or, with `status`, only its status) by `object`.
fn update(
    shared: &Shared,
    key: &Key,
    mut object: Value,
    status: bool,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let (kind, namespace, name) = key;
    check_type(*kind, namespace, &mut object)?;
    let object = kind.round_trip(object)?;
    let mut store = lock(&shared.store);
    let current = store
        .objects
        .get(key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(*kind, name))?;
    let given_name = object["metadata"]["name"].as_str().unwrap_or("");
    if given_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given_name}) does not match the name on the URL ({name})"
        )));
    }
    if let Some(uid) = object["metadata"]["uid"].as_str().filter(|u| !u.is_empty()) {
        if current["metadata"]["uid"] != json!(uid) {
            return Err(ApiError::conflict(
                *kind,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or("")
                ),
            ));
        }
    }
    if let Some(rv) = object["metadata"]["resourceVersion"]
        .as_str()
        .filter(|rv| !rv.is_empty())
    {
        if current["metadata"]["resourceVersion"] != json!(rv) {
            return Err(ApiError::modified(*kind, name));
        }
    }
    let mut updated = if status {
        let mut updated = current.clone();
        updated["status"] = object.get("status").cloned().unwrap_or(json!({}));
        updated
    } else {
        let mut updated = object;
        let metadata = updated["metadata"]
            .as_object_mut()
            .expect("metadata is an object");
        for kept in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
            match current["metadata"].get(kept) {
                Some(value) => metadata.insert(kept.to_owned(), value.clone()),
                None => metadata.remove(kept),
            };
        }
        if kind.has_status() {
            match current.get("status") {
                Some(value) => updated["status"] = value.clone(),
                None => {
                    updated.as_object_mut().map(|o| o.remove("status"));
                }
            }
        }
        validate(*kind, &updated)?;
        match kind {
            Kind::Pod => check_pod_update(name, &current, &updated)?,
            Kind::Service => {
                allocate_service(&mut store, name, namespace, &mut updated, Some(&current))?
            }
            Kind::NetworkPolicy => {}
        }
        if spec_of(&updated) != spec_of(&current) {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            updated["metadata"]["generation"] = json!(generation);
        }
        updated
    };
    let updated_without_rv = without_rv(&updated);
    if updated_without_rv == without_rv(&current) {
        // A no-op update keeps the resourceVersion and makes no event, as the real server.
        return Ok(current);
    }
    if dry_run {
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        return Ok(updated);
    }
    let updated = store.commit(key, Some(updated), EventType::Modified);
    drop(store);
    shared.notify();
    Ok(updated)
}

fn without_rv(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
    }
    object
}

/// Everything of an object but its metadata and status: what bumps `generation`.
fn spec_of(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        for field in ["metadata", "status", "kind", "apiVersion"] {
            map.remove(field);
        }
    }
    object
}

/// The real server lets a pod's spec change only in a few fields.
fn check_pod_update(name: &str, current: &Value, updated: &Value) -> Result<(), ApiError> {
    fn mutable_cleared(spec: &Value) -> Value {
        let mut spec = spec.clone();
        if let Some(map) = spec.as_object_mut() {
            for field in [
                "activeDeadlineSeconds",
                "tolerations",
                "terminationGracePeriodSeconds",
                "schedulingGates",
            ] {
                map.remove(field);
            }
        }
        for list in ["containers", "initContainers"] {
            if let Some(containers) = spec[list].as_array_mut() {
                for container in containers {
                    if let Some(container) = container.as_object_mut() {
                        container.remove("image");
                    }
                }
            }
        }
        spec
    }
    if mutable_cleared(&current["spec"]) == mutable_cleared(&updated["spec"]) {
        return Ok(());
    }
    Err(ApiError::invalid(
        Kind::Pod,
        name,
        vec![FieldError::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        )],
    ))
}

fn patch(
    shared: &Shared,
    key: &Key,
    content_type: &str,
    body: &[u8],
    status: bool,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let (kind, _, name) = key;
    match content_type {
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json-patch+json" => {}
        "application/apply-patch+yaml" => {
            return Err(ApiError::new(
                415,
                "server-side apply (application/apply-patch+yaml) is not modelled by this fake API server",
            ))
        }
        other => {
            return Err(ApiError::new(
                415,
                format!(
                    "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                ),
            ))
        }
    }
    // The real server applies a patch to the object it reads and retries when another
    // change comes in between; a patch that sets `metadata.resourceVersion` itself makes
    // that a precondition, which then fails every time (409).
    let mut attempts = 0;
    loop {
        let mut patched = lock(&shared.store)
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(*kind, name))?;
        if content_type == "application/json-patch+json" {
            let operations: Value = serde_json::from_slice(body).map_err(|error| {
                ApiError::bad_request(format!("the JSON patch is not valid JSON: {error}"))
            })?;
            json_patch(&mut patched, &operations)?;
        } else {
            let patch = parse_body(body)?;
            if content_type == "application/merge-patch+json" {
                merge_patch(&mut patched, &patch);
            } else {
                strategic_merge_patch(&mut patched, &patch, "");
            }
        }
        match update(shared, key, patched, status, dry_run) {
            Err(error) if error.code == 409 && attempts < 5 => attempts += 1,
            result => return result,
        }
    }
}

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("an object");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// The merge key of the lists a strategic merge patch merges element by element.
fn merge_key(field: &str, element: &Value) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "readinessGates" => Some(match field {
            "readinessGates" => "conditionType",
            _ => "name",
        }),
        "volumeMounts" => Some("mountPath"),
        "ownerReferences" => Some("uid"),
        "ports" if element.get("containerPort").is_some() => Some("containerPort"),
        "ports" => Some("port"),
        _ => None,
    }
}

/// A strategic merge patch for the subset of the API served here: a merge patch, except
/// that the well-known lists (containers, conditions, env, ports, ...) merge by their merge
/// key and honour `$patch: delete`; other directives are dropped.
fn strategic_merge_patch(target: &mut Value, patch: &Value, field: &str) {
    match (target.as_array_mut(), patch.as_array()) {
        (Some(current), Some(elements)) => {
            let Some(key) = elements.first().and_then(|e| merge_key(field, e)) else {
                *target = patch.clone();
                return;
            };
            for element in elements {
                let id = &element[key];
                let position = current.iter().position(|c| &c[key] == id);
                if element["$patch"] == json!("delete") {
                    if let Some(position) = position {
                        current.remove(position);
                    }
                    continue;
                }
                match position {
                    Some(position) => strategic_merge_patch(&mut current[position], element, ""),
                    None => {
                        let mut fresh = Value::Null;
                        strategic_merge_patch(&mut fresh, element, "");
                        current.push(fresh);
                    }
                }
            }
            return;
        }
        (_, Some(_)) => {
            *target = patch.clone();
            return;
        }
        _ => {}
    }
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("an object");
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target.remove(key);
        } else {
            strategic_merge_patch(target.entry(key.clone()).or_insert(Value::Null), value, key);
        }
    }
}

/// RFC 6902.
fn json_patch(target: &mut Value, operations: &Value) -> Result<(), ApiError> {
    let operations = operations
        .as_array()
        .ok_or_else(|| ApiError::bad_request("a JSON patch must be an array of operations"))?;
    for operation in operations {
        apply_operation(target, operation).map_err(|message| ApiError::new(422, message))?;
    }
    Ok(())
}

fn apply_operation(target: &mut Value, operation: &Value) -> Result<(), String> {
    let path = operation["path"]
        .as_str()
        .ok_or("a JSON patch operation needs a path")?;
    let from = || {
        operation["from"]
            .as_str()
            .ok_or_else(|| format!("operation {operation} needs from"))
    };
    match operation["op"].as_str().unwrap_or("") {
        "add" => pointer_add(target, path, operation["value"].clone()),
        "remove" => pointer_remove(target, path).map(drop),
        "replace" => {
            let slot = target.pointer_mut(path).ok_or_else(|| {
                format!("replace operation does not apply: doc is missing path: {path}")
            })?;
            *slot = operation["value"].clone();
            Ok(())
        }
        "move" => {
            let value = pointer_remove(target, from()?)?;
            pointer_add(target, path, value)
        }
        "copy" => {
            let from = from()?;
            let value = target.pointer(from).cloned().ok_or_else(|| {
                format!("copy operation does not apply: doc is missing from path: {from}")
            })?;
            pointer_add(target, path, value)
        }
        "test" => match target.pointer(path) {
            Some(value) if value == &operation["value"] => Ok(()),
            _ => Err(format!("testing value {path} failed: test failed")),
        },
        other => Err(format!("Unexpected kind: {other}")),
    }
}

fn split_pointer(path: &str) -> Result<(&str, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("invalid JSON pointer: {path}"))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn pointer_add(target: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("add operation does not apply: doc is missing path: {path}");
    match target.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(list) => {
            let index = if last == "-" {
                list.len()
            } else {
                last.parse::<usize>().map_err(|_| missing())?
            };
            if index > list.len() {
                return Err(missing());
            }
            list.insert(index, value);
            Ok(())
        }
        _ => Err(missing()),
    }
}

fn pointer_remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("remove operation does not apply: doc is missing path: {path}");
    match target.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => map.remove(&last).ok_or_else(missing),
        Value::Array(list) => match last.parse::<usize>() {
            Ok(index) if index < list.len() => Ok(list.remove(index)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

struct DeleteOptions {
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

impl DeleteOptions {
    fn parse(body: &[u8], query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body).map_err(|error| {
                ApiError::bad_request(format!("the DeleteOptions are not valid JSON: {error}"))
            })?
        };
        let text = |value: &Value| value.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        Ok(Self {
            uid: text(&body["preconditions"]["uid"]),
            resource_version: text(&body["preconditions"]["resourceVersion"]),
            dry_run: query.get("dryRun").is_some_and(|v| v == "All")
                || body["dryRun"]
                    .as_array()
                    .is_some_and(|modes| modes.contains(&json!("All"))),
        })
    }
}

/// Deletes at once: graceful deletion (`deletionTimestamp`, then removal after the grace
/// period and the finalizers) is not modelled. Pods and services answer the deleted
/// object, network policies a `Success` status, as the real server.
fn delete(shared: &Shared, key: &Key, options: &DeleteOptions) -> Result<Value, ApiError> {
    let (kind, _, name) = key;
    let mut store = lock(&shared.store);
    let current = store
        .objects
        .get(key)
        .ok_or_else(|| ApiError::not_found(*kind, name))?;
    let uid = current["metadata"]["uid"].as_str().unwrap_or("").to_owned();
    let rv = current["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    if let Some(expected) = options.uid.as_deref().filter(|u| *u != uid) {
        return Err(ApiError::conflict(
            *kind,
            name,
            &format!(
                "Precondition failed: UID in precondition: {expected}, UID in object meta: {uid}"
            ),
        ));
    }
    if let Some(expected) = options.resource_version.as_deref().filter(|r| *r != rv) {
        return Err(ApiError::conflict(
            *kind,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {expected}, ResourceVersion in object meta: {rv}"
            ),
        ));
    }
    let deleted = if options.dry_run {
        current.clone()
    } else {
        let deleted = store.commit(key, None, EventType::Deleted);
        drop(store);
        shared.notify();
        deleted
    };
    Ok(match kind {
        Kind::Pod | Kind::Service => deleted,
        Kind::NetworkPolicy => json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": kind.group(), "kind": kind.plural(), "uid": uid},
        }),
    })
}

/// Deletes every matching object; answers the list of them and the deleted names.
fn delete_collection(
    shared: &Shared,
    kind: Kind,
    namespace: &str,
    query: &HashMap<String, String>,
    options: &DeleteOptions,
) -> Result<(Value, Vec<String>), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(kind, query.get("fieldSelector").map_or("", String::as_str))?;
    let mut store = lock(&shared.store);
    let keys: Vec<Key> = store
        .objects
        .iter()
        .filter(|((k, ns, _), object)| {
            *k == kind && ns == namespace && labels.matches(object) && fields.matches(kind, object)
        })
        .map(|(key, _)| key.clone())
        .collect();
    let mut items = Vec::new();
    let mut names = Vec::new();
    for key in keys {
        let deleted = if options.dry_run {
            store.objects[&key].clone()
        } else {
            store.commit(&key, None, EventType::Deleted)
        };
        names.push(key.2.clone());
        items.push(list_item(&deleted));
    }
    let list = json!({
        "kind": format!("{}List", kind.name()),
        "apiVersion": kind.api_version(),
        "metadata": {"resourceVersion": store.rv.to_string()},
        "items": items,
    });
    drop(store);
    if options.dry_run || kind != Kind::Pod {
        names.clear();
    }
    shared.notify();
    Ok((list, names))
}

// ---------------------------------------------------------------------------------------
// Services: clusterIP and nodePort allocation

/// Fills a service's defaults and allocates its clusterIP and node ports (keeping those of
/// `current` on an update); `422` for a taken or out-of-range one or a changed clusterIP.
fn allocate_service(
    store: &mut Store,
    name: &str,
    namespace: &str,
    service: &mut Value,
    current: Option<&Value>,
) -> Result<(), ApiError> {
    let invalid = |cause| ApiError::invalid(Kind::Service, name, vec![cause]);
    let mut used_ips = HashSet::new();
    let mut used_ports = HashSet::new();
    for ((kind, ns, other), object) in &store.objects {
        if *kind != Kind::Service || (ns == namespace && other == name) {
            continue;
        }
        if let Some(ip) = object["spec"]["clusterIP"].as_str() {
            used_ips.insert(ip.to_owned());
        }
        for port in object["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(port) = port["nodePort"].as_u64() {
                used_ports.insert(port);
            }
        }
    }
    if !service["spec"].is_object() {
        service["spec"] = json!({});
    }
    let spec = &mut service["spec"];
    let service_type = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
    spec["type"] = json!(service_type);
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    if service_type == "ExternalName" {
        return Ok(());
    }
    let old_ip = current.and_then(|c| c["spec"]["clusterIP"].as_str());
    let given_ip = spec["clusterIP"].as_str().filter(|ip| !ip.is_empty());
    let ip = match (given_ip, old_ip) {
        (Some(given), Some(old)) if given != old => {
            return Err(invalid(FieldError::invalid(
                "spec.clusterIPs[0]",
                given,
                "may not change once set",
            )))
        }
        (_, Some(old)) => old.to_owned(),
        (Some("None"), None) => "None".to_owned(),
        (Some(given), None) => {
            let in_range = given
                .parse::<Ipv4Addr>()
                .is_ok_and(|ip| u32::from(ip) >> 16 == SERVICE_CIDR_BASE >> 16);
            if !in_range {
                return Err(invalid(FieldError::invalid(
                    "spec.clusterIPs",
                    given,
                    "failed to allocate IP: the provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/16",
                )));
            }
            if used_ips.contains(given) {
                return Err(invalid(FieldError::invalid(
                    "spec.clusterIPs",
                    given,
                    "failed to allocate IP: provided IP is already allocated",
                )));
            }
            given.to_owned()
        }
        (None, None) => loop {
            let offset = store.next_ip;
            store.next_ip = if offset >= 0xfffe { 1 } else { offset + 1 };
            let ip = Ipv4Addr::from(SERVICE_CIDR_BASE + offset).to_string();
            if !used_ips.contains(&ip) {
                break ip;
            }
        },
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if ip != "None" {
        spec["ipFamilies"] = json!(["IPv4"]);
        spec["ipFamilyPolicy"] = json!("SingleStack");
    }
    if spec["internalTrafficPolicy"].is_null() {
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    let node_ports = service_type == "NodePort" || service_type == "LoadBalancer";
    if node_ports && spec["externalTrafficPolicy"].is_null() {
        spec["externalTrafficPolicy"] = json!("Cluster");
    } else if !node_ports {
        if let Some(spec) = spec.as_object_mut() {
            spec.remove("externalTrafficPolicy");
        }
    }
    let old_ports: Vec<Value> = current
        .and_then(|c| c["spec"]["ports"].as_array().cloned())
        .unwrap_or_default();
    let mut taken = used_ports;
    let ports = spec["ports"].as_array_mut();
    for (index, port) in ports.into_iter().flatten().enumerate() {
        if port["protocol"].is_null() {
            port["protocol"] = json!("TCP");
        }
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
        let field = format!("spec.ports[{index}].nodePort");
        match (node_ports, port["nodePort"].as_u64()) {
            (false, Some(given))
                if old_ports
                    .iter()
                    .any(|old| old["nodePort"].as_u64() == Some(given)) =>
            {
                // Leaving NodePort: the real server drops the ports it had allocated.
                if let Some(port) = port.as_object_mut() {
                    port.remove("nodePort");
                }
            }
            (false, Some(_)) => {
                return Err(invalid(FieldError::forbidden(
                    field,
                    format!("may not be used when `type` is '{service_type}'"),
                )))
            }
            (false, None) => {}
            (true, Some(given)) => {
                let kept = old_ports
                    .iter()
                    .any(|old| old["nodePort"].as_u64() == Some(given));
                if !kept && !NODE_PORTS.contains(&u16::try_from(given).unwrap_or(0)) {
                    return Err(invalid(FieldError::invalid(
                        field,
                        &given.to_string(),
                        "provided port is not in the valid range. The range of valid ports is 30000-32767",
                    )));
                }
                if !taken.insert(given) {
                    return Err(invalid(FieldError::invalid(
                        field,
                        &given.to_string(),
                        "provided port is already allocated",
                    )));
                }
            }
            (true, None) => {
                let old = old_ports
                    .iter()
                    .find(|old| old["port"] == port["port"] && old["protocol"] == port["protocol"]);
                let chosen = match old.and_then(|old| old["nodePort"].as_u64()) {
                    Some(old) if !taken.contains(&old) => old,
                    _ => {
                        let mut tries = 0;
                        loop {
                            let candidate = u64::from(store.next_port);
                            store.next_port = if store.next_port >= *NODE_PORTS.end() {
                                *NODE_PORTS.start()
                            } else {
                                store.next_port + 1
                            };
                            if !taken.contains(&candidate) {
                                break candidate;
                            }
                            tries += 1;
                            if tries > NODE_PORTS.len() {
                                return Err(invalid(FieldError::invalid(
                                    field,
                                    "0",
                                    "failed to allocate a nodePort: range is full",
                                )));
                            }
                        }
                    }
                };
                taken.insert(chosen);
                port["nodePort"] = json!(chosen);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Validation

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const LABEL_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters.
fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn label_key_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_dns1123_subdomain(prefix) {
            return Some(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
        }
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".to_owned());
    }
    (!is_qualified_name_part(name)).then(|| LABEL_NAME_MSG.to_owned())
}

fn label_value_error(value: &str) -> Option<String> {
    if value.len() > 63 {
        return Some("must be no more than 63 characters".to_owned());
    }
    (!value.is_empty() && !is_qualified_name_part(value)).then(|| LABEL_VALUE_MSG.to_owned())
}

fn validate(kind: Kind, object: &Value) -> Result<(), ApiError> {
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    let mut causes = Vec::new();
    let (name_ok, message) = match kind {
        Kind::Service => (is_dns1035_label(name), DNS1035_LABEL_MSG),
        Kind::Pod | Kind::NetworkPolicy => (is_dns1123_subdomain(name), DNS1123_SUBDOMAIN_MSG),
    };
    if !name_ok {
        let message = if name.len() > 63 && kind == Kind::Service {
            "must be no more than 63 characters"
        } else {
            message
        };
        causes.push(FieldError::invalid("metadata.name", name, message));
    }
    if let Some(labels) = object["metadata"]["labels"].as_object() {
        for (key, value) in labels {
            if let Some(error) = label_key_error(key) {
                causes.push(FieldError::invalid("metadata.labels", key, error));
            }
            let value = value.as_str().unwrap_or("");
            if let Some(error) = label_value_error(value) {
                causes.push(FieldError::invalid("metadata.labels", value, error));
            }
        }
    }
    if let Some(annotations) = object["metadata"]["annotations"].as_object() {
        let mut total = 0;
        for (key, value) in annotations {
            total += key.len() + value.as_str().map_or(0, str::len);
            if let Some(error) = label_key_error(key) {
                causes.push(FieldError::invalid("metadata.annotations", key, error));
            }
        }
        if total > 256 * 1024 {
            causes.push(FieldError {
                field: "metadata.annotations".into(),
                reason: "FieldValueTooLong",
                message: "Too long: must have at most 262144 bytes".into(),
            });
        }
    }
    match kind {
        Kind::Pod => validate_pod_spec(&object["spec"], &mut causes),
        Kind::Service => validate_service_spec(&object["spec"], &mut causes),
        Kind::NetworkPolicy => {}
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(kind, name, causes))
    }
}

fn validate_pod_spec(spec: &Value, causes: &mut Vec<FieldError>) {
    let mut names = HashSet::new();
    for list in ["initContainers", "containers"] {
        let containers = spec[list].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if list == "containers" && containers.is_empty() {
            causes.push(FieldError::required("spec.containers"));
        }
        for (index, container) in containers.iter().enumerate() {
            let name = container["name"].as_str().unwrap_or("");
            let field = format!("spec.{list}[{index}]");
            if name.is_empty() {
                causes.push(FieldError::required(format!("{field}.name")));
            } else if !is_dns1123_label(name) {
                causes.push(FieldError::invalid(
                    format!("{field}.name"),
                    name,
                    DNS1123_LABEL_MSG,
                ));
            } else if !names.insert(name.to_owned()) {
                causes.push(FieldError::duplicate(format!("{field}.name"), name));
            }
            if container["image"].as_str().unwrap_or("").is_empty() {
                causes.push(FieldError::required(format!("{field}.image")));
            }
        }
    }
    if let Some(policy) = spec["restartPolicy"].as_str() {
        if !["Always", "OnFailure", "Never"].contains(&policy) {
            causes.push(FieldError {
                field: "spec.restartPolicy".into(),
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
                ),
            });
        }
    }
}

fn validate_service_spec(spec: &Value, causes: &mut Vec<FieldError>) {
    let service_type = spec["type"].as_str().unwrap_or("ClusterIP");
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&service_type) {
        causes.push(FieldError {
            field: "spec.type".into(),
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {service_type:?}: supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
            ),
        });
    }
    let ports = spec["ports"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let headless = spec["clusterIP"] == json!("None");
    if ports.is_empty() && !headless && service_type != "ExternalName" {
        causes.push(FieldError::required("spec.ports"));
    }
    let mut names = HashSet::new();
    for (index, port) in ports.iter().enumerate() {
        let field = format!("spec.ports[{index}]");
        match port["name"].as_str().unwrap_or("") {
            "" if ports.len() > 1 => causes.push(FieldError::required(format!("{field}.name"))),
            "" => {}
            name if !names.insert(name.to_owned()) => {
                causes.push(FieldError::duplicate(format!("{field}.name"), name))
            }
            _ => {}
        }
        let number = port["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&number) {
            causes.push(FieldError::invalid(
                format!("{field}.port"),
                &number.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Selectors

#[derive(Debug)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    GreaterThan(i64),
    LessThan(i64),
}

/// A parsed `labelSelector`: comma-joined requirements, all of which must hold.
#[derive(Debug, Default)]
struct LabelSelector(Vec<(String, LabelOp)>);

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Open,
    Close,
    Comma,
    Equals,
    NotEquals,
    Not,
    Greater,
    Less,
}

impl LabelSelector {
    fn parse(text: &str) -> Result<Self, ApiError> {
        let error =
            |why: &str| ApiError::bad_request(format!("unable to parse requirement: {why}"));
        let tokens = tokenize(text);
        let mut tokens = tokens.into_iter().peekable();
        let mut requirements = Vec::new();
        let word = |token: Option<Token>, what: &str| match token {
            Some(Token::Word(word)) => Ok(word),
            other => Err(error(&format!("found '{other:?}', expected: {what}"))),
        };
        while tokens.peek().is_some() {
            let requirement = if tokens.peek() == Some(&Token::Not) {
                tokens.next();
                (
                    word(tokens.next(), "identifier after '!'")?,
                    LabelOp::DoesNotExist,
                )
            } else {
                let key = word(tokens.next(), "identifier")?;
                let op = match tokens.peek() {
                    None | Some(Token::Comma) => LabelOp::Exists,
                    Some(Token::Equals | Token::NotEquals) => {
                        let equal = tokens.next() == Some(Token::Equals);
                        let value = match tokens.peek() {
                            Some(Token::Word(_)) => word(tokens.next(), "value")?,
                            _ => String::new(),
                        };
                        if equal {
                            LabelOp::Equals(value)
                        } else {
                            LabelOp::NotEquals(value)
                        }
                    }
                    Some(Token::Greater | Token::Less) => {
                        let greater = tokens.next() == Some(Token::Greater);
                        let value = word(tokens.next(), "integer value")?;
                        let number = value.parse::<i64>().map_err(|_| {
                            error(&format!(
                                "for 'Gt', 'Lt' operators, the value must be an integer: {value}"
                            ))
                        })?;
                        if greater {
                            LabelOp::GreaterThan(number)
                        } else {
                            LabelOp::LessThan(number)
                        }
                    }
                    Some(Token::Word(op)) if op == "in" || op == "notin" => {
                        let is_in = op == "in";
                        tokens.next();
                        if tokens.next() != Some(Token::Open) {
                            return Err(error("expected '(' after set operator"));
                        }
                        let mut values = Vec::new();
                        loop {
                            match tokens.next() {
                                Some(Token::Word(value)) => values.push(value),
                                Some(Token::Comma) => {}
                                Some(Token::Close) => break,
                                other => {
                                    return Err(error(&format!(
                                        "found '{other:?}', expected: ',', ')' or identifier"
                                    )))
                                }
                            }
                        }
                        if values.is_empty() {
                            return Err(error(
                                "for 'in', 'notin' operators, values set can't be empty",
                            ));
                        }
                        if is_in {
                            LabelOp::In(values)
                        } else {
                            LabelOp::NotIn(values)
                        }
                    }
                    Some(other) => {
                        return Err(error(&format!("found '{other:?}', expected an operator")))
                    }
                };
                (key, op)
            };
            if let Some(why) = label_key_error(&requirement.0) {
                return Err(error(&format!(
                    "key: Invalid value: {:?}: {why}",
                    requirement.0
                )));
            }
            let values: Vec<&String> = match &requirement.1 {
                LabelOp::Equals(v) | LabelOp::NotEquals(v) => vec![v],
                LabelOp::In(vs) | LabelOp::NotIn(vs) => vs.iter().collect(),
                _ => Vec::new(),
            };
            for value in values {
                if let Some(why) = label_value_error(value) {
                    return Err(error(&format!(
                        "values[0]: Invalid value: {value:?}: {why}"
                    )));
                }
            }
            requirements.push(requirement);
            match tokens.next() {
                None | Some(Token::Comma) => {}
                Some(other) => return Err(error(&format!("found '{other:?}', expected: ','"))),
            }
        }
        Ok(Self(requirements))
    }

    fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.0.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                LabelOp::Equals(expected) => value == Some(expected.as_str()),
                LabelOp::NotEquals(expected) => value != Some(expected.as_str()),
                LabelOp::In(set) => value.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::NotIn(set) => !value.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
                LabelOp::GreaterThan(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                LabelOp::LessThan(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => tokens.push(Token::Open),
            ')' => tokens.push(Token::Close),
            ',' => tokens.push(Token::Comma),
            '>' => tokens.push(Token::Greater),
            '<' => tokens.push(Token::Less),
            '=' => {
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                tokens.push(Token::Equals);
            }
            '!' => {
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::NotEquals);
                } else {
                    tokens.push(Token::Not);
                }
            }
            c => {
                let mut word = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || "(),=!<>".contains(next) {
                        break;
                    }
                    word.push(next);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
        }
    }
    tokens
}

/// A parsed `fieldSelector`: `field=value`, `field==value`, `field!=value`, comma-joined.
#[derive(Debug, Default)]
struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    fn parse(kind: Kind, text: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((field, value)) = term.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) = term.split_once("==") {
                (field, true, value)
            } else if let Some((field, value)) = term.split_once('=') {
                (field, true, value)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if field_value(kind, &json!({}), field).is_none() {
                return Err(ApiError::bad_request(format!(
                    "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"{}",
                    if kind == Kind::Pod {
                        ", \"spec.nodeName\", \"spec.restartPolicy\", \"spec.schedulerName\", \"spec.serviceAccountName\", \"status.phase\", \"status.podIP\", \"status.nominatedNodeName\""
                    } else {
                        ""
                    }
                )));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    fn matches(&self, kind: Kind, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            (field_value(kind, object, field).as_deref() == Some(value.as_str())) == *equal
        })
    }
}

/// The value of a selectable field (`""` when unset), `None` for an unknown field.
fn field_value(kind: Kind, object: &Value, field: &str) -> Option<String> {
    let pointer = match (kind, field) {
        (_, "metadata.name") => "/metadata/name",
        (_, "metadata.namespace") => "/metadata/namespace",
        (Kind::Pod, "spec.nodeName") => "/spec/nodeName",
        (Kind::Pod, "spec.restartPolicy") => "/spec/restartPolicy",
        (Kind::Pod, "spec.schedulerName") => "/spec/schedulerName",
        (Kind::Pod, "spec.serviceAccountName") => "/spec/serviceAccountName",
        (Kind::Pod, "status.phase") => "/status/phase",
        (Kind::Pod, "status.podIP") => "/status/podIP",
        (Kind::Pod, "status.nominatedNodeName") => "/status/nominatedNodeName",
        _ => return None,
    };
    Some(
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    )
}

// ---------------------------------------------------------------------------------------
// List and watch

/// An object as a list item: the real server leaves `kind` and `apiVersion` out.
fn list_item(object: &Value) -> Value {
    let mut item = object.clone();
    if let Some(map) = item.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    item
}

fn list(
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

fn watch(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_of_every_form_parse_and_match() {
        let object = json!({"metadata": {"labels": {"app": "web", "tier": "front", "n": "5"}}});
        for (selector, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db,cache)", true),
            ("missing notin (x)", true),
            ("app=web,tier in (front),!missing", true),
            ("app=web,tier=back", false),
            ("n>4,n<6", true),
            ("n>5", false),
        ] {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&object), expected, "{selector}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_bad_requests() {
        for selector in [
            "app in ()",
            "app in web",
            "=x",
            "a b",
            "bad key=x",
            "app=bad value!",
        ] {
            let error = LabelSelector::parse(selector).unwrap_err();
            assert_eq!(error.code, 400, "{selector}");
        }
    }

    #[test]
    fn names_follow_the_real_rules() {
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(is_dns1035_label("abc-1"));
        assert!(!is_dns1035_label("1abc"));
        assert!(!is_dns1035_label("a.b"));
        assert!(label_key_error("warren.dev/uid").is_none());
        assert!(label_key_error("Warren.dev/uid").is_some());
        assert!(label_value_error("").is_none());
        assert!(label_value_error("a@b").is_some());
    }

    #[test]
    fn strategic_merge_patches_merge_lists_by_their_key() {
        let mut pod = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}
        ]}});
        strategic_merge_patch(
            &mut pod,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            "",
        );
        assert_eq!(
            pod["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}])
        );
    }

    #[test]
    fn json_patches_apply_every_operation() {
        let mut doc = json!({"a": {"b": [1, 2]}, "c": "x"});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/a/b/-", "value": 3},
                {"op": "replace", "path": "/c", "value": "y"},
                {"op": "copy", "from": "/c", "path": "/d"},
                {"op": "move", "from": "/d", "path": "/e"},
                {"op": "remove", "path": "/a/b/0"},
                {"op": "test", "path": "/e", "value": "y"},
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": {"b": [2, 3]}, "c": "y", "e": "y"}));
        let error = json_patch(&mut doc, &json!([{"op": "test", "path": "/e", "value": 1}]));
        assert_eq!(error.unwrap_err().code, 422);
    }
}
