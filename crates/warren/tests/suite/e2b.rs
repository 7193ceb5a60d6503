//! E2B's API (issue 17) driven by the official, pinned E2B SDKs: the `e2b` Python SDK at a
//! current release (2.63.0, the `/v2` routes) and at one from before 2.51 (2.50.0), each
//! test run on both, and the `e2b` JS SDK. The scenarios are
//! `crates/warren/tests/e2b/scenarios.py` and `crates/warren/tests/e2b/js/smoke.mjs`; each
//! asserts results and prints `SCENARIO PASSED`. scripts/test installs the SDKs (the Python
//! ones in venvs it names in `WARREN_TEST_E2B_PY_CURRENT` and `WARREN_TEST_E2B_PY_OLD`).
//!
//! Tests running at the same time share one server (local backend): every scenario makes
//! sandboxes of its own and tags them with a metadata value of its own, so they never see
//! each other's. A failure shows the scenario's output and the tail of the server's log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use warren_test_support::{E2bServer, TestServer};

use super::bin;

/// Planted outside every sandbox; no answer may ever carry it.
const SECRET: &str = "TOP-SECRET-E2B-5c0ffee";

/// The pinned Python SDKs.
#[derive(Debug, Clone, Copy)]
enum Sdk {
    /// 2.63.0: `/v2/sandboxes`, `/v2/sandboxes/{id}/connect`.
    Current,
    /// 2.50.0, from before 2.51: `/sandboxes`, `/sandboxes/{id}/connect`.
    Old,
}

impl Sdk {
    fn version(self) -> &'static str {
        match self {
            Self::Current => "2.63.0",
            Self::Old => "2.50.0",
        }
    }

    fn variable(self) -> &'static str {
        match self {
            Self::Current => "WARREN_TEST_E2B_PY_CURRENT",
            Self::Old => "WARREN_TEST_E2B_PY_OLD",
        }
    }

    /// The venv interpreter with this SDK: from its variable, else where scripts/test puts
    /// it; a missing or mismatched SDK fails the test, saying how to install it.
    fn python(self) -> PathBuf {
        static CHECKED: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
        CHECKED[self as usize]
            .get_or_init(|| {
                let version = self.version();
                let python = std::env::var_os(self.variable())
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(format!("/var/cache/warren-test/e2b-py-{version}/bin/python"))
                    });
                let install = format!(
                    "the e2b Python SDK {version} is missing: run scripts/test (it installs it), or \
                     `python3 -m venv /var/cache/warren-test/e2b-py-{version} && \
                     /var/cache/warren-test/e2b-py-{version}/bin/pip install e2b=={version}` and \
                     set {} to that venv's bin/python",
                    self.variable()
                );
                let found = Command::new(&python)
                    .args([
                        "-c",
                        "from importlib.metadata import version; import e2b; print(version('e2b'))",
                    ])
                    .output();
                match found {
                    Ok(out) if out.status.success() => {
                        let got = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                        assert_eq!(got, version, "{} has e2b {got}; {install}", python.display());
                    }
                    Ok(out) => panic!(
                        "{}: {}; {install}",
                        python.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                    Err(error) => panic!("{}: {error}; {install}", python.display()),
                }
                python
            })
            .clone()
    }
}

/// The server of the tests running now: started by the first, stopped with the last.
fn shared() -> Arc<E2bServer> {
    static SHARED: Mutex<Weak<E2bServer>> = Mutex::new(Weak::new());
    let mut slot = SHARED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(server) = slot.upgrade() {
        return server;
    }
    let server = Arc::new(TestServer::start_e2b(bin(), &[], ""));
    *slot = Arc::downgrade(&server);
    server
}

/// A host directory outside every sandbox holding the secret.
struct Outside {
    dir: tempfile::TempDir,
}

impl Outside {
    fn plant() -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir");
        std::fs::write(dir.path().join("secret.txt"), SECRET).unwrap();
        std::fs::create_dir(dir.path().join("dir")).unwrap();
        std::fs::write(dir.path().join("dir/secret.txt"), SECRET).unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Every path below the directory with its bytes (a symlink as its target).
    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![self.path().to_owned()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let bytes = if meta.is_symlink() {
                    std::fs::read_link(&path)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes()
                } else if meta.is_dir() {
                    stack.push(path.clone());
                    Vec::new()
                } else {
                    std::fs::read(&path).unwrap()
                };
                out.push((path, bytes));
            }
        }
        out.sort();
        out
    }
}

