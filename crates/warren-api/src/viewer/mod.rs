//! The Viewer (I17): the web page where a person sees one workdir of one uid and its
//! artifacts, and uploads files into its `uploads/`.
//!
//! `POST /v1/viewer-links` (Bearer) signs a link for (uid, workdir, expiry). `GET
//! /viewer/open?t=` checks it and exchanges it for a session cookie (HttpOnly,
//! SameSite=Strict, Path=/viewer) carrying a grant of its own kind, then sends the browser
//! on to the page. The provisioner token never appears in a URL, a page or a cookie.
//!
//! **Architecture invariants:**
//! - every file the Viewer touches is reached through a root narrowed to the grant's
//!   workdir by descriptor ([`warren_fs::WorkspaceRoot::subroot`]): no URL form reaches
//!   above it, and a workdir swapped for a symlink is refused;
//! - nothing from the workspace is ever rendered as a document of the Viewer's origin:
//!   Markdown is sanitised on the server, HTML/SVG/XML are downloads only, raw bytes carry
//!   `nosniff` and a sandboxing CSP;
//! - the Viewer never creates or touches a runtime.

mod grant;
mod preview;

use std::time::Duration;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use warren_core::{Layout, LayoutName, Uid, Workdir};
use warren_fs::{ByteRange, FsError, Kind, WorkspaceRoot, WriteOptions};
use warren_protocol::{CreateViewerLink, ViewerLink};
use warren_provisioner::{media_type, ProvisionerError};

pub use grant::ViewerKey;
use grant::{Grant, GrantError, GrantKind};
use preview::{kind_of, text_preview, Preview, PreviewKind, PREVIEW_BYTES};

use crate::artifacts::content_disposition;
use crate::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery};
use crate::files::bytes_response;
use crate::{ApiError, ApiState};

/// The session cookie's name.
const COOKIE: &str = "warren_viewer";
/// The page's Content-Security-Policy: its own scripts and styles only, nothing inline,
/// nothing from elsewhere; frames only of itself (PDF previews); never framed by others.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' blob:; frame-src 'self'; connect-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";
/// A downloaded file, should a browser render it anyway: no script, no origin.
const DOWNLOAD_CSP: &str = "sandbox; default-src 'none'; frame-ancestors 'none'";
/// Default and longest lifetime of a link (and of the session it opens).
pub const DEFAULT_LINK_TTL: Duration = Duration::from_secs(3600);
/// See [`DEFAULT_LINK_TTL`].
pub const MAX_LINK_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest file the Viewer accepts as an upload.
pub const MAX_UPLOAD_BYTES: usize = 25 * 1024 * 1024;
/// Most entries one listing request returns.
const MAX_LIST_PAGE: usize = 5_000;
/// Most entries a directory may have to be listed at all (sorted in memory).
const MAX_DIRECTORY_ENTRIES: usize = 200_000;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
/// warren's own icon (not workspace content), for the pages `/viewer/open` draws.
const ICON_SVG: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
    <rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#2f6fde\"/>\
    <path d=\"M4 11V6l4-2 4 2v5H9V8H7v3z\" fill=\"#fff\"/></svg>";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The Viewer's routes, outside `/v1`: they authenticate with the session cookie.
