//! Persistent shell sessions through the AIO sandbox API (`/v1/shell/*`, `/v1/bash/*`,
//! issue 16) on the real local backend: one real shell per session, state that carries
//! over within a session and never crosses to another, exact output, timeouts that kill
//! trees and leave the shell, and every command in the run records (I22).

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::{TestServer, TEST_TOKEN};

use super::conformance::Host;
use super::{bin, write_config};

const KEY: &str = "deerflow-key-0123456789abcdef0123456789abcdef";

/// A local-backend server with DeerFlow's APIs on, and one DeerFlow sandbox in it.
struct Aio {
    server: TestServer,
    _config: Option<tempfile::NamedTempFile>,
    http: reqwest::Client,
    /// The sandbox's AIO base URL (its capability URL).
    url: String,
    /// DeerFlow's id of the sandbox.
    deerflow_id: String,
}

impl Aio {
    async fn start() -> Self {
        Self::start_on(&["--backend", "local"], "").await
    }

    /// A server started with `args`, its config file holding `extra` after the
    /// `[deerflow]` section.
    async fn start_on(args: &[&str], extra: &str) -> Self {
        let config = write_config(&format!("{extra}\n[deerflow]\napi_key = \"{KEY}\"\n"));
        let mut args = args.to_vec();
        args.extend(["--config", config.path().to_str().unwrap()]);
        Self::around(TestServer::start_with(bin(), &args), Some(config)).await
    }

    /// A server on `host` with DeerFlow's APIs on.
    async fn on(host: Host) -> Self {
        let config = format!("\n[deerflow]\napi_key = \"{KEY}\"\n");
        Self::around(host.start_configured(&config, &[]), None).await
    }

    async fn around(server: TestServer, config: Option<tempfile::NamedTempFile>) -> Self {
        let mut aio = Self {
            server,
            _config: config,
            http: reqwest::Client::new(),
            url: String::new(),
            deerflow_id: "5e55101d".into(),
        };
        aio.url = aio.create_sandbox().await;
        aio
    }

    async fn create_sandbox(&self) -> String {
        let (status, body) = self
            .server
            .send_json(
                self.http
                    .post(format!("{}/deerflow/api/sandboxes", self.server.url))
                    .header("X-API-Key", KEY)
                    .json(&json!({
                        "sandbox_id": self.deerflow_id,
                        "thread_id": "shell-thread",
                        "user_id": "alice",
                    })),
            )
            .await;
        assert_eq!(status, 200, "create: {body}");
        body["sandbox_url"].as_str().unwrap().to_owned()
    }

    async fn delete_sandbox(&self) {
        let (status, body) = self
            .server
            .send_json(
                self.http
                    .delete(format!(
                        "{}/deerflow/api/sandboxes/{}",
                        self.server.url, self.deerflow_id
                    ))
                    .header("X-API-Key", KEY),
            )
            .await;
        assert_eq!(status, 200, "delete: {body}");
    }

    /// A call to the sandbox's AIO API: the status and the whole envelope.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.server.send_json(request).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// A POST that must succeed; its `data`.
    async fn data(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.post(path, body.clone()).await;
        assert_eq!(status, 200, "{path} {body}: {answer}");
        assert_eq!(answer["success"], true, "{answer}");
        answer["data"].clone()
    }

    async fn shell_session(&self) -> String {
        let data = self.data("/v1/shell/sessions/create", json!({})).await;
        data["session_id"].as_str().unwrap().to_owned()
    }

    /// `shell/exec` in session `id`, synchronously; its `data`.
    async fn shell(&self, id: &str, command: &str) -> Value {
        self.data("/v1/shell/exec", json!({"id": id, "command": command}))
            .await
    }

    /// The output of a completed command in session `id`.
    async fn output(&self, id: &str, command: &str) -> String {
        let data = self.shell(id, command).await;
        assert_eq!(data["status"], "completed", "{command}: {data}");
        data["output"].as_str().unwrap().to_owned()
    }

    /// The command lines of every process in the sandbox, seen from a fresh session.
    async fn processes(&self) -> String {
        let probe = self.shell_session().await;
        let seen = self.output(&probe, "ps -eo pid=,args=").await;
        let (status, _) = self
            .call(Method::DELETE, &format!("/v1/shell/sessions/{probe}"), None)
            .await;
        assert_eq!(status, 200);
        seen
    }

