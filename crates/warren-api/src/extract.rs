//! Extractors whose rejections answer in warren's error format instead of axum's plain text.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use warren_core::SandboxId;
use warren_provisioner::{FenceToken, ProvisionerError};

use crate::ApiError;

/// A JSON body; a malformed one answers 400 `invalid_json` naming the problem, whether its
/// syntax or its shape is wrong (one code, one status: the OpenAPI document says 400). The
/// body is read as JSON whatever its `Content-Type` says: `curl -d` and many agent
/// frameworks send JSON labelled as a form. Every body warren takes is an object, and
/// anything else is refused here, centrally: serde would otherwise read a JSON array into a
/// struct field by field (`["projects/x"]` as `{"path":"projects/x"}`).
pub(crate) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        parse_json(&read_body(request, state).await?).map(Self)
    }
}

/// An optional JSON body, parsed like [`ApiJson`]; an empty one gives `T::default()`.
pub(crate) struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = read_body(request, state).await?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        parse_json(&body).map(Self)
    }
}

/// A raw request body (`application/octet-stream` uploads). One larger than the server's
/// body limit answers 413 `body_too_large` in warren's format, not axum's plain text.
pub(crate) struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        read_body(request, state).await.map(Self)
    }
}

async fn read_body<S: Send + Sync>(
    request: Request,
    state: &S,
) -> Result<axum::body::Bytes, ApiError> {
    axum::body::Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    warren_protocol::code!(
                        StatusCode::PAYLOAD_TOO_LARGE.as_u16(),
                        "body_too_large"
                    ),
                    "the request body is larger than this server accepts (the read cap plus \
                     64 KiB); send large files in appended parts",
                )
            } else {
                ApiError::new(rejection.status(), "invalid_body", rejection.body_text())
            }
        })
}

fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let invalid = |message: String| {
        ApiError::bad_request(warren_protocol::code!(400, "invalid_json"), message)
    };
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => invalid("invalid request body: expected a JSON object".to_owned()),
                Err(error) => invalid(format!("invalid request body: {error}")),
            },
        );
    }
    serde_json::from_slice(body).map_err(|error| invalid(format!("invalid request body: {error}")))
}

/// Query parameters; malformed ones answer 400 `invalid_query`.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_query"),
                rejection.body_text(),
            )),
        }
    }
}

/// Path parameters; a segment that is not UTF-8 once percent-decoded (or otherwise does not
/// fit `T`) answers 400 `invalid_path_parameter` in warren's format, not axum's plain text.
pub(crate) struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request(
                warren_protocol::code!(400, "invalid_path_parameter"),
                rejection.body_text(),
            )),
        }
    }
}

/// The `{id}` path segment as a [`SandboxId`]; a malformed one answers 400.
pub(crate) struct SandboxPath(pub SandboxId);

impl<S: Send + Sync> FromRequestParts<S> for SandboxPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath(id) = ApiPath::<String>::from_request_parts(parts, state).await?;
        SandboxId::parse(&id)
            .map(Self)
            .map_err(|e| ProvisionerError::from(e).into())
    }
}

/// A uid a client names (a path segment, a body field, a query), refused in warren's error
/// format: 400 `invalid_uid`, or 400 `reserved_uid` for the prefixes of owners that
/// isolation scopes derive (I29; see [`warren_core::Uid::plain`]).
pub(crate) fn uid(raw: String) -> Result<warren_core::Uid, ApiError> {
    warren_core::Uid::plain(raw).map_err(|e| warren_provisioner::ProvisionerError::from(e).into())
}

/// A sandbox id from a path segment of a route with more than one parameter, refused in
/// warren's error format (400 `invalid_sandbox_id`), as [`SandboxPath`] does.
pub(crate) fn sandbox_id(raw: &str) -> Result<SandboxId, ApiError> {
    SandboxId::parse(raw).map_err(|e| ProvisionerError::from(e).into())
}

pub(crate) use warren_provisioner::FENCE_HEADER;

/// `X-Warren-Fence: <token>` on a mutating sandbox route: `None` without the header (the
/// request behaves as before guards existed). A malformed value, or the header twice, is
/// 400 `fence_invalid`: a token the server cannot read must never pass as no token.
/// Handlers pass it to `Provisioner::fence` and hold the permit while they change things.
pub(crate) struct Fence(pub Option<FenceToken>);

impl<S: Send + Sync> FromRequestParts<S> for Fence {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let values = parts.headers.get_all(FENCE_HEADER).iter();
        Ok(Self(FenceToken::from_header_values(
            values.map(|value| value.as_bytes()),
        )?))
    }
}
