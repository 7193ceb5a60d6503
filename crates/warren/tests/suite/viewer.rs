//! The Viewer over HTTP (I17): signed links, the session cookie, the JSON API, uploads, and
//! every way of reaching outside the one workdir a link was issued for. The browser-level
//! tests (real Chromium) are in `viewer_browser.rs`.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::server;

const SECRET: &str = "TOP-SECRET-OF-B";

/// A server where alice has workdirs `projects/a` (the one linked) and `projects/b` (with a
/// secret), bob has one, and links of every shape can be made.
struct World {
    server: TestServer,
    http: reqwest::Client,
}

impl World {
    async fn new() -> Self {
        let server = server();
        server.workdir("alice", "projects/a").await;
        server.workdir("alice", "projects/b").await;
        server.workdir("bob", "projects/x").await;
        let a = server.workspace_of("alice").join("projects/a");
        std::fs::create_dir_all(a.join("docs/deep")).unwrap();
        std::fs::write(a.join("notes.txt"), "line one\nline two\n").unwrap();
        std::fs::write(
            a.join("docs/readme.md"),
            "# Hello\n\n<script>alert(1)</script>\n*ok*\n",
        )
        .unwrap();
        std::fs::write(
            a.join("page.html"),
            "<script>document.title='pwned'</script>",
        )
        .unwrap();
        std::fs::write(a.join("pixel.png"), tiny_png()).unwrap();
        std::fs::write(
            server.workspace_of("alice").join("projects/b/secret.txt"),
            SECRET,
        )
        .unwrap();
        std::os::unix::fs::symlink(
            server.workspace_of("alice").join("projects/b"),
            a.join("to-b"),
        )
        .unwrap();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Self { server, http }
    }

