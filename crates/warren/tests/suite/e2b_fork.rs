//! E2B's `Sandbox.fork()` through the official Python SDK (2.63.0) on the local backend in
//! the E2B layout: a sandbox that installed something outside its home and wrote a file in
//! it forks into three; each fork sees both, what one fork writes the others and the source
//! never see, the source runs on, and a count beyond 20 or another uid's key is refused.
//! The scenario is `crates/warren/tests/e2b/fork_scenario.py`; it asserts results and
//! prints `SCENARIO PASSED`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use warren_test_support::TestServer;

use super::bin;

/// The venv interpreter with the current E2B SDK: `WARREN_TEST_E2B_PY_CURRENT`, else where
/// scripts/test puts it.
fn python() -> PathBuf {
    let python = std::env::var_os("WARREN_TEST_E2B_PY_CURRENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/warren-test/e2b-py-2.63.0/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: run scripts/test (it installs the e2b Python SDK 2.63.0) or set \
         WARREN_TEST_E2B_PY_CURRENT to the bin/python of a venv with it",
        python.display()
    );
    python
}

#[test]
fn the_e2b_sdk_forks_a_sandbox_that_installed_a_package() {
    let server = TestServer::start_e2b(bin(), &[], "");
    let mut command = server.sdk_command(&python());
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/fork_scenario.py"))
        .env("WARREN_E2B_RUN", format!("fork-{}", std::process::id()));
    server.run_scenario(
        command,
        "the fork scenario with e2b 2.63.0",
        "SCENARIO PASSED",
        Duration::from_secs(240),
    );
}
