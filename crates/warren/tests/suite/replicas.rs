//! Several replicas on one PostgreSQL store and one shared workspace directory (issue 14):
//! one owner per runtime, runtime operations forwarded to it from any replica, takeover
//! with `node_lost` runs when the owner's lease lapses, and a paused owner whose late
//! writes are refused and whose stale runtime goes. Real processes with the native
//! runtime, on loopback; each replica has a data directory of its own.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::{ClusterFiles, S3Server, TestServer};

use super::bin;
use super::state_postgres::shared_postgres;

/// The node lease of these replicas: short, so takeovers happen within a test.
const TTL_S: u64 = 3;

pub(super) const CLUSTER_KEY: &str = "cluster-key-0123456789abcdef0123456789abcdef";

/// Replicas of one cluster: their servers, the database, the shared directory and, for
/// replicas on loopback, the S3 server their snapshots go to (replicas in namespaces of
/// their own keep snapshots in the shared directory: the S3 server listens on loopback).
pub(super) struct Cluster {
    pub(super) nodes: Vec<TestServer>,
    database: String,
    shared: tempfile::TempDir,
    _files: ClusterFiles,
    _s3: Option<S3Server>,
}

impl Cluster {
    pub(super) fn start(count: usize) -> Self {
        Self::start_on(count, None, "")
    }

    /// Replicas on loopback whose configuration also holds `config`.
    pub(super) fn start_configured(count: usize, config: &str) -> Self {
        Self::start_on(count, None, config)
    }

    /// Replicas on loopback, or each in its namespace of `bridge`, reaching PostgreSQL
    /// through the bridge's relay.
    fn start_on(count: usize, bridge: Option<&Bridge>, config: &str) -> Self {
        let mut database = shared_postgres().fresh_database();
        if let Some(bridge) = bridge {
            let direct = format!("127.0.0.1:{}", shared_postgres().port());
            database = database.replace(&direct, &bridge.pg_relay);
        }
        let shared = tempfile::tempdir().unwrap();
        let files = ClusterFiles::new(CLUSTER_KEY, TTL_S);
        let s3 = bridge.is_none().then(S3Server::start);
        if let Some(s3) = &s3 {
            files.add_config(&s3.snapshots_config());
        }
        if !config.is_empty() {
            files.add_config(config);
        }
        let nodes = (0..count)
            .map(|n| {
                let node_id = format!("node-{n}");
                let mut args = vec![
                    "--backend",
                    "local",
                    "--state",
                    &database,
                    "--workspace-dir",
                    shared.path().to_str().unwrap(),
                    "--node-id",
                    &node_id,
                    "--config",
                    files.config_arg(),
                ];
                match bridge {
                    Some(bridge) => {
                        let listen = format!("{}:0", bridge.address(n));
                        args.extend(["--listen", &listen]);
                        TestServer::start_logging_in_netns(bin(), &bridge.namespaces[n], &args)
                    }
                    None => TestServer::start_logging(bin(), &args),
                }
            })
            .collect();
        Self {
            nodes,
            database,
            shared,
            _files: files,
            _s3: s3,
        }
    }

    fn sql(&self, query: &str) -> String {
        let name = self.database.rsplit('/').next().unwrap();
        shared_postgres().psql_in(name, query).trim().to_owned()
    }

    /// The owner the store records for `sandbox`: node id and token.
    pub(super) fn owner(&self, sandbox: &str) -> String {
        self.sql(&format!(
            "SELECT coalesce(node_id, '-') || ' ' || token FROM runtime_owners \
             WHERE sandbox_id = '{sandbox}'"
        ))
    }

    /// Status and failure reason of every run of `sandbox`, oldest first.
    pub(super) fn runs(&self, sandbox: &str) -> Vec<String> {
        self.sql(&format!(
            "SELECT command || '|' || status || '|' || coalesce(failure_reason, '') || '|' || \
             coalesce(node_id, '') FROM runs WHERE sandbox_id = '{sandbox}' ORDER BY started_at"
        ))
        .lines()
        .map(str::to_owned)
        .collect()
    }
}

