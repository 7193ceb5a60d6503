//! `POST /sandboxes/{id}/fork`: new E2B sandboxes of the key's uid that start from a
//! sandbox as it is now (`Sandbox.fork()` in the SDKs).
//!
//! The provisioner does the work, every fork in one call (`fork_sandbox`): a running
//! source is paused for it and resumed after (its processes end), the forks start from a
//! runtime snapshot taken then (what is installed outside the home) and each writes a
//! branch of its own of the source's workdir (the home), so no fork sees what another, or
//! the source, writes afterwards. Memory and running processes are not forked (E2B's
//! fork keeps them).
//!
//! What E2B adds to each fork is the record create writes ([`record_new`]): the source's
//! (template, environment, `secure`, internet access, reported figures) under a new
//! sandbox id. A fork gets the source's metadata and auto-pause, and `timeout` as its
//! deadline as create turns it into one; its runtime starts before the answer, as
//! create's does, and its entry is what create answers.
//!
//! E2B answers 201 with one entry per fork, each its sandbox or why it did not start.
//! warren makes the forks in one call of the provisioner: when that call fails, no fork is
//! answered and the failure is the answer's status (404, 409, ...); an entry's `error` is
//! a fork made but whose record or runtime could not be, which is then ended.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_provisioner::SettingsChange;

use super::sandboxes::{answer_of, record_new, start_new, timeout_of};
use super::wire::{ForkRequest, ForkResult};
use super::{caller, owned, parse_body};
use crate::error::ApiFailure;
use crate::state::E2bSandbox;
use crate::Shared;

/// `POST /sandboxes/{id}/fork`: 201 with one [`ForkResult`] per fork; 404 for a sandbox
/// that is not the key's uid's (or is gone), 400 for a `count` outside 1 to 20.
pub(crate) async fn fork(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: ForkRequest = parse_body(&body)?;
    let timeout = timeout_of(&shared, request.timeout)?;
    // The provisioner holds the bound (1 to `MAX_FORKS`) and refuses what is outside it.
    let count = request
        .count
        .map_or(1, |count| usize::try_from(count).unwrap_or(usize::MAX));
    let source = owned(&shared, &uid, &id).await?;
    let settings = SettingsChange {
        labels: Some(source.sandbox.settings.labels.clone()),
        timeout: Some(Some(timeout)),
        on_deadline: Some(source.sandbox.settings.on_deadline),
    };
    let forked = shared
        .provisioner
        .fork_sandbox(&source.sandbox.id, count, settings)
        .await?;
    let source_id = source.e2b.sandbox_id.as_str();
    let entries = futures::future::join_all(forked.forks.iter().map(|fork| {
        let sandbox = E2bSandbox {
            sandbox_id: super::new_sandbox_id(),
            warren_id: fork.id.clone(),
            ..source.e2b.clone()
        };
        let shared = &shared;
        async move {
            let made = match record_new(shared, &sandbox).await {
                Ok(()) => start_new(shared, &sandbox).await,
                Err(failure) => Err(failure),
            };
            match made {
                Ok(()) => {
                    tracing::info!(source = %source_id, fork = %sandbox.sandbox_id, "E2B sandbox forked");
                    ForkResult::Sandbox(answer_of(shared, &sandbox))
                }
                Err(failure) => ForkResult::Error(failure.into_body()),
            }
        }
    }))
    .await;
    Ok((StatusCode::CREATED, Json(entries)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::wire::Sandbox;

    #[test]
    fn an_entry_is_its_sandbox_or_its_error_never_both() {
        let sandbox = E2bSandbox {
            sandbox_id: "abcdefghij0123456789".into(),
            warren_id: warren_core::SandboxId::derive(
                &warren_core::Uid::new("alice").unwrap(),
                &warren_core::RuntimeScope::new("fork-x").unwrap(),
            ),
            uid: warren_core::Uid::new("alice").unwrap(),
            template_id: "base".into(),
            alias: None,
            env_vars: Default::default(),
            secure: true,
            allow_internet_access: true,
            network: None,
            cpu_count: 2,
            memory_mb: 512,
        };
        let made = ForkResult::Sandbox(Sandbox::of(&sandbox, Some("t".into()), None));
        let failed = ForkResult::Error(
            ApiFailure::new(StatusCode::SERVICE_UNAVAILABLE, "no runtime").into_body(),
        );
        let json = serde_json::to_value([made, failed]).unwrap();
        assert_eq!(json[0]["sandbox"]["sandboxID"], "abcdefghij0123456789");
        assert_eq!(json[0]["sandbox"]["envdAccessToken"], "t");
        assert!(json[0].get("error").is_none(), "{json}");
        assert_eq!(
            json[1],
            serde_json::json!({"error": {"code": 503, "message": "no runtime"}})
        );
    }
}