pub(crate) fn router(state: ApiState) -> Router<ApiState> {
    Router::new()
        .route(
            "/viewer",
            get(|| async { axum::response::Redirect::to("/viewer/") }),
        )
        .route("/viewer/", get(page))
        .route("/viewer/open", get(open))
        .route("/viewer/assets/{name}", get(asset))
        .route("/viewer/api/session", get(session))
        .route("/viewer/api/list", get(list))
        .route("/viewer/api/preview", get(preview))
        .route("/viewer/api/raw", get(raw))
        .route("/viewer/api/upload", post(upload))
        .route("/viewer/api/artifacts", get(artifacts))
        .route("/viewer/api/artifacts/{artifact_id}", get(artifact))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// Headers every Viewer answer carries unless the handler set its own.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(PAGE_CSP));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Signs a link that opens the Viewer on one workdir of one uid.
#[utoipa::path(
    post, path = "/v1/viewer-links", tag = "viewer",
    request_body = CreateViewerLink,
    responses(
        (status = 201, body = ViewerLink, description = "A link to hand to a person"),
        (status = 404, body = warren_protocol::ErrorBody, description = "workdir_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create_link(
    State(state): State<ApiState>,
    ApiJson(request): ApiJson<CreateViewerLink>,
) -> Result<(StatusCode, Json<ViewerLink>), ApiError> {
    let uid = crate::extract::uid(request.uid)?;
    let workdir = Workdir::new(request.workdir).map_err(ProvisionerError::from)?;
    let ttl = request.ttl_s.map_or(DEFAULT_LINK_TTL, Duration::from_secs);
    if ttl.is_zero() || ttl > MAX_LINK_TTL {
        return Err(ApiError::bad_request(
            warren_protocol::code!(400, "invalid_request"),
            "ttl_s must be between 1 second and 7 days",
        ));
    }
    // The workdir must exist now; the link never creates anything.
    state
        .provisioner
        .workspaces()
        .workdir_root(&uid, &workdir)
        .await?;
    let exp = now() + i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
    let grant = Grant {
        uid: uid.to_string(),
        workdir: workdir.to_string(),
        exp,
        nonce: uuid_like(),
    };
    let token = state.viewer_key.sign(GrantKind::Link, &grant);
    Ok((
        StatusCode::CREATED,
        Json(ViewerLink {
            url: format!("/viewer/open?t={token}"),
            expires_at: chrono::DateTime::from_timestamp(exp, 0)
                .unwrap_or_default()
                .to_rfc3339(),
        }),
    ))
}

fn uuid_like() -> String {
    hex::encode(rand::random::<[u8; 12]>())
}

#[derive(Deserialize)]
struct OpenQuery {
    t: Option<String>,
}

/// A small page of the Viewer's own, for a refused link.
fn refusal(status: StatusCode, message: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>warren viewer</title><link rel=\"stylesheet\" href=\"/viewer/assets/app.css\">\
         <link rel=\"icon\" href=\"/viewer/assets/icon.svg\"></head><body><main class=\"refusal\"><h1>warren viewer</h1>\
         <p data-testid=\"error\">{message}</p></main></body></html>"
    );
    (status, Html(body)).into_response()
}

/// Exchanges a link for a session cookie, then sends the browser on to the page.
///
/// The onward step is an HTML refresh rather than a redirect: a SameSite=Strict cookie set
/// while following a link from another site is not sent along that same redirect chain,
/// but it is sent on the page's own navigation.
async fn open(State(state): State<ApiState>, Query(query): Query<OpenQuery>) -> Response {
    let Some(token) = query.t else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "This link is incomplete; ask for a new one.",
        );
    };
    let grant = match state.viewer_key.verify(GrantKind::Link, &token, now()) {
        Ok(grant) => grant,
        Err(GrantError::Expired) => {
            return refusal(
                StatusCode::UNAUTHORIZED,
                "This link has expired; ask for a new one.",
            )
        }
        Err(GrantError::Invalid) => {
            return refusal(
                StatusCode::FORBIDDEN,
                "This link is not valid; ask for a new one.",
            )
        }
    };
    let max_age = grant.exp - now();
    let session = state.viewer_key.sign(
        GrantKind::Session,
        &Grant {
            nonce: uuid_like(),
            ..grant
        },
    );
    let cookie =
        format!("{COOKIE}={session}; Path=/viewer; HttpOnly; SameSite=Strict; Max-Age={max_age}");
    let body = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
        <meta http-equiv=\"refresh\" content=\"0; url=/viewer/\"><title>warren viewer</title>\
        <link rel=\"stylesheet\" href=\"/viewer/assets/app.css\">\
        <link rel=\"icon\" href=\"/viewer/assets/icon.svg\"></head><body>\
        <main class=\"refusal\"><p>Opening the viewer… <a href=\"/viewer/\">continue</a></p>\
        </main></body></html>";
    let mut response = Html(body).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn page() -> Html<&'static str> {
    Html(INDEX_HTML)
}

async fn asset(ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    let (body, kind) = match name.as_str() {
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => (APP_CSS, "text/css; charset=utf-8"),
        "icon.svg" => (ICON_SVG, "image/svg+xml"),
        _ => return Err(crate::error::not_found().await),
    };
    Ok((
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response())
}

/// The grant of the request's session cookie.
struct ViewerSession {
    uid: Uid,
    workdir: Workdir,
    exp: i64,
}

impl axum::extract::FromRequestParts<ApiState> for ViewerSession {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &ApiState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .find_map(|pair| {
                pair.trim()
                    .strip_prefix(&format!("{COOKIE}="))
                    .map(str::to_owned)
            });
        let unauthorized = |code: &'static str, message: &str| {
            ApiError::new(StatusCode::UNAUTHORIZED, code, message.to_owned())
        };
        let Some(token) = token else {
            return Err(unauthorized(
                warren_protocol::code!(401, "viewer_session_required"),
                "no Viewer session; open the Viewer through a link",
            ));
        };
        let grant = match state.viewer_key.verify(GrantKind::Session, &token, now()) {
            Ok(grant) => grant,
            Err(GrantError::Expired) => {
                return Err(unauthorized(
                    warren_protocol::code!(401, "viewer_session_expired"),
                    "the Viewer session has expired; ask for a new link",
                ))
            }
            Err(GrantError::Invalid) => {
                return Err(unauthorized(
                    warren_protocol::code!(401, "viewer_session_invalid"),
                    "the Viewer session is not valid; ask for a new link",
                ))
            }
        };
        // Signed by us, so these parse; refusing is still the safe answer if not.
        let uid = Uid::new(grant.uid).map_err(ProvisionerError::from)?;
        let workdir = Workdir::new(grant.workdir).map_err(ProvisionerError::from)?;
        Ok(Self {
            uid,
            workdir,
            exp: grant.exp,
        })
    }
}

