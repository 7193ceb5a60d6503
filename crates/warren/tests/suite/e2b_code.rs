//! E2B's code interpreter (issue 36) through the official `e2b-code-interpreter` Python SDK
//! (2.11.5) and smolagents' E2B executor (1.26.0), unchanged, against warren's E2B API: a
//! sandbox of the SDK's default template (`code-interpreter-v1`) runs code on its port 49999
//! (`/execute`, `/contexts`). The scripts are in `crates/warren/tests/code_interpreter/`;
//! each asserts what came back and prints `SCENARIO PASSED`.
//!
//! scripts/test prepares the venv (`crates/warren/tests/code_interpreter/requirements.txt`,
//! every package pinned) and names its python in `WARREN_TEST_CODE_PY`.

use std::path::Path;
use std::time::Duration;

use warren_test_support::TestServer;

use super::{bin, prepared};

/// The line each script prints when every check held.
const PASSED: &str = "SCENARIO PASSED";

/// Runs `script` of `tests/code_interpreter` with the venv's python against a fresh server.
fn run(script: &str, what: &str) {
    let python = prepared("WARREN_TEST_CODE_PY");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/code_interpreter");
    let server = TestServer::start_e2b(bin(), &[], "");
    let mut command = server.sdk_command(Path::new(&python));
    command.current_dir(&dir).arg(dir.join(script));
    server.run_scenario(command, what, PASSED, Duration::from_secs(240));
}

#[test]
fn the_official_e2b_code_interpreter_sdk_runs_code_against_warren() {
    run("scenarios.py", "the e2b-code-interpreter SDK's scenarios");
}

#[test]
fn a_smolagents_code_agent_with_the_e2b_executor_reaches_its_final_answer() {
    run(
        "smolagents_agent.py",
        "a smolagents CodeAgent with the e2b executor",
    );
}