pub(super) async fn exec(server: &TestServer, sandbox: &str, command: &str) -> (u16, Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
                .json(&json!({ "command": command, "timeout_s": 60 })),
        )
        .await
}

/// The pids of processes whose command line starts with `command` (not the shells that
/// started them).
pub(super) fn processes_with(command: &str) -> Vec<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-f", &format!("^{command}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

fn runtime_dir(node: &TestServer, sandbox: &str) -> std::path::PathBuf {
    node.data_dir().join("runtimes").join(sandbox)
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[tokio::test]
async fn a_command_sent_to_any_replica_runs_in_the_one_runtime_its_owner_hosts() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    a.workdir("alice", "projects/one").await;
    let sandbox = a.sandbox("alice", "one", "projects/one").await;
    // The first command lands on node-0, which claims the runtime.
    let (status, first) = exec(a, &sandbox, "echo $$ > /home/gem/pid-file; echo made").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(cluster.owner(&sandbox), "node-0 1");
    // Through node-1 the command runs in the same runtime: /home/gem is the runtime's own.
    let request_id = "forwarded-request-7f3a";
    let (status, seen) = b
        .send_json(
            b.request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
                .header("x-request-id", request_id)
                .json(&json!({ "command": "cat /home/gem/pid-file && echo err >&2; exit 3" })),
        )
        .await;
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen["exit_code"], 3, "{seen}");
    assert_eq!(seen["stderr"], "err\n", "{seen}");
    assert!(!seen["stdout"].as_str().unwrap().is_empty(), "{seen}");
    assert!(
        !exists(&runtime_dir(b, &sandbox)),
        "node-1 started no runtime of its own"
    );
    // The owner ran and recorded it, under the caller's request id.
    let runs = cluster.runs(&sandbox);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[1].ends_with("|finished||node-0"), "{runs:?}");
    assert!(
        a.log_lines().iter().any(|line| line.contains(request_id)),
        "the owner logs the forwarded request under its id"
    );
    // node-1 now remembers the owner and forwards at once, without reading the sandbox
    // itself: a refusal comes from the owner, exactly as the owner gives it.
    let bad_cwd = json!({ "command": "true", "cwd": "../outside" });
    let mut answers = Vec::new();
    for server in [b, a] {
        let url = format!("/v1/sandboxes/{sandbox}/exec");
        answers.push(
            server
                .send_json(server.request(Method::POST, &url).json(&bad_cwd))
                .await,
        );
    }
    let [(via_b, refused_b), (via_a, refused_a)] = <[_; 2]>::try_from(answers).unwrap();
    assert_eq!(
        (via_b, &refused_b["error"]),
        (via_a, &refused_a["error"]),
        "{refused_b} vs {refused_a}"
    );
    assert!((400..500).contains(&via_a), "{refused_a}");
    // Streaming through node-1: output arrives as NDJSON events, then the exit.
    let response = b
        .request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "command": "echo one; sleep 0.2; echo two" }))
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        events.iter().filter(|e| e["type"] == "stdout").count() >= 1,
        "{text}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "exit", "{text}");
    assert_eq!(last["result"]["exit_code"], 0, "{text}");
    // `GET /v1/cluster` counts the runtime once, at its owner.
    let (_, info) = b.send_json(b.request(Method::GET, "/v1/cluster")).await;
    let count = |id: &str| {
        info["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node_id"] == id)
            .unwrap()["runtimes"]
            .clone()
    };
    assert_eq!(
        (count("node-0"), count("node-1")),
        (json!(1), json!(0)),
        "{info}"
    );
    // A runtime snapshot asked of node-1 is taken by the owner, recorded under its token.
    let (status, snapshot) = b
        .send_json(b.request(Method::POST, &format!("/v1/sandboxes/{sandbox}/snapshots")))
        .await;
    assert_eq!(status, 201, "{snapshot}");
    assert!(
        snapshot["snapshot_id"]
            .as_str()
            .unwrap()
            .starts_with("snap-"),
        "{snapshot}"
    );
    // Terminating through node-1 ends node-0's runtime.
    let ended = b.terminate(&sandbox).await;
    assert_eq!(ended["state"], "terminated", "{ended}");
    assert!(
        !exists(&runtime_dir(a, &sandbox)),
        "the owner's runtime is gone"
    );
    assert_eq!(cluster.owner(&sandbox), "- 1");
    // A command for it now gets the same refusal through either replica, whether or not
    // the one asked still remembers where the runtime ran.
    let (through_b, refused_b) = exec(b, &sandbox, "true").await;
    let (through_a, refused_a) = exec(a, &sandbox, "true").await;
    assert_eq!(
        (through_b, &refused_b["error"]["code"]),
        (through_a, &refused_a["error"]["code"]),
        "{refused_b} vs {refused_a}"
    );
    assert_eq!(through_a, 409, "{refused_a}");
}

