//! DeerFlow's provisioner API under `/deerflow` and the AIO sandbox API at each sandbox's
//! URL (issue 16), driven the way DeerFlow's remote backend and `AioSandbox` drive them;
//! `the_official_agent_sandbox_client_*` runs the official SDK
//! (`crates/warren/tests/deerflow/aio_client.py`; scripts/test installs it).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::{run_to_exit, TestServer, TEST_TOKEN};

use super::{bin, write_config};

const KEY: &str = "deerflow-key-0123456789abcdef0123456789abcdef";
const SECRET: &str = "TOP-SECRET";

/// A server with DeerFlow's APIs enabled by `[deerflow] api_key` (and `extra` lines of the
/// same section), on `backend`; the config file lives as long as the server.
struct Deerflow {
    server: TestServer,
    _config: tempfile::NamedTempFile,
    http: reqwest::Client,
}

impl Deerflow {
    fn start(backend: &str, extra: &str) -> Self {
        let config = write_config(&format!("[deerflow]\napi_key = \"{KEY}\"\n{extra}"));
        let server = TestServer::start_with(
            bin(),
            &[
                "--backend",
                backend,
                "--config",
                config.path().to_str().unwrap(),
            ],
        );
        Self::over(server, config)
    }

    fn over(server: TestServer, config: tempfile::NamedTempFile) -> Self {
        Self {
            server,
            _config: config,
            http: reqwest::Client::new(),
        }
    }

    /// A request to the provisioner API with the right key.
    fn api(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}/deerflow{path}", self.server.url))
            .header("X-API-Key", KEY)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        self.server.send_json(request).await
    }

    /// `POST /api/sandboxes` as DeerFlow sends it; asserts 200 and returns the answer.
    async fn create(&self, user: &str, thread: &str) -> Value {
        let (status, body) = self
            .send(self.create_request(user, thread, json!({})))
            .await;
        assert_eq!(status, 200, "create {user}/{thread}: {body}");
        body
    }

    fn create_request(&self, user: &str, thread: &str, extra: Value) -> reqwest::RequestBuilder {
        let mut body = json!({
            "sandbox_id": deerflow_id(user, thread),
            "thread_id": thread,
            "user_id": user,
            "include_legacy_skills": false,
            "provision_lark_cli_runtime": false,
            "provision_lark_cli_broker": false,
        });
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        self.api(Method::POST, "/api/sandboxes").json(&body)
    }

    /// A POST to an AIO endpoint of `sandbox_url` (no credentials, as the SDK sends it).
    async fn aio(&self, sandbox_url: &str, path: &str, body: Value) -> (u16, Value) {
        self.send(self.http.post(format!("{sandbox_url}{path}")).json(&body))
            .await
    }

    async fn probe(&self, sandbox_url: &str) -> (u16, Value) {
        self.send(self.http.get(format!("{sandbox_url}/v1/sandbox")))
            .await
    }
}

/// DeerFlow's own sandbox id: `sha256("{user_id}:{thread_id}")[:8]`.
fn deerflow_id(user: &str, thread: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("{user}:{thread}")))[..8].to_owned()
}

fn url_of(answer: &Value) -> String {
    answer["sandbox_url"]
        .as_str()
        .expect("sandbox_url")
        .to_owned()
}

