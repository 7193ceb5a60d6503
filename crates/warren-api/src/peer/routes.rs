//! The owner's side: `/internal/v1/sandboxes/{id}/…`, behind the cluster key. Each route
//! calls the provisioner's `*_as_owner` method, which runs the operation here or answers
//! `not_owner` (409) when this node does not own the runtime (any more).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream::BoxStream;
use futures::StreamExt as _;
use warren_backend::{OutputChunk, OutputStream};
use warren_provisioner::ProcessCall;

use super::wire::{
    encode, EndRuntime, FileAnswered, FollowFrom, ForwardedExec, ForwardedFile, Frame, Killed,
    Line, RemoteError, Report, SnapshotTaken, StdinClose, StdinWritten, TakeSnapshot, HEARTBEAT,
};
use super::ClusterKey;
use crate::extract::{ApiJson, ApiPath, ApiQuery, SandboxPath};
use crate::processes::ProcessPath;
use crate::{ApiError, ApiState};

/// The internal routes, when this node has a cluster key.
pub(crate) fn router(state: ApiState, key: ClusterKey) -> Router {
    Router::new()
        .route("/internal/v1/sandboxes/{id}/exec", post(exec))
        .route("/internal/v1/sandboxes/{id}/kill", post(kill))
        .route("/internal/v1/sandboxes/{id}/file", post(file))
        .route("/internal/v1/sandboxes/{id}/snapshot", post(snapshot))
        .route("/internal/v1/sandboxes/{id}/end-runtime", post(end_runtime))
        .route(
            "/internal/v1/sandboxes/{id}/processes/call",
            post(process_call),
        )
        .route(
            "/internal/v1/sandboxes/{id}/processes/{pid}/follow",
            get(follow_process),
        )
        .route(
            "/internal/v1/sandboxes/{id}/processes/{pid}/stdin",
            post(write_stdin),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            key,
            require_cluster_key,
        ))
        .with_state(state)
}

async fn require_cluster_key(
    State(key): State<ClusterKey>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    match crate::auth::bearer(&request) {
        Some(presented) if key.matches(presented.trim()) => Ok(next.run(request).await),
        _ => Err(ApiError::unauthorized(
            "node-to-node calls need the cluster key: `Authorization: Bearer <cluster key>`",
        )),
    }
}

fn remote(error: &ApiError) -> RemoteError {
    RemoteError {
        status: error.status().as_u16(),
        code: error.code().to_owned(),
        message: error.message().to_owned(),
    }
}

