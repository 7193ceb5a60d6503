//! Workdir rules (I4, I8, I11).

use std::os::unix::fs::MetadataExt;

use reqwest::Method;
use serde_json::json;

use super::{running_as_root, server};

#[tokio::test]
async fn a_default_workdir_is_a_fresh_project_without_uploads_or_outputs() {
    let server = server();
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/users/alice/workdirs"))
        .await;
    assert_eq!(status, 201, "{body}");
    let workdir = body["workdir"].as_str().unwrap();
    let uuid = workdir.strip_prefix("projects/").expect("projects/<uuid>");
    assert_eq!(uuid.len(), 36);
    assert_eq!(body["path"], format!("/home/gem/user-data/{workdir}"));
    let host = server.workspace_of("alice").join(workdir);
    assert!(host.is_dir());
    // I8: uploads/ and outputs/ appear on first use, not before.
    assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0);
    if running_as_root() {
        for dir in [host.clone(), server.workspace_of("alice")] {
            let meta = std::fs::metadata(&dir).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{}", dir.display());
        }
    }
    let (status, again) = server
        .send_json(server.request(Method::POST, "/v1/users/alice/workdirs"))
        .await;
    assert_eq!(status, 201);
    assert_ne!(again["workdir"], body["workdir"]);
}

#[tokio::test]
async fn an_explicit_workdir_is_created_once_then_confirmed() {
    let server = server();
    let request = || {
        server
            .request(Method::POST, "/v1/users/alice/workdirs")
            .json(&json!({"path": "projects/x/deep"}))
    };
    let (status, body) = server.send_json(request()).await;
    assert_eq!(
        (status, body["workdir"].as_str()),
        (201, Some("projects/x/deep"))
    );
    // Later calls confirm it with the time it was first created, as the listing says.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let (status, again) = server.send_json(request()).await;
    assert_eq!(status, 200);
    assert_eq!(again["created_at"], body["created_at"], "{again} vs {body}");
    let (status, list) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/workdirs"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(list["workdirs"].as_array().unwrap().len(), 1);
    assert_eq!(list["workdirs"][0]["workdir"], "projects/x/deep");
    assert_eq!(list["workdirs"][0]["created_at"], body["created_at"]);
}

#[tokio::test]
async fn workdir_rules_refuse_every_bad_form() {
    let server = server();
    let long = "a".repeat(300);
    let bad = [
        "/abs/path",
        "../escape",
        "projects/../../x",
        "projects/./x",
        "projects//x",
        "projects/x/",
        "agents",
        "agents/skills/mine",
        "",
        long.as_str(),
    ];
    for path in bad {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::POST, "/v1/users/alice/workdirs")
                    .json(&json!({ "path": path })),
            )
            .await;
        assert_eq!(status, 400, "{path:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_workdir", "{path:?}");
    }
    assert!(!server.workspace_of("alice").join("agents").exists());
    assert!(!server.data_dir().join("escape").exists());
}

#[tokio::test]
async fn a_workdir_through_a_planted_symlink_is_refused() {
    let server = server();
    server.workdir("alice", "projects/real").await;
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path(),
        server.workspace_of("alice").join("projects/link"),
    )
    .unwrap();
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/users/alice/workdirs")
                .json(&json!({ "path": "projects/link/inner" })),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "symlink_refused");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn unsafe_uids_get_a_hashed_directory() {
    let server = server();
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/users/a%20b%2F..%2Fc/workdirs")
                .json(&json!({ "path": "p" })),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let shared = server.data_dir().join("user-data/shared");
    let names: Vec<String> = std::fs::read_dir(&shared)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 1);
    assert!(
        names[0].starts_with("uid-") && names[0].len() == 68,
        "{names:?}"
    );
}
