//! Environment given to sandboxed commands: variable names, a uid's agent environment, and
//! masking of injected secret values in what commands print (I13, I14).
//!
//! Masking is defence in depth, not a boundary: a command that can read a secret can also
//! print it encoded, split or reversed. What it does guarantee is that the exact value of an
//! injected secret never reaches an API response or a model's context by being echoed.

use std::collections::BTreeMap;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::{shorten, CoreError};

/// Longest variable name accepted, in bytes.
pub const MAX_ENV_NAME_BYTES: usize = 256;
/// Longest value accepted, in bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
/// Most variables one uid's agent environment holds.
pub const MAX_AGENT_ENV_VARS: usize = 256;
/// Shortest secret value: shorter ones would mask ordinary output by accident.
pub const MIN_SECRET_BYTES: usize = 6;

/// Names a user's environment must not set: the sandbox identity is 1000:1000 whatever the
/// environment says (I11).
const RESERVED_NAMES: &[&str] = &["USER_UID", "USER_GID"];

/// Checks a variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_ENV_NAME_BYTES`], not
/// reserved. Shells cannot export any other name, so nothing is lost by refusing them.
pub fn check_env_name(name: &str) -> Result<(), CoreError> {
    let refuse = |reason| {
        Err(CoreError::InvalidEnv {
            name: shorten(name),
            reason,
        })
    };
    let mut bytes = name.bytes();
    match bytes.next() {
        None => return refuse("a variable name must not be empty"),
        Some(first) if !(first.is_ascii_alphabetic() || first == b'_') => {
            return refuse("a variable name starts with a letter or '_'")
        }
        Some(_) => {}
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return refuse("a variable name holds only letters, digits and '_'");
    }
    if name.len() > MAX_ENV_NAME_BYTES {
        return refuse("a variable name is at most 256 bytes");
    }
    if RESERVED_NAMES.contains(&name) {
        return refuse("USER_UID and USER_GID are fixed at 1000 and cannot be set (I11)");
    }
    Ok(())
}

/// Checks a variable's value: no NUL byte (the kernel could not pass it), bounded size.
pub fn check_env_value(name: &str, value: &str) -> Result<(), CoreError> {
    let refuse = |reason| {
        Err(CoreError::InvalidEnv {
            name: shorten(name),
            reason,
        })
    };
    if value.contains('\0') {
        return refuse("a value must not contain a NUL byte");
    }
    if value.len() > MAX_ENV_VALUE_BYTES {
        return refuse("a value is at most 32 KiB");
    }
    Ok(())
}

/// One variable of a uid's agent environment (I14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEnvVar {
    /// The variable's name, checked by [`check_env_name`].
    pub name: String,
    /// Its value; never returned in full by any read API.
    pub value: String,
    /// Whether the value is masked in command output. Secrets are at least
    /// [`MIN_SECRET_BYTES`] long.
    pub secret: bool,
}

impl AgentEnvVar {
    /// A checked variable.
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        secret: bool,
    ) -> Result<Self, CoreError> {
        let (name, value) = (name.into(), value.into());
        check_env_name(&name)?;
        check_env_value(&name, &value)?;
        if secret && value.len() < MIN_SECRET_BYTES {
            return Err(CoreError::InvalidEnv {
                name: shorten(&name),
                reason: "a secret must be at least 6 bytes long to be masked reliably in \
                         output; send it with \"secret\": false if it is not a secret",
            });
        }
        Ok(Self {
            name,
            value,
            secret,
        })
    }

    /// What a read API may show of the value: its last four characters, only when the value
    /// is long enough (16 characters and more) that they reveal next to nothing.
    pub fn hint(&self) -> Option<String> {
        let chars = self.value.chars().count();
        (chars >= 16).then(|| {
            let tail: String = self.value.chars().skip(chars - 4).collect();
            format!("…{tail}")
        })
    }
}

/// Replaces the exact values of secrets with `[masked:NAME]` in command output.
///
/// Cheap to clone and share: the matcher is built once per exec.
#[derive(Debug, Clone, Default)]
pub struct SecretMasker {
    inner: Option<Arc<MaskerInner>>,
}

