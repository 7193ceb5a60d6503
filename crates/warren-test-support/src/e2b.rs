//! A `warren serve` with its E2B listener (`--e2b-listen`, issue 17) and API keys for two
//! uids, for tests that drive the official E2B SDKs against it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::TestServer;

/// The uids [`E2bServer`] makes an API key for: the first is the default one.
pub const E2B_UIDS: [&str; 2] = ["alice", "bob"];

/// A running server with its E2B listener and a key per uid of [`E2B_UIDS`].
pub struct E2bServer {
    /// The server (its native API, data dir and log).
    pub server: TestServer,
    /// The E2B listener, `http://127.0.0.1:<port>`: `E2B_API_URL` and `E2B_SANDBOX_URL`.
    pub url: String,
    /// The API key of uid `alice`.
    pub key: String,
    keys: Vec<(String, String)>,
    _config: tempfile::NamedTempFile,
}

impl TestServer {
    /// Starts `bin serve <args> --e2b-listen 127.0.0.1:<free port>` with a `warren.toml`
    /// holding a fresh API key per uid of [`E2B_UIDS`] (`[e2b.keys]`) and `extra_toml`
    /// (whole tables, e.g. `[e2b]\ndomain = "e2b.test"`), its log going to a file
    /// ([`TestServer::log_lines`]). `args` choose the backend (`--backend local`, the default
    /// when they name none).
    pub fn start_e2b(bin: &Path, args: &[&str], extra_toml: &str) -> E2bServer {
        let keys: Vec<(String, String)> = E2B_UIDS
            .iter()
            .map(|uid| (generate_key(), (*uid).to_owned()))
            .collect();
        let mut toml = String::from("[e2b.keys]\n");
        for (key, uid) in &keys {
            toml.push_str(&format!("{key:?} = {uid:?}\n"));
        }
        toml.push_str(extra_toml);
        let config = tempfile::NamedTempFile::new().expect("a config file");
        std::fs::write(config.path(), toml).expect("write warren.toml");
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let config_arg = config
            .path()
            .to_str()
            .expect("a UTF-8 temporary path")
            .to_owned();
        let mut all: Vec<&str> = Vec::new();
        if !args.contains(&"--backend") {
            all.extend(["--backend", "local"]);
        }
        all.extend_from_slice(args);
        all.extend(["--config", &config_arg, "--e2b-listen", &listen]);
        let server = TestServer::start_logging(bin, &all);
        wait_for_listener(port, &server);
        E2bServer {
            server,
            url: format!("http://{listen}"),
            key: keys[0].0.clone(),
            keys,
            _config: config,
        }
    }

    /// [`TestServer::start_e2b`] on the Docker backend and [`crate::DOCKER_TEST_IMAGE`];
    /// panics, naming what is missing, without a Docker engine or the image.
    pub fn start_e2b_docker(bin: &Path, extra_toml: &str) -> E2bServer {
        crate::require_docker();
        Self::start_e2b(
            bin,
            &["--backend", "docker", "--image", crate::DOCKER_TEST_IMAGE],
            extra_toml,
        )
    }
}

impl E2bServer {
    /// The API key of `uid` (one of [`E2B_UIDS`]).
    pub fn key_of(&self, uid: &str) -> &str {
        self.keys
            .iter()
            .find(|(_, owner)| owner == uid)
            .map(|(key, _)| key.as_str())
            .unwrap_or_else(|| panic!("no E2B key for {uid}: the keys are for {E2B_UIDS:?}"))
    }

    /// The environment an E2B SDK needs to reach this server as `alice`: `E2B_API_KEY`,
    /// `E2B_API_URL` and `E2B_SANDBOX_URL`.
    pub fn sdk_env(&self) -> Vec<(String, String)> {
        vec![
            ("E2B_API_KEY".into(), self.key.clone()),
            ("E2B_API_URL".into(), self.url.clone()),
            ("E2B_SANDBOX_URL".into(), self.url.clone()),
        ]
    }

    /// The server's data directory on the host.
    pub fn data_dir(&self) -> PathBuf {
        self.server.data_dir()
    }

    /// `program` with the environment an E2B SDK needs to reach this server as `alice`
    /// ([`E2bServer::sdk_env`]; `WARREN_E2B_BOB_KEY` is bob's key) and nothing of the
    /// test's own `E2B_*` (debug mode would skip the call), Python unbuffered.
    pub fn sdk_command(&self, program: &Path) -> std::process::Command {
        let mut command = std::process::Command::new(program);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("E2B_") {
                command.env_remove(key);
            }
        }
        command
            .envs(self.sdk_env())
            .env("WARREN_E2B_BOB_KEY", self.key_of("bob"))
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        command
    }

    /// Runs `command` (an SDK scenario) for at most `within` and asserts that it succeeded
    /// and printed `marker`; fails with its output and the server's log otherwise. Its
    /// stdout comes back.
    pub fn run_scenario(
        &self,
        mut command: std::process::Command,
        what: &str,
        marker: &str,
        within: Duration,
    ) -> String {
        command.stdin(std::process::Stdio::null());
        let Some(output) = crate::output_within(&mut command, within) else {
            panic!(
                "{what} did not end within {within:?}; the server's log:\n{}",
                self.log_tail(60)
            );
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains(marker),
            "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- the server's log (last 60 lines)\n{}",
            output.status,
            self.log_tail(60)
        );
        stdout
    }

    /// Runs `script` with the interpreter of the venv holding the current official E2B
    /// Python SDK (`WARREN_TEST_E2B_PY_CURRENT`, which scripts/test sets), as
    /// [`E2bServer::run_scenario`] does.
    pub fn run_python_sdk(
        &self,
        what: &str,
        script: &str,
        marker: &str,
        within: Duration,
    ) -> String {
        let python = std::env::var_os("WARREN_TEST_E2B_PY_CURRENT").unwrap_or_else(|| {
            panic!(
                "WARREN_TEST_E2B_PY_CURRENT is not set: it names the bin/python of a venv with \
                 the e2b Python SDK 2.63.0 (scripts/test installs one at \
                 /var/cache/warren-test/e2b-py-2.63.0)"
            )
        });
        let mut command = self.sdk_command(Path::new(&python));
        command.args(["-c", script]);
        self.run_scenario(command, what, marker, within)
    }

    /// The last `n` lines of the server's log (without terminal colours), for a failure
    /// message.
    pub fn log_tail(&self, n: usize) -> String {
        let lines = self.server.log_lines();
        strip_colours(&lines[lines.len().saturating_sub(n)..].join("\n"))
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `e2b_` and 40 hex digits, as E2B's own keys and `warren e2b key create` make them.
fn generate_key() -> String {
    let hex = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    format!("e2b_{}", &hex[..40])
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until the E2B listener accepts connections (the server reports only its native
/// listener's address).
fn wait_for_listener(port: u16, server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let log = server.log_lines();
            panic!(
                "warren serve did not listen on its --e2b-listen port {port} within 30 s; its log:\n{}",
                log[log.len().saturating_sub(40)..].join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
