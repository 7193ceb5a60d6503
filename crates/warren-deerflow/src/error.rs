//! The crate's error type, and how a provisioner failure becomes an HTTP status and a
//! message for DeerFlow.

use axum::http::StatusCode;
use warren_provisioner::ProvisionerError;

/// Why the DeerFlow configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeerflowError {
    /// The API key is shorter than [`crate::ApiKey::MIN_LEN`].
    #[error("the DeerFlow API key has {len} characters; it needs at least 32 (generate one with `openssl rand -hex 32`)")]
    KeyTooShort {
        /// Its length.
        len: usize,
    },
    /// The API key contains whitespace or control characters, which no header carries.
    #[error("the DeerFlow API key contains whitespace or control characters")]
    KeyBadCharacters,
    /// The API key is the provisioner token: DeerFlow's config would then hold warren's
    /// master credential (I13).
    #[error(
        "the DeerFlow API key must not be the provisioner token; give DeerFlow a key of its own"
    )]
    KeyIsProvisionerToken,
    /// `sandbox_base_url` is not an absolute `http(s)://` URL without query or fragment.
    #[error("[deerflow] sandbox_base_url {url:?} must be an http:// or https:// URL without a query or fragment")]
    InvalidBaseUrl {
        /// The URL given (shortened).
        url: String,
    },
    /// `network` is not a usable network policy.
    #[error("[deerflow] network: {0}")]
    InvalidNetwork(warren_core::CoreError),
    /// An entry of `extra_mount_paths` or `extra_mount_roots` is not an absolute,
    /// normalised path.
    #[error("[deerflow] {setting} entry {path:?} must be an absolute path without `.` or `..` components")]
    InvalidMountSetting {
        /// Which setting.
        setting: &'static str,
        /// The entry.
        path: String,
    },
    /// An entry of `extra_mount_paths` is not a place an extra mount may appear.
    #[error("[deerflow] extra_mount_paths: {0}")]
    InvalidMountPath(warren_core::CoreError),
}

/// The HTTP status of a provisioner failure: the caller's mistakes are 4xx, warren's own
/// failures 5xx. 422 is never used: the AIO SDK misreads it (contract §0.3).
pub(crate) fn status_of(error: &ProvisionerError) -> StatusCode {
    StatusCode::from_u16(error.transport_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The message a DeerFlow client may see: virtual paths only (I1); warren's own failures
/// are logged in full and answered generically.
pub(crate) fn public_message(error: &ProvisionerError) -> String {
    if status_of(error).is_server_error() {
        tracing::error!(error = %warren_provisioner::error_chain(error), "a DeerFlow request failed on the server");
    }
    error.public_message()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_failure_answers_in_the_same_status_class_as_on_v1() {
        let kinds = warren_provisioner::ErrorKind::ALL;
        for (kind, error) in kinds
            .into_iter()
            .zip(warren_provisioner::one_of_every_kind())
        {
            let status = status_of(&error).as_u16();
            assert_eq!(status, kind.transport_status(), "{kind:?}");
            assert_eq!(status / 100, kind.status() / 100, "{kind:?}");
        }
    }
}
