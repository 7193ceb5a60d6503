//! `warren mcp`: a sandbox's MCP server for clients that launch tools as processes.
//!
//! A byte-level bridge between stdio (newline-delimited JSON-RPC, the MCP stdio transport)
//! and the server's streamable HTTP endpoint `/v1/sandboxes/{id}/mcp`. Every message read
//! from stdin is POSTed; the answer, plain JSON or a server-sent event stream, goes to
//! stdout one message per line. The tools themselves run in the server, so both transports
//! behave exactly alike.

use std::sync::{Arc, Mutex};

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::{encode, ClientError, WarrenClient};

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// What the bridge learns from the server and repeats on every later request.
#[derive(Default)]
struct Negotiated {
    session: Option<HeaderValue>,
    version: Option<HeaderValue>,
}

impl WarrenClient {
    /// Bridges stdin/stdout to the MCP endpoint of `sandbox` until stdin closes.
    pub async fn mcp_stdio_bridge(&self, sandbox: &str) -> Result<(), ClientError> {
        let url = format!("{}/v1/sandboxes/{}/mcp", self.base, encode(sandbox));
        let negotiated = Arc::new(Mutex::new(Negotiated::default()));
        let (out_sender, mut out_receiver) = tokio::sync::mpsc::channel::<String>(64);
        let writer = tokio::spawn(async move {
            let mut stdout = tokio::io::stdout();
            while let Some(line) = out_receiver.recv().await {
                if stdout.write_all(line.as_bytes()).await.is_err()
                    || stdout.write_all(b"\n").await.is_err()
                    || stdout.flush().await.is_err()
                {
                    break;
                }
            }
        });
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut in_flight = tokio::task::JoinSet::new();
        loop {
            let line = match lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(source) => return Err(ClientError::Stdin(source)),
            };
            if line.trim().is_empty() {
                continue;
            }
            let message: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let is_initialize = message.get("method") == Some(&json!("initialize"));
            let id = message.get("id").cloned();
            // The initialize answer carries the session and version every later request
            // needs: wait for it before reading on.
            let send = self.forward(
                url.clone(),
                line,
                negotiated.clone(),
                out_sender.clone(),
                id,
            );
            if is_initialize {
                send.await;
            } else {
                in_flight.spawn(send);
            }
        }
        while in_flight.join_next().await.is_some() {}
        let session = negotiated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .session
            .clone();
        if let Some(session) = session {
            // Best effort: the server also drops idle sessions on its own.
            let _ = self
                .http
                .delete(&url)
                .bearer_auth(&self.token)
                .header(SESSION_HEADER, session)
                .send()
                .await;
        }
        drop(out_sender);
        let _ = writer.await;
        Ok(())
    }

    /// POSTs one message and writes every message of the answer to `out`.
    fn forward(
        &self,
        url: String,
        body: String,
        negotiated: Arc<Mutex<Negotiated>>,
        out: tokio::sync::mpsc::Sender<String>,
        id: Option<Value>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let http = self.http.clone();
        let token = self.token.clone();
        // The guard token (`--fence`) fences the tools that change the sandbox, as on
        // every other mutating route.
        // Digits only (`with_fence` takes a number), so the conversion cannot fail.
        let fence = self
            .fence
            .as_deref()
            .and_then(|fence| HeaderValue::from_str(fence).ok());
        async move {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Some(fence) = fence {
                headers.insert(crate::FENCE_HEADER, fence);
            }
            headers.insert(
                ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            {
                let known = negotiated.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(session) = &known.session {
                    headers.insert(SESSION_HEADER, session.clone());
                }
                if let Some(version) = &known.version {
                    headers.insert(VERSION_HEADER, version.clone());
                }
            }
            let answer = http
                .post(&url)
                .bearer_auth(&token)
                .headers(headers)
                .body(body)
                .send()
                .await;
            let mut response = match answer {
                Ok(response) => response,
                Err(error) => {
                    reply_error(&out, id, format!("cannot reach warren at {url}: {error}")).await;
                    return;
                }
            };
            if let Some(session) = response.headers().get(SESSION_HEADER) {
                negotiated.lock().unwrap_or_else(|e| e.into_inner()).session =
                    Some(session.clone());
            }
            let status = response.status();
            if !status.is_success() {
                let text = response.text().await.unwrap_or_default();
                let hint = if status.as_u16() == 401 {
                    " (WARREN_TOKEN must be the server's token)"
                } else {
                    ""
                };
                reply_error(
                    &out,
                    id,
                    format!("warren answered {status}{hint}: {}", text.trim()),
                )
                .await;
                return;
            }
            let event_stream = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut pending = Vec::new();
            let mut data = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                if !event_stream {
                    pending.extend_from_slice(&chunk);
                    continue;
                }
                pending.extend_from_slice(&chunk);
                // One SSE line at a time; an empty line ends an event.
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&line);
                    let line = line.trim_end_matches(['\r', '\n']);
                    if line.is_empty() {
                        if !data.is_empty() {
                            emit(&out, &negotiated, std::mem::take(&mut data)).await;
                        }
                    } else if let Some(value) = line.strip_prefix("data:") {
                        if !data.is_empty() {
                            data.push('\n');
                        }
                        data.push_str(value.strip_prefix(' ').unwrap_or(value));
                    }
                }
            }
            if event_stream {
                if !data.is_empty() {
                    emit(&out, &negotiated, data).await;
                }
            } else if !pending.is_empty() {
                emit(
                    &out,
                    &negotiated,
                    String::from_utf8_lossy(&pending).into_owned(),
                )
                .await;
            }
        }
    }
}

/// Writes one JSON-RPC message (or batch) as one line, noting a negotiated protocol version.
async fn emit(
    out: &tokio::sync::mpsc::Sender<String>,
    negotiated: &Mutex<Negotiated>,
    text: String,
) {
    let Ok(message) = serde_json::from_str::<Value>(&text) else {
        return;
    };
    if let Some(version) = message
        .pointer("/result/protocolVersion")
        .and_then(Value::as_str)
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        negotiated.lock().unwrap_or_else(|e| e.into_inner()).version = Some(version);
    }
    let _ = out.send(message.to_string()).await;
}

/// Answers a request the server could not answer, so the client is not left waiting.
async fn reply_error(out: &tokio::sync::mpsc::Sender<String>, id: Option<Value>, message: String) {
    eprintln!("warren mcp: {message}");
    if let Some(id) = id {
        let answer = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32000, "message": message},
        });
        let _ = out.send(answer.to_string()).await;
    }
}
