//! Creating, reading, listing, timing out and killing E2B sandboxes.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_core::{LayoutName, RuntimeScope};
use warren_provisioner::{DeadlineAction, SandboxRequest, SettingsChange, WorkdirInit};

use super::wire::{NewSandbox, RefreshRequest, Sandbox, SandboxDetail, TimeoutRequest};
use super::{caller, owned, parse_body, save_new, Found};
use crate::error::{shorten, ApiFailure};
use crate::state::{E2bSandbox, E2bState};
use crate::Shared;

/// The disk size reported (`diskSizeMB`): the workdir is the uid's workspace, bounded by
/// the uid's quota where one is set, not by a per-sandbox disk.
const REPORTED_DISK_MB: u64 = 10 * 1024;

/// The timeout a request asks for, within the configured bounds.
pub(crate) fn timeout_of(shared: &Shared, seconds: Option<u64>) -> Result<Duration, ApiFailure> {
    let timeout = seconds
        .map(Duration::from_secs)
        .unwrap_or(shared.config.default_timeout);
    if timeout > shared.config.max_timeout {
        return Err(ApiFailure::bad_request(format!(
            "timeout {}s exceeds the maximum of {}s this server allows",
            timeout.as_secs(),
            shared.config.max_timeout.as_secs()
        )));
    }
    Ok(timeout)
}

/// `POST /sandboxes` and `POST /v2/sandboxes`: a new sandbox of the key's uid, its runtime
/// started before the answer (E2B's create returns a sandbox ready for commands).
pub(crate) async fn create(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: NewSandbox = serde_json::from_slice(&body).map_err(|error| {
        ApiFailure::bad_request(format!("the request body is not valid: {error}"))
    })?;
    let template_not_found = || {
        ApiFailure::new(
            StatusCode::NOT_FOUND,
            format!("template '{}' not found", shorten(&request.template_id)),
        )
    };
    // A template of the configuration, or a snapshot of the key's uid (another uid's is
    // not found, exactly like a template that does not exist).
    let (template, snapshot) = match shared.config.template(&request.template_id) {
        Some(template) => (template, None),
        None => {
            let (snapshot, _) = super::snapshots::find(&shared, &uid, &request.template_id)
                .await?
                .ok_or_else(template_not_found)?;
            let template = shared
                .config
                .template(&snapshot.template_id)
                .ok_or_else(template_not_found)?;
            (template, Some(snapshot))
        }
    };
    let timeout = timeout_of(&shared, request.timeout)?;
    let env_vars = request.env_vars.unwrap_or_default();
    check_env(&env_vars)?;
    let metadata = request.metadata.unwrap_or_default();
    let allow_internet_access = request.allow_internet_access.unwrap_or(true);
    let secure = request.secure.unwrap_or(true);
    let (network, network_rules) = super::network::policy_of(
        &shared.config.internet,
        request.allow_internet_access,
        secure,
        request.network.as_ref(),
    )?;

    let sandbox_id = super::new_sandbox_id();
    let scope = RuntimeScope::new(format!("e2b-{sandbox_id}"))
        .map_err(|error| ApiFailure::bad_request(error.to_string()))?;
    let workdir = format!("e2b/{sandbox_id}");
    // A new home holds the template's, unless a snapshot's checkpoint fills it below.
    let home = template
        .home
        .clone()
        .filter(|_| snapshot.is_none())
        .map(|host_dir| WorkdirInit {
            host_dir: Some(host_dir),
            ..WorkdirInit::default()
        });
    shared
        .provisioner
        .create_workdir_from(&uid, Some(&workdir), home)
        .await?;
    let mut sandbox_request = SandboxRequest::new(uid.clone(), scope);
    sandbox_request.workdir = Some(workdir);
    // E2B's protocol names the policy on every create: its own (`e2b.internet`, narrowed
    // by the request's rules), not the server's default.
    sandbox_request.network = Some(network);
    sandbox_request.backend = template.backend.clone();
    sandbox_request.image = template.image.clone();
    sandbox_request.layout = Some(LayoutName::E2b);
    sandbox_request.from_snapshot = snapshot
        .as_ref()
        .and_then(|snapshot| snapshot.runtime_snapshot.clone());
    // E2B's timeout and auto-pause are the sandbox's deadline; its metadata, its labels.
    sandbox_request.settings = SettingsChange {
        labels: Some(metadata),
        timeout: Some(Some(timeout)),
        on_deadline: Some(if request.auto_pause.unwrap_or(false) {
            DeadlineAction::Pause
        } else {
            DeadlineAction::Terminate
        }),
    };
    let (record, _) = shared.provisioner.create_sandbox(sandbox_request).await?;

    let sandbox = E2bSandbox {
        sandbox_id,
        warren_id: record.id.clone(),
        uid,
        template_id: request.template_id.clone(),
        alias: None,
        env_vars,
        secure,
        allow_internet_access,
        network: network_rules,
        cpu_count: shared.config.cpu_count,
        memory_mb: shared.config.memory_mb,
    };
    record_new(&shared, &sandbox).await?;
    // A snapshot's workdir fills the new one before its runtime starts.
    if let Some(snapshot) = &snapshot {
        if let Err(error) = shared
            .provisioner
            .restore_checkpoint_into(&record.id, &snapshot.source_warren_id, &snapshot.checkpoint)
            .await
        {
            super::lifecycle::end(&shared, &sandbox).await;
            return Err(error.into());
        }
    }
    start_new(&shared, &sandbox).await?;
    Ok((StatusCode::CREATED, Json(answer_of(&shared, &sandbox))).into_response())
}

