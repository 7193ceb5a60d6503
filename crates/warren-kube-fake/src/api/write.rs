//! Creating, replacing and deleting objects, with the real server's preconditions.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::error::{ApiError, FieldError};
use super::list_watch::list_item;
use super::lock;
use super::selector::{FieldSelector, LabelSelector};
use super::service::allocate_service;
use super::store::{EventType, Key, Kind, Shared};
use super::validation::validate;

pub(super) fn now() -> String {
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

pub(super) fn create(
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
pub(super) fn update(
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

pub(super) struct DeleteOptions {
    uid: Option<String>,
    resource_version: Option<String>,
    pub(super) dry_run: bool,
}

impl DeleteOptions {
    pub(super) fn parse(body: &[u8], query: &HashMap<String, String>) -> Result<Self, ApiError> {
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
pub(super) fn delete(
    shared: &Shared,
    key: &Key,
    options: &DeleteOptions,
) -> Result<Value, ApiError> {
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
pub(super) fn delete_collection(
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
