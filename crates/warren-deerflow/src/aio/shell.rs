//! The AIO shell and bash endpoints (`/v1/shell/*`, `/v1/bash/*`): persistent shell
//! sessions (placeholder; see `mod.rs` for the interface a handler uses).

use super::AioState;

/// The shell and bash routes, relative to a sandbox's URL.
pub(crate) fn routes() -> axum::Router<AioState> {
    axum::Router::new()
}
