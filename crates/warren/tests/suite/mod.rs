//! One module per area of the API contract.

/// One `#[tokio::test]` per rule in `module`, on `host` (a `conformance::Host`): the rules
/// are `async fn rule(host: Host)` beside the invocation.
macro_rules! rules_on {
    ($module:ident, $host:ident, [$($rule:ident),*]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::$rule(super::Host::$host).await
                }
            )*
        }
    };
}

/// Every rule on every backend and tier that runs commands here: local, Docker and
/// Kubernetes, and both gVisor tiers.
macro_rules! on_every_host {
    ($($rule:ident),* $(,)?) => {
        rules_on!(local, Local, [$($rule),*]);
        rules_on!(docker, Docker, [$($rule),*]);
        rules_on!(kubernetes, Kubernetes, [$($rule),*]);
        rules_on!(local_gvisor, LocalGvisor, [$($rule),*]);
        rules_on!(docker_gvisor, DockerGvisor, [$($rule),*]);
    };
}

mod agent_tcp;
mod aio_shell;
mod artifacts;
mod auth;
mod branches;
mod checkpoints;
mod cli;
mod cluster;
mod code;
mod config;
// Its `conformance_suite!` also runs the layout rules on every backend (`layouts`).
#[macro_use]
mod conformance;
mod data_dir;
mod deerflow;
mod docker;
mod e2b;
mod e2b_agentscope;
mod e2b_code;
mod e2b_fork;
mod e2b_langchain;
mod e2b_metrics;
mod e2b_operator;
mod e2b_runtime_files;
mod egress;
mod env;
mod errors;
mod etag;
mod files;
mod fork;
mod guard;
mod gvisor_compat;
mod image;
mod init;
mod kill;
mod kubernetes;
mod kubernetes_rbac;
mod kubernetes_real;
mod layouts;
mod lifecycle;
mod mcp;
mod metrics;
mod migrate;
mod network;
mod openapi;
mod path_attacks;
mod pause;
mod processes;
mod quotas;
mod reaper;
mod replica_processes;
mod replicas;
mod runs;
mod runtime;
mod runtime_files;
mod sandboxes;
mod sdk_python;
mod skills;
mod snapshots;
mod state_postgres;
mod unprivileged;
mod viewer;
mod viewer_browser;
mod workdirs;

use std::path::Path;

use warren_test_support::TestServer;

pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_warren"))
}

pub(crate) fn server() -> TestServer {
    TestServer::start(bin())
}

/// A command's stdout followed by its stderr, from an exec result.
pub(crate) fn output(result: &serde_json::Value) -> String {
    format!(
        "{}{}",
        result["stdout"].as_str().unwrap_or(""),
        result["stderr"].as_str().unwrap_or("")
    )
}

/// Whether this test process runs as root, where files must end up owned by 1000:1000 (I11).
pub(crate) fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// A `warren.toml` with `text`, removed when dropped.
pub(crate) fn write_config(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}
mod e2b_tls;

/// Reads NDJSON watch events until one satisfies `done`; every event read.
pub(crate) async fn watch_until(
    response: &mut reqwest::Response,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    let mut text = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        while let Some(end) = text.find('\n') {
            let line: String = text.drain(..=end).collect();
            let event: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
            let finished = done(&event);
            seen.push(event);
            if finished {
                return seen;
            }
        }
        assert!(std::time::Instant::now() < deadline, "{seen:?}");
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(20), response.chunk())
            .await
            .expect("an event within the wait")
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended: {seen:?}"));
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// Writes `{dir}/new-{n}.md` through the file API every 200 ms until stopped: for a wait
/// whose opening is not visible from outside, whichever write lands after it opened is
/// one it reports.
pub(crate) struct WriteEvery {
    stop: tokio::sync::oneshot::Sender<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl WriteEvery {
    pub(crate) fn start(server: &TestServer, id: &str, dir: &str) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (url, token) = (server.url.clone(), server.token.clone());
        let (id, dir) = (id.to_owned(), dir.to_owned());
        let writer = tokio::spawn(async move {
            let http = reqwest::Client::new();
            for n in 0.. {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                }
                let response = http
                    .put(format!("{url}/v1/sandboxes/{id}/files"))
                    .query(&[("path", format!("{dir}/new-{n}.md"))])
                    .bearer_auth(&token)
                    .body("note")
                    .send()
                    .await
                    .unwrap();
                assert!(response.status().is_success(), "{}", response.status());
            }
        });
        Self { stop, writer }
    }

    /// Stops writing; a failed write fails the test here.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        self.writer.await.unwrap();
    }
}

/// The value of `variable`, which scripts/test sets to what it prepared (a venv, a home).
pub(crate) fn prepared(variable: &str) -> String {
    std::env::var(variable)
        .unwrap_or_else(|_| panic!("{variable} is not set: scripts/test prepares it"))
}