/// Writes the E2B record of a new warren sandbox (create's, and each of a fork's): the
/// warren sandbox is ended when it cannot be, as nothing would name it.
pub(crate) async fn record_new(shared: &Shared, sandbox: &E2bSandbox) -> Result<(), ApiFailure> {
    if let Err(error) = save_new(shared, sandbox).await {
        super::lifecycle::end(shared, sandbox).await;
        return Err(error.into());
    }
    Ok(())
}

/// Starts a new sandbox's runtime before the answer (E2B's create and fork return
/// sandboxes ready for commands), so a broken template fails the create, not the first
/// command; the sandbox is ended when it cannot start.
pub(crate) async fn start_new(shared: &Shared, sandbox: &E2bSandbox) -> Result<(), ApiFailure> {
    if let Err(error) = shared.provisioner.start_runtime(&sandbox.warren_id).await {
        super::lifecycle::end(shared, sandbox).await;
        return Err(error.into());
    }
    Ok(())
}

/// The `Sandbox` create answers for `sandbox` (and fork for each of its, connect and
/// resume for theirs): with its envd access token when it is secure.
pub(crate) fn answer_of(shared: &Shared, sandbox: &E2bSandbox) -> Sandbox {
    let token = sandbox
        .secure
        .then(|| shared.secrets.access_token(&sandbox.sandbox_id));
    Sandbox::of(sandbox, token, shared.config.domain.as_deref())
}

/// Environment names and values E2B would take, and warren's bounds on them.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), ApiFailure> {
    if env.len() > 256 {
        return Err(ApiFailure::bad_request("at most 256 envVars"));
    }
    for (name, value) in env {
        let valid = !name.is_empty()
            && name.len() <= 256
            && !name.as_bytes()[0].is_ascii_digit()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(ApiFailure::bad_request(format!(
                "envVars name {:?} must be letters, digits and underscores, not starting with a digit",
                shorten(name)
            )));
        }
        if value.len() > 128 * 1024 || value.contains('\0') {
            return Err(ApiFailure::bad_request(format!(
                "envVars value of {name} must be at most 128 KiB without NUL bytes"
            )));
        }
    }
    Ok(())
}

/// `GET /sandboxes/{id}`.
pub(crate) async fn get_one(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<SandboxDetail>, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let found = owned(&shared, &uid, &id).await?;
    let token = found
        .e2b
        .secure
        .then(|| shared.secrets.access_token(&found.e2b.sandbox_id));
    Ok(Json(SandboxDetail::of(
        &found,
        token,
        shared.config.domain.as_deref(),
        REPORTED_DISK_MB,
    )))
}

