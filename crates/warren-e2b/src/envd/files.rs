//! `GET /files` and `POST /files`: a file's bytes down, files up, as envd serves them.
//!
//! A request is authorized as every envd request is (`E2b-Sandbox-Id` or the host name,
//! `X-Access-Token` for a secure sandbox), or by a signed URL ([`super::fs::signature`]).
//! Paths go to the provisioner's `read` and `write` by virtual path on the sandbox's warren
//! id, resolved by descriptor beneath the mount (I2); answers and errors name virtual
//! paths only (I1). Errors are envd's JSON `{"code": <status>, "message": ...}`.

use std::io::Write as _;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::header::{
    ACCEPT_ENCODING, CONTENT_DISPOSITION, CONTENT_ENCODING, CONTENT_TYPE, VARY,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use warren_fs::{ByteRange, WriteOptions};

use super::fs::signature::{Operation, SignatureError, Signed};
use super::fs::upload::{read_files, BodyKind, UploadError};
use super::fs::{check_user, expand_home};
use crate::error::ApiFailure;
use crate::state::E2bSandbox;
use crate::Shared;

/// How many live sandboxes a signed URL that names no sandbox is checked against. Such a
/// URL comes from an SDK configured with `E2B_SANDBOX_URL` (no header, no host name); the
/// signature binds the sandbox's access token, so only its own sandbox matches, and each
/// check is two hashes. Past this many live sandboxes, the newest are checked: a client
/// of a busier server names the sandbox (the `E2b-Sandbox-Id` header or `E2B_DOMAIN`).
pub(crate) const MAX_SIGNATURE_CANDIDATES: usize = 10_000;

/// Bytes a multipart body may carry beyond the files themselves (boundaries, headers).
const MULTIPART_FRAMING: usize = 64 * 1024;

/// Answers smaller than this are sent uncompressed even when gzip is accepted: there is
/// nothing to gain, and an empty file stays an empty body.
const GZIP_MIN_BYTES: usize = 1024;

/// The query of `/files`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FilesQuery {
    /// The file (download, or the destination of an upload).
    path: Option<String>,
    /// The user to act as (`user` or `root`; absent is the default user).
    username: Option<String>,
    /// A signed URL's signature (`v1_...`).
    signature: Option<String>,
    /// A signed URL's expiration, unix seconds.
    signature_expiration: Option<String>,
}

/// `GET /files?path=`: the file's bytes (`application/octet-stream`), gzip-compressed when
/// the client accepts it. At most the provisioner's read cap (`read_cap`, 64 MiB by
/// default) is read: a larger file is 413, as on the native API.
pub(crate) async fn download(
    State(shared): State<Shared>,
    query: Result<Query<FilesQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    match serve_download(&shared, query, &headers).await {
        Ok(response) => response,
        Err(failure) => failure.into_response(),
    }
}

