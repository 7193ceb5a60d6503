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
    /// The egress rules create was given (`network`), as given, for the detail to show;
    /// absent when it was given none (and in records written before warren kept them).
    /// What the runtime may reach is its warren sandbox's network policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) network: Option<E2bNetwork>,
    /// Figures reported to the SDK (`cpuCount`, `memoryMB`).
    pub(crate) cpu_count: u32,
    /// See `cpu_count`.
    pub(crate) memory_mb: u64,
}

/// What create's `network` set of what warren takes, kept to be shown back as it was sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct E2bNetwork {
    /// `allowOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) allow_out: Option<Vec<String>>,
    /// `denyOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deny_out: Option<Vec<String>>,
    /// `allowPublicTraffic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) allow_public_traffic: Option<bool>,
    /// `dnsServers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dns_servers: Option<Vec<String>>,
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
    fn a_record_written_before_network_rules_were_kept_still_reads() {
        let old = serde_json::json!({
            "sandbox_id": "abcdefghij0123456789",
            "warren_id": warren_core::SandboxId::derive(
                &Uid::new("alice").unwrap(),
                &warren_core::RuntimeScope::new("e2b-abcdefghij0123456789").unwrap(),
            ),
            "uid": "alice",
            "template_id": "base",
            "alias": null,
            "env_vars": {},
            "secure": true,
            "allow_internet_access": false,
            "cpu_count": 2,
            "memory_mb": 512,
        });
        let sandbox: E2bSandbox = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(sandbox.network, None);
        assert!(!sandbox.allow_internet_access);
        // Written back without rules, it is the same record.
        assert_eq!(serde_json::to_value(&sandbox).unwrap(), old);
        let with = E2bSandbox {
            network: Some(E2bNetwork {
                deny_out: Some(vec!["0.0.0.0/0".into()]),
                ..E2bNetwork::default()
            }),
            ..sandbox
        };
        let json = serde_json::to_value(&with).unwrap();
        assert_eq!(
            json["network"],
            serde_json::json!({"deny_out": ["0.0.0.0/0"]})
        );
        assert_eq!(serde_json::from_value::<E2bSandbox>(json).unwrap(), with);
    }

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