#[tokio::test]
async fn deerflow_creates_probes_lists_and_deletes_a_sandbox_the_way_its_remote_backend_does() {
    let deerflow = Deerflow::start("local", "");
    let id = deerflow_id("alice", "thread-1");

    // Create twice (DeerFlow retries on a transport error): the same sandbox and URL.
    let first = deerflow.create("alice", "thread-1").await;
    let again = deerflow.create("alice", "thread-1").await;
    assert_eq!(first, again);
    let url = url_of(&first);
    assert_eq!(
        (
            first["sandbox_id"].as_str(),
            first["status"].as_str(),
            first["user_id"].as_str(),
            first["thread_id"].as_str(),
            first["mount_contract_version"].as_u64()
        ),
        (
            Some(id.as_str()),
            Some("Running"),
            Some("alice"),
            Some("thread-1"),
            Some(2)
        ),
        "{first}"
    );
    assert!(
        url.starts_with(&format!("{}/deerflow/sandboxes/sbx-", deerflow.server.url)),
        "{url}"
    );
    assert!(!url.ends_with('/'), "{url}");

    // The readiness probe, then the status DeerFlow keeps a sandbox for.
    let (status, context) = deerflow.probe(&url).await;
    assert_eq!(status, 200, "{context}");
    assert_eq!(context["home_dir"], "/home/gem", "{context}");
    let (status, got) = deerflow
        .send(deerflow.api(Method::GET, &format!("/api/sandboxes/{id}")))
        .await;
    assert_eq!(
        (status, got["status"].as_str()),
        (200, Some("Running")),
        "{got}"
    );
    assert_eq!(url_of(&got), url);
    let (status, listed) = deerflow
        .send(deerflow.api(Method::GET, "/api/sandboxes"))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(
        listed["sandboxes"][0]["sandbox_id"],
        id.as_str(),
        "{listed}"
    );
    assert_eq!(url_of(&listed["sandboxes"][0]), url);

    // A file written through the AIO API lands in the thread's workdir, DeerFlow's shape.
    let (status, body) = deerflow
        .aio(
            &url,
            "/v1/file/write",
            json!({"file": "/mnt/user-data/outputs/report.md", "content": "# done\n"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let workdir = deerflow
        .server
        .workspace_of("alice")
        .join("threads/thread-1/user-data");
    for dir in ["workspace", "uploads", "outputs"] {
        assert!(workdir.join(dir).is_dir(), "{dir}/ is made for DeerFlow");
    }

    // Delete: ok, the status is gone, the URL is dead, the files stay (I15).
    let (status, deleted) = deerflow
        .send(deerflow.api(Method::DELETE, &format!("/api/sandboxes/{id}")))
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted, json!({"ok": true, "sandbox_id": id}));
    let (status, gone) = deerflow
        .send(deerflow.api(Method::GET, &format!("/api/sandboxes/{id}")))
        .await;
    assert_eq!(status, 404, "{gone}");
    assert_eq!(
        gone["detail"],
        format!("Sandbox '{id}' not found"),
        "{gone}"
    );
    let (status, dead) = deerflow.probe(&url).await;
    assert_eq!(status, 404, "the AIO URL dies with the sandbox: {dead}");
    assert_eq!(dead["success"], false, "{dead}");
    let (status, _) = deerflow
        .aio(
            &url,
            "/v1/file/read",
            json!({"file": "/mnt/user-data/outputs/report.md"}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        std::fs::read_to_string(workdir.join("outputs/report.md")).unwrap(),
        "# done\n"
    );
    let (_, listed) = deerflow
        .send(deerflow.api(Method::GET, "/api/sandboxes"))
        .await;
    assert_eq!(listed, json!({"sandboxes": [], "count": 0}));
    // Deleting again is still ok (DeerFlow deletes on every idle timeout and shutdown).
    for unknown in [id.as_str(), "0badc0de"] {
        let (status, body) = deerflow
            .send(deerflow.api(Method::DELETE, &format!("/api/sandboxes/{unknown}")))
            .await;
        assert_eq!(
            (status, body),
            (200, json!({"ok": true, "sandbox_id": unknown}))
        );
    }

    // Created again: a new generation with a new URL, on the same files.
    let reborn = deerflow.create("alice", "thread-1").await;
    let new_url = url_of(&reborn);
    assert_ne!(new_url, url, "a new generation has a new capability");
    let (status, read) = deerflow
        .aio(
            &new_url,
            "/v1/file/read",
            json!({"file": "/mnt/user-data/outputs/report.md"}),
        )
        .await;
    assert_eq!(
        (status, read["data"]["content"].as_str()),
        (200, Some("# done\n")),
        "{read}"
    );
    assert_eq!(deerflow.probe(&url).await.0, 404, "the old URL stays dead");
}

#[tokio::test]
async fn a_thread_less_sandbox_is_its_own_thread_and_the_user_defaults_to_default() {
    let deerflow = Deerflow::start("local", "");
    let (status, body) = deerflow
        .send(
            deerflow
                .api(Method::POST, "/api/sandboxes")
                .json(&json!({"sandbox_id": "a1b2c3d4", "thread_id": null})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["user_id"].as_str(), body["thread_id"].as_str()),
        (Some("default"), Some("a1b2c3d4")),
        "{body}"
    );
    assert!(deerflow
        .server
        .workspace_of("default")
        .join("threads/a1b2c3d4/user-data/workspace")
        .is_dir());
}

#[tokio::test]
async fn the_provisioner_api_needs_the_deerflow_key_and_nothing_else() {
    let deerflow = Deerflow::start("memory", "");
    let server = &deerflow.server;
    let url = |path: &str| format!("{}/deerflow{path}", server.url);
    for path in [
        "/api/sandboxes",
        "/api/capabilities",
        "/api/sandboxes/a1b2c3d4",
    ] {
        let refusals = [
            ("no key", deerflow.http.get(url(path))),
            (
                "a wrong key",
                deerflow
                    .http
                    .get(url(path))
                    .header("X-API-Key", "x".repeat(44)),
            ),
            (
                "the provisioner token",
                deerflow.http.get(url(path)).header("X-API-Key", TEST_TOKEN),
            ),
            (
                "the provisioner token as Bearer",
                deerflow.http.get(url(path)).bearer_auth(TEST_TOKEN),
            ),
            (
                "the key as Bearer",
                deerflow.http.get(url(path)).bearer_auth(KEY),
            ),
            (
                "the key with a suffix",
                deerflow
                    .http
                    .get(url(path))
                    .header("X-API-Key", format!("{KEY}x")),
            ),
        ];
        for (what, request) in refusals {
            let (status, body) = deerflow.send(request).await;
            assert_eq!(status, 401, "{path} with {what}: {body}");
            assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        }
    }
    let (status, listed) = deerflow
        .send(deerflow.api(Method::GET, "/api/sandboxes"))
        .await;
    assert_eq!(
        (status, listed),
        (200, json!({"sandboxes": [], "count": 0}))
    );
    let (status, capabilities) = deerflow
        .send(deerflow.api(Method::GET, "/api/capabilities"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        capabilities,
        json!({"lark_cli_init_image": false, "lark_cli_broker_image": false, "mount_contract_version": 2})
    );
    // The health check is public, as in DeerFlow's reference server.
    let (status, health) = deerflow.send(deerflow.http.get(url("/health"))).await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));
}

#[tokio::test]
async fn without_an_api_key_every_deerflow_route_answers_404() {
    let server = TestServer::start(bin());
    for (method, path) in [
        (Method::GET, "/deerflow/health"),
        (Method::GET, "/deerflow/api/capabilities"),
        (Method::GET, "/deerflow/api/sandboxes"),
        (Method::POST, "/deerflow/api/sandboxes"),
        (Method::GET, "/deerflow/api/sandboxes/a1b2c3d4"),
        (Method::DELETE, "/deerflow/api/sandboxes/a1b2c3d4"),
        (
            Method::GET,
            "/deerflow/sandboxes/sbx-000000000000000000000000/cap/v1/sandbox",
        ),
    ] {
        for request in [
            server
                .anonymous(method.clone(), path)
                .header("X-API-Key", KEY),
            server.request(method.clone(), path),
        ] {
            let (status, body) = server.send_json(request).await;
            assert_eq!(status, 404, "{method} {path}: {body}");
            assert_eq!(body["error"]["code"], "route_not_found", "{body}");
        }
    }
}

#[tokio::test]
async fn bad_ids_and_bodies_are_refused_with_400_never_422() {
    let deerflow = Deerflow::start("memory", "");
    let cases = [
        (json!({"thread_id": "t"}), "sandbox_id is required"),
        (json!({"sandbox_id": "../x"}), "sandbox_id"),
        (
            json!({"sandbox_id": "a1b2c3d4", "thread_id": "a/b"}),
            "thread_id",
        ),
        (
            json!({"sandbox_id": "a1b2c3d4", "thread_id": "x".repeat(65)}),
            "thread_id",
        ),
        (
            json!({"sandbox_id": "a1b2c3d4", "user_id": "bob smith"}),
            "user_id",
        ),
        (json!({"sandbox_id": "a1b2c3d4", "user_id": ""}), "user_id"),
        (json!({"sandbox_id": 7}), "invalid request"),
        (json!(["a1b2c3d4"]), "JSON object"),
        (
            json!({"sandbox_id": "a1b2c3d4", "provision_lark_cli_runtime": true}),
            "Lark",
        ),
    ];
    for (body, expected) in cases {
        let (status, answer) = deerflow
            .send(deerflow.api(Method::POST, "/api/sandboxes").json(&body))
            .await;
        assert_eq!(status, 400, "{body}: {answer}");
        let detail = answer["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(expected), "{body}: {answer}");
    }
    let (status, answer) = deerflow
        .send(
            deerflow
                .api(Method::POST, "/api/sandboxes")
                .header("content-type", "application/json")
                .body("{not json"),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
}

#[tokio::test]
async fn extra_mounts_are_refused_unless_the_operator_allowed_them_and_their_source_is_no_link() {
    let roots = tempfile::tempdir().unwrap();
    let allowed_root = roots.path().join("deer-flow");
    let deerflow = Deerflow::start(
        "memory",
        &format!(
            "extra_mount_paths = [\"/mnt/acp-workspace\", \"/mnt/skills/integrations\"]\n\
             extra_mount_roots = [\"{}\"]\n",
            allowed_root.display()
        ),
    );
    let host = |rest: &str| format!("{}/{rest}", allowed_root.display());
    let mount = |host_path: String, container: &str| json!({"host_path": host_path, "container_path": container, "read_only": false});
    let too_many: Vec<Value> = (0..11)
        .map(|n| mount(host(&format!("m{n}")), "/mnt/acp-workspace"))
        .collect();
    let cases = [
        (
            "a container path the operator did not allow",
            vec![mount(host("x"), "/mnt/user-data/workspace")],
            "extra_mount_not_allowed",
            "extra_mount_paths",
        ),
        (
            "DeerFlow's own allow-list entry the operator did not allow",
            vec![mount(host("x"), "/mnt/skills/custom")],
            "extra_mount_not_allowed",
            "extra_mount_paths",
        ),
        (
            "a host path outside the roots",
            vec![mount("/etc".into(), "/mnt/acp-workspace")],
            "extra_mount_not_allowed",
            "extra_mount_roots",
        ),
        (
            "a host path climbing out with ..",
            vec![mount(host("../../etc"), "/mnt/acp-workspace")],
            "extra_mount_not_allowed",
            "extra_mount_roots",
        ),
        (
            "a relative host path",
            vec![mount("deer-flow/x".into(), "/mnt/acp-workspace")],
            "extra_mount_not_allowed",
            "extra_mount_roots",
        ),
        (
            "the root itself",
            vec![mount(host(""), "/mnt/acp-workspace")],
            "extra_mount_not_allowed",
            "extra_mount_roots",
        ),
        ("too many", too_many, "invalid_extra_mounts", "at most 10"),
        (
            "a duplicate container path",
            vec![
                mount(host("a"), "/mnt/acp-workspace"),
                mount(host("b"), "/mnt/acp-workspace/"),
            ],
            "invalid_extra_mounts",
            "duplicate",
        ),
        (
            "a host path beneath a link under the root",
            vec![mount(host("linked/acp"), "/mnt/acp-workspace")],
            "extra_mount_unusable",
            "symlinks are not followed",
        ),
    ];
    std::fs::create_dir_all(&allowed_root).unwrap();
    symlink("/etc", allowed_root.join("linked")).unwrap();
    for (what, mounts, code, words) in cases {
        let (status, body) = deerflow
            .send(deerflow.create_request("alice", "thread-1", json!({"extra_mounts": mounts})))
            .await;
        assert_eq!(status, 400, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(words), "{what}: {detail}");
        assert!(
            !detail.contains("/etc") && !detail.contains(&allowed_root.display().to_string()),
            "{what}: no host path in the answer: {detail}"
        );
    }
    // Nothing was created by any refused request.
    let (_, listed) = deerflow
        .send(deerflow.api(Method::GET, "/api/sandboxes"))
        .await;
    assert_eq!(listed["count"], 0, "{listed}");
    // Without the operator's settings no extra mount passes.
    let plain = Deerflow::start("memory", "");
    let (status, body) = plain
        .send(plain.create_request(
            "alice",
            "thread-1",
            json!({"extra_mounts": [mount(host("x"), "/mnt/acp-workspace")]}),
        ))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("none are allowed now"),
        "{body}"
    );
}

/// Allowed extra mounts are mounted (issue 16): DeerFlow's `/mnt/acp-workspace` read-only,
/// a writable one, and `/mnt/skills/custom` taking the place of the uid's own skills; the
/// shell and the AIO file API both see them, through the same no-follow resolution as the
/// layout's mounts, and a live sandbox never changes them.
#[tokio::test]
async fn allowed_extra_mounts_are_mounted_and_served_by_the_aio_file_api_with_no_link_followed() {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().join("deer-flow");
    let acp = root.join("threads/thread-1/acp-workspace");
    std::fs::create_dir_all(&acp).unwrap();
    std::fs::create_dir_all(root.join("skills/alice/mine")).unwrap();
    std::fs::write(acp.join("result.md"), "from the ACP agent\n").unwrap();
    std::fs::write(root.join("skills/alice/mine/SKILL.md"), "custom skill\n").unwrap();
    symlink("/etc/passwd", acp.join("leak")).unwrap();
    let deerflow = Deerflow::start(
        "local",
        &format!(
            "extra_mount_paths = [\"/mnt/acp-workspace\", \"/mnt/scratch\", \"/mnt/skills/custom\"]\n\
             extra_mount_roots = [\"{}\"]\n",
            root.display()
        ),
    );
    let mounts = json!([
        {"host_path": acp.display().to_string(), "container_path": "/mnt/acp-workspace", "read_only": true},
        // Not there yet: made beneath the operator's directory, as DirectoryOrCreate would.
        {"host_path": root.join("scratch/thread-1").display().to_string(), "container_path": "/mnt/scratch", "read_only": false},
        {"host_path": root.join("skills/alice").display().to_string(), "container_path": "/mnt/skills/custom", "read_only": true},
    ]);
    let (status, created) = deerflow
        .send(deerflow.create_request("alice", "thread-1", json!({"extra_mounts": mounts})))
        .await;
    assert_eq!(status, 200, "{created}");
    let url = url_of(&created);

    let (status, shell) = deerflow
        .aio(
            &url,
            "/v1/shell/exec",
            json!({"command": "cat /mnt/acp-workspace/result.md; ls /mnt/skills/custom; \
                   echo new > /mnt/scratch/made.txt && echo wrote; \
                   touch /mnt/acp-workspace/x 2>/dev/null || echo read-only"}),
        )
        .await;
    assert_eq!(status, 200, "{shell}");
    assert_eq!(
        shell["data"]["output"].as_str().unwrap().trim_end(),
        "from the ACP agent\nmine\nwrote\nread-only",
        "{shell}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("scratch/thread-1/made.txt")).unwrap(),
        "new\n"
    );
    // The source made for it belongs to the sandbox user, the directory above to warren.
    use std::os::unix::fs::MetadataExt;
    let owner = |path: &Path| {
        let meta = std::fs::metadata(path).unwrap();
        (meta.uid(), meta.gid())
    };
    assert_eq!(owner(&root.join("scratch/thread-1")), (1000, 1000));
    assert_eq!(owner(&root.join("scratch")), (0, 0));

    // The AIO file API: reads under every extra mount, writes only where writable.
    let read = |file: &str| deerflow.aio(&url, "/v1/file/read", json!({"file": file}));
    let (status, body) = read("/mnt/acp-workspace/result.md").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["content"], "from the ACP agent\n", "{body}");
    let (status, body) = read("/mnt/skills/custom/mine/SKILL.md").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["content"], "custom skill\n", "{body}");
    let write = |file: &str| {
        deerflow.aio(
            &url,
            "/v1/file/write",
            json!({"file": file, "content": "via the API\n"}),
        )
    };
    let (status, body) = write("/mnt/scratch/api.txt").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        std::fs::read_to_string(root.join("scratch/thread-1/api.txt")).unwrap(),
        "via the API\n"
    );
    for refused in ["/mnt/acp-workspace/y.txt", "/mnt/skills/custom/y.txt"] {
        let (status, body) = write(refused).await;
        assert_ne!(status, 200, "{refused}: {body}");
        assert_eq!(body["success"], false, "{refused}: {body}");
    }
    assert!(!acp.join("y.txt").exists());
    // A link inside an extra mount, and `..` out of it, expose nothing of the host.
    for attack in [
        "/mnt/acp-workspace/leak",
        "/mnt/acp-workspace/../user-data/x",
        "/mnt/acp-workspacex/result.md",
    ] {
        let (status, body) = read(attack).await;
        assert_ne!(status, 200, "{attack}: {body}");
        let text = body.to_string();
        assert!(!text.contains("root:"), "{attack}: host bytes: {text}");
        assert!(
            !text.contains(&roots.path().display().to_string()),
            "{attack}: a host path: {text}"
        );
    }

    // Created again as DeerFlow retries: the same sandbox. With other mounts: refused, the
    // live runtime keeps its view (I16).
    let (status, again) = deerflow
        .send(deerflow.create_request("alice", "thread-1", json!({"extra_mounts": mounts})))
        .await;
    assert_eq!((status, url_of(&again)), (200, url.clone()), "{again}");
    let (status, other) = deerflow
        .send(deerflow.create_request("alice", "thread-1", json!({"extra_mounts": []})))
        .await;
    assert_eq!(status, 409, "{other}");
    assert_eq!(other["error"]["code"], "extra_mounts_conflict", "{other}");
}

