//! warren's HTTP API: routing, Bearer authentication, error mapping and the OpenAPI document.
//!
//! Handlers parse a request into a call on [`warren_provisioner::Provisioner`] and turn its
//! answer into JSON; they hold no rules of their own. Every error leaves through
//! [`ApiError`], the one place that maps failures to HTTP statuses and stable codes.
//!
//! **Architecture invariant:** nothing under `/v1` answers without a valid Bearer token, and
//! the token is compared in constant time (I12, I13).

#![deny(missing_docs)]

mod artifacts;
mod auth;
mod branches;
mod checkpoints;
mod cluster;
mod code;
mod contract;
mod env;
mod error;
mod extract;
mod files;
mod guard;
mod leases;
mod mcp;
mod openapi;
mod peer;
mod processes;
mod runs;
mod sandboxes;
mod secrets;
mod skills;
mod stream;
mod usage;
mod viewer;
mod watch;
mod workdirs;

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use warren_protocol::Health;
use warren_provisioner::Provisioner;

pub use auth::{ProvisionerToken, TokenError};
pub use error::ApiError;
pub use openapi::openapi_document;
pub use peer::{ClusterKey, PeerClient};
pub use viewer::{ViewerKey, MAX_UPLOAD_BYTES};

/// Shared state of every handler.
#[derive(Clone)]
pub struct ApiState {
    provisioner: Arc<Provisioner>,
    token: Arc<ProvisionerToken>,
    viewer_key: Arc<ViewerKey>,
    /// DeerFlow's provisioner and AIO sandbox APIs, when `[deerflow] api_key` enables them.
    deerflow: Option<Arc<warren_deerflow::Deerflow>>,
    /// The cluster key, when this node forwards to and serves other replicas (issue 14).
    cluster_key: Option<peer::ClusterKey>,
    /// What the gVisor probe found at start-up, for `/health` (issue 19): probed once,
    /// never per request (it starts sandboxes).
    pub(crate) gvisor: Arc<warren_protocol::GvisorHealth>,
}

impl ApiState {
    /// State over a provisioner, guarded by `token`. Viewer links are signed with a key
    /// that dies with the process unless [`ApiState::with_viewer_key`] gives a lasting one.
    pub fn new(provisioner: Arc<Provisioner>, token: ProvisionerToken) -> Self {
        Self {
            provisioner,
            token: Arc::new(token),
            viewer_key: Arc::new(ViewerKey::ephemeral()),
            deerflow: None,
            cluster_key: None,
            gvisor: Arc::new(warren_protocol::GvisorHealth {
                reason: Some("gVisor was not probed on this server".to_owned()),
                ..Default::default()
            }),
        }
    }

    /// Reports `gvisor`, the start-up gVisor probe's findings, on `/health` (issue 19).
    pub fn with_gvisor(mut self, gvisor: warren_protocol::GvisorHealth) -> Self {
        self.gvisor = Arc::new(gvisor);
        self
    }

    /// Links this node to the other replicas with `key`: runtime operations for runtimes
    /// other nodes own are forwarded to them, and `/internal/v1` serves theirs.
    pub fn with_cluster_key(mut self, key: peer::ClusterKey) -> Self {
        self.provisioner
            .set_peer_link(Arc::new(peer::PeerClient::new(key.clone())));
        self.cluster_key = Some(key);
        self
    }

    /// Serves DeerFlow's APIs under `/deerflow` as well; without this every `/deerflow`
    /// route answers 404. Sandbox URLs are signed with a key derived from the provisioner
    /// token, so every replica with the same token issues and accepts the same URLs.
    pub fn with_deerflow(mut self, config: warren_deerflow::DeerflowConfig) -> Self {
        let key = warren_deerflow::CapabilityKey::derive(&self.token.secret_digest());
        self.deerflow = Some(Arc::new(warren_deerflow::Deerflow::new(
            self.provisioner.clone(),
            config,
            key,
        )));
        self
    }