async fn serve_download(
    shared: &Shared,
    query: Result<Query<FilesQuery>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, ApiFailure> {
    let Query(query) = query.map_err(|error| ApiFailure::bad_request(error.body_text()))?;
    let sandbox = authorize(shared, headers, &query, Operation::Read).await?;
    let path = query
        .path
        .as_deref()
        .filter(|path| !path.is_empty())
        .ok_or_else(|| ApiFailure::bad_request("the `path` query is required"))?;
    let read = shared
        .provisioner
        .read(&sandbox.warren_id, &expand_home(path), ByteRange::FULL)
        .await?;
    let shown = read.path.to_string();
    let name = shown.rsplit('/').next().unwrap_or_default().to_owned();
    let bytes = read.value.bytes;
    let mut response = if accepts_gzip(headers) && bytes.len() >= GZIP_MIN_BYTES {
        let compressed = tokio::task::spawn_blocking(move || gzip(&bytes))
            .await
            .map_err(|_| ApiFailure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error"))?;
        let mut response = compressed.into_response();
        response
            .headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        response
    } else {
        bytes.into_response()
    };
    let out = response.headers_mut();
    out.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    out.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
    if let Ok(value) = HeaderValue::from_str(&content_disposition(&name)) {
        out.insert(CONTENT_DISPOSITION, value);
    }
    Ok(response)
}

/// `Content-Disposition` naming the file as envd does; a name with quotes, backslashes or
/// non-ASCII characters is sent percent-encoded (`filename*`).
fn content_disposition(name: &str) -> String {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ');
    if plain {
        format!("inline; filename=\"{name}\"")
    } else {
        let encoded: String = name
            .bytes()
            .map(|byte| {
                if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                    char::from(byte).to_string()
                } else {
                    format!("%{byte:02X}")
                }
            })
            .collect();
        format!("inline; filename*=UTF-8''{encoded}")
    }
}

/// Whether `Accept-Encoding` allows gzip (any `gzip` token whose `q` is not 0).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|param| {
                param
                    .strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// Compresses an answer (fast level: it is sent once, over a network).
fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 2),
        flate2::Compression::fast(),
    );
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    encoder.finish().unwrap_or_default()
}

/// One written file, as envd lists it.
#[derive(Debug, serde::Serialize)]
struct WrittenFile {
    name: String,
    r#type: &'static str,
    path: String,
}

/// `POST /files`: multipart (one or more `file` parts) or a raw body with `path`,
/// optionally gzip-encoded; answers the written files. The body is bounded by the
/// provisioner's read cap plus multipart framing (before and after decompression), so
/// every file written here can be read back through `GET /files`, and one request never
/// holds more memory than that.
pub(crate) async fn upload(
    State(shared): State<Shared>,
    query: Result<Query<FilesQuery>, QueryRejection>,
    request: Request,
) -> Response {
    match serve_upload(&shared, query, request).await {
        Ok(response) => response,
        Err(failure) => failure.into_response(),
    }
}

async fn serve_upload(
    shared: &Shared,
    query: Result<Query<FilesQuery>, QueryRejection>,
    request: Request,
) -> Result<Response, ApiFailure> {
    let Query(query) = query.map_err(|error| ApiFailure::bad_request(error.body_text()))?;
    let (parts, body) = request.into_parts();
    let sandbox = match authorize(shared, &parts.headers, &query, Operation::Write).await {
        Ok(sandbox) => sandbox,
        Err(failure) => {
            // The connection stays usable for the client's next request (see
            // `connect::drain_body`).
            super::connect::drain_body(body).await;
            return Err(failure);
        }
    };
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|value: &HeaderValue| value.to_str().ok())
    };
    let kind = BodyKind {
        content_type: header(CONTENT_TYPE),
        content_encoding: header(CONTENT_ENCODING),
        path: query.path.as_deref().filter(|path| !path.is_empty()),
    };
    let limit = usize::try_from(shared.provisioner.config().read_cap)
        .unwrap_or(usize::MAX)
        .saturating_add(MULTIPART_FRAMING);
    let files = read_files(kind, body, limit)
        .await
        .map_err(upload_failure)?;
    let options = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    let mut written = Vec::with_capacity(files.len());
    for file in files {
        let done = shared
            .provisioner
            .write(
                &sandbox.warren_id,
                &expand_home(&file.path),
                file.bytes.to_vec(),
                options.clone(),
                false,
            )
            .await?;
        let path = done.path.to_string();
        written.push(WrittenFile {
            name: path.rsplit('/').next().unwrap_or_default().to_owned(),
            r#type: "file",
            path,
        });
    }
    Ok(axum::Json(written).into_response())
}

