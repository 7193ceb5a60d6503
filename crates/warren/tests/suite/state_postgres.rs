//! warren serving on a PostgreSQL state store (issue 13): the same API with its state in a
//! real PostgreSQL server, snapshots kept in that database, a restart of warren that
//! keeps everything, and a restart of the database under load that costs 503s and nothing
//! else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_store::PostgresStore;
use warren_test_support::{PostgresServer, TestServer};

/// One cluster for this test binary; each test takes a database of its own.
pub(super) fn shared_postgres() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start)
}

fn serve_on(url: &str, backend: &str, config: Option<&tempfile::NamedTempFile>) -> TestServer {
    let mut args = vec!["--backend", backend, "--state", url];
    if let Some(config) = config {
        args.extend(["--config", config.path().to_str().unwrap()]);
    }
    TestServer::start_with(super::bin(), &args)
}

/// `warren serve` on the memory backend and the state store `url`, in a fresh data
/// directory, for a start that is expected to fail: its exit status and output.
fn serve_until_it_exits(url: &str) -> std::process::Output {
    let data = tempfile::tempdir().unwrap();
    warren_test_support::run_to_exit(
        super::bin(),
        &[
            "serve",
            "--backend",
            "memory",
            "--state",
            url,
            "--data-dir",
            data.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("WARREN_TOKEN", warren_test_support::TEST_TOKEN)],
    )
}

