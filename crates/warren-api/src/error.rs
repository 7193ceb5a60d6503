//! The one mapping from failures to HTTP statuses and stable error codes.
//!
//! Every error answer is `{"error":{"code":"<stable_snake_case>","message":"<sentence>"}}`.
//! Codes are part of the API contract; messages are for people and may change. Internal
//! failures are logged in full and answered with a generic message, so no host path or
//! driver detail reaches a client (I1).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_backend::BackendError;
use warren_fs::FsError;
use warren_protocol::{ErrorBody, ErrorDetail};
use warren_provisioner::strip_relative_path;
use warren_provisioner::{ErrorKind, ProvisionerError};

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    /// Static for every answer made here; an owner's answer to a forwarded operation
    /// carries the owner's code as it came.
    code: std::borrow::Cow<'static, str>,
    message: String,
    /// What some codes carry beside the message, boxed: most errors have none.
    details: Option<Box<Details>>,
}

/// The details of an error answer beside its code and message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Details {
    /// `guard_held`: the holder and the expiry of the live guard.
    holder: Option<(String, String)>,
    /// `merge_conflict`: each path the merge cannot combine.
    conflicts: Option<Vec<warren_protocol::MergeConflictInfo>>,
}

impl ApiError {
    /// An error with an explicit status, code and message.
    ///
    /// `code` must be in the table of codes with `status` (`warren_protocol::codes`): write
    /// a literal one as `warren_protocol::code!(status, "…")`, checked at compile time; one
    /// known only at run time is checked here in debug builds (the tests).
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        debug_assert!(
            warren_protocol::codes::allows(code, status.as_u16()),
            "error code {code:?} with status {status} is not in warren_protocol::codes::CODES"
        );
        Self {
            status,
            code: std::borrow::Cow::Borrowed(code),
            message: message.into(),
            details: None,
        }
    }

    /// 400 with a code naming what was wrong in the request.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn unauthorized(message: &str) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            warren_protocol::code!(StatusCode::UNAUTHORIZED.as_u16(), "unauthorized"),
            message,
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The human message.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn internal(what: &str, error: &dyn std::error::Error) -> Self {
        tracing::error!(error = %warren_provisioner::error_chain(error), "{what}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            warren_protocol::code!(StatusCode::INTERNAL_SERVER_ERROR.as_u16(), "internal"),
            format!("{what}; the server log has the details"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let details = self.details.map(|details| *details).unwrap_or_default();
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: ErrorDetail {
                    holder: details.holder.as_ref().map(|(holder, _)| holder.clone()),
                    expires_at: details.holder.map(|(_, expires_at)| expires_at),
                    conflicts: details.conflicts,
                    ..ErrorDetail::new(self.code, self.message)
                },
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<ProvisionerError> for ApiError {
    /// The provisioner's classification ([`ProvisionerError::classify`]) gives the status
    /// and code; the message is the error's own, with warren's failures logged in full
    /// and answered without their details.
    fn from(error: ProvisionerError) -> Self {
        let class = error.classify();
        let status =
            StatusCode::from_u16(class.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if class.kind == ErrorKind::Internal {
            let (what, cause): (&str, &dyn std::error::Error) = internal_what(&error);
            return Self {
                code: class.code,
                ..Self::internal(what, cause)
            };
        }
        let holder = match &error {
            // The execution guard (I33): a holder learns who has it and until when, so it
            // can wait for the lapse instead of polling blindly.
            ProvisionerError::GuardHeld {
                holder, expires_at, ..
            } => Some((
                holder.clone(),
                expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            )),
            _ => None,
        };
        let conflicts = match &error {
            ProvisionerError::MergeConflict { conflicts } => {
                Some(conflicts.iter().map(crate::branches::conflict).collect())
            }
            _ => None,
        };
        Self {
            status,
            code: class.code,
            message: message(&error, class.kind),
            details: (holder.is_some() || conflicts.is_some())
                .then(|| Box::new(Details { holder, conflicts })),
        }
    }
}

/// What a client is told of a failure that is not warren's own: the error's sentence,
/// with virtual paths only (I1) and what to do where there is something.
fn message(error: &ProvisionerError, kind: ErrorKind) -> String {
    use warren_store::StoreError;
    use ProvisionerError as P;
    match error {
        P::Forwarded { message, .. } => message.clone(),
        P::Store(StoreError::NotOwner { .. }) => {
            "the sandbox's runtime moved to another node; run the command again".to_owned()
        }
        P::Store(error) if error.is_unavailable() => format!("{error}; try again shortly"),
        P::File { path, source } => file_message(path, source),
        P::Snapshot(warren_snapshot::SnapshotError::File(source)) => {
            file_message("the workdir", source)
        }
        P::Backend(error @ BackendError::Cluster { code: 403, .. }) => format!(
            "{error}; grant warren's service account the Role `warren k8s manifests` writes"
        ),
        P::Backend(error) if kind == ErrorKind::Unavailable => format!("{error}; try again"),
        P::Backend(error) => error.to_string(),
        other => other.to_string(),
    }
}

/// The log line of one of warren's own failures, and the error it logs in full.
fn internal_what(error: &ProvisionerError) -> (&'static str, &dyn std::error::Error) {
    use ProvisionerError as P;
    match error {
        P::Store(cause) => ("the state store failed", cause),
        P::Backend(cause) => (
            match cause {
                BackendError::Create { .. }
                | BackendError::HostDir { .. }
                | BackendError::MountRefused { .. } => "the runtime could not be started",
                BackendError::Exec { .. } => "the command could not be run",
                BackendError::Discover { .. } => "the backend's runtimes could not be listed",
                BackendError::Kill { .. } => "the runtime's processes could not be killed",
                BackendError::Destroy { .. } => "the runtime could not be destroyed",
                _ => "the runtime failed",
            },
            cause,
        ),
        P::File { source, .. } | P::Snapshot(warren_snapshot::SnapshotError::File(source)) => {
            ("a file operation failed", source)
        }
        P::Snapshot(cause) => ("the snapshot store failed", cause),
        P::Interrupted(cause) => ("a file operation was interrupted", cause),
        P::NoPeerLink => ("no cluster link is configured", error),
        P::Volume { .. } | P::WorkspacesWithoutVolumes { .. } => {
            ("the workspace volume failed", error)
        }
        other => ("the operation failed on the server", other),
    }
}

/// A file-layer failure's message: the *virtual* path (I1) and the file layer's reason
/// with its own (root-relative) path stripped, so one message never mixes two path spaces.
fn file_message(path: &str, error: &FsError) -> String {
    format!("{path}: {}", strip_relative_path(&error.to_string()))
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        warren_protocol::code!(StatusCode::NOT_FOUND.as_u16(), "route_not_found"),
        "no such endpoint; GET /v1/openapi.json lists them",
    )
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        warren_protocol::code!(
            StatusCode::METHOD_NOT_ALLOWED.as_u16(),
            "method_not_allowed"
        ),
        "this endpoint does not accept that method; GET /v1/openapi.json lists them",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_failure_answers_its_kinds_status_on_v1() {
        let kinds = warren_provisioner::ErrorKind::ALL;
        for (kind, error) in kinds
            .into_iter()
            .zip(warren_provisioner::one_of_every_kind())
        {
            let code = error.code();
            let answer = ApiError::from(error);
            assert_eq!(answer.status().as_u16(), kind.status(), "{kind:?}");
            assert_eq!(answer.code(), code, "{kind:?}");
        }
    }

    #[test]
    fn file_layer_paths_are_stripped_from_messages() {
        assert_eq!(
            strip_relative_path("`a/b`: not a directory"),
            "not a directory"
        );
        assert_eq!(
            strip_relative_path("invalid glob \"[\""),
            "invalid glob \"[\""
        );
    }
}
