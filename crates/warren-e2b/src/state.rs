//! What warren keeps of an E2B sandbox beyond the warren sandbox behind it: the E2B id,
//! template, environment and the figures it reports, as one record in the state store
//! (namespace [`RECORD_NAMESPACE`]), written once at create (or fork, a copy of the
//! source's), so every replica reads it alike. Its life (running, paused, its deadline, its metadata) is the warren sandbox's
//! own: E2B's names for it are a view ([`E2bState::of`]). The per-sandbox secrets (envd
//! access token, signed file URLs) are derived, never stored.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use warren_core::{SandboxId, Uid};
use warren_store::SandboxState;

/// The namespace of E2B's records in the state store.
pub(crate) const RECORD_NAMESPACE: &str = "e2b";

/// The key of a sandbox's record.
pub(crate) fn record_key(sandbox_id: &str) -> String {
    format!("sandboxes/{sandbox_id}")
}

/// What E2B calls the state of a sandbox that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum E2bState {
    /// Its runtime runs (or starts on the next command).
    Running,
    /// Paused: its runtime was snapshotted and ended; connect resumes it.
    Paused,
}

impl E2bState {
    /// E2B's name for a warren sandbox in `state`; `None` once it is being ended or gone.
    pub(crate) fn of(state: SandboxState) -> Option<Self> {
        match state {
            SandboxState::Created | SandboxState::Running | SandboxState::Stopped => {
                Some(Self::Running)
            }
            SandboxState::Pausing | SandboxState::Paused => Some(Self::Paused),
            SandboxState::Terminating | SandboxState::Terminated => None,
        }
    }

    /// The name E2B's API uses.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
        }
    }
}

/// What E2B adds to the warren sandbox behind one of its sandboxes. Never changed after
/// create: no two writers ever race on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct E2bSandbox {
    /// E2B's id (`sandboxID`): 20 lowercase letters and digits.
    pub(crate) sandbox_id: String,
    /// The warren sandbox behind it.
    pub(crate) warren_id: SandboxId,
    /// Whose boundary it lives in: the uid the API key maps to.
    pub(crate) uid: Uid,
    /// The template it was created from.
    pub(crate) template_id: String,
    /// The alias the template was asked for by, when it was.
    pub(crate) alias: Option<String>,
    /// Environment every command of the sandbox gets.
    pub(crate) env_vars: BTreeMap<String, String>,
    /// Whether envd requires the access token (`secure` at create).
    pub(crate) secure: bool,
    /// Whether its runtime may reach the internet (through warren's filtering proxy).
    pub(crate) allow_internet_access: bool,
    /// Figures reported to the SDK (`cpuCount`, `memoryMB`).
    pub(crate) cpu_count: u32,
    /// See `cpu_count`.
    pub(crate) memory_mb: u64,
}

/// The secrets of E2B sandboxes, derived from the provisioner token's digest.
pub(crate) struct SandboxSecrets {
    key: [u8; 32],
}

type HmacSha256 = Hmac<Sha256>;

impl SandboxSecrets {
    /// The secrets of a server whose provisioner token has this digest.
    pub(crate) fn derive(secret_digest: &[u8]) -> Self {
        let mut mac =
            HmacSha256::new_from_slice(secret_digest).expect("HMAC takes keys of any length");
        mac.update(b"warren-e2b-sandbox-secrets-v1");
        Self {
            key: mac.finalize().into_bytes().into(),
        }
    }

    /// The envd access token of a sandbox (`envdAccessToken`): 64 hex digits.
    pub(crate) fn access_token(&self, sandbox_id: &str) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(b"envd-access-token:");
        mac.update(sandbox_id.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `presented` is the sandbox's access token, compared in constant time.
    pub(crate) fn token_matches(&self, sandbox_id: &str, presented: &str) -> bool {
        let expected: [u8; 32] = Sha256::digest(self.access_token(sandbox_id)).into();
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        expected.ct_eq(&presented).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_tokens_differ_per_sandbox_and_per_server_secret() {
        let one = SandboxSecrets::derive(b"digest-one");
        let two = SandboxSecrets::derive(b"digest-two");
        assert_ne!(one.access_token("a"), one.access_token("b"));
        assert_ne!(one.access_token("a"), two.access_token("a"));
        assert_eq!(one.access_token("a").len(), 64);
        assert!(one.token_matches("a", &one.access_token("a")));
        assert!(!one.token_matches("a", &one.access_token("b")));
        assert!(!one.token_matches("a", ""));
    }
}
