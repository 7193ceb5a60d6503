//! The AIO API's Jupyter routes (`/v1/jupyter/...`), as the `agent-sandbox` SDK calls them
//! (issue 36). A session is one of the provisioner's code contexts, its id the session id;
//! every rule (the kernel, timeouts, masking) is the provisioner's code interpreter's.
//!
//! An execution without a `session_id` runs in the default context (`default`), which keeps
//! its state like any other session.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::{delete, get, post};
use axum::Json;
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_protocol::{CodeEvent, ExecutionStatus};
use warren_provisioner::{
    default_context_id, CodeContext, FencePermit, NewContext, ProvisionerError, RunCode,
    MAX_CONTEXTS,
};

use super::{ok_with, AioError, AioJson, AioSandbox, AioState};

/// The AIO API's default and longest cell timeouts, in seconds.
const DEFAULT_TIMEOUT_S: u64 = 30;
const MAX_TIMEOUT_S: u64 = 300;
/// The only kernel: Python's.
const KERNEL: &str = "python3";

pub(crate) fn routes() -> axum::Router<AioState> {
    axum::Router::new()
        .route("/v1/jupyter/execute", post(execute))
        .route("/v1/jupyter/info", get(info))
        .route("/v1/jupyter/sessions", get(list).delete(remove_all))
        .route("/v1/jupyter/sessions/create", post(create))
        .route("/v1/jupyter/sessions/{session_id}", delete(remove))
}

#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    code: Option<String>,
    timeout: Option<u64>,
    kernel_name: Option<String>,
    session_id: Option<String>,
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CreateRequest {
    session_id: Option<String>,
    kernel_name: Option<String>,
    cwd: Option<String>,
}

/// The kernel name of a language, as Jupyter names it.
fn kernel_name(language: &str) -> &'static str {
    if language == "bash" {
        "bash"
    } else {
        KERNEL
    }
}

/// The language of a kernel name: `python3`, `python3.11`, `python`, `bash`.
fn language_of(kernel: Option<&str>) -> Result<&'static str, AioError> {
    match kernel {
        None => Ok("python"),
        Some(name) if name == "python" || name.starts_with("python3") => Ok("python"),
        Some("bash") => Ok("bash"),
        Some(name) => Err(AioError::bad_request(format!(
            "no kernel {name:?}; this sandbox runs {KERNEL} and bash"
        ))),
    }
}

async fn execute(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ExecuteRequest>,
) -> Result<Json<Value>, AioError> {
    let Some(code) = request.code else {
        return Err(AioError::bad_request("code is required"));
    };
    let timeout = request.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout) {
        return Err(AioError::bad_request(format!(
            "timeout must be 1 to {MAX_TIMEOUT_S} seconds"
        )));
    }
    let language = language_of(request.kernel_name.as_deref())?;
    let provisioner = &state.provisioner;
    let session = match request.session_id {
        Some(session) => {
            ensure_session(&state, &sandbox, &session, language, request.cwd.clone()).await?;
            Some(session)
        }
        None => None,
    };
    let input = RunCode {
        code: code.clone(),
        context: session.clone(),
        language: session.is_none().then(|| language.to_owned()),
        cwd: request.cwd,
        timeout: Some(Duration::from_secs(timeout)),
        requested_by: "deerflow:aio".to_owned(),
        ..Default::default()
    };
    let events: Vec<CodeEvent> = provisioner
        .run_code(&sandbox.id, input, FencePermit::unfenced())
        .await?
        .collect()
        .await;
    let mut outputs = Vec::new();
    let mut status = "error";
    let mut execution_count = None;
    let mut context_id = session.unwrap_or_else(|| default_context_id(language));
    for event in events {
        match event {
            CodeEvent::Stdout { text, .. } => {
                outputs.push(json!({"output_type": "stream", "name": "stdout", "text": text}))
            }
            CodeEvent::Stderr { text, .. } => {
                outputs.push(json!({"output_type": "stream", "name": "stderr", "text": text}))
            }
            CodeEvent::Result {
                data,
                is_main_result,
            } => outputs.push(if is_main_result {
                json!({"output_type": "execute_result", "data": data, "metadata": {}})
            } else {
                json!({"output_type": "display_data", "data": data, "metadata": {}})
            }),
            CodeEvent::Error {
                name,
                value,
                traceback,
            } => outputs.push(json!({
                "output_type": "error", "ename": name, "evalue": value, "traceback": traceback,
            })),
            CodeEvent::Restarted => {}
            CodeEvent::End {
                context_id: ran_in,
                execution_count: count,
                status: ended,
            } => {
                context_id = ran_in;
                execution_count = count;
                status = match ended {
                    ExecutionStatus::Ok => "ok",
                    ExecutionStatus::Error => "error",
                    ExecutionStatus::Timeout => "timeout",
                };
            }
        }
    }
    // The cell's value carries its count, as Jupyter's execute_result does.
    for output in &mut outputs {
        if output["output_type"] == "execute_result" {
            output["execution_count"] = json!(execution_count);
        }
    }
    Ok(ok_with(
        "Code executed successfully",
        json!({
            "kernel_name": kernel_name(language),
            "session_id": context_id,
            "status": status,
            "execution_count": execution_count,
            "outputs": outputs,
            "code": code,
            "msg_id": null,
        }),
    ))
}

