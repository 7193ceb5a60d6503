//! E2B snapshots: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`, `DELETE
//! /templates/{id}`, and the lookup that lets a create name a snapshot as its template.
//!
//! A snapshot of an E2B sandbox is two records of warren's: a runtime snapshot (the
//! copy-on-write system layer: installed packages and files outside the home; the E2B
//! layout's home is the workdir, so it is not in it) and a checkpoint of the workdir
//! (content-addressed, deduplicated in the uid's store). What ties them together is a
//! transport record (namespace `e2b`, key `snapshots/<snapshotID>`). A sandbox created
//! from it starts its runtime from the runtime snapshot and its new workdir is filled from
//! the checkpoint. Memory and running processes are not kept (as with pause).
//!
//! Both records belong to the source sandbox, under its retention (the newest few of each
//! per sandbox): a sandbox that takes many snapshots sees its oldest ones become
//! unusable (a create from them answers 404). Deleting a snapshot forgets its record; the
//! checkpoint and runtime snapshot stay with the source sandbox until its retention drops
//! them and the uid's garbage collection takes their data.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use warren_core::{SandboxId, Uid};
use warren_provisioner::{ProvisionerError, RecordWrite};
use warren_store::StoreError;

use super::{caller, parse_body};
use crate::error::{shorten, ApiFailure};
use crate::state::RECORD_NAMESPACE;
use crate::{E2bError, Shared};

/// Why warren's runtime snapshot was taken, as its record says.
const SNAPSHOT_REASON: &str = "e2b-snapshot";

/// The longest snapshot name.
const MAX_NAME_LEN: usize = 128;

/// One E2B snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct E2bSnapshot {
    /// E2B's id (`snapshotID`): 20 lowercase letters and digits.
    pub(crate) snapshot_id: String,
    /// Whose it is: only this uid's keys see or use it.
    pub(crate) uid: Uid,
    /// The names it was given (at most one today), usable as a template id too.
    pub(crate) names: Vec<String>,
    /// The template of the source sandbox: a sandbox made from the snapshot runs on it.
    pub(crate) template_id: String,
    /// The E2B sandbox it was taken of.
    pub(crate) source_sandbox_id: String,
    /// The warren sandbox behind it, which holds the checkpoint and runtime snapshot.
    pub(crate) source_warren_id: SandboxId,
    /// warren's runtime snapshot (none when the source had never run a runtime to take).
    pub(crate) runtime_snapshot: Option<String>,
    /// warren's checkpoint of the workdir.
    pub(crate) checkpoint: String,
    /// When it was taken.
    pub(crate) created_at: DateTime<Utc>,
}

impl E2bSnapshot {
    /// Whether `wanted` (a template id as a create or filter gives it) names this
    /// snapshot: its id or one of its names, with or without the `:default` tag.
    fn is_named(&self, wanted: &str) -> bool {
        let wanted = wanted.strip_suffix(":default").unwrap_or(wanted);
        self.snapshot_id == wanted || self.names.iter().any(|name| name == wanted)
    }

    fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            snapshot_id: self.snapshot_id.clone(),
            names: self.names.clone(),
        }
    }
}

/// The key of a snapshot's record.
fn snapshot_key(snapshot_id: &str) -> String {
    format!("snapshots/{snapshot_id}")
}

/// `SnapshotInfo` as the SDKs read it.
#[derive(Debug, Serialize)]
pub(crate) struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SnapshotRequest {
    /// A name the snapshot can be created from as well as by its id.
    #[serde(default)]
    name: Option<String>,
    /// Whether memory is kept: warren never keeps it (as with pause); accepted and ignored.
    #[serde(default)]
    #[allow(dead_code)]
    memory: Option<bool>,
}