fn line(frame: &Frame) -> Bytes {
    // Serialising these plain structs cannot fail.
    let mut text = serde_json::to_vec(frame).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

/// Runs a forwarded command and answers with NDJSON frames: output as it comes (when the
/// caller streams), then the report or the error. When the caller goes away (its own
/// client left, or its node died) the body is dropped, and so is the exec: the command's
/// tree is killed and the run recorded `client_disconnected` (I24).
async fn exec(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(forwarded): ApiJson<ForwardedExec>,
) -> Result<Response, ApiError> {
    let stream = forwarded.stream;
    let fence = forwarded
        .fence
        .map(warren_provisioner::FenceToken::new)
        .transpose()?;
    let input = forwarded.into_input().map_err(|message| {
        ApiError::bad_request(warren_protocol::code!(400, "invalid_request"), message)
    })?;
    // Checked here, at the owner, before the answer starts: a stale token is the caller's
    // 409 `fence_stale`, as on the owner's own API.
    let permit = state.provisioner.fence(&id, fence).await?;
    let (body_tx, body_rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let (chunk_tx, mut chunk_rx) = tokio::sync::mpsc::channel::<OutputChunk>(64);
    let request_id = super::current_request_id().unwrap_or_default();
    tokio::spawn(super::CURRENT_REQUEST_ID.scope(request_id, async move {
        let sink = stream.then_some(chunk_tx);
        let exec = state.provisioner.exec_as_owner(&id, input, sink, permit);
        tokio::pin!(exec);
        // The first beat after one period: a quick command answers with its report alone.
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
        let result = loop {
            tokio::select! {
                _ = heartbeat.tick() => {
                    if body_tx.send(line(&Frame::Alive)).await.is_err() {
                        return;
                    }
                }
                Some(chunk) = chunk_rx.recv() => {
                    let data = encode(&chunk.bytes);
                    let frame = match chunk.stream {
                        OutputStream::Stdout => Frame::Stdout(data),
                        OutputStream::Stderr => Frame::Stderr(data),
                    };
                    if body_tx.send(line(&frame)).await.is_err() {
                        return;
                    }
                }
                // The caller left: dropping the exec kills the command.
                () = body_tx.closed() => return,
                result = &mut exec => break result,
            }
        };
        while let Ok(chunk) = chunk_rx.try_recv() {
            let data = encode(&chunk.bytes);
            let frame = match chunk.stream {
                OutputStream::Stdout => Frame::Stdout(data),
                OutputStream::Stderr => Frame::Stderr(data),
            };
            let _ = body_tx.send(line(&frame)).await;
        }
        let last = match result {
            Ok(report) => Frame::Report(Report::new(report)),
            Err(error) => Frame::Error(remote(&ApiError::from(error))),
        };
        let _ = body_tx.send(line(&last)).await;
    }));
    let body = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    });
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

async fn file(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(body): ApiJson<ForwardedFile>,
) -> Result<Json<FileAnswered>, ApiError> {
    let (op, data) = body.into_parts().ok_or_else(|| {
        ApiError::bad_request(
            warren_protocol::code!(400, "invalid_body"),
            "the file bytes are not base64",
        )
    })?;
    let reply = state
        .provisioner
        .runtime_file_as_owner(&id, op, data)
        .await?;
    Ok(Json(FileAnswered::new(reply)))
}

async fn kill(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<Killed>, ApiError> {
    let killed = state.provisioner.kill_processes_as_owner(&id).await?;
    Ok(Json(Killed { killed }))
}

async fn snapshot(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(body): ApiJson<TakeSnapshot>,
) -> Result<Json<SnapshotTaken>, ApiError> {
    let snapshot = state
        .provisioner
        .snapshot_runtime_as_owner(&id, &body.reason)
        .await?;
    Ok(Json(SnapshotTaken {
        snapshot_id: snapshot.id,
    }))
}

async fn end_runtime(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(body): ApiJson<EndRuntime>,
) -> Result<Response, ApiError> {
    state
        .provisioner
        .end_runtime_as_owner(&id, Duration::from_millis(body.grace_ms))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Serves a call on a process of a runtime this node owns: the answer, as one NDJSON line
/// after heartbeats while it takes (a start may start the runtime, a read may wait).
async fn process_call(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(call): ApiJson<ProcessCall>,
) -> Response {
    let answer = async move {
        match state.provisioner.process_call_as_owner(&id, call).await {
            Ok(answer) => Line::Item(answer),
            Err(error) => Line::Error(remote(&ApiError::from(error))),
        }
    };
    with_heartbeats(futures::stream::once(answer).boxed())
}

/// Follows a process of a runtime this node owns, event by event, with heartbeats while
/// it is quiet. When the caller goes away, following stops; the process runs on.
async fn follow_process(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    ApiQuery(query): ApiQuery<FollowFrom>,
) -> Result<Response, ApiError> {
    let (id, pid) = path.parse()?;
    let events = state
        .provisioner
        .follow_process_as_owner(&id, pid, query.from)?;
    Ok(with_heartbeats(events.map(Line::Item).boxed()))
}

/// Writes the body to the stdin of a process of a runtime this node owns, at the pace the
/// process reads it.
async fn write_stdin(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ProcessPath>,
    ApiQuery(query): ApiQuery<StdinClose>,
    body: Body,
) -> Result<Json<StdinWritten>, ApiError> {
    let (id, pid) = path.parse()?;
    let written = state
        .provisioner
        .write_stdin_as_owner(&id, pid, body.into_data_stream(), query.close)
        .await?;
    Ok(Json(StdinWritten { written }))
}

/// An NDJSON answer of `lines`, with [`Line::Alive`] whenever none came for a
/// [`HEARTBEAT`]: the caller tells a quiet answer from a paused or cut-off owner.
fn with_heartbeats<T>(lines: BoxStream<'static, Line<T>>) -> Response
where
    T: serde::Serialize + Send + 'static,
{
    let body = futures::stream::unfold(lines, |mut lines| async move {
        // A stream keeps its state between polls: a beat never loses a line.
        let line = match tokio::time::timeout(HEARTBEAT, lines.next()).await {
            Ok(Some(line)) => line,
            Ok(None) => return None,
            Err(_) => Line::Alive,
        };
        let mut text = serde_json::to_vec(&line).unwrap_or_default();
        text.push(b'\n');
        Some((Ok::<_, Infallible>(Bytes::from(text)), lines))
    });
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}