#[tokio::test]
async fn a_guessed_foreign_or_old_generation_capability_is_refused_like_an_unknown_sandbox() {
    let deerflow = Deerflow::start("local", "");
    let url = url_of(&deerflow.create("alice", "thread-1").await);
    let bob_url = url_of(&deerflow.create("bob", "thread-1").await);
    let (prefix, capability) = url.rsplit_once('/').unwrap();
    let (bob_prefix, bob_capability) = bob_url.rsplit_once('/').unwrap();
    assert!(capability.len() >= 32, "{capability}");
    let mut flipped = capability.to_owned().into_bytes();
    flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let guesses = [
        format!("{prefix}/{flipped}"),
        format!("{prefix}/{}", &capability[..capability.len() - 1]),
        format!("{prefix}/{capability}x"),
        format!("{prefix}/{bob_capability}"),
        format!("{bob_prefix}/{capability}"),
        format!("{prefix}/"),
        format!(
            "{}/deerflow/sandboxes/sbx-000000000000000000000000/{capability}",
            deerflow.server.url
        ),
        format!(
            "{}/deerflow/sandboxes/not-an-id/{capability}",
            deerflow.server.url
        ),
    ];
    let (_, unknown) = deerflow.probe(&guesses[6]).await;
    for guess in &guesses {
        let (status, body) = deerflow.probe(guess).await;
        assert_eq!(status, 404, "{guess}: {body}");
        assert_eq!(body, unknown, "every refusal looks the same: {guess}");
        let (status, _) = deerflow
            .aio(guess, "/v1/file/read", json!({"file": "/mnt/user-data/x"}))
            .await;
        assert_eq!(status, 404, "{guess}");
    }
    assert_eq!(deerflow.probe(&url).await.0, 200);
    assert_eq!(deerflow.probe(&bob_url).await.0, 200);

    // A terminated sandbox's URL stays dead when the sandbox lives again (new generation).
    let id = deerflow_id("alice", "thread-1");
    deerflow
        .send(deerflow.api(Method::DELETE, &format!("/api/sandboxes/{id}")))
        .await;
    let reborn = url_of(&deerflow.create("alice", "thread-1").await);
    assert_ne!(reborn, url);
    assert_eq!(
        deerflow.probe(&url).await.0,
        404,
        "the old generation's URL"
    );
    assert_eq!(deerflow.probe(&reborn).await.0, 200);
}