/// Every snapshot of `uid`, with its record's version.
async fn snapshots_of(shared: &Shared, uid: &Uid) -> Result<Vec<(E2bSnapshot, i64)>, E2bError> {
    let records = shared
        .provisioner
        .list_records(RECORD_NAMESPACE, "snapshots/")
        .await?;
    Ok(records
        .into_iter()
        .filter_map(
            |record| match serde_json::from_slice::<E2bSnapshot>(&record.value) {
                Ok(snapshot) => Some((snapshot, record.version)),
                Err(error) => {
                    tracing::warn!(key = %record.key, %error, "skipping an unreadable E2B snapshot record");
                    None
                }
            },
        )
        .filter(|(snapshot, _)| &snapshot.uid == uid)
        .collect())
}

/// The snapshot of `uid` that `template_id` names (its id or a name); another uid's is
/// not found, exactly like one that does not exist.
pub(crate) async fn find(
    shared: &Shared,
    uid: &Uid,
    template_id: &str,
) -> Result<Option<(E2bSnapshot, i64)>, E2bError> {
    Ok(snapshots_of(shared, uid)
        .await?
        .into_iter()
        .find(|(snapshot, _)| snapshot.is_named(template_id)))
}

/// A name E2B would take: 1 to 128 letters, digits or `-_./`, not a template's.
fn check_name(shared: &Shared, name: &str) -> Result<(), ApiFailure> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if !valid {
        return Err(ApiFailure::bad_request(format!(
            "snapshot name {:?} must be 1 to {MAX_NAME_LEN} letters, digits or `-_./`",
            shorten(name)
        )));
    }
    if shared.config.template(name).is_some() {
        return Err(ApiFailure::new(
            StatusCode::CONFLICT,
            format!("{:?} is the name of a template", shorten(name)),
        ));
    }
    Ok(())
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{snapshotID, names}`; 404 for a sandbox that is
/// not the key's uid's (or is gone), 409 for a name the uid's snapshots already use.
pub(crate) async fn create(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: SnapshotRequest = parse_body(&body)?;
    let sandbox = super::owned(&shared, &uid, &id).await?.e2b;
    let names: Vec<String> = request
        .name
        .filter(|name| !name.is_empty())
        .into_iter()
        .collect();
    for name in &names {
        check_name(&shared, name)?;
        if find(&shared, &uid, name).await?.is_some() {
            return Err(ApiFailure::new(
                StatusCode::CONFLICT,
                format!("a snapshot named {:?} exists already", shorten(name)),
            ));
        }
    }
    let runtime_snapshot = match shared
        .provisioner
        .snapshot_runtime(&sandbox.warren_id, SNAPSHOT_REASON)
        .await
    {
        Ok(snapshot) => Some(snapshot.id),
        // Paused, or reclaimed while idle: its latest snapshot (the pause's, the reaper's)
        // is its state.
        Err(ProvisionerError::RuntimeNotRunning { .. }) => shared
            .provisioner
            .list_runtime_snapshots(&sandbox.warren_id)
            .await?
            .pop()
            .map(|snapshot| snapshot.id),
        Err(error) => return Err(error.into()),
    };
    let (checkpoint, _) = shared
        .provisioner
        .create_checkpoint(&sandbox.warren_id)
        .await?;
    let snapshot = E2bSnapshot {
        snapshot_id: super::new_sandbox_id(),
        uid,
        names,
        template_id: sandbox.template_id.clone(),
        source_sandbox_id: sandbox.sandbox_id.clone(),
        source_warren_id: sandbox.warren_id.clone(),
        runtime_snapshot,
        checkpoint: checkpoint.id,
        created_at: Utc::now(),
    };
    let bytes = serde_json::to_vec(&snapshot).map_err(|_| E2bError::CorruptRecord)?;
    match shared
        .provisioner
        .put_record(
            RECORD_NAMESPACE,
            &snapshot_key(&snapshot.snapshot_id),
            &bytes,
            RecordWrite::Create,
        )
        .await
    {
        Ok(_) => {}
        Err(ProvisionerError::Store(StoreError::RecordConflict { .. })) => {
            return Err(E2bError::Conflict.into())
        }
        Err(error) => return Err(error.into()),
    }
    tracing::info!(sandbox = %sandbox.sandbox_id, snapshot = %snapshot.snapshot_id, "E2B snapshot taken");
    Ok((StatusCode::CREATED, Json(snapshot.info())).into_response())
}

/// The query of `GET /snapshots`.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    /// Only the snapshots of this sandbox.
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    /// Only the snapshot with this id or name.
    name: Option<String>,
    /// Most snapshots per page (default 100, at most 1000).
    limit: Option<usize>,
    /// Where the previous page ended.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /snapshots`: the key's uid's snapshots, newest first, a page at a time
