//! The code interpreter (issue 36): `run_code("1+1")` through `/v1`, measured in one run
//! against one server (release build, local backend, loopback) beside the floor, a
//! `jupyter_client` round trip to an ipykernel on the host, and E2B's published figures
//! (labelled as such, not measured here). Cold: the first execution after the sandbox's
//! create answer (the runtime, the context's driver and its kernel all start in it), beside
//! a host kernel's start, ready and first execute; with the create alone besides. Warm: the
//! same execution in one sandbox, p50, p99 and mean, beside the same execute on a host
//! kernel's client. The timing and the table are `code_driver.py`'s (`time.perf_counter()`,
//! the two sides interleaved). Not a test: it prints.
//!
//! Run as root (the local backend's namespaces and cgroups) with Debian's
//! `python3-ipykernel` and `python3-jupyter-client` in `/usr/bin/python3` (the local
//! backend's default root is the host, so the sandbox's kernel is the same one):
//! `cargo bench -p warren --bench code` (`-- N` warm iterations, default 200;
//! `-- N COLD` also the cold ones, default 5).

use std::path::Path;
use std::process::Command;

use warren_test_support::TestServer;

/// The host's interpreter: the floor's, and the one the sandbox's kernel runs.
const PYTHON: &str = "/usr/bin/python3";

fn main() {
    let numbers: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg.parse::<u32>().is_ok())
        .collect();
    let warm = numbers.first().cloned().unwrap_or_else(|| "200".to_owned());
    let cold = numbers.get(1).cloned().unwrap_or_else(|| "5".to_owned());
    let check = Command::new(PYTHON)
        .args(["-c", "import jupyter_client, ipykernel"])
        .output()
        .unwrap_or_else(|e| panic!("this bench needs {PYTHON}: {e}"));
    assert!(
        check.status.success(),
        "{PYTHON} cannot import jupyter_client and ipykernel ({}): apt-get install python3-ipykernel python3-jupyter-client",
        String::from_utf8_lossy(&check.stderr).trim()
    );
    let server = TestServer::start_local(Path::new(env!("CARGO_BIN_EXE_warren")));
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/code_driver.py");
    let status = Command::new(PYTHON)
        .arg(&driver)
        .args([&warm, &cold])
        .env("WARREN_URL", &server.url)
        .env("WARREN_TOKEN", &server.token)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .status()
        .unwrap_or_else(|e| panic!("run {}: {e}", driver.display()));
    assert!(status.success(), "the benchmark failed: {status}");
}