/// A run id unique to this process and call, for the sandboxes' metadata.
fn run_id(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}

/// `program` with the SDK environment of `server` and what the scenarios read of the test:
/// the run id, the host paths no answer may show, the tree outside every sandbox, the
/// secret.
fn sdk_command(program: &Path, server: &E2bServer, run: &str, outside: &Outside) -> Command {
    let mut command = server.sdk_command(program);
    command
        .env("WARREN_E2B_RUN", run)
        .env("WARREN_E2B_HOST_PATHS", server.data_dir())
        .env("WARREN_E2B_OUTSIDE", outside.path())
        .env("WARREN_E2B_SECRET", SECRET);
    command
}

/// The line a scenario prints when every check held.
const PASSED: &str = "SCENARIO PASSED";

/// Runs one scenario of `scenarios.py` with `sdk` against `server`; nothing outside any
/// sandbox may change.
fn scenario_on(server: &E2bServer, sdk: Sdk, name: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2b/scenarios.py");
    let outside = Outside::plant();
    let before = outside.snapshot();
    let mut command = sdk_command(&sdk.python(), server, &run_id(name), &outside);
    command.arg(script).arg(name);
    server.run_scenario(
        command,
        &format!("the scenario {name} with e2b {}", sdk.version()),
        PASSED,
        Duration::from_secs(200),
    );
    assert_eq!(
        outside.snapshot(),
        before,
        "{name}: something outside every sandbox changed"
    );
}

fn scenario(sdk: Sdk, name: &str) {
    scenario_on(&shared(), sdk, name);
}

/// One test per scenario and pinned Python SDK.
macro_rules! python_scenarios {
    ($($test:ident => $scenario:literal,)*) => {
        /// The current Python SDK, 2.63.0 (the `/v2` routes).
        mod python_2_63 {
            $(
                #[test]
                fn $test() {
                    super::scenario(super::Sdk::Current, $scenario);
                }
            )*
        }

        /// The Python SDK 2.50.0, from before 2.51 (`/sandboxes`, `/sandboxes/{id}/connect`).
        mod python_2_50 {
            $(
                #[test]
                fn $test() {
                    super::scenario(super::Sdk::Old, $scenario);
                }
            )*
        }
    };
}

python_scenarios! {
    an_e2b_python_sdk_creates_connects_lists_by_metadata_and_kills_a_sandbox => "lifecycle",
    a_list_is_ordered_by_start_time_and_filtered_by_start_and_template => "listing",
    an_unknown_template_or_api_key_is_refused_in_e2b_error_shape => "errors",
    a_sandbox_is_killed_when_its_timeout_expires => "timeout_expiry",
    set_timeout_moves_a_sandbox_deadline_later_and_earlier => "set_timeout",
    resume_after_pause_keeps_files_and_installs_but_not_processes => "pause_resume",
    a_snapshot_starts_new_sandboxes_with_its_files_and_installs_for_its_uid_only => "snapshots",
    an_e2b_python_sdk_runs_a_foreground_command_and_reads_its_output => "foreground",
    a_background_command_is_waited_for_listed_and_killed => "background",
    a_command_reads_what_send_stdin_sends_until_stdin_is_closed => "stdin",
    commands_connect_attaches_to_a_running_command => "connect_running",
    sandbox_and_command_env_vars_reach_the_command => "envs",
    a_command_runs_in_the_cwd_it_is_given => "cwd",
    a_command_past_its_timeout_fails_with_the_sdk_timeout_error => "command_timeout",
    files_are_written_read_listed_stat_renamed_and_removed => "files",
    watch_dir_reports_files_written_into_the_directory => "watch",
    write_files_writes_several_files_in_one_request => "write_files",
    signed_urls_download_and_upload_without_any_header => "signed_urls",
    a_pty_takes_input_resizes_and_is_interrupted_by_ctrl_c => "pty",
    a_key_of_another_uid_neither_sees_nor_touches_a_sandbox => "other_users",
    envd_refuses_wrong_tokens_and_signatures_of_another_path_or_sandbox => "envd_credentials",
    no_attack_path_through_envd_reaches_outside_the_sandbox => "path_attacks",
}