fn upload_failure(error: UploadError) -> ApiFailure {
    let status = match error {
        UploadError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        UploadError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiFailure::new(status, error.to_string())
}

/// The sandbox a `/files` request may act on: named by header or host name and
/// authenticated by its access token (secure sandboxes) or a signed URL, or, when no
/// sandbox is named, found by its signature among the live sandboxes.
async fn authorize(
    shared: &Shared,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: Operation,
) -> Result<E2bSandbox, ApiFailure> {
    let user = query
        .username
        .clone()
        .or_else(|| super::basic_user(headers));
    check_user(user.as_deref())
        .map_err(|unknown| ApiFailure::new(StatusCode::UNAUTHORIZED, unknown.to_string()))?;
    let expiration =
        match query.signature_expiration.as_deref() {
            None | Some("") => None,
            Some(text) => Some(text.parse::<i64>().map_err(|_| {
                ApiFailure::bad_request("signature_expiration must be unix seconds")
            })?),
        };
    let signed = query.signature.as_deref().map(|signature| Signed {
        path: query.path.as_deref().unwrap_or(""),
        operation,
        user: query.username.as_deref().unwrap_or(""),
        signature,
        expiration,
    });
    let now = chrono::Utc::now().timestamp();
    let unauthorized = |message: String| ApiFailure::new(StatusCode::UNAUTHORIZED, message);

    let Some(id) = super::sandbox_id_of(headers, shared.config.domain.as_deref()) else {
        // No sandbox named: only a signature can say which one.
        let Some(signed) = signed else {
            return Err(ApiFailure::bad_request(
                "the request names no sandbox: send the E2b-Sandbox-Id header, use the host name 49983-<sandboxID>.<domain>, or a signed URL",
            ));
        };
        signed
            .precheck(now)
            .map_err(|e| unauthorized(e.to_string()))?;
        let candidates = crate::control::live_sandboxes(shared, MAX_SIGNATURE_CANDIDATES).await?;
        return candidates
            .into_iter()
            .find(|sandbox| signed.matches(&shared.secrets.access_token(&sandbox.sandbox_id)))
            .ok_or_else(|| unauthorized(SignatureError::Mismatch.to_string()));
    };
    let sandbox = crate::control::live_sandbox(shared, &id)
        .await?
        .ok_or_else(|| {
            ApiFailure::new(
                axum::http::StatusCode::BAD_GATEWAY,
                super::connect::sandbox_gone_message(&id),
            )
        })?;
    if super::presents_token(shared, &sandbox, headers, &["x-access-token"]) {
        return Ok(sandbox);
    }
    match signed {
        Some(signed) => {
            signed
                .verify(&shared.secrets.access_token(&sandbox.sandbox_id), now)
                .map_err(|e| unauthorized(e.to_string()))?;
            Ok(sandbox)
        }
        // envd's words for a secure sandbox's request with neither.
        None if sandbox.secure && headers.contains_key("x-access-token") => Err(unauthorized(
            "access token present in header but does not match".into(),
        )),
        None if sandbox.secure => Err(unauthorized("missing signature query parameter".into())),
        None => Ok(sandbox),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, value.parse().unwrap());
        headers
    }

    #[test]
    fn gzip_is_used_only_when_the_client_accepts_it() {
        assert!(accepts_gzip(&accept("gzip")));
        assert!(accepts_gzip(&accept("gzip, deflate, br, zstd")));
        assert!(accepts_gzip(&accept("br;q=1.0, GZIP;q=0.5")));
        assert!(accepts_gzip(&accept("*")));
        assert!(!accepts_gzip(&accept("gzip;q=0")));
        assert!(!accepts_gzip(&accept("identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn a_compressed_answer_decompresses_to_the_file() {
        use std::io::Read as _;
        let data = b"hello hello hello".repeat(100);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gzip(&data)[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn the_file_name_is_quoted_or_percent_encoded() {
        assert_eq!(
            content_disposition("a b.txt"),
            "inline; filename=\"a b.txt\""
        );
        assert_eq!(
            content_disposition("q\"é.txt"),
            "inline; filename*=UTF-8''q%22%C3%A9.txt"
        );
    }
}