impl ViewerSession {
    /// The workdir as a root of its own (writable only for uploads).
    async fn root(&self, state: &ApiState) -> Result<WorkspaceRoot, ApiError> {
        Ok(state
            .provisioner
            .workspaces()
            .workdir_root(&self.uid, &self.workdir)
            .await?)
    }
}

/// A Viewer path (`/` is the workdir, `/a/b` is `<workdir>/a/b`) as a path relative to the
/// workdir root. The file layer refuses `..`, NUL and the like when it parses it.
fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// Runs blocking file work on the workdir root, naming `shown` (the Viewer path) in errors.
async fn on_root<T: Send + 'static>(
    root: WorkspaceRoot,
    shown: String,
    work: impl FnOnce(&WorkspaceRoot) -> Result<T, FsError> + Send + 'static,
) -> Result<T, ApiError> {
    let path = shown.clone();
    tokio::task::spawn_blocking(move || work(&root))
        .await
        .map_err(|error| ApiError::from(ProvisionerError::Interrupted(error)))?
        .map_err(|source| ProvisionerError::File { path, source }.into())
}

#[derive(Serialize)]
struct SessionInfo {
    uid: String,
    workdir: String,
    workdir_path: String,
    expires_at: String,
}

async fn session(session: ViewerSession) -> Json<SessionInfo> {
    Json(SessionInfo {
        uid: session.uid.to_string(),
        workdir: session.workdir.to_string(),
        // The Viewer shows the whole UserWorkspace, in the default layout's terms.
        workdir_path: Layout::ARS.workdir_path(&session.workdir),
        expires_at: chrono::DateTime::from_timestamp(session.exp, 0)
            .unwrap_or_default()
            .to_rfc3339(),
    })
}

#[derive(Deserialize)]
struct ListQuery {
    path: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct ViewerEntry {
    name: String,
    path: String,
    kind: &'static str,
    size: u64,
    modified: String,
}

#[derive(Serialize)]
struct ViewerListing {
    path: String,
    entries: Vec<ViewerEntry>,
    total: usize,
    truncated: bool,
}

fn modified(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .unwrap_or_default()
        .to_rfc3339()
}

/// One directory, a page at a time: directories first, then by name.
async fn list(
    State(state): State<ApiState>,
    session: ViewerSession,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<ViewerListing>, ApiError> {
    let shown = query.path.unwrap_or_else(|| "/".to_owned());
    let offset = query.offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(500).clamp(1, MAX_LIST_PAGE);
    let root = session.root(&state).await?.read_only();
    let rel = relative(&shown).to_owned();
    let listing = on_root(root, shown.clone(), move |root| {
        root.list(&rel, 1, MAX_DIRECTORY_ENTRIES)
    })
    .await?;
    let mut entries = listing.entries;
    entries.sort_by(|a, b| {
        (b.kind == Kind::Dir)
            .cmp(&(a.kind == Kind::Dir))
            .then_with(|| a.path.cmp(&b.path))
    });
    let total = entries.len();
    let page = entries
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|entry| ViewerEntry {
            name: entry.path.rsplit('/').next().unwrap_or_default().to_owned(),
            path: format!("/{}", entry.path),
            kind: entry.kind.as_str(),
            size: entry.size,
            modified: modified(entry.modified_unix_ms),
        })
        .collect();
    Ok(Json(ViewerListing {
        path: format!("/{}", relative(&shown)),
        entries: page,
        total,
        truncated: offset.saturating_add(limit) < total || listing.truncated,
    }))
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Serialize)]
struct ViewerPreview {
    path: String,
    name: String,
    kind: &'static str,
    size: u64,
    modified: String,
    media_type: &'static str,
    preview: Preview,
}