    /// Polls `processes` until `gone` holds, for at most 10 s.
    async fn until_processes(&self, what: &str, gone: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = self.processes().await;
            if gone(&seen) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}; processes:\n{seen}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A row of the run records (I22), found by its command line.
    fn run_row(&self, command: &str) -> String {
        let db = self.server.data_dir().join("warren.db");
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select status, exit_code, timed_out, failure_reason, cwd, requested_by from runs where command = ?', (sys.argv[2],)).fetchall())",
                db.to_str().unwrap(),
                command,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

/// A command whose tree holds a background job, a subshell, a double-forked child, a
/// `setsid` child and a `nohup` child: stopping it leaves none of them.
const ESCAPES: &str = "sleep 998 & (sleep 999; echo never) & ( sleep 989 & ) ; \
    setsid sleep 988 & nohup sleep 987 >/dev/null 2>&1 & echo started; sleep 996";

/// What [`ESCAPES`] starts, as `ps` shows it.
const ESCAPES_LEFT: [&str; 6] = [
    "sleep 998",
    "sleep 999",
    "sleep 996",
    "sleep 989",
    "sleep 988",
    "sleep 987",
];

/// The last line of an output: bash may first report background jobs a kill ended, as an
/// interactive shell does at its next prompt.
fn last_line(output: &str) -> &str {
    output.lines().last().unwrap_or_default()
}

fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

#[tokio::test]
async fn a_session_keeps_its_shell_and_a_second_session_never_shares_it() {
    let aio = Aio::start().await;
    let (a, b) = (aio.shell_session().await, aio.shell_session().await);
    assert_ne!(a, b);

    // Both sessions work at once, their commands interleaved; neither sees the other.
    let (first_a, first_b) = tokio::join!(
        aio.output(
            &a,
            "cd /tmp && export EXPORTED=ea && PLAIN=pa && greet() { echo \"hi $1\"; } && echo $$"
        ),
        aio.output(&b, "cd /mnt/user-data/outputs && PLAIN=pb && echo $$"),
    );
    let (pid_a, pid_b) = (first_a.trim().to_owned(), first_b.trim().to_owned());
    assert!(pid_a.parse::<u32>().is_ok(), "{first_a:?}");
    assert_ne!(pid_a, pid_b, "sessions never share a shell");
    let (second_a, second_b) =
        tokio::join!(
        aio.output(&a, "echo $$ $PWD $EXPORTED $PLAIN; greet a; sh -c 'echo child sees $EXPORTED'"),
        aio.output(
            &b,
            "echo $$ $PWD ${EXPORTED-unset} $PLAIN; type greet >/dev/null 2>&1 || echo no greet"
        ),
    );
    assert_eq!(
        second_a,
        format!("{pid_a} /tmp ea pa\nhi a\nchild sees ea\n")
    );
    assert_eq!(
        second_b,
        format!("{pid_b} /mnt/user-data/outputs unset pb\nno greet\n")
    );

    // The sessions as listed: each where its shell is.
    let (status, listed) = aio.call(Method::GET, "/v1/shell/sessions", None).await;
    assert_eq!(status, 200, "{listed}");
    let sessions = &listed["data"]["sessions"];
    assert_eq!(sessions[&a]["working_dir"], "/tmp", "{listed}");
    assert_eq!(
        sessions[&b]["working_dir"], "/mnt/user-data/outputs",
        "{listed}"
    );
    assert_eq!(sessions[&a]["status"], "active", "{listed}");

    // A new session starts in the workdir, DeerFlow's /mnt/user-data.
    let c = aio.shell_session().await;
    assert_eq!(aio.output(&c, "pwd").await, "/mnt/user-data\n");
    // Creating an existing id returns that session, shell and all.
    let again = aio
        .data("/v1/shell/sessions/create", json!({"id": a}))
        .await;
    assert_eq!(
        (again["session_id"].as_str(), again["working_dir"].as_str()),
        (Some(a.as_str()), Some("/tmp"))
    );
    assert_eq!(aio.output(&a, "echo $$").await.trim(), pid_a);
}

#[tokio::test]
async fn the_output_is_exactly_what_the_command_wrote_and_the_shell_survives_mistakes() {
    let aio = Aio::start().await;
    let id = aio.shell_session().await;

    // stdout and stderr merged in the order written; no echo, prompt or marker; no
    // newline added.
    let data = aio
        .shell(&id, "echo out; echo err >&2; printf 'no newline'")
        .await;
    assert_eq!(
        (
            data["output"].as_str(),
            data["exit_code"].as_i64(),
            data["status"].as_str()
        ),
        (Some("out\nerr\nno newline"), Some(0), Some("completed")),
        "{data}"
    );
    assert_eq!(data["session_id"], id.as_str());
    assert_eq!(
        data["command"],
        "echo out; echo err >&2; printf 'no newline'"
    );
    let data = aio.shell(&id, "(exit 7)").await;
    assert_eq!(
        (data["exit_code"].as_i64(), text(&data["output"])),
        (Some(7), "")
    );
    assert_eq!(aio.shell(&id, "false").await["exit_code"], 1);

    // Quotes, heredocs, multi-line text and binary-looking bytes pass as typed.
    let tricky = "cat <<'EOF'\nit's \"quoted\" $HOME `x`\nEOF\nprintf '%s\\n' \"a'b\"";
    assert_eq!(
        aio.output(&id, tricky).await,
        "it's \"quoted\" $HOME `x`\na'b\n"
    );
    assert_eq!(
        aio.output(&id, "printf '\\036\\037\\001x'").await,
        "\u{1e}\u{1f}\u{1}x"
    );

    // A command reading stdin gets an end of file at once, even after `exec </dev/null`
    // (DeerFlow's own prefix); the shell's commands are never its input.
    assert_eq!(
        aio.output(&id, "cat; read -r line; echo read=$?").await,
        "read=1\n"
    );
    assert_eq!(
        aio.output(&id, "exec < /dev/null\necho still here").await,
        "still here\n"
    );
    assert_eq!(aio.output(&id, "echo next").await, "next\n");

    // Syntax errors (one of them fatal to bash while it parses) leave the shell as it was.
    aio.output(&id, "KEPT=yes").await;
    for broken in ["echo 'unterminated", "x=$(if); echo", "fi", "echo $((1+))"] {
        let data = aio.shell(&id, broken).await;
        assert_eq!(data["status"], "completed", "{broken}: {data}");
        assert_ne!(data["exit_code"], 0, "{broken}: {data}");
        assert!(text(&data["output"]).contains("bash: "), "{broken}: {data}");
    }
    assert_eq!(aio.output(&id, "echo $KEPT").await, "yes\n");

    // `set -x` traces the command, never the markers around it, and stays on.
    let data = aio.shell(&id, "set -x; echo traced").await;
    let traced = text(&data["output"]);
    assert!(traced.contains("+ echo traced\ntraced\n"), "{traced:?}");
    assert!(
        !traced.contains("printf") && !traced.contains("__warren"),
        "{traced:?}"
    );
    let data = aio.shell(&id, "echo again; set +x").await;
    let traced = text(&data["output"]);
    assert!(traced.contains("+ echo again\nagain\n"), "{traced:?}");
    assert!(
        !traced.contains("printf") && !traced.contains('\u{1e}'),
        "{traced:?}"
    );
    assert_eq!(aio.output(&id, "echo quiet").await, "quiet\n");

    // A big output is kept whole up to the cap; the default `truncate` keeps its start
    // and end (where DeerFlow's status line is), `truncate: false` gives all of it.
    let big = "seq 1 20000; echo __END__";
    let data = aio.shell(&id, big).await;
    let cut = text(&data["output"]);
    assert!(
        cut.starts_with("1\n2\n") && cut.ends_with("20000\n__END__\n"),
        "{}",
        &cut[..100]
    );
    assert!(cut.contains("characters truncated"));
    let whole = aio
        .data(
            "/v1/shell/exec",
            json!({"id": id, "command": big, "truncate": false}),
        )
        .await;
    assert_eq!(text(&whole["output"]).lines().count(), 20001);

    // A long command text reaches the shell whole (more than a pipe holds).
    let long = format!("LONG='{}'; echo ${{#LONG}}", "x".repeat(300_000));
    assert_eq!(aio.output(&id, &long).await, "300000\n");

    // Without an id a command gets a session of its own, named in the answer.
    let data = aio
        .data("/v1/shell/exec", json!({"command": "echo $$"}))
        .await;
    let implicit = text(&data["session_id"]).to_owned();
    assert_ne!(implicit, id);
    assert_eq!(
        aio.output(&implicit, "echo $$").await,
        text(&data["output"])
    );
}

#[tokio::test]
async fn bash_keeps_stdout_and_stderr_apart_and_env_holds_for_one_command() {
    let aio = Aio::start().await;
    let info = aio
        .data("/v1/bash/sessions/create", json!({"session_id": "b-1"}))
        .await;
    assert_eq!(
        (
            info["session_id"].as_str(),
            info["status"].as_str(),
            info["working_dir"].as_str()
        ),
        (Some("b-1"), Some("ready"), Some("/mnt/user-data")),
        "{info}"
    );
    for field in ["created_at", "last_used_at"] {
        assert!(
            chrono::DateTime::parse_from_rfc3339(text(&info[field])).is_ok(),
            "{field}: {info}"
        );
    }

    // As DeerFlow sends it: stdin closed first, secrets in `env` for this command only.
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({
                "session_id": "b-1",
                "command": "exec < /dev/null\necho \"out $SKILL_TOKEN\"; echo err >&2; PERSIST=1; cd workspace; exit_with() { return $1; }; exit_with 3",
                "env": {"SKILL_TOKEN": "tok-1", "HOME": null},
                "hard_timeout": 30.0,
            }),
        )
        .await;
    assert_eq!(
        (
            data["stdout"].as_str(),
            data["stderr"].as_str(),
            data["exit_code"].as_i64(),
            data["status"].as_str()
        ),
        (
            Some("out tok-1\n"),
            Some("err\n"),
            Some(3),
            Some("completed")
        ),
        "{data}"
    );
    assert_eq!(data["session_id"], "b-1");
    assert!(!text(&data["command_id"]).is_empty(), "{data}");
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "echo \"${SKILL_TOKEN-gone} $PERSIST $PWD\"; [ -n \"$HOME\" ] && echo home back"}),
        )
        .await;
    assert_eq!(
        text(&data["stdout"]),
        "gone 1 /mnt/user-data/workspace\nhome back\n",
        "{data}"
    );

    // exec_dir moves the session for good, anywhere in the runtime (only the file API is
    // bounded to the mounts); one under a mount that is no directory is refused.
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "pwd", "exec_dir": "/etc"}),
        )
        .await;
    assert_eq!(text(&data["stdout"]), "/etc\n");
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "pwd", "exec_dir": "/mnt/user-data/outputs"}),
        )
        .await;
    assert_eq!(text(&data["stdout"]), "/mnt/user-data/outputs\n");
    let (status, refused) = aio
        .post(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "pwd", "exec_dir": "/mnt/user-data/nope"}),
        )
        .await;
    assert_eq!(status, 400, "{refused}");

    // A hard timeout is `timed_out`; the session goes on.
    let started = Instant::now();
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "echo before; sleep 600", "hard_timeout": 1.0}),
        )
        .await;
    assert_eq!(
        (data["status"].as_str(), data["stdout"].as_str()),
        (Some("timed_out"), Some("before\n")),
        "{data}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "pwd"}),
        )
        .await;
    assert_eq!(text(&data["stdout"]), "/mnt/user-data/outputs\n");

    let (status, listed) = aio.call(Method::GET, "/v1/bash/sessions", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["data"][0]["session_id"], "b-1", "{listed}");
    assert_eq!(listed["data"][0]["command_count"], 6, "{listed}");

    // Closed: gone, with the words DeerFlow matches.
    let (status, _) = aio
        .call(Method::POST, "/v1/bash/sessions/b-1/close", None)
        .await;
    assert_eq!(status, 200);
    let (status, gone) = aio
        .post(
            "/v1/bash/exec",
            json!({"session_id": "b-1", "command": "true"}),
        )
        .await;
    assert_eq!(
        (status, gone["message"].as_str()),
        (404, Some("Session not found: b-1")),
        "{gone}"
    );
    // Shell and bash sessions are apart: a shell id is no bash session.
    let shell = aio.shell_session().await;
    let (status, _) = aio
        .post(
            "/v1/bash/exec",
            json!({"session_id": shell, "command": "true"}),
        )
        .await;
    assert_eq!(status, 404);
    // Without a session id, bash/exec opens one.
    let data = aio
        .data("/v1/bash/exec", json!({"command": "echo new"}))
        .await;
    assert_eq!(text(&data["stdout"]), "new\n");
    assert!(!text(&data["session_id"]).is_empty());
}