/// The session's context, created (with `cwd`) when missing.
async fn ensure_session(
    state: &AioState,
    sandbox: &AioSandbox,
    session: &str,
    language: &str,
    cwd: Option<String>,
) -> Result<(CodeContext, bool), AioError> {
    Ok(state
        .provisioner
        .code_context_or_create(
            &sandbox.id,
            NewContext {
                id: Some(session.to_owned()),
                language: Some(language.to_owned()),
                cwd,
                requested_by: "deerflow:aio".to_owned(),
                ..Default::default()
            },
            FencePermit::unfenced(),
        )
        .await?)
}

async fn info(State(state): State<AioState>, sandbox: AioSandbox) -> Result<Json<Value>, AioError> {
    let contexts = state.provisioner.code_contexts(&sandbox.id).await?;
    Ok(ok_with(
        "ok",
        json!({
            "default_kernel": KERNEL,
            "available_kernels": [KERNEL],
            "active_sessions": contexts.len(),
            // Sessions end with the runtime, which the idle reaper ends.
            "session_timeout_seconds": state.provisioner.config().idle_timeout.as_secs(),
            "max_sessions": MAX_CONTEXTS,
            "description": "Jupyter kernels (ipykernel) in the sandbox's runtime, one per session",
            "kernel_detection": "python3 with ipykernel and jupyter_client in the runtime",
        }),
    ))
}

async fn list(State(state): State<AioState>, sandbox: AioSandbox) -> Result<Json<Value>, AioError> {
    let contexts = state.provisioner.code_contexts(&sandbox.id).await?;
    let now = chrono::Utc::now();
    let sessions: BTreeMap<String, Value> = contexts
        .into_iter()
        .map(|context| {
            let started = context.created_at;
            let entry = json!({
                "kernel_name": kernel_name(&context.language),
                // warren does not track a session's last use: its start stands for it.
                "last_used": started.timestamp_millis() as f64 / 1000.0,
                "age_seconds": (now - started).num_seconds().max(0),
            });
            (context.id, entry)
        })
        .collect();
    Ok(ok_with("ok", json!({ "sessions": sessions })))
}

async fn create(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<CreateRequest>,
) -> Result<Json<Value>, AioError> {
    let language = language_of(request.kernel_name.as_deref())?;
    let session = request
        .session_id
        .unwrap_or_else(|| format!("jp-{}", uuid::Uuid::new_v4().simple()));
    let (context, made) = ensure_session(&state, &sandbox, &session, language, request.cwd).await?;
    let message = if made {
        "Session created"
    } else {
        "Session already exists"
    };
    Ok(ok_with(
        message,
        json!({"session_id": context.id, "kernel_name": kernel_name(&context.language), "message": message}),
    ))
}

async fn remove(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    Path(params): Path<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, AioError> {
    let session = params.get("session_id").cloned().unwrap_or_default();
    match state
        .provisioner
        .remove_code_context(&sandbox.id, &session)
        .await
    {
        Ok(()) => Ok(ok_with(
            &format!("Session {session} cleaned up"),
            Value::Null,
        )),
        Err(ProvisionerError::CodeContextNotFound { .. }) => {
            Err(AioError::session_not_found(&session))
        }
        Err(other) => Err(other.into()),
    }
}

async fn remove_all(
    State(state): State<AioState>,
    sandbox: AioSandbox,
) -> Result<Json<Value>, AioError> {
    let removed = state.provisioner.remove_code_contexts(&sandbox.id).await?;
    Ok(ok_with(
        &format!("{removed} session(s) cleaned up"),
        Value::Null,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_kernel_names_are_python_and_others_are_refused() {
        for name in [None, Some("python3"), Some("python3.11"), Some("python")] {
            assert_eq!(language_of(name).unwrap(), "python");
        }
        let refused = language_of(Some("ir")).unwrap_err();
        assert_eq!(refused.status(), axum::http::StatusCode::BAD_REQUEST);
    }
}
