//! Finding the provisioner token inside what a client sends toward a sandbox (I13).
//!
//! The token must never enter a sandbox: not as a whole value, and not as *part* of one
//! (`x<T>`, `http://h/?access_token=<T>`, `Authorization: Bearer <T>`). So every value that
//! reaches a runtime (environment layers, the command line, a command's stdin) is searched
//! for the token as a substring, in three spellings a client may produce by accident:
//!
//! - the token itself;
//! - after one level of percent-decoding (`%41` → `A`), so a URL with the token's
//!   characters escaped, even only some of them, is found too;
//! - base64, standard or URL-safe, at any byte alignment, so `Basic base64(user:<T>)` and a
//!   token embedded in a base64 blob are found: the base64 digits that depend only on the
//!   token's bytes are the same wherever the token starts, modulo 3.
//!
//! Other encodings (hex, reversed, split across variables) are not searched: this stops
//! accidents, not a client that means to hand its own credential to a sandbox.

use std::sync::Arc;

use aho_corasick::AhoCorasick;
use base64::Engine as _;

/// A matcher for one secret (the provisioner token) and its accidental encodings.
///
/// Cheap to clone; its `Debug` form is redacted so the token cannot reach a log.
#[derive(Clone)]
pub struct TokenFinder {
    matcher: Arc<AhoCorasick>,
}

impl TokenFinder {
    /// A finder for `token`. Tokens are at least 32 characters (I13), so every pattern
    /// built from one (the base64 ones are at least 40 digits) is long enough never to
    /// match ordinary text by chance.
    pub fn new(token: &str) -> Self {
        let bytes = token.as_bytes();
        let mut patterns = vec![bytes.to_vec()];
        for engine in [
            base64::engine::general_purpose::STANDARD_NO_PAD,
            base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            for offset in 0..3 {
                // With `offset` bytes before it, the token's bits start at bit 8*offset of
                // the encoding; keep only the digits made entirely of the token's bits.
                let mut shifted = vec![0u8; offset];
                shifted.extend_from_slice(bytes);
                let encoded = engine.encode(&shifted);
                let first = (8 * offset).div_ceil(6);
                let last = 8 * shifted.len() / 6;
                if last > first {
                    patterns.push(encoded.as_bytes()[first..last].to_vec());
                }
            }
        }
        patterns.sort();
        patterns.dedup();
        let matcher = AhoCorasick::new(&patterns)
            // Seven patterns of a bounded token never exceed the automaton's limits.
            .expect("a handful of token spellings always builds a matcher");
        Self {
            matcher: Arc::new(matcher),
        }
    }

    /// Whether `value` contains the token, raw, percent-encoded or base64-encoded.
    pub fn is_in(&self, value: &[u8]) -> bool {
        if self.matcher.is_match(value) {
            return true;
        }
        value.contains(&b'%') && {
            let decoded: Vec<u8> = percent_encoding::percent_decode(value).collect();
            self.matcher.is_match(&decoded)
        }
    }
}

impl std::fmt::Debug for TokenFinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenFinder(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "Tok3n0123456789abcdefABCDEF0123456789xyz";

    #[test]
    fn the_token_is_found_anywhere_inside_a_value() {
        let finder = TokenFinder::new(TOKEN);
        for value in [
            TOKEN.to_owned(),
            format!("x{TOKEN}"),
            format!("{TOKEN}y"),
            format!("http://h/?access_token={TOKEN}&a=b"),
            format!("Bearer%20{TOKEN}"),
            format!("line one\nline two {TOKEN} three"),
        ] {
            assert!(finder.is_in(value.as_bytes()), "{value}");
        }
    }

    #[test]
    fn percent_encoded_tokens_are_found_even_partly_escaped() {
        let finder = TokenFinder::new(TOKEN);
        let all: String = TOKEN.bytes().map(|b| format!("%{b:02X}")).collect();
        let some = format!("%54ok3n{}", &TOKEN[5..]);
        let lower: String = TOKEN.bytes().map(|b| format!("%{b:02x}")).collect();
        for value in [all, some, lower, format!("u=%20{TOKEN}")] {
            assert!(finder.is_in(value.as_bytes()), "{value}");
        }
    }

    #[test]
    fn base64_encoded_tokens_are_found_at_every_alignment() {
        let finder = TokenFinder::new(TOKEN);
        for prefix in ["", "u:", "ab:", "user:"] {
            for engine in [
                base64::engine::general_purpose::STANDARD,
                base64::engine::general_purpose::URL_SAFE,
            ] {
                let encoded = engine.encode(format!("{prefix}{TOKEN}"));
                let value = format!("Authorization: Basic {encoded}");
                assert!(finder.is_in(value.as_bytes()), "{prefix:?}: {value}");
            }
        }
    }

    #[test]
    fn other_text_and_near_misses_are_not_the_token() {
        let finder = TokenFinder::new(TOKEN);
        let near = &TOKEN[..TOKEN.len() - 1];
        for value in [
            "",
            "Bearer something-else-entirely-0123456789",
            near,
            "%zz%4",
            "%",
        ] {
            assert!(!finder.is_in(value.as_bytes()), "{value}");
        }
        assert_eq!(format!("{finder:?}"), "TokenFinder(<redacted>)");
    }
}
