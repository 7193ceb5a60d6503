//! Artifacts (I26): presenting files from outputs/, listing, downloading with ranges, safe
//! headers, and bytes that outlive the file and the runtime.

use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};
use warren_test_support::TestServer;

use super::server;

async fn put(server: &TestServer, id: &str, path: &str, body: &str) {
    let (status, answer) = server
        .send_json(
            server
                .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path)])
                .body(body.to_owned()),
        )
        .await;
    assert!(
        status == 200 || status == 201,
        "put {path}: {status} {answer}"
    );
}

async fn present(server: &TestServer, id: &str, paths: &[&str]) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/artifacts"))
                .json(&json!({ "paths": paths })),
        )
        .await
}

#[tokio::test]
async fn presented_files_are_listed_and_downloaded_with_ranges_and_safe_headers() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    put(&server, &id, "outputs/report.md", "# Report\n\nall good\n").await;
    put(
        &server,
        &id,
        "outputs/page.html",
        "<script>alert(1)</script>",
    )
    .await;
    let (status, body) = present(&server, &id, &["outputs/report.md", "outputs/page.html"]).await;
    assert_eq!(status, 201, "{body}");
    let artifacts = body["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 2);
    let report = &artifacts[0];
    assert_eq!(
        report["path"],
        "/home/gem/user-data/projects/a/outputs/report.md"
    );
    assert_eq!(report["size"], 19);
    assert_eq!(report["media_type"], "text/markdown");
    assert_eq!(
        report["sha256"],
        hex::encode(Sha256::digest(b"# Report\n\nall good\n"))
    );

    let (_, listed) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/artifacts")))
        .await;
    assert_eq!(listed["artifacts"], body["artifacts"]);

    let url = report["download_url"].as_str().unwrap();
    let response = server.request(Method::GET, url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-content-type-options"], "nosniff");
    assert!(response.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("inline"));
    assert_eq!(response.text().await.unwrap(), "# Report\n\nall good\n");

    let response = server
        .request(Method::GET, url)
        .header("range", "bytes=2-7")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 206);
    assert_eq!(response.headers()["content-range"], "bytes 2-7/19");
    assert_eq!(response.text().await.unwrap(), "Report");

    // Markup a browser would run is never served inline.
    let page = artifacts[1]["download_url"].as_str().unwrap();
    let response = server.request(Method::GET, page).send().await.unwrap();
    let headers = response.headers();
    assert!(headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment; filename=\"page.html\""));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("sandbox"));
}

#[tokio::test]
async fn only_regular_files_under_outputs_can_be_presented() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    put(&server, &id, "notes.md", "x").await;
    put(&server, &id, "outputs/ok.md", "x").await;
    let work = server.workspace_of("alice").join("projects/a");
    std::os::unix::fs::symlink("/etc/passwd", work.join("outputs/link")).unwrap();
    for (path, code) in [
        ("notes.md", "not_in_outputs"),
        ("outputs/../notes.md", "invalid_path"),
        ("/home/gem/skills/x", "not_in_outputs"),
        ("/etc/passwd", "invalid_path"),
        ("outputs/link", "symlink_refused"),
        ("outputs/missing.md", "not_found"),
    ] {
        let (status, body) = present(&server, &id, &[path]).await;
        assert_eq!(
            (status / 100, body["error"]["code"].as_str()),
            (4, Some(code)),
            "{path}: {body}"
        );
        assert!(!body.to_string().contains("root:x:0:0"));
    }
    // A bad path among good ones registers nothing.
    let (status, _) = present(&server, &id, &["outputs/ok.md", "notes.md"]).await;
    assert_eq!(status, 400);
    let (_, listed) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/artifacts")))
        .await;
    assert_eq!(listed["artifacts"], json!([]));
}

#[tokio::test]
async fn an_artifact_keeps_its_bytes_after_the_file_changes_and_the_sandbox_ends() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    put(&server, &id, "outputs/result.txt", "version one").await;
    let (_, body) = present(&server, &id, &["outputs/result.txt"]).await;
    let url = body["artifacts"][0]["download_url"]
        .as_str()
        .unwrap()
        .to_owned();
    put(&server, &id, "outputs/result.txt", "version two").await;
    let (status, _) = server
        .send_json(
            server
                .request(Method::DELETE, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", "outputs/result.txt")]),
        )
        .await;
    assert_eq!(status, 204);
    server.terminate(&id).await;
    let response = server.request(Method::GET, &url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "version one");

    // An ephemeral sandbox's artifacts outlive its scratch tree.
    let (_, scratch) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "fetch", "ephemeral": true,
        })))
        .await;
    let scratch_id = scratch["sandbox_id"].as_str().unwrap().to_owned();
    put(&server, &scratch_id, "outputs/fetched.txt", "from scratch").await;
    let (_, body) = present(&server, &scratch_id, &["outputs/fetched.txt"]).await;
    let url = body["artifacts"][0]["download_url"]
        .as_str()
        .unwrap()
        .to_owned();
    server.terminate(&scratch_id).await;
    let response = server.request(Method::GET, &url).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "from scratch");
}

#[tokio::test]
async fn an_artifact_is_reachable_only_through_its_own_sandbox() {
    let server = server();
    let alice = server.sandbox("alice", "t", "projects/a").await;
    let bob = server.sandbox("bob", "t", "projects/b").await;
    put(&server, &alice, "outputs/mine.txt", "alice's").await;
    let (_, body) = present(&server, &alice, &["outputs/mine.txt"]).await;
    let artifact = body["artifacts"][0]["artifact_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for path in [
        format!("/v1/sandboxes/{bob}/artifacts/{artifact}"),
        format!("/v1/sandboxes/{alice}/artifacts/art-doesnotexist"),
        format!("/v1/sandboxes/{alice}/artifacts/..%2F..%2Fwarren.db"),
    ] {
        let (status, body) = server.send_json(server.request(Method::GET, &path)).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("artifact_not_found")),
            "{path}: {body}"
        );
    }
}
