//! Streaming exec answers: NDJSON or server-sent events, chosen by `Accept`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use base64::Engine;
use warren_backend::{OutputChunk, OutputStream};
use warren_core::SandboxId;
use warren_protocol::{ErrorDetail, ExecEvent};
use warren_provisioner::{ExecInput, FencePermit};

use crate::sandboxes::exec_result;
use crate::{ApiError, ApiState};

/// How events are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamFormat {
    /// One JSON object per line.
    NdJson,
    /// `event: <type>` / `data: <json>` blocks.
    EventStream,
}

impl StreamFormat {
    pub(crate) fn from_accept(headers: &HeaderMap) -> Option<Self> {
        let accept = headers.get(header::ACCEPT)?.to_str().ok()?;
        if accept.contains("application/x-ndjson") {
            Some(Self::NdJson)
        } else if accept.contains("text/event-stream") {
            Some(Self::EventStream)
        } else {
            None
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Self::NdJson => "application/x-ndjson",
            Self::EventStream => "text/event-stream",
        }
    }

    fn frame(self, event: &ExecEvent) -> Bytes {
        // ExecEvent holds only strings and numbers: serialising cannot fail.
        let json = serde_json::to_string(event).unwrap_or_default();
        match self {
            Self::NdJson => Bytes::from(json + "\n"),
            Self::EventStream => {
                let name = match event {
                    ExecEvent::Stdout { .. } => "stdout",
                    ExecEvent::Stderr { .. } => "stderr",
                    ExecEvent::Exit { .. } => "exit",
                    ExecEvent::Error { .. } => "error",
                };
                Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
            }
        }
    }
}

/// Starts the exec and answers at once with a body that streams its events. When the client
/// goes away the body is dropped, the output sink closes, and the backend kills the command.
pub(crate) fn exec_stream(
    state: ApiState,
    id: SandboxId,
    input: ExecInput,
    format: StreamFormat,
    permit: FencePermit,
) -> Response {
    let (body_tx, body_rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let (chunk_tx, mut chunk_rx) = tokio::sync::mpsc::channel::<OutputChunk>(64);
    // The task keeps the request id, for a command forwarded to the runtime's owner.
    let request_id = crate::peer::current_request_id().unwrap_or_default();
    tokio::spawn(
        crate::peer::CURRENT_REQUEST_ID.scope(request_id, async move {
            let exec = state
                .provisioner
                .exec_fenced(&id, input, Some(chunk_tx), permit);
            tokio::pin!(exec);
            let engine = base64::engine::general_purpose::STANDARD;
            let mut client_gone = false;
            let result = loop {
                tokio::select! {
                    Some(chunk) = chunk_rx.recv() => {
                        let data = engine.encode(&chunk.bytes);
                        let event = match chunk.stream {
                            OutputStream::Stdout => ExecEvent::Stdout { data },
                            OutputStream::Stderr => ExecEvent::Stderr { data },
                        };
                        if body_tx.send(format.frame(&event)).await.is_err() {
                            client_gone = true;
                            chunk_rx.close();
                        }
                    }
                    // A silent command must not outlive its client either: notice the
                    // disconnect itself, not only a failed send.
                    () = body_tx.closed(), if !client_gone => {
                        client_gone = true;
                        // Closing the sink makes the backend kill the command's tree (I24).
                        chunk_rx.close();
                    }
                    result = &mut exec => break result,
                }
            };
            // Output that arrived after the command ended.
            while let Ok(chunk) = chunk_rx.try_recv() {
                let data = engine.encode(&chunk.bytes);
                let event = match chunk.stream {
                    OutputStream::Stdout => ExecEvent::Stdout { data },
                    OutputStream::Stderr => ExecEvent::Stderr { data },
                };
                let _ = body_tx.send(format.frame(&event)).await;
            }
            let last = match result {
                Ok(report) => ExecEvent::Exit {
                    result: exec_result(report),
                },
                Err(error) => {
                    let error = ApiError::from(error);
                    ExecEvent::Error {
                        error: ErrorDetail::new(error.code(), error.message()),
                    }
                }
            };
            let _ = body_tx.send(format.frame(&last)).await;
        }),
    );
    let stream = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    });
    streaming(format, Body::from_stream(stream))
}

/// A streaming answer in `format`: its content type, never cached, never buffered by a
/// proxy on the way.
pub(crate) fn streaming(format: StreamFormat, body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}