#[derive(Debug)]
struct MaskerInner {
    matcher: AhoCorasick,
    /// Pattern `i`'s bytes and its replacement.
    secrets: Vec<(Vec<u8>, Vec<u8>)>,
    longest: usize,
}

impl SecretMasker {
    /// A masker for `(name, value)` pairs. Empty values are ignored; when two names share a
    /// value, the first name (in iteration order) labels it.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut by_value: BTreeMap<&[u8], &str> = BTreeMap::new();
        for (name, value) in secrets {
            if !value.is_empty() {
                by_value.entry(value.as_bytes()).or_insert(name);
            }
        }
        if by_value.is_empty() {
            return Self::default();
        }
        let secrets: Vec<(Vec<u8>, Vec<u8>)> = by_value
            .into_iter()
            .map(|(value, name)| (value.to_vec(), format!("[masked:{name}]").into_bytes()))
            .collect();
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(secrets.iter().map(|(value, _)| value))
            // Only a pattern set beyond the automaton's size limits fails; a uid's environment
            // is bounded far below that.
            .expect("a bounded set of secrets always builds a matcher");
        let longest = secrets
            .iter()
            .map(|(value, _)| value.len())
            .max()
            .unwrap_or(0);
        Self {
            inner: Some(Arc::new(MaskerInner {
                matcher,
                secrets,
                longest,
            })),
        }
    }

    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    /// `bytes` with every secret value replaced.
    pub fn mask(&self, bytes: &[u8]) -> Vec<u8> {
        let Some(inner) = &self.inner else {
            return bytes.to_vec();
        };
        let mut out = Vec::with_capacity(bytes.len());
        let mut pos = 0;
        for found in inner.matcher.find_iter(bytes) {
            out.extend_from_slice(&bytes[pos..found.start()]);
            out.extend_from_slice(&inner.secrets[found.pattern().as_usize()].1);
            pos = found.end();
        }
        out.extend_from_slice(&bytes[pos..]);
        out
    }

    /// A masker for one output stream that arrives in chunks, so a secret split across two
    /// chunks is still caught.
    pub fn stream(&self) -> MaskingStream {
        MaskingStream {
            masker: self.clone(),
            held: Vec::new(),
        }
    }
}

/// See [`SecretMasker::stream`]. Holds back at most the longest secret's length minus one
/// bytes, and only while they could still begin a secret.
#[derive(Debug)]
pub struct MaskingStream {
    masker: SecretMasker,
    held: Vec<u8>,
}

