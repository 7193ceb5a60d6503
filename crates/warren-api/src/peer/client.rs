//! The forwarding side: [`PeerClient`] is the provisioner's [`PeerLink`] over HTTP.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt as _;
use warren_backend::{OutputChunk, OutputSink, OutputStream};
use warren_core::SandboxId;
use warren_provisioner::{
    ExecInput, ExecReport, FenceToken, OutputEvent, PeerLink, PeerNode, ProcessAnswer, ProcessCall,
    ProvisionerError,
};

use super::wire::{
    decode, EndRuntime, FileAnswered, ForwardedExec, ForwardedFile, Frame, Killed, Line,
    SnapshotTaken, StdinWritten, TakeSnapshot, SILENCE_LIMIT,
};
use super::{current_request_id, ClusterKey, REQUEST_ID_HEADER};

/// How long connecting to another replica may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Forwards runtime operations to the node that owns the runtime.
#[derive(Debug, Clone)]
pub struct PeerClient {
    http: reqwest::Client,
    key: ClusterKey,
}

impl PeerClient {
    /// A client that authenticates with `key`.
    pub fn new(key: ClusterKey) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // Node-to-node calls go to the advertised address, never through a proxy.
            .no_proxy()
            .build()
            .unwrap_or_default();
        Self { http, key }
    }

    fn post(&self, owner: &PeerNode, sandbox: &SandboxId, what: &str) -> reqwest::RequestBuilder {
        self.authorized(self.http.post(Self::url(owner, sandbox, what)))
    }

    fn url(owner: &PeerNode, sandbox: &SandboxId, what: &str) -> String {
        format!(
            "{}/internal/v1/sandboxes/{sandbox}/{what}",
            owner.advertise.trim_end_matches('/')
        )
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header(reqwest::header::AUTHORIZATION, self.key.header_value());
        match current_request_id() {
            Some(id) if !id.is_empty() => request.header(REQUEST_ID_HEADER, id),
            _ => request,
        }
    }

    async fn send(
        &self,
        owner: &PeerNode,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ProvisionerError> {
        self.send_within(owner, request, SILENCE_LIMIT).await
    }

    /// Sends `request`; its answer's head must come within `limit`.
    async fn send_within(
        &self,
        owner: &PeerNode,
        request: reqwest::RequestBuilder,
        limit: Duration,
    ) -> Result<reqwest::Response, ProvisionerError> {
        // A paused owner accepts the connection and never answers: the answer's head must
        // come within the silence limit (the body may take as long as the command).
        let response = match tokio::time::timeout(limit, request.send()).await {
            Ok(sent) => sent.map_err(|error| unreachable(owner, &error))?,
            Err(_) => {
                return Err(ProvisionerError::PeerUnreachable {
                    node: owner.node_id.clone(),
                    reason: format!("it did not answer within {} s", limit.as_secs()),
                })
            }
        };
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|error| unreachable(owner, &error))?;
        let field = |name: &str| {
            body.pointer(&format!("/error/{name}"))
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned()
        };
        Err(ProvisionerError::Forwarded {
            status,
            code: field("code"),
            message: field("message"),
        })
    }
}

fn unreachable(owner: &PeerNode, error: &reqwest::Error) -> ProvisionerError {
    tracing::warn!(node = %owner.node_id, advertise = %owner.advertise, %error, "a forwarded runtime operation failed on the way");
    ProvisionerError::PeerUnreachable {
        node: owner.node_id.clone(),
        reason: error.to_string(),
    }
}

