//! The agent tool surface of a sandbox over the Model Context Protocol, on the official Rust
//! SDK (`rmcp`).
//!
//! [`WarrenMcp`] is an MCP server whose tools (`bash`, `ls`, `read_file`, `write_file`,
//! `edit_file`, `glob`, `grep`, `present_files`, `view_image`, the background processes'
//! and the sandbox's own life's) act on one sandbox through
//! the [`Provisioner`], so they keep every rule the HTTP API keeps: virtual paths only (I1),
//! fd-based resolution (I2), the read-only skills mount (I7), run records (I22), masking of
//! injected secrets (I13). [`streamable_http_service`] serves it at
//! `/v1/sandboxes/{id}/mcp`; the sandbox is read from the request path, so one service
//! serves every sandbox. The tools that change the sandbox (`bash`, `write_file`,
//! `edit_file`, `present_files`) are fenced by the `X-Warren-Fence` header of the HTTP
//! request, like the HTTP routes (I33).
//!
//! **Architecture invariant:** a tool never fails as a protocol error. Bad arguments, bad
//! paths, refused escapes and failed commands are tool results with `isError: true` and a
//! message a model can act on; only an unknown tool or a request without a sandbox is a
//! JSON-RPC error.

#![deny(missing_docs)]

mod branches;
mod code;
mod lifecycle;
mod processes;
mod tools;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use warren_core::SandboxId;
use warren_provisioner::{FenceToken, Provisioner, ProvisionerError};

/// What the server tells a client about itself at `initialize`.
const INSTRUCTIONS: &str = "These tools act on one warren sandbox: a Linux runtime with a \
persistent workspace (your working directory is a project inside it) and read-only skills; \
the tool descriptions name where both are mounted. Paths are relative to the working \
directory or absolute under those mounts. Put results you want to hand over under outputs/ \
in the working directory and register them with present_files.";

/// The MCP server of warren's sandboxes.
#[derive(Clone)]
pub struct WarrenMcp {
    provisioner: Arc<Provisioner>,
}

impl WarrenMcp {
    /// A server acting through `provisioner`.
    pub fn new(provisioner: Arc<Provisioner>) -> Self {
        Self { provisioner }
    }
}

/// The sandbox a request is for: the `{id}` after `sandboxes/` in its HTTP path.
fn sandbox_of(context: &RequestContext<RoleServer>) -> Result<SandboxId, ErrorData> {
    let parts = context
        .extensions
        .get::<http::request::Parts>()
        .ok_or_else(|| ErrorData::invalid_request("no HTTP request carries this call", None))?;
    let mut segments = parts.uri.path().split('/');
    segments
        .by_ref()
        .find(|segment| *segment == "sandboxes")
        .and_then(|_| segments.next())
        .and_then(|id| SandboxId::parse(id).ok())
        .ok_or_else(|| {
            ErrorData::invalid_request(
                "the MCP endpoint is /v1/sandboxes/{id}/mcp with a sandbox id",
                None,
            )
        })
}

/// The execution guard token of a call: the `X-Warren-Fence` header of the HTTP request
/// that carried it, as on every other mutating route (I33). The header, not a tool
/// argument, because the guard belongs to the agent framework that runs the model, not to
/// the model: the framework sets it on its MCP connection and a model never handles tokens.
fn fence_of(context: &RequestContext<RoleServer>) -> Result<Option<FenceToken>, ProvisionerError> {
    let Some(parts) = context.extensions.get::<http::request::Parts>() else {
        return Ok(None);
    };
    FenceToken::from_header_values(
        parts
            .headers
            .get_all(warren_provisioner::FENCE_HEADER)
            .iter()
            .map(|value| value.as_bytes()),
    )
}

impl ServerHandler for WarrenMcp {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("warren", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let sandbox = sandbox_of(&context)?;
        // The HTTP layer answered 404 for an unknown sandbox before the session opened;
        // one that vanished since is still described, in the default layout's terms.
        let layout = match self.provisioner.sandbox(&sandbox).await {
            Ok(record) => record.binding.layout.layout(),
            Err(_) => &warren_core::Layout::ARS,
        };
        Ok(ListToolsResult::with_all_items(tools::definitions(layout)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let sandbox = sandbox_of(&context)?;
        let fence = fence_of(&context);
        let arguments = request.arguments.unwrap_or_default();
        let result =
            tools::call(&self.provisioner, &sandbox, &request.name, arguments, fence).await?;
        Ok(result.into())
    }
}

/// The open MCP sessions of a [`streamable_http_service`], so the HTTP layer can tell an
/// unknown session (404) from a known one before rmcp, which treats closing an unknown
/// session as a success, sees the request.
#[derive(Clone)]
pub struct McpSessions(Arc<LocalSessionManager>);

impl McpSessions {
    /// Whether `id` names a session that is open now.
    pub async fn is_open(&self, id: &str) -> bool {
        self.0
            .has_session(&id.to_owned().into())
            .await
            .unwrap_or(false)
    }
}

/// The streamable HTTP service of [`WarrenMcp`], to mount at `/v1/sandboxes/{id}/mcp`
/// behind the Bearer check, and a handle on its sessions.
///
/// Host validation (rmcp's DNS-rebinding guard, loopback only by default) is off: warren may
/// listen on any address, and every request must carry the provisioner token, which a
/// rebinding page cannot present.
pub fn streamable_http_service(
    provisioner: Arc<Provisioner>,
) -> (
    StreamableHttpService<WarrenMcp, LocalSessionManager>,
    McpSessions,
) {
    let server = WarrenMcp::new(provisioner);
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        sessions.clone(),
        StreamableHttpServerConfig::default().disable_allowed_hosts(),
    );
    (service, McpSessions(sessions))
}
