//! Routing requests to discovery documents and resource handlers, and serving them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, Uri};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::error::{json_response, ApiError};
use super::list_watch::{list, watch};
use super::lock;
use super::patch::patch;
use super::store::{Kind, Shared};
use super::write::{create, delete, delete_collection, update, DeleteOptions};

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

pub(super) async fn handle(
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

pub(super) async fn serve(
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

pub(super) fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
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
