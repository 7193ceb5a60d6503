//! `/v1/sandboxes/{id}/mcp`: rmcp's streamable HTTP service, with its HTTP-level answers
//! brought into warren's contract.
//!
//! rmcp answers transport problems (a missing `Accept`, an unknown session, a wrong method)
//! in plain text, and a session's `DELETE` with 202. Here every such answer becomes
//! warren's JSON error with a stable code, an unknown session is 404 (the MCP spec's word
//! for it), and a closed session is 204, which the official SDKs count as a clean
//! termination (they report 202 as a failure on every close). JSON-RPC answers, SSE streams
//! and successes pass through untouched.

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warren_mcp::McpSessions;

use crate::ApiError;

/// The header that names an MCP session.
const SESSION_ID: &str = "mcp-session-id";
/// rmcp's plain-text answers are one sentence; anything longer is cut, never buffered whole.
const MAX_TEXT_ANSWER: usize = 4096;

/// Rewrites rmcp's HTTP-level answers; see the module documentation.
pub(crate) async fn answers_in_warren_format(
    State(sessions): State<McpSessions>,
    request: Request,
    next: Next,
) -> Response {
    let closing = request.method() == Method::DELETE;
    if closing {
        if let Some(session) = request
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            // Closing an unknown session is a no-op for rmcp (202); it is 404 in the spec.
            if !sessions.is_open(session).await {
                return session_not_found();
            }
        }
    }
    let response = next.run(request).await;
    let status = response.status();
    if closing && status == StatusCode::ACCEPTED {
        return StatusCode::NO_CONTENT.into_response();
    }
    if !(status.is_client_error() || status.is_server_error()) || speaks_json_or_sse(&response) {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let text = match axum::body::to_bytes(response.into_body(), MAX_TEXT_ANSWER).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let mut answer = transport_error(status, text).into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

fn speaks_json_or_sse(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|essence| essence == "application/json" || essence == "text/event-stream")
}

fn session_not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        warren_protocol::code!(StatusCode::NOT_FOUND.as_u16(), "mcp_session_not_found"),
        "no such MCP session (it was closed, or the server restarted): initialize a new one",
    )
    .into_response()
}

/// rmcp's plain-text refusal as warren's error. Its texts name only HTTP headers and
/// methods; a 5xx is logged and answered generically like every internal error.
fn transport_error(status: StatusCode, text: String) -> ApiError {
    use warren_protocol::code;
    let (status, code) = match status {
        StatusCode::BAD_REQUEST => (status, code!(400, "invalid_mcp_request")),
        StatusCode::FORBIDDEN => (status, code!(403, "forbidden")),
        StatusCode::NOT_FOUND => (status, code!(404, "mcp_session_not_found")),
        StatusCode::METHOD_NOT_ALLOWED => (status, code!(405, "method_not_allowed")),
        StatusCode::NOT_ACCEPTABLE => (status, code!(406, "not_acceptable")),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (status, code!(415, "unsupported_media_type")),
        StatusCode::PAYLOAD_TOO_LARGE => (status, code!(413, "body_too_large")),
        // Any other refusal of rmcp's is the request's fault: one status for it.
        _ if status.is_client_error() => {
            (StatusCode::BAD_REQUEST, code!(400, "invalid_mcp_request"))
        }
        _ => {
            tracing::error!(%status, answer = %text, "the MCP transport failed");
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                warren_protocol::code!(StatusCode::INTERNAL_SERVER_ERROR.as_u16(), "internal"),
                "the MCP transport failed; the server log has the details",
            );
        }
    };
    let message = match text.as_str() {
        "" => status
            .canonical_reason()
            .unwrap_or("refused by the MCP transport")
            .to_owned(),
        _ => text,
    };
    ApiError::new(status, code, message)
}