/// (`X-Next-Token`).
pub(crate) async fn list(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let mut found: Vec<E2bSnapshot> = snapshots_of(&shared, &uid)
        .await?
        .into_iter()
        .map(|(snapshot, _)| snapshot)
        .filter(|snapshot| {
            query
                .sandbox_id
                .as_ref()
                .is_none_or(|id| &snapshot.source_sandbox_id == id)
        })
        .filter(|snapshot| {
            query
                .name
                .as_ref()
                .is_none_or(|name| snapshot.is_named(name))
        })
        .collect();
    found.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.snapshot_id.cmp(&b.snapshot_id))
    });
    if let Some(token) = &query.next_token {
        let Some(position) = found.iter().position(|s| &s.snapshot_id == token) else {
            return Err(ApiFailure::bad_request(
                "nextToken names no snapshot of this listing",
            ));
        };
        found.drain(..=position);
    }
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let more = found.len() > limit;
    found.truncate(limit);
    let page: Vec<SnapshotInfo> = found.iter().map(E2bSnapshot::info).collect();
    let mut response = Json(page).into_response();
    if more {
        if let Some(value) = found
            .last()
            .and_then(|last| HeaderValue::from_str(&last.snapshot_id).ok())
        {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    Ok(response)
}

/// `DELETE /templates/{id}`: forgets the key's uid's snapshot of that id or name; 204, or
/// 404 for anything else (templates of the configuration are not deleted over the API).
pub(crate) async fn delete(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let not_found = || {
        ApiFailure::new(
            StatusCode::NOT_FOUND,
            format!("snapshot '{}' not found", shorten(&id)),
        )
    };
    let (snapshot, version) = find(&shared, &uid, &id).await?.ok_or_else(not_found)?;
    let deleted = shared
        .provisioner
        .delete_record(
            RECORD_NAMESPACE,
            &snapshot_key(&snapshot.snapshot_id),
            Some(version),
        )
        .await?;
    if !deleted {
        return Err(not_found());
    }
    tracing::info!(snapshot = %snapshot.snapshot_id, "E2B snapshot deleted");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_named_by_its_id_or_names_with_or_without_the_default_tag() {
        let snapshot = E2bSnapshot {
            snapshot_id: "abcdefghij0123456789".into(),
            uid: Uid::new("alice").unwrap(),
            names: vec!["my-snap".into()],
            template_id: "base".into(),
            source_sandbox_id: "zzzzzzzzzzzzzzzzzzzz".into(),
            source_warren_id: SandboxId::derive(
                &Uid::new("alice").unwrap(),
                &warren_core::RuntimeScope::new("e2b-x").unwrap(),
            ),
            runtime_snapshot: None,
            checkpoint: "ckpt-1".into(),
            created_at: Utc::now(),
        };
        assert!(snapshot.is_named("abcdefghij0123456789"));
        assert!(snapshot.is_named("abcdefghij0123456789:default"));
        assert!(snapshot.is_named("my-snap"));
        assert!(snapshot.is_named("my-snap:default"));
        assert!(!snapshot.is_named("my-snap:v2"));
        assert!(!snapshot.is_named("base"));
        let round: E2bSnapshot =
            serde_json::from_slice(&serde_json::to_vec(&snapshot).unwrap()).unwrap();
        assert_eq!(round, snapshot);
    }
}
