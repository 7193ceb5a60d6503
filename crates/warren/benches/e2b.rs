//! E2B's API on warren (issue 17): a new sandbox and its first command, measured in one run
//! on one server (local backend) three ways, so the E2B layer's and the Python SDK's own
//! costs show as differences. Not a test: it asserts nothing beyond each answer being
//! right, it prints.
//!
//! - Native: `POST /v1/sandboxes` then `POST /v1/sandboxes/{id}/exec` of `true` (warren's
//!   own API; the runtime starts lazily, at that first exec).
//! - E2B HTTP, no SDK (reqwest): `POST /v2/sandboxes` (the runtime starts before the 201;
//!   a workdir of its own per sandbox, the `e2b` layout) then envd's
//!   `POST /process.Process/Start` (Connect, JSON codec, one request envelope; the stream
//!   read to its end-of-stream envelope), once with `{"cmd": "true"}` and once with the
//!   request the SDK sends for `commands.run("true")`: `/bin/bash -l -c true`.
//! - E2B Python SDK (`e2b_driver.py`, timed inside Python with `time.perf_counter()`):
//!   `Sandbox.create()` then `sbx.commands.run("true")`.
//!
//! The four ways interleave (each iteration runs all four, starting with the next one), so
//! a slow spell of this shared two-core machine lands on all of them alike. Every sandbox
//! is killed after its timing, outside the timed part, and the next one is created
//! [`SETTLE`] later, so no teardown lands in a measurement and none accumulate.
//! Everything runs on loopback on this machine: no network latency, no TLS, no scheduler or
//! placement (E2B's cloud has all three). The anchors printed beside our figures — E2B's
//! ~150 ms create and CubeSandbox's < 60 ms cold start — are the projects' published
//! claims, not measured here, on other hardware and other isolation (microVMs); the ratios
//! only give scale.
//!
//! Run as root (the local backend's namespaces and cgroups) with the `e2b` Python SDK in a
//! venv (`WARREN_TEST_E2B_PY_CURRENT`, default
//! `/var/cache/warren-test/e2b-py-2.63.0/bin/python`; scripts/test installs it):
//! `cargo bench -p warren --bench e2b` (`-- --iterations N`, default 20, after one
//! warm-up iteration each).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::latency::{ms, percentile, row};
use warren_test_support::{E2bServer, TestServer};

/// Untimed iterations of every way first: page cache, first connections, imports.
const WARM_UP: usize = 1;

/// The pause after each kill, outside the timing: teardown finishes before the next create.
const SETTLE: Duration = Duration::from_millis(100);

/// The published figures printed beside ours, not measured here.
const ANCHORS: [(&str, &str, f64); 2] = [
    ("E2B create (published claim)", "~150 ms", 150.0),
    ("CubeSandbox cold start (published claim)", "< 60 ms", 60.0),
];

/// One way's samples: create alone, first command alone, and both.
#[derive(Default)]
struct Phases {
    create: Vec<Duration>,
    first: Vec<Duration>,
    total: Vec<Duration>,
}

impl Phases {
    fn push(&mut self, create: Duration, first: Duration) {
        self.create.push(create);
        self.first.push(first);
        self.total.push(create + first);
    }
}