#[async_trait::async_trait]
impl PeerLink for PeerClient {
    async fn exec(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        input: ExecInput,
        sink: Option<OutputSink>,
        fence: Option<FenceToken>,
    ) -> Result<ExecReport, ProvisionerError> {
        let body = ForwardedExec::new(input, sink.is_some(), fence.map(FenceToken::get));
        let response = self
            .send(owner, self.post(owner, sandbox, "exec").json(&body))
            .await?;
        let mut lines = Lines::new(response, owner);
        let bad = |what: &str| ProvisionerError::PeerUnreachable {
            node: owner.node_id.clone(),
            reason: what.to_owned(),
        };
        loop {
            let frame = tokio::select! {
                // No heartbeat within the silence limit: the owner is paused, cut off or
                // gone. Dropping the answer closes the connection; an owner that wakes
                // kills the command.
                frame = lines.frame::<Frame>() => frame?.ok_or_else(|| lines.ended("the command's result"))?,
                // The caller's client left: dropping the response closes the connection,
                // and the owner kills the command (I24).
                () = closed(sink.as_ref()) => {
                    return Err(ProvisionerError::Forwarded {
                        status: 499,
                        code: "client_disconnected".into(),
                        message: "the client went away".into(),
                    });
                }
            };
            match frame {
                Frame::Alive => {}
                Frame::Stdout(data) => {
                    let bytes = decode(&data).ok_or_else(|| bad("output is not base64"))?;
                    forward(sink.as_ref(), OutputStream::Stdout, bytes).await;
                }
                Frame::Stderr(data) => {
                    let bytes = decode(&data).ok_or_else(|| bad("output is not base64"))?;
                    forward(sink.as_ref(), OutputStream::Stderr, bytes).await;
                }
                Frame::Report(report) => return report.into_report().map_err(bad),
                Frame::Error(error) => return Err(error.into_error()),
            }
        }
    }

    async fn snapshot_runtime(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        reason: &str,
    ) -> Result<String, ProvisionerError> {
        let body = TakeSnapshot {
            reason: reason.to_owned(),
        };
        // A snapshot takes as long as the runtime's state is large: only the answer's
        // head is bounded (see `send`), the owner's own limits bound the rest.
        let response = self
            .send(owner, self.post(owner, sandbox, "snapshot").json(&body))
            .await?;
        let taken: SnapshotTaken = response
            .json()
            .await
            .map_err(|error| unreachable(owner, &error))?;
        Ok(taken.snapshot_id)
    }

    async fn runtime_file(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        op: &warren_backend::FileOp,
        data: Vec<u8>,
    ) -> Result<warren_backend::FileReply, ProvisionerError> {
        let body = ForwardedFile::new(op, &data);
        let response = self
            .send(owner, self.post(owner, sandbox, "file").json(&body))
            .await?;
        let answered: FileAnswered = response
            .json()
            .await
            .map_err(|error| unreachable(owner, &error))?;
        answered
            .into_reply()
            .ok_or_else(|| ProvisionerError::PeerUnreachable {
                node: owner.node_id.clone(),
                reason: "a file answer whose bytes are not base64".into(),
            })
    }

    async fn kill_processes(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
    ) -> Result<u64, ProvisionerError> {
        let response = self.send(owner, self.post(owner, sandbox, "kill")).await?;
        let killed: Killed = response
            .json()
            .await
            .map_err(|error| unreachable(owner, &error))?;
        Ok(killed.killed)
    }

    async fn end_runtime(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        grace: Duration,
    ) -> Result<(), ProvisionerError> {
        let body = EndRuntime {
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
        };
        self.send(owner, self.post(owner, sandbox, "end-runtime").json(&body))
            .await?;
        Ok(())
    }

    async fn process_call(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        call: ProcessCall,
    ) -> Result<ProcessAnswer, ProvisionerError> {
        let request = self.post(owner, sandbox, "processes/call").json(&call);
        let response = self.send(owner, request).await?;
        let mut lines = Lines::new(response, owner);
        lines
            .next()
            .await?
            .ok_or_else(|| lines.ended("the call's result"))
    }