#[tokio::test]
async fn an_aio_sandbox_url_capability_never_reaches_the_server_log() {
    let config = write_config(&format!("[deerflow]\napi_key = \"{KEY}\"\n"));
    let server = TestServer::start_logging(
        bin(),
        &[
            "--backend",
            "local",
            "--config",
            config.path().to_str().unwrap(),
        ],
    );
    let deerflow = Deerflow::over(server, config);
    let url = url_of(&deerflow.create("alice", "thread-1").await);
    let capability = url.rsplit('/').next().unwrap().to_owned();
    assert_eq!(deerflow.probe(&url).await.0, 200);
    deerflow
        .aio(
            &url,
            "/v1/file/read",
            json!({"file": "/mnt/user-data/missing"}),
        )
        .await;
    deerflow.probe(&format!("{url}x")).await;
    // The request lines are there, naming the sandbox, with the capability redacted.
    let lines = deerflow.server.log_lines();
    let logged: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains("/deerflow/sandboxes/sbx-"))
        .collect();
    assert!(
        logged
            .iter()
            .any(|line| line.contains("<capability>/v1/sandbox")),
        "the AIO requests are logged: {lines:#?}"
    );
    for line in &lines {
        assert!(
            !line.contains(&capability),
            "the capability was logged: {line}"
        );
        assert!(!line.contains(KEY), "the API key was logged: {line}");
    }
}

