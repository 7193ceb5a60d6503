//! Signed `/files` URLs (`download_url` / `upload_url` of the SDKs, `e2b/sandbox/signature.py`):
//! `signature=v1_<base64 of sha256("path:operation:user:token[:expiration]")>`, unpadded
//! standard base64, with `signature_expiration` in unix seconds when the URL expires.
//!
//! The signature binds the sandbox's envd access token, so it names the sandbox as surely
//! as the token does; a URL with no sandbox in it (an SDK configured with `E2B_SANDBOX_URL`
//! sends neither header nor host name) is matched against the live sandboxes' tokens.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a signed URL grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl Operation {
    /// The word the signature covers.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// The signature parameters of one request, as its query carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signed<'a> {
    /// The `path` query, exactly as sent (the SDK signs the path as its caller wrote it).
    pub(crate) path: &'a str,
    /// GET reads, POST writes.
    pub(crate) operation: Operation,
    /// The `username` query, empty when absent (the SDK signs `""` for the default user).
    pub(crate) user: &'a str,
    /// The `signature` query.
    pub(crate) signature: &'a str,
    /// The `signature_expiration` query: unix seconds.
    pub(crate) expiration: Option<i64>,
}

/// Why a signed URL is refused (all answered 401, in envd's words, which its SDKs' own
/// tests and users match on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SignatureError {
    /// The signature is not `v1_` followed by base64.
    #[error("invalid signature")]
    Malformed,
    /// `signature_expiration` passed (of a signature that matches).
    #[error("signature is already expired")]
    Expired,
    /// The signature is not this sandbox's for this path, operation and user.
    #[error("invalid signature")]
    Mismatch,
}

/// The signature the SDK computes (`get_signature`).
pub(crate) fn sign(
    path: &str,
    operation: Operation,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let raw = match expiration {
        None => format!("{path}:{}:{user}:{token}", operation.as_str()),
        Some(at) => format!("{path}:{}:{user}:{token}:{at}", operation.as_str()),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// The signature as the SDK computed it: a `+` that reached the query unescaped was
/// decoded as a space (form encoding), and padding, which the SDK strips, is tolerated.
fn normalized(signature: &str) -> String {
    signature.trim_end_matches('=').replace(' ', "+")
}

impl Signed<'_> {
    /// Refuses a malformed or expired signature before any token is tried.
    pub(crate) fn precheck(&self, now_unix: i64) -> Result<(), SignatureError> {
        let presented = normalized(self.signature);
        let Some(encoded) = presented.strip_prefix("v1_") else {
            return Err(SignatureError::Malformed);
        };
        // A SHA-256 digest is 43 unpadded base64 characters.
        let decoded = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(encoded)
            .map_err(|_| SignatureError::Malformed)?;
        if decoded.len() != 32 {
            return Err(SignatureError::Malformed);
        }
        match self.expiration {
            Some(at) if at < now_unix => Err(SignatureError::Expired),
            _ => Ok(()),
        }
    }

    /// Whether the signature is the one `token` gives, compared in constant time (over
    /// SHA-256 digests of both, so lengths leak nothing either).
    pub(crate) fn matches(&self, token: &str) -> bool {
        let expected = sign(self.path, self.operation, self.user, token, self.expiration);
        let expected: [u8; 32] = Sha256::digest(expected).into();
        let presented: [u8; 32] = Sha256::digest(normalized(self.signature)).into();
        expected.ct_eq(&presented).into()
    }

    /// Checks the signature against one sandbox's token, as envd does: whether it
    /// matches first, then whether it expired, so a forged signature never learns more
    /// than that it is invalid.
    pub(crate) fn verify(&self, token: &str, now_unix: i64) -> Result<(), SignatureError> {
        if !self.matches(token) {
            return Err(SignatureError::Mismatch);
        }
        match self.expiration {
            Some(at) if at < now_unix => Err(SignatureError::Expired),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed with the SDK's own `get_signature` (e2b 2.63.0):
    /// `get_signature("/home/user/a.txt", "read", None, "tok", None)` and the same with
    /// `"write"`, `"user"` and expiration 1700000000 (`time.time` pinned).
    const READ_NO_USER: &str = "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY";
    const WRITE_USER_EXPIRING: &str = "v1_x09R0+VxB2mRzkxWcRyFCpiJmFv0okUrtgQ6q12G0jM";

    fn signed<'a>(
        signature: &'a str,
        operation: Operation,
        user: &'a str,
        exp: Option<i64>,
    ) -> Signed<'a> {
        Signed {
            path: "/home/user/a.txt",
            operation,
            user,
            signature,
            expiration: exp,
        }
    }

    #[test]
    fn the_signature_is_the_sdks_on_a_fixed_example() {
        assert_eq!(
            sign("/home/user/a.txt", Operation::Read, "", "tok", None),
            READ_NO_USER
        );
        assert_eq!(
            sign(
                "/home/user/a.txt",
                Operation::Write,
                "user",
                "tok",
                Some(1_700_000_000)
            ),
            WRITE_USER_EXPIRING
        );
    }

    #[test]
    fn a_valid_signature_is_accepted_until_it_expires() {
        let read = signed(READ_NO_USER, Operation::Read, "", None);
        assert_eq!(read.verify("tok", 2_000_000_000), Ok(()));
        let write = signed(
            WRITE_USER_EXPIRING,
            Operation::Write,
            "user",
            Some(1_700_000_000),
        );
        assert_eq!(write.verify("tok", 1_700_000_000), Ok(()));
        assert_eq!(
            write.verify("tok", 1_700_000_001),
            Err(SignatureError::Expired)
        );
        // A signature that does not match is invalid, expired or not (envd's order).
        assert_eq!(
            write.verify("other", 1_700_000_001),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            SignatureError::Expired.to_string(),
            "signature is already expired"
        );
        assert_eq!(SignatureError::Mismatch.to_string(), "invalid signature");
    }

    #[test]
    fn a_wrong_operation_user_token_path_or_expiration_is_refused() {
        let mismatch = Err(SignatureError::Mismatch);
        assert_eq!(
            signed(READ_NO_USER, Operation::Write, "", None).verify("tok", 0),
            mismatch
        );
        assert_eq!(
            signed(READ_NO_USER, Operation::Read, "root", None).verify("tok", 0),
            mismatch
        );
        assert_eq!(
            signed(READ_NO_USER, Operation::Read, "", None).verify("other", 0),
            mismatch
        );
        let mut moved = signed(READ_NO_USER, Operation::Read, "", None);
        moved.path = "/home/user/b.txt";
        assert_eq!(moved.verify("tok", 0), mismatch);
        // Extending the expiration changes what was signed.
        assert_eq!(
            signed(
                WRITE_USER_EXPIRING,
                Operation::Write,
                "user",
                Some(1_800_000_000)
            )
            .verify("tok", 0),
            mismatch
        );
    }

    #[test]
    fn a_plus_decoded_as_a_space_and_padding_still_match() {
        let spaced = WRITE_USER_EXPIRING.replace('+', " ") + "=";
        let write = signed(&spaced, Operation::Write, "user", Some(1_700_000_000));
        assert_eq!(write.verify("tok", 0), Ok(()));
    }

    #[test]
    fn a_malformed_signature_is_refused_before_any_token_is_tried() {
        for bad in ["", "v2_abc", "v1_not*base64!", "v1_YWJj"] {
            assert_eq!(
                signed(bad, Operation::Read, "", None).precheck(0),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
    }
}
