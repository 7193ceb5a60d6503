//! E2B API keys (`X-API-Key`): warren's own, `e2b_` and at least 32 hex digits, each
//! mapped to a uid. Keys come from `[e2b.keys]` in warren.toml or from
//! `warren e2b key create` (kept in the state store as a digest only); never the
//! provisioner token.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use warren_core::Uid;
use warren_provisioner::Provisioner;

use crate::E2bError;

/// The state store's key of a created API key: its digest.
fn record_key(digest: &[u8; 32]) -> String {
    format!("keys/{}", hex::encode(digest))
}

/// An API key, kept as its SHA-256 digest; its `Debug` form is redacted.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl ApiKey {
    /// Fewest hex digits after `e2b_`.
    pub const MIN_HEX: usize = 32;

    /// Validates a key's form.
    pub fn parse(key: &str) -> Result<Self, E2bError> {
        let Some(hex) = key.strip_prefix("e2b_") else {
            return Err(E2bError::InvalidKey);
        };
        if hex.len() < Self::MIN_HEX
            || hex.len() > 256
            || !hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(E2bError::InvalidKey);
        }
        Ok(Self {
            digest: Sha256::digest(key.as_bytes()).into(),
        })
    }

    /// A new random key: `e2b_` and 40 hex digits, as E2B's own keys.
    pub fn generate() -> String {
        let bytes: [u8; 20] = rand::random();
        format!("e2b_{}", hex::encode(bytes))
    }

    /// The key's digest, what the store keeps.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    fn matches(&self, digest: &[u8; 32]) -> bool {
        self.digest.ct_eq(digest).into()
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A created key's record in the state store.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyRecord {
    uid: Uid,
    created_at: chrono::DateTime<chrono::Utc>,
}

/// Every API key a server accepts: the configuration's and the store's.
pub struct KeyRing {
    provisioner: Arc<Provisioner>,
    configured: Vec<(ApiKey, Uid)>,
}

impl KeyRing {
    /// The keys of the configuration, and those created in the store.
    pub fn new(provisioner: Arc<Provisioner>, configured: Vec<(ApiKey, Uid)>) -> Self {
        Self {
            provisioner,
            configured,
        }
    }

    /// The uid a presented key maps to; `None` for a key of the wrong form or unknown.
    pub(crate) async fn uid_of(&self, presented: &str) -> Result<Option<Uid>, E2bError> {
        let Ok(key) = ApiKey::parse(presented) else {
            return Ok(None);
        };
        let digest = key.digest();
        // Every configured key is compared, so the time taken says nothing of which matched.
        let mut found = None;
        for (candidate, uid) in &self.configured {
            if candidate.matches(&digest) && found.is_none() {
                found = Some(uid.clone());
            }
        }
        if found.is_some() {
            return Ok(found);
        }
        let record = self
            .provisioner
            .get_record(crate::state::RECORD_NAMESPACE, &record_key(&digest))
            .await?;
        match record {
            Some(record) => {
                let record: KeyRecord =
                    serde_json::from_slice(&record.value).map_err(|_| E2bError::CorruptRecord)?;
                Ok(Some(record.uid))
            }
            None => Ok(None),
        }
    }
}

/// Creates an API key for `uid` in the state store and returns it: the only time it is
/// shown; the store keeps its digest (`warren e2b key create`).
pub async fn create_key(
    store: &dyn warren_store::StateStore,
    uid: &Uid,
) -> Result<String, E2bError> {
    let key = ApiKey::generate();
    let digest = ApiKey::parse(&key)?.digest();
    let record = KeyRecord {
        uid: uid.clone(),
        created_at: chrono::Utc::now(),
    };
    let bytes = serde_json::to_vec(&record).map_err(|_| E2bError::CorruptRecord)?;
    store
        .put_record(
            crate::state::RECORD_NAMESPACE,
            &record_key(&digest),
            &bytes,
            warren_store::RecordWrite::Create,
        )
        .await
        .map_err(|error| E2bError::Provisioner(error.into()))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_needs_the_prefix_and_32_hex_digits() {
        assert!(ApiKey::parse("e2b_0123456789abcdef0123456789abcdef").is_ok());
        assert!(ApiKey::parse("e2b_0123456789abcdef0123456789abcde").is_err());
        assert!(ApiKey::parse("0123456789abcdef0123456789abcdef0000").is_err());
        assert!(ApiKey::parse("e2b_0123456789abcdef0123456789abcdeg").is_err());
        let generated = ApiKey::generate();
        assert!(ApiKey::parse(&generated).is_ok(), "{generated}");
    }
}
