//! langchain-tests' standard `SandboxIntegrationTests` (1.1.9), unchanged, through E2B's own
//! deepagents backend (`langchain-e2b` 0.0.6 over the official `e2b` SDK) against warren's
//! E2B API (issue 42). The suite works under `/tmp/test_sandbox_ops/`, the runtime's own
//! tree: uploads and downloads go through envd's `/files`, served by the runtime's agent;
//! `ls`, `read`, `edit`, `grep` and `glob` run deepagents' `python3` templates as commands.
//!
//! scripts/test prepares the venv (`crates/warren/tests/langchain/requirements.txt`, every
//! package pinned) and names its python in `WARREN_TEST_LANGCHAIN_PY`.

use std::path::Path;
use std::time::Duration;

use warren_test_support::TestServer;

use super::{bin, prepared};

/// How many tests the standard suite collects at 1.1.9: all of them must pass.
const STANDARD_TESTS: usize = 86;

#[test]
fn langchain_s_standard_sandbox_suite_passes_through_e2b_s_deepagents_backend() {
    let python = prepared("WARREN_TEST_LANGCHAIN_PY");
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/langchain");
    let server = TestServer::start_e2b(bin(), &[], "");
    let mut command = server.sdk_command(Path::new(&python));
    command.current_dir(&tests).args([
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        // The standard suite's async tests are plain `async def`s.
        "-o",
        "asyncio_mode=auto",
        "-rfEsxX",
        "test_sandbox_standard.py",
    ]);
    let stdout = server.run_scenario(
        command,
        "langchain-tests' SandboxIntegrationTests",
        " passed",
        Duration::from_secs(600),
    );
    // Every test ran and passed: none skipped, expected to fail or deselected.
    let summary = stdout
        .lines()
        .rev()
        .find(|line| line.contains(" passed"))
        .unwrap_or_default();
    assert!(
        summary.starts_with(&format!("{STANDARD_TESTS} passed"))
            && !["skipped", "xfail", "xpass", "deselected", "failed", "error"]
                .iter()
                .any(|word| summary.contains(word)),
        "{summary}\n{stdout}"
    );
}