#[test]
fn a_short_key_or_the_provisioner_token_as_key_stops_the_server() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    let serve = ["serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0"];
    for (env, expected) in [
        (
            vec![("WARREN_DEERFLOW_API_KEY", "short")],
            "WARREN_DEERFLOW_API_KEY is not usable",
        ),
        (
            vec![
                ("WARREN_TOKEN", TEST_TOKEN),
                ("WARREN_DEERFLOW_API_KEY", TEST_TOKEN),
            ],
            "must not be the provisioner token",
        ),
    ] {
        let out = run_to_exit(bin(), &serve, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?}: started anyway");
        assert!(stderr.contains(expected), "{env:?}: {stderr}");
    }
    for (text, expected) in [
        (
            format!("[deerflow]\napi_key = \"{KEY}\"\nsandbox_env = 1\n"),
            "unknown field",
        ),
        (
            format!("[deerflow]\napi_key = \"{KEY}\"\nextra_mount_roots = [\"rel\"]\n"),
            "extra_mount_roots",
        ),
        (
            format!("[deerflow]\napi_key = \"{KEY}\"\nsandbox_base_url = \"warren:1\"\n"),
            "sandbox_base_url",
        ),
        (
            format!("[sandbox_env]\nLEAK = \"{KEY}\"\n[deerflow]\napi_key = \"{KEY}\"\n"),
            "must never enter one",
        ),
    ] {
        let config = write_config(&text);
        let mut args = serve.to_vec();
        args.extend(["--config", config.path().to_str().unwrap()]);
        let out = run_to_exit(bin(), &args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: started anyway");
        assert!(stderr.contains(expected), "{text}: {stderr}");
    }
}

