//! `GET /v1/sandbox` and the AIO file endpoints (`/v1/file/*`).

use axum::extract::State;
use axum::Json;

use super::{AioError, AioSandbox, AioState};

/// The file routes, relative to a sandbox's URL.
pub(crate) fn routes() -> axum::Router<AioState> {
    axum::Router::new()
}

/// `GET /v1/sandbox`: the sandbox's context, and DeerFlow's readiness probe.
pub(crate) async fn context(
    State(_state): State<AioState>,
    sandbox: AioSandbox,
) -> Result<Json<serde_json::Value>, AioError> {
    let layout = sandbox.record.layout.layout();
    Ok(Json(serde_json::json!({
        "success": true,
        "message": "ok",
        "home_dir": layout.home,
        "version": env!("CARGO_PKG_VERSION"),
        "detail": {
            "system": {
                "os": "linux", "os_version": "", "arch": std::env::consts::ARCH,
                "user": layout.user, "home_dir": layout.home, "timezone": "UTC",
                "occupied_ports": [],
            },
            "runtime": {"python": [], "nodejs": []},
            "utils": [],
        },
    })))
}
