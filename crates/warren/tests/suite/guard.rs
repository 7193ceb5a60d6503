//! The execution guard (issue 13, I33): `/v1/sandboxes/{id}/guard` and `X-Warren-Fence` on
//! every mutating route, over real HTTP, and real holder processes (the warren CLI under
//! `sh`) that are stopped past their TTL or killed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::TestServer;

use super::{bin, server};

const FENCE: &str = "X-Warren-Fence";

/// Runs each named scenario against a server on each state store: SQLite (the embedded
/// default, expiry by the process clock) and PostgreSQL (a real cluster, expiry by
/// `clock_timestamp()`).
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::server()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::on_postgres()).await
                }
            )*
        }
    };
}

on_both_stores!(
    the_guard_is_exclusive_until_released_or_lapsed_and_the_next_holder_gets_a_larger_token,
    a_write_fenced_with_a_stale_token_is_409_and_leaves_the_file_as_it_was,
    every_mutating_route_refuses_a_stale_token_before_it_changes_anything,
    guard_requests_out_of_range_are_refused_and_an_unknown_sandbox_is_404,
    a_holder_stopped_past_its_ttl_is_refused_when_it_resumes_and_changes_nothing,
    a_holder_killed_with_sigkill_is_replaced_within_its_ttl_and_one_renew_interval,
);

/// A server whose state is a fresh database of this binary's one PostgreSQL cluster
/// (started on first use; a host without PostgreSQL fails here, saying what is missing).
fn on_postgres() -> TestServer {
    static CLUSTER: std::sync::OnceLock<warren_test_support::PostgresServer> =
        std::sync::OnceLock::new();
    let url = CLUSTER
        .get_or_init(warren_test_support::PostgresServer::start)
        .fresh_database();
    TestServer::start_with(bin(), &["--backend", "memory", "--state", &url])
}

async fn acquire(server: &TestServer, id: &str, holder: &str, ttl_s: u64) -> (u16, Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard"))
                .json(&json!({"holder": holder, "ttl_s": ttl_s})),
        )
        .await
}

async fn token(server: &TestServer, id: &str, holder: &str, ttl_s: u64) -> i64 {
    let (status, body) = acquire(server, id, holder, ttl_s).await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_i64().expect("a token")
}

async fn current(server: &TestServer, id: &str) -> (u16, Value) {
    server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/guard")))
        .await
}

async fn write(server: &TestServer, id: &str, fence: Option<&str>, text: &str) -> (u16, Value) {
    let mut request = server
        .request(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=notes.txt"),
        )
        .body(text.to_owned());
    if let Some(fence) = fence {
        request = request.header(FENCE, fence);
    }
    server.send_json(request).await
}

async fn read(server: &TestServer, id: &str) -> String {
    let response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=notes.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// Polls until nobody holds the guard (it lapsed by the server's clock), at most `within`.
async fn lapses_within(server: &TestServer, id: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if current(server, id).await.0 == 404 {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

async fn the_guard_is_exclusive_until_released_or_lapsed_and_the_next_holder_gets_a_larger_token(
    server: TestServer,
) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(code(&current(&server, &id).await.1), "guard_not_found");

    let (status, first) = acquire(&server, &id, "replica-a", 30).await;
    assert_eq!(status, 201, "{first}");
    let t1 = first["token"].as_i64().unwrap();
    assert_eq!(first["holder"], "replica-a");
    let (status, held) = acquire(&server, &id, "replica-b", 30).await;
    assert_eq!((status, code(&held)), (409, "guard_held"), "{held}");
    // The refusal names the holder and its expiry, in the message and as fields.
    assert_eq!(held["error"]["holder"], "replica-a", "{held}");
    assert_eq!(held["error"]["expires_at"], first["expires_at"], "{held}");
    assert!(held["error"]["message"]
        .as_str()
        .unwrap()
        .contains("replica-a"));
    let (status, shown) = current(&server, &id).await;
    assert_eq!(
        (status, shown["token"].as_i64()),
        (200, Some(t1)),
        "{shown}"
    );

    let (status, renewed) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard/renew"))
                .json(&json!({"token": t1, "ttl_s": 60})),
        )
        .await;
    assert_eq!(
        (status, renewed["token"].as_i64()),
        (200, Some(t1)),
        "{renewed}"
    );
    assert!(renewed["expires_at"].as_str() > first["expires_at"].as_str());
    // The issue's shape, `{token}` alone: renewed by the lifetime last granted.
    let (status, again) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard/renew"))
                .json(&json!({ "token": t1 })),
        )
        .await;
    assert_eq!(
        (status, again["token"].as_i64()),
        (200, Some(t1)),
        "{again}"
    );

    let release = |token: i64| {
        server.request(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/guard?token={token}"),
        )
    };
    let response = release(t1).send().await.unwrap();
    assert_eq!(response.status(), 204);
    assert_eq!(current(&server, &id).await.0, 404);
    let (status, again) = server.send_json(release(t1)).await;
    assert_eq!((status, code(&again)), (404, "guard_not_found"), "{again}");

    // Released: the next holder gets it at once, with a larger token.
    let t2 = token(&server, &id, "replica-b", 1).await;
    assert!(t2 > t1, "{t2} after {t1}");
    // Lapsed by the server's clock: the next holder gets it without a release.
    assert!(lapses_within(&server, &id, Duration::from_secs(3)).await);
    let t3 = token(&server, &id, "replica-a", 30).await;
    assert!(t3 > t2, "{t3} after {t2}");
    // The lapsed holder cannot renew or release what it lost.
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard/renew"))
                .json(&json!({"token": t2, "ttl_s": 30})),
        )
        .await;
    assert_eq!((status, code(&body)), (404, "guard_not_found"), "{body}");
    assert_eq!(server.send_json(release(t2)).await.0, 404);
}

