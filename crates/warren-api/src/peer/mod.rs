//! The node-to-node link of a cluster (issue 14): runtime operations a replica receives
//! for a runtime another node owns are forwarded to that node here, and the owner serves
//! them under `/internal/v1`. A transport like the others: it parses, authenticates and
//! calls the provisioner, which decides where each operation runs.
//!
//! Calls authenticate with the *cluster key*, a secret of the replicas distinct from the
//! provisioner token (a client holding the token cannot call these routes, and the key
//! never reaches a sandbox: it is only ever sent between replicas). Without a key the
//! routes do not exist (404) and a lone node forwards nothing.

mod client;
mod routes;
mod wire;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use client::PeerClient;
pub(crate) use routes::router;

/// The header a forwarded call carries its request id in: the owner logs the same id.
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

tokio::task_local! {
    /// The id of the request being served, for the calls it forwards.
    pub(crate) static CURRENT_REQUEST_ID: String;
}

/// The cluster key: at least 32 characters, compared by digest in constant time.
#[derive(Clone)]
pub struct ClusterKey {
    key: String,
    digest: [u8; 32],
}

impl ClusterKey {
    /// Shortest key accepted.
    pub const MIN_LEN: usize = 32;

    /// A checked key: 32 or more printable characters without whitespace.
    pub fn new(key: &str) -> Result<Self, String> {
        if key.chars().count() < Self::MIN_LEN {
            return Err(format!(
                "the cluster key has {} characters; it needs at least {} (generate one with `openssl rand -hex 32`)",
                key.chars().count(),
                Self::MIN_LEN
            ));
        }
        if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("the cluster key contains whitespace or control characters".to_owned());
        }
        Ok(Self {
            key: key.to_owned(),
            digest: Sha256::digest(key.as_bytes()).into(),
        })
    }

    fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&presented).into()
    }

    fn header_value(&self) -> String {
        format!("Bearer {}", self.key)
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

/// The request id of the request being served, if any.
pub(crate) fn current_request_id() -> Option<String> {
    CURRENT_REQUEST_ID.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_key_must_be_long_and_printable_and_never_shows_in_debug() {
        assert!(ClusterKey::new("short").unwrap_err().contains("32"));
        assert!(ClusterKey::new(&format!("{} x", "a".repeat(40)))
            .unwrap_err()
            .contains("whitespace"));
        let key = ClusterKey::new(&"k".repeat(40)).unwrap();
        assert!(key.matches(&"k".repeat(40)));
        assert!(!key.matches(&"k".repeat(39)));
        assert!(!format!("{key:?}").contains("kkkk"));
    }
}
