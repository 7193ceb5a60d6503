//! Bearer authentication and token handling (I12, I13, I17).

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use warren_test_support::{run_to_exit, TestServer};

use super::{bin, server};

#[tokio::test]
async fn missing_token_is_refused_with_a_json_error() {
    let server = server();
    let response = server
        .anonymous(Method::GET, "/v1/sandboxes")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Bearer"));
}

#[tokio::test]
async fn wrong_or_malformed_tokens_are_refused() {
    let server = server();
    let wrong = [
        format!("Bearer {}", "x".repeat(40)),
        format!("Bearer {}x", server.token),
        format!("Bearer {}", &server.token[..server.token.len() - 1]),
        format!("Basic {}", server.token),
        server.token.clone(),
        "Bearer ".to_owned(),
    ];
    for header in wrong {
        let (status, body) = server
            .send_json(
                server
                    .anonymous(Method::GET, "/v1/sandboxes")
                    .header("authorization", &header),
            )
            .await;
        assert_eq!(status, 401, "{header}");
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let (status, _) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn every_v1_route_needs_the_token() {
    let server = server();
    let id = "sbx-0123456789abcdef01234567";
    let routes = [
        (Method::POST, "/v1/users/alice/workdirs".to_owned()),
        (Method::GET, "/v1/users/alice/workdirs".to_owned()),
        (Method::POST, "/v1/sandboxes".to_owned()),
        (Method::GET, format!("/v1/sandboxes/{id}")),
        (Method::DELETE, format!("/v1/sandboxes/{id}")),
        (Method::POST, format!("/v1/sandboxes/{id}/exec")),
        (Method::GET, format!("/v1/sandboxes/{id}/files?path=a")),
        (Method::PUT, format!("/v1/sandboxes/{id}/files?path=a")),
        (Method::DELETE, format!("/v1/sandboxes/{id}/files?path=a")),
        (Method::GET, format!("/v1/sandboxes/{id}/files/list")),
        (Method::POST, format!("/v1/sandboxes/{id}/files/edit")),
        (Method::POST, format!("/v1/sandboxes/{id}/files/move")),
        (Method::GET, "/v1/openapi.json".to_owned()),
    ];
    for (method, path) in routes {
        let (status, body) = server
            .send_json(server.anonymous(method.clone(), &path))
            .await;
        assert_eq!(status, 401, "{method} {path}: {body}");
    }
}

#[tokio::test]
async fn health_needs_no_token_and_claims_no_more_than_initialisation() {
    let server = server();
    let (status, body) = server
        .send_json(server.anonymous(Method::GET, "/health"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["backend"], "memory");
    assert_eq!(body["isolation"], false);
    assert_eq!(body["exec"], false);
}

#[test]
fn a_token_under_32_characters_stops_serve_from_starting() {
    let data = tempfile::tempdir().unwrap();
    let output = run_to_exit(
        bin(),
        &[
            "serve",
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[("WARREN_TOKEN", "short-token-of-31-characters-xx")],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 32"), "{stderr}");
    assert!(
        !stderr.contains("short-token-of-31"),
        "the token leaked: {stderr}"
    );
}

#[test]
fn a_short_token_file_stops_serve_from_starting() {
    let data = tempfile::tempdir().unwrap();
    let token_file = data.path().join("given-token");
    std::fs::write(&token_file, "tiny").unwrap();
    let output = run_to_exit(
        bin(),
        &[
            "serve",
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.path().join("d").to_str().unwrap(),
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least 32"));
}

#[tokio::test]
async fn a_generated_token_is_private_and_works() {
    let server = TestServer::start_with_token(bin(), &["--backend", "memory"], None);
    let token_file = server.data_dir().join("token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(server.token.len() >= 32);
    let (status, _) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(status, 200);
}

#[test]
fn a_generated_token_never_reaches_the_log() {
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("log");
    let mut child = Command::new(bin())
        .args([
            "serve",
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data.path().join("d"))
        .env_remove("WARREN_TOKEN")
        .env("WARREN_LOG", "debug")
        .stdout(Stdio::from(
            std::fs::File::create(data.path().join("out")).unwrap(),
        ))
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let token_file = data.path().join("d/token");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(data.path().join("out"))
        .unwrap()
        .contains("listening")
    {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let token = std::fs::read_to_string(token_file).unwrap();
    let log = std::fs::read_to_string(log).unwrap();
    assert!(log.contains("token"), "the log names the token file: {log}");
    assert!(!log.contains(token.trim()), "the token leaked into the log");
}
