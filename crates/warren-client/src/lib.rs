//! A typed HTTP client for warren's `/v1` API, used by the CLI (and later by MCP over stdio).
//!
//! Errors keep the server's stable code and message, so a caller can both branch on the
//! code and show the message to a person.

#![deny(missing_docs)]

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use warren_protocol::{
    AgentEnv, AgentEnvEntry, CheckpointCreated, CheckpointDiff, CheckpointInfo, CheckpointList,
    CreateGuard, CreateSandbox, CreateWorkdir, ErrorBody, ExecCommand, ExecResult, FileList,
    GuardInfo, MergeConflictInfo, ProcessInfo, ProcessList, RenewGuard, RunList, SandboxInfo,
    SandboxList, SetAgentEnvVar, StartProcess, WorkdirInfo, WriteResult,
};

mod branches;
mod mcp_bridge;
mod secrets;

pub use secrets::SecretOwner;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not a usable http(s) URL.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it is unusable.
        reason: String,
    },
    /// The server could not be reached.
    #[error("could not reach warren at {url}: {source}")]
    Connect {
        /// The server's base URL.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code.
        code: String,
        /// The server's message.
        message: String,
        /// With `merge_conflict`: each path the merge could not combine, with the baseline,
        /// ours and theirs (empty for every other error).
        conflicts: Vec<MergeConflictInfo>,
    },
    /// The server's answer could not be understood.
    #[error("unexpected answer from warren (HTTP {status}): {detail}")]
    Decode {
        /// The HTTP status.
        status: u16,
        /// What could not be decoded.
        detail: String,
    },
    /// The WebSocket of a terminal could not be opened.
    #[error("could not attach to the process: {0}")]
    Attach(String),
    /// Reading standard input failed (the MCP stdio bridge).
    #[error("could not read standard input: {0}")]
    Stdin(#[source] std::io::Error),
}

/// A client of one warren server.
#[derive(Debug, Clone)]
pub struct WarrenClient {
    base: String,
    token: String,
    http: reqwest::Client,
    /// The execution guard token sent as `X-Warren-Fence` with every mutating call: a
    /// number's digits, so always a valid header value.
    fence: Option<String>,
}

/// The header a mutating call carries its execution guard token in (I33).
pub const FENCE_HEADER: &str = "x-warren-fence";

