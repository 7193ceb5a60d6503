//! The code interpreter through `/v1/sandboxes/{id}/code` (issue 36), with the real binary
//! on every backend and tier that runs here: a kernel that keeps its state, rich results
//! streamed in order, contexts and their life, timeouts and callers that go away, secrets
//! masked, working directories that cannot leave the sandbox, the reaper, and the errors.

use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::TestServer;

use super::conformance::Host;

/// Runs code; the gathered answer.
async fn run(server: &TestServer, id: &str, body: Value) -> Value {
    let (status, answer) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/code/execute"))
                .json(&body),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// Runs code; its events as they streamed.
async fn stream(server: &TestServer, id: &str, body: Value) -> Vec<Value> {
    let response = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/code/execute"))
        .header("accept", "application/x-ndjson")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    events_of(&response.text().await.unwrap())
}

/// The events of a streamed execution's NDJSON.
fn events_of(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Interrupts context `context` of the sandbox whose contexts are at `base`.
async fn interrupt(server: &TestServer, base: &str, context: &str) {
    let (status, body) = send(
        server,
        Method::POST,
        &format!("{base}/{context}/interrupt"),
        json!({}),
    )
    .await;
    assert_eq!(status, 204, "{body}");
}

/// The main result's `text/plain`.
#[track_caller]
fn value_of(answer: &Value) -> &str {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["is_main_result"] == true)
        .and_then(|r| r["data"]["text/plain"].as_str())
        .unwrap_or_else(|| panic!("no main result: {answer}"))
}

async fn send(server: &TestServer, method: Method, path: &str, body: Value) -> (u16, Value) {
    server
        .send_json(server.request(method, path).json(&body))
        .await
}

async fn a_kernel_keeps_its_state_and_streams_rich_results_in_order(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "code", "projects/a").await;
    let first = run(&server, &id, json!({"code": "x = 20\nprint('set')\nx + 1"})).await;
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["stdout"], "set\n");
    assert_eq!(value_of(&first), "21");
    assert_eq!(first["context_id"], "default");
    let second = run(&server, &id, json!({"code": "x * 2"})).await;
    assert_eq!(value_of(&second), "40", "state kept: {second}");
    assert_eq!(
        second["execution_count"].as_i64(),
        first["execution_count"].as_i64().map(|n| n + 1)
    );

    // Streamed: each event as the kernel sends it, in order, the end last.
    let events = stream(
        &server,
        &id,
        json!({"code": "import sys, time\nprint('a')\nsys.stdout.flush()\ntime.sleep(0.2)\nprint('b', file=sys.stderr)\nsys.stderr.flush()\ntime.sleep(0.2)\nprint('c')\n'done'"}),
    )
    .await;
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            let text = e["text"]
                .as_str()
                .or_else(|| e["data"]["text/plain"].as_str())
                .or_else(|| e["status"].as_str())
                .unwrap_or("");
            (e["type"].as_str().unwrap(), text)
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("stdout", "a\n"),
            ("stderr", "b\n"),
            ("stdout", "c\n"),
            ("result", "'done'"),
            ("end", "ok"),
        ],
        "{events:?}"
    );

    // A plot is a PNG, and an HTML table and JSON keep their MIME types.
    let plot = run(
        &server,
        &id,
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"}),
    )
    .await;
    let png = plot["results"][0]["data"]["image/png"]
        .as_str()
        .unwrap_or_else(|| panic!("no PNG: {plot}"));
    let png = base64::engine::general_purpose::STANDARD
        .decode(png.trim())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(plot["results"][0]["is_main_result"], false);
    let rich = run(
        &server,
        &id,
        json!({"code": "from IPython.display import HTML, JSON, display\ndisplay(HTML('<b>bold</b>'))\ndisplay(JSON({'k': [1, 2]}))"}),
    )
    .await;
    assert_eq!(rich["results"][0]["data"]["text/html"], "<b>bold</b>");
    assert_eq!(
        rich["results"][1]["data"]["application/json"],
        json!({"k": [1, 2]})
    );

    // An exception: its name, value and traceback; the state stays.
    let failed = run(
        &server,
        &id,
        json!({"code": "def f():\n    return 1 / 0\nf()"}),
    )
    .await;
    assert_eq!(failed["status"], "error");
    assert_eq!(failed["error"]["name"], "ZeroDivisionError");
    assert_eq!(failed["error"]["value"], "division by zero");
    let traceback = failed["error"]["traceback"].to_string();
    assert!(
        traceback.contains("Traceback (most recent call last)") && traceback.contains("line 2"),
        "{traceback}"
    );
    assert_eq!(
        value_of(&run(&server, &id, json!({"code": "x"})).await),
        "20"
    );

    // Output that bypasses Python's streams (a child process writing to fd 1) never lands
    // between the driver's event lines. ipykernel forwards it from the fd by a thread of
    // its own: on a loaded host it can come after the cell's end, and then it is not part
    // of the execution; when it comes in time, it is stdout.
    let child = run(
        &server,
        &id,
        json!({"code": "import subprocess\nsubprocess.run(['echo', 'from-a-child'])\n'after'"}),
    )
    .await;
    assert_eq!(child["status"], "ok", "{child}");
    assert_eq!(value_of(&child), "'after'");
    assert!(
        child["stdout"] == "from-a-child\n" || child["stdout"] == "",
        "{child}"
    );

    // Environment and working directory for one execution only.
    let once = run(
        &server,
        &id,
        json!({"code": "import os\nos.environ.get('ONCE'), os.getcwd()", "env": {"ONCE": "yes"}, "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(value_of(&once), "('yes', '/tmp')");
    let after = run(
        &server,
        &id,
        json!({"code": "os.environ.get('ONCE'), os.getcwd() == '/tmp'"}),
    )
    .await;
    assert_eq!(value_of(&after), "(None, False)");

    // Each execution is a run of its own (I22), beside its context's one process run.
    let (status, runs) = send(
        &server,
        Method::GET,
        &format!("/v1/sandboxes/{id}/runs?limit=100"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{runs}");
    let code: Vec<&Value> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "code")
        .collect();
    assert_eq!(code.len(), 10, "{runs}");
    assert!(code
        .iter()
        .all(|r| r["tag"] == "default" && r["status"] == "finished"));
    let failed_run = code
        .iter()
        .find(|r| r["command"].as_str().unwrap().starts_with("def f():"))
        .expect("the failing execution's run");
    assert_eq!(failed_run["exit_code"], 1, "{failed_run}");
    let first_run = code
        .iter()
        .find(|r| r["command"] == "x = 20\nprint('set')\nx + 1")
        .expect("the first execution's run");
    assert_eq!(first_run["exit_code"], 0, "{first_run}");
}

async fn contexts_are_created_listed_restarted_interrupted_and_removed(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "ctx", "projects/a").await;
    let base = format!("/v1/sandboxes/{id}/code/contexts");
    let (status, made) = send(
        &server,
        Method::POST,
        &base,
        json!({"id": "nb", "cwd": "/tmp", "env": {"MODE": "nb"}}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        (&made["id"], &made["language"], &made["cwd"], &made["env"]),
        (
            &json!("nb"),
            &json!("python"),
            &json!("/tmp"),
            &json!({"MODE": "nb"})
        )
    );
    // Its own state, directory and environment, apart from the default context's.
    run(&server, &id, json!({"code": "owner = 'default'"})).await;
    run(
        &server,
        &id,
        json!({"code": "owner = 'nb'", "context": "nb"}),
    )
    .await;
    let seen = run(
        &server,
        &id,
        json!({"code": "import os\nowner, os.getcwd(), os.environ['MODE']", "context": "nb"}),
    )
    .await;
    assert_eq!(value_of(&seen), "('nb', '/tmp', 'nb')");
    assert_eq!(
        value_of(&run(&server, &id, json!({"code": "owner"})).await),
        "'default'"
    );
    // Creates of one id that race make one context.
    let racing = (0..4).map(|_| send(&server, Method::POST, &base, json!({"id": "race"})));
    let mut statuses: Vec<u16> = futures::future::join_all(racing)
        .await
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, vec![201, 409, 409, 409]);
    let (status, _) = send(&server, Method::DELETE, &format!("{base}/race"), json!({})).await;
    assert_eq!(status, 204);
    let (status, again) = send(&server, Method::POST, &base, json!({"id": "nb"})).await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("code_context_exists"))
    );

    let (_, listed) = send(&server, Method::GET, &base, json!({})).await;
    let ids: Vec<&str> = listed["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    // Oldest first: nb was made before the default context's first execution.
    assert_eq!(ids, vec!["nb", "default"], "{listed}");
    // Each is one of the sandbox's processes, tagged.
    let (_, processes) = send(
        &server,
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes"),
        json!({}),
    )
    .await;
    let tags: Vec<&str> = processes["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["status"] == "running")
        .filter_map(|p| p["tag"].as_str())
        .collect();
    assert!(tags.contains(&"code:python:nb"), "{processes}");

    // Interrupt: the running execution ends with KeyboardInterrupt; the state stays.
    let looping = tokio::spawn({
        let (url, token, id) = (server.url.clone(), server.token.clone(), id.clone());
        async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/sandboxes/{id}/code/execute"))
                .bearer_auth(token)
                .json(
                    &json!({"code": "import time\nwhile True: time.sleep(0.05)", "context": "nb"}),
                )
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let interrupted = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        interrupt(&server, &base, "nb").await;
        if looping.is_finished() {
            break looping.await.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the interrupt never ended the loop"
        );
    };
    assert_eq!(
        interrupted["error"]["name"], "KeyboardInterrupt",
        "{interrupted}"
    );
    assert_eq!(
        value_of(&run(&server, &id, json!({"code": "owner", "context": "nb"})).await),
        "'nb'"
    );

    // An interrupt that lands while IPython shows a failed cell's traceback stops the
    // display (IPython then only prints "KeyboardInterrupt" to stderr): the execution
    // still ends with its error, named.
    let slow_error = "import time\nclass SlowError(Exception):\n    def _render_traceback_(self):\n        print('showing', flush=True)\n        time.sleep(60)\n        return []\nraise SlowError('slow to show')";
    let mut response = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/code/execute"))
        .header("accept", "application/x-ndjson")
        .json(&json!({"code": slow_error, "context": "nb"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let mut interrupted = false;
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if !interrupted && text.contains("showing") {
            interrupted = true;
            interrupt(&server, &base, "nb").await;
        }
    }
    let events = events_of(&text);
    let error = events
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("no error event: {events:?}"));
    assert_eq!(
        (&error["name"], &error["value"]),
        (&json!("SlowError"), &json!("slow to show")),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap()["status"], "error", "{events:?}");

    // Restart: the state is gone; the id, directory and environment stay.
    let (status, restarted) = send(
        &server,
        Method::POST,
        &format!("{base}/nb/restart"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{restarted}");
    assert_eq!(
        (&restarted["cwd"], &restarted["env"]),
        (&json!("/tmp"), &json!({"MODE": "nb"}))
    );
    assert_ne!(restarted["pid"], made["pid"]);
    let gone = run(&server, &id, json!({"code": "owner", "context": "nb"})).await;
    assert_eq!(gone["error"]["name"], "NameError", "{gone}");

    // Remove: gone from the list, and its name is free again.
    let (status, _) = send(&server, Method::DELETE, &format!("{base}/nb"), json!({})).await;
    assert_eq!(status, 204);
    let (status, body) = send(&server, Method::GET, &format!("{base}/nb"), json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("code_context_not_found"))
    );
    let (status, body) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/execute"),
        json!({"code": "1", "context": "nb"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("code_context_not_found"))
    );
}

async fn driver_log(server: &TestServer, id: &str) -> String {
    let (_, list) = send(
        server,
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes"),
        json!({}),
    )
    .await;
    let mut out = String::new();
    for p in list["processes"].as_array().unwrap() {
        let pid = p["pid"].as_i64().unwrap();
        let events = super::processes::follow(server, id, pid, 0).await;
        out.push_str(&format!("== {} {}\n", p["tag"], p["status"]));
        for e in events {
            if let Some(data) = e["data"].as_str() {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap();
                let text = String::from_utf8_lossy(&bytes);
                out.push_str(&format!(
                    "[{}] {}\n",
                    e["type"],
                    text.chars().take(300).collect::<String>()
                ));
            }
        }
    }
    out
}

async fn a_timeout_or_a_caller_that_goes_away_interrupts_only_its_execution(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "time", "projects/a").await;
    // The first execution starts the kernel, which takes longer than its timeout: it
    // never runs, and says so.
    let early = run(
        &server,
        &id,
        json!({"code": "import time\ntime.sleep(30)", "timeout_s": 1}),
    )
    .await;
    assert_eq!(early["status"], "timeout", "{early}");
    assert_eq!(early["error"]["name"], "KeyboardInterrupt", "{early}");
    run(&server, &id, json!({"code": "kept = 'yes'"})).await;
    let timed = run(
        &server,
        &id,
        json!({"code": "import time\nwhile True: time.sleep(0.05)", "timeout_s": 1}),
    )
    .await;
    assert_eq!(timed["status"], "timeout", "{timed}");
    assert_eq!(timed["error"]["name"], "KeyboardInterrupt");
    let kept = run(&server, &id, json!({"code": "kept"})).await;
    if kept["results"].as_array().unwrap().is_empty() {
        panic!(
            "no value after the timeout: {kept}\n{}",
            driver_log(&server, &id).await
        );
    }
    assert_eq!(value_of(&kept), "'yes'");

    // A kernel that ignores the interrupt: its context is started anew, and says so.
    let stubborn = run(
        &server,
        &id,
        json!({"code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", "timeout_s": 1}),
    )
    .await;
    assert_eq!(stubborn["status"], "timeout", "{stubborn}");
    assert_eq!(stubborn["error"]["name"], "TimeoutError");
    let fresh = run(&server, &id, json!({"code": "kept"})).await;
    assert_eq!(fresh["error"]["name"], "NameError", "{fresh}");

    // A caller that goes away mid-execution interrupts it: the next one runs at once.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let abandoned = client
        .post(format!("{}/v1/sandboxes/{id}/code/execute", server.url))
        .bearer_auth(&server.token)
        .json(&json!({"code": "import time\nfor _ in range(600): time.sleep(0.1)"}))
        .send()
        .await;
    assert!(abandoned.is_err(), "the caller gave up: {abandoned:?}");
    let started = Instant::now();
    let next = run(&server, &id, json!({"code": "'next'"})).await;
    if next["results"].as_array().unwrap().is_empty() {
        panic!(
            "no value after the abandoned execution: {next}\n{}",
            driver_log(&server, &id).await
        );
    }
    assert_eq!(value_of(&next), "'next'");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the abandoned loop still held the kernel: {:?}",
        started.elapsed()
    );
}

async fn secrets_are_masked_in_every_output_of_an_execution(host: Host) {
    let server = host.start();
    let secret = "s3cr3t-code-value";
    let (status, _) = server
        .send_json(
            server
                .request(Method::PUT, "/v1/users/alice/env/API_KEY")
                .json(&json!({ "value": secret })),
        )
        .await;
    assert!(status == 200 || status == 201);
    let id = server.sandbox("alice", "secret", "projects/a").await;
    let answer = run(
        &server,
        &id,
        json!({"code": "import os, sys\nk = os.environ['API_KEY']\nprint(k)\nprint(k, file=sys.stderr)\nfrom IPython.display import JSON, display\ndisplay(JSON({'key': k}))\nraise ValueError(k)"}),
    )
    .await;
    let text = answer.to_string();
    assert!(!text.contains(secret), "a secret leaked: {text}");
    assert_eq!(answer["stdout"], "[masked:API_KEY]\n");
    assert_eq!(answer["stderr"], "[masked:API_KEY]\n");
    assert_eq!(answer["error"]["value"], "[masked:API_KEY]");
    assert_eq!(
        answer["results"][0]["data"]["application/json"],
        json!({"key": "[masked:API_KEY]"})
    );
}

async fn working_directories_and_context_ids_cannot_leave_the_sandbox(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "paths", "projects/a").await;
    // Another uid's workspace, a link out, and `..` out of every root.
    let _ = server.sandbox("bob", "paths", "projects/b").await;
    server
        .exec(&id, "ln -sfn /etc out-link && mkdir -p real")
        .await;
    for cwd in [
        "/home/gem/user-data/projects/a/../../../../etc",
        "../../../../../etc",
        "out-link",
        "/home/gem/user-data/projects/b",
        "/var/lib/warren",
    ] {
        let (status, body) = send(
            &server,
            Method::POST,
            &format!("/v1/sandboxes/{id}/code/execute"),
            json!({"code": "import os; os.getcwd()", "cwd": cwd}),
        )
        .await;
        if status == 200 && body["status"] == "error" {
            // Not there in the runtime's own view: nothing ran.
            assert_eq!(body["error"]["name"], "FileNotFoundError", "{cwd}: {body}");
        } else if status == 200 {
            // Only a directory of the runtime's own view may be entered, never a host one.
            let inside = value_of(&body).trim_matches('\'').to_owned();
            assert!(
                !inside.contains("projects/b") && !inside.contains("/var/lib/warren"),
                "{cwd} -> {inside}"
            );
        } else {
            assert_eq!(status, 400, "{cwd}: {body}");
        }
        let (status, body) = send(
            &server,
            Method::POST,
            &format!("/v1/sandboxes/{id}/code/contexts"),
            json!({"cwd": cwd}),
        )
        .await;
        if status == 201 {
            let cwd_seen = body["cwd"].as_str().unwrap();
            assert!(
                !cwd_seen.contains("projects/b") && !cwd_seen.contains("/var/lib/warren"),
                "{cwd} -> {body}"
            );
        } else {
            assert!(status == 400 || status == 422, "{cwd}: {status} {body}");
        }
    }
    for bad in ["../x", "a/b", "a:b", "", "x y"] {
        let (status, body) = send(
            &server,
            Method::POST,
            &format!("/v1/sandboxes/{id}/code/contexts"),
            json!({"id": bad}),
        )
        .await;
        assert_eq!(status, 400, "{bad:?}: {body}");
    }
    // The token is refused in code and in its environment.
    let (status, body) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/execute"),
        json!({"code": format!("t = '{}'", server.token)}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("token_in_command")),
        "{body}"
    );
    let (status, body) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/execute"),
        json!({"code": "1", "env": {"T": server.token}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("token_in_env")),
        "{body}"
    );
}

async fn code_errors_are_clear(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "errs", "projects/a").await;
    let execute = format!("/v1/sandboxes/{id}/code/execute");
    let (status, body) = send(
        &server,
        Method::POST,
        &execute,
        json!({"code": "1", "language": "cobol"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("unsupported_language"))
    );
    let (status, body) = send(
        &server,
        Method::POST,
        &execute,
        json!({"code": "1", "language": "python", "context": "default"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, _) = send(
        &server,
        Method::POST,
        &execute,
        json!({"code": "x".repeat((1 << 20) + 1)}),
    )
    .await;
    assert_eq!(status, 400);
    // A working directory that is not there: the execution says so, and runs nothing.
    let missing = run(
        &server,
        &id,
        json!({"code": "ran = True", "cwd": "/nonexistent/dir"}),
    )
    .await;
    assert_eq!(missing["status"], "error", "{missing}");
    assert_eq!(missing["error"]["name"], "FileNotFoundError", "{missing}");
    let ran = run(&server, &id, json!({"code": "'ran' in dir()"})).await;
    assert_eq!(value_of(&ran), "False");
    let (status, body) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/contexts"),
        json!({"cwd": "/nonexistent/dir"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("process_not_started")),
        "{body}"
    );
    // A runtime whose python cannot start the driver says what it lacks.
    let (status, body) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/contexts"),
        json!({"env": {"PYTHONHOME": "/nonexistent"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("code_interpreter_unavailable")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(
        message.matches("cannot run a code interpreter").count(),
        1,
        "said once: {message}"
    );
    assert!(
        message.contains("the driver ended before it was ready"),
        "{message}"
    );
    // Nothing is left of the failed contexts: only the default one is there.
    let (_, listed) = send(
        &server,
        Method::GET,
        &format!("/v1/sandboxes/{id}/code/contexts"),
        json!({}),
    )
    .await;
    let ids: Vec<&str> = listed["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["default"], "{listed}");
}

on_every_host!(
    a_kernel_keeps_its_state_and_streams_rich_results_in_order,
    contexts_are_created_listed_restarted_interrupted_and_removed,
    a_timeout_or_a_caller_that_goes_away_interrupts_only_its_execution,
    secrets_are_masked_in_every_output_of_an_execution,
    working_directories_and_context_ids_cannot_leave_the_sandbox,
    code_errors_are_clear,
);

/// An idle kernel does not keep its runtime: the reaper ends it as if nothing ran, while
/// an execution longer than the idle timeout keeps it.
#[tokio::test]
async fn an_idle_kernel_lets_its_runtime_be_reaped_but_an_execution_keeps_it() {
    let server = TestServer::start_with(
        super::bin(),
        &[
            "--backend",
            "local",
            "--idle-timeout",
            "3",
            "--reap-interval",
            "1",
        ],
    );
    let id = server.sandbox("alice", "reap", "projects/a").await;
    // Busy for twice the idle timeout: not reaped meanwhile.
    let busy = run(
        &server,
        &id,
        json!({"code": "import time\ntime.sleep(7)\n'slept'"}),
    )
    .await;
    assert_eq!(value_of(&busy), "'slept'", "{busy}");
    assert_eq!(server.sandbox_state(&id).await, "running");
    // Idle with its kernel running: reaped like any idle runtime (3 s, a 1 s interval,
    // and 4 s for the pass and this poll).
    let bound = Duration::from_secs(3 + 1 + 4);
    assert!(
        server.reaches_state(&id, "stopped", bound).await,
        "the idle kernel kept its runtime for {bound:?} (state {})",
        server.sandbox_state(&id).await
    );
    // The next execution starts a fresh runtime and kernel.
    let after = run(&server, &id, json!({"code": "'again'"})).await;
    assert_eq!(value_of(&after), "'again'");
}

/// bash in a kernel (bash_kernel, which scripts/test installs for the host's python3, the
/// local backend's root): the shell's variables and directory stay between executions,
/// an execution's own environment and directory are put back after it, a failing command
/// is an error, a timeout interrupts the command and keeps the shell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bash_kernel_keeps_its_shell_between_executions() {
    let server = Host::Local.start();
    let id = server.sandbox("alice", "bash", "projects/a").await;
    let (status, made) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/contexts"),
        json!({"id": "sh", "language": "bash"}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["language"], "bash");
    let sh = |code: &str| json!({"code": code, "context": "sh"});
    run(&server, &id, sh("X=5; cd /tmp")).await;
    let kept = run(&server, &id, sh("echo $X $PWD")).await;
    assert_eq!(
        (&kept["status"], &kept["stdout"]),
        (&json!("ok"), &json!("5 /tmp\n")),
        "{kept}"
    );
    let once = run(
        &server,
        &id,
        json!({"code": "echo $ONCE; pwd", "context": "sh", "env": {"ONCE": "it's once"}, "cwd": "/"}),
    )
    .await;
    assert_eq!(once["stdout"], "it's once\n/\n", "{once}");
    let after = run(&server, &id, sh("echo ${ONCE-unset}; pwd")).await;
    assert_eq!(after["stdout"], "unset\n/tmp\n", "{after}");
    let failed = run(&server, &id, sh("false")).await;
    assert_eq!(failed["status"], "error", "{failed}");
    let slow = run(
        &server,
        &id,
        json!({"code": "sleep 30", "context": "sh", "timeout_s": 2}),
    )
    .await;
    assert_eq!(slow["status"], "timeout", "{slow}");
    let still = run(&server, &id, sh("echo $X")).await;
    assert_eq!(still["stdout"], "5\n", "the shell stayed: {still}");
    // Without a context, bash's own default context, apart from Python's.
    let plain = run(&server, &id, json!({"code": "echo hi", "language": "bash"})).await;
    assert_eq!(
        (&plain["context_id"], &plain["stdout"]),
        (&json!("default-bash"), &json!("hi\n")),
        "{plain}"
    );
}

/// An image without a bash kernel (the Docker test image has none) says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_without_a_bash_kernel_says_what_it_lacks() {
    let server = Host::Docker.start();
    let id = server.sandbox("alice", "nobash", "projects/a").await;
    let (status, body) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/code/contexts"),
        json!({"language": "bash"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("code_interpreter_unavailable")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no Jupyter kernel 'bash'"), "{message}");
}
