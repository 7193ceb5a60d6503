//! Connect's error codes, their HTTP statuses, and the error a call ends with.

use axum::http::StatusCode;

/// Connect's error codes: the protocol's whole set, of which warren's envd produces most
/// (not `out_of_range` or `data_loss`, kept so the table stays the protocol's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum Code {
    /// `canceled`
    Canceled,
    /// `unknown`
    Unknown,
    /// `invalid_argument`
    InvalidArgument,
    /// `deadline_exceeded`
    DeadlineExceeded,
    /// `not_found`
    NotFound,
    /// `already_exists`
    AlreadyExists,
    /// `permission_denied`
    PermissionDenied,
    /// `resource_exhausted`
    ResourceExhausted,
    /// `failed_precondition`
    FailedPrecondition,
    /// `aborted`
    Aborted,
    /// `out_of_range`
    OutOfRange,
    /// `unimplemented`
    Unimplemented,
    /// `internal`
    Internal,
    /// `unavailable`
    Unavailable,
    /// `data_loss`
    DataLoss,
    /// `unauthenticated`
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Canceled => "canceled",
            Self::Unknown => "unknown",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::FailedPrecondition => "failed_precondition",
            Self::Aborted => "aborted",
            Self::OutOfRange => "out_of_range",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::DataLoss => "data_loss",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code, as the Connect protocol's table has
    /// it (the revision that moved `canceled` to 499, `deadline_exceeded` to 504,
    /// `failed_precondition` to 400 and `unimplemented` to 501). Clients read the code from
    /// the body; the status matters to proxies and to plain HTTP tools.
    pub(crate) fn http_status(self) -> StatusCode {
        let status = match self {
            Self::Canceled => 499,
            Self::Unknown | Self::Internal | Self::DataLoss => 500,
            Self::InvalidArgument | Self::FailedPrecondition | Self::OutOfRange => 400,
            Self::DeadlineExceeded => 504,
            Self::NotFound => 404,
            Self::AlreadyExists | Self::Aborted => 409,
            Self::PermissionDenied => 403,
            Self::ResourceExhausted => 429,
            Self::Unimplemented => 501,
            Self::Unavailable => 503,
            Self::Unauthenticated => 401,
        };
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Connect error: a code and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub(crate) struct ConnectError {
    /// The code.
    pub(crate) code: Code,
    /// The message.
    pub(crate) message: String,
    /// The HTTP status of a unary answer, where it is not the code's (E2B's proxy answers
    /// 502 for a sandbox that is gone).
    pub(crate) status: Option<StatusCode>,
}

impl ConnectError {
    /// An error with this code and message.
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            status: None,
            message: message.into(),
        }
    }

    /// A sandbox that is gone, paused or was never there, as E2B's proxy answers it: 502,
    /// `unavailable`, "… was not found", which the SDKs turn into their
    /// `SandboxNotRunning` error.
    pub(crate) fn sandbox_gone(sandbox_id: &str) -> Self {
        Self {
            code: Code::Unavailable,
            status: Some(StatusCode::BAD_GATEWAY),
            message: sandbox_gone_message(sandbox_id),
        }
    }

    /// The error as Connect's JSON: `{"code": "...", "message": "..."}`, the message left
    /// out when empty.
    pub(super) fn to_json(&self) -> serde_json::Value {
        let mut error = serde_json::Map::new();
        error.insert("code".into(), self.code.as_str().into());
        if !self.message.is_empty() {
            error.insert("message".into(), self.message.clone().into());
        }
        serde_json::Value::Object(error)
    }
}

/// E2B's words for a sandbox that is gone: the SDKs match on "was not found".
pub(crate) fn sandbox_gone_message(sandbox_id: &str) -> String {
    format!(
        "The sandbox {} was not found: it was killed, paused or reached its timeout",
        crate::error::shorten(sandbox_id)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_statuses_of_connects_table() {
        for (code, status) in [
            (Code::Canceled, 499),
            (Code::InvalidArgument, 400),
            (Code::DeadlineExceeded, 504),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::PermissionDenied, 403),
            (Code::ResourceExhausted, 429),
            (Code::FailedPrecondition, 400),
            (Code::Unimplemented, 501),
            (Code::Internal, 500),
            (Code::Unavailable, 503),
            (Code::Unauthenticated, 401),
        ] {
            assert_eq!(code.http_status().as_u16(), status, "{code}");
        }
    }
}