#[tokio::test]
async fn a_client_leaving_a_forwarded_stream_kills_the_command_at_the_owner() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    a.workdir("alice", "projects/one").await;
    let sandbox = a.sandbox("alice", "one", "projects/one").await;
    let (status, _) = exec(a, &sandbox, "true").await;
    assert_eq!(status, 200);
    let marker = "4417.25";
    let response = b
        .request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "command": format!("echo started; sleep {marker}") }))
        .send()
        .await
        .unwrap();
    let mut response = response;
    let first = response.chunk().await.unwrap().unwrap();
    assert!(
        String::from_utf8_lossy(&first).contains("stdout"),
        "{first:?}"
    );
    assert_eq!(processes_with(&format!("sleep {marker}")).len(), 1);
    drop(response);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_with(&format!("sleep {marker}")).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        processes_with(&format!("sleep {marker}")).is_empty(),
        "the command was killed"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let runs = cluster.runs(&sandbox);
        if runs
            .last()
            .unwrap()
            .contains("|failed|client_disconnected|node-0")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{runs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_dead_owners_runtime_is_taken_over_from_its_latest_snapshot_with_its_runs_lost() {
    let mut cluster = Cluster::start(2);
    cluster.nodes[0].workdir("alice", "projects/one").await;
    let sandbox = cluster.nodes[0]
        .sandbox("alice", "one", "projects/one")
        .await;
    let a = &cluster.nodes[0];
    let (status, _) = exec(
        a,
        &sandbox,
        "echo installed > /home/gem/tool && echo kept > /home/gem/user-data/projects/one/notes.txt",
    )
    .await;
    assert_eq!(status, 200);
    let (status, snapshot) = a
        .send_json(a.request(Method::POST, &format!("/v1/sandboxes/{sandbox}/snapshots")))
        .await;
    assert_eq!(status, 201, "{snapshot}");
    // After the snapshot: what a takeover cannot bring back.
    let (status, _) = exec(a, &sandbox, "echo later > /home/gem/after-snapshot").await;
    assert_eq!(status, 200);
    // A command runs on node-0 when the node dies: the server by SIGKILL, and its
    // runtimes with it, as when the machine goes.
    let marker = "5521.5";
    let running = {
        let url = format!("{}/v1/sandboxes/{sandbox}/exec", a.url);
        let token = warren_test_support::TEST_TOKEN;
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&json!({ "command": format!("sleep {marker}"), "timeout_s": 120 }))
                .send()
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&format!("sleep {marker}")).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = Instant::now();
    cluster.nodes[0].kill();
    warren_test_support::reap_runtimes(&cluster.nodes[0].data_dir());
    let _ = running.await;
    // The next command, through node-1, waits out node-0's lease, takes the runtime over
    // and finds it as of the snapshot; the workspace is whole.
    let b = &cluster.nodes[1];
    let check = "cat /home/gem/tool; \
                 test -e /home/gem/after-snapshot && echo after || echo no-after; \
                 cat /home/gem/user-data/projects/one/notes.txt";
    // Until node-0's lease lapsed the command could only be forwarded to it, and failed.
    let (mut status, mut found) = exec(b, &sandbox, check).await;
    while status != 200 && killed_at.elapsed() < Duration::from_secs(TTL_S + 10) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        (status, found) = exec(b, &sandbox, check).await;
    }
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["stdout"], "installed\nno-after\nkept\n", "{found}");
    assert_eq!(cluster.owner(&sandbox), "node-1 2");
    // The environment came from the S3 server: nothing of it was in the shared directory.
    assert!(
        !cluster.shared.path().join("snapshots").exists(),
        "snapshots were kept in the shared directory, not in S3"
    );
    let runs = cluster.runs(&sandbox);
    let lost: Vec<_> = runs
        .iter()
        .filter(|run| run.starts_with(&format!("sleep {marker}|")))
        .collect();
    assert_eq!(lost.len(), 1, "{runs:?}");
    assert!(lost[0].contains("|failed|node_lost|node-0"), "{runs:?}");
    assert!(
        runs.iter().all(|run| !run.contains("|running|")),
        "no run is left without a final status: {runs:?}"
    );
}