async fn preview(
    State(state): State<ApiState>,
    session: ViewerSession,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> Result<Json<ViewerPreview>, ApiError> {
    let shown = format!("/{}", relative(&query.path));
    let root = session.root(&state).await?.read_only();
    let rel = relative(&query.path).to_owned();
    let media = media_type(&rel);
    let (entry, preview) = on_root(root, shown.clone(), move |root| {
        let entry = root.stat(&rel)?;
        let preview = match entry.kind {
            Kind::Dir => Preview::None {
                reason: "a directory".into(),
            },
            Kind::Symlink => Preview::None {
                reason: "a symbolic link; links are not followed".into(),
            },
            Kind::Other => Preview::None {
                reason: "not a regular file".into(),
            },
            Kind::File => match kind_of(media) {
                PreviewKind::Image => Preview::Image,
                PreviewKind::Pdf => Preview::Pdf,
                PreviewKind::DownloadOnly(reason) => Preview::None {
                    reason: reason.into(),
                },
                PreviewKind::Text { markdown } => {
                    let read = root.read(
                        &rel,
                        ByteRange::Span {
                            start: 0,
                            end_inclusive: Some(PREVIEW_BYTES - 1),
                        },
                        PREVIEW_BYTES,
                    )?;
                    text_preview(&read.bytes, read.total_size, markdown)
                }
            },
        };
        Ok((entry, preview))
    })
    .await?;
    Ok(Json(ViewerPreview {
        name: shown.rsplit('/').next().unwrap_or_default().to_owned(),
        path: shown,
        kind: entry.kind.as_str(),
        size: entry.size,
        modified: modified(entry.modified_unix_ms),
        media_type: media,
        preview,
    }))
}

#[derive(Deserialize)]
struct RawQuery {
    path: String,
    download: Option<String>,
}

/// A file's bytes: inline only for images and PDFs (for the page's `<img>` and frame),
/// as an attachment otherwise or when asked.
async fn raw(
    State(state): State<ApiState>,
    session: ViewerSession,
    ApiQuery(query): ApiQuery<RawQuery>,
) -> Result<Response, ApiError> {
    let shown = format!("/{}", relative(&query.path));
    let root = session.root(&state).await?.read_only();
    let rel = relative(&query.path).to_owned();
    let media = media_type(&rel);
    let cap = state.provisioner.config().read_cap;
    let read = on_root(root, shown.clone(), move |root| {
        root.read(&rel, ByteRange::FULL, cap)
    })
    .await?;
    if read.total_size > read.bytes.len() as u64 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            warren_protocol::code!(StatusCode::UNPROCESSABLE_ENTITY.as_u16(), "too_large"),
            format!(
                "{shown} has {} bytes; the Viewer serves files up to {cap} bytes",
                read.total_size
            ),
        ));
    }
    let wants_download = matches!(query.download.as_deref(), Some("1" | "true"));
    let inline = !wants_download && matches!(kind_of(media), PreviewKind::Image | PreviewKind::Pdf);
    let content_type = if inline {
        media
    } else {
        "application/octet-stream"
    };
    let mut response = bytes_response(read, false, HeaderValue::from_static(content_type));
    let name = shown.rsplit('/').next().unwrap_or("file").to_owned();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_DISPOSITION,
        content_disposition(inline, &name),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(if inline {
            // Images and PDFs, framed by the Viewer page only; nothing they could run.
            "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; object-src 'self'; frame-ancestors 'self'"
        } else {
            DOWNLOAD_CSP
        }),
    );
    Ok(response)
}

#[derive(Deserialize)]
struct UploadQuery {
    name: String,
    overwrite: Option<String>,
}

#[derive(Serialize)]
struct Uploaded {
    path: String,
    size: usize,
}

/// A file name for `uploads/`: one component, nothing hidden in it.
fn upload_name(name: &str) -> Result<&str, ApiError> {
    let refuse = |reason: &str| {
        ApiError::bad_request(
            warren_protocol::code!(400, "invalid_name"),
            format!("invalid file name {name:?}: {reason}"),
        )
    };
    if name.is_empty() || name.len() > 255 {
        return Err(refuse("a name has 1 to 255 bytes"));
    }
    if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(refuse("a name is one path component"));
    }
    if name.chars().any(char::is_control) {
        return Err(refuse("a name has no control characters"));
    }
    Ok(name)
}

