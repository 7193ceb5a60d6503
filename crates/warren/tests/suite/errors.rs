//! Every error is JSON in warren's format, with the status the OpenAPI document gives it
//! (issue 20, item 10): the answers axum and rmcp used to give in plain text, and the
//! statuses that did not match HTTP's meaning.

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_test_support::TestServer;

use super::server;

/// The status and the error code of an answer, asserting the body is warren's error JSON.
async fn error_of(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    assert!(
        content_type.starts_with("application/json"),
        "{status} answered as {content_type:?}: {text}"
    );
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    let code = body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("{text}"));
    assert!(body["error"]["message"].is_string(), "{text}");
    (status, code.to_owned())
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_json_413() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // More than the limit (the 64 MiB read cap plus 64 KiB), on a raw connection: the
    // server answers as soon as the limit is passed, while the client is still sending.
    let address = server.url.trim_start_matches("http://").to_owned();
    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let total: usize = 66 * 1024 * 1024;
    let head = format!(
        "PUT /v1/sandboxes/{id}/files?path=big.bin HTTP/1.1\r\nhost: {address}\r\n\
         authorization: Bearer {}\r\ncontent-type: application/octet-stream\r\n\
         content-length: {total}\r\n\r\n",
        server.token
    );
    let sender = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        let chunk = vec![0u8; 1024 * 1024];
        for _ in 0..total / chunk.len() {
            writer.write_all(&chunk).await?;
        }
        Ok::<_, std::io::Error>(writer)
    });
    // Read exactly one answer: the connection itself may stay open.
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let (head, body) = loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(60), reader.read(&mut buffer))
            .await
            .expect("the server answers")
            .unwrap();
        assert!(n > 0, "the server closed without an answer");
        answer.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a content-length");
            if body.len() >= length {
                break (head.to_owned(), body.to_owned());
            }
        }
    };
    sender.abort();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert!(body.contains("\"body_too_large\""), "{body}");
    let (status, _) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=big.bin"),
        ))
        .await;
    assert_eq!(status, 404, "nothing of the refused body was written");
}

#[tokio::test]
async fn a_path_parameter_that_is_not_utf8_is_a_json_400() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    for path in [
        "/v1/users/%FF/workdirs".to_owned(),
        "/v1/users/%C3%28/env".to_owned(),
        "/v1/users/alice/env/%FF".to_owned(),
        "/v1/users/alice/skills/%FF".to_owned(),
        format!("/v1/sandboxes/{id}/checkpoints/%FF/diff"),
        format!("/v1/sandboxes/{id}/artifacts/%FF"),
        "/v1/sandboxes/%FF".to_owned(),
    ] {
        let method = if path.contains("/skills/") {
            Method::PUT
        } else if path.contains("/env/") {
            Method::DELETE
        } else {
            Method::GET
        };
        let response = server.request(method, &path).send().await.unwrap();
        assert_eq!(
            error_of(response).await,
            (400, "invalid_path_parameter".to_owned()),
            "{path}"
        );
    }
}

#[tokio::test]
async fn reading_a_unix_socket_in_the_workspace_is_not_a_file() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let socket = server.workspace_of("alice").join("projects/a/agent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    for url in [
        format!("/v1/sandboxes/{id}/files?path=agent.sock"),
        format!("/v1/sandboxes/{id}/files?path=/home/gem/user-data/projects/a/agent.sock"),
    ] {
        let response = server.request(Method::GET, &url).send().await.unwrap();
        assert_eq!(
            error_of(response).await,
            (400, "not_a_file".to_owned()),
            "{url}"
        );
    }
}

#[tokio::test]
async fn an_if_match_tag_warren_never_issued_fails_the_precondition() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let url = format!("/v1/sandboxes/{id}/files?path=doc.txt");
    let (status, written) = server
        .send_json(server.request(Method::PUT, &url).body("v1"))
        .await;
    assert_eq!(status, 201, "{written}");
    let etag = written["etag"].as_str().unwrap().to_owned();
    for tag in [
        "\"abc\"".to_owned(),
        "\"\"".to_owned(),
        format!("W/\"{etag}\""),
        "\"xyzzy\", \"other\"".to_owned(),
    ] {
        let response = server
            .request(Method::PUT, &url)
            .header("if-match", &tag)
            .body("v2")
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (412, "precondition_failed".to_owned()),
            "If-Match: {tag}"
        );
        let response = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/files/edit"))
            .json(&json!({"path": "doc.txt", "old": "v1", "new": "v3", "if_match": tag}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (412, "precondition_failed".to_owned()),
            "if_match: {tag}"
        );
    }
    // Not entity-tag syntax at all is still a malformed request.
    let response = server
        .request(Method::PUT, &url)
        .header("if-match", "garbage")
        .body("v2")
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(response).await, (400, "invalid_etag".to_owned()));
    // A list naming the current tag among strangers matches, as RFC 9110 says.
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, &url)
                .header("if-match", format!("\"other\", \"{etag}\""))
                .body("v2"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let text = server
        .request(Method::GET, &url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "v2");
}

