//! Failures answered as real `Status` objects.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{json, Value};

use super::store::Kind;

/// A failure answered as a `Status` object.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) code: u16,
    pub(super) reason: &'static str,
    pub(super) message: String,
    pub(super) details: Option<Value>,
    pub(super) retry_after: Option<u32>,
}

/// One cause of a `422 Invalid`.
pub(super) struct FieldError {
    pub(super) field: String,
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl FieldError {
    pub(super) fn invalid(field: impl Into<String>, value: &str, detail: impl AsRef<str>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value:?}: {}", detail.as_ref()),
        }
    }

    pub(super) fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueRequired",
            message: "Required value".to_owned(),
        }
    }

    pub(super) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {}", detail.into()),
        }
    }

    pub(super) fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueDuplicate",
            message: format!("Duplicate value: {value:?}"),
        }
    }
}

impl ApiError {
    pub(super) fn new(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason_for(code),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub(super) fn not_found(kind: Kind, name: &str) -> Self {
        Self {
            details: Some(kind.details(name)),
            ..Self::new(404, format!("{} {name:?} not found", kind.qualified()))
        }
    }

    pub(super) fn no_such_resource() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(404, "the server could not find the requested resource")
        }
    }

    pub(super) fn already_exists(kind: Kind, name: &str) -> Self {
        Self {
            reason: "AlreadyExists",
            details: Some(kind.details(name)),
            ..Self::new(409, format!("{} {name:?} already exists", kind.qualified()))
        }
    }

    pub(super) fn conflict(kind: Kind, name: &str, why: &str) -> Self {
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

    pub(super) fn modified(kind: Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(super) fn invalid(kind: Kind, name: &str, causes: Vec<FieldError>) -> Self {
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

    pub(super) fn expired(message: impl Into<String>) -> Self {
        Self {
            reason: "Expired",
            ..Self::new(410, message)
        }
    }

    pub(super) fn status(&self) -> Value {
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

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).expect("JSON serializes"),
    )
        .into_response()
}