    /// Signs Viewer links and sessions with `key`.
    pub fn with_viewer_key(mut self, key: ViewerKey) -> Self {
        self.viewer_key = Arc::new(key);
        self
    }
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole API as a router, without a socket, so tests can drive it directly.
pub fn app(state: ApiState) -> Router {
    let body_limit = usize::try_from(state.provisioner.config().read_cap)
        .unwrap_or(usize::MAX)
        .saturating_add(64 * 1024);
    let (mcp_service, mcp_sessions) =
        warren_mcp::streamable_http_service(state.provisioner.clone());
    let v1 = Router::new()
        .route(
            "/users/{uid}/workdirs",
            post(workdirs::create).get(workdirs::list),
        )
        .route(
            "/users/{uid}/env",
            get(env::get).put(env::replace).delete(env::clear),
        )
        .route("/users/{uid}/env/{name}", put(env::set).delete(env::remove))
        .route("/users/{uid}/secrets", get(secrets::of_user))
        .route(
            "/users/{uid}/secrets/{name}",
            put(secrets::set_for_user).delete(secrets::remove_for_user),
        )
        .route("/sandboxes/{id}/secrets", get(secrets::of_sandbox))
        .route(
            "/sandboxes/{id}/secrets/{name}",
            put(secrets::set_for_sandbox).delete(secrets::remove_for_sandbox),
        )
        .route("/sandboxes/{id}/egress", get(secrets::egress))
        .route("/viewer-links", post(viewer::create_link))
        .route("/users/{uid}/snapshots/gc", post(checkpoints::gc))
        .route(
            "/users/{uid}/branches",
            post(branches::create).get(branches::list),
        )
        .route("/users/{uid}/branches/{branch}", delete(branches::delete))
        .route("/users/{uid}/branches/{branch}/diff", get(branches::diff))
        .route("/sandboxes/{id}/merge", post(branches::merge))
        .route(
            "/sandboxes/{id}/snapshots",
            post(checkpoints::snapshot).get(checkpoints::snapshots),
        )
        .route("/users/{uid}/usage", get(usage::get))
        .route("/users/{uid}/runs", get(runs::of_user))
        .route("/users/{uid}/skills", get(skills::list))
        .route("/users/{uid}/skills/sync", post(skills::sync))
        .route(
            "/users/{uid}/skills/{skill}",
            put(skills::grant).delete(skills::revoke),
        )
        .route(
            "/sandboxes/{id}/checkpoints",
            post(checkpoints::create).get(checkpoints::list),
        )
        .route(
            "/sandboxes/{id}/checkpoints/{checkpoint_id}/diff",
            get(checkpoints::diff),
        )
        .route(
            "/sandboxes/{id}/checkpoints/{checkpoint_id}/restore",
            post(checkpoints::restore),
        )
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get)
                .patch(sandboxes::update)
                .delete(sandboxes::delete),
        )
        .route("/sandboxes/{id}/terminate", post(sandboxes::terminate))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/fork", post(sandboxes::fork))
        .route("/sandboxes/{id}/watch", get(watch::watch))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/exec", post(sandboxes::exec))
        .route("/sandboxes/{id}/kill", post(sandboxes::kill))
        .route(
            "/sandboxes/{id}/code/contexts",
            post(code::create).get(code::list),
        )
        .route(
            "/sandboxes/{id}/code/contexts/{context}",
            get(code::get).delete(code::remove),
        )
        .route(
            "/sandboxes/{id}/code/contexts/{context}/restart",
            post(code::restart),
        )
        .route(
            "/sandboxes/{id}/code/contexts/{context}/interrupt",
            post(code::interrupt),
        )
        .route("/sandboxes/{id}/code/execute", post(code::execute))
        .route(
            "/sandboxes/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route("/sandboxes/{id}/processes/{pid}", get(processes::get))
        .route(
            "/sandboxes/{id}/processes/{pid}/output",
            get(processes::output),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/stdin",
            // Streamed to the process as it arrives, at its pace: no body limit applies.
            post(processes::stdin).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/stdin/close",
            post(processes::close_stdin),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/signal",
            post(processes::signal),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/resize",
            post(processes::resize),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/kill",
            post(processes::kill),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/attach",
            get(processes::attach),
        )
        .route("/sandboxes/{id}/runs", get(runs::of_sandbox))
        // MCP over streamable HTTP (POST messages, GET streams, DELETE sessions), behind
        // the same Bearer check as everything else under /v1.
        .route_service(
            "/sandboxes/{id}/mcp",
            tower::ServiceBuilder::new()
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    require_sandbox,
                ))
                .layer(axum::middleware::from_fn_with_state(
                    mcp_sessions,
                    mcp::answers_in_warren_format,
                ))
                .service(mcp_service),
        )
        .route(
            "/sandboxes/{id}/artifacts",
            post(artifacts::present).get(artifacts::list),
        )
        .route(
            "/sandboxes/{id}/artifacts/{artifact_id}",
            get(artifacts::download),
        )
        .route(
            "/sandboxes/{id}/guard",
            post(guard::acquire).get(guard::get).delete(guard::release),
        )
        .route("/sandboxes/{id}/guard/renew", post(guard::renew))
        .route("/sandboxes/{id}/leases", post(leases::create))
        .route("/sandboxes/{id}/leases/{lease_id}", delete(leases::release))
        .route(
            "/sandboxes/{id}/leases/{lease_id}/renew",
            post(leases::renew),
        )
        .route(
            "/sandboxes/{id}/files",
            get(files::read).put(files::write).delete(files::remove),
        )
        .route("/sandboxes/{id}/files/stat", get(files::stat))
        .route("/sandboxes/{id}/files/list", get(files::list))
        .route("/sandboxes/{id}/files/edit", post(files::edit))
        .route("/sandboxes/{id}/files/glob", post(files::glob))
        .route("/sandboxes/{id}/files/grep", post(files::grep))
        .route("/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/sandboxes/{id}/files/move", post(files::rename))
        .route("/cluster", get(cluster::get))
        .route("/openapi.json", get(openapi::serve))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_bearer,
        ));
    // Prometheus scrapes with the same Bearer token (`authorization` in its scrape config).
    let metrics = Router::new().route("/metrics", get(metrics)).route_layer(
        axum::middleware::from_fn_with_state(state.clone(), auth::require_bearer),
    );
    let routes = Router::new()
        .route("/health", get(health))
        .merge(metrics)
        .merge(viewer::router(state.clone()))
        .nest("/v1", v1)
        .with_state(state.clone());
    // DeerFlow's foreign APIs, on the same listener and behind the same layers; they are
    // not part of the /v1 OpenAPI document.
    let routes = match &state.deerflow {
        Some(deerflow) => routes.merge(deerflow.router()),
        None => routes,
    };
    // The node-to-node routes exist only on a node with a cluster key.
    let routes = match &state.cluster_key {
        Some(key) => routes.merge(peer::router(state.clone(), key.clone())),
        None => routes,
    };
    routes
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<_>| {
                    let request_id = request
                        .headers()
                        .get(REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    // Every line logged while serving a sandbox route carries its id; create
                    // records it once the id is known.
                    let path = request.uri().path();
                    let sandbox = path
                        .strip_prefix("/v1/sandboxes/")
                        .or_else(|| path.strip_prefix("/deerflow/sandboxes/"))
                        .and_then(|rest| rest.split('/').next())
                        .and_then(|id| warren_core::SandboxId::parse(id).ok());
                    let span = tracing::info_span!(
                        "request",
                        method = %request.method(),
                        // A DeerFlow sandbox URL is a bearer capability: never logged.
                        path = %warren_deerflow::redact_path(path),
                        request_id = %request_id,
                        sandbox = tracing::field::Empty,
                    );
                    if let Some(sandbox) = sandbox {
                        span.record("sandbox", tracing::field::display(sandbox));
                    }
                    span
                })
                // One line per answer: status and latency, inside the request's span.
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(axum::middleware::from_fn(scope_request_id))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// Makes the request id known to the calls the request forwards to other nodes.
async fn scope_request_id(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    peer::CURRENT_REQUEST_ID.scope(id, next.run(request)).await
}

