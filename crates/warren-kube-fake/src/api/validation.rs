//! Validating names, labels, pod specs and service specs as the real server does.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::error::{ApiError, FieldError};
use super::store::Kind;

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

pub(super) fn label_key_error(key: &str) -> Option<String> {
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

pub(super) fn label_value_error(value: &str) -> Option<String> {
    if value.len() > 63 {
        return Some("must be no more than 63 characters".to_owned());
    }
    (!value.is_empty() && !is_qualified_name_part(value)).then(|| LABEL_VALUE_MSG.to_owned())
}

pub(super) fn validate(kind: Kind, object: &Value) -> Result<(), ApiError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
