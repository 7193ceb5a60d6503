//! File operations by virtual path (I1, I7, I8, I10, I11).

use std::os::unix::fs::MetadataExt;

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::{running_as_root, server};

async fn put(server: &TestServer, id: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path)])
                .body(body.to_owned()),
        )
        .await
}

async fn post(
    server: &TestServer,
    id: &str,
    op: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/files/{op}"))
                .json(&body),
        )
        .await
}

#[tokio::test]
async fn a_written_file_reads_back_with_its_etag_and_lands_as_1000() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, written) = put(&server, &id, "outputs/report.md", "# hello\n").await;
    assert_eq!(status, 201, "{written}");
    assert_eq!(
        written["path"],
        "/home/gem/user-data/projects/a/outputs/report.md"
    );
    assert_eq!(written["size"], 8);
    let response = server
        .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", "/home/gem/user-data/projects/a/outputs/report.md")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["etag"].to_str().unwrap(),
        format!("\"{}\"", written["etag"].as_str().unwrap())
    );
    assert_eq!(response.headers()["x-content-type-options"], "nosniff");
    assert_eq!(response.text().await.unwrap(), "# hello\n");
    let host = server
        .workspace_of("alice")
        .join("projects/a/outputs/report.md");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "# hello\n");
    if running_as_root() {
        for path in [host.clone(), host.parent().unwrap().to_owned()] {
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{}", path.display());
        }
    }
    let (status, _) = put(&server, &id, "outputs/report.md", "v2").await;
    assert_eq!(status, 200, "replacing answers 200");
}

#[tokio::test]
async fn byte_ranges_answer_206_with_content_range() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    put(&server, &id, "digits.txt", "0123456789").await;
    let cases = [
        ("bytes=2-4", "234", "bytes 2-4/10"),
        ("bytes=7-", "789", "bytes 7-9/10"),
        ("bytes=-3", "789", "bytes 7-9/10"),
    ];
    for (range, expected, content_range) in cases {
        let response = server
            .request(
                Method::GET,
                &format!("/v1/sandboxes/{id}/files?path=digits.txt"),
            )
            .header("range", range)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 206, "{range}");
        assert_eq!(response.headers()["content-range"], content_range);
        assert_eq!(response.text().await.unwrap(), expected);
    }
    let (status, body) = server
        .send_json(
            server
                .request(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files?path=digits.txt"),
                )
                .header("range", "bytes=5-2"),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (416, Some("invalid_range"))
    );
}

#[tokio::test]
async fn listing_globbing_and_grepping_report_virtual_paths() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    for (path, body) in [
        ("src/main.rs", "fn main() {}\n// TODO: x\n"),
        ("src/lib/mod.rs", "// todo later\n"),
        ("README.md", "hi\n"),
    ] {
        put(&server, &id, path, body).await;
    }
    let (status, list) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/list?depth=1"),
        ))
        .await;
    assert_eq!(status, 200, "{list}");
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/home/gem/user-data/projects/a/README.md",
            "/home/gem/user-data/projects/a/src"
        ]
    );
    let (_, deep) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/list?path=src&depth=5"),
        ))
        .await;
    assert_eq!(deep["entries"].as_array().unwrap().len(), 3, "{deep}");
    let (status, globbed) = post(&server, &id, "glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(status, 200, "{globbed}");
    let paths: Vec<&str> = globbed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/home/gem/user-data/projects/a/src/lib/mod.rs",
            "/home/gem/user-data/projects/a/src/main.rs"
        ]
    );
    let (status, grepped) = post(
        &server,
        &id,
        "grep",
        json!({"pattern": "todo", "case_insensitive": true}),
    )
    .await;
    assert_eq!(status, 200, "{grepped}");
    assert_eq!(grepped["matches"].as_array().unwrap().len(), 2);
    assert_eq!(
        grepped["matches"][0]["path"],
        "/home/gem/user-data/projects/a/src/lib/mod.rs"
    );
    let (status, capped) = post(
        &server,
        &id,
        "grep",
        json!({"pattern": ".", "max_matches": 1}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            capped["matches"].as_array().unwrap().len(),
            capped["truncated"].as_bool()
        ),
        (1, Some(true))
    );
    let (status, body) = post(&server, &id, "grep", json!({"pattern": "("})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_regex"))
    );
}

