//! The AIO sandbox API, served at each sandbox's `sandbox_url`
//! (`{base}/deerflow/sandboxes/{sandbox}/{capability}`), as the `agent-sandbox` SDK calls it.
//!
//! # How a handler is written (the interface `files.rs` and `shell.rs` share)
//!
//! - **Routes** are relative to the sandbox URL (`/v1/file/read`, `/v1/shell/exec`, ...)
//!   and registered on an `axum::Router<AioState>`; [`router`] nests them under
//!   `/deerflow/sandboxes/{sandbox}/{capability}` behind [`require_capability`].
//! - **State**: `State(state): State<AioState>` gives `state.provisioner`
//!   (`Arc<Provisioner>`).
//! - **The sandbox**: [`AioSandbox`] as an extractor gives the resolved, capability-checked
//!   `id: SandboxId` and the `record: SandboxRecord` read when the request arrived (its
//!   layout is `record.layout`, always DeerFlow for sandboxes made by this crate). A
//!   request whose capability is wrong, stale (an older generation) or whose sandbox is
//!   terminating or terminated never reaches a handler: it is answered 404.
//! - **Path parameters of your own** (`/v1/shell/sessions/{session_id}`): the two outer
//!   parameters `sandbox` and `capability` are in the same map, so extract
//!   `axum::extract::Path<std::collections::HashMap<String, String>>` and take yours by name.
//! - **Bodies**: [`AioJson<T>`] instead of `axum::Json`: it reads any content type, takes an
//!   empty body as `{}`, and refuses malformed JSON with 400 (never 422, which the SDK
//!   misreads; contract §0.3). Make every field `Option<_>`: the SDK sends `null` for an
//!   explicit `None`, and unknown fields are ignored.
//! - **Answers**: `Ok(ok(data))` gives 200 `{"success":true,"message":"ok","data":data}`;
//!   [`ok_with`] sets the message. Failures are [`AioError`]: `?` on a `ProvisionerError`
//!   maps it (status by kind, message without host paths); [`AioError::bad_request`],
//!   [`AioError::not_found`] and [`AioError::session_not_found`] (404
//!   `"Session not found: <id>"`, which DeerFlow matches) build the rest. Every failure is
//!   non-2xx with `{"success":false,"message":...,"data":null}`.
//! - **A runtime**: `state.provisioner.start_runtime(&id)` starts it if needed (I12) and
//!   returns the record; commands go through the provisioner's exec path as everywhere.

mod files;
mod jupyter;
mod shell;

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;
use warren_core::SandboxId;
use warren_provisioner::{Provisioner, ProvisionerError};
use warren_store::{SandboxRecord, SandboxState};

use crate::capability::CapabilityKey;

/// The state of every AIO handler.
#[derive(Clone)]
pub(crate) struct AioState {
    /// Where every rule lives.
    pub(crate) provisioner: Arc<Provisioner>,
    /// Checks the capability segment of sandbox URLs.
    pub(crate) capabilities: Arc<CapabilityKey>,
}

/// The AIO routes of every sandbox, with their state applied.
pub(crate) fn router(state: AioState) -> Router {
    let v1 = Router::new()
        .route("/v1/sandbox", get(files::context))
        .merge(files::routes())
        .merge(shell::routes())
        .merge(jupyter::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_capability,
        ))
        // In the AIO envelope too. It tells nothing about the sandbox: the capability is
        // not checked for a route that does not exist.
        .fallback(|| async { AioError::not_found("no such endpoint in this sandbox API") });
    Router::new()
        .nest("/deerflow/sandboxes/{sandbox}/{capability}", v1)
        .with_state(state)
}

/// The sandbox a request's URL names, after its capability was checked.
#[derive(Debug, Clone)]
pub(crate) struct AioSandbox {
    /// warren's id of the sandbox.
    pub(crate) id: SandboxId,
    /// The record as it was when the request arrived.
    #[allow(dead_code)] // for the shell handlers
    pub(crate) record: SandboxRecord,
}