#[tokio::test]
async fn a_hard_timeout_kills_the_commands_tree_and_leaves_the_shell_and_older_jobs() {
    let aio = Aio::start().await;
    let id = aio.shell_session().await;
    let pid = aio.output(&id, "sleep 997 & echo $$").await;

    let started = Instant::now();
    let data = aio
        .data(
            "/v1/shell/exec",
            json!({
                "id": id,
                "command": ESCAPES,
                "hard_timeout": 1.0,
            }),
        )
        .await;
    // The output so far, and bash's own word on what became of its foreground job.
    assert_eq!(data["status"], "hard_timeout", "{data}");
    let output = text(&data["output"]);
    assert!(output.starts_with("started\n"), "{data}");
    assert!(
        !output.contains("\nnever") && !output.contains('\u{1e}'),
        "{data}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    aio.until_processes("the command's tree is killed, what left it too", |seen| {
        !ESCAPES_LEFT.iter().any(|left| seen.contains(left))
    })
    .await;
    let seen = aio.processes().await;
    assert!(
        seen.contains("sleep 997"),
        "an earlier command's job stays:\n{seen}"
    );
    // The same shell goes on.
    assert_eq!(last_line(&aio.output(&id, "echo $$").await), pid.trim());

    // A kill request does the same for a command started without waiting.
    let data = aio
        .data(
            "/v1/shell/exec",
            json!({"id": id, "command": "echo go; sleep 995", "async_mode": true}),
        )
        .await;
    assert_eq!(data["status"], "running", "{data}");
    let killed = aio.data("/v1/shell/kill", json!({"id": id})).await;
    assert_eq!(killed["status"], "terminated", "{killed}");
    let view = aio.data("/v1/shell/view", json!({"id": id})).await;
    assert_eq!(view["status"], "terminated", "{view}");
    assert!(
        text(&view["console"][0]["output"]).starts_with("go\n"),
        "{view}"
    );
    assert_eq!(last_line(&aio.output(&id, "echo $$").await), pid.trim());

    // Work the shell does itself cannot be killed apart from it: the session ends.
    let data = aio
        .data(
            "/v1/shell/exec",
            json!({"id": id, "command": "while :; do :; done", "hard_timeout": 1.0}),
        )
        .await;
    assert_eq!(data["status"], "hard_timeout", "{data}");
    let (status, gone) = aio
        .post("/v1/shell/exec", json!({"id": id, "command": "true"}))
        .await;
    assert_eq!(
        (status, gone["message"].as_str()),
        (404, Some(format!("Session not found: {id}").as_str()))
    );
    let shell = pid.trim().to_owned();
    aio.until_processes("the ended session's shell is gone", |seen| {
        !seen
            .lines()
            .any(|line| line.split_whitespace().next() == Some(shell.as_str()))
    })
    .await;

    // Each command has its run record (I22), a timeout marked as such.
    assert_eq!(
        aio.run_row(ESCAPES),
        "[('finished', 137, 1, None, '/mnt/user-data', 'deerflow')]"
    );
    assert_eq!(
        aio.run_row("sleep 997 & echo $$"),
        "[('finished', 0, 0, None, '/mnt/user-data', 'deerflow')]"
    );
}

