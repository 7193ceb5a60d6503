//! `GET /v1/sandbox` and the AIO file endpoints (`/v1/file/*`, contract §2.1, §2.7–2.12).
//!
//! Every path goes through the provisioner's file functions with the sandbox's layout
//! (`/mnt/user-data/...`, `/mnt/skills/public/...`, `/mnt/skills/custom/...`), which resolve
//! it by file descriptor beneath the uid's trees: `..`, symlinks, other mounts and other
//! uids' files are refused exactly as on `/v1` (I1, I2, I11). Paths in answers are the
//! requested path followed by what lies below it, as DeerFlow filters results by that
//! prefix (contract §2.11); messages name virtual paths only.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use warren_fs::{ByteRange, Entry, GrepOptions, Kind, WriteOptions};

use super::{ok, AioError, AioJson, AioSandbox, AioState};

/// Most entries one list or find returns.
const MAX_ENTRIES: usize = 10_000;
/// Most matches one grep returns when the caller names no limit.
const DEFAULT_GREP_RESULTS: usize = 1_000;
/// Most matches one grep may ask for.
const MAX_GREP_RESULTS: usize = 10_000;

/// The file routes, relative to a sandbox's URL.
pub(crate) fn routes() -> axum::Router<AioState> {
    axum::Router::new()
        .route("/v1/file/read", post(read))
        .route("/v1/file/write", post(write))
        .route("/v1/file/download", get(download))
        .route("/v1/file/find", post(find))
        .route("/v1/file/list", post(list))
        .route("/v1/file/grep", post(grep))
}

type Answer = Result<Json<serde_json::Value>, AioError>;

/// `GET /v1/sandbox`: the sandbox's context, and DeerFlow's readiness probe. It answers
/// 200 only once the runtime runs and can take a command, so it starts the runtime if
/// it does not run yet (I12: this is the first use).
pub(crate) async fn context(State(state): State<AioState>, sandbox: AioSandbox) -> Answer {
    let record = state.provisioner.start_runtime(&sandbox.id).await?;
    let layout = record.binding.layout.layout();
    let workspace = layout.workdir_path(&record.binding.workdir);
    Ok(Json(serde_json::json!({
        "success": true,
        "message": "ok",
        "data": null,
        "home_dir": layout.home,
        "workspace": workspace,
        "version": concat!("warren-", env!("CARGO_PKG_VERSION")),
        "detail": {
            "system": {
                "os": "linux",
                "os_version": os_version(),
                "arch": std::env::consts::ARCH,
                "user": layout.user,
                "home_dir": layout.home,
                "workspace": workspace,
                "timezone": "UTC",
                "occupied_ports": [],
            },
            "runtime": {"python": [], "nodejs": []},
            "utils": [],
        },
    })))
}

/// The kernel release (runtimes share the host's kernel), or empty.
fn os_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| release.trim().to_owned())
        .unwrap_or_default()
}

/// An absolute path in the sandbox's terms; relative ones are refused (the AIO API has
/// no working directory to resolve them against).
fn absolute(field: &str, path: Option<String>) -> Result<String, AioError> {
    let path = path.ok_or_else(|| AioError::bad_request(format!("{field} is required")))?;
    if !path.starts_with('/') {
        return Err(AioError::bad_request(format!(
            "{field} must be an absolute path in the sandbox, such as /mnt/user-data/workspace/..."
        )));
    }
    Ok(path)
}