    async fn follow_process(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        pid: i32,
        from: u64,
    ) -> Result<BoxStream<'static, OutputEvent>, ProvisionerError> {
        let url = Self::url(owner, sandbox, &format!("processes/{pid}/follow"));
        let request = self.authorized(self.http.get(url).query(&[("from", from)]));
        let response = self.send(owner, request).await?;
        let lines = Lines::new(response, owner);
        Ok(futures::stream::unfold(lines, |mut lines| async move {
            match lines.next::<OutputEvent>().await {
                Ok(Some(event)) => Some((event, lines)),
                Ok(None) => None,
                Err(error) => {
                    // The reader sees its stream end without the process's end, and
                    // resumes from its offset.
                    tracing::warn!(node = %lines.owner.node_id, %error, "following a process at its runtime's owner stopped");
                    None
                }
            }
        })
        .boxed())
    }

    async fn write_stdin(
        &self,
        owner: &PeerNode,
        sandbox: &SandboxId,
        pid: i32,
        chunks: BoxStream<'static, std::io::Result<Vec<u8>>>,
        close: bool,
    ) -> Result<u64, ProvisionerError> {
        let request = self
            .post(owner, sandbox, &format!("processes/{pid}/stdin"))
            .query(&[("close", close)])
            .body(reqwest::Body::wrap_stream(chunks));
        // The answer comes once the process read the whole body, which takes as long as
        // it takes: only the caller going away bounds it.
        let response = self.send_within(owner, request, Duration::MAX).await?;
        let written: StdinWritten = response
            .json()
            .await
            .map_err(|error| unreachable(owner, &error))?;
        Ok(written.written)
    }
}

/// The longest answer line taken from an owner: far more than the largest (a listing of
/// every process, or one read of output as base64).
const MAX_LINE: usize = 16 << 20;

/// The lines of an owner's NDJSON answer ([`Line`]), each within the silence limit.
struct Lines {
    response: reqwest::Response,
    pending: Vec<u8>,
    owner: PeerNode,
}

impl Lines {
    fn new(response: reqwest::Response, owner: &PeerNode) -> Self {
        Self {
            response,
            pending: Vec::new(),
            owner: owner.clone(),
        }
    }

    /// The next item of a [`Line`] answer; `None` when the answer ended. Heartbeats are
    /// skipped; an error line is the owner's error.
    async fn next<T: serde::de::DeserializeOwned>(
        &mut self,
    ) -> Result<Option<T>, ProvisionerError> {
        loop {
            match self.frame::<Line<T>>().await? {
                Some(Line::Alive) => {}
                Some(Line::Item(item)) => return Ok(Some(item)),
                Some(Line::Error(error)) => return Err(error.into_error()),
                None => return Ok(None),
            }
        }
    }

    /// The next line, parsed as `F`; `None` when the answer ended. Each read waits at most
    /// the silence limit, and a line may be at most [`MAX_LINE`] long. Cancel-safe: a read
    /// dropped before it returned takes nothing from the answer.
    async fn frame<F: serde::de::DeserializeOwned>(
        &mut self,
    ) -> Result<Option<F>, ProvisionerError> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return serde_json::from_slice(&line).map(Some).map_err(|error| {
                    ProvisionerError::PeerUnreachable {
                        node: self.owner.node_id.clone(),
                        reason: format!("an answer line is not understood: {error}"),
                    }
                });
            }
            if self.pending.len() > MAX_LINE {
                return Err(ProvisionerError::PeerUnreachable {
                    node: self.owner.node_id.clone(),
                    reason: format!("an answer line is longer than {MAX_LINE} bytes"),
                });
            }
            let chunk = tokio::time::timeout(SILENCE_LIMIT, self.response.chunk())
                .await
                .map_err(|_| ProvisionerError::PeerUnreachable {
                    node: self.owner.node_id.clone(),
                    reason: format!("it sent nothing for {} s", SILENCE_LIMIT.as_secs()),
                })?
                .map_err(|error| unreachable(&self.owner, &error))?;
            match chunk {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }

    /// The answer ended before `what` came.
    fn ended(&self, what: &str) -> ProvisionerError {
        ProvisionerError::PeerUnreachable {
            node: self.owner.node_id.clone(),
            reason: format!("the answer ended before {what}"),
        }
    }
}

async fn forward(sink: Option<&OutputSink>, stream: OutputStream, bytes: Vec<u8>) {
    if let Some(sink) = sink {
        let _ = sink.send(OutputChunk { stream, bytes }).await;
    }
}

/// Resolves once the caller's sink is closed; never without a sink.
async fn closed(sink: Option<&OutputSink>) {
    match sink {
        Some(sink) => sink.closed().await,
        None => std::future::pending().await,
    }
}
