//! Egress secrets and the egress audit (I13, I22, I23): a credential a sandbox may present
//! only to the destinations it is bound to, injected by warren's proxy on the way out, so
//! the sandbox holds a placeholder and never the value.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::network::Destination;
use crate::{shorten, CoreError, SandboxId};

/// Most secrets one uid (or one sandbox) may hold.
pub const MAX_EGRESS_SECRETS: usize = 64;
/// Most destinations one secret may be bound to.
pub const MAX_SECRET_TARGETS: usize = 16;
/// Longest secret value, bytes.
pub const MAX_SECRET_VALUE_BYTES: usize = 8 * 1024;
/// The prefix of the variable that carries a secret's placeholder inside a sandbox.
pub const SECRET_ENV_PREFIX: &str = "WARREN_SECRET_";
/// The prefix every placeholder starts with: what the proxy looks for.
pub const PLACEHOLDER_PREFIX: &str = "warren-secret-";

/// The name of an egress secret: upper-case letters, digits and `_`, starting with a
/// letter, at most 64 bytes, so `WARREN_SECRET_<NAME>` is a portable variable name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SecretName(String);

impl SecretName {
    /// A checked name.
    pub fn new(name: impl Into<String>) -> Result<Self, CoreError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.as_bytes()[0].is_ascii_uppercase()
            && name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(invalid(
                &name,
                "a secret name is 1 to 64 of A-Z, 0-9 and _, starting with a letter",
            ));
        }
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The variable that carries its placeholder inside a sandbox.
    pub fn env_name(&self) -> String {
        format!("{SECRET_ENV_PREFIX}{}", self.0)
    }
}

impl TryFrom<String> for SecretName {
    type Error = CoreError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<SecretName> for String {
    fn from(value: SecretName) -> Self {
        value.0
    }
}

impl std::fmt::Display for SecretName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One destination a secret may be presented to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretTarget {
    /// A host name (`api.github.com`), a wildcard suffix (`*.example.com`) or an IP
    /// address, matched against the host the client named (never a resolved address).
    pub host: String,
    /// The ports it may go to; 443 when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Only requests whose path starts with this (`/v1/`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
}

impl SecretTarget {
    fn validate(&self) -> Result<(), CoreError> {
        // One address at most: a range names no destination a certificate could prove.
        if self.host.contains('/') || Destination::parse(&self.host).is_none() {
            return Err(invalid(
                &self.host,
                "a target host is a host name, *.suffix or one IP address",
            ));
        }
        if self.ports.contains(&0) || self.ports.len() > 16 {
            return Err(invalid(&self.host, "ports are 1 to 65535, at most 16"));
        }
        if let Some(prefix) = &self.path_prefix {
            let printable = prefix.bytes().all(|b| b.is_ascii_graphic());
            if !prefix.starts_with('/') || !printable || prefix.len() > 1024 {
                return Err(invalid(
                    prefix,
                    "a path prefix starts with / and holds printable ASCII only",
                ));
            }
        }
        Ok(())
    }

    /// Whether a connection to `host:port` (as the client named it) may carry the secret.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let port_ok = if self.ports.is_empty() {
            port == 443
        } else {
            self.ports.contains(&port)
        };
        port_ok
            && Destination::parse(&self.host).is_some_and(|d| match d {
                Destination::Range(address, _) => host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|h| h.to_canonical() == address.to_canonical()),
                named => named.covers_name(&host),
            })
    }

    /// Whether a request for `path` (origin form, query included) may carry the secret.
    pub fn covers_path(&self, path: &str) -> bool {
        self.path_prefix.as_deref().is_none_or(|prefix| {
            // `..` and encoded separators could climb out of the prefix on the server.
            let path_only = path.split(['?', '#']).next().unwrap_or("");
            path_only.starts_with(prefix)
                && !path_only.split('/').any(|s| s == ".." || s == ".")
                && !path_only.to_ascii_lowercase().contains("%2f")
                && !path_only.to_ascii_lowercase().contains("%2e")
        })
    }
}

