//! Shared test support: start a real `warren serve` process in a temporary data directory
//! and talk to it over real HTTP.
//!
//! Tests pass the path of the binary under test (`env!("CARGO_BIN_EXE_warren")`), so this
//! crate depends on no warren library and cannot drift from what users run.

#![deny(missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use reqwest::{Client, Method, RequestBuilder};

mod e2b;
pub use e2b::{E2bServer, E2B_UIDS};
mod postgres;
pub use postgres::PostgresServer;
pub mod deerflow_tree;
pub mod kube;
pub mod workload;

/// A token long enough for `warren serve` (I13).
pub const TEST_TOKEN: &str = "test-token-0123456789abcdef0123456789abcdef";

/// A running `warren serve` with its own data directory, killed on drop.
pub struct TestServer {
    child: Child,
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// The token the server accepts.
    pub token: String,
    data_dir: tempfile::TempDir,
    /// The data directory's name inside `data_dir`, when not `data_dir` itself.
    data_subdir: Option<PathBuf>,
    bin: PathBuf,
    extra_args: Vec<String>,
    /// Where the server's stderr goes at level `info`, when the test reads its logs.
    log: Option<tempfile::NamedTempFile>,
    /// The network namespace the server runs in, if not the test's own.
    netns: Option<String>,
    http: Client,
    /// What must live as long as the server (a fake API server and its kubelet), dropped
    /// after it.
    held: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

/// Starts `bin serve` on `data_dir` and waits for the address it reports.
fn spawn_server(
    bin: &Path,
    data_dir: &Path,
    extra_args: &[&str],
    token: Option<&str>,
    user: Option<(u32, u32)>,
    log: Option<&Path>,
    netns: Option<&str>,
) -> (Child, String) {
    // `ip netns exec` enters the namespace and execs the server: the child is the server.
    let mut command = match netns {
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns]).arg(bin);
            command
        }
        None => Command::new(bin),
    };
    if let Some((uid, gid)) = user {
        // As root, std also drops every supplementary group when a uid is set.
        std::os::unix::process::CommandExt::uid(&mut command, uid);
        std::os::unix::process::CommandExt::gid(&mut command, gid);
    }
    command.env_remove("WARREN_TOKEN");
    // The server's settings come from the test alone, not from the machine running it.
    for key in SERVE_SETTINGS {
        command.env_remove(key);
    }
    if let Some(token) = token {
        command.env("WARREN_TOKEN", token);
    }
    let mut child = command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        // A test that names its own address (a namespace's) gives `--listen` itself.
        .args(if extra_args.contains(&"--listen") {
            &[][..]
        } else {
            &["--listen", "127.0.0.1:0"][..]
        })
        .args(extra_args)
        .env("WARREN_LOG", if log.is_some() { "info" } else { "warn" })
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(match log {
            Some(path) => std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map(Stdio::from)
                .expect("open the server log"),
            None => Stdio::inherit(),
        })
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let stdout = child.stdout.take().expect("stdout is piped");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("warren listening on ") {
                let _ = sender.send(url.to_owned());
            }
        }
    });
    match receiver.recv_timeout(Duration::from_secs(30)) {
        Ok(url) => (child, url),
        Err(_) => {
            let _ = child.kill();
            let status = child.wait().ok();
            panic!("warren serve did not report its address within 30 s (exit: {status:?})");
        }
    }
}

impl TestServer {
    /// Starts `bin serve --backend memory` on a free loopback port.
    pub fn start(bin: &Path) -> Self {
        Self::start_with(bin, &["--backend", "memory"])
    }

    /// Starts `bin serve` on its default backend: the native Linux runtime.
    pub fn start_local(bin: &Path) -> Self {
        Self::start_with(bin, &["--backend", "local"])
    }

    /// Starts `bin serve --backend docker --image` [`DOCKER_TEST_IMAGE`]. Panics, naming
    /// what is missing, when no Docker engine answers or the image is not built: the test
    /// command (`scripts/test`) starts dockerd and builds the image.
    pub fn start_docker(bin: &Path) -> Self {
        require_docker();
        Self::start_with(bin, &["--backend", "docker", "--image", DOCKER_TEST_IMAGE])
    }

