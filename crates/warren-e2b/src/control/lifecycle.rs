//! Killing, pausing, resuming and connecting to E2B sandboxes.
//!
//! A pause is a runtime snapshot and a reclaim, as the reaper's (I30): the sandbox's
//! processes end, its runtime goes, its workdir (the home) stays, and the next runtime
//! starts from the snapshot: files and installed packages come back, memory and running
//! processes do not (E2B's own pause keeps memory; warren says so where it documents the
//! API). Resume (and connect to a paused sandbox) marks it running and starts the runtime.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_provisioner::{ProcessState, ProvisionerError, RecordWrite};

use super::sandboxes::{deadline, timeout_of};
use super::wire::{ConnectRequest, Sandbox};
use super::{caller, owned, parse_body, save};
use crate::error::ApiFailure;
use crate::state::{record_key, E2bSandbox, E2bState, RECORD_NAMESPACE};
use crate::{E2bError, Shared};

/// How often a change that lost a race with another writer is tried again.
pub(crate) const CONFLICT_RETRIES: usize = 8;

/// Ends a sandbox for good: its processes, its runtime, its record. The workdir stays in
/// the uid's workspace (I15). Best effort: used where a failure must not hide the first.
pub(crate) async fn end(shared: &Shared, sandbox: &E2bSandbox) {
    end_processes(shared, sandbox).await;
    if let Err(error) = shared
        .provisioner
        .terminate_sandbox(&sandbox.warren_id, Duration::ZERO)
        .await
    {
        tracing::warn!(sandbox = %sandbox.sandbox_id, %error, "could not terminate an E2B sandbox's runtime");
    }
    if let Err(error) = shared
        .provisioner
        .delete_record(RECORD_NAMESPACE, &record_key(&sandbox.sandbox_id), None)
        .await
    {
        tracing::warn!(sandbox = %sandbox.sandbox_id, %error, "could not forget an E2B sandbox");
    }
}

/// Kills a sandbox read at `version`: the record goes first (at that version, so a
/// concurrent kill or pause does not run twice), then processes and runtime.
pub(crate) async fn kill(
    shared: &Shared,
    sandbox: &E2bSandbox,
    version: i64,
) -> Result<(), E2bError> {
    let deleted = shared
        .provisioner
        .delete_record(
            RECORD_NAMESPACE,
            &record_key(&sandbox.sandbox_id),
            Some(version),
        )
        .await?;
    if !deleted {
        return Err(E2bError::Conflict);
    }
    end_processes(shared, sandbox).await;
    shared
        .provisioner
        .terminate_sandbox(&sandbox.warren_id, Duration::ZERO)
        .await?;
    Ok(())
}

/// Kills the sandbox's running processes and waits (within a bound) until they ended; their
/// envd streams end with `unavailable`, the sandbox being gone or paused by then.
async fn end_processes(shared: &Shared, sandbox: &E2bSandbox) {
    let id = &sandbox.warren_id;
    let Ok(processes) = shared.provisioner.list_processes(id).await else {
        return;
    };
    let kills = processes
        .iter()
        .filter(|process| process.state == ProcessState::Running)
        .map(|process| shared.provisioner.kill_process(id, process.pid));
    let _ = tokio::time::timeout(END_WAIT, futures::future::join_all(kills)).await;
}

/// How long the end of a sandbox waits for its processes.
const END_WAIT: Duration = Duration::from_secs(10);

/// Pauses a running sandbox read at `version`: processes end, the runtime is snapshotted
/// and reclaimed, the record says paused. `Ok(false)` when it was paused already.
pub(crate) async fn pause_sandbox(
    shared: &Shared,
    mut sandbox: E2bSandbox,
    version: i64,
) -> Result<bool, E2bError> {
    if sandbox.state == E2bState::Paused {
        return Ok(false);
    }
    // The record changes first, so envd stops taking commands for it at once.
    sandbox.state = E2bState::Paused;
    let version = save(shared, &sandbox, RecordWrite::Replace(version)).await?;
    end_processes(shared, &sandbox).await;
    let snapshot = shared.provisioner.pause_runtime(&sandbox.warren_id).await?;
    sandbox.paused_snapshot = snapshot.map(|snapshot| snapshot.id);
    save(shared, &sandbox, RecordWrite::Replace(version)).await?;
    Ok(true)
}

/// `POST /sandboxes/{id}/pause`: 204, 409 when paused already, 404.
pub(crate) async fn pause(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let (sandbox, version) = super::owned_unexpired(&shared, &uid, &id).await?;
    if pause_sandbox(&shared, sandbox, version).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiFailure::new(
            StatusCode::CONFLICT,
            format!("sandbox {id:?} is already paused"),
        ))
    }
}

/// Resumes a paused sandbox: running again until `now + timeout`, its runtime started
/// from the pause's snapshot.
async fn resume_sandbox(
    shared: &Shared,
    mut sandbox: E2bSandbox,
    version: i64,
    timeout: Duration,
    auto_pause: Option<bool>,
) -> Result<E2bSandbox, ApiFailure> {
    sandbox.state = E2bState::Running;
    sandbox.end_at = deadline(timeout);
    if let Some(auto_pause) = auto_pause {
        sandbox.auto_pause = auto_pause;
    }
    save(shared, &sandbox, RecordWrite::Replace(version)).await?;
    shared.provisioner.start_runtime(&sandbox.warren_id).await?;
    Ok(sandbox)
}

fn answer(shared: &Shared, sandbox: &E2bSandbox, status: StatusCode) -> Response {
    let token = sandbox
        .secure
        .then(|| shared.secrets.access_token(&sandbox.sandbox_id));
    let body = Sandbox::of(sandbox, token, shared.config.domain.as_deref());
    (status, Json(body)).into_response()
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
    let (sandbox, version) = owned(&shared, &uid, &id).await?;
    if sandbox.state == E2bState::Running {
        if sandbox.end_at <= chrono::Utc::now() {
            return Err(ApiFailure::sandbox_not_found(&id));
        }
        return Err(ApiFailure::new(
            StatusCode::CONFLICT,
            format!("sandbox {id:?} is already running"),
        ));
    }
    let sandbox = resume_sandbox(&shared, sandbox, version, timeout, request.auto_pause).await?;
    Ok(answer(&shared, &sandbox, StatusCode::CREATED))
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
    for _ in 0..CONFLICT_RETRIES {
        let (mut sandbox, version) = owned(&shared, &uid, &id).await?;
        match sandbox.state {
            E2bState::Paused => {
                let sandbox = resume_sandbox(&shared, sandbox, version, timeout, None).await?;
                return Ok(answer(&shared, &sandbox, StatusCode::CREATED));
            }
            E2bState::Running if sandbox.end_at <= chrono::Utc::now() => {
                return Err(ApiFailure::sandbox_not_found(&id));
            }
            E2bState::Running => {
                let end_at = deadline(timeout);
                if end_at > sandbox.end_at {
                    sandbox.end_at = end_at;
                    match save(&shared, &sandbox, RecordWrite::Replace(version)).await {
                        Ok(_) => {}
                        Err(E2bError::Conflict) => continue,
                        Err(error) => return Err(error.into()),
                    }
                }
                return Ok(answer(&shared, &sandbox, StatusCode::OK));
            }
        }
    }
    Err(E2bError::Conflict.into())
}

/// Whether an error only says the runtime was not running (nothing to pause or end).
pub(crate) fn is_not_running(error: &ProvisionerError) -> bool {
    matches!(error, ProvisionerError::RuntimeNotRunning { .. })
}