async fn a_write_fenced_with_a_stale_token_is_409_and_leaves_the_file_as_it_was(
    server: TestServer,
) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    let old = token(&server, &id, "replica-a", 1).await.to_string();
    assert_eq!(write(&server, &id, Some(&old), "from a").await.0, 201);
    assert!(lapses_within(&server, &id, Duration::from_secs(3)).await);
    // A lapsed token nobody superseded still writes: only a newer holder makes it stale.
    assert_eq!(write(&server, &id, Some(&old), "from a, late").await.0, 200);

    let new = token(&server, &id, "replica-b", 30).await.to_string();
    assert_eq!(write(&server, &id, Some(&new), "from b").await.0, 200);
    let (status, body) = write(&server, &id, Some(&old), "from a, stale").await;
    assert_eq!((status, code(&body)), (409, "fence_stale"), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&old) && message.contains(&new),
        "{message}"
    );
    assert_eq!(read(&server, &id).await, "from b");
    let response = server
        .request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    let metrics = response.text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l == "warren_stale_fences_total 1"),
        "{metrics}"
    );

    // Requests without the header behave as before guards existed.
    assert_eq!(write(&server, &id, None, "unfenced").await.0, 200);
    assert_eq!(read(&server, &id).await, "unfenced");
    // A malformed token, or one never issued, is not taken for no token.
    // (Leading and trailing blanks are not the value's: HTTP strips them.)
    for bad in [
        "abc",
        "0",
        "01",
        "-1",
        "1.0",
        "99999",
        "99999999999999999999",
    ] {
        let (status, body) = write(&server, &id, Some(bad), "bad").await;
        assert_eq!(
            (status, code(&body)),
            (400, "fence_invalid"),
            "{bad:?}: {body}"
        );
    }
    assert_eq!(read(&server, &id).await, "unfenced");
}

async fn every_mutating_route_refuses_a_stale_token_before_it_changes_anything(server: TestServer) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(write(&server, &id, None, "kept").await.0, 201);
    let old = token(&server, &id, "replica-a", 1).await.to_string();
    assert!(lapses_within(&server, &id, Duration::from_secs(3)).await);
    token(&server, &id, "replica-b", 30).await;
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": "true"})),
        ),
        (Method::POST, format!("/v1/sandboxes/{id}/kill"), None),
        (Method::DELETE, format!("/v1/sandboxes/{id}"), None),
        (Method::POST, format!("/v1/sandboxes/{id}/terminate"), None),
        (
            Method::PUT,
            format!("/v1/sandboxes/{id}/files?path=notes.txt"),
            None,
        ),
        (
            Method::DELETE,
            format!("/v1/sandboxes/{id}/files?path=notes.txt"),
            None,
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/files/edit"),
            Some(json!({"path": "notes.txt", "old": "kept", "new": "edited"})),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/files/mkdir"),
            Some(json!({"path": "made"})),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/files/move"),
            Some(json!({"from": "notes.txt", "to": "moved.txt"})),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/checkpoints"),
            None,
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/checkpoints/cp-0/restore"),
            None,
        ),
        (Method::POST, format!("/v1/sandboxes/{id}/snapshots"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/artifacts"),
            Some(json!({"paths": ["outputs/x"]})),
        ),
    ];
    for (method, path, body) in routes {
        let mut request = server.request(method.clone(), &path).header(FENCE, &old);
        request = match body {
            Some(body) => request.json(&body),
            // The one raw body: a file's new bytes.
            None if method == Method::PUT => request.body("changed"),
            None => request,
        };
        let (status, answer) = server.send_json(request).await;
        assert_eq!(
            (status, code(&answer)),
            (409, "fence_stale"),
            "{method} {path}: {answer}"
        );
    }
    // Nothing changed: the file, the sandbox, no checkpoint.
    assert_eq!(read(&server, &id).await, "kept");
    assert_eq!(server.sandbox_state(&id).await, "created");
    let (_, checkpoints) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/checkpoints")))
        .await;
    assert_eq!(checkpoints["checkpoints"], json!([]), "{checkpoints}");
    // An unknown sandbox is 404 with a token too, not a token problem.
    let (status, body) = server
        .send_json(
            server
                .request(
                    Method::PUT,
                    "/v1/sandboxes/sbx-000000000000000000000000/files?path=x",
                )
                .header(FENCE, "1")
                .body("x"),
        )
        .await;
    assert_eq!((status, code(&body)), (404, "sandbox_not_found"), "{body}");
}

