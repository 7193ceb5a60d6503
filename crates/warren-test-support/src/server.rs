//! A real `warren serve` process on a temporary data directory: starting it in its many
//! ways, talking to it over HTTP, and cleaning up after it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use reqwest::{Client, Method, RequestBuilder};

use crate::{
    kube, reap_runtimes, remove_docker_runtimes, require_docker, unmount_under,
    unmount_workspace_volumes, DOCKER_TEST_IMAGE, TEST_TOKEN,
};

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
        let root = self
            .cluster()
            .map(|cluster| cluster.workspace.path())
            .or_else(|| self.real_cluster().map(|cluster| cluster.workspace.path()))
            .map_or_else(|| self.data_dir(), Path::to_owned);
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
        let config = cluster.config("test", extra);
        Self::start_on_cluster(bin, &config, args, cluster)
    }

    /// Starts `bin serve --config <config> <args>`, holding `cluster` (what serves the
    /// config's `[kubernetes]`) until the server is gone.
    fn start_on_cluster(
        bin: &Path,
        config: &str,
        args: &[&str],
        cluster: impl std::any::Any + Send + Sync,
    ) -> Self {
        let file = tempfile::NamedTempFile::new().expect("a config file");
        std::fs::write(file.path(), config).expect("write the config");
        let path = file.path().display().to_string();
        let mut all = vec!["--config", path.as_str()];
        all.extend_from_slice(args);
        let mut server = Self::start_with(bin, &all);
        server.hold(file);
        server.hold(cluster);
        server
    }

    /// Starts `bin serve` with the Kubernetes backend on a namespace of the real cluster
    /// (`scripts/k8s-cluster up`), `extra` appended to its `[kubernetes]` section.
    pub fn start_kubernetes_real_with(bin: &Path, extra: &str, args: &[&str]) -> Self {
        let cluster = kube::real::RealCluster::start(bin);
        let config = cluster.config("test", extra);
        Self::start_on_cluster(bin, &config, args, cluster)
    }

    /// The namespace of the real cluster a server from
    /// [`TestServer::start_kubernetes_real_with`] serves.
    pub fn real_cluster(&self) -> Option<&kube::real::RealCluster> {
        self.held.iter().find_map(|held| held.downcast_ref())
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
        unmount_under(&self.data_dir());
    }
}

/// The variables `warren serve` reads its settings from.
pub(crate) const SERVE_SETTINGS: [&str; 19] = [
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