    /// Starts `bin serve <extra args>` on a free loopback port with [`TEST_TOKEN`].
    pub fn start_with(bin: &Path, extra_args: &[&str]) -> Self {
        Self::start_with_token(bin, extra_args, Some(TEST_TOKEN))
    }

    /// Starts `bin serve <extra args>`; with `token: None` the server generates its own
    /// into `<data>/token`, which this reads back.
    pub fn start_with_token(bin: &Path, extra_args: &[&str], token: Option<&str>) -> Self {
        let data_dir = tempfile::tempdir().expect("create a temporary data dir");
        Self::start_in(bin, data_dir, extra_args, token)
    }

    /// Starts `bin serve <extra args>` on a data directory the test prepared (an imported
    /// image, a planted layout); it is removed when the server is dropped.
    pub fn start_in(
        bin: &Path,
        data_dir: tempfile::TempDir,
        extra_args: &[&str],
        token: Option<&str>,
    ) -> Self {
        let (child, url) = spawn_server(bin, data_dir.path(), extra_args, token, None, None, None);
        let token = match token {
            Some(token) => token.to_owned(),
            None => std::fs::read_to_string(data_dir.path().join("token"))
                .expect("the server generated a token file"),
        };
        Self {
            child,
            url,
            token,
            data_dir,
            data_subdir: None,
            bin: bin.to_owned(),
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            log: None,
            netns: None,
            http: Client::new(),
            held: Vec::new(),
        }
    }

    /// Starts `bin serve <extra args>` with its log (level `info`) going to a file the test
    /// reads with [`TestServer::log_lines`].
    pub fn start_logging(bin: &Path, extra_args: &[&str]) -> Self {
        Self::start_logging_in(bin, None, extra_args)
    }

    /// [`TestServer::start_logging`] inside the network namespace `netns` (`ip netns`);
    /// `extra_args` give `--listen` on an address of that namespace.
    pub fn start_logging_in_netns(bin: &Path, netns: &str, extra_args: &[&str]) -> Self {
        Self::start_logging_in(bin, Some(netns), extra_args)
    }

    fn start_logging_in(bin: &Path, netns: Option<&str>, extra_args: &[&str]) -> Self {
        let data_dir = tempfile::tempdir().expect("create a temporary data dir");
        let log = tempfile::NamedTempFile::new().expect("create a log file");
        let (child, url) = spawn_server(
            bin,
            data_dir.path(),
            extra_args,
            Some(TEST_TOKEN),
            None,
            Some(log.path()),
            netns,
        );
        Self {
            child,
            url,
            token: TEST_TOKEN.to_owned(),
            data_dir,
            data_subdir: None,
            bin: bin.to_owned(),
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            log: Some(log),
            netns: netns.map(str::to_owned),
            http: Client::new(),
            held: Vec::new(),
        }
    }

