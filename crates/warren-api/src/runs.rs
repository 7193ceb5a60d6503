//! `/v1/sandboxes/{id}/runs` and `/v1/users/{uid}/runs`: the run records (I22), newest
//! first, one page at a time.
//!
//! A page ends with an opaque `next_page_token` naming its last run; the next page lists
//! the runs after it, so paging neither loses nor repeats a run while new ones start. The
//! token is URL-safe base64 of that run's start (unix milliseconds) and id.

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use warren_protocol::{RunInfo, RunKind, RunList, RunStatus};
use warren_store::{RunCursor, RunQuery, RunRecord, RunScope};

use crate::extract::{uid, ApiPath, ApiQuery, SandboxPath};
use crate::{ApiError, ApiState};

/// A page's size when the query names none.
const DEFAULT_LIMIT: u32 = 50;

/// The longest page token the server reads: it issues far shorter ones.
pub(crate) const MAX_PAGE_TOKEN: usize = 1024;

const TOKEN: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunsQuery {
    /// Only runs in this status.
    status: Option<RunStatus>,
    /// Only runs started at or after this time (RFC 3339).
    since: Option<String>,
    /// Most runs on the page (default 50, at most 500).
    limit: Option<u32>,
    /// The `next_page_token` of the previous page.
    page_token: Option<String>,
}

/// One page of the sandbox's runs, in all its generations.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/runs", tag = "runs",
    params(("id" = String, Path, description = "Sandbox id"), RunsQuery),
    responses(
        (status = 200, body = RunList),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_page_token: page_token is not a next_page_token this server issued; invalid_query: status, since or limit is malformed or out of range"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn of_sandbox(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<RunsQuery>,
) -> Result<Json<RunList>, ApiError> {
    page(&state, RunScope::Sandbox(id), query).await
}

/// One page of the runs of every sandbox of the user; none when it has no sandboxes.
#[utoipa::path(
    get, path = "/v1/users/{uid}/runs", tag = "runs",
    params(("uid" = String, Path, description = "The workspace owner"), RunsQuery),
    responses(
        (status = 200, body = RunList),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_page_token: page_token is not a next_page_token this server issued; invalid_query: status, since or limit is malformed or out of range"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn of_user(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
    ApiQuery(query): ApiQuery<RunsQuery>,
) -> Result<Json<RunList>, ApiError> {
    let uid = uid(raw_uid)?;
    page(&state, RunScope::Uid(uid), query).await
}

async fn page(
    state: &ApiState,
    scope: RunScope,
    query: RunsQuery,
) -> Result<Json<RunList>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    // Refused rather than clamped, as the document says.
    if !(1..=RunQuery::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(
            warren_protocol::code!(400, "invalid_query"),
            format!("limit is 1 to {}", RunQuery::MAX_LIMIT),
        ));
    }
    let since = query
        .since
        .as_deref()
        .map(|since| {
            DateTime::parse_from_rfc3339(since)
                .map(|since| since.with_timezone(&Utc))
                .map_err(|error| {
                    ApiError::bad_request(
                        warren_protocol::code!(400, "invalid_query"),
                        format!("since is not an RFC 3339 time: {error}"),
                    )
                })
        })
        .transpose()?;
    let after = query.page_token.as_deref().map(read_token).transpose()?;
    let page = state
        .provisioner
        .runs(&RunQuery {
            scope,
            status: query.status.map(|status| match status {
                RunStatus::Running => warren_store::RunStatus::Running,
                RunStatus::Finished => warren_store::RunStatus::Finished,
                RunStatus::Failed => warren_store::RunStatus::Failed,
            }),
            since,
            limit,
            after,
        })
        .await?;
    Ok(Json(RunList {
        runs: page.runs.iter().map(info).collect(),
        next_page_token: page.next.as_ref().map(write_token),
    }))
}

fn time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Stored figures are never negative; one that is reads as absent rather than wrapped.
fn figure(value: Option<i64>) -> Option<u64> {
    value.and_then(|value| u64::try_from(value).ok())
}

fn info(run: &RunRecord) -> RunInfo {
    RunInfo {
        id: run.id.clone(),
        sandbox_id: run.sandbox_id.to_string(),
        generation: run.generation,
        kind: match run.kind {
            warren_store::RunKind::Exec => RunKind::Exec,
            warren_store::RunKind::Process => RunKind::Process,
            warren_store::RunKind::Code => RunKind::Code,
        },
        tag: run.tag.clone(),
        pty: run.pty,
        command: run.command.clone(),
        // A virtual path, as recorded (I1).
        cwd: run.cwd.clone(),
        requested_by: run.requested_by.clone(),
        status: match run.status {
            warren_store::RunStatus::Running => RunStatus::Running,
            warren_store::RunStatus::Finished => RunStatus::Finished,
            warren_store::RunStatus::Failed => RunStatus::Failed,
        },
        started_at: time(run.started_at),
        finished_at: run.finished_at.map(time),
        exit_code: run.exit_code,
        signal: run.signal,
        timed_out: run.timed_out,
        duration_ms: figure(run.duration_ms),
        cpu_user_ms: figure(run.cpu_user_ms),
        cpu_system_ms: figure(run.cpu_system_ms),
        peak_memory_bytes: figure(run.peak_memory_bytes),
        failure_reason: run.failure_reason.clone(),
    }
}

