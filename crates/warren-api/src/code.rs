//! `/v1/sandboxes/{id}/code`: the code interpreter (issue 36). Each handler parses and
//! calls the provisioner's `code` module, which holds every rule and every context.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use warren_protocol::{
    CodeContext, CodeContextList, CodeEvent, CodeExecution, CreateCodeContext, RunCode,
};

use crate::extract::{sandbox_id, ApiJson, ApiPath, Fence, SandboxPath};
use crate::stream::StreamFormat;
use crate::{ApiError, ApiState};

/// The path of one context: the sandbox and the context's id.
#[derive(Debug, Deserialize)]
pub(crate) struct ContextPath {
    id: String,
    context: String,
}

impl ContextPath {
    fn parse(self) -> Result<(warren_core::SandboxId, String), ApiError> {
        Ok((sandbox_id(&self.id)?, self.context))
    }
}

pub(crate) fn context_info(context: &warren_provisioner::CodeContext) -> CodeContext {
    CodeContext {
        id: context.id.clone(),
        language: context.language.clone(),
        cwd: context.cwd.clone(),
        env: context.env.clone(),
        pid: context.pid,
        created_at: context.created_at.to_rfc3339(),
    }
}

/// Creates an execution context: a kernel that keeps its state between executions (its
/// variables, imports, working directory), started on its first execution as one of the
/// sandbox's processes.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"),
        ("X-Warren-Requested-By" = Option<String>, Header, description = "Who asks, for the run record")),
    request_body = CreateCodeContext,
    responses(
        (status = 201, body = CodeContext, description = "Created"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request, unsupported_language, invalid_cwd, invalid_env, token_in_env"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "code_context_exists, too_many_processes, sandbox_terminating, sandbox_terminated, fence_stale"),
        (status = 422, body = warren_protocol::ErrorBody, description = "code_interpreter_unavailable: the image lacks python3, ipykernel or jupyter_client"),
        (status = 429, body = warren_protocol::ErrorBody, description = "too_many_code_contexts"),
        (status = 501, body = warren_protocol::ErrorBody, description = "processes_not_supported"),
        (status = 503, body = warren_protocol::ErrorBody, description = "runtime_elsewhere"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CreateCodeContext>,
) -> Result<Response, ApiError> {
    let input = warren_provisioner::NewContext {
        id: request.id,
        language: request.language,
        cwd: request.cwd,
        env: request.env,
        requested_by: crate::sandboxes::requested_by(&headers),
    };
    let permit = state.provisioner.fence(&id, fence).await?;
    let context = state
        .provisioner
        .create_code_context(&id, input, permit)
        .await?;
    Ok((StatusCode::CREATED, Json(context_info(&context))).into_response())
}

/// The sandbox's execution contexts, oldest first. A context ends with its runtime.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = CodeContextList),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<CodeContextList>, ApiError> {
    let contexts = state.provisioner.code_contexts(&id).await?;
    Ok(Json(CodeContextList {
        contexts: contexts.iter().map(context_info).collect(),
    }))
}

/// One execution context.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "The context's id")),
    responses(
        (status = 200, body = CodeContext),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, code_context_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ContextPath>,
) -> Result<Json<CodeContext>, ApiError> {
    let (id, context) = path.parse()?;
    let found = state.provisioner.code_context(&id, &context).await?;
    Ok(Json(context_info(&found)))
}

/// Removes an execution context: its kernel is killed and its state is gone.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "The context's id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, code_context_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn remove(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ContextPath>,
    Fence(fence): Fence,
) -> Result<StatusCode, ApiError> {
    let (id, context) = path.parse()?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    state.provisioner.remove_code_context(&id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restarts an execution context's kernel: its state is gone; its id, language, working
/// directory and environment stay.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/contexts/{context}/restart", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "The context's id"),
        ("X-Warren-Requested-By" = Option<String>, Header, description = "Who asks, for the run record")),
    responses(
        (status = 200, body = CodeContext, description = "Restarted"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, code_context_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "sandbox_terminating, sandbox_terminated, fence_stale"),
        (status = 422, body = warren_protocol::ErrorBody, description = "code_interpreter_unavailable"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn restart(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ContextPath>,
    Fence(fence): Fence,
    headers: HeaderMap,
) -> Result<Json<CodeContext>, ApiError> {
    let (id, context) = path.parse()?;
    let permit = state.provisioner.fence(&id, fence).await?;
    let restarted = state
        .provisioner
        .restart_code_context(
            &id,
            &context,
            crate::sandboxes::requested_by(&headers),
            permit,
        )
        .await?;
    Ok(Json(context_info(&restarted)))
}

/// Interrupts what the context's kernel runs now (`KeyboardInterrupt` in Python): the
/// execution ends with its error, the context's state stays.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/contexts/{context}/interrupt", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "The context's id")),
    responses(
        (status = 204, description = "Interrupted"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, code_context_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "process_ended, fence_stale"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn interrupt(
    State(state): State<ApiState>,
    ApiPath(path): ApiPath<ContextPath>,
    Fence(fence): Fence,
) -> Result<StatusCode, ApiError> {
    let (id, context) = path.parse()?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    state
        .provisioner
        .interrupt_code_context(&id, &context)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs code in a context's kernel, which keeps its state for the next execution. With
/// `Accept: application/x-ndjson` or `text/event-stream` the events stream as the kernel
/// sends them (stdout and stderr text, results with every MIME bundle, an error with its
/// traceback, `end` last); otherwise the answer gathers them. A client that goes away
/// before the end interrupts the kernel.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/execute", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"),
        ("X-Warren-Requested-By" = Option<String>, Header, description = "Who asks, for the run record")),
    request_body = RunCode,
    responses(
        (status = 200, body = CodeExecution, description = "Ran (streamed as `CodeEvent`s with a streaming `Accept`)"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_request, unsupported_language, invalid_cwd, invalid_env, token_in_env, token_in_command"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, code_context_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "too_many_processes, process_ended, sandbox_terminating, sandbox_terminated, fence_stale"),
        (status = 422, body = warren_protocol::ErrorBody, description = "code_interpreter_unavailable"),
        (status = 501, body = warren_protocol::ErrorBody, description = "processes_not_supported"),
        (status = 503, body = warren_protocol::ErrorBody, description = "runtime_elsewhere"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn execute(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    headers: HeaderMap,
    ApiJson(request): ApiJson<RunCode>,
) -> Result<Response, ApiError> {
    let input = warren_provisioner::RunCode {
        code: request.code,
        context: request.context,
        language: request.language,
        env: request.env,
        cwd: request.cwd,
        timeout: request.timeout_s.map(Duration::from_secs),
        context_env: std::collections::BTreeMap::new(),
        requested_by: crate::sandboxes::requested_by(&headers),
    };
    let permit = state.provisioner.fence(&id, fence).await?;
    let events = state.provisioner.run_code(&id, input, permit).await?;
    let Some(format) = StreamFormat::from_accept(&headers) else {
        let events: Vec<CodeEvent> = events.collect().await;
        return Ok(Json(CodeExecution::gather(events)).into_response());
    };
    let framed = events.map(move |event| Ok::<_, Infallible>(frame(format, &event)));
    Ok(crate::stream::streaming(format, Body::from_stream(framed)))
}

fn frame(format: StreamFormat, event: &CodeEvent) -> Bytes {
    // A CodeEvent holds strings, numbers and JSON values: serialising cannot fail.
    let json = serde_json::to_string(event).unwrap_or_default();
    match format {
        StreamFormat::NdJson => Bytes::from(json + "\n"),
        StreamFormat::EventStream => {
            let name = match event {
                CodeEvent::Stdout { .. } => "stdout",
                CodeEvent::Stderr { .. } => "stderr",
                CodeEvent::Result { .. } => "result",
                CodeEvent::Error { .. } => "error",
                CodeEvent::Restarted => "restarted",
                CodeEvent::End { .. } => "end",
            };
            Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
        }
    }
}