/// The requested path as a prefix of result paths: exactly as asked, without trailing
/// slashes.
fn prefix_of(requested: &str) -> &str {
    match requested.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

/// A result path: the requested prefix followed by what the file layer found below it.
fn below(prefix: &str, base_relative: &str, entry_relative: &str) -> String {
    let rest = if base_relative.is_empty() {
        entry_relative
    } else {
        entry_relative
            .strip_prefix(base_relative)
            .map(|rest| rest.trim_start_matches('/'))
            .unwrap_or(entry_relative)
    };
    match (prefix, rest) {
        (prefix, "") => prefix.to_owned(),
        ("/", rest) => format!("/{rest}"),
        (prefix, rest) => format!("{prefix}/{rest}"),
    }
}

#[derive(Debug, Deserialize)]
struct ReadFile {
    file: Option<String>,
    start_line: Option<i64>,
    end_line: Option<i64>,
}

/// `POST /v1/file/read`: the file as text, or lines `[start_line, end_line)` of it
/// (0-based, each keeping its line end).
async fn read(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ReadFile>,
) -> Answer {
    let file = absolute("file", request.file)?;
    let (start, end) = match (request.start_line, request.end_line) {
        (Some(start), _) if start < 0 => {
            return Err(AioError::bad_request("start_line must be 0 or more"))
        }
        (_, Some(end)) if end < 0 => {
            return Err(AioError::bad_request("end_line must be 0 or more"))
        }
        (start, end) => (start.unwrap_or(0) as usize, end.map(|end| end as usize)),
    };
    let read = state
        .provisioner
        .read(&sandbox.id, &file, ByteRange::FULL)
        .await?;
    let text = String::from_utf8_lossy(&read.value.bytes);
    let content: String = if start == 0 && end.is_none() {
        text.into_owned()
    } else {
        let take = end.map_or(usize::MAX, |end| end.saturating_sub(start));
        text.split_inclusive('\n').skip(start).take(take).collect()
    };
    Ok(ok(serde_json::json!({"file": file, "content": content})))
}

#[derive(Debug, Deserialize)]
struct WriteFile {
    file: Option<String>,
    content: Option<String>,
    encoding: Option<String>,
    append: Option<bool>,
    leading_newline: Option<bool>,
    trailing_newline: Option<bool>,
}

/// `POST /v1/file/write`: writes (or appends) text or base64-decoded bytes, creating
/// missing parent directories as the sandbox user (I11). Under the read-only skills
/// mounts it is refused (403).
async fn write(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<WriteFile>,
) -> Answer {
    let file = absolute("file", request.file)?;
    let content = request
        .content
        .ok_or_else(|| AioError::bad_request("content is required"))?;
    let bytes = match request
        .encoding
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("utf-8" | "utf8" | "raw" | "text") => {
            let mut text = String::with_capacity(content.len() + 2);
            if request.leading_newline == Some(true) {
                text.push('\n');
            }
            text.push_str(&content);
            if request.trailing_newline == Some(true) {
                text.push('\n');
            }
            text.into_bytes()
        }
        Some("base64") => decode_base64(&content)?,
        Some(other) => {
            return Err(AioError::bad_request(format!(
                "encoding {:?} is not supported: use utf-8 or base64",
                other.chars().take(40).collect::<String>()
            )))
        }
    };
    let written = bytes.len();
    let options = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    state
        .provisioner
        .write(
            &sandbox.id,
            &file,
            bytes,
            options,
            request.append == Some(true),
        )
        .await?;
    Ok(ok(
        serde_json::json!({"file": file, "bytes_written": written}),
    ))
}

/// Standard base64, padded or not, with line breaks allowed (what `base64.b64encode`
/// and MIME encoders produce).
fn decode_base64(content: &str) -> Result<Vec<u8>, AioError> {
    let compact: String = content.split_ascii_whitespace().collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    engine
        .decode(compact.as_bytes())
        .map_err(|e| AioError::bad_request(format!("content is not valid base64: {e}")))
}

