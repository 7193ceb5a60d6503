//! The MCP tool surface, driven by the official MCP Python SDK (PyPI `mcp`) over streamable
//! HTTP and over stdio (`warren mcp`), against real runtimes. The client script is
//! `crates/warren/tests/mcp/e2e.py`; scripts/test installs the SDK.

use std::process::Command;

use reqwest::Method;
use serde_json::json;
use warren_test_support::{McpSession, TestServer};

use super::bin;

/// Runs the e2e client on a fresh sandbox of `server` over `transport`.
async fn run_client(server: &TestServer, transport: &str) {
    let sdk = Command::new("python3")
        .args(["-c", "import mcp.client.streamable_http"])
        .output()
        .expect("python3 runs");
    assert!(
        sdk.status.success(),
        "the MCP Python SDK is missing: install it with `pip install 'mcp>=2.3,<3'` \
         (scripts/test does): {}",
        String::from_utf8_lossy(&sdk.stderr)
    );
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": format!("mcp-{transport}"),
        })))
        .await;
    assert_eq!(status, 201, "{body}");
    let sandbox = body["sandbox_id"].as_str().unwrap().to_owned();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/e2e.py");
    let data_dir = server.data_dir();
    let output = tokio::task::spawn_blocking({
        let (url, token) = (server.url.clone(), server.token.clone());
        let transport = transport.to_owned();
        move || {
            Command::new("python3")
                .arg(script)
                .args(["--url", &url, "--token", &token, "--sandbox", &sandbox])
                .arg("--data-dir")
                .arg(&data_dir)
                .args(["--transport", &transport, "--warren-bin"])
                .arg(bin())
                .output()
                .expect("python3 runs the e2e client")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(&format!("ALL CHECKS PASSED ({transport})")),
        "the MCP e2e client failed over {transport}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_official_python_sdk_uses_every_tool_over_streamable_http() {
    let server = TestServer::start_local(bin());
    run_client(&server, "http").await;
}

#[tokio::test]
async fn the_official_python_sdk_uses_every_tool_over_stdio() {
    let server = TestServer::start_local(bin());
    run_client(&server, "stdio").await;
}

#[tokio::test]
async fn the_mcp_endpoint_needs_the_token_and_a_real_sandbox() {
    let server = TestServer::start(bin());
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    });
    let response = server
        .anonymous(
            Method::POST,
            "/v1/sandboxes/sbx-000000000000000000000000/mcp",
        )
        .header("accept", "application/json, text/event-stream")
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);

    for (id, status, code) in [
        ("sbx-000000000000000000000000", 404, "sandbox_not_found"),
        ("not-a-sandbox", 400, "invalid_sandbox_id"),
    ] {
        let (got, body) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/mcp"))
                    .header("accept", "application/json, text/event-stream")
                    .json(&initialize),
            )
            .await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
}

#[tokio::test]
async fn tool_results_mask_injected_secrets_wherever_they_show_up() {
    let server = TestServer::start_local(bin());
    let secret = "sk-mcp-0123456789abcdef";
    let (status, _) = server
        .send_json(
            server
                .request(Method::PUT, "/v1/users/alice/env")
                .json(&json!({ "env": { "API_KEY": secret } })),
        )
        .await;
    assert_eq!(status, 200);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mut mcp = McpSession::open(&server, &id).await;
    let calls = [
        (
            "bash",
            json!({"command": "echo \"key=$API_KEY\"; echo $API_KEY > outputs.txt"}),
        ),
        ("read_file", json!({"path": "outputs.txt"})),
        ("grep", json!({"pattern": "sk-mcp"})),
        ("bash", json!({"command": "echo \"$API_KEY\" >&2; exit 1"})),
    ];
    for (tool, arguments) in calls {
        let answer = mcp.call_tool(tool, arguments.clone()).await;
        let text = answer["result"]["content"].to_string();
        assert!(
            !text.contains(secret),
            "{tool} {arguments} leaked the secret: {text}"
        );
        assert!(
            text.contains("[masked:API_KEY]"),
            "{tool} {arguments}: {text}"
        );
    }
}
