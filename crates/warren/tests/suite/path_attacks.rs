//! The path attack corpus through the real HTTP server (I1, I2, I37).
//!
//! Each attack is a virtual path run against every file operation. Every answer must be a
//! 4xx with a stable code, no byte of a secret outside the boundary may come back, no host
//! path may appear, and nothing outside the boundary may be created, changed or deleted.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::json;
use warren_test_support::{McpSession, TestServer};

use super::server;

const SECRET: &str = "TOP-SECRET";

/// The planted world: alice's sandbox, a secret outside the data dir, bob's secret, and
/// symlinks of every shape inside alice's workdir.
struct World {
    server: TestServer,
    id: String,
    outside: tempfile::TempDir,
}

impl World {
    async fn plant() -> Self {
        let server = server();
        let id = server.sandbox("alice", "t", "projects/a").await;
        server.sandbox("bob", "t", "projects/b").await;
        std::fs::write(
            server.workspace_of("bob").join("projects/b/secret.txt"),
            SECRET,
        )
        .unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), SECRET).unwrap();
        std::fs::create_dir(outside.path().join("dir")).unwrap();
        std::fs::write(outside.path().join("dir/secret.txt"), SECRET).unwrap();
        let work = server.workspace_of("alice").join("projects/a");
        std::fs::create_dir(work.join("real")).unwrap();
        std::fs::write(work.join("real/ok.txt"), "fine").unwrap();
        let out = outside.path();
        symlink(out, work.join("abs_link")).unwrap();
        symlink("../../../../../../../..", work.join("rel_link")).unwrap();
        symlink(out.join("secret.txt"), work.join("last_link")).unwrap();
        symlink("real/ok.txt", work.join("inside_link")).unwrap();
        symlink("/proc/self/root", work.join("proc_root")).unwrap();
        symlink("/proc/self/cwd", work.join("proc_cwd")).unwrap();
        symlink(server.workspace_of("bob"), work.join("bob_link")).unwrap();
        symlink(out.join("dir"), work.join("real/mid_link")).unwrap();
        std::fs::create_dir(server.workspace_of("alice").join("top")).unwrap();
        symlink(out, server.workspace_of("alice").join("top/first")).unwrap();
        Self {
            server,
            id,
            outside,
        }
    }

    fn outside(&self) -> &Path {
        self.outside.path()
    }
}

/// Paths whose last component is a symlink planted by [`World::plant`].
const BARE_LINKS: [&str; 3] = ["abs_link", "last_link", "inside_link"];

/// Virtual paths that must never reach outside alice's boundary.
fn corpus(world: &World) -> Vec<String> {
    let secret_abs = world.outside().join("secret.txt");
    let long_component = "a".repeat(256);
    let long_path = ["abcdefgh"; 600].join("/");
    vec![
        "..".into(),
        "../secret.txt".into(),
        "../../../../../../etc/passwd".into(),
        "real/../../b".into(),
        "/home/gem/user-data/../../../etc/shadow".into(),
        "/home/gem/user-data/projects/a/../../../../bob/workspace/projects/b/secret.txt".into(),
        "/home/gem/skills/../user-data".into(),
        "/etc/passwd".into(),
        "/root".into(),
        secret_abs.to_string_lossy().into_owned(),
        "/home/gem".into(),
        "/home/gem/user-dataX/secret.txt".into(),
        "abs_link/secret.txt".into(),
        "abs_link".into(),
        "rel_link/etc/passwd".into(),
        "last_link".into(),
        "inside_link".into(),
        "proc_root/etc/passwd".into(),
        "proc_cwd/secret.txt".into(),
        "bob_link/projects/b/secret.txt".into(),
        "real/mid_link/secret.txt".into(),
        "/home/gem/user-data/top/first/secret.txt".into(),
        "nul\0byte".into(),
        long_component,
        long_path,
    ]
}