#[tokio::test]
async fn a_json_array_is_refused_where_an_object_is_documented() {
    let server = server();
    let id = server.sandbox("erin", "t", "projects/a").await;
    for (path, body) in [
        ("/v1/users/erin/workdirs".to_owned(), r#"["projects/arr2"]"#),
        ("/v1/users/erin/workdirs".to_owned(), r#""projects/arr2""#),
        (
            "/v1/users/erin/workdirs".to_owned(),
            r#"{"path": "projects/arr3", "init": [null, null]}"#,
        ),
        (
            "/v1/users/erin/env".to_owned(),
            r#"{"env": {"A": ["value", false]}}"#,
        ),
        ("/v1/sandboxes".to_owned(), r#"["erin", "t2"]"#),
        (format!("/v1/sandboxes/{id}/exec"), r#"["echo hi"]"#),
        (format!("/v1/sandboxes/{id}/files/mkdir"), r#"["d"]"#),
        (format!("/v1/sandboxes/{id}/terminate"), "[]"),
        (format!("/v1/sandboxes/{id}/terminate"), "null"),
    ] {
        let response = server
            .request(
                if path.ends_with("/env") {
                    Method::PUT
                } else {
                    Method::POST
                },
                &path,
            )
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (400, "invalid_json".to_owned()),
            "{path} {body}"
        );
    }
    let (_, listing) = server
        .send_json(server.request(Method::GET, "/v1/users/erin/workdirs"))
        .await;
    let workdirs: Vec<&str> = listing["workdirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["workdir"].as_str().unwrap())
        .collect();
    assert_eq!(workdirs, ["projects/a"]);
    assert_eq!(server.sandbox_state(&id).await, "created");
}

#[tokio::test]
async fn invalid_json_is_400_whether_its_syntax_or_its_shape_is_wrong() {
    let server = server();
    for body in [
        "{not json",
        r#"{"uid":"a","runtime_scope_id":"b","surprise":1}"#,
        r#"{"uid":7,"runtime_scope_id":"b"}"#,
    ] {
        let response = server
            .request(Method::POST, "/v1/sandboxes")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (400, "invalid_json".to_owned()),
            "{body}"
        );
    }
}

async fn mcp_delete(server: &TestServer, sandbox: &str, session: &str) -> reqwest::Response {
    server
        .request(Method::DELETE, &format!("/v1/sandboxes/{sandbox}/mcp"))
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn closing_an_mcp_session_is_204_and_an_unknown_one_is_a_json_404() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // The raw wire, as the refusals below are: an initialize, and the session it opened.
    let initialized = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}},
        }))
        .send()
        .await
        .unwrap();
    assert!(
        initialized.status().is_success(),
        "{}",
        initialized.status()
    );
    let session_id = initialized.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let response = mcp_delete(&server, &id, &session_id).await;
    assert_eq!(response.status(), 204);
    assert!(response.bytes().await.unwrap().is_empty());
    for unknown in [session_id.as_str(), "no-such-session"] {
        let response = mcp_delete(&server, &id, unknown).await;
        assert_eq!(
            error_of(response).await,
            (404, "mcp_session_not_found".to_owned()),
            "{unknown}"
        );
    }
    // A request in the closed session is refused the same way.
    let response = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session_id)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_of(response).await,
        (404, "mcp_session_not_found".to_owned())
    );
}

#[tokio::test]
async fn the_mcp_endpoint_refuses_a_missing_accept_in_json() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    });
    for accept in [None, Some("text/plain")] {
        let mut request = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/mcp"))
            .json(&initialize);
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            error_of(response).await,
            (406, "not_acceptable".to_owned()),
            "Accept: {accept:?}"
        );
    }
    let response = server
        .request(Method::GET, &format!("/v1/sandboxes/{id}/mcp"))
        .send()
        .await
        .unwrap();
    let (status, _) = error_of(response).await;
    assert!(status == 406 || status == 400, "{status}");
}

#[tokio::test]
async fn a_listing_depth_or_limit_out_of_range_is_refused_not_clamped() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    for query in ["depth=0", "depth=65", "limit=0", "limit=10001"] {
        let response = server
            .request(
                Method::GET,
                &format!("/v1/sandboxes/{id}/files/list?{query}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (400, "invalid_query".to_owned()),
            "{query}"
        );
    }
    for query in ["depth=1", "depth=64", "limit=1", "limit=10000"] {
        let (status, body) = server
            .send_json(server.request(
                Method::GET,
                &format!("/v1/sandboxes/{id}/files/list?{query}"),
            ))
            .await;
        assert_eq!(status, 200, "{query}: {body}");
    }
}