#[tokio::test]
async fn sandbox_urls_start_with_the_configured_base_url() {
    let deerflow = Deerflow::start(
        "local",
        "sandbox_base_url = \"http://warren.internal:9000/prefix/\"\n",
    );
    let url = url_of(&deerflow.create("alice", "thread-1").await);
    assert!(
        url.starts_with("http://warren.internal:9000/prefix/deerflow/sandboxes/sbx-"),
        "{url}"
    );
}

#[tokio::test]
async fn a_colliding_deerflow_id_is_refused_not_given_another_users_sandbox() {
    let deerflow = Deerflow::start("local", "");
    deerflow.create("alice", "thread-1").await;
    // bob's thread sent with alice's id, as a collision of 8 hex digits would.
    let (status, body) = deerflow
        .send(deerflow.api(Method::POST, "/api/sandboxes").json(&json!({
            "sandbox_id": deerflow_id("alice", "thread-1"),
            "thread_id": "thread-9",
            "user_id": "bob",
        })))
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_id_conflict", "{body}");
    let (_, listed) = deerflow
        .send(deerflow.api(Method::GET, "/api/sandboxes"))
        .await;
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(listed["sandboxes"][0]["user_id"], "alice", "{listed}");
}

/// The attack world of `path_attacks.rs`, in DeerFlow's layout: symlinks of every shape in
/// alice's thread workdir and her personal skills, bob's secret in his thread, a secret
/// outside the data directory.
fn plant_attack_world(server: &TestServer, outside: &Path) {
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::create_dir(outside.join("dir")).unwrap();
    std::fs::write(outside.join("dir/secret.txt"), SECRET).unwrap();
    let bob = server.workspace_of("bob");
    std::fs::write(bob.join("threads/t/user-data/secret.txt"), SECRET).unwrap();
    let alice = server.workspace_of("alice");
    let work = alice.join("threads/t/user-data");
    std::fs::create_dir(work.join("real")).unwrap();
    std::fs::write(work.join("real/ok.txt"), "fine").unwrap();
    symlink(outside, work.join("abs_link")).unwrap();
    symlink("../../../../../../../..", work.join("rel_link")).unwrap();
    symlink(outside.join("secret.txt"), work.join("last_link")).unwrap();
    symlink("real/ok.txt", work.join("inside_link")).unwrap();
    symlink("/proc/self/root", work.join("proc_root")).unwrap();
    symlink("/proc/self/cwd", work.join("proc_cwd")).unwrap();
    symlink(&bob, work.join("bob_link")).unwrap();
    symlink(outside.join("dir"), work.join("real/mid_link")).unwrap();
    let skills = alice.join("agents/skills");
    std::fs::create_dir_all(skills.join("mine")).unwrap();
    std::fs::write(skills.join("mine/SKILL.md"), "# my skill\n").unwrap();
    symlink(outside, skills.join("evil_link")).unwrap();
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
                out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn the_official_agent_sandbox_client_uses_every_aio_endpoint_and_every_path_attack_is_refused(
) {
    let sdk = Command::new("python3")
        .args([
            "-c",
            "import agent_sandbox; from agent_sandbox import Sandbox",
        ])
        .output()
        .expect("python3 runs");
    assert!(
        sdk.status.success(),
        "the agent-sandbox SDK is missing: install it with `pip install agent-sandbox==0.0.30` \
         (scripts/test does): {}",
        String::from_utf8_lossy(&sdk.stderr)
    );
    let deerflow = Deerflow::start("local", "");
    // The sandboxes exist before the world is planted in their workdirs; the client's own
    // create then finds alice's (idempotent) and checks it answers the same.
    deerflow.create("alice", "t").await;
    deerflow.create("bob", "t").await;
    let outside = tempfile::tempdir().unwrap();
    plant_attack_world(&deerflow.server, outside.path());
    let before_outside = snapshot(outside.path());
    let bob = deerflow.server.workspace_of("bob");
    let before_bob = snapshot(&bob);

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/deerflow/aio_client.py");
    let data_dir = deerflow.server.data_dir();
    let url = deerflow.server.url.clone();
    let outside_path = outside.path().to_owned();
    let started = std::time::Instant::now();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args([
                "--url",
                &url,
                "--api-key",
                KEY,
                "--user",
                "alice",
                "--thread",
                "t",
            ])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--outside")
            .arg(&outside_path)
            .output()
            .expect("python3 runs the AIO client")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("ALL CHECKS PASSED"),
        "the AIO client failed after {:?}:\n{stdout}\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        snapshot(outside.path()),
        before_outside,
        "something outside changed"
    );
    assert_eq!(snapshot(&bob), before_bob, "bob's workspace changed");
    let work = deerflow
        .server
        .workspace_of("alice")
        .join("threads/t/user-data");
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
            "{link} is still the planted link"
        );
    }
}

