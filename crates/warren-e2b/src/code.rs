//! E2B's code interpreter (the `e2b-code-interpreter` SDKs, smolagents' E2B executor):
//! `/execute` and `/contexts` on the sandbox's port 49999, reached like envd by the
//! `E2b-Sandbox-Id` header or the host name `49999-<id>.<domain>` (issue 36). Each route
//! parses and calls the provisioner's code interpreter, which holds every rule.
//!
//! `/execute` answers NDJSON, one line per output in E2B's shapes (`stdout`, `stderr`,
//! `result` with its formats, `error`, `number_of_executions`, `end_of_execution`); a
//! client that goes away (the SDK's timeout) interrupts the kernel. A secure sandbox's
//! routes take its access token in `X-Access-Token` or `E2B-Traffic-Access-Token` (the SDKs
//! send the second to these routes).

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures::StreamExt as _;
use serde::Deserialize;
use warren_provisioner::{CodeContext, CodeEvent, FencePermit, NewContext, RunCode};

use crate::error::ApiFailure;
use crate::state::E2bSandbox;
use crate::Shared;

/// The port E2B's SDKs address the code interpreter at (`49999-<id>.<domain>`).
pub(crate) const JUPYTER_PORT: u16 = 49999;

/// The code interpreter's routes.
pub(crate) fn routes(shared: Shared) -> Router {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", get(list).post(create))
        .route("/contexts/{context}", delete(remove))
        .route("/contexts/{context}/restart", post(restart))
        .with_state(shared)
}

/// `POST /execute`.
#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`.
#[derive(Debug, Default, Deserialize)]
struct CreateRequest {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// A context as the SDKs read it.
fn context_json(context: &CodeContext) -> serde_json::Value {
    serde_json::json!({
        "id": context.id,
        "language": context.language,
        "cwd": context.cwd,
    })
}

/// The sandbox a request is for, authenticated as envd's are.
async fn sandbox_of(shared: &Shared, headers: &HeaderMap) -> Result<E2bSandbox, ApiFailure> {
    let Some(id) = crate::envd::sandbox_id_of(headers, shared.config.domain.as_deref()) else {
        return Err(ApiFailure::bad_request(
            "the request names no sandbox: send the E2b-Sandbox-Id header or use the host name 49999-<sandboxID>.<domain>",
        ));
    };
    let sandbox = crate::control::live_sandbox(shared, &id)
        .await?
        .ok_or_else(|| ApiFailure::sandbox_not_found(&id))?;
    if !crate::envd::access_granted(
        shared,
        &sandbox,
        headers,
        &["x-access-token", "e2b-traffic-access-token"],
    ) {
        return Err(ApiFailure::new(
            StatusCode::UNAUTHORIZED,
            "the X-Access-Token or E2B-Traffic-Access-Token header is missing or is not this sandbox's access token",
        ));
    }
    Ok(sandbox)
}

fn parse<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiFailure> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|error| ApiFailure::bad_request(format!("invalid request body: {error}")))
}

async fn execute(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    match start_execution(&shared, &headers, &body).await {
        Ok(response) => response,
        Err(failure) => failure.into_response(),
    }
}