/// `PUT /sandboxes/{id}/network` (`update_network` in the SDKs): 400, as a sandbox's
/// network policy is part of what it is bound to, fixed at create; 404 for a sandbox that
/// is not the key's uid's.
pub(crate) async fn update_network(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    owned(&shared, &uid, &id).await?;
    Err(ApiFailure::bad_request(
        "changing a sandbox's network rules is not supported by this server: they are fixed \
         at create (network allow_out and deny_out); create a sandbox with the rules wanted",
    ))
}

/// The query of the list routes.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ListQuery {
    /// `k=v&k2=v2`, URL-encoded as one value: every pair must match.
    metadata: Option<String>,
    /// `running`, `paused` or both, comma-separated (v2; default both).
    state: Option<String>,
    /// Where the previous page ended.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// Most sandboxes per page (default 100, at most 1000).
    limit: Option<usize>,
    /// `asc` or `desc` (the default) by start time.
    order: Option<String>,
    /// Only sandboxes started at or after this time (RFC 3339).
    #[serde(rename = "startedAfter")]
    started_after: Option<String>,
    /// Only sandboxes of this template (its id or the alias it was asked for by).
    template: Option<String>,
}

/// `GET /sandboxes`: the running sandboxes of the key's uid (E2B's v1 list).
pub(crate) async fn list_running(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Query(mut query): Query<ListQuery>,
) -> Result<Response, ApiFailure> {
    query.state = Some("running".into());
    query.limit = Some(query.limit.unwrap_or(usize::MAX));
    list_page(&shared, &headers, query).await
}

/// `GET /v2/sandboxes`: the sandboxes of the key's uid in the asked states, a page at a
/// time (`X-Next-Token`).
pub(crate) async fn list(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiFailure> {
    list_page(&shared, &headers, query).await
}

async fn list_page(
    shared: &Shared,
    headers: &HeaderMap,
    query: ListQuery,
) -> Result<Response, ApiFailure> {
    let uid = caller(shared, headers).await?;
    let wanted = parse_metadata_filter(query.metadata.as_deref())?;
    let states: Vec<E2bState> = match query.state.as_deref() {
        None | Some("") => vec![E2bState::Running, E2bState::Paused],
        Some(list) => list
            .split(',')
            .map(|state| match state.trim() {
                "running" => Ok(E2bState::Running),
                "paused" => Ok(E2bState::Paused),
                other => Err(ApiFailure::bad_request(format!(
                    "state {:?} is not running or paused",
                    shorten(other)
                ))),
            })
            .collect::<Result<_, _>>()?,
    };
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let ascending = match query.order.as_deref() {
        None | Some("") | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiFailure::bad_request(format!(
                "order {:?} is not asc or desc",
                shorten(other)
            )))
        }
    };
    let started_after = query
        .started_after
        .as_deref()
        .filter(|text| !text.is_empty())
        .map(parse_time)
        .transpose()?;
    // Newest first (`all_sandboxes`); the page token is the last id handed out, so pages
    // never repeat or skip a sandbox that stays.
    let mut found: Vec<Found> = super::all_sandboxes(shared, Some(&uid))
        .await?
        .into_iter()
        .filter(|found| states.contains(&found.state()))
        .filter(|found| started_after.is_none_or(|after| found.sandbox.created_at >= after))
        .filter(|found| {
            query.template.as_deref().is_none_or(|template| {
                found.e2b.template_id == template || found.e2b.alias.as_deref() == Some(template)
            })
        })
        .filter(|found| {
            wanted
                .iter()
                .all(|(key, value)| found.sandbox.settings.labels.get(key) == Some(value))
        })
        .collect();
    if ascending {
        found.reverse();
    }
    if let Some(token) = &query.next_token {
        let Some(position) = found
            .iter()
            .position(|found| &found.e2b.sandbox_id == token)
        else {
            return Err(ApiFailure::bad_request(
                "nextToken names no sandbox of this listing",
            ));
        };
        found.drain(..=position);
    }
    let more = found.len() > limit;
    found.truncate(limit);
    let page: Vec<SandboxDetail> = found
        .iter()
        .map(|found| SandboxDetail::of(found, None, None, REPORTED_DISK_MB))
        .collect();
    let mut response = Json(page).into_response();
    if more {
        if let Some(last) = found.last() {
            if let Ok(value) = HeaderValue::from_str(&last.e2b.sandbox_id) {
                response.headers_mut().insert("x-next-token", value);
            }
        }
    }
    Ok(response)
}