/// Every file operation, aimed at `path`.
fn operations(server: &TestServer, id: &str, path: &str) -> Vec<(String, reqwest::RequestBuilder)> {
    let base = format!("/v1/sandboxes/{id}/files");
    vec![
        (
            "read".into(),
            server.request(Method::GET, &base).query(&[("path", path)]),
        ),
        (
            "stat".into(),
            server
                .request(Method::GET, &format!("{base}/stat"))
                .query(&[("path", path)]),
        ),
        (
            "list".into(),
            server
                .request(Method::GET, &format!("{base}/list"))
                .query(&[("path", path), ("depth", "3")]),
        ),
        (
            "write".into(),
            server
                .request(Method::PUT, &base)
                .query(&[("path", path)])
                .body("PWNED"),
        ),
        (
            "append".into(),
            server
                .request(Method::PUT, &base)
                .query(&[("path", path), ("append", "true")])
                .body("PWNED"),
        ),
        (
            "delete".into(),
            server
                .request(Method::DELETE, &base)
                .query(&[("path", path), ("recursive", "true")]),
        ),
        (
            "edit".into(),
            server
                .request(Method::POST, &format!("{base}/edit"))
                .json(&json!({"path": path, "old": SECRET, "new": "PWNED"})),
        ),
        (
            "mkdir".into(),
            server
                .request(Method::POST, &format!("{base}/mkdir"))
                .json(&json!({"path": format!("{path}/newdir")})),
        ),
        (
            "move-from".into(),
            server
                .request(Method::POST, &format!("{base}/move"))
                .json(&json!({"from": path, "to": "moved"})),
        ),
        (
            "move-to".into(),
            server
                .request(Method::POST, &format!("{base}/move"))
                .json(&json!({"from": "real/ok.txt", "to": path})),
        ),
        (
            "glob".into(),
            server
                .request(Method::POST, &format!("{base}/glob"))
                .json(&json!({"pattern": "**", "path": path})),
        ),
        (
            "grep".into(),
            server
                .request(Method::POST, &format!("{base}/grep"))
                .json(&json!({"pattern": "SECRET", "path": path})),
        ),
    ]
}