#[tokio::test]
async fn a_quiet_command_returns_no_change_timeout_and_goes_on_and_async_mode_is_followed_by_wait_and_view(
) {
    let aio = Aio::start().await;
    let id = aio.shell_session().await;

    let started = Instant::now();
    let data = aio
        .data(
            "/v1/shell/exec",
            json!({"id": id, "command": "echo first; sleep 3; echo done", "no_change_timeout": 1}),
        )
        .await;
    assert_eq!(
        (data["status"].as_str(), data["output"].as_str()),
        (Some("no_change_timeout"), Some("first\n")),
        "{data}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // One command at a time per session.
    let (status, busy) = aio
        .post("/v1/shell/exec", json!({"id": id, "command": "true"}))
        .await;
    assert_eq!(status, 409, "{busy}");
    // wait returns within its bound, then once the command ends.
    let mut polls = 0;
    loop {
        let before = Instant::now();
        let waited = aio
            .data("/v1/shell/wait", json!({"id": id, "max_wait_seconds": 1}))
            .await;
        assert!(
            before.elapsed() < Duration::from_millis(1800),
            "{:?}",
            before.elapsed()
        );
        if waited["status"] == "completed" {
            break;
        }
        assert_eq!(waited["status"], "running", "{waited}");
        polls += 1;
        assert!(polls < 10, "the command never ended");
    }
    let view = aio.data("/v1/shell/view", json!({"id": id})).await;
    assert_eq!(
        (
            view["output"].as_str(),
            view["exit_code"].as_i64(),
            view["console"][0]["command"].as_str()
        ),
        (
            Some("first\ndone\n"),
            Some(0),
            Some("echo first; sleep 3; echo done")
        ),
        "{view}"
    );

    // async_mode: `running` at once; view shows the output so far.
    let data = aio
        .data(
            "/v1/shell/exec",
            json!({"id": id, "command": "echo a; sleep 1; echo b", "async_mode": true}),
        )
        .await;
    assert_eq!(data["status"], "running", "{data}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = aio.data("/v1/shell/view", json!({"id": id})).await;
        if view["status"] == "completed" {
            assert_eq!(view["output"], "a\nb\n", "{view}");
            break;
        }
        assert!(Instant::now() < deadline, "{view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // DeerFlow's abort: a long synchronous exec drains within ~1 s of sessions/update.
    let waiting = {
        let (http, url, id) = (aio.http.clone(), aio.url.clone(), id.clone());
        tokio::spawn(async move {
            let answer: Value = http
                .post(format!("{url}/v1/shell/exec"))
                .json(&json!({"id": id, "command": "sleep 30", "no_change_timeout": 600}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (answer, Instant::now())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while aio.data("/v1/shell/view", json!({"id": id})).await["command"] != "sleep 30" {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let updated = Instant::now();
    aio.data(
        "/v1/shell/sessions/update",
        json!({"id": id, "no_change_timeout": 1}),
    )
    .await;
    let (answer, returned) = waiting.await.unwrap();
    assert_eq!(answer["data"]["status"], "no_change_timeout", "{answer}");
    assert!(
        returned - updated < Duration::from_millis(1800),
        "{:?}",
        returned - updated
    );
    let killed = aio.data("/v1/shell/kill", json!({"id": id})).await;
    assert_eq!(killed["status"], "terminated", "{killed}");
    assert_eq!(aio.output(&id, "echo alive").await, "alive\n");
}

#[tokio::test]
async fn exit_ends_the_session_and_close_kills_the_shell_and_what_it_started() {
    let aio = Aio::start().await;

    // `exit` in a command: `terminated`, its status and output; the id is gone after.
    let id = aio.shell_session().await;
    let data = aio.shell(&id, "echo bye; exit 3").await;
    assert_eq!(
        (
            data["status"].as_str(),
            data["exit_code"].as_i64(),
            data["output"].as_str()
        ),
        (Some("terminated"), Some(3), Some("bye\n")),
        "{data}"
    );
    let view = aio.data("/v1/shell/view", json!({"id": id})).await;
    assert_eq!(view["status"], "terminated", "{view}");
    let (status, gone) = aio
        .post("/v1/shell/exec", json!({"id": id, "command": "true"}))
        .await;
    assert_eq!(
        (status, text(&gone["message"])),
        (404, format!("Session not found: {id}").as_str())
    );
    // Creating the id again gives a fresh shell.
    aio.data("/v1/shell/sessions/create", json!({"id": id}))
        .await;
    assert_eq!(aio.output(&id, "echo fresh").await, "fresh\n");

    // Closing kills the shell and its background jobs.
    let pid = aio
        .output(&id, "sleep 994 & echo $$")
        .await
        .trim()
        .to_owned();
    let (status, closed) = aio
        .call(Method::DELETE, &format!("/v1/shell/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{closed}");
    aio.until_processes("the closed session's processes are gone", |seen| {
        !seen.contains("sleep 994")
            && !seen
                .lines()
                .any(|line| line.split_whitespace().next() == Some(pid.as_str()))
    })
    .await;
    let (status, _) = aio
        .call(Method::DELETE, &format!("/v1/shell/sessions/{id}"), None)
        .await;
    assert_eq!(status, 404, "closing twice: the session is gone");

    // Missing sessions, everywhere, in DeerFlow's words; bad ids are 400.
    for (path, body) in [
        ("/v1/shell/exec", json!({"id": "nope", "command": "true"})),
        ("/v1/shell/view", json!({"id": "nope"})),
        (
            "/v1/shell/wait",
            json!({"id": "nope", "max_wait_seconds": 1}),
        ),
        ("/v1/shell/kill", json!({"id": "nope"})),
        (
            "/v1/shell/sessions/update",
            json!({"id": "nope", "no_change_timeout": 1}),
        ),
    ] {
        let (status, answer) = aio.post(path, body).await;
        assert_eq!(
            (
                status,
                answer["message"].as_str(),
                answer["success"].as_bool()
            ),
            (404, Some("Session not found: nope"), Some(false)),
            "{path}: {answer}"
        );
    }
    let (status, answer) = aio
        .call(Method::POST, "/v1/bash/sessions/nope/close", None)
        .await;
    assert_eq!(
        (status, answer["message"].as_str()),
        (404, Some("Session not found: nope"))
    );
    let (status, answer) = aio
        .post("/v1/shell/sessions/create", json!({"id": "a/b c"}))
        .await;
    assert_eq!(status, 400, "{answer}");

    // Terminating the sandbox ends its sessions, and the command running in one.
    let id = aio.shell_session().await;
    let running = aio
        .data(
            "/v1/shell/exec",
            json!({"id": id, "command": "sleep 993", "async_mode": true}),
        )
        .await;
    assert_eq!(running["status"], "running");
    aio.delete_sandbox().await;
    let url = aio.create_sandbox().await;
    let (status, gone) = aio
        .server
        .send_json(
            aio.http
                .post(format!("{url}/v1/shell/exec"))
                .json(&json!({"id": id, "command": "true"})),
        )
        .await;
    assert_eq!(status, 404, "{gone}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = aio.run_row("sleep 993");
        if row.starts_with("[('failed'") {
            break;
        }
        assert!(Instant::now() < deadline, "{row}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_sandbox_holds_a_bounded_number_of_sessions_and_sessions_without_an_id_make_room() {
    let aio = Aio::start().await;
    // Commands without a session id, many more than the bound: the oldest idle ones go.
    for n in 0..40 {
        let data = aio
            .data("/v1/shell/exec", json!({"command": format!("echo {n}")}))
            .await;
        assert_eq!(data["output"], format!("{n}\n"));
    }
    let (_, listed) = aio.call(Method::GET, "/v1/shell/sessions", None).await;
    let live = listed["data"]["sessions"].as_object().unwrap().len();
    assert_eq!(live, 8, "at most 8 sessions without an id stay: {listed}");
    // Named sessions are kept: the bound then says no, clearly.
    for n in 0..32 {
        aio.data("/v1/shell/sessions/create", json!({"id": format!("s{n}")}))
            .await;
    }
    let (status, full) = aio
        .post("/v1/shell/sessions/create", json!({"id": "one-too-many"}))
        .await;
    assert_eq!(status, 409, "{full}");
    assert!(
        text(&full["message"]).contains("32 open shell sessions"),
        "{full}"
    );
    let (status, _) = aio.call(Method::DELETE, "/v1/shell/sessions", None).await;
    assert_eq!(status, 200);
    aio.data("/v1/shell/sessions/create", json!({"id": "one-too-many"}))
        .await;
}

#[tokio::test]
async fn a_warm_shell_exec_is_quick() {
    let aio = Aio::start().await;
    let id = aio.shell_session().await;
    aio.output(&id, "true").await;
    let mut took = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        assert_eq!(aio.output(&id, "echo hi").await, "hi\n");
        took.push(started.elapsed());
    }
    took.sort();
    let p50 = took[took.len() / 2];
    let p90 = took[took.len() * 9 / 10];
    // Beside it, for scale: the native exec API, one process per command.
    let sandbox = aio
        .url
        .split("/deerflow/sandboxes/")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    let mut native = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let result = aio.server.exec(&sandbox, "echo hi").await;
        assert_eq!(result["stdout"], "hi\n");
        native.push(started.elapsed());
    }
    native.sort();
    println!(
        "warm shell/exec `echo hi`: p50 {p50:?}, p90 {p90:?}; native exec p50 {:?} (50 calls each)",
        native[native.len() / 2]
    );
    assert!(p50 < Duration::from_millis(500), "p50 {p50:?}");
}

#[tokio::test]
async fn secrets_are_masked_in_output_and_run_records_and_the_token_never_enters_a_session() {
    const SECRET: &str = "s3cr3t-value-4242";
    let aio = Aio::start_on(
        &["--backend", "local"],
        &format!("[sandbox_secrets]\nAIO_SECRET = \"{SECRET}\""),
    )
    .await;
    let id = aio.shell_session().await;
    // The shell has the secret (I14); what it prints of it is masked (I13), also when it
    // comes in two writes a while apart (two chunks of output).
    let output = aio
        .output(
            &id,
            "echo \"$AIO_SECRET\"; head=${AIO_SECRET%????}; printf '%s' \"$head\"; sleep 0.3; echo \"${AIO_SECRET#$head}\"",
        )
        .await;
    assert_eq!(output, "[masked:AIO_SECRET]\n[masked:AIO_SECRET]\n");
    let typed = format!("echo {SECRET} >/dev/null");
    aio.output(&id, &typed).await;
    assert_eq!(
        aio.run_row("echo [masked:AIO_SECRET] >/dev/null"),
        "[('finished', 0, 0, None, '/mnt/user-data', 'deerflow')]"
    );
    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"command": "echo \"$AIO_SECRET\" >&2"}),
        )
        .await;
    assert_eq!(data["stderr"], "[masked:AIO_SECRET]\n", "{data}");

    // The provisioner token is refused in a command, a directory and an env value (I13).
    for (path, body) in [
        (
            "/v1/shell/exec",
            json!({"id": id, "command": format!("echo {TEST_TOKEN}")}),
        ),
        (
            "/v1/shell/exec",
            json!({"id": id, "command": "pwd", "exec_dir": format!("/mnt/user-data/{TEST_TOKEN}")}),
        ),
        (
            "/v1/bash/exec",
            json!({"command": "true", "env": {"T": TEST_TOKEN}}),
        ),
    ] {
        let (status, refused) = aio.post(path, body).await;
        assert_eq!(status, 400, "{path}: {refused}");
        assert!(!refused.to_string().contains(TEST_TOKEN), "{refused}");
    }
    // Nor is it in the shell's environment.
    let env = aio.output(&id, "env").await;
    assert!(!env.contains(TEST_TOKEN), "{env}");
}

/// On every backend and tier: one shell per session, and stopping a command kills its whole
/// tree, what left it by a double fork, `setsid` or `nohup` included, and leaves the shell.
async fn a_session_keeps_its_shell_and_stopping_a_command_leaves_it(host: Host) {
    let aio = Aio::on(host).await;
    let (a, b) = (aio.shell_session().await, aio.shell_session().await);
    let pid = aio.output(&a, "cd /tmp; X=1; echo $$").await;
    assert_eq!(
        aio.output(&a, "echo $$ $PWD $X").await,
        format!("{} /tmp 1\n", pid.trim())
    );
    assert_ne!(
        aio.output(&b, "echo $$").await,
        pid,
        "sessions never share a shell"
    );
    assert_eq!(
        aio.output(&b, "echo ${X-unset} $PWD").await,
        "unset /mnt/user-data\n"
    );

    let data = aio
        .data(
            "/v1/shell/exec",
            json!({"id": a, "command": ESCAPES, "hard_timeout": 1.0}),
        )
        .await;
    assert_eq!(data["status"], "hard_timeout", "{data}");
    assert!(text(&data["output"]).starts_with("started\n"), "{data}");
    aio.until_processes("the command's tree is killed, what left it too", |seen| {
        !ESCAPES_LEFT.iter().any(|left| seen.contains(left))
    })
    .await;
    assert_eq!(last_line(&aio.output(&a, "echo $$").await), pid.trim());

    let data = aio
        .data(
            "/v1/bash/exec",
            json!({"command": "echo out; echo err >&2"}),
        )
        .await;
    assert_eq!(
        (data["stdout"].as_str(), data["stderr"].as_str()),
        (Some("out\n"), Some("err\n"))
    );

    aio.output(&a, "sleep 990 &").await;
    let (status, _) = aio
        .call(Method::DELETE, &format!("/v1/shell/sessions/{a}"), None)
        .await;
    assert_eq!(status, 200);
    let shell = pid.trim().to_owned();
    aio.until_processes("the closed session's processes are gone", |seen| {
        !seen.contains("sleep 990")
            && !seen
                .lines()
                .any(|line| line.split_whitespace().next() == Some(shell.as_str()))
    })
    .await;
}

#[tokio::test]
async fn an_idle_session_closes_itself_so_the_reaper_can_reclaim_the_runtime_but_a_running_command_keeps_both(
) {
    let aio = Aio::start_on(
        &["--backend", "local"],
        "[lifecycle]\nidle_timeout_s = 3\nreap_interval_s = 1",
    )
    .await;
    let sandbox = aio
        .url
        .split("/deerflow/sandboxes/")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    let id = aio.shell_session().await;
    // A command longer than the idle timeout: the session and the runtime stay for it.
    let data = aio.shell(&id, "sleep 5; echo done").await;
    assert_eq!(
        (data["status"].as_str(), data["output"].as_str()),
        (Some("completed"), Some("done\n")),
        "{data}"
    );
    assert_eq!(aio.server.sandbox_state(&sandbox).await, "running");
    // Then nobody uses it: the session closes itself, and the runtime is reaped.
    let idle = Instant::now();
    assert!(
        aio.server
            .reaches_state(&sandbox, "stopped", Duration::from_secs(3 + 3 + 1 + 5))
            .await,
        "an idle session kept its runtime (state {})",
        aio.server.sandbox_state(&sandbox).await
    );
    eprintln!(
        "the idle session's runtime was reaped {:?} after its last command",
        idle.elapsed()
    );
    let (status, gone) = aio
        .post("/v1/shell/exec", json!({"id": id, "command": "true"}))
        .await;
    assert_eq!(status, 404, "{gone}");
}

on_every_host!(a_session_keeps_its_shell_and_stopping_a_command_leaves_it);