/// A time as the SDKs send it: RFC 3339, or ISO 8601 without an offset (UTC).
fn parse_time(text: &str) -> Result<chrono::DateTime<chrono::Utc>, ApiFailure> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&chrono::Utc))
        .or_else(|_| {
            text.parse::<chrono::NaiveDateTime>()
                .map(|naive| naive.and_utc())
        })
        .map_err(|_| {
            ApiFailure::bad_request(format!(
                "startedAfter {:?} is not an RFC 3339 time",
                shorten(text)
            ))
        })
}

/// `k=v&k2=v2` as the SDKs encode it (each key and value percent-encoded).
fn parse_metadata_filter(text: Option<&str>) -> Result<Vec<(String, String)>, ApiFailure> {
    let Some(text) = text.filter(|text| !text.is_empty()) else {
        return Ok(Vec::new());
    };
    text.split('&')
        .map(|pair| {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                ApiFailure::bad_request("metadata is key=value pairs joined by &")
            })?;
            Ok((percent_decode(key)?, percent_decode(value)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Result<String, ApiFailure> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| ApiFailure::bad_request("metadata is not UTF-8"))
}

/// `DELETE /sandboxes/{id}`: 204, or 404. The runtime and every process go; the workdir
/// stays in the uid's workspace (I15): warren never loses workspace files.
pub(crate) async fn kill(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let found = owned(&shared, &uid, &id).await?;
    super::lifecycle::kill(&shared, &found.e2b).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends `timeout` seconds from now.
pub(crate) async fn set_timeout(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: TimeoutRequest = serde_json::from_slice(&body).map_err(|error| {
        ApiFailure::bad_request(format!("the request body is not valid: {error}"))
    })?;
    let timeout = timeout_of(&shared, Some(request.timeout))?;
    extend(&shared, &owned(&shared, &uid, &id).await?, timeout, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/refreshes`: keeps the sandbox alive `duration` more seconds.
pub(crate) async fn refresh(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let request: RefreshRequest = parse_body(&body)?;
    let timeout = timeout_of(&shared, request.duration)?;
    extend(&shared, &owned(&shared, &uid, &id).await?, timeout, false).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Moves a running sandbox's deadline to `now + timeout` (`shorten_too`: also earlier).
pub(crate) async fn extend(
    shared: &Shared,
    found: &Found,
    timeout: Duration,
    shorten_too: bool,
) -> Result<(), ApiFailure> {
    if !found.is_running() {
        return Err(ApiFailure::sandbox_not_found(&found.e2b.sandbox_id));
    }
    let later = found
        .sandbox
        .settings
        .deadline
        .is_none_or(|deadline| deadline < warren_provisioner::deadline_after(timeout));
    if shorten_too || later {
        let change = SettingsChange {
            timeout: Some(Some(timeout)),
            ..SettingsChange::default()
        };
        shared
            .provisioner
            .update_settings(&found.sandbox.id, change)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_filter_reads_pairs_as_the_sdks_encode_them() {
        let pairs = parse_metadata_filter(Some("user%20id=a%26b&kind=x")).unwrap();
        assert_eq!(
            pairs,
            [
                ("user id".to_owned(), "a&b".to_owned()),
                ("kind".to_owned(), "x".to_owned())
            ]
        );
        assert!(parse_metadata_filter(Some("novalue")).is_err());
        assert!(parse_metadata_filter(Some("a=%ff")).is_err());
        assert!(parse_metadata_filter(None).unwrap().is_empty());
    }
}