/// `<started_at in unix milliseconds>.<id>`, URL-safe base64 without padding.
fn write_token(cursor: &RunCursor) -> String {
    TOKEN.encode(format!(
        "{}.{}",
        cursor.started_at.timestamp_millis(),
        cursor.id
    ))
}

/// The cursor a token names; anything but a token [`write_token`] could have written is
/// 400 `invalid_page_token`.
fn read_token(token: &str) -> Result<RunCursor, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            warren_protocol::code!(400, "invalid_page_token"),
            "page_token is not a next_page_token this server issued; start again without it",
        )
    };
    if token.is_empty() || token.len() > MAX_PAGE_TOKEN {
        return Err(invalid());
    }
    let bytes = TOKEN.decode(token).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let (millis, id) = text.split_once('.').ok_or_else(invalid)?;
    // Digits only (and a sign): `i64::from_str` would also take a leading `+`.
    if millis.is_empty()
        || !millis
            .trim_start_matches('-')
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        return Err(invalid());
    }
    let started_at = millis
        .parse::<i64>()
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .ok_or_else(invalid)?;
    Ok(RunCursor {
        started_at,
        id: id.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_names_the_cursor_it_was_written_from() {
        for id in ["3f1c2a9e-0b7d-4c55-9a51-0d3b8c4e7f21", "run.with.dots", ""] {
            let cursor = RunCursor {
                started_at: DateTime::from_timestamp_millis(1_700_000_000_123).unwrap(),
                id: id.to_owned(),
            };
            let token = write_token(&cursor);
            assert!(token.len() <= MAX_PAGE_TOKEN);
            assert!(token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            assert_eq!(read_token(&token).unwrap(), cursor);
        }
    }

    #[test]
    fn a_page_token_the_server_could_not_have_written_is_refused() {
        let encoded = |text: &str| TOKEN.encode(text);
        for token in [
            String::new(),
            "not a token!".to_owned(),
            "a".repeat(MAX_PAGE_TOKEN + 1),
            encoded("no separator"),
            encoded(".id"),
            encoded("+12.id"),
            encoded("12x.id"),
            encoded("99999999999999999.id"),
            TOKEN.encode([0xff, 0xfe, b'.', b'x']),
        ] {
            let error = read_token(&token).unwrap_err();
            assert_eq!(
                (error.status().as_u16(), error.code()),
                (400, "invalid_page_token"),
                "{token}"
            );
        }
    }

    #[test]
    fn the_document_holds_both_listings_to_the_rules_the_server_enforces() {
        let doc = crate::openapi_document();
        for path in ["/v1/sandboxes/{id}/runs", "/v1/users/{uid}/runs"] {
            let operation = &doc["paths"][path]["get"];
            let parameter = |name: &str| {
                operation["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == name)
                    .unwrap_or_else(|| panic!("{path}: no {name}"))["schema"]
                    .clone()
            };
            assert_eq!(
                parameter("limit"),
                serde_json::json!({"type": "integer", "minimum": 1, "maximum": 500}),
                "{path}"
            );
            assert_eq!(
                parameter("status")["enum"],
                serde_json::json!(["running", "finished", "failed"]),
                "{path}"
            );
            assert_eq!(parameter("since")["format"], "date-time", "{path}");
            assert_eq!(
                parameter("page_token")["pattern"],
                "^[A-Za-z0-9_-]{1,1024}$",
                "{path}"
            );
            let answer = &operation["responses"]["200"]["content"]["application/json"]["schema"];
            assert_eq!(answer["$ref"], "#/components/schemas/RunList", "{path}");
            for status in ["400", "401", "503"] {
                assert!(
                    operation["responses"][status].is_object(),
                    "{path} {status}"
                );
            }
        }
        assert!(doc["paths"]["/v1/sandboxes/{id}/runs"]["get"]["responses"]["404"].is_object());
        // The generic `limit` elsewhere keeps its own bounds.
        let files = &doc["paths"]["/v1/sandboxes/{id}/files/list"]["get"]["parameters"];
        let limit = files
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "limit")
            .unwrap();
        assert_eq!(limit["schema"]["maximum"], 10000);
        let info = &doc["components"]["schemas"]["RunInfo"];
        assert_eq!(
            doc["components"]["schemas"]["RunKind"]["enum"],
            serde_json::json!(["exec", "process", "code"])
        );
        assert_eq!(
            info["properties"]["status"]["$ref"],
            "#/components/schemas/RunStatus"
        );
    }
}
