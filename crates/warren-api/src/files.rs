//! `/v1/sandboxes/{id}/files…`: file operations by virtual path (I1, I2, I27).
//!
//! Reads carry an `ETag`; writes and edits accept `If-Match` (and `If-None-Match: *` for
//! create-only) and answer 412 on a mismatch, so concurrent writers never lose an update
//! silently.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use warren_core::VirtualPath;
use warren_fs::{ByteRange, Entry, Etag, GrepOptions, WriteOptions};
use warren_protocol::{
    EditFile, EditResult, FileEntry, FileList, GlobFiles, GrepFiles, GrepMatch, GrepResult,
    MakeDirectory, MakeDirectoryResult, MoveFile, MoveResult, WriteResult,
};

use crate::extract::{ApiBytes, ApiJson, ApiQuery, Fence, SandboxPath};
use crate::{ApiError, ApiState};

const MAX_LIST_LIMIT: usize = 10_000;
const MAX_DEPTH: u32 = 64;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// Virtual path: absolute under /home/gem/user-data or /home/gem/skills, or relative to
    /// the workdir.
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WriteQuery {
    /// Virtual path of the file.
    path: String,
    /// Append to the file instead of replacing it.
    #[serde(default)]
    append: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RemoveQuery {
    /// Virtual path to delete.
    path: String,
    /// Delete a directory and everything in it (symlinks inside are removed, never followed).
    #[serde(default)]
    recursive: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Directory to list; default: the workdir.
    path: Option<String>,
    /// Levels to descend (1 = direct children; default 1, at most 64).
    depth: Option<u32>,
    /// Most entries returned (default 1000, at most 10000).
    limit: Option<usize>,
}

fn entry(path: &VirtualPath, entry: &Entry) -> FileEntry {
    FileEntry {
        path: path.rebase(&entry.path).to_string(),
        kind: entry.kind.as_str().to_owned(),
        size: entry.size,
        mode: entry.mode & 0o7777,
        modified: chrono::DateTime::from_timestamp_millis(entry.modified_unix_ms)
            .unwrap_or_default()
            .to_rfc3339(),
    }
}

fn etag_header(etag: &Etag) -> HeaderValue {
    // An ETag is `b3-` plus hex digits, always a valid header value.
    HeaderValue::from_str(&etag.quoted()).expect("etags are ascii")
}

/// The one strong ETag an `If-Match` value (or an edit's `if_match`) names.
///
/// A value that is not entity-tag syntax at all is 400 `invalid_etag`. Well-formed tags
/// warren never issued (another server's, a weak `W/"…"` one, which strong comparison never
/// matches, or an empty list) cannot match the file's current content: they compare as
/// [`Etag::unmatchable`], so the precondition fails with 412 once the file is looked at,
/// as RFC 9110 §13.1.1 says, rather than as a malformed request.
fn parse_etag(value: &str) -> Result<Etag, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            warren_protocol::code!(400, "invalid_etag"),
            format!("{value:?} is not an entity tag (a quoted ETag, as warren issues them)"),
        )
    };
    let mut issued = Vec::new();
    for member in list_members(value).ok_or_else(invalid)? {
        if let Ok(etag) = member.parse::<Etag>() {
            issued.push(etag);
        } else if !is_entity_tag(member) {
            return Err(invalid());
        }
    }
    match issued.len() {
        0 => Ok(Etag::unmatchable()),
        1 => Ok(issued.remove(0)),
        _ => Err(ApiError::bad_request(
            warren_protocol::code!(400, "invalid_precondition"),
            "name one ETag: a write or an edit checks against exactly one version",
        )),
    }
}

/// The members of a `#entity-tag` list: quoted tags may hold commas, empty members are
/// skipped (RFC 9110 §5.6.1). `None` when a quote is never closed.
fn list_members(value: &str) -> Option<Vec<&str>> {
    let mut members = Vec::new();
    let mut rest = value;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return Some(members);
        }
        let opaque_start = if rest.starts_with("W/\"") { 2 } else { 0 };
        let end = if rest[opaque_start..].starts_with('"') {
            opaque_start + 1 + rest[opaque_start + 1..].find('"')? + 1
        } else {
            rest.find(',').unwrap_or(rest.len())
        };
        members.push(rest[..end].trim_end_matches([' ', '\t']));
        rest = &rest[end..];
    }
}

