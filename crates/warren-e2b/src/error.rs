//! The crate's error type, and how a failure becomes E2B's error body
//! (`{"code": <int>, "message": <str>}`, the SDKs read both fields) or a Connect error.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use warren_provisioner::{ErrorKind, ProvisionerError};

use crate::envd::connect::{Code, ConnectError};

/// What went wrong in the E2B API or its configuration.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// An API key is not `e2b_` followed by 32 to 256 hex digits.
    #[error("an E2B API key is `e2b_` followed by at least 32 hex digits (create one with `warren e2b key create --uid <uid>`)")]
    InvalidKey,
    /// A template name holds characters E2B's template ids never do.
    #[error("[e2b.templates] name {name:?} must be 1 to 128 letters, digits or `-_.:/`")]
    InvalidTemplateName {
        /// The name.
        name: String,
    },
    /// The domain is not a host name.
    #[error("[e2b] domain {domain:?} is not a DNS name")]
    InvalidDomain {
        /// The domain.
        domain: String,
    },
    /// The internet policy is not usable.
    #[error("[e2b] internet: {0}")]
    InvalidNetwork(warren_core::CoreError),
    /// The timeouts are zero or the default exceeds the maximum.
    #[error("[e2b] default_timeout_s must be positive and at most max_timeout_s")]
    InvalidTimeouts,
    /// A record in the state store could not be read.
    #[error("an E2B record in the state store is corrupt")]
    CorruptRecord,
    /// The record changed under an update: another request or replica changed it.
    #[error("the sandbox changed while this request worked on it; retry")]
    Conflict,
    /// The provisioner refused or failed.
    #[error(transparent)]
    Provisioner(#[from] ProvisionerError),
}

impl E2bError {
    /// The failure as envd answers it: a provisioner failure by its kind, every kind
    /// named; E2B's own by its status.
    pub(crate) fn into_connect(self) -> ConnectError {
        let code = match &self {
            E2bError::Provisioner(error) => connect_code(error.kind()),
            E2bError::InvalidKey => Code::Unauthenticated,
            E2bError::Conflict => Code::FailedPrecondition,
            E2bError::InvalidTemplateName { .. }
            | E2bError::InvalidDomain { .. }
            | E2bError::InvalidNetwork(_)
            | E2bError::InvalidTimeouts
            | E2bError::CorruptRecord => Code::Internal,
        };
        ConnectError::new(code, ApiFailure::from(self).message)
    }
}

/// The Connect code of a provisioner failure's kind.
fn connect_code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::Invalid | ErrorKind::Unprocessable => Code::InvalidArgument,
        ErrorKind::Forbidden => Code::PermissionDenied,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Conflict | ErrorKind::PreconditionFailed => Code::FailedPrecondition,
        ErrorKind::RangeNotSatisfiable => Code::OutOfRange,
        ErrorKind::TooLarge | ErrorKind::TooMany | ErrorKind::InsufficientStorage => {
            Code::ResourceExhausted
        }
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Unavailable | ErrorKind::BadGateway => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    }
}

/// A REST failure: E2B's error body with the HTTP status as its `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiFailure {
    /// The HTTP status (also the body's `code`).
    pub(crate) status: StatusCode,
    /// A message for humans: virtual paths and E2B ids only, nothing internal (I1).
    pub(crate) message: String,
}

impl ApiFailure {
    /// A failure with this status and message.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 404 for a sandbox that does not exist (or is another key's).
    pub(crate) fn sandbox_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {:?} not found", shorten(id)),
        )
    }

    /// 400 for a malformed request.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

/// At most 64 characters of something a client sent, for messages.
pub(crate) fn shorten(text: &str) -> String {
    text.chars().take(64).collect()
}

impl From<E2bError> for ApiFailure {
    fn from(error: E2bError) -> Self {
        match error {
            E2bError::Provisioner(error) => Self::from(error),
            E2bError::Conflict => Self::new(StatusCode::CONFLICT, error.to_string()),
            E2bError::InvalidKey => Self::new(StatusCode::UNAUTHORIZED, error.to_string()),
            other => {
                tracing::error!(error = %other, "E2B request failed");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
        }
    }
}

impl From<ProvisionerError> for ApiFailure {
    fn from(error: ProvisionerError) -> Self {
        let status = status_of(&error);
        if status.is_server_error() {
            tracing::error!(error = %error, "E2B request failed in the provisioner");
        }
        Self::new(status, error.public_message())
    }
}

/// The HTTP status of a provisioner failure (the rule the DeerFlow transport follows too).
pub(crate) fn status_of(error: &ProvisionerError) -> StatusCode {
    StatusCode::from_u16(error.transport_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// E2B's `Error` object: the HTTP status as `code`, and the message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ErrorBody {
    code: u16,
    message: String,
}

impl ApiFailure {
    /// The failure as E2B's `Error` object: an answer's body, or one entry's `error` in a
    /// fork's answer.
    pub(crate) fn into_body(self) -> ErrorBody {
        ErrorBody {
            code: self.status.as_u16(),
            message: self.message,
        }
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let status = self.status;
        (status, axum::Json(self.into_body())).into_response()
    }
}

#[cfg(test)]
mod walk_tests {
    use super::*;

    #[test]
    fn every_kind_of_failure_answers_in_the_same_status_class_as_on_v1_on_both_planes() {
        let kinds = ErrorKind::ALL;
        for (kind, error) in kinds
            .into_iter()
            .zip(warren_provisioner::one_of_every_kind())
        {
            let code = connect_code(kind);
            let rest = ApiFailure::from(E2bError::Provisioner(error));
            assert_eq!(rest.status.as_u16() / 100, kind.status() / 100, "{kind:?}");
            assert_eq!(rest.status.as_u16(), kind.transport_status(), "{kind:?}");
            // envd's Connect codes map back onto the same status class, but for a full
            // disk: Connect's one code for exhausted resources is a 429.
            if kind != ErrorKind::InsufficientStorage {
                let connect = code.http_status().as_u16();
                assert_eq!(connect / 100, kind.status() / 100, "{kind:?}");
            }
        }
    }
}
