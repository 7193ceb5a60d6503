//! E2B's control plane (`X-API-Key`): sandboxes created, listed, connected, paused, timed
//! out, forked and killed. Each E2B sandbox is a warren sandbox of the key's uid, whose
//! life is the provisioner's (pause, resume, deadline, labels as E2B's metadata); what E2B
//! adds (template, environment, reported figures) is a record written once at create or
//! fork ([`crate::state`]).

mod fork;
mod lifecycle;
mod metrics;
mod network;
mod sandboxes;
mod snapshots;
mod wire;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get, post, put};
use axum::Router;
use warren_core::Uid;
use warren_provisioner::{ProvisionerError, RecordWrite};
use warren_store::{SandboxRecord, StoreError};

use crate::error::ApiFailure;
use crate::state::{record_key, E2bSandbox, E2bState, RECORD_NAMESPACE};
use crate::{E2bError, Shared};

/// The control-plane routes.
pub(crate) fn routes(shared: Shared) -> Router {
    Router::new()
        .route(
            "/sandboxes",
            post(sandboxes::create).get(sandboxes::list_running),
        )
        .route(
            "/v2/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get_one).delete(sandboxes::kill),
        )
        // A static segment wins over `{id}` in axum's matching, whatever the order.
        .route("/sandboxes/metrics", get(metrics::sandboxes_metrics))
        .route("/sandboxes/{id}/metrics", get(metrics::sandbox_metrics))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/network", put(sandboxes::update_network))
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh))
        .route("/sandboxes/{id}/pause", post(lifecycle::pause))
        .route("/sandboxes/{id}/resume", post(lifecycle::resume))
        .route("/sandboxes/{id}/connect", post(lifecycle::connect))
        .route("/v2/sandboxes/{id}/connect", post(lifecycle::connect))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete))
        .with_state(shared)
}

/// The uid of the request's `X-API-Key`; 401 in E2B's shape without a known key.
pub(crate) async fn caller(shared: &Shared, headers: &HeaderMap) -> Result<Uid, ApiFailure> {
    let presented = headers
        .get("x-api-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    match shared.keys.uid_of(presented).await {
        Ok(Some(uid)) => Ok(uid),
        Ok(None) => Err(ApiFailure::new(
            StatusCode::UNAUTHORIZED,
            "invalid API key: send X-API-Key with a key warren issued (`warren e2b key create --uid <uid>`)",
        )),
        Err(error) => Err(error.into()),
    }
}

/// Reads a JSON body, answering 400 in E2B's shape when it is not the expected object.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, ApiFailure> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|error| ApiFailure::bad_request(format!("the request body is not valid: {error}")))
}

/// An E2B sandbox that exists: its record and the warren sandbox behind it.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// What E2B adds.
    pub(crate) e2b: E2bSandbox,
    /// The warren sandbox: its state, deadline and labels.
    pub(crate) sandbox: SandboxRecord,
}

impl Found {
    /// What E2B calls its state.
    pub(crate) fn state(&self) -> E2bState {
        E2bState::of(self.sandbox.state).unwrap_or(E2bState::Paused)
    }

    /// Whether commands run in it.
    pub(crate) fn is_running(&self) -> bool {
        E2bState::of(self.sandbox.state) == Some(E2bState::Running)
    }
}

/// A sandbox's record.
pub(crate) async fn load(
    shared: &Shared,
    sandbox_id: &str,
) -> Result<Option<E2bSandbox>, E2bError> {
    if !is_sandbox_id(sandbox_id) {
        return Ok(None);
    }
    let Some(record) = shared
        .provisioner
        .get_record(RECORD_NAMESPACE, &record_key(sandbox_id))
        .await?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&record.value)
        .map(Some)
        .map_err(|_| E2bError::CorruptRecord)
}

/// Writes a new sandbox's record.
pub(crate) async fn save_new(shared: &Shared, sandbox: &E2bSandbox) -> Result<(), E2bError> {
    let bytes = serde_json::to_vec(sandbox).map_err(|_| E2bError::CorruptRecord)?;
    match shared
        .provisioner
        .put_record(
            RECORD_NAMESPACE,
            &record_key(&sandbox.sandbox_id),
            &bytes,
            RecordWrite::Create,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(ProvisionerError::Store(StoreError::RecordConflict { .. })) => Err(E2bError::Conflict),
        Err(error) => Err(error.into()),
    }
}