#[tokio::test]
async fn deerflow_sandboxes_get_the_network_policy_the_operator_set() {
    let deerflow = Deerflow::start(
        "local",
        "network = { mode = \"allowlist\", allow = [\"pypi.org\"] }\n",
    );
    deerflow.create("alice", "thread-1").await;
    let (status, listed) = deerflow
        .send(deerflow.server.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(status, 200, "{listed}");
    let network = &listed["sandboxes"][0]["network"];
    assert_eq!(
        network,
        &json!({"mode": "allowlist", "allow": ["pypi.org"]}),
        "{listed}"
    );
    // Without the setting, DeerFlow's sandboxes stay on loopback (I23).
    let plain = Deerflow::start("local", "");
    plain.create("alice", "thread-1").await;
    let (_, listed) = plain
        .send(plain.server.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(
        listed["sandboxes"][0]["network"]["mode"], "none",
        "{listed}"
    );
}

/// The AIO file API reaches the whole runtime as DeerFlow's own sandbox does (issue 42):
/// `/tmp` outside `/mnt/user-data` is the runtime's, written and read as the sandbox user.
#[tokio::test]
async fn the_aio_file_api_reads_and_writes_the_runtime_s_tmp_as_its_user() {
    let deerflow = Deerflow::start("local", "");
    let url = url_of(&deerflow.create("alice", "thread-tmp").await);
    let (status, body) = deerflow
        .aio(
            &url,
            "/v1/file/write",
            json!({"file": "/tmp/aio/note.md", "content": "in the runtime\n"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = deerflow
        .aio(&url, "/v1/file/read", json!({"file": "/tmp/aio/note.md"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["content"], "in the runtime\n", "{body}");
    let (status, body) = deerflow
        .aio(
            &url,
            "/v1/file/write",
            json!({"file": "/etc/passwd", "content": "root::0:0::/:/bin/sh\n"}),
        )
        .await;
    assert_ne!(status, 200, "uid 1000 wrote /etc/passwd: {body}");
    assert_eq!(body["success"], false, "{body}");
}
