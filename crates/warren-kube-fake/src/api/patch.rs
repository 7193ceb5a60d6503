//! Patching objects: merge, strategic-merge and JSON patches.

use serde_json::{json, Value};

use super::error::ApiError;
use super::lock;
use super::routing::parse_body;
use super::store::{Key, Shared};
use super::write::update;

pub(super) fn patch(
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

#[cfg(test)]
mod tests {
    use super::*;

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