/// Puts one file into the workdir's `uploads/` (made on first use, I8).
async fn upload(
    State(state): State<ApiState>,
    session: ViewerSession,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<UploadQuery>,
    ApiBytes(body): ApiBytes,
) -> Result<(StatusCode, Json<Uploaded>), ApiError> {
    // A form on another site cannot set this header without a CORS preflight, which the
    // Viewer never grants: defence in depth behind SameSite=Strict.
    if headers.get("x-warren-viewer").and_then(|v| v.to_str().ok()) != Some("1") {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            warren_protocol::code!(StatusCode::FORBIDDEN.as_u16(), "viewer_header_missing"),
            "uploads come from the Viewer page (X-Warren-Viewer: 1)".to_owned(),
        ));
    }
    let name = upload_name(&query.name)?.to_owned();
    if body.len() > MAX_UPLOAD_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            warren_protocol::code!(StatusCode::PAYLOAD_TOO_LARGE.as_u16(), "too_large"),
            format!(
                "{name} has {} bytes; uploads are at most {MAX_UPLOAD_BYTES} bytes",
                body.len()
            ),
        ));
    }
    let overwrite = matches!(query.overwrite.as_deref(), Some("1" | "true"));
    let root = session.root(&state).await?;
    let rel = format!("uploads/{name}");
    let shown = format!("/{rel}");
    let size = body.len();
    let written = on_root(root, shown.clone(), move |root| {
        root.write(
            &rel,
            &body,
            WriteOptions {
                create_parents: true,
                if_none_match_any: !overwrite,
                ..WriteOptions::default()
            },
        )
    })
    .await;
    match written {
        Ok(_) => {
            tracing::info!(uid = %session.uid, workdir = %session.workdir, path = %shown, size, "viewer upload");
            Ok((StatusCode::CREATED, Json(Uploaded { path: shown, size })))
        }
        Err(error) if error.code() == "precondition_failed" => Err(ApiError::new(
            StatusCode::CONFLICT,
            warren_protocol::code!(StatusCode::CONFLICT.as_u16(), "already_exists"),
            format!("{shown} already exists; upload with overwrite=1 to replace it"),
        )),
        Err(error) => Err(error),
    }
}

#[derive(Serialize)]
struct ViewerArtifact {
    artifact_id: String,
    name: String,
    path: String,
    size: u64,
    media_type: String,
    created_at: String,
    download_url: String,
}

async fn artifacts(
    State(state): State<ApiState>,
    session: ViewerSession,
) -> Result<Json<serde_json::Value>, ApiError> {
    // Artifact paths are in their sandbox's layout's terms; each shows the workdir at
    // its own place.
    let prefixes: Vec<String> = LayoutName::ALL
        .iter()
        .map(|name| format!("{}/", name.layout().workdir_path(&session.workdir)))
        .collect();
    let artifacts: Vec<ViewerArtifact> = state
        .provisioner
        .workdir_artifacts(&session.uid, &session.workdir)
        .await?
        .into_iter()
        .map(|artifact| ViewerArtifact {
            name: artifact
                .path
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
            path: format!(
                "/{}",
                prefixes
                    .iter()
                    .find_map(|prefix| artifact.path.strip_prefix(prefix.as_str()))
                    .unwrap_or(&artifact.path)
            ),
            download_url: format!("/viewer/api/artifacts/{}", artifact.id),
            artifact_id: artifact.id,
            size: artifact.size,
            media_type: artifact.media_type,
            created_at: artifact.created_at.to_rfc3339(),
        })
        .collect();
    Ok(Json(serde_json::json!({ "artifacts": artifacts })))
}

/// An artifact of this workdir, always as an attachment.
async fn artifact(
    State(state): State<ApiState>,
    session: ViewerSession,
    ApiPath(artifact_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let (artifact, read) = state
        .provisioner
        .read_workdir_artifact(&session.uid, &session.workdir, &artifact_id)
        .await?;
    let mut response = bytes_response(
        read,
        false,
        HeaderValue::from_static("application/octet-stream"),
    );
    let name = artifact.path.rsplit('/').next().unwrap_or("artifact");
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_DISPOSITION,
        content_disposition(false, name),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(DOWNLOAD_CSP),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_names_are_single_plain_components() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a\0b",
            "a\nb",
            &"x".repeat(256),
        ] {
            assert!(upload_name(bad).is_err(), "{bad:?}");
        }
        for good in ["report.pdf", "with space.txt", "ünïcode.md", ".hidden"] {
            assert_eq!(upload_name(good).unwrap(), good);
        }
    }

    #[test]
    fn viewer_paths_are_workdir_relative() {
        assert_eq!(relative("/"), "");
        assert_eq!(relative("/a/b"), "a/b");
        assert_eq!(relative("a"), "a");
        // Whatever remains is the file layer's to refuse.
        assert_eq!(relative("/../x"), "../x");
    }
}
