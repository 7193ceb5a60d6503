//! Every error answer's body: a stable code and a sentence for people.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: `{"error":{"code":"…","message":"…"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A stable machine-readable code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code, e.g. `workdir_conflict`.
    pub code: String,
    /// What went wrong and, where possible, what to do.
    pub message: String,
    /// With `guard_held`: who holds the sandbox's execution guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// With `guard_held`: when the holder's guard lapses unless renewed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// With `merge_conflict`: each path the merge cannot combine, with the baseline, ours
    /// and theirs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflicts: Option<Vec<crate::MergeConflictInfo>>,
}

impl ErrorDetail {
    /// A code and a message, no details.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            holder: None,
            expires_at: None,
            conflicts: None,
        }
    }
}