#[tokio::main]
async fn main() {
    let iterations: usize = warren_test_support::latency::iterations(20);
    let python = python();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    let e2b = TestServer::start_e2b(bin, &[], "");
    e2b.server.workdir("bench", "projects/p").await;

    let http = reqwest::Client::new();
    let true_cmd = json!({"cmd": "true"});
    let bash_cmd = json!({"cmd": "/bin/bash", "args": ["-l", "-c", "true"]});
    let mut driver = Driver::start(&python, &e2b);
    let sdk_version = driver.sdk.clone();
    let mut ways: [Phases; 4] = Default::default();
    // The ways interleave, each iteration starting with the next one, so a slower spell of
    // this machine (two cores, shared) lands on all of them alike.
    for i in 0..WARM_UP + iterations {
        for k in 0..ways.len() {
            let way = (i + k) % ways.len();
            let (create, first) = match way {
                0 => native(&e2b.server, i).await,
                1 => e2b_http(&e2b, &http, &true_cmd).await,
                2 => e2b_http(&e2b, &http, &bash_cmd).await,
                _ => driver.step(&e2b),
            };
            if i >= WARM_UP {
                ways[way].push(create, first);
            }
            tokio::time::sleep(SETTLE).await;
        }
    }
    driver.finish(&e2b);
    let left = live_e2b_sandboxes(&e2b, &http).await;
    assert_eq!(left, 0, "E2B sandboxes left running after the bench");
    drop(e2b);
    let [native, raw_true, raw_bash, mut sdk] = ways;

    println!(
        "warren E2B API vs native API (local backend, loopback, this machine), {iterations} iterations of each way, interleaved, after {WARM_UP} warm-up; each sandbox killed after its timing\n"
    );
    println!("create + first command");
    line(
        "native API: create + exec `true`",
        &mut native.total.clone(),
    );
    line(
        "E2B HTTP, no SDK: create + Start `true`",
        &mut raw_true.total.clone(),
    );
    line(
        "E2B HTTP, no SDK: create + Start `bash -l -c true`",
        &mut raw_bash.total.clone(),
    );
    line(
        &format!("E2B Python SDK {sdk_version}: create() + run(\"true\")"),
        &mut sdk.total.clone(),
    );
    println!("\ncreate alone");
    line(
        "native API: POST /v1/sandboxes (lazy runtime)",
        &mut native.create.clone(),
    );
    line(
        "E2B HTTP, no SDK: POST /v2/sandboxes",
        &mut merged(&raw_true.create, &raw_bash.create),
    );
    line("E2B Python SDK: Sandbox.create()", &mut sdk.create.clone());
    println!("\nfirst command alone");
    line(
        "native API: exec `true` (starts the runtime)",
        &mut native.first.clone(),
    );
    line(
        "E2B HTTP, no SDK: Start `true`",
        &mut raw_true.first.clone(),
    );
    line(
        "E2B HTTP, no SDK: Start `bash -l -c true`",
        &mut raw_bash.first.clone(),
    );
    line(
        "E2B Python SDK: commands.run(\"true\")",
        &mut sdk.first.clone(),
    );

    println!("\nthe layers' own cost (create + first command, p50 difference and ratio)");
    println!(
        "E2B API over native (same command)       {:>+10.2} ms",
        p50_ms(&mut raw_true.total.clone()) - p50_ms(&mut native.total.clone())
    );
    println!(
        "bash -l over plain `true` (the SDK's cmd) {:>+10.2} ms",
        p50_ms(&mut raw_bash.total.clone()) - p50_ms(&mut raw_true.total.clone())
    );
    println!(
        "Python SDK over raw HTTP (same requests)  {:>+10.2} ms",
        p50_ms(&mut sdk.total.clone()) - p50_ms(&mut raw_bash.total.clone())
    );
    row(
        "E2B HTTP `true` vs native",
        &mut raw_true.total.clone(),
        &mut native.total.clone(),
        "native API",
    );
    row(
        "Python SDK vs E2B HTTP `bash -l`",
        &mut sdk.total.clone(),
        &mut raw_bash.total.clone(),
        "E2B HTTP, no SDK",
    );

    println!("\npublished figures, NOT measured here (other hardware, microVM isolation, their own networks); ratio = our p50 / the figure");
    let sdk_create = p50_ms(&mut sdk.create);
    let sdk_total = p50_ms(&mut sdk.total);
    let native_total = p50_ms(&mut native.total.clone());
    for (name, shown, figure) in ANCHORS {
        println!(
            "{name:<42} {shown:>8}   SDK create() {:.2}x   SDK create()+run {:.2}x   native create+exec {:.2}x",
            sdk_create / figure,
            sdk_total / figure,
            native_total / figure
        );
    }
}