async fn start_execution(
    shared: &Shared,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiFailure> {
    let sandbox = sandbox_of(shared, headers).await?;
    let request: ExecuteRequest = serde_json::from_slice(body)
        .map_err(|error| ApiFailure::bad_request(format!("invalid request body: {error}")))?;
    let input = RunCode {
        code: request.code,
        context: request.context_id,
        language: request.language,
        env: request.env_vars.unwrap_or_default(),
        cwd: None,
        // The SDK's timeout is the client's: it goes away, which interrupts the kernel.
        timeout: None,
        // The sandbox's environment (`envVars` at create) is its kernels'.
        context_env: sandbox.env_vars.clone(),
        requested_by: format!("e2b:{}", sandbox.sandbox_id),
    };
    let events = shared
        .provisioner
        .run_code(&sandbox.warren_id, input, FencePermit::unfenced())
        .await?;
    let lines = events.flat_map(|event| {
        futures::stream::iter(
            e2b_lines(event)
                .into_iter()
                .map(|line| Ok::<_, Infallible>(Bytes::from(line.to_string() + "\n"))),
        )
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// E2B's lines for one event.
fn e2b_lines(event: CodeEvent) -> Vec<serde_json::Value> {
    match event {
        CodeEvent::Stdout { text, timestamp } => {
            vec![serde_json::json!({"type": "stdout", "text": text, "timestamp": timestamp})]
        }
        CodeEvent::Stderr { text, timestamp } => {
            vec![serde_json::json!({"type": "stderr", "text": text, "timestamp": timestamp})]
        }
        CodeEvent::Result {
            data,
            is_main_result,
        } => vec![result_json(data, is_main_result)],
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => vec![serde_json::json!({
            "type": "error",
            "name": name,
            "value": value,
            "traceback": traceback.join("\n"),
        })],
        CodeEvent::Restarted => Vec::new(),
        CodeEvent::End {
            execution_count, ..
        } => {
            let mut lines = Vec::new();
            if let Some(count) = execution_count {
                lines.push(
                    serde_json::json!({"type": "number_of_executions", "execution_count": count}),
                );
            }
            lines.push(serde_json::json!({"type": "end_of_execution"}));
            lines
        }
    }
}

/// A result in E2B's shape: each known MIME type under its format's name, the others
/// under `extra`.
fn result_json(
    data: BTreeMap<String, serde_json::Value>,
    is_main_result: bool,
) -> serde_json::Value {
    let mut result = serde_json::Map::new();
    result.insert("type".into(), "result".into());
    result.insert("is_main_result".into(), is_main_result.into());
    let mut extra = serde_json::Map::new();
    for (mime, value) in data {
        let format = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            _ => {
                extra.insert(mime, value);
                continue;
            }
        };
        result.insert(format.into(), value);
    }
    if !extra.is_empty() {
        result.insert("extra".into(), extra.into());
    }
    result.into()
}

async fn list(State(shared): State<Shared>, headers: HeaderMap) -> Result<Response, ApiFailure> {
    let sandbox = sandbox_of(&shared, &headers).await?;
    let contexts = shared.provisioner.code_contexts(&sandbox.warren_id).await?;
    let listed: Vec<_> = contexts.iter().map(context_json).collect();
    Ok(Json(listed).into_response())
}

async fn create(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiFailure> {
    let sandbox = sandbox_of(&shared, &headers).await?;
    let request: CreateRequest = parse(&body)?;
    let input = NewContext {
        id: None,
        language: request.language,
        cwd: request.cwd,
        env: sandbox.env_vars.clone(),
        requested_by: format!("e2b:{}", sandbox.sandbox_id),
    };
    let context = shared
        .provisioner
        .create_code_context(&sandbox.warren_id, input, FencePermit::unfenced())
        .await?;
    Ok(Json(context_json(&context)).into_response())
}

async fn remove(
    State(shared): State<Shared>,
    Path(context): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let sandbox = sandbox_of(&shared, &headers).await?;
    shared
        .provisioner
        .remove_code_context(&sandbox.warren_id, &context)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart(
    State(shared): State<Shared>,
    Path(context): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let sandbox = sandbox_of(&shared, &headers).await?;
    shared
        .provisioner
        .restart_code_context(
            &sandbox.warren_id,
            &context,
            format!("e2b:{}", sandbox.sandbox_id),
            FencePermit::unfenced(),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_carry_each_known_mime_type_under_e2b_s_format_name_and_the_rest_as_extra() {
        let data = BTreeMap::from([
            ("text/plain".to_owned(), serde_json::json!("<Figure>")),
            ("image/png".to_owned(), serde_json::json!("iVBOR")),
            ("application/json".to_owned(), serde_json::json!({"a": 1})),
            ("application/vnd.custom".to_owned(), serde_json::json!("x")),
        ]);
        let json = result_json(data, false);
        assert_eq!(
            json,
            serde_json::json!({
                "type": "result",
                "is_main_result": false,
                "text": "<Figure>",
                "png": "iVBOR",
                "json": {"a": 1},
                "extra": {"application/vnd.custom": "x"},
            })
        );
    }

    #[test]
    fn an_execution_s_end_tells_its_count_then_ends() {
        let lines = e2b_lines(CodeEvent::End {
            context_id: "default".into(),
            execution_count: Some(3),
            status: warren_provisioner::ExecutionStatus::Ok,
        });
        assert_eq!(
            lines,
            vec![
                serde_json::json!({"type": "number_of_executions", "execution_count": 3}),
                serde_json::json!({"type": "end_of_execution"}),
            ]
        );
    }

    #[test]
    fn an_error_s_traceback_is_one_text_as_the_sdks_read_it() {
        let lines = e2b_lines(CodeEvent::Error {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: vec!["a".into(), "b".into()],
        });
        assert_eq!(lines[0]["traceback"], "a\nb");
        assert_eq!(lines[0]["name"], "ZeroDivisionError");
    }
}
