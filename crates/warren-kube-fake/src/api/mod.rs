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

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use http::Method;

use super::Kubelet;
use routing::handle;
use store::{Shared, Store};

mod error;
mod list_watch;
mod patch;
mod routing;
mod selector;
mod service;
mod store;
mod validation;
mod write;

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
