//! Wire types of presented files, artifacts (I26).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/artifacts`: files under the workdir's `outputs/` to present.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PresentFiles {
    /// Virtual paths (or paths relative to the workdir), each under `<workdir>/outputs/`.
    pub paths: Vec<String>,
}

/// A presented file (I26): its bytes were copied when it was presented and stay readable
/// after the runtime is reclaimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactInfo {
    /// `art-…`.
    pub artifact_id: String,
    /// The virtual path it was presented from.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the bytes, lowercase hex.
    pub sha256: String,
    /// Media type, from the file name.
    pub media_type: String,
    /// RFC 3339.
    pub created_at: String,
    /// Where to download it (same Bearer token).
    pub download_url: String,
}

/// `GET /v1/sandboxes/{id}/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactList {
    /// Oldest first.
    pub artifacts: Vec<ArtifactInfo>,
}
