//! The JSON shapes of E2B's control plane, as the SDKs read and write them (field names
//! are E2B's: `sandboxID`, `templateID`, `envVars`, ...). Requests ignore fields warren
//! has no use for (`mcp`, `volumeMounts`, `iam`, ...), as newer SDKs send more than older
//! servers know; what a field would change and warren cannot do is refused, not ignored.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Found;
use crate::error::ErrorBody;
use crate::state::{E2bNetwork, E2bSandbox};

/// `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewSandbox {
    /// The template (or its alias).
    #[serde(rename = "templateID")]
    pub(crate) template_id: String,
    /// Seconds until the sandbox is killed (or paused, with `autoPause`).
    pub(crate) timeout: Option<u64>,
    /// Pause instead of kill when the timeout passes.
    #[serde(default)]
    pub(crate) auto_pause: Option<bool>,
    /// Whether envd requires the access token (the SDKs send `true`).
    #[serde(default)]
    pub(crate) secure: Option<bool>,
    /// Whether the sandbox may reach the internet (default: yes). `false` is E2B's
    /// `denyOut: ["0.0.0.0/0"]`.
    #[serde(rename = "allow_internet_access", default)]
    pub(crate) allow_internet_access: Option<bool>,
    /// Egress rules and the settings of the sandbox's URLs.
    #[serde(default)]
    pub(crate) network: Option<NetworkConfig>,
    /// The caller's labels.
    #[serde(default)]
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    /// Environment for every command.
    #[serde(default)]
    pub(crate) env_vars: Option<BTreeMap<String, String>>,
}

/// `SandboxNetworkConfig`: create's `network`. What warren cannot do is refused where it
/// is read ([`super::network`]); `null` is the field's absence, as E2B reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkConfig {
    /// Destinations allowed even when `denyOut` refuses them: IP addresses, CIDR ranges,
    /// host names and `*.suffix`es.
    #[serde(default)]
    pub(crate) allow_out: Option<Vec<String>>,
    /// Destinations refused: IP addresses and CIDR ranges (`0.0.0.0/0` is all traffic);
    /// warren also takes host names and `*.suffix`es.
    #[serde(default)]
    pub(crate) deny_out: Option<Vec<String>>,
    /// Whether the sandbox's URLs take traffic without its traffic access token.
    #[serde(default)]
    pub(crate) allow_public_traffic: Option<bool>,
    /// DNS servers E2B's firewall opens when `allowOut` names a domain.
    #[serde(default)]
    pub(crate) dns_servers: Option<Vec<String>>,
    /// The `Host` requests to the sandbox's ports carry.
    #[serde(default)]
    pub(crate) mask_request_host: Option<String>,
    /// Ports of the sandbox served over HTTPS.
    #[serde(default)]
    pub(crate) https_ports: Option<Vec<serde_json::Value>>,
    /// A SOCKS5 proxy for the sandbox's egress.
    #[serde(default)]
    pub(crate) egress_proxy: Option<serde_json::Value>,
    /// Per-host transforms of egress requests.
    #[serde(default)]
    pub(crate) rules: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `SandboxNetworkConfig` as the detail shows it: what create was given.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_out: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deny_out: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_public_traffic: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_servers: Option<Vec<String>>,
}

impl From<&E2bNetwork> for NetworkInfo {
    fn from(network: &E2bNetwork) -> Self {
        Self {
            allow_out: network.allow_out.clone(),
            deny_out: network.deny_out.clone(),
            allow_public_traffic: network.allow_public_traffic,
            dns_servers: network.dns_servers.clone(),
        }
    }
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub(crate) struct TimeoutRequest {
    /// Seconds from now.
    pub(crate) timeout: u64,
}

/// `POST /sandboxes/{id}/refreshes`.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct RefreshRequest {
    /// Seconds from now (default: the sandbox's default timeout).
    pub(crate) duration: Option<u64>,
}

/// `POST /sandboxes/{id}/connect`, `/v2/.../connect` and `/resume`.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConnectRequest {
    /// Seconds from now.
    pub(crate) timeout: Option<u64>,
    /// `/resume` only: pause again when the timeout passes.
    pub(crate) auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct ForkRequest {
    /// Seconds each fork lives (the server's default timeout, as for create, when absent).
    pub(crate) timeout: Option<u64>,
    /// How many forks (default 1; the provisioner bounds it, 1 to 20).
    pub(crate) count: Option<u64>,
}

/// `SandboxForkResult`: one fork's entry in the answer, exactly one of `sandbox` (what
/// create answers for it) and `error` (why it could not start).
#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ForkResult {
    /// The fork, ready for commands.
    Sandbox(Sandbox),
    /// Why it did not start.
    Error(ErrorBody),
}

/// `Sandbox`: what create, fork, connect and resume answer.
#[derive(Debug, Serialize)]
pub(crate) struct Sandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    alias: Option<String>,
    #[serde(rename = "clientID")]
    client_id: String,
    #[serde(rename = "envdVersion")]
    envd_version: &'static str,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    /// What the SDKs send to the sandbox's other ports (the code interpreter's 49999):
    /// the same capability as the envd access token, so the same token.
    #[serde(rename = "trafficAccessToken", skip_serializing_if = "Option::is_none")]
    traffic_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
}

/// `SandboxDetail` (get) and `ListedSandbox` (list): the same fields, the detail with the
/// access token and domain.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxDetail {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    alias: Option<String>,
    #[serde(rename = "clientID")]
    client_id: String,
    started_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    envd_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    metadata: BTreeMap<String, String>,
    state: &'static str,
    allow_internet_access: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<NetworkInfo>,
}

/// The client id E2B reports (the node the sandbox runs on, in E2B's fleet): warren has
/// no such thing per sandbox, so a constant the SDKs accept.
const CLIENT_ID: &str = "warren";

impl Sandbox {
    /// The answer for `sandbox`, with its envd access token when it is secure.
    pub(crate) fn of(sandbox: &E2bSandbox, token: Option<String>, domain: Option<&str>) -> Self {
        Self {
            template_id: sandbox.template_id.clone(),
            sandbox_id: sandbox.sandbox_id.clone(),
            alias: sandbox.alias.clone(),
            client_id: CLIENT_ID.into(),
            envd_version: crate::envd::ENVD_VERSION,
            traffic_access_token: token.clone(),
            envd_access_token: token,
            domain: domain.map(str::to_owned),
        }
    }
}

impl SandboxDetail {
    /// The answer for `found`.
    pub(crate) fn of(
        found: &Found,
        token: Option<String>,
        domain: Option<&str>,
        disk_size_mb: u64,
    ) -> Self {
        let (sandbox, record) = (&found.e2b, &found.sandbox);
        Self {
            template_id: sandbox.template_id.clone(),
            sandbox_id: sandbox.sandbox_id.clone(),
            alias: sandbox.alias.clone(),
            client_id: CLIENT_ID.into(),
            started_at: record.created_at,
            // Every E2B sandbox has a deadline; one made before warren kept it in the
            // sandbox itself has none, shown as ten years on.
            end_at: record
                .settings
                .deadline
                .unwrap_or(record.created_at + chrono::Duration::days(3650)),
            envd_version: crate::envd::ENVD_VERSION,
            envd_access_token: token,
            domain: domain.map(str::to_owned),
            cpu_count: sandbox.cpu_count,
            memory_mb: sandbox.memory_mb,
            disk_size_mb,
            metadata: record.settings.labels.clone(),
            state: found.state().as_str(),
            allow_internet_access: sandbox.allow_internet_access,
            network: sandbox.network.as_ref().map(NetworkInfo::from),
        }
    }
}
