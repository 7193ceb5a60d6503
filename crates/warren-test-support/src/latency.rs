//! Latency samples of the benchmarks, and their report lines.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::TestServer;

/// How long one `docker` command takes, its output dropped; panics when it fails.
pub fn timed_docker(args: &[&str]) -> Duration {
    let started = Instant::now();
    let status = std::process::Command::new("docker")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("docker runs");
    assert!(status.success(), "docker {args:?} failed");
    started.elapsed()
}

/// The `--iterations N` a benchmark was run with, or `default`.
pub fn iterations(default: usize) -> usize {
    std::env::args()
        .skip_while(|a| a != "--iterations")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Starts the container `name` of the test image as 1000:1000 with no network,
/// sleeping until removed, the anchor a benchmark measures `docker` against; how long
/// `docker run -d` took.
pub fn sleeping_container(name: &str) -> Duration {
    timed_docker(&[
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "none",
        "--user",
        "1000:1000",
        crate::DOCKER_TEST_IMAGE,
        "sleep",
        "infinity",
    ])
}

/// Untimed rounds before each measurement: page cache, the server's first requests.
const WARM_UP: usize = 5;

/// A keystroke's round trips through a process's terminal: `cat` on a pty started
/// through `start` (uid `bench`, workdir `projects/k`), attached over the
/// `/v1` WebSocket through `attach` (the same server, or another replica), one byte in
/// and its echo (by the line discipline) out, `keystrokes` times after 20 untimed.
pub async fn terminal_keystrokes(
    start: &TestServer,
    attach: &TestServer,
    keystrokes: usize,
) -> Vec<Duration> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let id = start.sandbox("bench", "keys", "projects/k").await;
    let (status, process) = start
        .send_json(
            start
                .request(Method::POST, &format!("/v1/sandboxes/{id}/processes"))
                .json(&json!({"command": "exec cat >/dev/null", "pty": {"cols": 80, "rows": 24}, "stdin": true})),
        )
        .await;
    assert_eq!(status, 201, "{process}");
    let pid = process["pid"].as_i64().unwrap();
    let url = format!(
        "{}/v1/sandboxes/{id}/processes/{pid}/attach",
        attach.url.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", attach.token).parse().unwrap(),
    );
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the attach WebSocket");
    let (mut to_server, mut from_server) = socket.split();
    let mut samples = Vec::with_capacity(keystrokes);
    for i in 0..keystrokes + 20 {
        let started = Instant::now();
        to_server
            .send(Message::Binary(b"a".to_vec().into()))
            .await
            .unwrap();
        loop {
            match from_server.next().await.expect("the echo").unwrap() {
                Message::Binary(bytes) if bytes.contains(&b'a') => break,
                _ => {}
            }
        }
        if i >= 20 {
            samples.push(started.elapsed());
        }
        if i % 64 == 63 {
            // Lines stay short; `cat` reads each.
            to_server
                .send(Message::Binary(b"\n".to_vec().into()))
                .await
                .unwrap();
            loop {
                match from_server.next().await.expect("the echo").unwrap() {
                    Message::Binary(bytes) if bytes.contains(&b'\n') => break,
                    _ => {}
                }
            }
        }
    }
    samples
}

/// Through `server`'s API (uid `bench`, whose workdir `projects/p` must exist):
/// `cold` times creating a sandbox and running its first command (the runtime starts
/// lazily), and `warm` times one command in a running runtime.
///
/// The cold sandboxes are removed after the timing, not in between: a destroyed
/// runtime's teardown (network namespace, container) finishes asynchronously, and on
/// two cores that work would land inside the next creation's time.
pub async fn create_and_exec(
    server: &TestServer,
    cold: usize,
    warm: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut create = Vec::new();
    let mut ids = Vec::new();
    for i in 0..cold + WARM_UP {
        let (took, id) = create_and_first_exec(server, &format!("cold-{i}")).await;
        if i >= WARM_UP {
            create.push(took);
        }
        ids.push(id);
    }
    for id in ids {
        server
            .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
            .await;
    }
    let id = server.sandbox("bench", "warm", "projects/p").await;
    let mut times = Vec::new();
    for i in 0..warm + WARM_UP {
        let started = Instant::now();
        let result = server.exec_with(&id, json!({"argv": ["true"]})).await;
        assert_eq!(result["exit_code"], 0, "{result}");
        if i >= WARM_UP {
            times.push(started.elapsed());
        }
    }
    (create, times)
}

/// Creates a sandbox of uid `bench` and runtime scope `scope` on workdir `projects/p` and
/// runs the command `true` in it (the runtime starts lazily): how long both took, and the sandbox.
pub async fn create_and_first_exec(server: &TestServer, scope: &str) -> (Duration, String) {
    let started = Instant::now();
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "bench", "runtime_scope_id": scope, "workdir": "projects/p"
        })))
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["sandbox_id"].as_str().unwrap().to_owned();
    let result = server.exec(&id, "true").await;
    assert_eq!(result["exit_code"], 0, "{result}");
    (started.elapsed(), id)
}

/// The `p` quantile (0..=1) of `samples` (sorted in place).
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// One report line: our p50/p99 beside an anchor's, and the p50 ratio.
pub fn row(name: &str, ours: &mut [Duration], anchor: &mut [Duration], anchor_name: &str) {
    if ours.is_empty() {
        return;
    }
    let (p50, p99) = (percentile(ours, 0.5), percentile(ours, 0.99));
    if anchor.is_empty() {
        println!(
            "{name:<40} p50 {:>10}  p99 {:>10}   ({anchor_name}: not available)",
            ms(p50),
            ms(p99)
        );
    } else {
        let (a50, a99) = (percentile(anchor, 0.5), percentile(anchor, 0.99));
        println!(
            "{name:<40} p50 {:>10}  p99 {:>10}   {anchor_name:<22} p50 {:>10}  p99 {:>10}   ratio p50 {:.2}x",
            ms(p50),
            ms(p99),
            ms(a50),
            ms(a99),
            p50.as_secs_f64() / a50.as_secs_f64()
        );
    }
}