/// How many rows of `table` match `condition`, read straight from the database.
fn count(server: &PostgresServer, url: &str, table: &str, condition: &str) -> i64 {
    server
        .psql_in(
            url,
            &format!("SELECT COUNT(*) FROM {table} WHERE {condition}"),
        )
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_server_on_postgres_runs_commands_and_keeps_checkpoints_in_the_database_across_a_restart()
{
    let postgres = shared_postgres();
    let url = postgres.fresh_database();
    let config = super::write_config("[snapshots]\nstore = \"sql\"\n");
    let mut server = serve_on(&url, "local", Some(&config));
    let id = server.sandbox("alice", "t", "projects/a").await;

    let result = server
        .exec(&id, "echo kept > notes.md && cat notes.md")
        .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/checkpoints")))
        .await;
    assert_eq!(status, 201, "{body}");
    let checkpoint = body["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The chunks and the manifest are rows of the PostgreSQL database, not files.
    assert!(count(postgres, &url, "snapshot_objects", "key LIKE 'manifests/%'") >= 1);
    assert!(!server.data_dir().join("snapshots").exists());
    assert_eq!(
        count(
            postgres,
            &url,
            "runs",
            &format!("sandbox_id = '{id}' AND status = 'finished'")
        ),
        1
    );

    server.restart_after_kill();
    // Restart recovery ran against the database; the sandbox and its checkpoint are there.
    let (status, body) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
        .await;
    assert_eq!(status, 200, "{body}");
    let result = server.exec(&id, "echo changed > notes.md").await;
    assert_eq!(result["exit_code"], 0, "{result}");
    let (status, body) = server
        .send_json(server.request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/checkpoints/{checkpoint}/restore"),
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let result = server.exec(&id, "cat notes.md").await;
    assert_eq!(result["stdout"], "kept\n", "{result}");
    assert_eq!(
        count(postgres, &url, "runs", &format!("sandbox_id = '{id}'")),
        3,
        "every command is recorded once"
    );
}

#[tokio::test]
async fn a_state_url_warren_cannot_reach_stops_it_with_a_message_naming_the_store() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://warren:hunter2@127.0.0.1:{port}/warren");
    let out = serve_until_it_exits(&url);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot open the state store"), "{stderr}");
    assert!(stderr.contains("PostgreSQL server"), "{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "the password must not be printed: {stderr}"
    );
}

#[tokio::test]
async fn a_second_server_on_the_same_database_is_refused_until_the_first_stops() {
    let postgres = shared_postgres();
    let url = postgres.fresh_database();
    let mut first = serve_on(&url, "memory", None);
    let out = serve_until_it_exits(&url);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another warren server is using this PostgreSQL database"),
        "{stderr}"
    );

    // A server that dies, however it dies, frees the database.
    first.kill();
    let third = serve_on(&url, "memory", None);
    let (status, _) = third
        .send_json(third.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(status, 200);
}

/// One request of the load: what it was and how it was answered.
struct Answer {
    what: &'static str,
    status: u16,
    body: serde_json::Value,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restart_under_load_costs_503s_and_nothing_else() {
    // A server of its own: this test stops it.
    let mut postgres = PostgresServer::start();
    let url = postgres.fresh_database();
    let server = Arc::new(serve_on(&url, "local", None));
    let id = server.sandbox("alice", "load", "projects/a").await;
    server.workdir("bob", "projects/b").await;

    // A command that starts before the database goes away and ends while it is away: its
    // outcome must still be recorded, once the database is back.
    let long = {
        let server = Arc::clone(&server);
        let id = id.clone();
        tokio::spawn(async move { server.exec(&id, "sleep 2; echo survived").await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&postgres, &url, "runs", "status = 'running'") == 0 {
        assert!(Instant::now() < deadline, "the long command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..6)
        .map(|worker| {
            let server = Arc::clone(&server);
            let stop = Arc::clone(&stop);
            let id = id.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let (what, request) = match n % 3 {
                        0 => (
                            "get",
                            server.request(Method::GET, &format!("/v1/sandboxes/{id}")),
                        ),
                        1 => (
                            "create",
                            server.request(Method::POST, "/v1/sandboxes").json(&json!({
                                "uid": "bob",
                                "runtime_scope_id": format!("w{worker}-{n}"),
                                "workdir": "projects/b",
                            })),
                        ),
                        _ => (
                            "write",
                            server
                                .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                                .query(&[("path", format!("w{worker}.txt"))])
                                .body(format!("{n}\n")),
                        ),
                    };
                    let (status, body) = server.send_json(request).await;
                    answers.push(Answer { what, status, body });
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                answers
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(300)).await;
    postgres.stop();
    // Longer than a request waits for a connection: a request that meets a shorter outage
    // is only delayed (and succeeds), so only an outage past the wait makes 503s certain.
    let outage = PostgresStore::ACQUIRE_TIMEOUT + Duration::from_secs(2);
    tokio::time::sleep(outage).await;
    postgres.resume();
    // Service resumes by itself: no restart of warren.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = server
            .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
            .await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "warren did not serve again: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for worker in workers {
        answers.extend(worker.await.unwrap());
    }

    let mut unavailable = 0;
    for answer in &answers {
        match answer.status {
            200 | 201 => {}
            503 => {
                assert_eq!(
                    answer.body["error"]["code"], "state_store_unavailable",
                    "{} answered {}",
                    answer.what, answer.body
                );
                unavailable += 1;
            }
            other => panic!("{} answered {other}: {}", answer.what, answer.body),
        }
    }
    assert!(
        unavailable > 0,
        "the database was down for {outage:?}, longer than a request waits, yet nothing failed"
    );
    assert!(
        answers.iter().any(|a| a.status / 100 == 2),
        "nothing succeeded around the restart"
    );

    let long = long.await.unwrap();
    assert_eq!(long["stdout"], "survived\n", "{long}");
    assert_eq!(count(&postgres, &url, "runs", "status = 'running'"), 0);
    // Every create answered 201 made exactly its sandbox; none answered 503 made one.
    let created: Vec<&str> = answers
        .iter()
        .filter(|a| a.what == "create" && a.status == 201)
        .map(|a| a.body["sandbox_id"].as_str().unwrap())
        .collect();
    let (status, listing) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes?uid=bob"))
        .await;
    assert_eq!(status, 200, "{listing}");
    let listed = listing["sandboxes"].as_array().unwrap();
    for id in &created {
        assert!(
            listed.iter().any(|s| s["sandbox_id"] == *id),
            "{id} is missing"
        );
    }
}
