//! Signed, expiring grants: the token in a Viewer link and the Viewer's session cookie.
//!
//! A grant names one uid and one workdir and an expiry; it is `base64url(json)` followed by
//! `.` and `base64url(HMAC-SHA256(key, kind || json))`. The key is warren's own (never the
//! provisioner token, which must not appear in a URL, a page or a cookie), kept 0600 in the
//! data directory so links survive a restart. The kind is part of the signed bytes, so a
//! link token is not a session and a session is not a link.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// What a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantKind {
    /// The token in a link: exchanged once for a session.
    Link,
    /// The session cookie.
    Session,
}

impl GrantKind {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Link => b"warren-viewer-link-v1\0",
            Self::Session => b"warren-viewer-session-v1\0",
        }
    }
}

/// The signed content of a grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Grant {
    /// The workspace owner.
    pub uid: String,
    /// The one workdir the grant opens.
    pub workdir: String,
    /// Unix seconds after which the grant is refused.
    pub exp: i64,
    /// Makes two grants for the same scope and second differ.
    pub nonce: String,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantError {
    /// Malformed or not signed by this key (tampered, or for another kind).
    Invalid,
    /// Signed, but past its expiry.
    Expired,
}

/// The Viewer's signing key.
pub struct ViewerKey {
    key: [u8; 32],
}

impl std::fmt::Debug for ViewerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ViewerKey(<redacted>)")
    }
}

impl ViewerKey {
    /// A fresh random key: links signed with it die with the process.
    pub fn ephemeral() -> Self {
        Self {
            key: rand::random(),
        }
    }

    /// The key in `<data_dir>/viewer.key`, created (0600, 32 random bytes) when missing.
    pub fn load_or_create(data_dir: &Path) -> std::io::Result<Self> {
        let path = data_dir.join("viewer.key");
        match std::fs::File::open(&path) {
            Ok(mut file) => {
                let mut key = [0u8; 32];
                file.read_exact(&mut key)?;
                Ok(Self { key })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let key: [u8; 32] = rand::random();
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                file.write_all(&key)?;
                file.sync_all()?;
                Ok(Self { key })
            }
            Err(error) => Err(error),
        }
    }

    fn mac(&self, kind: GrantKind, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(kind.label());
        mac.update(payload);
        mac
    }

    /// The token of `grant`.
    pub(crate) fn sign(&self, kind: GrantKind, grant: &Grant) -> String {
        let payload =
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(grant).expect("a grant serialises"));
        let tag = self.mac(kind, payload.as_bytes()).finalize().into_bytes();
        format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// The grant in `token`, if this key signed it for `kind` and it has not expired at
    /// `now` (Unix seconds). The tag is checked in constant time before anything is parsed.
    pub(crate) fn verify(
        &self,
        kind: GrantKind,
        token: &str,
        now: i64,
    ) -> Result<Grant, GrantError> {
        let (payload, tag) = token.split_once('.').ok_or(GrantError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| GrantError::Invalid)?;
        self.mac(kind, payload.as_bytes())
            .verify_slice(&tag)
            .map_err(|_| GrantError::Invalid)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| GrantError::Invalid)?;
        let grant: Grant = serde_json::from_slice(&json).map_err(|_| GrantError::Invalid)?;
        if grant.exp <= now {
            return Err(GrantError::Expired);
        }
        Ok(grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(exp: i64) -> Grant {
        Grant {
            uid: "alice".into(),
            workdir: "projects/a".into(),
            exp,
            nonce: "n".into(),
        }
    }

    #[test]
    fn a_signed_grant_verifies_until_it_expires() {
        let key = ViewerKey::ephemeral();
        let token = key.sign(GrantKind::Link, &grant(100));
        assert_eq!(key.verify(GrantKind::Link, &token, 99), Ok(grant(100)));
        assert_eq!(
            key.verify(GrantKind::Link, &token, 100),
            Err(GrantError::Expired)
        );
    }

    #[test]
    fn a_tampered_token_another_kind_or_another_key_is_invalid() {
        let key = ViewerKey::ephemeral();
        let token = key.sign(GrantKind::Link, &grant(100));
        assert_eq!(
            key.verify(GrantKind::Session, &token, 0),
            Err(GrantError::Invalid)
        );
        assert_eq!(
            ViewerKey::ephemeral().verify(GrantKind::Link, &token, 0),
            Err(GrantError::Invalid)
        );
        // Another workdir under the same signature.
        let (_, tag) = token.split_once('.').unwrap();
        let mut other = grant(100);
        other.workdir = "projects/b".into();
        let forged = format!(
            "{}.{tag}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&other).unwrap())
        );
        assert_eq!(
            key.verify(GrantKind::Link, &forged, 0),
            Err(GrantError::Invalid)
        );
        for junk in ["", ".", "abc", "a.b", &format!("{token}x")] {
            assert_eq!(
                key.verify(GrantKind::Link, junk, 0),
                Err(GrantError::Invalid),
                "{junk}"
            );
        }
    }

    #[test]
    fn the_key_file_is_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = ViewerKey::load_or_create(dir.path()).unwrap();
        let second = ViewerKey::load_or_create(dir.path()).unwrap();
        assert_eq!(first.key, second.key);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("viewer.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(format!("{first:?}"), "ViewerKey(<redacted>)");
    }
}