/// Answers 400/404 in warren's error format before an MCP session is opened for a sandbox
/// id that is malformed or unknown.
async fn require_sandbox(
    axum::extract::State(state): axum::extract::State<ApiState>,
    extract::SandboxPath(id): extract::SandboxPath,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response, ApiError> {
    state.provisioner.sandbox(&id).await?;
    Ok(next.run(request).await)
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Small answers (an exec's result, a forwarded command's frames) go out at once:
    // without TCP_NODELAY a second small write waits for the peer's delayed ACK (~40 ms).
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::warn!(%error, "cannot set TCP_NODELAY on a connection");
        }
    });
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Prometheus metrics in the OpenMetrics text format: sandboxes by state, runtime start and
/// exec latency, reaps, fence waits, failures by cause.
#[utoipa::path(
    get, path = "/metrics",
    responses((status = 200, body = String, content_type = "application/openmetrics-text", description = "OpenMetrics text")),
    security(("bearer" = []))
)]
async fn metrics(
    axum::extract::State(state): axum::extract::State<ApiState>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let text = state.provisioner.render_metrics().await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}

/// Liveness: the process and its backend are initialised. It proves nothing about any
/// runtime (I17), and needs no token.
#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
async fn health(axum::extract::State(state): axum::extract::State<ApiState>) -> Json<Health> {
    let backend = state.provisioner.backend();
    let capabilities = backend.capabilities();
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        backend: backend.kind().as_str().into(),
        backends: state
            .provisioner
            .backends()
            .into_iter()
            .map(|kind| kind.as_str().to_owned())
            .collect(),
        isolation: capabilities.isolation,
        exec: capabilities.exec,
        warnings: backend.warnings(),
        quotas: state.provisioner.quotas().enforcement.as_str().into(),
        gvisor: state.gvisor.as_ref().clone(),
    })
}