/// One line: p50 and p99 of `samples`.
fn line(name: &str, samples: &mut [Duration]) {
    let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
    println!("{name:<52} p50 {:>10}  p99 {:>10}", ms(p50), ms(p99));
}

fn p50_ms(samples: &mut [Duration]) -> f64 {
    percentile(samples, 0.5).as_secs_f64() * 1000.0
}

fn merged(a: &[Duration], b: &[Duration]) -> Vec<Duration> {
    a.iter().chain(b).copied().collect()
}

/// Native API: create a sandbox (uid `bench`, workdir `projects/p`) and exec `true`; the
/// sandbox is terminated after the timing. Create alone and the first exec alone.
async fn native(server: &TestServer, i: usize) -> (Duration, Duration) {
    let started = Instant::now();
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "bench", "runtime_scope_id": format!("native-{i}"), "workdir": "projects/p"
        })))
        .await;
    assert_eq!(status, 201, "{body}");
    let created = started.elapsed();
    let id = body["sandbox_id"].as_str().unwrap().to_owned();
    let result = server.exec(&id, "true").await;
    let total = started.elapsed();
    assert_eq!(result["exit_code"], 0, "{result}");
    server.terminate(&id).await;
    (created, total - created)
}

/// E2B's HTTP API without the SDK: `POST /v2/sandboxes`, then envd's Start of `process`
/// read to the end of its stream; the sandbox is killed after the timing.
async fn e2b_http(
    e2b: &E2bServer,
    http: &reqwest::Client,
    process: &Value,
) -> (Duration, Duration) {
    let started = Instant::now();
    let response = http
        .post(format!("{}/v2/sandboxes", e2b.url))
        .header("X-API-Key", &e2b.key)
        .json(&json!({"templateID": "base", "timeout": 300, "metadata": {}, "envVars": {}}))
        .send()
        .await
        .expect("the E2B listener answers");
    let status = response.status();
    let body: Value = response.json().await.expect("a JSON create answer");
    assert_eq!(status, 201, "create: {body}");
    let created = started.elapsed();
    let id = body["sandboxID"].as_str().expect("sandboxID").to_owned();
    let token = body["envdAccessToken"].as_str().unwrap_or_default();
    let end = start_process(http, &e2b.url, &id, token, process).await;
    let total = started.elapsed();
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0, "{end}");
    assert_eq!(end["exited"], true, "{end}");
    let killed = http
        .delete(format!("{}/sandboxes/{id}", e2b.url))
        .header("X-API-Key", &e2b.key)
        .send()
        .await
        .expect("the E2B listener answers");
    assert_eq!(killed.status(), 204, "kill {id}");
    (created, total - created)
}

/// `POST /process.Process/Start` (Connect server-streaming, JSON codec): one request
/// envelope, then the answer's envelopes read until the end-of-stream one; the `end` event.
async fn start_process(
    http: &reqwest::Client,
    url: &str,
    sandbox: &str,
    token: &str,
    process: &Value,
) -> Value {
    let message = serde_json::to_vec(&json!({ "process": process })).unwrap();
    let mut envelope = vec![0u8];
    envelope.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    envelope.extend_from_slice(&message);
    let mut request = http
        .post(format!("{url}/process.Process/Start"))
        .header("Content-Type", "application/connect+json")
        .header("Connect-Protocol-Version", "1")
        .header("E2b-Sandbox-Id", sandbox);
    if !token.is_empty() {
        request = request.header("X-Access-Token", token);
    }
    let mut response = request.body(envelope).send().await.expect("envd answers");
    assert_eq!(response.status(), 200, "Start in {sandbox}");
    let mut buffer = Vec::new();
    let mut end = None;
    loop {
        let chunk = response
            .chunk()
            .await
            .expect("the Start stream reads")
            .unwrap_or_else(|| panic!("the Start stream ended without its end-of-stream envelope"));
        buffer.extend_from_slice(&chunk);
        while buffer.len() >= 5 {
            let length = u32::from_be_bytes(buffer[1..5].try_into().unwrap()) as usize;
            if buffer.len() < 5 + length {
                break;
            }
            let flags = buffer[0];
            let payload: Value =
                serde_json::from_slice(&buffer[5..5 + length]).expect("a JSON envelope");
            buffer.drain(..5 + length);
            if flags & 0x02 != 0 {
                assert!(payload.get("error").is_none(), "Start failed: {payload}");
                return end.expect("an end event before the end of the stream");
            }
            if let Some(event) = payload["event"].get("end") {
                end = Some(event.clone());
            }
        }
    }
}