/// Whether `path` names the runtime's own tree: absolute, outside the mounts, with no `..`
/// (refused before anything runs) and no NUL.
fn runtime_path(path: &str) -> bool {
    path.starts_with('/')
        && !path.starts_with("/home/gem/user-data/")
        && !path.starts_with("/home/gem/skills/")
        && !path.split('/').any(|part| part == ".." || part.len() > 255)
        && !path.contains('\0')
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
                out.push((path, Vec::new()));
            } else {
                let bytes = std::fs::read(&path).unwrap_or_default();
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn no_attack_path_reaches_outside_the_boundary() {
    let world = World::plant().await;
    let server = &world.server;
    let before_outside = snapshot(world.outside());
    let bob = server.workspace_of("bob");
    let before_bob = snapshot(&bob);
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    let mut checked = 0;
    for path in corpus(&world) {
        for (op, request) in operations(server, &world.id, &path) {
            // Deleting or moving a symlink acts on the link itself, inside the boundary, and
            // is allowed; `deleting_a_symlink_removes_the_link_not_its_target` covers it.
            if BARE_LINKS.contains(&path.as_str()) && (op == "delete" || op == "move-from") {
                continue;
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            let shown: String = path.chars().take(60).collect();
            assert!(
                !body.contains(SECRET),
                "{op} {shown:?} leaked the secret: {body}"
            );
            assert!(
                !body.contains(&data_dir),
                "{op} {shown:?} leaked a host path: {body}"
            );
            // A plain absolute path outside the mounts is the runtime's own (issue 42),
            // which only a runtime's agent serves: this backend runs none.
            if runtime_path(&path) && op != "move-from" && op != "move-to" {
                let json: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(
                    (status, &json["error"]["code"]),
                    (501, &json!("exec_not_supported")),
                    "{op} {shown:?}"
                );
                checked += 1;
                continue;
            }
            assert!(
                (400..500).contains(&status),
                "{op} {shown:?} answered {status}: {body}"
            );
            let json: serde_json::Value = serde_json::from_str(&body)
                .unwrap_or_else(|_| panic!("{op} {shown:?}: not JSON: {body}"));
            assert!(json["error"]["code"].is_string(), "{op} {shown:?}: {body}");
            checked += 1;
        }
    }
    assert!(checked >= 250, "only {checked} attacks ran");
    assert_eq!(
        snapshot(world.outside()),
        before_outside,
        "something outside changed"
    );
    assert_eq!(snapshot(&bob), before_bob, "bob's workspace changed");
    assert!(world.outside().join("secret.txt").exists());
    // The planted symlinks themselves are still there: a refused delete removed nothing.
    let work = server.workspace_of("alice").join("projects/a");
    for link in [
        "abs_link",
        "last_link",
        "proc_root",
        "bob_link",
        "real/mid_link",
    ] {
        assert!(
            std::fs::symlink_metadata(work.join(link))
                .unwrap()
                .file_type()
                .is_symlink(),
            "{link}"
        );
    }
}

#[tokio::test]
async fn no_attack_path_reaches_outside_through_the_mcp_tools() {
    let world = World::plant().await;
    let server = &world.server;
    let before_outside = snapshot(world.outside());
    let bob = server.workspace_of("bob");
    let before_bob = snapshot(&bob);
    let host_paths = [
        server.data_dir().to_string_lossy().into_owned(),
        world.outside().to_string_lossy().into_owned(),
    ];
    let mut mcp = McpSession::open(server, &world.id).await;
    let mut checked = 0;
    for path in corpus(&world) {
        let calls = [
            ("read_file", json!({"path": path})),
            ("ls", json!({"path": path, "depth": 3})),
            ("write_file", json!({"path": path, "content": "PWNED"})),
            (
                "write_file",
                json!({"path": format!("{path}/new.txt"), "content": "PWNED"}),
            ),
            (
                "edit_file",
                json!({"path": path, "old_string": SECRET, "new_string": "PWNED"}),
            ),
            ("glob", json!({"pattern": "**", "path": path})),
            ("grep", json!({"pattern": "SECRET", "path": path})),
            ("view_image", json!({"path": path})),
            ("present_files", json!({"paths": [path]})),
        ];
        for (tool, arguments) in calls {
            let answer = mcp.call_tool(tool, arguments).await;
            let shown: String = path.chars().take(60).collect();
            let result = &answer["result"];
            assert_eq!(
                result["isError"], true,
                "{tool} {shown:?} was not refused as a tool error: {answer}"
            );
            let text = result["content"].to_string();
            assert!(
                !text.contains(SECRET),
                "{tool} {shown:?} leaked the secret: {text}"
            );
            // A host path may come back only as the caller's own input, echoed.
            for host in host_paths
                .iter()
                .filter(|host| !path.contains(host.as_str()))
            {
                assert!(
                    !text.contains(host.as_str()),
                    "{tool} {shown:?} leaked a host path: {text}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 200, "only {checked} attacks ran");
    assert_eq!(
        snapshot(world.outside()),
        before_outside,
        "something outside changed"
    );
    assert_eq!(snapshot(&bob), before_bob, "bob's workspace changed");
}

#[tokio::test]
async fn refusals_name_the_reason_with_stable_codes() {
    let world = World::plant().await;
    let server = &world.server;
    let cases = [
        ("../x", "invalid_path"),
        ("/home/gem/user-data/../../../etc/passwd", "invalid_path"),
        ("abs_link/secret.txt", "symlink_refused"),
        ("last_link", "symlink_refused"),
        ("inside_link", "symlink_refused"),
        ("proc_root/etc/passwd", "symlink_refused"),
        ("real/mid_link/secret.txt", "symlink_refused"),
    ];
    for (path, code) in cases {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::GET, &format!("/v1/sandboxes/{}/files", world.id))
                    .query(&[("path", path)]),
            )
            .await;
        assert_eq!(body["error"]["code"], code, "{path}: {status} {body}");
        let message = body["error"]["message"].as_str().unwrap();
        if code == "invalid_path" {
            assert!(
                message.contains("/home/gem/user-data"),
                "the message names the allowed roots: {message}"
            );
        } else {
            assert!(
                message.starts_with("/home/gem/user-data/"),
                "virtual path in message: {message}"
            );
        }
    }
}

#[tokio::test]
async fn a_listing_shows_symlinks_but_never_descends_them() {
    let world = World::plant().await;
    let server = &world.server;
    let (status, body) = server
        .send_json(
            server
                .request(
                    Method::GET,
                    &format!("/v1/sandboxes/{}/files/list", world.id),
                )
                .query(&[("depth", "10")]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let text = body.to_string();
    assert!(!text.contains("secret.txt"), "a link was followed: {text}");
    let kinds: Vec<(&str, &str)> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert!(
        kinds.contains(&("/home/gem/user-data/projects/a/abs_link", "symlink")),
        "{kinds:?}"
    );
}

/// A directory component is swapped for a symlink to the outside while reads and writes run
/// through the API. No read may return the outside secret; no write may land outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_during_operations_never_leaks() {
    let world = World::plant().await;
    let server = &world.server;
    let work = server.workspace_of("alice").join("projects/a");
    std::fs::create_dir(work.join("swap_real")).unwrap();
    std::fs::write(work.join("swap_real/secret.txt"), "inside").unwrap();
    symlink(world.outside().join("dir"), work.join("swap_link")).unwrap();
    std::fs::rename(work.join("swap_real"), work.join("swap")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let work = work.clone();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // swap <-> swap_link in one atomic exchange, so `swap` always exists and is
                // at every instant either the real directory or the link to the outside.
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    work.join("swap"),
                    rustix::fs::CWD,
                    work.join("swap_link"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let base = format!("/v1/sandboxes/{}/files", world.id);
    let mut inside_reads = 0;
    for i in 0..400 {
        let response = server
            .request(Method::GET, &base)
            .query(&[("path", "swap/secret.txt")])
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(
            !body.contains(SECRET),
            "iteration {i}: read the outside secret"
        );
        if status == 200 {
            assert_eq!(body, "inside");
            inside_reads += 1;
        }
        let response = server
            .request(Method::PUT, &base)
            .query(&[("path", format!("swap/new-{i}.txt"))])
            .body("x")
            .send()
            .await
            .unwrap();
        assert!(
            response.status().as_u16() < 500,
            "iteration {i}: {}",
            response.status()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 100, "the race barely ran ({swaps} swaps)");
    let outside_files: Vec<_> = std::fs::read_dir(world.outside().join("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        outside_files,
        [std::ffi::OsString::from("secret.txt")],
        "a write landed outside"
    );
    assert!(
        inside_reads > 0,
        "no read ever saw the real directory; the race test proves nothing"
    );
}

#[tokio::test]
async fn deleting_a_symlink_removes_the_link_not_its_target() {
    let world = World::plant().await;
    let server = &world.server;
    let base = format!("/v1/sandboxes/{}/files", world.id);
    for link in ["abs_link", "last_link", "bob_link"] {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::DELETE, &base)
                    .query(&[("path", link), ("recursive", "true")]),
            )
            .await;
        assert_eq!(status, 204, "{link}: {body}");
    }
    let work = server.workspace_of("alice").join("projects/a");
    assert!(std::fs::symlink_metadata(work.join("abs_link")).is_err());
    assert_eq!(
        std::fs::read_to_string(world.outside().join("secret.txt")).unwrap(),
        SECRET
    );
    assert_eq!(
        std::fs::read_to_string(world.outside().join("dir/secret.txt")).unwrap(),
        SECRET
    );
    let bob = server.workspace_of("bob").join("projects/b/secret.txt");
    assert_eq!(std::fs::read_to_string(bob).unwrap(), SECRET);
}
