//! E2B's control plane (`X-API-Key`): sandboxes created, listed, connected, paused, timed
//! out and killed. Each E2B sandbox is a warren sandbox of the key's uid; what E2B adds
//! (metadata, deadline, pause state) is a transport record in the state store
//! ([`crate::state`]), written at the version read so replicas never both win.

mod deadlines;
mod lifecycle;
mod metrics;
mod sandboxes;
mod snapshots;
mod wire;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get, post};
use axum::Router;
use warren_core::Uid;
use warren_provisioner::{ProvisionerError, RecordWrite};
use warren_store::StoreError;

use crate::error::ApiFailure;
use crate::state::{record_key, E2bSandbox, E2bState, RECORD_NAMESPACE};
use crate::{E2bError, Shared};

pub(crate) use deadlines::spawn_deadlines;

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
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh))
        .route("/sandboxes/{id}/pause", post(lifecycle::pause))
        .route("/sandboxes/{id}/resume", post(lifecycle::resume))
        .route("/sandboxes/{id}/connect", post(lifecycle::connect))
        .route("/v2/sandboxes/{id}/connect", post(lifecycle::connect))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
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

/// A sandbox's record and the version it was read at.
pub(crate) async fn load(
    shared: &Shared,
    sandbox_id: &str,
) -> Result<Option<(E2bSandbox, i64)>, E2bError> {
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
    let sandbox = serde_json::from_slice(&record.value).map_err(|_| E2bError::CorruptRecord)?;
    Ok(Some((sandbox, record.version)))
}

/// Writes a sandbox's record if it is still as read; [`E2bError::Conflict`] if not.
pub(crate) async fn save(
    shared: &Shared,
    sandbox: &E2bSandbox,
    expected: RecordWrite,
) -> Result<i64, E2bError> {
    let bytes = serde_json::to_vec(sandbox).map_err(|_| E2bError::CorruptRecord)?;
    match shared
        .provisioner
        .put_record(
            RECORD_NAMESPACE,
            &record_key(&sandbox.sandbox_id),
            &bytes,
            expected,
        )
        .await
    {
        Ok(version) => Ok(version),
        Err(ProvisionerError::Store(StoreError::RecordConflict { .. })) => Err(E2bError::Conflict),
        Err(error) => Err(error.into()),
    }
}

/// The sandbox of `uid` that `sandbox_id` names, and its version; 404 for another uid's,
/// exactly as for one that does not exist.
pub(crate) async fn owned(
    shared: &Shared,
    uid: &Uid,
    sandbox_id: &str,
) -> Result<(E2bSandbox, i64), ApiFailure> {
    match load(shared, sandbox_id).await? {
        Some((sandbox, version)) if &sandbox.uid == uid => Ok((sandbox, version)),
        _ => Err(ApiFailure::sandbox_not_found(sandbox_id)),
    }
}

/// [`owned`], and 404 for a running sandbox past its deadline as well: for clients it is
/// gone already (list and connect say so); the deadline task ends what is left of it.
pub(crate) async fn owned_unexpired(
    shared: &Shared,
    uid: &Uid,
    sandbox_id: &str,
) -> Result<(E2bSandbox, i64), ApiFailure> {
    let (sandbox, version) = owned(shared, uid, sandbox_id).await?;
    if sandbox.state == E2bState::Running && sandbox.end_at <= chrono::Utc::now() {
        return Err(ApiFailure::sandbox_not_found(sandbox_id));
    }
    Ok((sandbox, version))
}

/// The sandbox `sandbox_id` names when it runs: a paused one, or one whose timeout passed
/// (the deadline task may not have ended it yet), is not live.
pub(crate) async fn live_sandbox(
    shared: &Shared,
    sandbox_id: &str,
) -> Result<Option<E2bSandbox>, E2bError> {
    Ok(load(shared, sandbox_id)
        .await?
        .map(|(sandbox, _)| sandbox)
        .filter(is_live))
}

/// Every live sandbox of the server, at most `limit` (the newest first).
pub(crate) async fn live_sandboxes(
    shared: &Shared,
    limit: usize,
) -> Result<Vec<E2bSandbox>, E2bError> {
    let mut live: Vec<E2bSandbox> = all_sandboxes(shared)
        .await?
        .into_iter()
        .map(|(sandbox, _)| sandbox)
        .filter(is_live)
        .collect();
    live.sort_by_key(|sandbox| std::cmp::Reverse(sandbox.started_at));
    live.truncate(limit);
    Ok(live)
}

fn is_live(sandbox: &E2bSandbox) -> bool {
    sandbox.state == E2bState::Running && sandbox.end_at > chrono::Utc::now()
}

/// Every E2B sandbox record, with its version; unreadable records are logged and skipped.
pub(crate) async fn all_sandboxes(shared: &Shared) -> Result<Vec<(E2bSandbox, i64)>, E2bError> {
    let records = shared
        .provisioner
        .list_records(RECORD_NAMESPACE, "sandboxes/")
        .await?;
    Ok(records
        .into_iter()
        .filter_map(|record| match serde_json::from_slice(&record.value) {
            Ok(sandbox) => Some((sandbox, record.version)),
            Err(error) => {
                tracing::warn!(key = %record.key, %error, "skipping an unreadable E2B sandbox record");
                None
            }
        })
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