/// `GET /v1/file/download?path=`: the file's bytes (the query is form-decoded, so `+` is
/// a space, contract §1.1).
async fn download(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, AioError> {
    let path = absolute("path", query.get("path").cloned())?;
    let read = state
        .provisioner
        .read(&sandbox.id, &path, ByteRange::FULL)
        .await?;
    let name = path.rsplit('/').next().unwrap_or("download");
    let disposition = format!(
        "attachment; filename=\"{}\"",
        name.chars()
            .filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\' || *c == ' ')
            .collect::<String>()
    );
    let mut response = (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        read.value.bytes,
    )
        .into_response();
    if let Ok(value) = header::HeaderValue::from_str(&disposition) {
        response
            .headers_mut()
            .insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
struct FindFiles {
    path: Option<String>,
    glob: Option<String>,
}

/// `POST /v1/file/find`: files (not directories) under `path` matching `glob`. A pattern
/// without `/` matches the file name at any depth; one with `/` is anchored at `path`
/// (`**` spans directories), as DeerFlow's own matcher does.
async fn find(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<FindFiles>,
) -> Answer {
    let path = absolute("path", request.path)?;
    let glob = request
        .glob
        .filter(|glob| !glob.is_empty())
        .ok_or_else(|| AioError::bad_request("glob is required"))?;
    let pattern = if glob.contains('/') {
        glob.trim_start_matches('/').to_owned()
    } else {
        format!("**/{glob}")
    };
    let found = state
        .provisioner
        .glob(&sandbox.id, &path, pattern, MAX_ENTRIES)
        .await?;
    let prefix = prefix_of(&path);
    let base = found.path.relative();
    let files: Vec<String> = found
        .value
        .entries
        .iter()
        .filter(|entry| entry.kind == Kind::File)
        .map(|entry| below(prefix, base, &entry.path))
        .collect();
    Ok(ok(serde_json::json!({"path": path, "files": files})))
}

#[derive(Debug, Deserialize)]
struct ListPath {
    path: Option<String>,
    recursive: Option<bool>,
    show_hidden: Option<bool>,
    file_types: Option<Vec<String>>,
    max_depth: Option<i64>,
    include_size: Option<bool>,
    include_permissions: Option<bool>,
    sort_by: Option<String>,
    sort_desc: Option<bool>,
}

#[derive(Debug, Serialize)]
struct FileInfo {
    name: String,
    path: String,
    is_directory: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    permissions: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    extension: Option<String>,
}

/// `POST /v1/file/list`: the entries of a directory, or of its whole tree with
/// `recursive`; hidden entries (and what lies under hidden directories) only with
/// `show_hidden`.
async fn list(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<ListPath>,
) -> Answer {
    let path = absolute("path", request.path)?;
    let depth = match (request.recursive, request.max_depth) {
        (_, Some(depth)) if depth < 1 => {
            return Err(AioError::bad_request("max_depth must be 1 or more"))
        }
        (Some(true), Some(depth)) => depth.min(warren_fs::MAX_WALK_DEPTH as i64) as u32,
        (Some(true), None) => warren_fs::MAX_WALK_DEPTH,
        _ => 1,
    };
    let listed = state
        .provisioner
        .list(&sandbox.id, &path, depth, MAX_ENTRIES)
        .await?;
    let prefix = prefix_of(&path);
    let base = listed.path.relative().to_owned();
    let show_hidden = request.show_hidden == Some(true);
    let file_types: Vec<String> = request
        .file_types
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.trim_start_matches('.').to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let mut files: Vec<(FileInfo, &Entry)> = Vec::new();
    for entry in &listed.value.entries {
        let below_base = entry
            .path
            .strip_prefix(base.as_str())
            .unwrap_or(&entry.path)
            .trim_start_matches('/');
        if !show_hidden && below_base.split('/').any(|part| part.starts_with('.')) {
            continue;
        }
        let name = entry.path.rsplit('/').next().unwrap_or_default().to_owned();
        let is_directory = entry.kind == Kind::Dir;
        let extension = (!is_directory)
            .then(|| name.rsplit_once('.').map(|(_, ext)| ext.to_owned()))
            .flatten()
            .filter(|ext| !ext.is_empty());
        if !file_types.is_empty()
            && !is_directory
            && !extension
                .as_deref()
                .is_some_and(|ext| file_types.contains(&ext.to_ascii_lowercase()))
        {
            continue;
        }
        let info = FileInfo {
            path: below(prefix, &base, &entry.path),
            name,
            is_directory,
            size: (request.include_size != Some(false)).then_some(entry.size),
            modified_time: modified_time(entry.modified_unix_ms),
            permissions: (request.include_permissions == Some(true))
                .then(|| format!("{:o}", entry.mode & 0o7777)),
            extension: extension.map(|ext| format!(".{ext}")),
        };
        files.push((info, entry));
    }
    match request.sort_by.as_deref() {
        None | Some("name" | "") => {}
        Some("size") => files.sort_by_key(|(_, entry)| entry.size),
        Some("modified") => files.sort_by_key(|(_, entry)| entry.modified_unix_ms),
        Some("type") => files.sort_by_key(|(info, _)| !info.is_directory),
        Some(other) => {
            return Err(AioError::bad_request(format!(
                "sort_by {:?} is not one of name, size, modified, type",
                other.chars().take(40).collect::<String>()
            )))
        }
    }
    if request.sort_desc == Some(true) {
        files.reverse();
    }
    let directory_count = files.iter().filter(|(info, _)| info.is_directory).count();
    let total_count = files.len();
    let files: Vec<FileInfo> = files.into_iter().map(|(info, _)| info).collect();
    Ok(ok(serde_json::json!({
        "path": path,
        "files": files,
        "total_count": total_count,
        "directory_count": directory_count,
        "file_count": total_count - directory_count,
    })))
}

fn modified_time(unix_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(unix_ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[derive(Debug, Deserialize)]
struct GrepFiles {
    path: Option<String>,
    pattern: Option<String>,
    include: Option<Vec<String>>,
    exclude: Option<Vec<String>>,
    case_insensitive: Option<bool>,
    fixed_strings: Option<bool>,
    context_before: Option<i64>,
    context_after: Option<i64>,
    max_results: Option<i64>,
    max_file_size: Option<String>,
    multiline: Option<bool>,
    offset: Option<i64>,
    #[serde(rename = "type")]
    file_type: Option<String>,
    recursive: Option<bool>,
}

/// `POST /v1/file/grep`: lines matching a regular expression (or a literal with
/// `fixed_strings`) in the files under `path` (or `path` itself). Binary files and files
/// over `max_file_size` are skipped; symlinks are never followed.
async fn grep(
    State(state): State<AioState>,
    sandbox: AioSandbox,
    AioJson(request): AioJson<GrepFiles>,
) -> Answer {
    let path = absolute("path", request.path)?;
    let pattern = request
        .pattern
        .filter(|p| !p.is_empty())
        .ok_or_else(|| AioError::bad_request("pattern is required"))?;
    // What ripgrep offers and the file layer does not is refused, not silently ignored.
    let unsupported = [
        (
            "exclude",
            request.exclude.as_ref().is_some_and(|e| !e.is_empty()),
        ),
        (
            "context_before",
            request.context_before.is_some_and(|n| n != 0),
        ),
        (
            "context_after",
            request.context_after.is_some_and(|n| n != 0),
        ),
        ("multiline", request.multiline == Some(true)),
        (
            "type",
            request.file_type.as_ref().is_some_and(|t| !t.is_empty()),
        ),
    ];
    if let Some((name, _)) = unsupported.iter().find(|(_, used)| *used) {
        return Err(AioError::bad_request(format!(
            "{name} is not supported by this sandbox's grep"
        )));
    }
    let regex = if request.fixed_strings == Some(true) {
        regex::escape(&pattern)
    } else {
        pattern.clone()
    };
    let glob = match request.include.unwrap_or_default().as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        many => Some(format!("{{{}}}", many.join(","))),
    };
    let limit = match request.max_results {
        Some(n) if n < 1 => return Err(AioError::bad_request("max_results must be 1 or more")),
        Some(n) => (n as usize).min(MAX_GREP_RESULTS),
        None => DEFAULT_GREP_RESULTS,
    };
    let skip = match request.offset {
        Some(n) if n < 0 => return Err(AioError::bad_request("offset must be 0 or more")),
        Some(n) => n as usize,
        None => 0,
    };
    let mut options = GrepOptions {
        glob,
        case_insensitive: request.case_insensitive == Some(true),
        max_matches: limit.saturating_add(skip),
        ..GrepOptions::default()
    };
    if let Some(size) = &request.max_file_size {
        options.max_file_size = parse_size(size)?;
    }
    let found = state
        .provisioner
        .grep(&sandbox.id, &path, regex, options)
        .await?;
    let prefix = prefix_of(&path);
    let base = found.path.relative();
    let recursive = request.recursive != Some(false);
    let matches: Vec<serde_json::Value> = found
        .value
        .matches
        .iter()
        .filter(|m| {
            // Without `recursive`, only the files directly in `path`.
            recursive
                || !m
                    .path
                    .strip_prefix(base)
                    .unwrap_or(&m.path)
                    .trim_start_matches('/')
                    .contains('/')
        })
        .skip(skip)
        .take(limit)
        .map(|m| {
            serde_json::json!({
                "file": below(prefix, base, &m.path),
                "line_number": m.line_number,
                "line_content": m.line,
            })
        })
        .collect();
    let files_matched = {
        let mut files: Vec<&str> = matches.iter().filter_map(|m| m["file"].as_str()).collect();
        files.dedup();
        files.len()
    };
    Ok(ok(serde_json::json!({
        "path": path,
        "pattern": pattern,
        "matches": matches,
        "match_count": matches.len(),
        "files_searched": found.value.files_scanned,
        "files_matched": files_matched,
        "truncated": found.value.truncated,
    })))
}

/// `1M`, `500K`, `2G` (powers of 1024) or a plain number of bytes.
fn parse_size(size: &str) -> Result<u64, AioError> {
    let size = size.trim();
    let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => size.split_at(at),
        None => (size, ""),
    };
    let factor: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| factor != 0)
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| {
            AioError::bad_request("max_file_size must be a size such as 500K, 1M or 1048576")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_paths_keep_the_requested_prefix() {
        let base = "threads/t/user-data/workspace";
        assert_eq!(
            below(
                "/mnt/user-data/workspace",
                base,
                "threads/t/user-data/workspace/a/b.py"
            ),
            "/mnt/user-data/workspace/a/b.py"
        );
        assert_eq!(
            below("/mnt/user-data/workspace", base, base),
            "/mnt/user-data/workspace"
        );
        assert_eq!(
            prefix_of("/mnt/user-data/workspace//"),
            "/mnt/user-data/workspace"
        );
        assert_eq!(
            below("/mnt/skills/public", "", "pdf/SKILL.md"),
            "/mnt/skills/public/pdf/SKILL.md"
        );
    }

    #[test]
    fn sizes_are_read_in_powers_of_1024() {
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("500K").unwrap(), 500 << 10);
        assert_eq!(parse_size("42").unwrap(), 42);
        for bad in ["", "M", "1X", "-1", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