    async fn link(&self, uid: &str, workdir: &str, ttl_s: u64) -> String {
        let (status, body) = self
            .server
            .send_json(
                self.server
                    .request(Method::POST, "/v1/viewer-links")
                    .json(&json!({ "uid": uid, "workdir": workdir, "ttl_s": ttl_s })),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["url"].as_str().unwrap().to_owned()
    }

    /// Opens `link` and returns the session cookie (`name=value`).
    async fn open(&self, link: &str) -> String {
        let response = self
            .http
            .get(format!("{}{link}", self.server.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let cookie = response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_owned();
        cookie.split(';').next().unwrap().to_owned()
    }

    /// A session on `workdir` of alice, through a fresh ten-minute link.
    async fn session(&self, workdir: &str) -> String {
        self.open(&self.link("alice", workdir, 600).await).await
    }

    fn get(&self, cookie: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.server.url))
            .header("cookie", cookie)
    }
}

fn tiny_png() -> Vec<u8> {
    // A valid 1×1 PNG.
    let hex = "89504e470d0a1a0a0000000d4948445200000001000000010806000000\
               1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5f6\
               4c6e0000000049454e44ae426082";
    hex::decode(hex.replace(char::is_whitespace, "")).unwrap()
}

#[tokio::test]
async fn a_link_opens_a_session_cookie_and_never_carries_the_token() {
    let world = World::new().await;
    let server = &world.server;
    let link = world.link("alice", "projects/a", 600).await;
    assert!(link.starts_with("/viewer/open?t="), "{link}");
    assert!(!link.contains(&server.token));

    let response = world
        .http
        .get(format!("{}{link}", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    for part in [
        "warren_viewer=",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/viewer",
        "Max-Age=",
    ] {
        assert!(cookie.contains(part), "{part} missing: {cookie}");
    }
    assert!(!cookie.contains(&server.token));
    assert_eq!(response.headers()["referrer-policy"], "no-referrer");
    let page = response.text().await.unwrap();
    assert!(page.contains("url=/viewer/") && !page.contains(&server.token));

    let session = cookie.split(';').next().unwrap();
    let (status, body) = server
        .send_json(world.get(session, "/viewer/api/session"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["uid"], "alice");
    assert_eq!(body["workdir"], "projects/a");

    // The page itself carries a strict policy and loads only its own assets.
    let response = world.get(session, "/viewer/").send().await.unwrap();
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{part}: {csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
}

#[tokio::test]
async fn links_are_refused_when_expired_tampered_or_used_as_a_session() {
    let world = World::new().await;
    let server = &world.server;
    let (status, body) = server
        .send_json(
            server
                .anonymous(Method::POST, "/v1/viewer-links")
                .json(&json!({ "uid": "alice", "workdir": "projects/a" })),
        )
        .await;
    assert_eq!(status, 401, "{body}");
    for (request, status, code) in [
        (
            json!({ "uid": "alice", "workdir": "projects/none" }),
            404,
            "workdir_not_found",
        ),
        (
            json!({ "uid": "alice", "workdir": "../x" }),
            400,
            "invalid_workdir",
        ),
        (
            json!({ "uid": "alice", "workdir": "projects/a", "ttl_s": 0 }),
            400,
            "invalid_request",
        ),
        (
            json!({ "uid": "alice", "workdir": "projects/a", "ttl_s": 700000 }),
            400,
            "invalid_request",
        ),
    ] {
        let (got, body) = server
            .send_json(
                server
                    .request(Method::POST, "/v1/viewer-links")
                    .json(&request),
            )
            .await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{request}"
        );
    }

    let short = world.link("alice", "projects/a", 1).await;
    let good = world.link("alice", "projects/a", 600).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let token = good.trim_start_matches("/viewer/open?t=");
    let (payload, tag) = token.split_once('.').unwrap();
    let mut flipped = tag.as_bytes().to_vec();
    flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
    let tampered = format!(
        "/viewer/open?t={payload}.{}",
        String::from_utf8(flipped).unwrap()
    );
    for (link, status) in [
        (short.as_str(), 401),
        (tampered.as_str(), 403),
        ("/viewer/open", 400),
        ("/viewer/open?t=garbage", 403),
    ] {
        let response = world
            .http
            .get(format!("{}{link}", server.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{link}");
        assert!(
            response.headers().get("set-cookie").is_none(),
            "{link} set a cookie"
        );
    }
    // A link token is not a session, and no cookie is no session.
    for cookie in [format!("warren_viewer={token}"), String::new()] {
        let (status, body) = server
            .send_json(world.get(&cookie, "/viewer/api/list?path=/"))
            .await;
        assert_eq!(status, 401, "{body}");
        assert!(body["error"]["code"]
            .as_str()
            .unwrap()
            .starts_with("viewer_session"));
    }
}

#[tokio::test]
async fn the_api_lists_and_previews_only_the_linked_workdir() {
    let world = World::new().await;
    let cookie = world.session("projects/a").await;
    let (status, listing) = world
        .server
        .send_json(world.get(&cookie, "/viewer/api/list?path=/"))
        .await;
    assert_eq!(status, 200, "{listing}");
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["/docs", "/notes.txt", "/page.html", "/pixel.png", "/to-b"]
    );

    let (_, text) = world
        .server
        .send_json(world.get(&cookie, "/viewer/api/preview?path=/notes.txt"))
        .await;
    assert_eq!(text["preview"]["type"], "text");
    assert_eq!(text["preview"]["text"], "line one\nline two\n");
    let (_, markdown) = world
        .server
        .send_json(world.get(&cookie, "/viewer/api/preview?path=/docs/readme.md"))
        .await;
    let html = markdown["preview"]["html"].as_str().unwrap();
    assert!(
        html.contains("<h1>Hello</h1>") && !html.contains("<script"),
        "{html}"
    );
    let (_, page) = world
        .server
        .send_json(world.get(&cookie, "/viewer/api/preview?path=/page.html"))
        .await;
    assert_eq!(
        page["preview"]["type"], "none",
        "HTML is never rendered: {page}"
    );

    // Workspace HTML comes only as an attachment in a sandbox; images inline.
    let response = world
        .get(&cookie, "/viewer/api/raw?path=/page.html")
        .send()
        .await
        .unwrap();
    let headers = response.headers();
    assert!(headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert!(headers["content-security-policy"]
        .to_str()
        .unwrap()
        .starts_with("sandbox"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let response = world
        .get(&cookie, "/viewer/api/raw?path=/pixel.png")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "image/png");
    assert!(response.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("inline"));
}

#[tokio::test]
async fn no_url_form_reaches_outside_the_workdir() {
    let world = World::new().await;
    let cookie = world.session("projects/a").await;
    let data_dir = world.server.data_dir().to_string_lossy().into_owned();
    let mut tried = 0;
    for path in [
        "/../b/secret.txt",
        "../b/secret.txt",
        "/..%2fb%2fsecret.txt",
        "/%2e%2e/b/secret.txt",
        "%2e%2e%2fb%2fsecret.txt",
        "//../b/secret.txt",
        "/to-b/secret.txt",
        "/to-b",
        "/docs/../../b/secret.txt",
        "/etc/passwd/../../../b/secret.txt",
        "/%00",
        "/..",
    ] {
        for endpoint in ["list", "preview", "raw"] {
            let url = format!("/viewer/api/{endpoint}?path={path}");
            let response = world.get(&cookie, &url).send().await.unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            assert!(!body.contains(SECRET), "{url} leaked: {body}");
            assert!(
                !body.contains(&data_dir),
                "{url} leaked a host path: {body}"
            );
            assert!(
                (400..500).contains(&status),
                "{url} answered {status}: {body}"
            );
            tried += 1;
        }
    }
    assert!(tried >= 36);

    // The path part of the route itself cannot be bent either.
    for url in [
        "/viewer/api/../../v1/sandboxes",
        "/viewer/assets/..%2f..%2fwarren.db",
        "/viewer/assets/%2e%2e/app.js",
    ] {
        let response = world.get(&cookie, url).send().await.unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert!(
            status == 404 || status == 401 || status == 400,
            "{url}: {status} {body}"
        );
    }

    // A link for another workdir, or bob, sees only its own.
    let other = world.session("projects/b").await;
    let (_, listing) = world
        .server
        .send_json(world.get(&other, "/viewer/api/list?path=/"))
        .await;
    assert_eq!(listing["entries"][0]["path"], "/secret.txt");
    let (status, _) = world
        .server
        .send_json(world.get(&other, "/viewer/api/preview?path=/../a/notes.txt"))
        .await;
    assert_eq!(status, 400);

    // The workdir swapped for a symlink after the link was issued: refused, not followed.
    let a = world.server.workspace_of("alice").join("projects/a");
    std::fs::rename(&a, a.with_file_name("a-moved")).unwrap();
    std::os::unix::fs::symlink(world.server.workspace_of("alice").join("projects/b"), &a).unwrap();
    let response = world
        .get(&cookie, "/viewer/api/raw?path=/secret.txt")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    assert!(
        !body.contains(SECRET),
        "the swapped workdir was followed: {body}"
    );
    assert_eq!(status, 403, "{body}");
}

#[tokio::test]
async fn uploads_land_in_uploads_with_limits_and_no_overwrite_by_accident() {
    let world = World::new().await;
    let cookie = world.session("projects/a").await;
    let upload = |name: &str, body: Vec<u8>, header: bool| {
        let mut request = world
            .http
            .post(format!("{}/viewer/api/upload", world.server.url))
            .query(&[("name", name)])
            .header("cookie", &cookie)
            .body(body);
        if header {
            request = request.header("x-warren-viewer", "1");
        }
        request
    };
    let (status, _) = world
        .server
        .send_json(upload("a.txt", b"x".to_vec(), false))
        .await;
    assert_eq!(status, 403, "an upload without the Viewer's header");
    assert!(!world
        .server
        .workspace_of("alice")
        .join("projects/a/uploads")
        .exists());

    let (status, body) = world
        .server
        .send_json(upload("report.txt", b"first".to_vec(), true))
        .await;
    assert_eq!(
        (status, body["path"].as_str()),
        (201, Some("/uploads/report.txt"))
    );
    let host = world
        .server
        .workspace_of("alice")
        .join("projects/a/uploads/report.txt");
    assert_eq!(std::fs::read(&host).unwrap(), b"first");
    if super::running_as_root() {
        let meta = std::fs::metadata(&host).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "I11");
    }
    let (status, body) = world
        .server
        .send_json(upload("report.txt", b"second".to_vec(), true))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("already_exists"))
    );
    let (status, _) = world
        .server
        .send_json(upload("report.txt", b"second".to_vec(), true).query(&[("overwrite", "1")]))
        .await;
    assert_eq!(status, 201);
    assert_eq!(std::fs::read(&host).unwrap(), b"second");

    for name in ["../escape.txt", "a/b", "..", ""] {
        let (status, body) = world
            .server
            .send_json(upload(name, b"x".to_vec(), true))
            .await;
        assert_eq!(status, 400, "{name:?}: {body}");
    }
    let big = vec![b'x'; warren_api_max_upload() + 1];
    let (status, body) = world.server.send_json(upload("big.bin", big, true)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("too_large"))
    );

    // uploads/ planted as a link to elsewhere is not followed.
    let other = world.session("projects/b").await;
    std::os::unix::fs::symlink(
        "/tmp",
        world
            .server
            .workspace_of("alice")
            .join("projects/b/uploads"),
    )
    .unwrap();
    let response = world
        .http
        .post(format!("{}/viewer/api/upload", world.server.url))
        .query(&[("name", "pwn.txt")])
        .header("cookie", &other)
        .header("x-warren-viewer", "1")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert!(!std::path::Path::new("/tmp/pwn.txt").exists());
}

fn warren_api_max_upload() -> usize {
    25 * 1024 * 1024
}

#[tokio::test]
async fn artifacts_of_the_workdir_are_listed_and_downloaded_as_attachments() {
    let world = World::new().await;
    let server = &world.server;
    let id = server.sandbox("alice", "t", "projects/a").await;
    let other = server.sandbox("alice", "t2", "projects/b").await;
    for (sandbox, path, body) in [
        (&id, "outputs/r.html", "<b>hi</b>"),
        (&other, "outputs/s.txt", SECRET),
    ] {
        let (status, _) = server
            .send_json(
                server
                    .request(Method::PUT, &format!("/v1/sandboxes/{sandbox}/files"))
                    .query(&[("path", path)])
                    .body(body),
            )
            .await;
        assert!(status < 300);
        let (status, _) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{sandbox}/artifacts"))
                    .json(&json!({ "paths": [path] })),
            )
            .await;
        assert_eq!(status, 201);
    }
    let cookie = world.session("projects/a").await;
    let (_, body) = server
        .send_json(world.get(&cookie, "/viewer/api/artifacts"))
        .await;
    let artifacts = body["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "only this workdir's: {body}");
    assert_eq!(artifacts[0]["path"], "/outputs/r.html");
    let url = artifacts[0]["download_url"].as_str().unwrap();
    let response = world.get(&cookie, url).send().await.unwrap();
    assert!(response.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));
    assert_eq!(response.text().await.unwrap(), "<b>hi</b>");
    // The other workdir's artifact id is not reachable from this session.
    let (_, all) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{other}/artifacts")))
        .await;
    let foreign = all["artifacts"][0]["artifact_id"].as_str().unwrap();
    let (status, body) = server
        .send_json(world.get(&cookie, &format!("/viewer/api/artifacts/{foreign}")))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("artifact_not_found"))
    );
}

#[tokio::test]
async fn a_directory_of_ten_thousand_files_is_listed_a_page_at_a_time() {
    let world = World::new().await;
    let big = world.server.workspace_of("alice").join("projects/a/big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..10_000 {
        std::fs::write(big.join(format!("f{i:05}.txt")), "x").unwrap();
    }
    let cookie = world.session("projects/a").await;
    let started = std::time::Instant::now();
    let (status, page) = world
        .server
        .send_json(world.get(&cookie, "/viewer/api/list?path=/big&offset=500&limit=500"))
        .await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert_eq!(page["total"], 10_000);
    assert_eq!(page["truncated"], true);
    assert_eq!(page["entries"].as_array().unwrap().len(), 500);
    assert_eq!(page["entries"][0]["path"], "/big/f00500.txt");
    eprintln!("listing a page of a 10,000-entry directory took {took:?}");
}
