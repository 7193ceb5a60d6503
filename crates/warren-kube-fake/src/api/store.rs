//! The objects the server holds: their kinds, the store with its resourceVersions and
//! watch history, and the state shared by every request.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use http::Method;
use k8s_openapi::api::core::v1::{Pod, PodStatus, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{json, Value};

use super::error::ApiError;
use super::{lock, Fault, HISTORY_LIMIT, NODE_PORTS};
use crate::{Kubelet, StatusReporter};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Kind {
    Pod,
    Service,
    NetworkPolicy,
}

impl Kind {
    pub(super) const ALL: [Kind; 3] = [Kind::Pod, Kind::Service, Kind::NetworkPolicy];

    pub(super) fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Service => "services",
            Kind::NetworkPolicy => "networkpolicies",
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::NetworkPolicy => "NetworkPolicy",
        }
    }

    pub(super) fn group(self) -> &'static str {
        match self {
            Kind::Pod | Kind::Service => "",
            Kind::NetworkPolicy => "networking.k8s.io",
        }
    }

    pub(super) fn api_version(self) -> &'static str {
        match self {
            Kind::Pod | Kind::Service => "v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
        }
    }

    pub(super) fn has_status(self) -> bool {
        matches!(self, Kind::Pod | Kind::Service)
    }

    /// `pods`, `networkpolicies.networking.k8s.io`: how the real server names a resource in
    /// its messages.
    pub(super) fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_owned(),
            group => format!("{}.{group}", self.plural()),
        }
    }

    pub(super) fn details(self, name: &str) -> Value {
        let mut details = json!({"name": name, "kind": self.plural()});
        if !self.group().is_empty() {
            details["group"] = json!(self.group());
        }
        details
    }

    /// Decodes `object` as this kind and encodes it back: type errors become `400`, unknown
    /// fields are dropped (as the real server does without `fieldValidation=Strict`).
    pub(super) fn round_trip(self, object: Value) -> Result<Value, ApiError> {
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

pub(super) type Key = (Kind, String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) kind: Kind,
    pub(super) namespace: String,
    pub(super) kind_of_change: EventType,
    pub(super) object: Arc<Value>,
    /// The object before a MODIFIED change (for selector transitions).
    pub(super) previous: Option<Arc<Value>>,
}

pub(super) struct Store {
    /// The latest resourceVersion handed out.
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<Key, Value>,
    pub(super) history: VecDeque<Event>,
    /// Every event up to this resourceVersion is gone; a watch from an older one gets 410.
    pub(super) compacted: u64,
    /// Bumped by `expire_watches`.
    pub(super) epoch: u64,
    pub(super) next_ip: u32,
    pub(super) next_port: u16,
}

impl Store {
    pub(super) fn new() -> Self {
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
    pub(super) fn commit(
        &mut self,
        key: &Key,
        object: Option<Value>,
        kind_of_change: EventType,
    ) -> Value {
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

pub(super) struct Shared {
    pub(super) store: Mutex<Store>,
    /// Bumped after every change, waking the watches.
    pub(super) changed: tokio::sync::watch::Sender<u64>,
    pub(super) kubelet: Option<Arc<dyn Kubelet>>,
    pub(super) faults: Mutex<Vec<Fault>>,
    pub(super) requests: Mutex<Vec<(Method, String)>>,
    /// For the kubelet's reporters, which must not keep the server alive.
    pub(super) weak: Weak<Shared>,
}

impl Shared {
    pub(super) fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    pub(super) fn take_fault(&self, method: &Method, path: &str) -> Option<Fault> {
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

    pub(super) fn reporter(&self, namespace: &str, name: &str, uid: &str) -> StatusReporter {
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
