//! The Viewer in a real browser: Debian's headless Chromium driven by playwright-core
//! (`crates/warren/tests/viewer/e2e.mjs`; scripts/test installs both). Opening a link,
//! browsing, previews, download, upload, artifacts, a large directory, the keyboard, a
//! phone-sized screen, refused links and traversal URLs, and no script from the workspace
//! ever running.
//!
//! `WARREN_VIEWER_SCREENSHOT=docs/viewer.png cargo test ... viewer_browser` refreshes the
//! screenshot the README shows.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::server;

const E2E_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/viewer");

/// What the browser test needs, with what to do when it is missing.
fn require_tools() {
    let chromium = Path::new("/usr/bin/chromium");
    assert!(
        chromium.exists(),
        "Debian's chromium is missing (/usr/bin/chromium): apt-get install chromium (scripts/test does)"
    );
    assert!(
        Path::new(E2E_DIR).join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: npm ci --prefix crates/warren/tests/viewer (scripts/test does)"
    );
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|out| out.status.success()),
        "node is missing: install Node.js 20 or newer"
    );
}

async fn link(server: &TestServer, workdir: &str, ttl_s: u64) -> String {
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/viewer-links")
                .json(&json!({ "uid": "alice", "workdir": workdir, "ttl_s": ttl_s })),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body["url"].as_str().unwrap().to_owned()
}

fn tiny_png() -> Vec<u8> {
    hex::decode(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154\
         789c6360f8cfc0f01f0005000201a5f64c6e0000000049454e44ae426082",
    )
    .unwrap()
}

const TINY_PDF: &str = "%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n\
    2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n\
    3 0 obj<</Type/Page/MediaBox[0 0 200 200]/Parent 2 0 R>>endobj\n\
    trailer<</Root 1 0 R>>\n%%EOF\n";

#[tokio::test]
async fn the_viewer_works_in_a_real_browser() {
    require_tools();
    let server = server();
    server.workdir("alice", "projects/a").await;
    server.workdir("alice", "projects/b").await;
    let a = server.workspace_of("alice").join("projects/a");
    std::fs::create_dir_all(a.join("docs")).unwrap();
    std::fs::create_dir_all(a.join("big")).unwrap();
    std::fs::write(a.join("notes.txt"), "line one\nline two\n").unwrap();
    std::fs::write(
        a.join("docs/readme.md"),
        "# Hello\n\nWhat the agent wrote, **rendered**.\n\n\
         <script>window.__pwned=1</script>\n\n<img src=x onerror=\"window.__pwned=2\">\n\n\
         | file | lines |\n|---|---|\n| notes.txt | 2 |\n",
    )
    .unwrap();
    std::fs::write(a.join("pixel.png"), tiny_png()).unwrap();
    std::fs::write(
        a.join("page.html"),
        "<script>window.__pwned=3; document.title='pwned'</script>",
    )
    .unwrap();
    std::fs::write(a.join("doc.pdf"), TINY_PDF).unwrap();
    for i in 0..2_000 {
        std::fs::write(a.join(format!("big/file-{i:04}.txt")), "x").unwrap();
    }
    std::fs::write(
        server.workspace_of("alice").join("projects/b/secret-b.txt"),
        "TOP-SECRET-B",
    )
    .unwrap();
    let sandbox = server.sandbox("alice", "t", "projects/a").await;
    let (status, _) = server
        .send_json(
            server
                .request(Method::PUT, &format!("/v1/sandboxes/{sandbox}/files"))
                .query(&[("path", "outputs/report.md")])
                .body("# Report\n"),
        )
        .await;
    assert!(status < 300);
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{sandbox}/artifacts"))
                .json(&json!({ "paths": ["outputs/report.md"] })),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    let good = link(&server, "projects/a", 600).await;
    let other = link(&server, "projects/b", 600).await;
    let expired = link(&server, "projects/a", 1).await;
    let (payload, tag) = good.rsplit_once('.').unwrap();
    let flipped = if tag.starts_with('A') { "B" } else { "A" };
    let tampered = format!("{payload}.{flipped}{}", &tag[1..]);
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let scratch = tempfile::tempdir().unwrap();
    let screenshot = std::env::var_os("WARREN_VIEWER_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| scratch.path().join("viewer.png"));
    let downloads = scratch.path().join("downloads");
    std::fs::create_dir(&downloads).unwrap();
    let config = json!({
        "base": server.url,
        "link": good,
        "other_link": other,
        "expired_link": expired,
        "tampered_link": tampered,
        "chromium": "/usr/bin/chromium",
        "screenshot": screenshot,
        "download_dir": downloads,
        "expect": {
            "text_file": "/notes.txt", "text_content": "line one",
            "markdown_file": "/docs/readme.md", "markdown_heading": "Hello",
            "image_file": "/pixel.png",
            "html_file": "/page.html",
            "download_file": "/notes.txt", "download_content": "line one\nline two\n",
            "artifact_name": "report.md",
            "b_only_file": "/secret-b.txt"
        }
    });
    let config_path = scratch.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(Path::new(E2E_DIR).join("e2e.mjs"))
            .arg("--config")
            .arg(&config_path)
            .output()
            .expect("node runs the browser test")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The browser's own report (timings included) shows with `--nocapture`.
    eprintln!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("ALL VIEWER CHECKS PASSED"),
        "the browser test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let png = std::fs::read(&screenshot).expect("a screenshot was taken");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a real screenshot"
    );
    let uploaded = server
        .workspace_of("alice")
        .join("projects/a/uploads/hello-upload.txt");
    assert_eq!(
        std::fs::read_to_string(uploaded).unwrap(),
        "uploaded by the browser test"
    );
    // Nothing the page did started a runtime (I17): the sandbox is still only created.
    let (_, info) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{sandbox}")))
        .await;
    assert_eq!(info["state"], "created");
}