/// How a secret is presented on a request to a bound destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Presentation {
    /// `Authorization: Bearer <value>`.
    Bearer,
    /// A header of this name: `<prefix><value>`.
    Header {
        /// The header's name (`X-Api-Key`).
        name: String,
        /// Put before the value (`token `), empty by default.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        prefix: String,
    },
    /// A query parameter of this name.
    Query {
        /// The parameter's name (`key`).
        name: String,
    },
    /// `Authorization: Basic base64(<username>:<value>)`.
    Basic {
        /// The user name.
        username: String,
    },
}

impl Presentation {
    fn validate(&self) -> Result<(), CoreError> {
        let token = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        match self {
            Self::Bearer => Ok(()),
            Self::Header { name, prefix } => {
                let hop = [
                    "host",
                    "connection",
                    "content-length",
                    "transfer-encoding",
                    "proxy-authorization",
                    "upgrade",
                    "te",
                ];
                if !token(name) || hop.contains(&name.to_ascii_lowercase().as_str()) {
                    return Err(invalid(name, "not a header name warren may set"));
                }
                if prefix.len() > 64 || prefix.bytes().any(|b| b.is_ascii_control()) {
                    return Err(invalid(prefix, "a prefix is printable and short"));
                }
                Ok(())
            }
            Self::Query { name } => {
                if !token(name) || name.contains(['&', '=', '#', '%', '+']) {
                    return Err(invalid(name, "not a query parameter name warren may set"));
                }
                Ok(())
            }
            Self::Basic { username } => {
                if username.contains(':') || username.bytes().any(|b| b.is_ascii_control()) {
                    return Err(invalid(username, "a user name holds no ':' and no control"));
                }
                Ok(())
            }
        }
    }
}

/// What a secret is bound to and how it is presented: everything but its value, which a
/// read API may show.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRule {
    /// Where it may go.
    pub targets: Vec<SecretTarget>,
    /// How it is presented there.
    pub present: Presentation,
    /// The operator's source that mints the value for each sandbox (a short-lived token),
    /// in place of a value stored with the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl SecretRule {
    /// Checks every part.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.targets.is_empty() || self.targets.len() > MAX_SECRET_TARGETS {
            return Err(invalid("", "a secret is bound to 1 to 16 targets"));
        }
        for target in &self.targets {
            target.validate()?;
        }
        if let Some(source) = &self.source {
            check_source_name(source)?;
        }
        self.present.validate()
    }

    /// Whether a connection to `host:port` may carry the secret at all.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        self.targets.iter().any(|t| t.covers(host, port))
    }

    /// Whether a request for `path` on `host:port` may carry the secret.
    pub fn covers_request(&self, host: &str, port: u16, path: &str) -> bool {
        self.targets
            .iter()
            .any(|t| t.covers(host, port) && t.covers_path(path))
    }
}

/// An egress secret with its value: what the proxy needs, never what an API returns.
#[derive(Clone, PartialEq, Eq)]
pub struct EgressSecret {
    /// Its name.
    pub name: SecretName,
    /// Where it goes and how.
    pub rule: SecretRule,
    /// The value.
    pub value: String,
}

impl std::fmt::Debug for EgressSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSecret")
            .field("name", &self.name)
            .field("rule", &self.rule)
            .field("value", &"<hidden>")
            .finish()
    }
}

impl EgressSecret {
    /// A checked secret: a value, or (with a source) none until one is minted
    /// ([`EgressSecret::minted`]).
    pub fn new(name: SecretName, rule: SecretRule, value: String) -> Result<Self, CoreError> {
        rule.validate()?;
        if rule.source.is_some() {
            if !value.is_empty() {
                return Err(invalid(
                    name.as_str(),
                    "a secret has a value or a source, not both",
                ));
            }
            return Ok(Self { name, rule, value });
        }
        if value.is_empty() {
            return Err(invalid(
                name.as_str(),
                "a secret needs a value, or a source that mints one",
            ));
        }
        Self::check_value(&name, &value)?;
        Ok(Self { name, rule, value })
    }

    /// This secret presenting `value`, minted by its source.
    pub fn minted(&self, value: String) -> Result<Self, CoreError> {
        Self::check_value(&self.name, &value)?;
        Ok(Self {
            value,
            ..self.clone()
        })
    }