impl WarrenClient {
    /// A client for the server at `base_url` (e.g. `http://127.0.0.1:7878`) using `token`.
    pub fn new(base_url: &str, token: &str) -> Result<Self, ClientError> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::InvalidUrl {
                url: base_url.to_owned(),
                reason: "it must start with http:// or https://".into(),
            });
        }
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| ClientError::InvalidUrl {
                url: base_url.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            base,
            token: token.to_owned(),
            http,
            fence: None,
        })
    }

    /// Sends `token` as `X-Warren-Fence` with every call that changes a sandbox (exec,
    /// kill, file writes, checkpoints, snapshots, termination, MCP): the server refuses
    /// each with 409 `fence_stale` once a newer guard holder took over.
    pub fn with_fence(mut self, token: Option<u64>) -> Self {
        self.fence = token.map(|token| token.to_string());
        self
    }

    /// A request that changes a sandbox: fenced when a token was given.
    fn mutating(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.request(method, path);
        match &self.fence {
            Some(token) => request.header(FENCE_HEADER, token),
            None => request,
        }
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    async fn send(&self, request: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let response = request
            .send()
            .await
            .map_err(|source| ClientError::Connect {
                url: self.base.clone(),
                source,
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(error_of(status.as_u16(), text.as_bytes()))
    }

    async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ClientError> {
        let response = self.send(request).await?;
        let status = response.status();
        response.json().await.map_err(|e| ClientError::Decode {
            status: status.as_u16(),
            detail: e.to_string(),
        })
    }

    /// `POST /v1/users/{uid}/workdirs`.
    pub async fn create_workdir(
        &self,
        uid: &str,
        path: Option<&str>,
    ) -> Result<WorkdirInfo, ClientError> {
        let body = CreateWorkdir {
            path: path.map(str::to_owned),
            init: None,
        };
        self.json(
            self.request(Method::POST, &format!("/v1/users/{}/workdirs", encode(uid)))
                .json(&body),
        )
        .await
    }

    /// `POST /v1/sandboxes`.
    pub async fn create_sandbox(
        &self,
        request: &CreateSandbox,
    ) -> Result<SandboxInfo, ClientError> {
        self.json(self.request(Method::POST, "/v1/sandboxes").json(request))
            .await
    }

    /// `GET /v1/sandboxes`: of one uid, in one state, carrying every label (`key=value`).
    pub async fn list_sandboxes(
        &self,
        uid: Option<&str>,
        state: Option<&str>,
        labels: &[String],
    ) -> Result<SandboxList, ClientError> {
        let mut query: Vec<(&str, &str)> = Vec::new();
        query.extend(uid.map(|uid| ("uid", uid)));
        query.extend(state.map(|state| ("state", state)));
        query.extend(labels.iter().map(|label| ("label", label.as_str())));
        self.json(self.request(Method::GET, "/v1/sandboxes").query(&query))
            .await
    }

    /// `PATCH /v1/sandboxes/{id}`: its deadline or labels.
    pub async fn update_sandbox(
        &self,
        id: &str,
        update: &warren_protocol::UpdateSandbox,
    ) -> Result<SandboxInfo, ClientError> {
        self.json(
            self.mutating(Method::PATCH, &format!("/v1/sandboxes/{}", encode(id)))
                .json(update),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/pause`.
    pub async fn pause_sandbox(
        &self,
        id: &str,
    ) -> Result<warren_protocol::PausedSandbox, ClientError> {
        self.json(self.mutating(Method::POST, &format!("/v1/sandboxes/{}/pause", encode(id))))
            .await
    }

    /// `POST /v1/sandboxes/{id}/fork`.
    pub async fn fork_sandbox(
        &self,
        id: &str,
        request: &warren_protocol::ForkSandbox,
    ) -> Result<warren_protocol::ForkedSandboxes, ClientError> {
        self.json(
            self.mutating(Method::POST, &format!("/v1/sandboxes/{}/fork", encode(id)))
                .json(request),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub async fn resume_sandbox(
        &self,
        id: &str,
        timeout_s: Option<u64>,
    ) -> Result<SandboxInfo, ClientError> {
        let body = warren_protocol::ResumeSandbox { timeout_s };
        self.json(
            self.mutating(
                Method::POST,
                &format!("/v1/sandboxes/{}/resume", encode(id)),
            )
            .json(&body),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/watch`: the watch's answer, whose body streams NDJSON
    /// [`warren_protocol::WatchEvent`] lines.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<reqwest::Response, ClientError> {
        let recursive = if recursive { "true" } else { "false" };
        self.send(
            self.request(Method::GET, &format!("/v1/sandboxes/{}/watch", encode(id)))
                .query(&[("path", path), ("recursive", recursive)])
                .header(reqwest::header::ACCEPT, "application/x-ndjson"),
        )
        .await
    }

    /// `DELETE /v1/sandboxes/{id}`.
    pub async fn remove_sandbox(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.json(self.mutating(Method::DELETE, &format!("/v1/sandboxes/{}", encode(id))))
            .await
    }

    /// `POST /v1/sandboxes/{id}/kill`: every process of the sandbox but its runtime's own.
    pub async fn kill_processes(
        &self,
        id: &str,
    ) -> Result<warren_protocol::KilledProcesses, ClientError> {
        self.json(self.mutating(Method::POST, &format!("/v1/sandboxes/{}/kill", encode(id))))
            .await
    }

    /// `POST /v1/sandboxes/{id}/checkpoints`.
    pub async fn create_checkpoint(&self, id: &str) -> Result<CheckpointCreated, ClientError> {
        self.json(self.mutating(
            Method::POST,
            &format!("/v1/sandboxes/{}/checkpoints", encode(id)),
        ))
        .await
    }

    /// `GET /v1/sandboxes/{id}/checkpoints`.
    pub async fn list_checkpoints(&self, id: &str) -> Result<CheckpointList, ClientError> {
        self.json(self.request(
            Method::GET,
            &format!("/v1/sandboxes/{}/checkpoints", encode(id)),
        ))
        .await
    }

    /// `GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/diff`.
    pub async fn checkpoint_diff(
        &self,
        id: &str,
        checkpoint: &str,
    ) -> Result<CheckpointDiff, ClientError> {
        self.json(self.request(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/checkpoints/{}/diff",
                encode(id),
                encode(checkpoint)
            ),
        ))
        .await
    }

    /// `POST /v1/sandboxes/{id}/checkpoints/{checkpoint}/restore`.
    pub async fn restore_checkpoint(
        &self,
        id: &str,
        checkpoint: &str,
    ) -> Result<CheckpointInfo, ClientError> {
        self.json(self.mutating(
            Method::POST,
            &format!(
                "/v1/sandboxes/{}/checkpoints/{}/restore",
                encode(id),
                encode(checkpoint)
            ),
        ))
        .await
    }

    /// `POST /v1/sandboxes/{id}/snapshots`: a runtime snapshot.
    pub async fn create_snapshot(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        self.json(self.mutating(
            Method::POST,
            &format!("/v1/sandboxes/{}/snapshots", encode(id)),
        ))
        .await
    }

    /// `GET /v1/sandboxes/{id}/snapshots`.
    pub async fn list_snapshots(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        self.json(self.request(
            Method::GET,
            &format!("/v1/sandboxes/{}/snapshots", encode(id)),
        ))
        .await
    }

    /// `POST /v1/users/{uid}/snapshots/gc`.
    pub async fn collect_snapshot_garbage(
        &self,
        uid: &str,
    ) -> Result<serde_json::Value, ClientError> {
        self.json(self.request(
            Method::POST,
            &format!("/v1/users/{}/snapshots/gc", encode(uid)),
        ))
        .await
    }

    /// `GET /v1/users/{uid}/env`: names, lengths and hints, never values.
    pub async fn agent_env(&self, uid: &str) -> Result<AgentEnv, ClientError> {
        self.json(self.request(Method::GET, &format!("/v1/users/{}/env", encode(uid))))
            .await
    }

    /// `PUT /v1/users/{uid}/env/{name}`.
    pub async fn set_agent_env_var(
        &self,
        uid: &str,
        name: &str,
        value: &SetAgentEnvVar,
    ) -> Result<AgentEnvEntry, ClientError> {
        self.json(
            self.request(
                Method::PUT,
                &format!("/v1/users/{}/env/{}", encode(uid), encode(name)),
            )
            .json(value),
        )
        .await
    }

    /// `DELETE /v1/users/{uid}/env/{name}`.
    pub async fn remove_agent_env_var(&self, uid: &str, name: &str) -> Result<(), ClientError> {
        self.send(self.request(
            Method::DELETE,
            &format!("/v1/users/{}/env/{}", encode(uid), encode(name)),
        ))
        .await
        .map(drop)
    }

    /// `POST /v1/sandboxes/{id}/exec`.
    pub async fn exec(&self, id: &str, command: &ExecCommand) -> Result<ExecResult, ClientError> {
        self.json(
            self.mutating(Method::POST, &format!("/v1/sandboxes/{}/exec", encode(id)))
                .json(command),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/files`: the bytes of a file.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, ClientError> {
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/sandboxes/{}/files", encode(id)))
                    .query(&[("path", path)]),
            )
            .await?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| ClientError::Decode {
            status: status.as_u16(),
            detail: e.to_string(),
        })?;
        Ok(bytes.to_vec())
    }

    /// `PUT /v1/sandboxes/{id}/files`: writes a whole file.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        bytes: Vec<u8>,
    ) -> Result<WriteResult, ClientError> {
        self.json(
            self.mutating(Method::PUT, &format!("/v1/sandboxes/{}/files", encode(id)))
                .query(&[("path", path)])
                .body(bytes),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/files/list`.
    pub async fn list_files(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<FileList, ClientError> {
        self.json(
            self.request(
                Method::GET,
                &format!("/v1/sandboxes/{}/files/list", encode(id)),
            )
            .query(&[("path", path), ("depth", &depth.to_string())]),
        )
        .await
    }
}

/// The execution guard (I33).
impl WarrenClient {
    /// `POST /v1/sandboxes/{id}/guard`: 409 `guard_held` while another holder has it.
    pub async fn acquire_guard(
        &self,
        id: &str,
        holder: &str,
        ttl_s: u64,
    ) -> Result<GuardInfo, ClientError> {
        self.json(
            self.request(Method::POST, &format!("/v1/sandboxes/{}/guard", encode(id)))
                .json(&CreateGuard {
                    holder: holder.to_owned(),
                    ttl_s,
                }),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/guard/renew`: 404 `guard_not_found` once it lapsed.
    pub async fn renew_guard(
        &self,
        id: &str,
        token: u64,
        ttl_s: Option<u64>,
    ) -> Result<GuardInfo, ClientError> {
        self.json(
            self.request(
                Method::POST,
                &format!("/v1/sandboxes/{}/guard/renew", encode(id)),
            )
            .json(&RenewGuard { token, ttl_s }),
        )
        .await
    }

    /// `DELETE /v1/sandboxes/{id}/guard?token=`.
    pub async fn release_guard(&self, id: &str, token: u64) -> Result<(), ClientError> {
        self.send(
            self.request(
                Method::DELETE,
                &format!("/v1/sandboxes/{}/guard", encode(id)),
            )
            .query(&[("token", token)]),
        )
        .await
        .map(drop)
    }

    /// `GET /v1/sandboxes/{id}/guard`: 404 `guard_not_found` when nobody holds it.
    pub async fn current_guard(&self, id: &str) -> Result<GuardInfo, ClientError> {
        self.json(self.request(Method::GET, &format!("/v1/sandboxes/{}/guard", encode(id))))
            .await
    }
}

impl ClientError {
    /// The HTTP status of an API error, if this is one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Api { status, .. } | Self::Decode { status, .. } => {
                StatusCode::from_u16(*status).ok()
            }
            _ => None,
        }
    }

    /// The server's stable error code, if the server answered with an error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The conflicts of a refused merge (409 `merge_conflict`); empty for any other error.
    pub fn conflicts(&self) -> &[MergeConflictInfo] {
        match self {
            Self::Api { conflicts, .. } => conflicts,
            _ => &[],
        }
    }
}

/// The error an answer of HTTP `status` with `body` stands for: the server's code,
/// message and details when the body is its error JSON.
fn error_of(status: u16, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(body) => ClientError::Api {
            status,
            code: body.error.code,
            message: body.error.message,
            conflicts: body.error.conflicts.unwrap_or_default(),
        },
        Err(_) => ClientError::Decode {
            status,
            detail: String::from_utf8_lossy(body).chars().take(200).collect(),
        },
    }
}

/// A process's terminal over a WebSocket ([`WarrenClient::attach`]).
pub type Attached =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl WarrenClient {
    /// `POST /v1/sandboxes/{id}/processes`.
    pub async fn start_process(
        &self,
        id: &str,
        request: &StartProcess,
    ) -> Result<ProcessInfo, ClientError> {
        self.json(
            self.mutating(
                Method::POST,
                &format!("/v1/sandboxes/{}/processes", encode(id)),
            )
            .json(request),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn list_processes(&self, id: &str) -> Result<ProcessList, ClientError> {
        self.json(self.request(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes", encode(id)),
        ))
        .await
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/kill`.
    pub async fn kill_process(&self, id: &str, pid: i32) -> Result<ProcessInfo, ClientError> {
        self.json(self.mutating(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes/{pid}/kill", encode(id)),
        ))
        .await
    }

    /// `GET /v1/sandboxes/{id}/runs` (with `sandbox`) or `GET /v1/users/{uid}/runs`.
    pub async fn list_runs(
        &self,
        scope: RunsOf<'_>,
        status: Option<&str>,
        limit: Option<u32>,
        page_token: Option<&str>,
    ) -> Result<RunList, ClientError> {
        let path = match scope {
            RunsOf::Sandbox(id) => format!("/v1/sandboxes/{}/runs", encode(id)),
            RunsOf::Uid(uid) => format!("/v1/users/{}/runs", encode(uid)),
        };
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(status) = status {
            query.push(("status", status.to_owned()));
        }
        if let Some(limit) = limit {
            query.push(("limit", limit.to_string()));
        }
        if let Some(token) = page_token {
            query.push(("page_token", token.to_owned()));
        }
        self.json(self.request(Method::GET, &path).query(&query))
            .await
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}/attach`: the process's terminal over a
    /// WebSocket, its output from offset `from`.
    pub async fn attach(&self, id: &str, pid: i32, from: u64) -> Result<Attached, ClientError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let Some(rest) = self.base.strip_prefix("http://") else {
            return Err(ClientError::InvalidUrl {
                url: self.base.clone(),
                reason: "attaching to a terminal needs a plain http:// server URL".into(),
            });
        };
        let url = format!(
            "ws://{rest}/v1/sandboxes/{}/processes/{pid}/attach?from={from}",
            encode(id)
        );
        let mut request =
            url.as_str()
                .into_client_request()
                .map_err(|e| ClientError::InvalidUrl {
                    url: url.clone(),
                    reason: e.to_string(),
                })?;
        let header = |value: &str| {
            value.parse().map_err(|_| ClientError::InvalidUrl {
                url: url.clone(),
                reason: "the token is not a valid header value".into(),
            })
        };
        request
            .headers_mut()
            .insert("authorization", header(&format!("Bearer {}", self.token))?);
        if let Some(fence) = &self.fence {
            request.headers_mut().insert(FENCE_HEADER, header(fence)?);
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let status = response.status().as_u16();
                let body = response.body().clone().unwrap_or_default();
                Err(error_of(status, &body))
            }
            Err(error) => Err(ClientError::Attach(error.to_string())),
        }
    }
}

/// Whose runs [`WarrenClient::list_runs`] lists.
#[derive(Debug, Clone, Copy)]
pub enum RunsOf<'a> {
    /// One sandbox's.
    Sandbox(&'a str),
    /// Every sandbox's of one uid.
    Uid(&'a str),
}

/// Percent-encodes one path segment (ids and uids may hold any character).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("alice"), "alice");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
        assert_eq!(encode("../x"), "..%2Fx");
    }

    #[test]
    fn a_merge_conflict_keeps_its_conflicts() {
        let body = br#"{"error":{"code":"merge_conflict","message":"m","conflicts":[
            {"path":"a.txt","branch":"b1","reason":"r","base":{"type":"absent"},
             "ours":{"type":"text","text":"x\n","mode":420},
             "theirs":{"type":"binary","size":3,"hash":"abc","mode":420}}]}}"#;
        let error = error_of(409, body);
        assert_eq!(error.code(), Some("merge_conflict"));
        assert_eq!(error.conflicts().len(), 1);
        assert_eq!(error.conflicts()[0].path, "a.txt");
        let other = error_of(
            404,
            br#"{"error":{"code":"branch_not_found","message":"m"}}"#,
        );
        assert!(other.conflicts().is_empty());
    }

    #[test]
    fn non_http_urls_are_refused() {
        assert!(WarrenClient::new("ftp://x", "t").is_err());
        assert!(WarrenClient::new("http://127.0.0.1:7878/", "t").is_ok());
    }
}
