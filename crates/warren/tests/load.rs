//! The load test (issue 20, item 17): many sandboxes, many concurrent clients mixing exec,
//! streaming exec, file reads and writes and MCP tool calls against one real `warren serve`
//! on loopback, for a bounded time.
//!
//! It reports throughput and p50/p99 per operation, and fails on what must never happen
//! under load, whatever the machine's speed: a 5xx answer, a failed request, a lost or torn
//! write (every client owns a file and checks it reads back its own last write), and any
//! process, mount, cgroup or runtime directory left after the sandboxes are terminated
//! (I24). It asserts no latency: figures are printed, not judged (performance is measured in benchmarks, never asserted in tests).
//!
//! `cargo test -p warren --test load` runs the default shape (200 sandboxes, 1,000
//! clients, 20 s) twice: with the state in SQLite, then in a real PostgreSQL server
//! (issue 13); `-- --sandboxes N --clients N --duration S --uids N` changes the shape and
//! `-- --store sqlite` (or `postgres`) runs one.
//! Runs as root (real local runtimes), like the rest of the end-to-end suite.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::{
    docker_instance, latency::percentile, mcp_messages, PostgresServer, TestServer,
};

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
struct Shape {
    sandboxes: usize,
    clients: usize,
    uids: usize,
    duration: Duration,
    /// Which state stores to run against, in order.
    stores: &'static [Store],
}

/// Where the server under load keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Sqlite,
    Postgres,
}

impl Shape {
    fn from_args() -> Self {
        let mut shape = Shape {
            sandboxes: 200,
            clients: 1000,
            uids: 50,
            duration: Duration::from_secs(20),
            stores: &[Store::Sqlite, Store::Postgres],
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let value = || -> u64 {
                args.get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{} needs a number", args[i]))
            };
            match args[i].as_str() {
                "--sandboxes" => shape.sandboxes = value() as usize,
                "--clients" => shape.clients = value() as usize,
                "--uids" => shape.uids = value() as usize,
                "--duration" => shape.duration = Duration::from_secs(value()),
                "--store" => {
                    shape.stores = match args.get(i + 1).map(String::as_str) {
                        Some("sqlite") => &[Store::Sqlite],
                        Some("postgres") => &[Store::Postgres],
                        other => panic!("--store takes sqlite or postgres, not {other:?}"),
                    }
                }
                // What libtest-style runners pass along; nothing to filter here.
                _ => {
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        assert!(shape.sandboxes >= shape.uids && shape.uids > 0 && shape.clients > 0);
        shape
    }
}

/// What the clients do, in the proportions of a busy agent platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Exec,
    StreamExec,
    Write,
    Read,
    Mcp,
}

impl Op {
    const ALL: [Op; 5] = [Op::Exec, Op::StreamExec, Op::Write, Op::Read, Op::Mcp];

    fn name(self) -> &'static str {
        match self {
            Op::Exec => "exec",
            Op::StreamExec => "exec (NDJSON stream)",
            Op::Write => "file write",
            Op::Read => "file read",
            Op::Mcp => "MCP tools/call",
        }
    }

    /// The n-th operation of a client: writes and reads alternate with commands.
    fn nth(n: u64) -> Op {
        match n % 8 {
            0 | 4 => Op::Write,
            1 | 5 => Op::Read,
            2 => Op::Exec,
            3 => Op::StreamExec,
            6 => Op::Mcp,
            _ => Op::Exec,
        }
    }
}

/// Everything the clients observed.
#[derive(Default)]
struct Tally {
    latencies: Mutex<HashMap<Op, Vec<Duration>>>,
    server_errors: Mutex<Vec<String>>,
    failures: Mutex<Vec<String>>,
    completed: AtomicU64,
}

impl Tally {
    fn record(&self, op: Op, took: Duration) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.latencies
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .push(took);
    }

