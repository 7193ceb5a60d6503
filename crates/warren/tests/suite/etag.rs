//! Version checks on writes: If-Match, If-None-Match, no lost update (I27).

use reqwest::Method;
use serde_json::json;

use super::server;

#[tokio::test]
async fn a_stale_if_match_is_refused_with_412_and_keeps_the_newer_content() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let url = format!("/v1/sandboxes/{id}/files?path=doc.txt");
    let (_, v1) = server
        .send_json(server.request(Method::PUT, &url).body("v1"))
        .await;
    let etag1 = v1["etag"].as_str().unwrap().to_owned();
    let (status, _) = server
        .send_json(
            server
                .request(Method::PUT, &url)
                .header("if-match", format!("\"{etag1}\""))
                .body("v2"),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, &url)
                .header("if-match", format!("\"{etag1}\""))
                .body("v3-lost?"),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (412, Some("precondition_failed"))
    );
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/files/edit"))
                .json(&json!({"path": "doc.txt", "old": "v2", "new": "v4", "if_match": etag1})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (412, Some("precondition_failed"))
    );
    let text = server
        .request(Method::GET, &url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "v2");
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, &url)
                .header("if-none-match", "*")
                .body("create only"),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (412, Some("precondition_failed"))
    );
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, &url)
                .header("if-match", "garbage")
                .body("x"),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_etag"))
    );
}

#[tokio::test]
async fn concurrent_writers_with_if_match_lose_no_update() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let url = format!("/v1/sandboxes/{id}/files?path=counter");
    server
        .send_json(server.request(Method::PUT, &url).body("0"))
        .await;
    let writers = 6;
    let increments = 15;
    let worker = |_: usize| {
        let server = &server;
        let url = &url;
        async move {
            let mut conflicts = 0u32;
            for _ in 0..increments {
                loop {
                    let response = server.request(Method::GET, url).send().await.unwrap();
                    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
                    let value: u64 = response.text().await.unwrap().parse().unwrap();
                    let response = server
                        .request(Method::PUT, url)
                        .header("if-match", etag)
                        .body((value + 1).to_string())
                        .send()
                        .await
                        .unwrap();
                    match response.status().as_u16() {
                        200 => break,
                        412 => conflicts += 1,
                        other => panic!("unexpected status {other}"),
                    }
                }
            }
            conflicts
        }
    };
    let conflicts: u32 = futures::future::join_all((0..writers).map(worker))
        .await
        .into_iter()
        .sum();
    let text = server
        .request(Method::GET, &url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        text,
        (writers * increments).to_string(),
        "after {conflicts} conflicts"
    );
}
