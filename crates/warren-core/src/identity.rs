//! Identities: the uid that owns files, its filesystem-safe form, the runtime scope that
//! groups runs, and the stable sandbox id derived from both (I3, I5).

use std::fmt;

use sha2::{Digest, Sha256};

use crate::{shorten, CoreError};

/// Why an identifier given by a client (uid, scope id) is unusable: the same rules for both.
fn identifier_problem(value: &str, max_len: usize) -> Option<&'static str> {
    if value.is_empty() {
        Some("it is empty")
    } else if value.len() > max_len {
        Some("it is too long")
    } else if value.chars().any(char::is_control) {
        Some("it contains control characters")
    } else {
        None
    }
}

/// The user a workspace belongs to: the authorisation boundary for files.
///
/// Any non-empty string of at most 256 bytes without control characters is a uid; whether it
/// is safe as a directory name is a separate question answered by [`SafeUid`].
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Uid(String);

impl TryFrom<String> for Uid {
    type Error = CoreError;

    fn try_from(uid: String) -> Result<Self, CoreError> {
        Self::new(uid)
    }
}

impl From<Uid> for String {
    fn from(uid: Uid) -> Self {
        uid.0
    }
}

impl Uid {
    /// Longest uid accepted, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Validates a uid.
    pub fn new(uid: impl Into<String>) -> Result<Self, CoreError> {
        let uid = uid.into();
        match identifier_problem(&uid, Self::MAX_LEN) {
            Some(reason) => Err(CoreError::InvalidUid {
                uid: shorten(&uid),
                reason,
            }),
            None => Ok(Self(uid)),
        }
    }

    /// Validates a uid a client names directly (a path segment, a request's `uid` field),
    /// refusing the prefixes of owners that isolation scopes derive
    /// ([`IsolationScope::RESERVED_OWNER_PREFIXES`](crate::IsolationScope)): otherwise
    /// `{"uid":"session:s-9"}` would land in the workspace and sandbox that session `s-9`
    /// derives (I29), and a platform passing its users' names as uids would let a user named
    /// `agent:coder` into an agent's workspace. Derived owners are reached only through
    /// their scope.
    pub fn plain(uid: impl Into<String>) -> Result<Self, CoreError> {
        let uid = Self::new(uid)?;
        match crate::IsolationScope::reserved_prefix_of(uid.as_str()) {
            Some(prefix) => Err(CoreError::ReservedUid {
                uid: shorten(uid.as_str()),
                prefix,
            }),
            None => Ok(uid),
        }
    }

    /// The uid as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The directory-name form of this uid (I3).
    pub fn safe(&self) -> SafeUid {
        SafeUid::of(self)
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A uid in the form used as a directory name (I3).
///
/// A uid matching `[A-Za-z0-9][A-Za-z0-9._-]{0,63}` is used as is; any other uid becomes
/// `uid-<sha256 hex>`. The two forms cannot collide: a safe uid never contains 64 hex digits
/// after `uid-` because it is at most 64 characters long in total.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SafeUid(String);

impl SafeUid {
    /// Derives the directory-name form of `uid`.
    pub fn of(uid: &Uid) -> Self {
        if is_safe_as_is(uid.as_str()) {
            Self(uid.as_str().to_owned())
        } else {
            Self(format!("uid-{}", hex::encode(Sha256::digest(uid.as_str()))))
        }
    }

    /// The directory name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SafeUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_safe_as_is(uid: &str) -> bool {
    let bytes = uid.as_bytes();
    let Some((first, rest)) = bytes.split_first() else {
        return false;
    };
    // `uid-<64 hex>` is the hashed form; a uid that already looks like a hash would make two
    // uids share one directory, so it is hashed as well. (It is exactly 68 bytes, over the
    // 64 allowed, so the length rule already guarantees this; the test pins it.)
    first.is_ascii_alphanumeric()
        && rest.len() <= 63
        && rest
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The key that groups runs into one runtime: today the root conversation's thread id.
///
/// A child agent inherits its root run's runtime scope, and so shares its runtime (I6).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct RuntimeScope(String);

impl RuntimeScope {
    /// Longest runtime scope id accepted, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Validates a runtime scope id.
    pub fn new(scope: impl Into<String>) -> Result<Self, CoreError> {
        let scope = scope.into();
        match identifier_problem(&scope, Self::MAX_LEN) {
            Some(reason) => Err(CoreError::InvalidRuntimeScope {
                scope: shorten(&scope),
                reason,
            }),
            None => Ok(Self(scope)),
        }
    }

    /// The scope id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RuntimeScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stable id of the sandbox of one (uid, runtime scope) (I5).
///
/// It is `sbx-` plus the first 24 hex digits (96 bits) of SHA-256 over a length-prefixed
/// encoding of both parts, so `("ab", "c")` and `("a", "bc")` never share an id. Nothing
/// else — not the workdir, not the backend — goes into it.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl TryFrom<String> for SandboxId {
    type Error = CoreError;

    fn try_from(id: String) -> Result<Self, CoreError> {
        Self::parse(&id)
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> Self {
        id.0
    }
}

impl SandboxId {
    const PREFIX: &'static str = "sbx-";
    const HEX_LEN: usize = 24;

    /// Derives the sandbox id of `(uid, scope)`.
    pub fn derive(uid: &Uid, scope: &RuntimeScope) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"warren.sandbox.v1\0");
        for part in [uid.as_str(), scope.as_str()] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part.as_bytes());
        }
        let digest = hex::encode(hasher.finalize());
        Self(format!("{}{}", Self::PREFIX, &digest[..Self::HEX_LEN]))
    }

