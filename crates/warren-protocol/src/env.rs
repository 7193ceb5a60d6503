//! Wire types of a uid's agent environment (`/v1/users/{uid}/env`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One value in `PUT /v1/users/{uid}/env`: a bare string is a secret; the object form says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum AgentEnvValue {
    /// A secret value: masked in command output.
    Secret(String),
    /// A value with its secrecy stated.
    Detailed(SetAgentEnvVar),
}

/// A string or an object, as documented: serde's untagged derive would also read the
/// object form from an array.
impl<'de> Deserialize<'de> for AgentEnvValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(value) => Ok(Self::Secret(value)),
            value @ serde_json::Value::Object(_) => serde_json::from_value(value)
                .map(Self::Detailed)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "expected a string (a secret) or an object {\"value\", \"secret\"}",
            )),
        }
    }
}

/// `PUT /v1/users/{uid}/env/{name}`, and the object form of [`AgentEnvValue`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetAgentEnvVar {
    /// The value (at most 32 KiB, no NUL byte).
    pub value: String,
    /// Whether the value is masked in command output (default true). A secret is at least
    /// 6 bytes long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
}

/// `PUT /v1/users/{uid}/env`: the uid's whole agent environment, replacing the old one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaceAgentEnv {
    /// Variable name → value. Names are `[A-Za-z_][A-Za-z0-9_]*`; at most 256 variables.
    pub env: BTreeMap<String, AgentEnvValue>,
}

/// One variable as read back: never its value (I13).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentEnvEntry {
    /// The name.
    pub name: String,
    /// Whether the value is masked in command output.
    pub secret: bool,
    /// The value's length in bytes.
    pub length: usize,
    /// The last four characters, for values of 16 characters or more; nothing otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// RFC 3339: when it was last set.
    pub updated_at: String,
}

/// `GET /v1/users/{uid}/env`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentEnv {
    /// The uid.
    pub uid: String,
    /// Its variables, by name.
    pub variables: Vec<AgentEnvEntry>,
}
