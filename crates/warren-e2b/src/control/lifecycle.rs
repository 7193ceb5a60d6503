//! Killing, pausing, resuming and connecting to E2B sandboxes: each the provisioner's
//! own move of the warren sandbox behind it (`pause_sandbox`, `resume_sandbox`,
//! `terminate_sandbox`, `update_settings`), so the rules are the ones every wire has.
//!
//! A pause is a runtime snapshot and the runtime's end: files and installed packages come
//! back on resume, memory and running processes do not (E2B's own pause keeps memory;
//! warren says so where it documents the API).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_provisioner::{DeadlineAction, ProvisionerError, SettingsChange};

use super::sandboxes::{answer_of, timeout_of};
use super::wire::ConnectRequest;
use super::{caller, owned, parse_body, Found};
use crate::error::ApiFailure;
use crate::state::{E2bSandbox, E2bState};
use crate::{E2bError, Shared};

/// Ends a sandbox for good: its runtime (and every process with it) and its record. The
/// workdir stays in the uid's workspace (I15).
pub(crate) async fn kill(shared: &Shared, sandbox: &E2bSandbox) -> Result<(), E2bError> {
    shared
        .provisioner
        .terminate_sandbox(&sandbox.warren_id, Duration::ZERO)
        .await?;
    super::forget(shared, &sandbox.sandbox_id).await;
    Ok(())
}

/// [`kill`] where a failure must not hide the first one: logged.
pub(crate) async fn end(shared: &Shared, sandbox: &E2bSandbox) {
    if let Err(error) = kill(shared, sandbox).await {
        tracing::warn!(sandbox = %sandbox.sandbox_id, %error, "could not end an E2B sandbox");
    }
}

/// `POST /sandboxes/{id}/pause`: 204, 409 when paused already, 404.
pub(crate) async fn pause(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let found = owned(&shared, &uid, &id).await?;
    match shared.provisioner.pause_sandbox(&found.sandbox.id).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(ProvisionerError::IllegalTransition { .. }) => Err(ApiFailure::new(
            StatusCode::CONFLICT,
            format!("sandbox {id:?} is already paused"),
        )),
        Err(error) => Err(error.into()),
    }
}

/// Resumes a paused sandbox: running again until `now + timeout`, its runtime started
/// from the pause's snapshot.
async fn resume_found(
    shared: &Shared,
    found: Found,
    timeout: Duration,
    auto_pause: Option<bool>,
) -> Result<Response, ApiFailure> {
    let change = SettingsChange {
        timeout: Some(Some(timeout)),
        on_deadline: auto_pause.map(|pause| {
            if pause {
                DeadlineAction::Pause
            } else {
                DeadlineAction::Terminate
            }
        }),
        ..SettingsChange::default()
    };
    shared
        .provisioner
        .resume_sandbox(&found.sandbox.id, change)
        .await?;
    Ok(answer(shared, &found.e2b, StatusCode::CREATED))
}

fn answer(shared: &Shared, sandbox: &E2bSandbox, status: StatusCode) -> Response {
    (status, Json(answer_of(shared, sandbox))).into_response()
}

/// `POST /sandboxes/{id}/resume` (E2B's older route): 201 with the sandbox, 409 when it
/// runs.
pub(crate) async fn resume(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: ConnectRequest = parse_body(&body)?;
    let timeout = timeout_of(&shared, request.timeout)?;
    let found = owned(&shared, &uid, &id).await?;
    if found.state() == E2bState::Running {
        return Err(ApiFailure::new(
            StatusCode::CONFLICT,
            format!("sandbox {id:?} is already running"),
        ));
    }
    resume_found(&shared, found, timeout, request.auto_pause).await
}

/// `POST /sandboxes/{id}/connect` and `/v2/...`: 200 for a running sandbox (its timeout
/// moved to `now + timeout` when that is later), 201 for a paused one, resumed.
pub(crate) async fn connect(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: ConnectRequest = parse_body(&body)?;
    let timeout = timeout_of(&shared, request.timeout)?;
    let found = owned(&shared, &uid, &id).await?;
    match found.state() {
        E2bState::Paused => resume_found(&shared, found, timeout, None).await,
        E2bState::Running => {
            super::sandboxes::extend(&shared, &found, timeout, false).await?;
            Ok(answer(&shared, &found.e2b, StatusCode::OK))
        }
    }
}
