//! Wire types of egress secrets (`/v1/users/{uid}/secrets`, `/v1/sandboxes/{id}/secrets`)
//! and the egress audit (`/v1/sandboxes/{id}/egress`), issue 38. A secret's value goes in
//! and never comes back out.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One destination a secret may be presented to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretTargetSpec {
    /// A host name (`api.github.com`), a wildcard suffix (`*.example.com`) or one IP
    /// address, matched against the host the client named, never a resolved address.
    pub host: String,
    /// The ports; 443 when empty. A port that carries plain HTTP must be listed.
    #[serde(
        default,
        deserialize_with = "crate::strict::ports",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ports: Vec<u16>,
    /// Only requests whose path starts with this (`/v1/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
}

/// How a secret is presented on a request to a bound destination, where the request
/// carries no placeholder of it (a placeholder the client placed is replaced where it
/// stands).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SecretPresentation {
    /// `Authorization: Bearer <value>`. (A struct variant, so a field it does not take is
    /// refused like any other's.)
    Bearer {},
    /// A header `<name>: <prefix><value>`.
    Header {
        /// The header's name.
        name: String,
        /// Put before the value.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        prefix: String,
    },
    /// A query parameter `<name>=<value>`.
    Query {
        /// The parameter's name.
        name: String,
    },
    /// `Authorization: Basic base64(<username>:<value>)`.
    Basic {
        /// The user name.
        username: String,
    },
}

/// `PUT /v1/users/{uid}/secrets/{name}` and `PUT /v1/sandboxes/{id}/secrets/{name}`: sets
/// a secret, or rotates it in place (the next connection presents the new value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEgressSecret {
    /// Where it may go (1 to 16 targets).
    pub targets: Vec<SecretTargetSpec>,
    /// How it is presented there.
    pub present: SecretPresentation,
    /// The value: 6 bytes to 8 KiB, no control character. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Instead of a value, one of the operator's sources (`network.secret_sources`): it
    /// mints a short-lived value for each sandbox, kept until it expires, never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// One secret given with `POST /v1/sandboxes`: the sandbox's own, over its uid's of the
/// same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewEgressSecret {
    /// The name: 1 to 64 of `A-Z`, `0-9`, `_`, starting with a letter.
    pub name: String,
    /// Where it may go (1 to 16 targets).
    pub targets: Vec<SecretTargetSpec>,
    /// How it is presented there.
    pub present: SecretPresentation,
    /// The value. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Instead of a value, one of the operator's sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Whose a secret is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecretScope {
    /// The uid's: every sandbox of theirs may present it.
    Uid,
    /// One sandbox's own.
    Sandbox,
}

/// A secret as read back: never its value (I13).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EgressSecretInfo {
    /// The name.
    pub name: String,
    /// Whose it is.
    pub scope: SecretScope,
    /// The variable holding its placeholder inside a sandbox (`WARREN_SECRET_<NAME>`).
    pub env: String,
    /// Where it may go.
    pub targets: Vec<SecretTargetSpec>,
    /// How it is presented.
    pub present: SecretPresentation,
    /// The operator's source that mints it, for a secret with no stored value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The stored value's length in bytes (0 for a source's).
    pub length: usize,
    /// The last four characters, for values of 16 characters or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// RFC 3339: when it was last set.
    pub updated_at: String,
}

/// `GET /v1/users/{uid}/secrets` and `GET /v1/sandboxes/{id}/secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EgressSecretList {
    /// The secrets, by name.
    pub secrets: Vec<EgressSecretInfo>,
}

/// One record of a connection a sandbox made or was refused. An allowed connection has
/// two, with the same `connection`: one written when it opened (no `ended_at`, nothing
/// carried yet) and one when it ended, with the bytes it carried. A refused connection
/// has one, with `ended_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EgressConnection {
    /// Its place in the sandbox's audit: pass the last one as `after` for the next page.
    pub id: i64,
    /// The connection's id, shared by its records.
    pub connection: String,
    /// RFC 3339: when it was made.
    pub at: String,
    /// RFC 3339: when it ended or was refused; absent on the record of its opening.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// The host the client named.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The address connected to, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `allowed` or `refused`.
    pub verdict: String,
    /// What decided it: the network mode that allowed it (`open`, `allowlist`), or what
    /// refused it (`policy`, `placeholder`, `unreachable`, `upstream_tls`, `malformed`,
    /// `limit`, `authority`).
    pub rule: String,
    /// The secrets presented on it, by name.
    pub secrets: Vec<String>,
    /// Whether warren terminated its TLS (a destination a secret is bound to).
    pub intercepted: bool,
    /// Bytes the sandbox sent.
    pub bytes_out: u64,
    /// Bytes it received.
    pub bytes_in: u64,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /v1/sandboxes/{id}/egress`: oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EgressLog {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its connections' records after the cursor.
    pub connections: Vec<EgressConnection>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presentation_takes_only_its_own_fields() {
        for text in [
            r#"{"type": "bearer", "name": "x"}"#,
            r#"{"type": "header", "name": "X", "extra": 1}"#,
            r#"{"type": "query"}"#,
            r#"{"type": "nothing"}"#,
        ] {
            assert!(
                serde_json::from_str::<SecretPresentation>(text).is_err(),
                "{text}"
            );
        }
        let ports: SecretTargetSpec =
            serde_json::from_str(r#"{"host": "h", "ports": [443.0, 8443]}"#).unwrap();
        assert_eq!(ports.ports, [443, 8443]);
        for bad in [r#"[0]"#, r#"[65536]"#, r#"[1.5]"#, r#"["443"]"#] {
            let text = format!(r#"{{"host": "h", "ports": {bad}}}"#);
            assert!(
                serde_json::from_str::<SecretTargetSpec>(&text).is_err(),
                "{bad}"
            );
        }
    }
}