/// `entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE` (RFC 9110 §8.8.3).
fn is_entity_tag(value: &str) -> bool {
    let opaque = value.strip_prefix("W/").unwrap_or(value);
    opaque.len() >= 2
        && opaque.starts_with('"')
        && opaque.ends_with('"')
        && opaque[1..opaque.len() - 1]
            .bytes()
            .all(|b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
}

/// `If-Match` (one strong ETag) and `If-None-Match: *` as write preconditions.
fn preconditions(headers: &HeaderMap) -> Result<(Option<Etag>, bool), ApiError> {
    let if_match = headers
        .get(header::IF_MATCH)
        .map(|v| {
            v.to_str()
                .map_err(|_| {
                    ApiError::bad_request(
                        warren_protocol::code!(400, "invalid_etag"),
                        "If-Match is not ASCII",
                    )
                })
                .and_then(parse_etag)
        })
        .transpose()?;
    let if_none_match_any = match headers.get(header::IF_NONE_MATCH) {
        None => false,
        Some(v) if v.as_bytes() == b"*" => true,
        Some(_) => {
            return Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_precondition"),
                "only `If-None-Match: *` (create only) is supported on writes",
            ))
        }
    };
    Ok((if_match, if_none_match_any))
}

/// Parses a single-range `Range: bytes=…` header. Multiple ranges are not supported.
pub(crate) fn byte_range(headers: &HeaderMap) -> Result<Option<ByteRange>, ApiError> {
    let Some(value) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            warren_protocol::code!(StatusCode::RANGE_NOT_SATISFIABLE.as_u16(), "invalid_range"),
            "Range must be one `bytes=start-end`, `bytes=start-` or `bytes=-suffix`",
        )
    };
    let spec = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().strip_prefix("bytes="))
        .ok_or_else(invalid)?;
    let (start, end) = spec.split_once('-').ok_or_else(invalid)?;
    let number = |s: &str| s.trim().parse::<u64>().map_err(|_| invalid());
    let range = match (start.trim().is_empty(), end.trim().is_empty()) {
        (true, false) => ByteRange::Suffix { len: number(end)? },
        (false, true) => ByteRange::Span {
            start: number(start)?,
            end_inclusive: None,
        },
        (false, false) => {
            let (start, end) = (number(start)?, number(end)?);
            if end < start {
                return Err(invalid());
            }
            ByteRange::Span {
                start,
                end_inclusive: Some(end),
            }
        }
        (true, true) => return Err(invalid()),
    };
    Ok(Some(range))
}

/// Reads a file's bytes (with `Range` support); the `ETag` header identifies the content.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 206, description = "The requested range"),
        (status = 403, body = warren_protocol::ErrorBody, description = "symlink_refused, read_only, ..."),
        (status = 404, body = warren_protocol::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn read(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let range = byte_range(&headers)?;
    let read = state
        .provisioner
        .read(&id, &query.path, range.unwrap_or(ByteRange::FULL))
        .await?;
    Ok(bytes_response(
        read.value,
        range.is_some(),
        HeaderValue::from_static("application/octet-stream"),
    ))
}

/// Bytes read from a file (or an artifact) as a response: `ETag`, `Accept-Ranges`,
/// `nosniff`, and 206 with `Content-Range` when a range was asked for.
pub(crate) fn bytes_response(
    value: warren_fs::ReadResult,
    ranged: bool,
    content_type: HeaderValue,
) -> Response {
    let length = value.bytes.len() as u64;
    let range_start = value.range_start;
    let total_size = value.total_size;
    let mut response = Response::new(Body::from(value.bytes));
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag_header(&value.etag));
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if ranged {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let end = (range_start + length).saturating_sub(1);
        let content_range = format!("bytes {range_start}-{end}/{total_size}");
        response.headers_mut().insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&content_range).expect("digits and ascii"),
        );
    }
    response
}

