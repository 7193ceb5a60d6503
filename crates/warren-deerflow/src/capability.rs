//! The capability in each sandbox's AIO URL (I12, I13).
//!
//! DeerFlow's `AioSandbox` sends no credentials to `sandbox_url`, so the URL itself is the
//! bearer credential: `{base}/deerflow/sandboxes/{sandbox_id}/{capability}`. The capability
//! is HMAC-SHA256 over the sandbox id and its generation, keyed by a key derived from the
//! provisioner token. It is derived, not stored: every replica holding the token computes
//! the same one, and nothing needs to be deleted to revoke it, because a terminated sandbox
//! is refused by state and its next life has a new generation, hence a new capability.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use warren_core::SandboxId;

type HmacSha256 = Hmac<Sha256>;

/// What the key derivation binds the provisioner token to, so the key is good for this
/// one purpose only.
const KEY_CONTEXT: &[u8] = b"warren deerflow aio sandbox capability key v1";

/// The key capabilities are computed with. Its `Debug` form is redacted.
#[derive(Clone)]
pub struct CapabilityKey([u8; 32]);

impl CapabilityKey {
    /// The key of a server guarded by a provisioner token, from secret material bound to
    /// that token (warren passes the token's SHA-256 digest).
    pub fn derive(token_secret: &[u8]) -> Self {
        let mut mac =
            HmacSha256::new_from_slice(token_secret).expect("HMAC takes keys of any length");
        mac.update(KEY_CONTEXT);
        Self(mac.finalize().into_bytes().into())
    }

    /// The capability of one generation of one sandbox: 256 bits, base64url without
    /// padding (43 characters), safe in a URL path segment.
    pub fn capability(&self, sandbox: &SandboxId, generation: i64) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(b"sandbox\0");
        mac.update(sandbox.as_str().as_bytes());
        mac.update(b"\0generation\0");
        mac.update(&generation.to_be_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// Whether `presented` is the capability of this generation, compared in constant time.
    pub fn verify(&self, sandbox: &SandboxId, generation: i64, presented: &str) -> bool {
        let expected = self.capability(sandbox, generation);
        expected.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(<redacted>)")
    }
}

/// `path` with the capability segment of an AIO URL replaced by `<capability>`, for logs:
/// the capability is a bearer credential and never reaches a log line.
pub fn redact_path(path: &str) -> std::borrow::Cow<'_, str> {
    const PREFIX: &str = "/deerflow/sandboxes/";
    let Some(rest) = path.strip_prefix(PREFIX) else {
        return std::borrow::Cow::Borrowed(path);
    };
    let Some((sandbox, after)) = rest.split_once('/') else {
        return std::borrow::Cow::Borrowed(path);
    };
    let tail = after.find('/').map_or("", |at| &after[at..]);
    std::borrow::Cow::Owned(format!("{PREFIX}{sandbox}/<capability>{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> SandboxId {
        SandboxId::derive(
            &warren_core::Uid::new("alice").unwrap(),
            &warren_core::RuntimeScope::new("thread-1").unwrap(),
        )
    }

    #[test]
    fn a_capability_has_at_least_128_bits_and_is_url_safe() {
        let key = CapabilityKey::derive("t".repeat(32).as_bytes());
        let capability = key.capability(&sandbox(), 1);
        assert!(capability.len() >= 32, "{capability}");
        assert!(capability
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert!(key.verify(&sandbox(), 1, &capability));
    }

    #[test]
    fn another_generation_or_token_or_guess_does_not_verify() {
        let key = CapabilityKey::derive("t".repeat(32).as_bytes());
        let capability = key.capability(&sandbox(), 1);
        assert!(!key.verify(&sandbox(), 2, &capability));
        assert!(!CapabilityKey::derive("u".repeat(32).as_bytes()).verify(
            &sandbox(),
            1,
            &capability
        ));
        assert!(!key.verify(&sandbox(), 1, &capability[..capability.len() - 1]));
        assert!(!key.verify(&sandbox(), 1, ""));
    }

    #[test]
    fn the_capability_segment_is_redacted_from_logged_paths() {
        assert_eq!(
            redact_path("/deerflow/sandboxes/sb-1/SECRETCAP/v1/file/read"),
            "/deerflow/sandboxes/sb-1/<capability>/v1/file/read"
        );
        assert_eq!(
            redact_path("/deerflow/sandboxes/sb-1/SECRETCAP"),
            "/deerflow/sandboxes/sb-1/<capability>"
        );
        assert_eq!(
            redact_path("/v1/sandboxes/x/files"),
            "/v1/sandboxes/x/files"
        );
        assert_eq!(
            redact_path("/deerflow/api/sandboxes"),
            "/deerflow/api/sandboxes"
        );
    }
}