/// The sandbox `sandbox_id` names, with the warren sandbox behind it; `None` once that is
/// being ended or gone (its record then goes too, as nothing can bring it back).
pub(crate) async fn find(shared: &Shared, sandbox_id: &str) -> Result<Option<Found>, E2bError> {
    let Some(e2b) = load(shared, sandbox_id).await? else {
        return Ok(None);
    };
    let sandbox = match shared.provisioner.sandbox(&e2b.warren_id).await {
        Ok(sandbox) => sandbox,
        Err(ProvisionerError::SandboxNotFound(_)) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    Ok(join(e2b, sandbox, shared).await)
}

/// `e2b` with its warren sandbox, or `None` (and its record forgotten) once that ended.
async fn join(e2b: E2bSandbox, sandbox: SandboxRecord, shared: &Shared) -> Option<Found> {
    if E2bState::of(sandbox.state).is_some() {
        return Some(Found { e2b, sandbox });
    }
    if sandbox.state == warren_store::SandboxState::Terminated {
        forget(shared, &e2b.sandbox_id).await;
    }
    None
}

/// Forgets a sandbox's record (best effort: a leftover is forgotten on its next read).
pub(crate) async fn forget(shared: &Shared, sandbox_id: &str) {
    if let Err(error) = shared
        .provisioner
        .delete_record(RECORD_NAMESPACE, &record_key(sandbox_id), None)
        .await
    {
        tracing::warn!(sandbox = %sandbox_id, %error, "could not forget an E2B sandbox");
    }
}

/// The sandbox of `uid` that `sandbox_id` names; 404 for another uid's, exactly as for one
/// that does not exist.
pub(crate) async fn owned(
    shared: &Shared,
    uid: &Uid,
    sandbox_id: &str,
) -> Result<Found, ApiFailure> {
    match find(shared, sandbox_id).await? {
        Some(found) if &found.e2b.uid == uid => Ok(found),
        _ => Err(ApiFailure::sandbox_not_found(sandbox_id)),
    }
}

/// The sandbox `sandbox_id` names when commands run in it (not paused, not ended).
pub(crate) async fn live_sandbox(
    shared: &Shared,
    sandbox_id: &str,
) -> Result<Option<E2bSandbox>, E2bError> {
    Ok(find(shared, sandbox_id)
        .await?
        .filter(Found::is_running)
        .map(|found| found.e2b))
}

/// Every sandbox of `uid` (of everyone with `None`) that exists, newest first: one read of
/// the records and one of the sandboxes.
pub(crate) async fn all_sandboxes(
    shared: &Shared,
    uid: Option<&Uid>,
) -> Result<Vec<Found>, E2bError> {
    let records = shared
        .provisioner
        .list_records(RECORD_NAMESPACE, "sandboxes/")
        .await?;
    let mut sandboxes: std::collections::HashMap<_, _> = shared
        .provisioner
        .list_sandboxes(uid)
        .await?
        .into_iter()
        .map(|sandbox| (sandbox.id.clone(), sandbox))
        .collect();
    let mut found = Vec::new();
    for record in records {
        let e2b: E2bSandbox = match serde_json::from_slice(&record.value) {
            Ok(e2b) => e2b,
            Err(error) => {
                tracing::warn!(key = %record.key, %error, "skipping an unreadable E2B sandbox record");
                continue;
            }
        };
        if uid.is_some_and(|uid| uid != &e2b.uid) {
            continue;
        }
        if let Some(sandbox) = sandboxes.remove(&e2b.warren_id) {
            found.extend(join(e2b, sandbox, shared).await);
        }
    }
    found.sort_by(|a, b| {
        b.sandbox
            .created_at
            .cmp(&a.sandbox.created_at)
            .then_with(|| a.e2b.sandbox_id.cmp(&b.e2b.sandbox_id))
    });
    Ok(found)
}

/// Every sandbox of the server commands run in, at most `limit` (the newest first).
pub(crate) async fn live_sandboxes(
    shared: &Shared,
    limit: usize,
) -> Result<Vec<E2bSandbox>, E2bError> {
    Ok(all_sandboxes(shared, None)
        .await?
        .into_iter()
        .filter(Found::is_running)
        .take(limit)
        .map(|found| found.e2b)
        .collect())
}

/// Whether `id` has the form of the ids warren gives: 20 lowercase letters and digits.
pub(crate) fn is_sandbox_id(id: &str) -> bool {
    id.len() == SANDBOX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The length of E2B sandbox ids warren gives.
pub(crate) const SANDBOX_ID_LEN: usize = 20;

/// A new sandbox id: 20 lowercase letters and digits, as E2B's own.
pub(crate) fn new_sandbox_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..SANDBOX_ID_LEN)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sandbox_ids_have_the_form_ids_are_checked_against() {
        for _ in 0..100 {
            assert!(is_sandbox_id(&new_sandbox_id()));
        }
        assert!(!is_sandbox_id("../../etc/passwd"));
        assert!(!is_sandbox_id("ABCDEFGHIJKLMNOPQRST"));
        assert!(!is_sandbox_id(""));
    }
}