#[tokio::test]
async fn a_paused_owner_past_its_lease_has_its_late_writes_refused_and_kills_its_stale_runtime() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    a.workdir("alice", "projects/one").await;
    let sandbox = a.sandbox("alice", "one", "projects/one").await;
    let (status, _) = exec(a, &sandbox, "echo on-a > /home/gem/where").await;
    assert_eq!(status, 200);
    let marker = "6633.5";
    // A command that ends while node-0 is stopped: its outcome reaches node-0 late.
    let running = {
        let url = format!("{}/v1/sandboxes/{sandbox}/exec", a.url);
        let token = warren_test_support::TEST_TOKEN;
        let command = format!("sleep {marker} & sleep 1; echo done-on-a");
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&json!({ "command": command, "timeout_s": 120 }))
                .send()
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&format!("sleep {marker}")).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(a.pid(), "STOP");
    tokio::time::sleep(Duration::from_secs(TTL_S + 1)).await;
    // node-1 takes over; node-0's runtime (its processes were not stopped) still runs.
    let (status, found) = exec(b, &sandbox, "cat /home/gem/where 2>&1; echo on-b").await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(cluster.owner(&sandbox), "node-1 2");
    assert!(!processes_with(&format!("sleep {marker}")).is_empty());
    signal(a.pid(), "CONT");
    // Its late outcome is refused: the run stays as the takeover recorded it.
    let answer = running.await.unwrap().unwrap();
    let late: Value = answer.json().await.unwrap();
    let runs = cluster.runs(&sandbox);
    let on_a: Vec<_> = runs
        .iter()
        .filter(|run| run.contains(&format!("sleep {marker}")))
        .collect();
    assert_eq!(on_a.len(), 1, "{runs:?}");
    assert!(
        on_a[0].contains("|failed|node_lost|node-0"),
        "{runs:?} {late}"
    );
    // node-0 fenced itself on waking and killed what it no longer owns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_with(&format!("sleep {marker}")).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        processes_with(&format!("sleep {marker}")).is_empty(),
        "the stale runtime's processes are gone"
    );
    assert!(
        a.log_lines()
            .iter()
            .any(|line| line.contains("fencing itself")),
        "node-0 says it fenced itself"
    );
    // It rejoins with a new epoch (refusing runtime work, 503 node_fenced, until it has),
    // and forwards to the new owner like any replica.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut status, mut again) = exec(a, &sandbox, "echo through-a").await;
    while status == 503 && Instant::now() < deadline {
        assert_eq!(again["error"]["code"], "node_fenced", "{again}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        (status, again) = exec(a, &sandbox, "echo through-a").await;
    }
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["stdout"], "through-a\n");
    assert_eq!(cluster.owner(&sandbox), "node-1 2");
    let epoch = cluster.sql("SELECT epoch FROM nodes WHERE node_id = 'node-0'");
    assert_eq!(epoch, "2", "node-0 joined again");
}

