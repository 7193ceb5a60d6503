//! An MCP client for a sandbox's MCP endpoint, and the messages of an MCP answer.

use crate::TestServer;

/// An MCP client session with the MCP endpoint of a sandbox, on the official Rust SDK's
/// client (`rmcp`, its streamable HTTP transport), for tests that call many tools (the
/// end-to-end tests use the official Python SDK too).
pub struct McpSession {
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
}

impl McpSession {
    /// Initializes a session with the MCP endpoint of `sandbox`.
    pub async fn open(server: &TestServer, sandbox: &str) -> Self {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::ServiceExt;
        let config = StreamableHttpClientTransportConfig::with_uri(format!(
            "{}/v1/sandboxes/{sandbox}/mcp",
            server.url
        ))
        .auth_header(server.token.clone());
        let client = ()
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .unwrap_or_else(|error| panic!("MCP initialize failed: {error}"));
        Self { client }
    }

    /// Calls a tool and returns its answer as JSON-RPC would carry it: `{"result": …}`, or
    /// `{"error": …}` for a protocol error.
    pub async fn call_tool(
        &mut self,
        name: &str,
        arguments: serde_json::Value,
    ) -> serde_json::Value {
        let serde_json::Value::Object(arguments) = arguments else {
            panic!("tool arguments are an object: {arguments}")
        };
        let params =
            rmcp::model::CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        match self.client.call_tool(params).await {
            Ok(result) => serde_json::json!({ "result": result }),
            Err(rmcp::ServiceError::McpError(error)) => serde_json::json!({ "error": error }),
            Err(error) => panic!("the MCP call of {name} failed: {error}"),
        }
    }
}

/// The JSON-RPC messages of an MCP streamable-HTTP answer: one JSON body, or the `data:`
/// lines of an SSE stream.
pub fn mcp_messages(text: &str) -> Vec<serde_json::Value> {
    let payloads: Vec<&str> = if text.trim_start().starts_with('{') {
        vec![text]
    } else {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .filter(|data| !data.is_empty())
            .collect()
    };
    payloads
        .into_iter()
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}