    fn fail(&self, status: Option<u16>, what: String) {
        let list = match status {
            Some(s) if s >= 500 => &self.server_errors,
            _ => &self.failures,
        };
        let mut list = list.lock().unwrap();
        // Enough to diagnose; a broken server would otherwise fill memory.
        if list.len() < 50 {
            list.push(what);
        }
    }
}

/// One client: owns `load/c<i>.txt` in its sandbox's workdir, and an MCP session.
struct Client {
    index: usize,
    sandbox: String,
    file: String,
    /// The content of the last write the server acknowledged.
    last_written: Option<String>,
    mcp_session: Option<String>,
    mcp_next_id: u64,
}

fn main() {
    let shape = Shape::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // The verdict is printed only once the server is gone: dropping it kills it and removes
    // whatever a failed run left, and `exit` would skip that.
    let mut passed = true;
    for &store in shape.stores {
        passed &= runtime.block_on(run(shape, store));
    }
    drop(runtime);
    if passed {
        println!("load: 1 passed, 0 failed");
    } else {
        println!("load: 0 passed, 1 failed");
        std::process::exit(1);
    }
}

/// One run; whether it passed.
async fn run(shape: Shape, store: Store) -> bool {
    println!(
        "load: {} sandboxes of {} uids, {} concurrent clients, {:?}, state in {store:?}",
        shape.sandboxes, shape.uids, shape.clients, shape.duration
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    // Kept for the run: the server's state lives in it.
    let postgres = (store == Store::Postgres).then(PostgresServer::start);
    let url = postgres.as_ref().map(PostgresServer::fresh_database);
    // Idle reaping off for the run: every runtime must be the one the clients started.
    let mut args = vec!["--backend", "local", "--idle-timeout", "3600"];
    if let Some(url) = &url {
        args.extend(["--state", url.as_str()]);
    }
    let server = Arc::new(TestServer::start_with(bin, &args));
    let sandboxes = create_sandboxes(&server, shape).await;
    let runtimes = runtime_records(&server, &sandboxes);
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let deadline = started + shape.duration;
    let mut tasks = Vec::new();
    for index in 0..shape.clients {
        let client = Client {
            index,
            sandbox: sandboxes[index % sandboxes.len()].clone(),
            file: format!("load/c{index}.txt"),
            last_written: None,
            mcp_session: None,
            mcp_next_id: 1,
        };
        tasks.push(tokio::spawn(drive(
            server.clone(),
            client,
            tally.clone(),
            deadline,
        )));
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.expect("a client task panicked"));
    }
    let elapsed = started.elapsed();
    verify_no_write_lost(&server, &clients, &tally).await;
    report(&tally, elapsed);
    terminate_all(&server, &sandboxes, &tally).await;
    let leftovers = leftovers(&server, &sandboxes, &runtimes);

    let server_errors = tally.server_errors.lock().unwrap();
    let failures = tally.failures.lock().unwrap();
    let mut verdict = Vec::new();
    if !server_errors.is_empty() {
        verdict.push(format!("5xx answers: {:#?}", *server_errors));
    }
    if !failures.is_empty() {
        verdict.push(format!("failed or wrong answers: {:#?}", *failures));
    }
    if !leftovers.is_empty() {
        verdict.push(format!("left behind after termination: {leftovers:#?}"));
    }
    if tally.completed.load(Ordering::Relaxed) == 0 {
        verdict.push("no operation completed".to_owned());
    }
    if !verdict.is_empty() {
        eprintln!("load: FAILED\n{}", verdict.join("\n"));
    }
    verdict.is_empty()
}

