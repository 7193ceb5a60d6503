//! Bearer authentication of `/v1` (I12, I13).

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{ApiError, ApiState};

/// The provisioner token: at least 32 characters (I13).
///
/// Its `Debug` form is redacted so it cannot reach a log by accident.
pub struct ProvisionerToken {
    digest: [u8; 32],
    /// Finds the token inside values bound for a sandbox (I13); the provisioner gets a
    /// clone through [`ProvisionerToken::finder`].
    finder: warren_core::TokenFinder,
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Shorter than [`ProvisionerToken::MIN_LEN`].
    #[error("the provisioner token has {len} characters; it needs at least 32 (generate one with `openssl rand -hex 32`)")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Contains whitespace or control characters, which no HTTP header can carry intact.
    #[error("the provisioner token contains whitespace or control characters")]
    BadCharacters,
}

impl ProvisionerToken {
    /// Shortest token accepted (I13).
    pub const MIN_LEN: usize = 32;

    /// Validates a token.
    pub fn new(token: &str) -> Result<Self, TokenError> {
        let len = token.chars().count();
        if len < Self::MIN_LEN {
            return Err(TokenError::TooShort { len });
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::BadCharacters);
        }
        Ok(Self {
            digest: Sha256::digest(token.as_bytes()).into(),
            finder: warren_core::TokenFinder::new(token),
        })
    }

    /// What the provisioner searches every value bound for a sandbox with, so the token
    /// never enters one, whole or as part of a value (I13).
    pub fn finder(&self) -> warren_core::TokenFinder {
        self.finder.clone()
    }

    /// The token's SHA-256 digest, for deriving keys bound to it (DeerFlow's sandbox URL
    /// capabilities): a secret, never logged or sent.
    pub fn secret_digest(&self) -> [u8; 32] {
        self.digest
    }

    /// Whether `presented` is this token. Both sides are hashed first, so the comparison
    /// takes the same time whatever the presented length or content.
    pub fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&presented).into()
    }
}

impl std::fmt::Debug for ProvisionerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProvisionerToken(<redacted>)")
    }
}

/// The credential of an `Authorization: Bearer …` header, if the request has one.
pub(crate) fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
}

pub(crate) async fn require_bearer(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    match bearer(&request) {
        Some(token) if state.token.matches(token.trim()) => Ok(next.run(request).await),
        Some(_) => Err(ApiError::unauthorized("the bearer token is not valid")),
        None => Err(ApiError::unauthorized(
            "missing credentials: send `Authorization: Bearer <token>`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_are_refused() {
        assert_eq!(
            ProvisionerToken::new(&"a".repeat(31)).unwrap_err(),
            TokenError::TooShort { len: 31 }
        );
        assert!(ProvisionerToken::new(&"a".repeat(32)).is_ok());
        assert!(ProvisionerToken::new(&format!("{} ", "a".repeat(32))).is_err());
    }

    #[test]
    fn only_the_exact_token_matches() {
        let token = ProvisionerToken::new(&"k".repeat(40)).unwrap();
        assert!(token.matches(&"k".repeat(40)));
        assert!(!token.matches(&"k".repeat(39)));
        assert!(!token.matches(&"k".repeat(41)));
        assert!(!token.matches(""));
        assert_eq!(format!("{token:?}"), "ProvisionerToken(<redacted>)");
    }

    #[test]
    fn the_finder_finds_the_token_inside_text() {
        let raw = "tok-0123456789abcdef0123456789abcdef==";
        let finder = ProvisionerToken::new(raw).unwrap().finder();
        assert!(finder.is_in(format!("x{raw}").as_bytes()));
        assert!(!finder.is_in(b"Bearer something-else-entirely-0123456789"));
    }
}