    /// Parses an id given by a client; only the shape is checked.
    pub fn parse(id: &str) -> Result<Self, CoreError> {
        let valid = id.strip_prefix(Self::PREFIX).is_some_and(|hex| {
            hex.len() == Self::HEX_LEN
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if valid {
            Ok(Self(id.to_owned()))
        } else {
            Err(CoreError::InvalidSandboxId { id: shorten(id) })
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> Uid {
        Uid::new(s).unwrap()
    }

    fn scope(s: &str) -> RuntimeScope {
        RuntimeScope::new(s).unwrap()
    }

    #[test]
    fn ids_read_from_json_are_checked_as_parsed_ones() {
        let id = SandboxId::derive(&uid("alice"), &scope("default"));
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<SandboxId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<SandboxId>("\"sbx-../../etc\"").is_err());
        assert_eq!(
            serde_json::from_str::<Uid>("\"alice\"").unwrap(),
            uid("alice")
        );
        assert!(serde_json::from_str::<Uid>("\"a\\nb\"").is_err());
    }

    #[test]
    fn a_plain_uid_may_not_use_the_prefixes_of_derived_owners() {
        for reserved in ["session:s-9", "agent:coder", "global:shared", "global:"] {
            assert!(
                matches!(Uid::plain(reserved), Err(CoreError::ReservedUid { .. })),
                "{reserved}"
            );
            // The owner itself is still a valid uid for what scopes derive.
            assert!(Uid::new(reserved).is_ok());
        }
        for plain in ["alice", "Session:s-9", "sessions", "my-session:x", "agent"] {
            assert_eq!(Uid::plain(plain).unwrap().as_str(), plain);
        }
        assert!(matches!(Uid::plain(""), Err(CoreError::InvalidUid { .. })));
    }

    #[test]
    fn safe_uids_are_used_as_is() {
        for name in ["alice", "A", "u1.2_3-4", &"a".repeat(64)] {
            assert_eq!(uid(name).safe().as_str(), name);
        }
    }

    #[test]
    fn unsafe_uids_become_a_sha256_name() {
        for name in [
            "../bob",
            ".hidden",
            "-dash",
            "a/b",
            "ali ce",
            "émile",
            &"a".repeat(65),
            "_x",
        ] {
            let safe = uid(name).safe();
            let hex = safe.as_str().strip_prefix("uid-").expect("hashed form");
            assert_eq!(hex.len(), 64, "{name}");
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn a_uid_shaped_like_a_hash_is_hashed_again() {
        let lookalike = format!("uid-{}", "0".repeat(64));
        assert_ne!(uid(&lookalike).safe().as_str(), lookalike);
    }

    #[test]
    fn empty_long_and_control_uids_are_refused() {
        assert!(Uid::new("").is_err());
        assert!(Uid::new("a".repeat(257)).is_err());
        assert!(Uid::new("a\nb").is_err());
        assert!(Uid::new("a\0b").is_err());
    }

    #[test]
    fn sandbox_id_is_stable_and_depends_only_on_uid_and_scope() {
        let a = SandboxId::derive(&uid("alice"), &scope("thread-1"));
        assert_eq!(a, SandboxId::derive(&uid("alice"), &scope("thread-1")));
        assert_ne!(a, SandboxId::derive(&uid("alice"), &scope("thread-2")));
        assert_ne!(a, SandboxId::derive(&uid("bob"), &scope("thread-1")));
        assert_eq!(SandboxId::parse(a.as_str()).unwrap(), a);
    }

    #[test]
    fn sandbox_id_is_unambiguous_under_concatenation() {
        assert_ne!(
            SandboxId::derive(&uid("ab"), &scope("c")),
            SandboxId::derive(&uid("a"), &scope("bc"))
        );
    }

    #[test]
    fn malformed_sandbox_ids_are_refused() {
        for id in [
            "",
            "sbx-",
            "sbx-XYZ",
            "sbx-0123456789abcdef0123456",
            "sbx-0123456789ABCDEF01234567",
            "../sbx-0123456789abcdef01234567",
        ] {
            assert!(SandboxId::parse(id).is_err(), "{id}");
        }
        assert!(SandboxId::parse("sbx-0123456789abcdef01234567").is_ok());
    }
}
