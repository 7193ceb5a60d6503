//! Wire types of a sandbox's leases (I25) and its execution guard (I33).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::strict;

/// `POST /v1/sandboxes/{id}/leases`: a run's hold on the sandbox's runtime (I25).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLease {
    /// Who holds it: the run id of a root run or one of its child runs.
    pub holder: String,
    /// Seconds until it lapses unless renewed (1 to 3600).
    #[serde(deserialize_with = "strict::required_whole_number")]
    pub ttl_s: u64,
}

/// `POST /v1/sandboxes/{id}/leases/{lease_id}/renew`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewLease {
    /// New lifetime in seconds from now (1 to 3600); default 60.
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub ttl_s: Option<u64>,
}

/// A lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseInfo {
    /// The lease's id.
    pub lease_id: String,
    /// Who holds it.
    pub holder: String,
    /// The sandbox generation it holds.
    pub generation: i64,
    /// When it lapses unless renewed (RFC 3339).
    pub expires_at: String,
}

/// `POST /v1/sandboxes/{id}/guard`: the sandbox's execution guard for one executor (I33).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGuard {
    /// Who holds it: a run, worker or replica id, 1 to 256 bytes of printable text. Other
    /// holders see it in their `guard_held` answers.
    pub holder: String,
    /// Seconds until it lapses unless renewed (1 to 3600). Renew at a third of it.
    #[serde(deserialize_with = "strict::required_whole_number")]
    pub ttl_s: u64,
}

/// `POST /v1/sandboxes/{id}/guard/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewGuard {
    /// The token the acquisition returned.
    #[serde(deserialize_with = "strict::required_whole_number")]
    pub token: u64,
    /// New lifetime in seconds from now (1 to 3600); without it, the lifetime the guard
    /// was last granted or renewed for.
    #[serde(
        default,
        deserialize_with = "strict::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_s: Option<u64>,
}

/// A sandbox's execution guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GuardInfo {
    /// The fencing token: larger than every token issued before for this sandbox. Send it
    /// as `X-Warren-Fence` with every change to the sandbox.
    pub token: i64,
    /// Who holds it.
    pub holder: String,
    /// When it was acquired (RFC 3339).
    pub acquired_at: String,
    /// When it lapses unless renewed (RFC 3339, the server's clock).
    pub expires_at: String,
}
