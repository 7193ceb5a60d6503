//! The OpenAPI document is generated from the code and covers the contract.

use reqwest::Method;

use super::server;

#[tokio::test]
async fn the_openapi_document_lists_every_route_with_bearer_auth() {
    let server = server();
    let (status, doc) = server
        .send_json(server.request(Method::GET, "/v1/openapi.json"))
        .await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/health",
        "/v1/users/{uid}/workdirs",
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/files/list",
        "/v1/sandboxes/{id}/files/stat",
        "/v1/sandboxes/{id}/files/edit",
        "/v1/sandboxes/{id}/files/glob",
        "/v1/sandboxes/{id}/files/grep",
        "/v1/sandboxes/{id}/files/mkdir",
        "/v1/sandboxes/{id}/files/move",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(doc["components"]["schemas"]["SandboxInfo"].is_object());
}