    fn check_value(name: &SecretName, value: &str) -> Result<(), CoreError> {
        if value.len() < crate::MIN_SECRET_BYTES || value.len() > MAX_SECRET_VALUE_BYTES {
            return Err(invalid(
                name.as_str(),
                "a secret value is 6 bytes to 8 KiB long",
            ));
        }
        // It goes into a request head: no byte may end a line or a header.
        if value.bytes().any(|b| b.is_ascii_control() || b == 0x7f) {
            return Err(invalid(
                name.as_str(),
                "a secret value holds no control character",
            ));
        }
        Ok(())
    }

    /// What a read API may show of the value: its last four characters, only when it is
    /// long enough (16 characters and more) that they reveal next to nothing.
    pub fn hint(&self) -> Option<String> {
        let chars = self.value.chars().count();
        (chars >= 16).then(|| {
            let tail: String = self.value.chars().skip(chars - 4).collect();
            format!("…{tail}")
        })
    }
}

/// Checks the name of an operator's secret source: 1 to 64 of `a-z`, `0-9`, `.`, `_`,
/// `-`, starting with a letter or digit.
pub fn check_source_name(name: &str) -> Result<(), CoreError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if valid {
        Ok(())
    } else {
        Err(invalid(
            name,
            "a source name is 1 to 64 of a-z, 0-9, '.', '_' and '-'",
        ))
    }
}

/// The placeholder that stands for secret `name` inside `sandbox`: what
/// `WARREN_SECRET_<NAME>` holds. Derived, so never stored; worth nothing anywhere but on a
/// request to a bound destination through that sandbox's own proxy.
pub fn placeholder(sandbox: &SandboxId, name: &SecretName) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"warren egress placeholder\0");
    hasher.update(sandbox.as_str().as_bytes());
    hasher.update(b"\0");
    hasher.update(name.as_str().as_bytes());
    let digest = hasher.finalize();
    format!("{PLACEHOLDER_PREFIX}{}", hex::encode(&digest[..16]))
}

/// What happened to one connection a sandbox made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressVerdict {
    /// Connected and carried.
    Allowed,
    /// Refused by the network policy, a placeholder sent where it may not go, or a
    /// destination that could not be reached.
    Refused,
}

/// One connection of a sandbox through warren's egress proxy (the audit, I22). An allowed
/// connection is recorded twice, with the same `connection`: when it opens (no `ended_at`,
/// nothing carried yet), so a connection still open, or cut by a stopping server, is in
/// the audit; and when it ends, with what it carried. A refused one is recorded once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressEvent {
    /// When the connection was made, Unix milliseconds.
    pub at: i64,
    /// The connection's id, shared by its records.
    #[serde(default)]
    pub connection: String,
    /// When it ended (or was refused), Unix milliseconds; `None` on the record of its
    /// opening.
    #[serde(default)]
    pub ended_at: Option<i64>,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The host the client named.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The address connected to, when one was.
    pub address: Option<String>,
    /// Allowed or refused.
    pub verdict: EgressVerdict,
    /// The rule that decided it: `open`, `allowlist <entry>`, `secret <NAME>` or what
    /// refused it (`policy`, `placeholder`, `unreachable`, `malformed`, `limit`).
    pub rule: String,
    /// The secrets injected into it.
    pub secrets: Vec<SecretName>,
    /// Whether warren terminated its TLS (a bound HTTPS destination).
    pub intercepted: bool,
    /// Bytes the sandbox sent.
    pub bytes_out: u64,
    /// Bytes the sandbox received.
    pub bytes_in: u64,
    /// Why it was refused, for a refused one.
    pub reason: Option<String>,
}

