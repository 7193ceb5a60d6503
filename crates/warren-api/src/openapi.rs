//! The OpenAPI 3 document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "warren", description = "Sandboxes and workspaces for AI agents."),
    paths(
        crate::health,
        crate::metrics,
        crate::workdirs::create,
        crate::workdirs::list,
        crate::usage::get,
        crate::env::get,
        crate::env::replace,
        crate::env::clear,
        crate::env::set,
        crate::env::remove,
        crate::sandboxes::create,
        crate::sandboxes::list,
        crate::sandboxes::get,
        crate::sandboxes::delete,
        crate::sandboxes::terminate,
        crate::sandboxes::exec,
        crate::sandboxes::kill,
        crate::viewer::create_link,
        crate::checkpoints::create,
        crate::checkpoints::list,
        crate::checkpoints::diff,
        crate::checkpoints::restore,
        crate::checkpoints::gc,
        crate::checkpoints::snapshot,
        crate::checkpoints::snapshots,
        crate::skills::list,
        crate::skills::grant,
        crate::skills::revoke,
        crate::skills::sync,
        crate::artifacts::present,
        crate::artifacts::list,
        crate::artifacts::download,
        crate::leases::create,
        crate::leases::renew,
        crate::leases::release,
        crate::files::read,
        crate::files::write,
        crate::files::remove,
        crate::files::stat,
        crate::files::list,
        crate::files::edit,
        crate::files::glob,
        crate::files::grep,
        crate::files::mkdir,
        crate::files::rename,
    ),
    modifiers(&BearerAuth)
)]
struct WarrenApi;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document of this server.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    WarrenApi::openapi()
}

/// `GET /v1/openapi.json`.
pub(crate) async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi_document())
}