#[tokio::test]
async fn internal_routes_need_the_cluster_key_and_the_provisioner_token_is_not_it() {
    let cluster = Cluster::start(1);
    let a = &cluster.nodes[0];
    a.workdir("alice", "projects/one").await;
    let sandbox = a.sandbox("alice", "one", "projects/one").await;
    let url = format!("{}/internal/v1/sandboxes/{sandbox}/kill", a.url);
    for auth in [
        None,
        Some(warren_test_support::TEST_TOKEN),
        Some("wrong-key-0123456789abcdef0123456789"),
    ] {
        let mut request = reqwest::Client::new().post(&url);
        if let Some(auth) = auth {
            request = request.bearer_auth(auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{auth:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    }
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth(CLUSTER_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // A lone node without a key has no such routes.
    let lone = TestServer::start(bin());
    let response = reqwest::Client::new()
        .post(format!("{}/internal/v1/sandboxes/{sandbox}/kill", lone.url))
        .bearer_auth(CLUSTER_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

/// Writes files through whichever replicas are live, until told to stop; returns the
/// writes that were acknowledged.
fn write_under_load(
    live: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    sandbox: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut acknowledged = Vec::new();
        let mut n = 0u32;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let urls = live.lock().unwrap().clone();
            let url = &urls[n as usize % urls.len()];
            let name = format!("load-{n}.txt");
            let sent = client
                .put(format!("{url}/v1/sandboxes/{sandbox}/files?path={name}"))
                .bearer_auth(warren_test_support::TEST_TOKEN)
                .body(format!("write {n}\n"))
                .send()
                .await;
            if sent.is_ok_and(|r| r.status().is_success()) {
                acknowledged.push(name);
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        acknowledged
    })
}

#[tokio::test]
async fn a_rolling_restart_of_every_replica_loses_no_home_installed_file_or_acknowledged_write() {
    let mut cluster = Cluster::start(3);
    let mut sandboxes = Vec::new();
    for n in 0..3 {
        let node = &cluster.nodes[n];
        node.workdir(&format!("user{n}"), "projects/p").await;
        let sandbox = node.sandbox(&format!("user{n}"), "s", "projects/p").await;
        // Each replica owns one runtime, with state only the runtime holds.
        let (status, body) = exec(
            node,
            &sandbox,
            &format!(
                "echo home{n} > /home/gem/state && mkdir -p /usr/local/share/t && \
                 echo pkg{n} > /usr/local/share/t/pkg"
            ),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(cluster.owner(&sandbox), format!("node-{n} 1"));
        sandboxes.push(sandbox);
    }
    let live = std::sync::Arc::new(std::sync::Mutex::new(
        cluster
            .nodes
            .iter()
            .map(|n| n.url.clone())
            .collect::<Vec<_>>(),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = write_under_load(live.clone(), sandboxes[0].clone(), stop.clone());
    for n in 0..3 {
        // Out of the load balancer first, then drained by `warren drain`.
        live.lock()
            .unwrap()
            .retain(|url| *url != cluster.nodes[n].url);
        let drained = warren_test_support::run_to_exit(
            bin(),
            &[
                "drain",
                "--data-dir",
                cluster.nodes[n].data_dir().to_str().unwrap(),
            ],
            &[],
        );
        assert!(
            drained.status.success(),
            "{}",
            String::from_utf8_lossy(&drained.stderr)
        );
        let exited = cluster.nodes[n].wait_for_exit(Duration::from_secs(60));
        assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
        assert!(
            cluster.nodes[n]
                .log_lines()
                .iter()
                .any(|line| line.contains("drained")),
            "node-{n} says it drained"
        );
        // What it owned is handed back, with nothing left running there.
        assert_eq!(
            cluster.owner(&sandboxes[n]),
            "- 1",
            "node-{n}'s runtime went back"
        );
        assert!(!exists(&runtime_dir(&cluster.nodes[n], &sandboxes[n])));
        // Every sandbox, through another replica, is as it was.
        let other = &cluster.nodes[(n + 1) % 3];
        for (k, sandbox) in sandboxes.iter().enumerate() {
            let (status, found) =
                exec(other, sandbox, "cat /home/gem/state /usr/local/share/t/pkg").await;
            assert_eq!(status, 200, "{found}");
            assert_eq!(
                found["stdout"],
                format!("home{k}\npkg{k}\n"),
                "after node-{n}"
            );
        }
        cluster.nodes[n].start_again();
        live.lock().unwrap().push(cluster.nodes[n].url.clone());
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let acknowledged = load.await.unwrap();
    assert!(
        acknowledged.len() > 10,
        "the load ran: {}",
        acknowledged.len()
    );
    let reader = &cluster.nodes[0];
    for name in &acknowledged {
        let (status, _) = reader
            .send_json(reader.request(
                Method::GET,
                &format!("/v1/sandboxes/{}/files/stat?path={name}", sandboxes[0]),
            ))
            .await;
        assert_eq!(status, 200, "acknowledged write {name} is there");
    }
    let runs: Vec<String> = sandboxes.iter().flat_map(|s| cluster.runs(s)).collect();
    assert!(
        runs.iter().all(|run| !run.contains("|running|")),
        "every run has a final status: {runs:?}"
    );
    for sandbox in &sandboxes {
        let owners = cluster.sql(&format!(
            "SELECT count(*) FROM runtime_owners WHERE sandbox_id = '{sandbox}' AND node_id IS NOT NULL"
        ));
        assert!(owners == "0" || owners == "1", "{owners}");
    }
}

/// Network namespaces on a bridge of the test's own, one per replica, so a replica can
/// be cut off (its veth link down) while its processes keep running. PostgreSQL is
/// reached through a relay on the bridge's address (the shared server listens on
/// loopback only).
struct Bridge {
    name: String,
    subnet: String,
    namespaces: Vec<String>,
    host_links: Vec<String>,
    pg_relay: String,
    /// Whether an iptables rule lets the bridge's traffic through (removed on drop).
    firewalled: bool,
}

/// The iptables arguments that insert (`-I`) or delete (`-D`) the rule accepting traffic
/// from `bridge` to itself.
fn forward_rule<'a>(action: &'a str, bridge: &'a str) -> [&'a str; 8] {
    [
        action, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
    ]
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Bridge {
    fn new(count: usize) -> Self {
        let tag = std::process::id() % 10_000;
        let subnet = format!("10.231.{}", tag % 250);
        let name = format!("wbr{tag}");
        ip(&["link", "add", &name, "type", "bridge"]);
        ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &name]);
        ip(&["link", "set", &name, "up"]);
        // Replicas reach each other across the bridge, so the host's firewall sees that
        // traffic when bridged frames go through iptables (br_netfilter, loaded by dockerd,
        // which also sets FORWARD's policy to DROP): let this bridge's own traffic through,
        // as dockerd does for docker0, until the bridge goes.
        let firewalled = std::process::Command::new("iptables")
            .args(forward_rule("-I", &name))
            .status()
            .is_ok_and(|status| status.success());
        let mut bridge = Self {
            name,
            subnet,
            namespaces: Vec::new(),
            host_links: Vec::new(),
            pg_relay: String::new(),
            firewalled,
        };
        for n in 0..count {
            let netns = format!("wns{tag}-{n}");
            let host = format!("wvh{tag}-{n}");
            let inside = format!("wvn{tag}-{n}");
            ip(&["netns", "add", &netns]);
            bridge.namespaces.push(netns.clone());
            ip(&[
                "link", "add", &host, "type", "veth", "peer", "name", &inside,
            ]);
            bridge.host_links.push(host.clone());
            ip(&["link", "set", &inside, "netns", &netns]);
            ip(&["link", "set", &host, "master", &bridge.name, "up"]);
            let address = format!("{}/24", bridge.address(n));
            ip(&["-n", &netns, "addr", "add", &address, "dev", &inside]);
            ip(&["-n", &netns, "link", "set", &inside, "up"]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
        }
        bridge.pg_relay = relay(&format!("{}.1", bridge.subnet), shared_postgres().port());
        bridge
    }

    fn address(&self, n: usize) -> String {
        format!("{}.{}", self.subnet, 10 + n)
    }

    fn cut(&self, n: usize) {
        ip(&["link", "set", &self.host_links[n], "down"]);
    }

    fn heal(&self, n: usize) {
        ip(&["link", "set", &self.host_links[n], "up"]);
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth pair too; whatever is gone already is fine.
        let quiet = |args: &[&str]| {
            let _ = std::process::Command::new("ip")
                .args(args)
                .stderr(std::process::Stdio::null())
                .status();
        };
        for netns in &self.namespaces {
            quiet(&["netns", "del", netns]);
        }
        for link in &self.host_links {
            quiet(&["link", "del", link]);
        }
        quiet(&["link", "del", &self.name]);
        if self.firewalled {
            let _ = std::process::Command::new("iptables")
                .args(forward_rule("-D", &self.name))
                .status();
        }
    }
}

/// A TCP relay from `address` (a free port) to PostgreSQL on loopback, on a thread and
/// runtime of its own so a test blocking its own threads never stalls the replicas'
/// database traffic. Returns `host:port`.
fn relay(address: &str, pg_port: u16) -> String {
    let listener = std::net::TcpListener::bind(format!("{address}:0")).unwrap();
    let bound = listener.local_addr().unwrap().to_string();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", pg_port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
    });
    bound
}

/// `(token, unix nanoseconds)` of every tick a runtime appended to `file`.
fn ticks(file: &Path) -> Vec<(u64, u128)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (token, at) = line.split_once(' ')?;
            Some((token.parse().ok()?, at.trim().parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_owner_stops_its_runtime_before_another_replica_starts_one() {
    let bridge = Bridge::new(3);
    let cluster = Cluster::start_on(3, Some(&bridge), "");
    let nodes = &cluster.nodes;
    let owner = |sandbox: &str| cluster.owner(sandbox);
    nodes[0].workdir("alice", "projects/p").await;
    let sandbox = nodes[0].sandbox("alice", "s", "projects/p").await;
    let ticker = |token: u64| {
        json!({
            "command": "nohup sh -c 'while :; do echo \"$T $(date +%s%N)\" >> ticks; sleep 0.1; done' \
                        >/dev/null 2>&1 &",
            "env": { "T": token.to_string() },
        })
    };
    let started = nodes[0].exec_with(&sandbox, ticker(1)).await;
    assert_eq!(started["exit_code"], 0, "{started}");
    assert_eq!(owner(&sandbox), "node-0 1");
    let file = cluster
        .shared
        .path()
        .join("user-data/shared/alice/workspace/projects/p/ticks");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(ticks(&file).len() >= 5, "node-0's runtime ticks");

    // node-0 is cut off while its runtime writes to the shared workspace.
    bridge.cut(0);
    let cut_at = Instant::now();
    let b = &nodes[1];
    let (mut status, mut body) = exec(b, &sandbox, "true").await;
    while status != 200 && cut_at.elapsed() < Duration::from_secs(TTL_S + 15) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        (status, body) = exec(b, &sandbox, "true").await;
    }
    assert_eq!(status, 200, "node-1 takes the runtime over: {body}");
    assert_eq!(owner(&sandbox), "node-1 2");
    let restarted = b.exec_with(&sandbox, ticker(2)).await;
    assert_eq!(restarted["exit_code"], 0, "{restarted}");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // No two generations of the runtime ever ran at once: every tick of the cut-off
    // owner comes before the first of the new one.
    let all = ticks(&file);
    let last_old = all.iter().filter(|(t, _)| *t == 1).map(|(_, at)| *at).max();
    let first_new = all.iter().filter(|(t, _)| *t == 2).map(|(_, at)| *at).min();
    let (Some(last_old), Some(first_new)) = (last_old, first_new) else {
        panic!("both runtimes ticked: {all:?}");
    };
    assert!(
        last_old < first_new,
        "the cut-off runtime ticked {} ms after the new one began",
        (last_old - first_new) / 1_000_000
    );
    assert!(
        nodes[0]
            .log_lines()
            .iter()
            .any(|l| l.contains("fencing itself")),
        "node-0 fenced itself"
    );

    // Healed, node-0 joins again and serves the sandbox through its new owner.
    bridge.heal(0);
    let healed_at = Instant::now();
    let (mut status, mut again) = exec(&nodes[0], &sandbox, "echo via-node-0").await;
    while status != 200 && healed_at.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        (status, again) = exec(&nodes[0], &sandbox, "echo via-node-0").await;
    }
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["stdout"], "via-node-0\n");
    assert_eq!(owner(&sandbox), "node-1 2");
    // The replicas go before their namespaces.
    drop(cluster);
    drop(bridge);
}

#[tokio::test]
async fn a_forwarded_command_is_fenced_by_the_owner_with_the_callers_guard_token() {
    let cluster = Cluster::start(2);
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    a.workdir("alice", "projects/one").await;
    let sandbox = a.sandbox("alice", "one", "projects/one").await;
    let (status, _) = exec(a, &sandbox, "true").await;
    assert_eq!(status, 200);
    // Two holders in turn, through node-1: the first one's token is superseded.
    let acquire = |holder: &'static str| {
        b.request(Method::POST, &format!("/v1/sandboxes/{sandbox}/guard"))
            .json(&json!({ "holder": holder, "ttl_s": 30 }))
    };
    let (status, first) = b.send_json(acquire("worker-1")).await;
    assert_eq!(status, 201, "{first}");
    let old = first["token"].as_i64().unwrap();
    let (status, _) = b
        .send_json(b.request(
            Method::DELETE,
            &format!("/v1/sandboxes/{sandbox}/guard?token={old}"),
        ))
        .await;
    assert_eq!(status, 204);
    let (status, second) = b.send_json(acquire("worker-2")).await;
    assert_eq!(status, 201, "{second}");
    let new = second["token"].as_i64().unwrap();
    let fenced = |token: i64| {
        b.request(Method::POST, &format!("/v1/sandboxes/{sandbox}/exec"))
            .header("x-warren-fence", token.to_string())
            .json(&json!({ "command": "echo ran >> fenced.txt" }))
    };
    let (status, stale) = b.send_json(fenced(old)).await;
    assert_eq!(
        (status, &stale["error"]["code"]),
        (409, &json!("fence_stale")),
        "{stale}"
    );
    let (status, ran) = b.send_json(fenced(new)).await;
    assert_eq!(status, 200, "{ran}");
    let file = a
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{sandbox}/files?path=fenced.txt"),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(file, "ran\n", "only the current holder's command ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_server_whose_lease_lapses_in_a_database_outage_keeps_its_runtimes() {
    // A database of its own: this test stops it for longer than the node lease.
    let mut postgres = warren_test_support::PostgresServer::start();
    let database = postgres.fresh_database();
    let config = tempfile::tempdir().unwrap();
    let toml = config.path().join("warren.toml");
    std::fs::write(&toml, format!("[cluster]\nnode_ttl_s = {TTL_S}\n")).unwrap();
    let server = TestServer::start_logging(
        bin(),
        &[
            "--backend",
            "local",
            "--state",
            &database,
            "--config",
            toml.to_str().unwrap(),
        ],
    );
    server.workdir("alice", "projects/one").await;
    let sandbox = server.sandbox("alice", "one", "projects/one").await;
    let (status, _) = exec(&server, &sandbox, "echo kept > /home/gem/marker").await;
    assert_eq!(status, 200);
    postgres.stop();
    tokio::time::sleep(Duration::from_secs(TTL_S + 2)).await;
    postgres.resume();
    // Nobody else can take its runtimes: it joins again and keeps them, /home/gem and all.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut status, mut found) = exec(&server, &sandbox, "cat /home/gem/marker").await;
    while status != 200 && Instant::now() < deadline {
        assert_ne!(found["error"]["code"], "node_fenced", "{found}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        (status, found) = exec(&server, &sandbox, "cat /home/gem/marker").await;
    }
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["stdout"], "kept\n", "the same runtime: {found}");
    assert!(
        !server
            .log_lines()
            .iter()
            .any(|l| l.contains("fencing itself")),
        "a lone server never fences itself"
    );
}