/// The official SDK through `e2b_driver.py`, one iteration per line it reads.
struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The SDK's version, as the driver reports it.
    sdk: String,
}

impl Driver {
    fn start(python: &Path, e2b: &E2bServer) -> Self {
        let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/e2b_driver.py");
        let mut child = Command::new(python)
            .arg(&driver)
            .envs(e2b.sdk_env())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("a piped stdout"));
        let mut driver = Self {
            child,
            stdin,
            stdout,
            sdk: String::new(),
        };
        let hello = driver.answer(e2b);
        driver.sdk = hello["sdk"].as_str().expect("the SDK's version").to_owned();
        driver
    }

    /// One iteration: `Sandbox.create()` and `commands.run("true")`, as Python timed them.
    fn step(&mut self, e2b: &E2bServer) -> (Duration, Duration) {
        let stdin = self.stdin.as_mut().expect("the driver runs");
        writeln!(stdin, "step")
            .and_then(|()| stdin.flush())
            .expect("the driver reads");
        let answer = self.answer(e2b);
        let millis = |key: &str| {
            let value = answer[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} in {answer}"));
            Duration::from_secs_f64(value / 1000.0)
        };
        (millis("create_ms"), millis("run_ms"))
    }

    /// The driver's next JSON line; a panic with the server's log when it has none.
    fn answer(&mut self, e2b: &E2bServer) -> Value {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line).unwrap_or(0);
        if read == 0 {
            let status = self.child.wait();
            panic!(
                "the E2B SDK driver ended ({status:?}; its error is above); the server's log:\n{}",
                e2b.log_tail(40)
            );
        }
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("the driver said {line:?}: {e}"))
    }

    /// Closes the driver's stdin and waits for it to exit.
    fn finish(mut self, e2b: &E2bServer) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for the driver");
        assert!(
            status.success(),
            "the E2B SDK driver: {status}; the server's log:\n{}",
            e2b.log_tail(40)
        );
    }
}

/// The interpreter of a venv with the `e2b` SDK; a clear panic when there is none.
fn python() -> PathBuf {
    let python = std::env::var_os("WARREN_TEST_E2B_PY_CURRENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/warren-test/e2b-py-2.63.0/bin/python"));
    let install = "run scripts/test (it installs the SDK), or `python3 -m venv \
         /var/cache/warren-test/e2b-py-2.63.0 && /var/cache/warren-test/e2b-py-2.63.0/bin/pip \
         install e2b==2.63.0`, or set WARREN_TEST_E2B_PY_CURRENT to a venv's bin/python with e2b";
    match Command::new(&python).args(["-c", "import e2b"]).output() {
        Ok(out) if out.status.success() => python,
        Ok(out) => panic!(
            "{} cannot import the e2b SDK: {}; {install}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(error) => panic!(
            "this bench needs the e2b Python SDK; {} is missing ({error}); {install}",
            python.display()
        ),
    }
}

/// How many E2B sandboxes are still running (`GET /v2/sandboxes`).
async fn live_e2b_sandboxes(e2b: &E2bServer, http: &reqwest::Client) -> usize {
    let listed: Value = http
        .get(format!("{}/v2/sandboxes", e2b.url))
        .header("X-API-Key", &e2b.key)
        .send()
        .await
        .expect("the E2B listener answers")
        .json()
        .await
        .expect("a JSON list");
    listed.as_array().map_or(0, Vec::len)
}