/// `shape.sandboxes` sandboxes spread over `shape.uids` uids (one workdir each), each with
/// its runtime started by a first command, a few at a time.
async fn create_sandboxes(server: &Arc<TestServer>, shape: Shape) -> Vec<String> {
    let began = Instant::now();
    for u in 0..shape.uids {
        server.workdir(&format!("load-u{u}"), "projects/load").await;
    }
    let ids: Vec<String> = futures::stream::iter(0..shape.sandboxes)
        .map(|s| {
            let server = server.clone();
            let uid = format!("load-u{}", s % shape.uids);
            async move {
                let id = server
                    .sandbox(&uid, &format!("scope-{s}"), "projects/load")
                    .await;
                let first = server.exec(&id, "mkdir -p load").await;
                assert_eq!(first["exit_code"], 0, "{first}");
                id
            }
        })
        .buffered(8)
        .collect()
        .await;
    println!(
        "load: {} runtimes started in {:.1} s",
        ids.len(),
        began.elapsed().as_secs_f64()
    );
    ids
}

async fn drive(
    server: Arc<TestServer>,
    mut client: Client,
    tally: Arc<Tally>,
    deadline: Instant,
) -> Client {
    // Clients start spread out, as real ones do, not in one synchronised burst.
    tokio::time::sleep(Duration::from_millis((client.index % 100) as u64 * 5)).await;
    let mut n = client.index as u64;
    let mut seq = 0u64;
    while Instant::now() < deadline {
        let op = Op::nth(n);
        n += 1;
        let began = Instant::now();
        let outcome = match op {
            Op::Exec => exec(&server, &client).await,
            Op::StreamExec => stream_exec(&server, &client).await,
            Op::Write => {
                seq += 1;
                write(&server, &mut client, seq).await
            }
            Op::Read => read(&server, &client).await,
            Op::Mcp => mcp(&server, &mut client).await,
        };
        match outcome {
            Ok(()) => tally.record(op, began.elapsed()),
            Err((status, what)) => tally.fail(
                status,
                format!("client {} {}: {what}", client.index, op.name()),
            ),
        }
    }
    client
}

type Outcome = Result<(), (Option<u16>, String)>;

fn transport(error: reqwest::Error) -> (Option<u16>, String) {
    (None, format!("request failed: {error}"))
}

async fn exec(server: &TestServer, client: &Client) -> Outcome {
    let token = format!("x{}", client.index);
    let response = server
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", client.sandbox),
        )
        .json(&json!({"argv": ["echo", token]}))
        .send()
        .await
        .map_err(transport)?;
    let status = response.status().as_u16();
    let body: Value = response.json().await.map_err(transport)?;
    if status != 200 || body["exit_code"] != 0 || body["stdout"] != format!("{token}\n") {
        return Err((Some(status), format!("{body}")));
    }
    Ok(())
}

async fn stream_exec(server: &TestServer, client: &Client) -> Outcome {
    let response = server
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", client.sandbox),
        )
        .header("accept", "application/x-ndjson")
        .json(&json!({"command": "echo one; echo two >&2; echo three"}))
        .send()
        .await
        .map_err(transport)?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(transport)?;
    if status != 200 {
        return Err((Some(status), text));
    }
    let events: Vec<Value> = text
        .lines()
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    match events.last() {
        Some(last)
            if last["type"] == "exit"
                && last["result"]["exit_code"] == 0
                && last["result"]["stdout"] == "one\nthree\n" =>
        {
            Ok(())
        }
        _ => Err((Some(status), format!("stream ended wrongly: {text}"))),
    }
}

async fn write(server: &TestServer, client: &mut Client, seq: u64) -> Outcome {
    // Long enough that a torn write would show.
    let content = format!("client {} write {seq} {}\n", client.index, "x".repeat(512));
    let response = server
        .request(
            Method::PUT,
            &format!(
                "/v1/sandboxes/{}/files?path={}",
                client.sandbox, client.file
            ),
        )
        .body(content.clone())
        .send()
        .await
        .map_err(transport)?;
    let status = response.status().as_u16();
    if !(200..300).contains(&status) {
        let body = response.text().await.unwrap_or_default();
        return Err((Some(status), body));
    }
    client.last_written = Some(content);
    Ok(())
}