impl MaskingStream {
    /// Masks what can be decided after `chunk` and returns it; the rest waits for the next
    /// chunk or [`MaskingStream::finish`].
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let Some(inner) = self.masker.inner.clone() else {
            return chunk.to_vec();
        };
        self.held.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.held);
        // A match starting before `settled` lies wholly in `buf` together with every longer
        // candidate at the same start, so the leftmost-longest choice there is final.
        let settled = buf.len().saturating_sub(inner.longest - 1);
        let mut out = Vec::with_capacity(buf.len());
        let mut pos = 0;
        for found in inner.matcher.find_iter(&buf) {
            if found.start() >= settled {
                break;
            }
            out.extend_from_slice(&buf[pos..found.start()]);
            out.extend_from_slice(&inner.secrets[found.pattern().as_usize()].1);
            pos = found.end();
        }
        // From `pos` on nothing was replaced. Bytes from which no secret can begin (neither
        // whole in `buf` nor cut off by its end) go out now; the rest is held.
        let undecided = pos.max(settled);
        let hold_from = (undecided..buf.len())
            .find(|&start| {
                let rest = &buf[start..];
                inner.secrets.iter().any(|(secret, _)| {
                    let n = secret.len().min(rest.len());
                    rest[..n] == secret[..n]
                })
            })
            .unwrap_or(buf.len());
        out.extend_from_slice(&buf[pos..hold_from]);
        self.held = buf[hold_from..].to_vec();
        out
    }

    /// The end of the stream: masks and returns whatever was held.
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        self.masker.mask(&held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masker() -> SecretMasker {
        SecretMasker::new([("API_KEY", "sk-live-abcdef"), ("DB_PASS", "hunter22")])
    }

    #[test]
    fn a_secret_in_a_buffer_is_replaced_by_its_name() {
        let out = masker().mask(b"key=sk-live-abcdef pass=hunter22 end");
        assert_eq!(out, b"key=[masked:API_KEY] pass=[masked:DB_PASS] end");
    }

    #[test]
    fn the_longest_secret_wins_where_two_start_at_one_place() {
        let masker = SecretMasker::new([("SHORT", "abcdef"), ("LONG", "abcdefgh")]);
        assert_eq!(masker.mask(b"xabcdefghx"), b"x[masked:LONG]x");
        assert_eq!(masker.mask(b"xabcdefx"), b"x[masked:SHORT]x");
    }

    #[test]
    fn a_secret_split_across_chunks_is_masked_at_every_split_point() {
        let input = b"before sk-live-abcdef middle hunter22 after sk-live-abcdef";
        let expected = masker().mask(input);
        for split in 0..=input.len() {
            for second in split..=input.len() {
                let mut stream = masker().stream();
                let mut out = stream.push(&input[..split]);
                out.extend(stream.push(&input[split..second]));
                out.extend(stream.push(&input[second..]));
                out.extend(stream.finish());
                assert_eq!(out, expected, "split at {split} and {second}");
            }
        }
    }

    #[test]
    fn byte_by_byte_streaming_masks_like_the_whole_buffer() {
        let masker = SecretMasker::new([("A", "aaaaab"), ("B", "aab")]);
        let input = b"aaaaaaab aab aaaaab aaa";
        let mut stream = masker.stream();
        let mut out = Vec::new();
        for byte in input {
            out.extend(stream.push(&[*byte]));
        }
        out.extend(stream.finish());
        assert_eq!(out, masker.mask(input));
    }

    #[test]
    fn output_that_cannot_begin_a_secret_is_not_held_back() {
        let mut stream = masker().stream();
        assert_eq!(stream.push(b"Password: "), b"Password: ");
        assert_eq!(stream.push(b"ok sk-li"), b"ok ");
        assert_eq!(stream.push(b"ve-abcdef!"), b"[masked:API_KEY]!");
        assert!(stream.finish().is_empty());
    }

    #[test]
    fn an_empty_masker_passes_output_through() {
        let masker = SecretMasker::new([("EMPTY", "")]);
        assert!(masker.is_empty());
        assert_eq!(masker.mask(b"anything"), b"anything");
        assert_eq!(masker.stream().push(b"x"), b"x");
    }

    #[test]
    fn names_outside_the_portable_set_are_refused() {
        for bad in ["", "1ABC", "A-B", "A=B", "A B", "Ä", "USER_UID", "USER_GID"] {
            assert!(check_env_name(bad).is_err(), "{bad:?} must be refused");
        }
        check_env_name(&"A".repeat(257)).unwrap_err();
        for good in ["A", "_x", "OPENAI_API_KEY", "a1_"] {
            check_env_name(good).unwrap();
        }
    }

    #[test]
    fn values_with_nul_or_beyond_the_size_limit_are_refused() {
        assert!(check_env_value("A", "a\0b").is_err());
        assert!(check_env_value("A", &"x".repeat(MAX_ENV_VALUE_BYTES + 1)).is_err());
        check_env_value("A", "").unwrap();
    }

    #[test]
    fn short_secrets_are_refused_and_short_plain_values_are_not() {
        assert!(AgentEnvVar::new("PIN", "1234", true).is_err());
        AgentEnvVar::new("MODE", "fast", false).unwrap();
    }

    #[test]
    fn a_hint_shows_the_last_four_characters_of_long_values_only() {
        let long = AgentEnvVar::new("K", "sk-0123456789abcdef", true).unwrap();
        assert_eq!(long.hint().as_deref(), Some("…cdef"));
        let short = AgentEnvVar::new("K", "hunter22", true).unwrap();
        assert_eq!(short.hint(), None);
    }
}
