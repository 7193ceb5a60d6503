//! `/v1/sandboxes/{id}/artifacts`: files an agent presented (I26). Downloads never render
//! active content inline: HTML, XHTML, SVG and XML are attachments, everything carries
//! `nosniff` and a sandboxing Content-Security-Policy.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Json;
use warren_fs::ByteRange;
use warren_protocol::{ArtifactInfo, ArtifactList, PresentFiles};
use warren_provisioner::is_active_content;
use warren_store::Artifact;

use crate::extract::{sandbox_id, ApiJson, ApiPath, Fence, SandboxPath};
use crate::files::{byte_range, bytes_response};
use crate::{ApiError, ApiState};

pub(crate) fn artifact_info(artifact: &Artifact) -> ArtifactInfo {
    ArtifactInfo {
        artifact_id: artifact.id.clone(),
        path: artifact.path.clone(),
        size: artifact.size,
        sha256: artifact.sha256.clone(),
        media_type: artifact.media_type.clone(),
        created_at: artifact.created_at.to_rfc3339(),
        download_url: format!(
            "/v1/sandboxes/{}/artifacts/{}",
            artifact.sandbox_id, artifact.id
        ),
    }
}

/// Presents files under the workdir's `outputs/` as artifacts.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/artifacts", tag = "artifacts",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = PresentFiles,
    responses(
        (status = 201, body = ArtifactList, description = "Presented"),
        (status = 400, body = warren_protocol::ErrorBody, description = "not_in_outputs, invalid_path"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn present(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<PresentFiles>,
) -> Result<(StatusCode, Json<ArtifactList>), ApiError> {
    // Held until the change is done: no newer guard token is issued meanwhile (I33).
    let _permit = state.provisioner.fence(&id, fence).await?;
    let artifacts = state.provisioner.present_files(&id, &request.paths).await?;
    Ok((
        StatusCode::CREATED,
        Json(ArtifactList {
            artifacts: artifacts.iter().map(artifact_info).collect(),
        }),
    ))
}

/// The sandbox's artifacts, oldest first.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/artifacts", tag = "artifacts",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = ArtifactList)),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<ArtifactList>, ApiError> {
    let artifacts = state.provisioner.list_artifacts(&id).await?;
    Ok(Json(ArtifactList {
        artifacts: artifacts.iter().map(artifact_info).collect(),
    }))
}

/// Downloads an artifact (with `Range` support).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/artifacts/{artifact_id}", tag = "artifacts",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("artifact_id" = String, Path, description = "Artifact id"),
    ),
    responses(
        (status = 200, description = "The bytes"),
        (status = 206, description = "The requested range"),
        (status = 404, body = warren_protocol::ErrorBody, description = "artifact_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn download(
    State(state): State<ApiState>,
    ApiPath((raw_id, artifact_id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&raw_id)?;
    let range = byte_range(&headers)?;
    let (artifact, read) = state
        .provisioner
        .read_artifact(&id, &artifact_id, range.unwrap_or(ByteRange::FULL))
        .await?;
    let content_type = HeaderValue::from_str(&artifact.media_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let mut response = bytes_response(read, range.is_some(), content_type);
    let name = artifact
        .path
        .rsplit('/')
        .next()
        .unwrap_or("artifact")
        .to_owned();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_DISPOSITION,
        content_disposition(!is_active_content(&artifact.media_type), &name),
    );
    // Even a browser that ignored the disposition would run nothing from it.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    Ok(response)
}

/// `inline` or `attachment` with the file name in both the ASCII and the RFC 8187 form.
pub(crate) fn content_disposition(inline: bool, name: &str) -> HeaderValue {
    let disposition = if inline { "inline" } else { "attachment" };
    HeaderValue::from_str(&format!(
        "{disposition}; filename=\"{}\"; filename*=UTF-8''{}",
        ascii_fallback(name),
        percent_encode(name)
    ))
    .unwrap_or(HeaderValue::from_static("attachment"))
}

/// The name with anything outside printable ASCII (and quotes, backslashes) replaced.
fn ascii_fallback(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ' '..='~' if c != '"' && c != '\\' => c,
            _ => '_',
        })
        .collect()
}

/// RFC 8187 encoding of the name for `filename*`.
fn percent_encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_quoted_safely_in_both_forms() {
        assert_eq!(ascii_fallback("a \"b\"\\é.html"), "a _b___.html");
        assert_eq!(percent_encode("é x.html"), "%C3%A9%20x.html");
    }
}