/// Writes a file atomically from the raw request body (creating parents), or appends to it.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WriteQuery,
        ("If-Match" = Option<String>, Header, description = "Write only if the file's ETag is this one"),
        ("If-None-Match" = Option<String>, Header, description = "`*`: create only")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, body = WriteResult, description = "Created"),
        (status = 200, body = WriteResult, description = "Replaced or appended"),
        (status = 412, body = warren_protocol::ErrorBody, description = "precondition_failed"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn write(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiQuery(query): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    ApiBytes(body): ApiBytes,
) -> Result<Response, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let (if_match, if_none_match_any) = preconditions(&headers)?;
    let options = WriteOptions {
        if_match,
        if_none_match_any,
        create_parents: true,
        mode: None,
    };
    let written = state
        .provisioner
        .write(&id, &query.path, body.to_vec(), options, query.append)
        .await?;
    let status = if written.value.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let etag = etag_header(&written.value.etag);
    let body = WriteResult {
        path: written.path.to_string(),
        etag: written.value.etag.to_string(),
        size: written.value.size,
        created: written.value.created,
    };
    Ok((status, [(header::ETAG, etag)], Json(body)).into_response())
}

/// Deletes a file, an empty directory, or (with `recursive=true`) a directory tree.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveQuery),
    responses((status = 204, description = "Deleted"), (status = 409, body = warren_protocol::ErrorBody, description = "directory_not_empty")),
    security(("bearer" = []))
)]
pub(crate) async fn remove(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiQuery(query): ApiQuery<RemoveQuery>,
) -> Result<StatusCode, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    state
        .provisioner
        .remove(&id, &query.path, query.recursive)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Metadata of one entry (a symlink is reported as one, never followed).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses((status = 200, body = FileEntry)),
    security(("bearer" = []))
)]
pub(crate) async fn stat(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> Result<Json<FileEntry>, ApiError> {
    let found = state.provisioner.stat(&id, &query.path).await?;
    Ok(Json(entry(&found.path, &found.value)))
}

/// Lists a directory to a depth; symlinks are listed, never descended.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ListQuery),
    responses((status = 200, body = FileList)),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<FileList>, ApiError> {
    // Refused rather than clamped, as the document says (1..=64, 1..=10000).
    let depth = query.depth.unwrap_or(1);
    let limit = query.limit.unwrap_or(1000);
    if !(1..=MAX_DEPTH).contains(&depth) || !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(
            warren_protocol::code!(400, "invalid_query"),
            format!("depth is 1 to {MAX_DEPTH} and limit 1 to {MAX_LIST_LIMIT}"),
        ));
    }
    let path = query.path.as_deref().unwrap_or(".");
    let listing = state.provisioner.list(&id, path, depth, limit).await?;
    Ok(Json(FileList {
        path: listing.path.to_string(),
        entries: listing
            .value
            .entries
            .iter()
            .map(|e| entry(&listing.path, e))
            .collect(),
        truncated: listing.value.truncated,
    }))
}

/// Replaces exact text: fails when `old` matches zero times, or more than once unless
/// `replace_all`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/edit", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = EditFile,
    responses(
        (status = 200, body = EditResult),
        (status = 412, body = warren_protocol::ErrorBody, description = "precondition_failed"),
        (status = 422, body = warren_protocol::ErrorBody, description = "edit_no_match or edit_ambiguous"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn edit(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    headers: HeaderMap,
    ApiJson(request): ApiJson<EditFile>,
) -> Result<Response, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let (header_match, _) = preconditions(&headers)?;
    let if_match = match (header_match, request.if_match.as_deref()) {
        (Some(etag), None) => Some(etag),
        (None, Some(body)) => Some(parse_etag(body)?),
        (None, None) => None,
        (Some(header), Some(body)) => {
            let body = parse_etag(body)?;
            if header != body {
                return Err(ApiError::bad_request(
                    warren_protocol::code!(400, "invalid_precondition"),
                    "If-Match and `if_match` disagree",
                ));
            }
            Some(header)
        }
    };
    let edited = state
        .provisioner
        .edit(
            &id,
            &request.path,
            request.old,
            request.new,
            request.replace_all,
            if_match,
        )
        .await?;
    let etag = etag_header(&edited.value.etag);
    let body = EditResult {
        path: edited.path.to_string(),
        etag: edited.value.etag.to_string(),
        replacements: edited.value.replacements as u64,
    };
    Ok(([(header::ETAG, etag)], Json(body)).into_response())
}

/// Finds entries by glob pattern (`**` crosses directories); symlinks are never followed.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/glob", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = GlobFiles,
    responses((status = 200, body = FileList)),
    security(("bearer" = []))
)]
pub(crate) async fn glob(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(request): ApiJson<GlobFiles>,
) -> Result<Json<FileList>, ApiError> {
    let limit = request.limit.unwrap_or(1000).clamp(1, MAX_LIST_LIMIT);
    let base = request.path.as_deref().unwrap_or(".");
    let found = state
        .provisioner
        .glob(&id, base, request.pattern, limit)
        .await?;
    Ok(Json(FileList {
        path: found.path.to_string(),
        entries: found
            .value
            .entries
            .iter()
            .map(|e| entry(&found.path, e))
            .collect(),
        truncated: found.value.truncated,
    }))
}