async fn guard_requests_out_of_range_are_refused_and_an_unknown_sandbox_is_404(server: TestServer) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    for body in [
        json!({"holder": "", "ttl_s": 5}),
        json!({"holder": "a\u{7}b", "ttl_s": 5}),
        json!({"holder": "h".repeat(257), "ttl_s": 5}),
        json!({"holder": "h", "ttl_s": 0}),
        json!({"holder": "h", "ttl_s": 3601}),
    ] {
        let (status, answer) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/guard"))
                    .json(&body),
            )
            .await;
        assert_eq!(
            (status, code(&answer)),
            (400, "invalid_request"),
            "{body}: {answer}"
        );
    }
    let (status, answer) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard"))
                .json(&json!({"holder": "h", "ttl_s": 5, "extra": 1})),
        )
        .await;
    assert_eq!((status, code(&answer)), (400, "invalid_json"), "{answer}");
    let (status, answer) = acquire(&server, "sbx-000000000000000000000000", "h", 5).await;
    assert_eq!(
        (status, code(&answer)),
        (404, "sandbox_not_found"),
        "{answer}"
    );
    let (status, answer) = server
        .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}/guard")))
        .await;
    assert_eq!((status, code(&answer)), (400, "invalid_query"), "{answer}");
    let (status, answer) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard/renew"))
                .json(&json!({"token": 1, "ttl_s": 5})),
        )
        .await;
    assert_eq!(
        (status, code(&answer)),
        (404, "guard_not_found"),
        "{answer}"
    );
}

#[tokio::test]
async fn mcp_tools_through_the_cli_bridge_are_fenced_by_its_fence_flag() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(write(&server, &id, None, "kept").await.0, 201);
    let old = token(&server, &id, "replica-a", 1).await;
    assert!(lapses_within(&server, &id, Duration::from_secs(3)).await);
    let new = token(&server, &id, "replica-b", 30).await;
    // The bridge is a process of its own and the server another: blocking here is fine.
    let stale = mcp_write(&server, &id, old, "stale");
    assert_eq!(stale["result"]["isError"], true, "{stale}");
    assert!(stale.to_string().contains("stale"), "{stale}");
    assert_eq!(read(&server, &id).await, "kept");
    let current = mcp_write(&server, &id, new, "current");
    assert_ne!(current["result"]["isError"], true, "{current}");
    assert_eq!(read(&server, &id).await, "current");
}