async fn read(server: &TestServer, client: &Client) -> Outcome {
    let Some(expected) = &client.last_written else {
        return Ok(());
    };
    let response = server
        .request(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/files?path={}",
                client.sandbox, client.file
            ),
        )
        .send()
        .await
        .map_err(transport)?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(transport)?;
    if status != 200 || &body != expected {
        return Err((
            Some(status),
            format!(
                "read back {} bytes, not its last write: {body:.80}",
                body.len()
            ),
        ));
    }
    Ok(())
}

/// One MCP `tools/call` (`read_file` of the client's own file once it wrote one, else
/// `bash`), over a session the client opened with `initialize`.
async fn mcp(server: &TestServer, client: &mut Client) -> Outcome {
    if client.mcp_session.is_none() {
        let answer = mcp_post(
            server,
            client,
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "warren-load", "version": "1"},
            }}),
        )
        .await?;
        if answer.get("result").is_none() {
            return Err((None, format!("initialize: {answer}")));
        }
        mcp_post(
            server,
            client,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await?;
    }
    client.mcp_next_id += 1;
    let id = client.mcp_next_id;
    let (tool, arguments, want) = match &client.last_written {
        Some(content) => (
            "read_file",
            json!({"path": client.file}),
            content.split(' ').take(4).collect::<Vec<_>>().join(" "),
        ),
        None => (
            "bash",
            json!({"command": format!("echo mcp{}", client.index)}),
            format!("mcp{}", client.index),
        ),
    };
    let answer = mcp_post(
        server,
        client,
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": tool, "arguments": arguments}}),
    )
    .await?;
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    if answer["result"]["isError"] == true || !text.contains(&want) {
        return Err((None, format!("{tool}: {answer}")));
    }
    Ok(())
}

/// POSTs one JSON-RPC message to the sandbox's MCP endpoint; the answer with the same id
/// (or `null` for a notification).
async fn mcp_post(
    server: &TestServer,
    client: &mut Client,
    message: Value,
) -> Result<Value, (Option<u16>, String)> {
    let mut request = server
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{}/mcp", client.sandbox),
        )
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&message);
    if let Some(session) = &client.mcp_session {
        request = request.header("mcp-session-id", session);
    }
    let response = request.send().await.map_err(transport)?;
    let status = response.status().as_u16();
    if let Some(session) = response.headers().get("mcp-session-id") {
        client.mcp_session = session.to_str().ok().map(str::to_owned);
    }
    let text = response.text().await.map_err(transport)?;
    if !(200..300).contains(&status) {
        return Err((Some(status), text));
    }
    let Some(id) = message.get("id") else {
        return Ok(Value::Null);
    };
    mcp_messages(&text)
        .into_iter()
        .find(|m| &m["id"] == id)
        .ok_or_else(|| (Some(status), format!("no answer with id {id}: {text}")))
}

/// After the run, each client's file holds exactly its last acknowledged write, both on the
/// host and as the runtime sees it.
async fn verify_no_write_lost(server: &TestServer, clients: &[Client], tally: &Tally) {
    let mut checked = 0;
    for client in clients {
        let Some(expected) = &client.last_written else {
            continue;
        };
        checked += 1;
        if let Err((status, what)) = read(server, client).await {
            tally.fail(
                status,
                format!("client {} after the run: {what}", client.index),
            );
        }
        if client.index % 10 == 0 {
            let seen = server
                .exec(&client.sandbox, &format!("cat {}", client.file))
                .await;
            if seen["stdout"].as_str() != Some(expected.as_str()) {
                tally.fail(
                    None,
                    format!("client {} inside its runtime: {seen}", client.index),
                );
            }
        }
    }
    println!("load: {checked} files checked against their last acknowledged write");
}