/// Searches file contents with a regular expression; binary and very large files are skipped.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/grep", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = GrepFiles,
    responses((status = 200, body = GrepResult)),
    security(("bearer" = []))
)]
pub(crate) async fn grep(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiJson(request): ApiJson<GrepFiles>,
) -> Result<Json<GrepResult>, ApiError> {
    let base = request.path.as_deref().unwrap_or(".");
    let options = GrepOptions {
        glob: request.glob,
        case_insensitive: request.case_insensitive,
        max_matches: request.max_matches.unwrap_or(200).clamp(1, MAX_LIST_LIMIT),
        ..GrepOptions::default()
    };
    let found = state
        .provisioner
        .grep(&id, base, request.pattern, options)
        .await?;
    let base = &found.path;
    Ok(Json(GrepResult {
        matches: found
            .value
            .matches
            .iter()
            .map(|m| GrepMatch {
                path: base.rebase(&m.path).to_string(),
                line_number: m.line_number,
                line: m.line.clone(),
            })
            .collect(),
        truncated: found.value.truncated,
        files_scanned: found.value.files_scanned,
    }))
}

/// Creates a directory and its missing parents.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MakeDirectory,
    responses((status = 200, body = MakeDirectoryResult)),
    security(("bearer" = []))
)]
pub(crate) async fn mkdir(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<MakeDirectory>,
) -> Result<Json<MakeDirectoryResult>, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let made = state.provisioner.mkdir(&id, &request.path).await?;
    Ok(Json(MakeDirectoryResult {
        path: made.path.to_string(),
        created: made.value,
    }))
}

/// Moves or renames an entry inside the UserWorkspace.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/move", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MoveFile,
    responses((status = 200, body = MoveResult), (status = 409, body = warren_protocol::ErrorBody, description = "already_exists")),
    security(("bearer" = []))
)]
pub(crate) async fn rename(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<MoveFile>,
) -> Result<Json<MoveResult>, ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let (from, to) = state
        .provisioner
        .rename(&id, &request.from, &request.to, request.overwrite)
        .await?;
    Ok(Json(MoveResult {
        from: from.to_string(),
        to: to.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_lists_split_between_tags_not_inside_them() {
        let warren = format!("b3-{}", "0".repeat(32));
        assert_eq!(
            list_members(&format!(" \"a,b\" ,, W/\"c\", {warren} ,\t\"{warren}\"")),
            Some(vec![
                "\"a,b\"",
                "W/\"c\"",
                warren.as_str(),
                &format!("\"{warren}\""),
            ])
        );
        assert_eq!(list_members(""), Some(vec![]));
        assert_eq!(list_members("\"open"), None);
        // Tags warren never issued cannot match; one of warren's is the precondition.
        assert_eq!(parse_etag("\"a,b\", W/\"c\"").unwrap(), Etag::unmatchable());
        assert_eq!(
            parse_etag(&format!("W/\"x,\", {warren}"))
                .unwrap()
                .to_string(),
            warren
        );
        assert_eq!(parse_etag("garbage").unwrap_err().code(), "invalid_etag");
        assert_eq!(parse_etag("\"a").unwrap_err().code(), "invalid_etag");
    }
}