impl<S: Send + Sync> FromRequestParts<S> for AioSandbox {
    type Rejection = AioError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<AioSandbox>()
            .cloned()
            .ok_or_else(|| AioError::new(StatusCode::INTERNAL_SERVER_ERROR, "no sandbox"))
    }
}

/// What an unknown sandbox, a wrong capability and a revoked one all answer: the same 404,
/// so a caller learns nothing about which sandboxes exist.
fn unknown_sandbox() -> AioError {
    AioError::not_found("no such sandbox")
}

/// Resolves `{sandbox}/{capability}` and lets the request through only when the capability
/// is the one of the sandbox's current generation and the sandbox is not terminating or
/// terminated (the capability dies with the sandbox).
async fn require_capability(
    State(state): State<AioState>,
    axum::extract::Path(params): axum::extract::Path<std::collections::HashMap<String, String>>,
    mut request: Request,
    next: Next,
) -> Result<Response, AioError> {
    let (Some(sandbox), Some(capability)) = (params.get("sandbox"), params.get("capability"))
    else {
        return Err(unknown_sandbox());
    };
    let Ok(id) = SandboxId::parse(sandbox) else {
        return Err(unknown_sandbox());
    };
    let record = match state.provisioner.sandbox(&id).await {
        Ok(record) => record,
        Err(ProvisionerError::SandboxNotFound(_)) => return Err(unknown_sandbox()),
        Err(other) => return Err(other.into()),
    };
    let live = !matches!(
        record.state,
        SandboxState::Terminating | SandboxState::Terminated
    );
    // The comparison runs whatever the state, so timing does not tell states apart.
    let valid = state
        .capabilities
        .verify(&id, record.generation, capability);
    if !(valid && live) {
        return Err(unknown_sandbox());
    }
    request.extensions_mut().insert(AioSandbox { id, record });
    Ok(next.run(request).await)
}

/// 200 with the AIO envelope around `data`.
pub(crate) fn ok<T: Serialize>(data: T) -> Json<serde_json::Value> {
    ok_with("ok", data)
}

/// 200 with the AIO envelope around `data` and a message.
pub(crate) fn ok_with<T: Serialize>(message: &str, data: T) -> Json<serde_json::Value> {
    Json(serde_json::json!({"success": true, "message": message, "data": data}))
}

/// A failed AIO call: a non-2xx status (never 422, contract §0.3) and the envelope with
/// `success: false`. Messages name paths as the sandbox sees them, never a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AioError {
    status: StatusCode,
    message: String,
}

impl AioError {
    /// An error with an explicit status.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
            StatusCode::BAD_REQUEST
        } else {
            status
        };
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400: the request was wrong.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 404 `Session not found: <id>`, the words DeerFlow looks for to recreate a session.
    #[allow(dead_code)] // used by the shell handlers
    pub(crate) fn session_not_found(id: &str) -> Self {
        Self::not_found(format!("Session not found: {id}"))
    }

    /// The HTTP status.
    #[allow(dead_code)] // for tests and the shell handlers
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for AioError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({"success": false, "message": self.message, "data": null})),
        )
            .into_response()
    }
}

impl From<ProvisionerError> for AioError {
    fn from(error: ProvisionerError) -> Self {
        Self::new(crate::status_of(&error), crate::public_message(&error))
    }
}

/// A JSON body as the SDK sends it: any content type, an empty body meaning `{}`, and a
/// malformed one refused with 400.
pub(crate) struct AioJson<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for AioJson<T> {
    type Rejection = AioError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|rejection| AioError::new(rejection.status(), rejection.body_text()))?;
        let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &body
        };
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| AioError::bad_request(format!("the body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(AioError::bad_request("the body must be a JSON object"));
        }
        serde_json::from_value(value)
            .map(Self)
            .map_err(|e| AioError::bad_request(format!("invalid request: {e}")))
    }
}