/// `write_file` through `warren mcp --fence <fence>` (the stdio bridge); the JSON-RPC answer.
fn mcp_write(server: &TestServer, id: &str, fence: i64, text: &str) -> Value {
    let mut child = cli(server, id)
        .args(["mcp", "--sandbox", id, "--fence", &fence.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "guard-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "write_file", "arguments": {"path": "notes.txt", "content": text}}}),
    ] {
        writeln!(stdin, "{message}").unwrap();
    }
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|message| message["id"] == 2)
        .unwrap_or_else(|| {
            panic!(
                "no answer: {stdout} {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

/// Gives `command` this server's address and token, and nothing else of warren's from the
/// test's environment.
fn with_server<'a>(
    command: &'a mut Command,
    server: &TestServer,
    sandbox: &str,
) -> &'a mut Command {
    for (key, _) in std::env::vars() {
        if key.starts_with("WARREN_") {
            command.env_remove(key);
        }
    }
    command
        .env("WARREN", bin())
        .env("WARREN_URL", &server.url)
        .env("WARREN_TOKEN", &server.token)
        .env("WARREN_LOG", "warn")
        .env("SBX", sandbox)
}

/// The warren CLI, talking to `server`.
fn cli(server: &TestServer, sandbox: &str) -> Command {
    let mut command = Command::new(bin());
    with_server(&mut command, server, sandbox);
    command
}

/// A holder: a shell script driving the warren CLI, in a process group of its own so the
/// test can stop, continue or kill it and everything it runs.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Holder {
    fn start(server: &TestServer, sandbox: &str, script: &str) -> Self {
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        let mut child = with_server(&mut command, server, sandbox)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The next line the script printed, waiting at most `within`.
    fn line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("the holder printed nothing within {within:?}"))
    }

    /// Sends `signal` to the holder's whole process group.
    fn signal(&self, signal: &str) {
        let group = format!("-{}", self.child.id());
        let status = Command::new("kill")
            .args([signal, "--", &group])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {group}");
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn wait(mut self) -> (Vec<String>, String) {
        drop(self.stdin.take());
        let mut stderr = String::new();
        std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        self.child.wait().unwrap();
        // Every line the script printed, up to the end of its stdout (the reader thread
        // forwards the last ones after the process is gone).
        let mut lines = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            lines.push(line);
        }
        (lines, stderr)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Gone already after `wait`; then kill finds nobody, which is fine.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

const TTL_S: u64 = 2;

async fn a_holder_stopped_past_its_ttl_is_refused_when_it_resumes_and_changes_nothing(
    server: TestServer,
) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mut paused = Holder::start(
        &server,
        &id,
        &format!(
            r#"T=$("$WARREN" guard acquire "$SBX" --holder paused --ttl {TTL_S} --token-only) || exit 10
echo "acquired $T"
read go
echo "from the paused holder" | "$WARREN" put "$SBX" notes.txt --fence "$T" >/dev/null
echo "put exited $?""#
        ),
    );
    let acquired = paused.line(Duration::from_secs(20));
    let t1: i64 = acquired.strip_prefix("acquired ").unwrap().parse().unwrap();
    // Paused right after it took the guard, about to write; its go-ahead waits in the pipe.
    paused.signal("-STOP");
    paused.say("go");
    assert!(
        lapses_within(&server, &id, Duration::from_secs(TTL_S + 2)).await,
        "the stopped holder's guard never lapsed"
    );
    // Another holder process takes the guard and writes.
    let output = cli(&server, &id)
        .args([
            "guard",
            "acquire",
            &id,
            "--holder",
            "fresh",
            "--ttl",
            "30",
            "--token-only",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let t2: i64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    let mut put = cli(&server, &id)
        .args(["put", &id, "notes.txt", "--fence", &t2.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    put.stdin
        .take()
        .unwrap()
        .write_all(b"from the new holder\n")
        .unwrap();
    assert!(put.wait().unwrap().success());
    // The stopped holder resumes and writes with the token it still believes in.
    paused.signal("-CONT");
    let (lines, stderr) = paused.wait();
    assert_eq!(lines, ["put exited 2"], "{stderr}");
    assert!(stderr.contains("fence_stale"), "{stderr}");
    assert!(stderr.contains(&t2.to_string()), "{stderr}");
    assert_eq!(read(&server, &id).await, "from the new holder\n");
}

async fn a_holder_killed_with_sigkill_is_replaced_within_its_ttl_and_one_renew_interval(
    server: TestServer,
) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    let renew_every = Duration::from_millis(TTL_S * 1000 / 3);
    let holder = Holder::start(
        &server,
        &id,
        &format!(
            r#"T=$("$WARREN" guard acquire "$SBX" --holder doomed --ttl {TTL_S} --token-only) || exit 10
echo "acquired $T"
while sleep {renew}; do "$WARREN" guard renew "$SBX" --token "$T" --ttl {TTL_S} >/dev/null || exit 11; done"#,
            renew = renew_every.as_secs_f64()
        ),
    );
    let acquired = holder.line(Duration::from_secs(20));
    let t1: i64 = acquired.strip_prefix("acquired ").unwrap().parse().unwrap();
    // Renewing at a third of the TTL, it keeps the guard well past one TTL.
    tokio::time::sleep(Duration::from_secs(TTL_S) + renew_every * 2).await;
    let (status, body) = acquire(&server, &id, "successor", TTL_S).await;
    assert_eq!((status, code(&body)), (409, "guard_held"), "{body}");
    assert_eq!(body["error"]["holder"], "doomed", "{body}");

    holder.signal("-KILL");
    let killed = Instant::now();
    // The guard lapses at most a TTL after the holder's last renewal, which came before
    // the kill: polling as often as a holder renews finds it free within TTL + interval.
    let bound = Duration::from_secs(TTL_S) + renew_every;
    let t2 = loop {
        let (status, body) = acquire(&server, &id, "successor", 30).await;
        if status == 201 {
            break body["token"].as_i64().unwrap();
        }
        assert_eq!((status, code(&body)), (409, "guard_held"), "{body}");
        assert!(
            killed.elapsed() <= bound,
            "still held {:?} after the kill ({body})",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(killed.elapsed() <= bound, "{:?}", killed.elapsed());
    assert!(t2 > t1, "{t2} after {t1}");
}

#[tokio::test]
async fn a_fenced_exec_runs_with_the_current_token_and_never_starts_with_a_stale_one() {
    let server = super::runtime::local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let old = token(&server, &id, "replica-a", 1).await.to_string();
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .header(FENCE, &old)
                .json(&json!({"command": "echo ran > ran.txt"})),
        )
        .await;
    assert_eq!(
        (status, body["exit_code"].as_i64()),
        (200, Some(0)),
        "{body}"
    );
    assert!(lapses_within(&server, &id, Duration::from_secs(3)).await);
    token(&server, &id, "replica-b", 30).await;
    // Refused before the command starts, streaming or not: nothing runs.
    for accept in [
        "application/json",
        "application/x-ndjson",
        "text/event-stream",
    ] {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .header(FENCE, &old)
                    .header("accept", accept)
                    .json(&json!({"command": "touch stale.txt"})),
            )
            .await;
        assert_eq!(
            (status, code(&body)),
            (409, "fence_stale"),
            "{accept}: {body}"
        );
    }
    let listing = server.exec(&id, "ls").await;
    assert_eq!(listing["stdout"], "ran.txt\n", "{listing}");
}

#[tokio::test]
async fn the_cli_holds_the_guard_and_speaks_of_its_own_commands_in_errors() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let run = |args: &[&str], fence: Option<&str>| {
        let mut command = cli(&server, &id);
        command.args(args);
        if let Some(fence) = fence {
            command.env("WARREN_FENCE", fence);
        }
        let output = command.stdin(Stdio::null()).output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (status, stdout, stderr) = run(&["guard", "acquire", &id, "--holder", "cli-a"], None);
    assert_eq!(status, Some(0), "{stderr}");
    let guard: Value = serde_json::from_str(&stdout).unwrap();
    let t = guard["token"].as_i64().unwrap().to_string();
    assert_eq!(guard["holder"], "cli-a");

    let (status, _, stderr) = run(&["guard", "acquire", &id, "--holder", "cli-b"], None);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(
        stderr.contains("guard_held") && stderr.contains("cli-a"),
        "{stderr}"
    );
    let (status, stdout, _) = run(&["guard", "show", &id], None);
    assert_eq!(status, Some(0));
    assert!(stdout.contains("cli-a"), "{stdout}");
    // The token comes from WARREN_FENCE, as it does for the commands it fences.
    let (status, _, stderr) = run(&["guard", "renew", &id, "--ttl", "60"], Some(&t));
    assert_eq!(status, Some(0), "{stderr}");
    let (status, _, stderr) = run(&["put", &id, "notes.txt"], Some(&t));
    assert_eq!(status, Some(0), "{stderr}");
    let (status, _, stderr) = run(&["guard", "release", &id], Some(&t));
    assert_eq!(status, Some(0), "{stderr}");
    let (status, _, stderr) = run(&["guard", "renew", &id], Some(&t));
    assert_eq!(status, Some(2), "{stderr}");
    assert!(
        stderr.contains("guard_not_found")
            && stderr.contains("`warren guard acquire <sandbox> --holder <name>`")
            && !stderr.contains("POST /v1"),
        "{stderr}"
    );
    let (status, _, stderr) = run(&["guard", "release", &id], None);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(stderr.contains("WARREN_FENCE"), "{stderr}");
    // A newer holder makes the CLI's token stale.
    run(&["guard", "acquire", &id, "--holder", "cli-b"], None);
    let (status, _, stderr) = run(&["put", &id, "notes.txt"], Some(&t));
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("fence_stale"), "{stderr}");
    let (status, _, stderr) = run(&["put", &id, "notes.txt", "--fence", "x"], None);
    assert_eq!(status, Some(2), "{stderr}");
}