    /// The lines the server logged so far (only for [`TestServer::start_logging`]).
    pub fn log_lines(&self) -> Vec<String> {
        let log = self
            .log
            .as_ref()
            .expect("the server was started with start_logging");
        std::fs::read_to_string(log.path())
            .expect("read the server log")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Starts `bin serve` as an unprivileged user (`uid`:`gid`, no supplementary groups),
    /// on a data directory that user owns. The binary is copied next to it first, so the
    /// user can run it wherever the build lives. The test itself must run as root.
    pub fn start_unprivileged(bin: &Path, uid: u32, gid: u32) -> Self {
        let home = tempfile::tempdir().expect("create a temporary dir");
        let own = |path: &Path| std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
        own(home.path());
        let copy = home.path().join("warren");
        std::fs::copy(bin, &copy).expect("copy the warren binary");
        own(&copy);
        let data = home.path().join("data");
        std::fs::create_dir(&data).unwrap();
        own(&data);
        let (child, url) = spawn_server(
            &copy,
            &data,
            &[],
            Some(TEST_TOKEN),
            Some((uid, gid)),
            None,
            None,
        );
        Self {
            child,
            url,
            token: TEST_TOKEN.to_owned(),
            data_dir: home,
            data_subdir: Some("data".into()),
            bin: copy,
            extra_args: Vec::new(),
            log: None,
            netns: None,
            http: Client::new(),
            held: Vec::new(),
        }
    }

    /// Kills the server with SIGKILL (runtimes and files stay) and starts it again on the
    /// same data directory and token, on a new port.
    pub fn restart_after_kill(&mut self) {
        self.kill();
        self.start_again();
    }

    /// Waits up to `within` for the server to exit by itself (after SIGTERM, `warren
    /// drain`); its exit status, or `None` if it still runs.
    pub fn wait_for_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server again on the same data directory, token and flags, on a new port,
    /// once the previous process has exited.
    pub fn start_again(&mut self) {
        let args: Vec<&str> = self.extra_args.iter().map(String::as_str).collect();
        let log = self.log.as_ref().map(|log| log.path().to_owned());
        let (child, url) = spawn_server(
            &self.bin,
            &self.data_dir(),
            &args,
            Some(&self.token),
            None,
            log.as_deref(),
            self.netns.as_deref(),
        );
        self.child = child;
        self.url = url;
    }

    /// The server's data directory on the host.
    pub fn data_dir(&self) -> PathBuf {
        match &self.data_subdir {
            Some(sub) => self.data_dir.path().join(sub),
            None => self.data_dir.path().to_owned(),
        }
    }

    /// The host directory of a uid's UserWorkspace, for planting test fixtures. The uid must
    /// be one that is safe as a directory name.
    pub fn workspace_of(&self, safe_uid: &str) -> PathBuf {
        // On a test cluster the workspace directory is the claims', not the data dir.
        let root = match self.cluster() {
            Some(cluster) => cluster.workspace.path().to_owned(),
            None => self.data_dir(),
        };
        root.join("user-data/shared")
            .join(safe_uid)
            .join("workspace")
    }

    /// A request with the right Bearer token.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    /// A request with no credentials at all.
    pub fn anonymous(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.url))
    }

    /// Sends a request and returns its status and JSON body (`null` when the body is not
    /// JSON).
    pub async fn send_json(&self, request: RequestBuilder) -> (u16, serde_json::Value) {
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a readable body");
        let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        (status, body)
    }

    /// `POST /v1/users/{uid}/workdirs` with `path`, asserting success; returns the workdir.
    pub async fn workdir(&self, uid: &str, path: &str) -> String {
        let (status, body) = self
            .send_json(
                self.request(Method::POST, &format!("/v1/users/{uid}/workdirs"))
                    .json(&serde_json::json!({ "path": path })),
            )
            .await;
        assert!(
            status == 201 || status == 200,
            "create workdir: {status} {body}"
        );
        body["workdir"].as_str().expect("workdir").to_owned()
    }

    /// Creates a workdir and a sandbox of (uid, scope) bound to it; returns the sandbox id.
    pub async fn sandbox(&self, uid: &str, scope: &str, workdir: &str) -> String {
        self.workdir(uid, workdir).await;
        let (status, body) = self
            .send_json(
                self.request(Method::POST, "/v1/sandboxes")
                    .json(&serde_json::json!({
                        "uid": uid, "runtime_scope_id": scope, "workdir": workdir,
                    })),
            )
            .await;
        assert!(
            status == 201 || status == 200,
            "create sandbox: {status} {body}"
        );
        body["sandbox_id"].as_str().expect("sandbox_id").to_owned()
    }

    /// Runs a shell command in a sandbox and returns the JSON result, asserting HTTP 200.
    pub async fn exec(&self, sandbox: &str, command: &str) -> serde_json::Value {
        self.exec_with(sandbox, serde_json::json!({ "command": command }))
            .await
    }

    /// Runs an exec request body in a sandbox and returns the JSON result, asserting 200.
    pub async fn exec_with(&self, sandbox: &str, body: serde_json::Value) -> serde_json::Value {
        let (status, result) = self
            .send_json(
                self.request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
                    .json(&body),
            )
            .await;
        assert_eq!(status, 200, "exec {body}: {result}");
        result
    }

    /// `DELETE /v1/sandboxes/{sandbox}`, asserting the sandbox ends `terminated`; returns it.
    pub async fn terminate(&self, sandbox: &str) -> serde_json::Value {
        let (status, body) = self
            .send_json(self.request(Method::DELETE, &format!("/v1/sandboxes/{sandbox}")))
            .await;
        assert_eq!(
            (status, body["state"].as_str()),
            (200, Some("terminated")),
            "terminate {sandbox}: {body}"
        );
        body
    }

    /// A sandbox's state (`created`, `running`, `stopped`, ...), or "" when unreadable.
    pub async fn sandbox_state(&self, id: &str) -> String {
        let (_, body) = self
            .send_json(self.request(Method::GET, &format!("/v1/sandboxes/{id}")))
            .await;
        body["state"].as_str().unwrap_or_default().to_owned()
    }

    /// Waits up to `within` for the sandbox to reach the state `wanted`; whether it did.
    pub async fn reaches_state(&self, id: &str, wanted: &str, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if self.sandbox_state(id).await == wanted {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server at once (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TestServer {
    /// Starts `bin serve` with the Kubernetes backend on a fresh [`kube::TestCluster`]
    /// (a fake API server and a simulated kubelet, held as long as the server), with more
    /// `[kubernetes]` settings in `extra`.
    pub fn start_kubernetes(bin: &Path, extra: &str) -> Self {
        Self::start_kubernetes_with(bin, extra, &[])
    }

    /// [`TestServer::start_kubernetes`] with more `warren serve` arguments.
    pub fn start_kubernetes_with(bin: &Path, extra: &str, args: &[&str]) -> Self {
        let cluster = kube::TestCluster::start(bin);
        let config = tempfile::NamedTempFile::new().expect("a config file");
        std::fs::write(config.path(), cluster.config("test", extra)).expect("write the config");
        let path = config.path().display().to_string();
        let mut all = vec!["--config", path.as_str()];
        all.extend_from_slice(args);
        let mut server = Self::start_with(bin, &all);
        server.hold(config);
        server.hold(cluster);
        server
    }

    /// The simulated cluster of a server from [`TestServer::start_kubernetes`].
    pub fn cluster(&self) -> Option<&kube::TestCluster> {
        self.held.iter().find_map(|held| held.downcast_ref())
    }

    /// Keeps `value` alive until the server is gone (it is dropped after the server).
    pub fn hold(&mut self, value: impl std::any::Any + Send + Sync) {
        self.held.push(Box::new(value));
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
        // A simulated cluster's pods go before the directories they mount.
        self.held.clear();
        // Runtimes outlive the server by design; a test must not leave them behind.
        reap_runtimes(&self.data_dir());
        remove_docker_runtimes(&self.data_dir());
        unmount_workspace_volumes(&self.data_dir());
    }
}

/// Unmounts the per-uid workspace volumes of a server with storage quotas (they stay
/// mounted after the server by design); their loop devices go with the last unmount.
pub fn unmount_workspace_volumes(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(data_dir.join("user-data/shared")) else {
        return;
    };
    for entry in entries.flatten() {
        let workspace = entry.path().join("workspace");
        if std::fs::read_dir(data_dir.join("volumes")).is_ok() {
            let _ = Command::new("umount").arg("-l").arg(&workspace).output();
        }
    }
}

/// An MCP client session with the MCP endpoint of a sandbox, on the official Rust SDK's
/// client (`rmcp`, its streamable HTTP transport), for tests that call many tools (the
/// end-to-end tests use the official Python SDK too).
pub struct McpSession {
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
}

impl McpSession {
    /// Initializes a session with the MCP endpoint of `sandbox`.
    pub async fn open(server: &TestServer, sandbox: &str) -> Self {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::ServiceExt;
        let config = StreamableHttpClientTransportConfig::with_uri(format!(
            "{}/v1/sandboxes/{sandbox}/mcp",
            server.url
        ))
        .auth_header(server.token.clone());
        let client = ()
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .unwrap_or_else(|error| panic!("MCP initialize failed: {error}"));
        Self { client }
    }

    /// Calls a tool and returns its answer as JSON-RPC would carry it: `{"result": …}`, or
    /// `{"error": …}` for a protocol error.
    pub async fn call_tool(
        &mut self,
        name: &str,
        arguments: serde_json::Value,
    ) -> serde_json::Value {
        let serde_json::Value::Object(arguments) = arguments else {
            panic!("tool arguments are an object: {arguments}")
        };
        let params =
            rmcp::model::CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        match self.client.call_tool(params).await {
            Ok(result) => serde_json::json!({ "result": result }),
            Err(rmcp::ServiceError::McpError(error)) => serde_json::json!({ "error": error }),
            Err(error) => panic!("the MCP call of {name} failed: {error}"),
        }
    }
}

/// The JSON-RPC messages of an MCP streamable-HTTP answer: one JSON body, or the `data:`
/// lines of an SSE stream.
pub fn mcp_messages(text: &str) -> Vec<serde_json::Value> {
    let payloads: Vec<&str> = if text.trim_start().starts_with('{') {
        vec![text]
    } else {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .filter(|data| !data.is_empty())
            .collect()
    };
    payloads
        .into_iter()
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// A real S3-compatible server (`s3s-fs`, from crates.io; scripts/test installs it) on a
/// free loopback port, serving one empty bucket from a temporary directory. Killed on drop.
pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The bucket, already created.
    pub bucket: String,
    /// The access key the server accepts.
    pub access_key: String,
    /// The secret key the server accepts.
    pub secret_key: String,
    _root: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server; fails with what to install when `s3s-fs` is missing.
    pub fn start() -> Self {
        let binary = std::env::var_os("WARREN_S3S_FS")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("PATH").and_then(|paths| {
                    std::env::split_paths(&paths)
                        .map(|dir| dir.join("s3s-fs"))
                        .find(|candidate| candidate.is_file())
                })
            })
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|home| PathBuf::from(home).join(".cargo/bin/s3s-fs"))
                    .filter(|candidate| candidate.is_file())
            })
            .expect(
                "the S3 server s3s-fs is missing: cargo install s3s-fs --version 0.14.1 --locked \
                 --features binary (scripts/test does), or point WARREN_S3S_FS at it",
            );
        let root = tempfile::tempdir().expect("a temporary dir for the S3 server");
        let bucket = "warren-test".to_owned();
        std::fs::create_dir(root.path().join(&bucket)).expect("create the bucket");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let (access_key, secret_key) = (
            "warren-test-access".to_owned(),
            "warren-test-secret-0123456789".to_owned(),
        );
        let child = Command::new(&binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", &access_key, "--secret-key", &secret_key])
            .arg(root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "s3s-fs did not listen on port {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket,
            access_key,
            secret_key,
            _root: root,
        }
    }
}