/// `e2b.internet` of the egress-rule scenario (`network`): two loopback addresses of the
/// host, listed as addresses (the one way to an internal address), so its servers there
/// are the destinations; 127.0.0.3 is outside it.
const NETWORK_TOML: &str =
    "[e2b]\ninternet = { mode = \"allowlist\", allow = [\"127.0.0.1\", \"127.0.0.2\"] }\n";

/// E2B's egress rules (issue 38): `network` `allow_out`/`deny_out` (with `ALL_TRAFFIC`)
/// and `allow_internet_access`, as the SDK sends them, let a sandbox reach exactly what
/// they allow within `e2b.internet`, seen from the destinations; what warren cannot filter
/// is a 400 in E2B's shape.
fn network_rules(sdk: Sdk) {
    let server = TestServer::start_e2b(bin(), &[], NETWORK_TOML);
    scenario_on(&server, sdk, "network");
}

#[test]
fn with_python_sdk_2_63_allow_out_and_deny_out_reach_exactly_what_they_allow_within_e2b_internet() {
    network_rules(Sdk::Current);
}

#[test]
fn with_python_sdk_2_50_allow_out_and_deny_out_reach_exactly_what_they_allow_within_e2b_internet() {
    network_rules(Sdk::Old);
}

#[test]
fn the_e2b_js_sdk_creates_runs_commands_and_reads_writes_and_lists_files() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2b/js"));
    assert!(
        dir.join("node_modules/e2b/package.json").is_file(),
        "the e2b JS SDK is missing: run scripts/test (it installs it), or \
         `npm ci --prefix crates/warren/tests/e2b/js`"
    );
    let server = shared();
    let outside = Outside::plant();
    let mut command = sdk_command(Path::new("node"), &server, &run_id("js"), &outside);
    command.arg(dir.join("smoke.mjs")).current_dir(dir);
    server.run_scenario(
        command,
        "the JS SDK scenario",
        PASSED,
        Duration::from_secs(150),
    );
}

#[test]
fn on_docker_an_e2b_python_sdk_runs_commands_with_stdin_and_a_pty_and_reads_and_writes_files() {
    let server = TestServer::start_e2b_docker(bin(), "");
    for name in ["foreground", "files", "stdin", "pty"] {
        scenario_on(&server, Sdk::Current, name);
    }
}

/// Two replicas on one PostgreSQL store (issue 32): a sandbox made through the first, its
/// commands, stdin, kills and terminal driven with the SDK through the second; every run
/// is recorded by the first, which owns the runtime.
#[test]
fn an_e2b_sdk_drives_commands_and_a_pty_through_a_replica_that_does_not_own_the_runtime() {
    let postgres = super::state_postgres::shared_postgres();
    let database = postgres.fresh_database();
    let shared_dir = tempfile::tempdir().unwrap();
    let files = warren_test_support::ClusterFiles::new(super::replicas::CLUSTER_KEY, 3);
    let cluster_toml = std::fs::read_to_string(&files.config).unwrap();
    let replica = |n: usize| {
        let node = format!("node-{n}");
        TestServer::start_e2b(
            bin(),
            &[
                "--state",
                &database,
                "--workspace-dir",
                shared_dir.path().to_str().unwrap(),
                "--node-id",
                &node,
            ],
            &cluster_toml,
        )
    };
    let (first, second) = (replica(0), replica(1));
    let outside = Outside::plant();
    let mut command = sdk_command(
        &Sdk::Current.python(),
        &first,
        &run_id("replicas"),
        &outside,
    );
    command
        .env("WARREN_E2B_OTHER_URL", &second.url)
        .env("WARREN_E2B_OTHER_KEY", second.key_of("alice"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/e2b/scenarios.py"
        ))
        .arg("replicas");
    first.run_scenario(
        command,
        "the scenario replicas with e2b 2.63.0",
        PASSED,
        Duration::from_secs(200),
    );
    let name = database.rsplit('/').next().unwrap();
    let recorders = postgres.psql_in(name, "SELECT DISTINCT coalesce(node_id, '-') FROM runs");
    assert_eq!(recorders.trim(), "node-0", "every run was the owner's");
    // And the second replica did forward them (the SDK spoke to it, not to the first).
    let metrics = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let server = &second.server;
        let response = server
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await;
        response.unwrap().text().await.unwrap()
    });
    let forwarded: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("warren_forwarded_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no warren_forwarded_total in:\n{metrics}"));
    assert!(
        forwarded >= 5.0,
        "the second replica forwarded {forwarded} operations"
    );
}
