//! warren's Python SDK (issue 35): deepagents' backend on warren (`WarrenSandbox` over
//! `warren_sdk.Warren`) beside the same calls as raw HTTP, measured in one run against one
//! server (release build, local backend, loopback), so the SDK's own overhead is the
//! ratio: `execute("true")` round trip, and a 1 MiB `upload_files` + `download_files`.
//! The timing is `sdk/python/bench/overhead.py`'s (`time.perf_counter()`, the two ways
//! interleaved). Not a test: it prints.
//!
//! Run as root with the SDK's test venv (`WARREN_TEST_SDK_PY`; scripts/test makes it):
//! `cargo bench -p warren --bench sdk` (`-- N` iterations, default 200).

use std::path::Path;
use std::process::Command;

use warren_test_support::TestServer;

fn main() {
    let iterations = std::env::args()
        .skip(1)
        .find(|arg| arg.parse::<u32>().is_ok())
        .unwrap_or_else(|| "200".to_owned());
    let python = std::env::var("WARREN_TEST_SDK_PY").unwrap_or_else(|_| {
        panic!("WARREN_TEST_SDK_PY is not set: it names the python of the SDK's test venv (scripts/test makes it)")
    });
    let server = TestServer::start_local(Path::new(env!("CARGO_BIN_EXE_warren")));
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python");
    let status = Command::new(python)
        .arg(sdk.join("bench/overhead.py"))
        .arg(&iterations)
        .env("WARREN_URL", &server.url)
        .env("WARREN_TOKEN", &server.token)
        .env("PYTHONPATH", sdk.join("src"))
        .status()
        .expect("run sdk/python/bench/overhead.py");
    assert!(status.success(), "the benchmark failed: {status}");
}