impl S3Server {
    /// `[snapshots]` tables that put a server's snapshot store on this S3 server.
    pub fn snapshots_config(&self) -> String {
        format!(
            "[snapshots]\nstore = \"s3\"\n[snapshots.s3]\nendpoint = \"{}\"\nbucket = \"{}\"\n\
             access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            self.endpoint, self.bucket, self.access_key, self.secret_key
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real Redis server (Debian's `redis-server`; scripts/test installs it) on a free
/// loopback port, with no persistence. Killed on drop.
pub struct RedisServer {
    child: Child,
    /// `redis://127.0.0.1:<port>/0`.
    pub url: String,
}

impl RedisServer {
    /// Starts the server; fails with what to install when `redis-server` is missing.
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): apt-get install redis-server (scripts/test does)")
            });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not listen on port {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("redis://127.0.0.1:{port}/0"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The image the Docker backend's tests run (built by `scripts/docker-test-image`).
pub const DOCKER_TEST_IMAGE: &str = "warren-test:bookworm-2";

/// Panics with what to do unless a Docker engine answers and has [`DOCKER_TEST_IMAGE`].
pub fn require_docker() {
    let engine = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    match engine {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "the Docker backend tests need a running Docker engine (scripts/test starts dockerd): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(error) => panic!(
            "the Docker backend tests need the docker client and a running engine (apt-get install docker.io; scripts/test does): {error}"
        ),
    }
    let image = Command::new("docker")
        .args(["image", "inspect", DOCKER_TEST_IMAGE])
        .output()
        .expect("run docker image inspect");
    assert!(
        image.status.success(),
        "the Docker backend tests need the image {DOCKER_TEST_IMAGE}: build it with scripts/docker-test-image (scripts/test does)"
    );
}

/// The instance name a warren on `data_dir` gives its runtimes: the label value of its
/// Docker containers, the prefix of its local runtimes' cgroups.
pub fn docker_instance(data_dir: &Path) -> String {
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_owned());
    blake3::hash(canonical.as_os_str().as_encoded_bytes()).to_hex()[..8].to_owned()
}

/// Runs the docker client and returns its trimmed stdout (empty on failure).
pub fn docker(args: &[&str]) -> String {
    Command::new("docker")
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Ids of the containers the Docker backend of `data_dir` made (running or not).
pub fn docker_containers(data_dir: &Path) -> Vec<String> {
    let filter = format!("label=dev.warren.instance={}", docker_instance(data_dir));
    docker(&["ps", "-aq", "--no-trunc", "--filter", &filter])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Names of the networks the Docker backend of `data_dir` made.
pub fn docker_networks(data_dir: &Path) -> Vec<String> {
    let filter = format!("label=dev.warren.instance={}", docker_instance(data_dir));
    docker(&["network", "ls", "-q", "--filter", &filter])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Removes every container and network the Docker backend of `data_dir` made.
pub fn remove_docker_runtimes(data_dir: &Path) {
    if !data_dir.join("docker").exists() {
        return;
    }
    for container in docker_containers(data_dir) {
        docker(&["rm", "-f", &container]);
    }
    for network in docker_networks(data_dir) {
        docker(&["network", "rm", &network]);
    }
    // Each sandbox's socket directory is a small tmpfs on the host.
    if let Ok(entries) = std::fs::read_dir(data_dir.join("docker/sockets")) {
        for entry in entries.flatten() {
            let _ = Command::new("umount").arg("-l").arg(entry.path()).output();
        }
    }
    // Staged binds (`<data>/docker/binds/<sandbox>/<n>`) live only while a container
    // starts; one a killed server left must not be walked when the data dir is removed.
    for sandbox in std::fs::read_dir(data_dir.join("docker/binds"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for staged in std::fs::read_dir(sandbox.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = Command::new("umount").arg("-l").arg(staged.path()).output();
        }
    }
}

/// Kills every runtime recorded under `data_dir` and removes its cgroups.
pub fn reap_runtimes(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(data_dir.join("runtimes")) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(identity) = std::fs::read(entry.path().join("runtime.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        else {
            continue;
        };
        if let Some(pid) = identity["pid"].as_i64() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        if let Some(cgroup) = identity["cgroup"].as_str() {
            for hierarchy in cgroup_hierarchies() {
                remove_cgroup_tree(&hierarchy.join("warren").join(cgroup));
            }
        }
    }
}

fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        out.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    out
}

fn remove_cgroup_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for attempt in 0..200 {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.path().is_dir() {
                    remove_cgroup_tree(&entry.path());
                }
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        let _ = attempt;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The variables `warren serve` reads its settings from.
const SERVE_SETTINGS: [&str; 19] = [
    "WARREN_CONFIG",
    "WARREN_DATA_DIR",
    "WARREN_LISTEN",
    "WARREN_BACKEND",
    "WARREN_ISOLATION",
    "WARREN_ROOTFS",
    "WARREN_IMAGE",
    "WARREN_DOCKER",
    "WARREN_DOCKER_IMAGE",
    "WARREN_DOCKER_SOCKET",
    "WARREN_IDLE_TIMEOUT",
    "WARREN_MAX_LIFETIME",
    "WARREN_REAP_INTERVAL",
    "WARREN_LOG_FORMAT",
    "WARREN_S3_ACCESS_KEY_ID",
    "WARREN_S3_SECRET_ACCESS_KEY",
    "WARREN_REDIS_URL",
    "WARREN_URL",
    "WARREN_DEERFLOW_API_KEY",
];

/// The files replicas of one cluster share: a cluster key and a `warren.toml` naming it
/// with a node lease of `ttl_s` (flags cannot set the TTL).
pub struct ClusterFiles {
    _dir: tempfile::TempDir,
    /// The `warren.toml` to give each replica with `--config`.
    pub config: PathBuf,
}

impl ClusterFiles {
    /// Writes `key` and the configuration into a temporary directory.
    pub fn new(key: &str, ttl_s: u64) -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir for the cluster's files");
        let key_file = dir.path().join("cluster.key");
        std::fs::write(&key_file, key).expect("write the cluster key");
        let config = dir.path().join("warren.toml");
        std::fs::write(
            &config,
            format!("[cluster]\nnode_ttl_s = {ttl_s}\nkey_file = {key_file:?}\n"),
        )
        .expect("write the cluster's warren.toml");
        Self { _dir: dir, config }
    }

    /// Adds `toml` (whole tables) to the configuration.
    pub fn add_config(&self, toml: &str) {
        let mut config = std::fs::read_to_string(&self.config).expect("read warren.toml");
        config.push_str(toml);
        std::fs::write(&self.config, config).expect("write warren.toml");
    }

    /// The configuration's path, as a flag value.
    pub fn config_arg(&self) -> &str {
        self.config.to_str().expect("a UTF-8 temporary path")
    }
}

/// Runs `bin` with `args` and `env` (nothing else of the test's environment that matters to
/// warren), waiting at most 30 s, and returns its output.
pub fn run_to_exit(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin);
    command
        .args(args)
        .env_remove("WARREN_TOKEN")
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null());
    for key in SERVE_SETTINGS {
        command.env_remove(key);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(Duration::from_secs(30)) {
        Ok(output) => output.expect("the process ran"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{} {args:?} did not exit within 30 s", bin.display());
        }
    }
}

/// A tiny root filesystem as a tar archive: the host's `sh` (dash), `true` and `sleep` with
/// the libraries they link, plus any extra `(path, content)` files. For image tests and the
/// docker anchor of the benchmark, where no registry is reachable.
pub fn minimal_rootfs_tar(extra: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (inside, host) in [
        ("bin/sh", "/bin/dash"),
        ("bin/true", "/bin/true"),
        ("bin/sleep", "/bin/sleep"),
        (
            "lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libc.so.6",
        ),
        ("lib64/ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2"),
    ] {
        let bytes = std::fs::read(host).unwrap_or_else(|e| panic!("{host}: {e}"));
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_size(bytes.len() as u64);
        builder
            .append_data(&mut header, inside, &bytes[..])
            .unwrap();
    }
    for (path, content) in extra {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(content.len() as u64);
        builder.append_data(&mut header, path, *content).unwrap();
    }
    builder.into_inner().unwrap()
}

/// Latency samples of the benchmarks, and their report lines.
pub mod latency {
    use std::time::{Duration, Instant};

    use reqwest::Method;
    use serde_json::json;

    use crate::TestServer;

    /// How long one `docker` command takes, its output dropped; panics when it fails.
    pub fn timed_docker(args: &[&str]) -> Duration {
        let started = Instant::now();
        let status = std::process::Command::new("docker")
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("docker runs");
        assert!(status.success(), "docker {args:?} failed");
        started.elapsed()
    }

    /// The `--iterations N` a benchmark was run with, or `default`.
    pub fn iterations(default: usize) -> usize {
        std::env::args()
            .skip_while(|a| a != "--iterations")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// Starts the container `name` of the test image as 1000:1000 with no network,
    /// sleeping until removed, the anchor a benchmark measures `docker` against; how long
    /// `docker run -d` took.
    pub fn sleeping_container(name: &str) -> Duration {
        timed_docker(&[
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "none",
            "--user",
            "1000:1000",
            crate::DOCKER_TEST_IMAGE,
            "sleep",
            "infinity",
        ])
    }

    /// Untimed rounds before each measurement: page cache, the server's first requests.
    const WARM_UP: usize = 5;

    /// A keystroke's round trips through a process's terminal: `cat` on a pty started
    /// through `start` (uid `bench`, workdir `projects/k`), attached over the
    /// `/v1` WebSocket through `attach` (the same server, or another replica), one byte in
    /// and its echo (by the line discipline) out, `keystrokes` times after 20 untimed.
    pub async fn terminal_keystrokes(
        start: &TestServer,
        attach: &TestServer,
        keystrokes: usize,
    ) -> Vec<Duration> {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;

        let id = start.sandbox("bench", "keys", "projects/k").await;
        let (status, process) = start
            .send_json(
                start
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/processes"))
                    .json(&json!({"command": "exec cat >/dev/null", "pty": {"cols": 80, "rows": 24}, "stdin": true})),
            )
            .await;
        assert_eq!(status, 201, "{process}");
        let pid = process["pid"].as_i64().unwrap();
        let url = format!(
            "{}/v1/sandboxes/{id}/processes/{pid}/attach",
            attach.url.replacen("http://", "ws://", 1)
        );
        let mut request = url.into_client_request().unwrap();
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {}", attach.token).parse().unwrap(),
        );
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .expect("the attach WebSocket");
        let (mut to_server, mut from_server) = socket.split();
        let mut samples = Vec::with_capacity(keystrokes);
        for i in 0..keystrokes + 20 {
            let started = Instant::now();
            to_server
                .send(Message::Binary(b"a".to_vec().into()))
                .await
                .unwrap();
            loop {
                match from_server.next().await.expect("the echo").unwrap() {
                    Message::Binary(bytes) if bytes.contains(&b'a') => break,
                    _ => {}
                }
            }
            if i >= 20 {
                samples.push(started.elapsed());
            }
            if i % 64 == 63 {
                // Lines stay short; `cat` reads each.
                to_server
                    .send(Message::Binary(b"\n".to_vec().into()))
                    .await
                    .unwrap();
                loop {
                    match from_server.next().await.expect("the echo").unwrap() {
                        Message::Binary(bytes) if bytes.contains(&b'\n') => break,
                        _ => {}
                    }
                }
            }
        }
        samples
    }

    /// Through `server`'s API (uid `bench`, whose workdir `projects/p` must exist):
    /// `cold` times creating a sandbox and running its first command (the runtime starts
    /// lazily), and `warm` times one command in a running runtime.
    ///
    /// The cold sandboxes are removed after the timing, not in between: a destroyed
    /// runtime's teardown (network namespace, container) finishes asynchronously, and on
    /// two cores that work would land inside the next creation's time.
    pub async fn create_and_exec(
        server: &TestServer,
        cold: usize,
        warm: usize,
    ) -> (Vec<Duration>, Vec<Duration>) {
        let mut create = Vec::new();
        let mut ids = Vec::new();
        for i in 0..cold + WARM_UP {
            let started = Instant::now();
            let (status, body) = server
                .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                    "uid": "bench", "runtime_scope_id": format!("cold-{i}"), "workdir": "projects/p"
                })))
                .await;
            assert_eq!(status, 201, "{body}");
            let id = body["sandbox_id"].as_str().unwrap().to_owned();
            let result = server.exec(&id, "true").await;
            assert_eq!(result["exit_code"], 0, "{result}");
            if i >= WARM_UP {
                create.push(started.elapsed());
            }
            ids.push(id);
        }
        for id in ids {
            server
                .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
                .await;
        }
        let id = server.sandbox("bench", "warm", "projects/p").await;
        let mut times = Vec::new();
        for i in 0..warm + WARM_UP {
            let started = Instant::now();
            let result = server.exec_with(&id, json!({"argv": ["true"]})).await;
            assert_eq!(result["exit_code"], 0, "{result}");
            if i >= WARM_UP {
                times.push(started.elapsed());
            }
        }
        (create, times)
    }

    /// The `p` quantile (0..=1) of `samples` (sorted in place).
    pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
        samples.sort();
        let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[index]
    }

    /// Milliseconds with two decimals.
    pub fn ms(d: Duration) -> String {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    }

    /// One report line: our p50/p99 beside an anchor's, and the p50 ratio.
    pub fn row(name: &str, ours: &mut [Duration], anchor: &mut [Duration], anchor_name: &str) {
        if ours.is_empty() {
            return;
        }
        let (p50, p99) = (percentile(ours, 0.5), percentile(ours, 0.99));
        if anchor.is_empty() {
            println!(
                "{name:<40} p50 {:>10}  p99 {:>10}   ({anchor_name}: not available)",
                ms(p50),
                ms(p99)
            );
        } else {
            let (a50, a99) = (percentile(anchor, 0.5), percentile(anchor, 0.99));
            println!(
                "{name:<40} p50 {:>10}  p99 {:>10}   {anchor_name:<22} p50 {:>10}  p99 {:>10}   ratio p50 {:.2}x",
                ms(p50),
                ms(p99),
                ms(a50),
                ms(a99),
                p50.as_secs_f64() / a50.as_secs_f64()
            );
        }
    }
}