#[tokio::test]
async fn edit_refuses_zero_and_ambiguous_matches_unless_replace_all() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    put(&server, &id, "notes.txt", "a b a").await;
    let (status, body) = post(
        &server,
        &id,
        "edit",
        json!({"path": "notes.txt", "old": "zzz", "new": "y"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("edit_no_match"))
    );
    let (status, body) = post(
        &server,
        &id,
        "edit",
        json!({"path": "notes.txt", "old": "a", "new": "y"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("edit_ambiguous"))
    );
    let (status, body) = post(
        &server,
        &id,
        "edit",
        json!({"path": "notes.txt", "old": "b", "new": "B"}),
    )
    .await;
    assert_eq!(
        (status, body["replacements"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    let (status, body) = post(
        &server,
        &id,
        "edit",
        json!({"path": "notes.txt", "old": "a", "new": "Z", "replace_all": true}),
    )
    .await;
    assert_eq!((status, body["replacements"].as_u64()), (200, Some(2)));
    let host = server.workspace_of("alice").join("projects/a/notes.txt");
    assert_eq!(std::fs::read_to_string(host).unwrap(), "Z B Z");
}

#[tokio::test]
async fn mkdir_move_and_delete_follow_their_rules() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, made) = post(&server, &id, "mkdir", json!({"path": "x/y/z"})).await;
    assert_eq!((status, made["created"].as_bool()), (200, Some(true)));
    put(&server, &id, "x/y/z/f.txt", "f").await;
    put(&server, &id, "g.txt", "g").await;
    let (status, body) = post(
        &server,
        &id,
        "move",
        json!({"from": "g.txt", "to": "x/f.txt"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["to"], "/home/gem/user-data/projects/a/x/f.txt");
    put(&server, &id, "h.txt", "h").await;
    let (status, body) = post(
        &server,
        &id,
        "move",
        json!({"from": "h.txt", "to": "x/f.txt"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("already_exists"))
    );
    let (status, _) = post(
        &server,
        &id,
        "move",
        json!({"from": "h.txt", "to": "x/f.txt", "overwrite": true}),
    )
    .await;
    assert_eq!(status, 200);
    let delete = |path: &str, recursive: bool| {
        server.send_json(
            server
                .request(Method::DELETE, &format!("/v1/sandboxes/{id}/files"))
                .query(&[
                    ("path", path),
                    ("recursive", if recursive { "true" } else { "false" }),
                ]),
        )
    };
    let (status, body) = delete("x", false).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("directory_not_empty"))
    );
    let (status, _) = delete("x", true).await;
    assert_eq!(status, 204);
    assert!(!server.workspace_of("alice").join("projects/a/x").exists());
    let (status, body) = delete("/home/gem/user-data", true).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("root_refused"))
    );
    assert!(server.workspace_of("alice").join("projects/a").is_dir());
}

#[tokio::test]
async fn skills_are_readable_and_never_writable() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let skills = server.data_dir().join("skill-projections/alice/pdf");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(skills.join("SKILL.md"), "use pdftotext").unwrap();
    let response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/home/gem/skills/pdf/SKILL.md"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "use pdftotext");
    let (status, body) = put(&server, &id, "/home/gem/skills/pdf/SKILL.md", "evil").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("read_only"))
    );
    let (status, _) = post(
        &server,
        &id,
        "mkdir",
        json!({"path": "/home/gem/skills/new"}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = post(
        &server,
        &id,
        "move",
        json!({"from": "/home/gem/skills/pdf/SKILL.md", "to": "stolen.md"}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = server
        .send_json(server.request(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/files?path=/home/gem/skills/pdf&recursive=true"),
        ))
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        std::fs::read_to_string(skills.join("SKILL.md")).unwrap(),
        "use pdftotext"
    );
}

#[tokio::test]
async fn every_project_of_a_uid_is_visible_to_its_sandboxes() {
    let server = server();
    let a = server.sandbox("alice", "t1", "projects/a").await;
    let b = server.sandbox("alice", "t2", "projects/b").await;
    put(&server, &b, "from-b.txt", "b").await;
    let response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{a}/files?path=/home/gem/user-data/projects/b/from-b.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "I10: project A can read project B");
}

#[tokio::test]
async fn files_outlive_their_sandbox() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    put(&server, &id, "kept.txt", "kept").await;
    server.terminate(&id).await;
    let response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=kept.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "kept");
}