fn report(tally: &Tally, elapsed: Duration) {
    let completed = tally.completed.load(Ordering::Relaxed);
    println!(
        "load: {completed} operations in {:.1} s = {:.0} ops/s",
        elapsed.as_secs_f64(),
        completed as f64 / elapsed.as_secs_f64()
    );
    let mut latencies = tally.latencies.lock().unwrap();
    for op in Op::ALL {
        let Some(samples) = latencies.get_mut(&op) else {
            println!("{:<24} none completed", op.name());
            continue;
        };
        let count = samples.len();
        let p50 = percentile(samples, 0.5);
        let p99 = percentile(samples, 0.99);
        println!(
            "{:<24} {count:>8} ok  {:>7.0}/s  p50 {:>8.2} ms  p99 {:>8.2} ms",
            op.name(),
            count as f64 / elapsed.as_secs_f64(),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    println!(
        "load: {} 5xx, {} other failures",
        tally.server_errors.lock().unwrap().len(),
        tally.failures.lock().unwrap().len()
    );
}

async fn terminate_all(server: &Arc<TestServer>, sandboxes: &[String], tally: &Tally) {
    let results: Vec<(String, u16, Value)> = futures::stream::iter(sandboxes.iter().cloned())
        .map(|id| {
            let server = server.clone();
            async move {
                let (status, body) = server
                    .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
                    .await;
                (id, status, body)
            }
        })
        .buffered(16)
        .collect()
        .await;
    for (id, status, body) in results {
        if status != 200 || body["state"] != "terminated" {
            tally.fail(Some(status), format!("terminate {id}: {body}"));
        }
    }
}

/// Each sandbox's runtime as recorded while it ran: (init pid, its start time, cgroup name).
fn runtime_records(server: &TestServer, sandboxes: &[String]) -> Vec<(String, String, String)> {
    sandboxes
        .iter()
        .map(|id| {
            let record = server
                .data_dir()
                .join("runtimes")
                .join(id)
                .join("runtime.json");
            let identity: Value = serde_json::from_slice(
                &std::fs::read(&record).unwrap_or_else(|e| panic!("{}: {e}", record.display())),
            )
            .expect("runtime.json is JSON");
            let pid = identity["pid"].to_string();
            let started = start_time(&pid).unwrap_or_default();
            (
                id.clone(),
                format!("{pid}@{started}"),
                identity["cgroup"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, so a reused pid is told apart.
fn start_time(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(19).map(str::to_owned)
}

/// What the terminated sandboxes left: live inits, mounts, cgroups, runtime directories,
/// and processes in the runtimes' cgroups.
fn leftovers(
    server: &TestServer,
    sandboxes: &[String],
    runtimes: &[(String, String, String)],
) -> Vec<String> {
    let mut found = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    for line in mounts.lines().filter(|l| l.contains(&data_dir)) {
        found.push(format!("mount: {line}"));
    }
    let instance = docker_instance(&server.data_dir());
    let hierarchies: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for (id, handle, cgroup) in runtimes {
        let (pid, started) = handle.split_once('@').unwrap_or((handle, ""));
        if start_time(pid).is_some_and(|now| now == started) {
            found.push(format!("{id}: init {pid} still runs"));
        }
        for hierarchy in hierarchies.iter().chain([&"/sys/fs/cgroup".into()]) {
            for name in [cgroup.clone(), format!("{instance}-{id}")] {
                if name.is_empty() {
                    continue;
                }
                let dir = hierarchy.join("warren").join(&name);
                if dir.exists() {
                    found.push(format!("{id}: cgroup {}", dir.display()));
                }
            }
        }
    }
    for id in sandboxes {
        if server.data_dir().join("runtimes").join(id).exists() {
            found.push(format!("{id}: runtime directory"));
        }
    }
    // The server's own children: a finished runtime's launcher must have been reaped.
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", server.pid())) {
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace() {
                let stat =
                    std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
                found.push(format!("a child of the server: {}", stat.trim()));
            }
        }
    }
    found.dedup();
    found
}