fn invalid(entry: &str, reason: &'static str) -> CoreError {
    CoreError::InvalidEgressSecret {
        entry: shorten(entry),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, ports: &[u16], prefix: Option<&str>) -> SecretTarget {
        SecretTarget {
            host: host.into(),
            ports: ports.to_vec(),
            path_prefix: prefix.map(Into::into),
        }
    }

    #[test]
    fn secret_names_are_portable_variable_names() {
        assert!(SecretName::new("GITHUB_TOKEN").is_ok());
        for bad in ["", "lower", "1ABC", "A-B", "A B", &"A".repeat(65)] {
            assert!(SecretName::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            SecretName::new("X").unwrap().env_name(),
            "WARREN_SECRET_X".to_owned()
        );
    }

    #[test]
    fn a_target_covers_its_host_and_ports_only() {
        let exact = target("api.example.com", &[], None);
        assert!(exact.covers("API.example.com.", 443));
        assert!(!exact.covers("api.example.com", 80));
        assert!(!exact.covers("api.example.com.evil.test", 443));
        assert!(!exact.covers("evil-api.example.com", 443));
        let wild = target("*.example.com", &[443, 8443], None);
        assert!(wild.covers("a.b.example.com", 8443));
        assert!(!wild.covers("example.com", 443));
        let ip = target("127.0.0.1", &[8080], None);
        assert!(ip.covers("127.0.0.1", 8080));
        assert!(!ip.covers("localhost", 8080));
        assert!(target("10.0.0.0/8", &[], None).validate().is_err());
    }

    #[test]
    fn a_path_prefix_cannot_be_climbed_out_of() {
        let t = target("h", &[], Some("/v1/"));
        assert!(t.covers_path("/v1/repos?x=../"));
        assert!(!t.covers_path("/v2/"));
        assert!(!t.covers_path("/v1/../admin"));
        assert!(!t.covers_path("/v1/%2e%2e/admin"));
        assert!(!t.covers_path("/v1/..%2Fadmin"));
    }

    #[test]
    fn values_and_presentations_that_could_split_a_header_are_refused() {
        let rule = SecretRule {
            targets: vec![target("h.example", &[], None)],
            present: Presentation::Bearer,
            source: None,
        };
        let name = SecretName::new("T").unwrap();
        assert!(EgressSecret::new(name.clone(), rule.clone(), "abc\r\nX: y".into()).is_err());
        assert!(EgressSecret::new(name.clone(), rule.clone(), "short".into()).is_err());
        assert!(EgressSecret::new(name, rule, "long-enough-value".into()).is_ok());
        for bad in [
            Presentation::Header {
                name: "Host".into(),
                prefix: String::new(),
            },
            Presentation::Header {
                name: "X Bad".into(),
                prefix: String::new(),
            },
            Presentation::Query { name: "a&b".into() },
            Presentation::Basic {
                username: "a:b".into(),
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn placeholders_differ_per_sandbox_and_name_and_never_hold_the_value() {
        let a = SandboxId::parse("sbx-aaaaaaaaaaaaaaaaaaaaaaaa").unwrap();
        let b = SandboxId::parse("sbx-bbbbbbbbbbbbbbbbbbbbbbbb").unwrap();
        let name = SecretName::new("TOKEN").unwrap();
        let other = SecretName::new("OTHER").unwrap();
        let p = placeholder(&a, &name);
        assert!(p.starts_with(PLACEHOLDER_PREFIX) && p.len() == PLACEHOLDER_PREFIX.len() + 32);
        assert_eq!(p, placeholder(&a, &name));
        assert_ne!(p, placeholder(&b, &name));
        assert_ne!(p, placeholder(&a, &other));
    }

    #[test]
    fn a_sourced_secret_has_no_value_until_one_is_minted() {
        let rule = SecretRule {
            targets: vec![target("h.example", &[], None)],
            present: Presentation::Bearer,
            source: Some("github-app".into()),
        };
        let name = SecretName::new("T").unwrap();
        assert!(EgressSecret::new(name.clone(), rule.clone(), "a-stored-value".into()).is_err());
        let sourced = EgressSecret::new(name, rule.clone(), String::new()).unwrap();
        assert!(sourced.minted("ok-minted-token".into()).is_ok());
        assert!(sourced.minted("bad\ntoken".into()).is_err());
        let bad_source = SecretRule {
            source: Some("Has Spaces".into()),
            ..rule
        };
        assert!(bad_source.validate().is_err());
    }

    #[test]
    fn a_secret_never_prints_its_value() {
        let secret = EgressSecret::new(
            SecretName::new("T").unwrap(),
            SecretRule {
                targets: vec![target("h.example", &[], None)],
                present: Presentation::Bearer,
                source: None,
            },
            "supersecretvalue123".into(),
        )
        .unwrap();
        assert!(!format!("{secret:?}").contains("supersecret"));
        assert_eq!(secret.hint().as_deref(), Some("…e123"));
    }
}
