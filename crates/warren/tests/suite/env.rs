//! The environment policy (I13, I14): the global sandbox environment, a uid's agent
//! environment, `inherit_env: false`, `ephemeral: true`, masking of injected secrets, and
//! logs that carry the request and sandbox ids.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};
use warren_test_support::{TestServer, TEST_TOKEN};

use super::{bin, output, server, write_config};

const API_KEY: &str = "sk-live-0123456789abcdef";
const GLOBAL_SECRET: &str = "global-secret-value-42";

/// A local server whose configuration sets one global variable and one global secret.
fn local_with_global_env() -> (TestServer, tempfile::NamedTempFile) {
    let config = write_config(&format!(
        "[sandbox_env]\nGLOBAL = \"global-value\"\n\
         [sandbox_secrets]\nGLOBAL_SECRET = \"{GLOBAL_SECRET}\"\n"
    ));
    let server = TestServer::start_with(bin(), &["--config", config.path().to_str().unwrap()]);
    (server, config)
}

async fn put_env(server: &TestServer, uid: &str, env: serde_json::Value) -> (u16, String) {
    let response = server
        .request(Method::PUT, &format!("/v1/users/{uid}/env"))
        .json(&json!({ "env": env }))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

async fn create(server: &TestServer, body: serde_json::Value) -> (u16, serde_json::Value) {
    server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
        .await
}

#[tokio::test]
async fn agent_env_values_go_in_and_never_come_back_out() {
    let server = server();
    let (status, text) = put_env(
        &server,
        "alice",
        json!({ "API_KEY": API_KEY, "MODE": { "value": "fast", "secret": false } }),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains(API_KEY) && !text.contains("fast"), "{text}");

    let response = server
        .request(Method::GET, "/v1/users/alice/env")
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    assert!(!text.contains(API_KEY) && !text.contains("fast"), "{text}");
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    let variables = body["variables"].as_array().unwrap();
    assert_eq!(variables.len(), 2, "{body}");
    assert_eq!(
        (
            &variables[0]["name"],
            &variables[0]["secret"],
            &variables[0]["length"],
            &variables[0]["hint"]
        ),
        (
            &json!("API_KEY"),
            &json!(true),
            &json!(API_KEY.len()),
            &json!("…cdef")
        ),
        "{body}"
    );
    assert_eq!(
        (&variables[1]["name"], &variables[1]["secret"]),
        (&json!("MODE"), &json!(false))
    );
    assert!(
        variables[1].get("hint").is_none(),
        "short values get no hint"
    );

    // Another uid has an environment of its own.
    let (_, bob) = server
        .send_json(server.request(Method::GET, "/v1/users/bob/env"))
        .await;
    assert_eq!(bob["variables"], json!([]));

    // One variable at a time: 201 new, 200 replaced, and again no value in the answer.
    let one = |name: &str, value: &str| {
        server
            .request(Method::PUT, &format!("/v1/users/alice/env/{name}"))
            .json(&json!({ "value": value }))
    };
    let response = one("OTHER", "other-secret-value").send().await.unwrap();
    assert_eq!(response.status(), 201);
    let response = one("OTHER", "rotated-secret-value").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(!text.contains("rotated-secret-value"), "{text}");

    let delete = |path: &str| server.request(Method::DELETE, path);
    let (status, _) = server.send_json(delete("/v1/users/alice/env/OTHER")).await;
    assert_eq!(status, 204);
    let (status, body) = server.send_json(delete("/v1/users/alice/env/OTHER")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("env_var_not_found"))
    );
    let (status, _) = server.send_json(delete("/v1/users/alice/env")).await;
    assert_eq!(status, 204);
    let (_, body) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/env"))
        .await;
    assert_eq!(body["variables"], json!([]));
}

#[tokio::test]
async fn bad_names_short_secrets_too_many_variables_and_the_token_are_refused() {
    let server = server();
    for (env, code) in [
        (json!({ "1X": "abcdefgh" }), "invalid_env"),
        (json!({ "A-B": "abcdefgh" }), "invalid_env"),
        (
            json!({ "USER_UID": { "value": "0", "secret": false } }),
            "invalid_env",
        ),
        (json!({ "PIN": "1234" }), "invalid_env"),
        (json!({ "NUL": "abc\u{0}defgh" }), "invalid_env"),
        (json!({ "LEAK": TEST_TOKEN }), "token_in_env"),
        (
            json!({ "LEAK": format!("Bearer {TEST_TOKEN}") }),
            "token_in_env",
        ),
        (
            json!({ "A": { "value": "x", "secret": false, "extra": 1 } }),
            "invalid_json",
        ),
    ] {
        let (status, text) = put_env(&server, "alice", env.clone()).await;
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (status / 100, body["error"]["code"].as_str()),
            (4, Some(code)),
            "{env}: {text}"
        );
        assert!(!text.contains(TEST_TOKEN), "the token was echoed: {text}");
    }
    let (_, text) = put_env(&server, "alice", json!({ "PIN": "1234" })).await;
    assert!(
        text.contains("\\\"secret\\\": false"),
        "the message says what to do: {text}"
    );

    let too_many: serde_json::Map<String, serde_json::Value> = (0..257)
        .map(|i| (format!("V{i}"), json!({ "value": "x", "secret": false })))
        .collect();
    let (status, text) = put_env(&server, "alice", too_many.clone().into()).await;
    assert_eq!(status, 400, "{text}");
    let full: serde_json::Map<_, _> = too_many.into_iter().take(256).collect();
    let (status, _) = put_env(&server, "alice", full.into()).await;
    assert_eq!(status, 200);
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, "/v1/users/alice/env/ONE_MORE")
                .json(&json!({ "value": "x", "secret": false })),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("agent_env_full"))
    );

    // The token is refused in a call's own environment too, and a bad name likewise.
    let id = server.sandbox("alice", "t", "projects/a").await;
    for (env, code) in [
        (json!({ "X": TEST_TOKEN }), "token_in_env"),
        (json!({ "A=B": "x" }), "invalid_env"),
    ] {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&json!({ "command": "true", "env": env })),
            )
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(code)),
            "{body}"
        );
    }
}

#[tokio::test]
async fn commands_get_the_layered_environment_with_injected_secrets_masked() {
    let (server, _config) = local_with_global_env();
    let (status, _) = put_env(
        &server,
        "alice",
        json!({ "API_KEY": API_KEY, "MODE": { "value": "from-agent-env", "secret": false } }),
    )
    .await;
    assert_eq!(status, 200);
    let id = server.sandbox("alice", "t", "projects/a").await;

    let result = server
        .exec_with(
            &id,
            json!({
                "command": "echo \"$API_KEY|$MODE|$GLOBAL|$GLOBAL_SECRET|$CALL\"; echo \"$API_KEY\" >&2; printf %s \"$API_KEY\" | sha256sum",
                "env": { "CALL": "from-call" },
            }),
        )
        .await;
    let stdout = result["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with(
            "[masked:API_KEY]|from-agent-env|global-value|[masked:GLOBAL_SECRET]|from-call\n"
        ),
        "{result}"
    );
    assert!(
        stdout.contains(&sha256_hex(API_KEY)),
        "the exact value was injected: {result}"
    );
    assert_eq!(result["stderr"], "[masked:API_KEY]\n");

    // The call's own env goes over the agent environment.
    let result = server
        .exec_with(
            &id,
            json!({ "command": "echo $MODE", "env": { "MODE": "call" } }),
        )
        .await;
    assert_eq!(result["stdout"], "call\n");

    // A secret split across two writes (and two stream chunks) is still masked.
    let mut response = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .header("accept", "application/x-ndjson")
        .json(&json!({
            "command": "printf %s \"${API_KEY%????????????}\"; sleep 0.5; printf '%s\\n' \"${API_KEY#????????????}\"",
        }))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    use base64::Engine;
    let mut streamed = Vec::new();
    for line in text.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        if event["type"] == "stdout" {
            streamed.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(event["data"].as_str().unwrap())
                    .unwrap(),
            );
        }
    }
    assert_eq!(
        String::from_utf8(streamed).unwrap(),
        "[masked:API_KEY]\n",
        "{text}"
    );
    assert!(text.contains("\"exit\""), "{text}");

    // A new value applies to the next command, in the same runtime.
    server.exec(&id, "echo kept > /tmp/mark").await;
    let (status, _) = server
        .send_json(
            server
                .request(Method::PUT, "/v1/users/alice/env/API_KEY")
                .json(&json!({ "value": "sk-rotated-9876543210" })),
        )
        .await;
    assert_eq!(status, 200);
    let result = server
        .exec(
            &id,
            "cat /tmp/mark; printf %s \"$API_KEY\" | sha256sum; echo $API_KEY",
        )
        .await;
    let stdout = result["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("kept\n"), "{result}");
    assert!(
        stdout.contains(&sha256_hex("sk-rotated-9876543210")),
        "{result}"
    );
    assert!(stdout.ends_with("[masked:API_KEY]\n"), "{result}");

    // Another uid gets the global layer but not alice's agent environment.
    let bob = server.sandbox("bob", "t", "projects/b").await;
    let result = server.exec(&bob, "echo \"[$API_KEY][$GLOBAL]\"").await;
    assert_eq!(result["stdout"], "[][global-value]\n");
}

#[tokio::test]
async fn a_sandbox_that_does_not_inherit_gets_only_the_base_and_its_call_env() {
    let (server, _config) = local_with_global_env();
    put_env(&server, "alice", json!({ "API_KEY": API_KEY })).await;
    server.workdir("alice", "projects/a").await;
    let (status, info) = create(
        &server,
        json!({ "uid": "alice", "runtime_scope_id": "fetch", "workdir": "projects/a", "inherit_env": false }),
    )
    .await;
    assert_eq!(
        (status, &info["inherit_env"]),
        (201, &json!(false)),
        "{info}"
    );
    let id = info["sandbox_id"].as_str().unwrap();
    let result = server
        .exec_with(id, json!({ "command": "env", "env": { "CALL": "yes" } }))
        .await;
    let env = output(&result);
    for absent in ["API_KEY", "GLOBAL", "GLOBAL_SECRET", API_KEY, GLOBAL_SECRET] {
        assert!(
            !env.contains(absent),
            "{absent} reached a non-inheriting sandbox: {env}"
        );
    }
    for present in ["CALL=yes", "HOME=/home/gem", "PATH="] {
        assert!(env.contains(present), "{present} missing: {env}");
    }

    // The policy is part of the binding.
    let (status, body) = create(
        &server,
        json!({ "uid": "alice", "runtime_scope_id": "fetch", "workdir": "projects/a" }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("env_policy_conflict")),
        "{body}"
    );
}

#[tokio::test]
async fn an_ephemeral_sandbox_never_touches_the_uid_workspace_and_leaves_nothing() {
    let server = TestServer::start_local(bin());
    // alice has persistent files; the ephemeral sandbox must not see them.
    let persistent = server.sandbox("alice", "main", "projects/a").await;
    server
        .exec(
            &persistent,
            "echo private > /home/gem/user-data/projects/a/secret.txt",
        )
        .await;

    let (status, info) = create(
        &server,
        json!({ "uid": "alice", "runtime_scope_id": "skill-fetch", "ephemeral": true, "inherit_env": false }),
    )
    .await;
    assert_eq!((status, &info["ephemeral"]), (201, &json!(true)), "{info}");
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let result = server
        .exec(
            &id,
            "pwd; ls -A /home/gem/user-data; ls -A /home/gem/user-data/projects | wc -l; \
             ls -A /home/gem/skills | wc -l; echo fetched > out.txt; \
             touch /home/gem/skills/x 2>/dev/null && echo skills-writable; id -u",
        )
        .await;
    let stdout = result["stdout"].as_str().unwrap();
    let workdir = info["workdir_path"].as_str().unwrap();
    assert_eq!(
        stdout,
        format!("{workdir}\nprojects\n1\n0\n1000\n"),
        "{result}"
    );
    let scratch = server.data_dir().join("scratch").join(&id);
    assert!(scratch.is_dir(), "the scratch tree lives in the data dir");

    // The file API serves the same scratch tree.
    let (status, body) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=out.txt"),
        ))
        .await;
    assert_eq!(status, 200, "{body}");

    // A uid with no workspace gets none from an ephemeral sandbox.
    let (status, carol) = create(
        &server,
        json!({ "uid": "carol", "runtime_scope_id": "t", "ephemeral": true }),
    )
    .await;
    assert_eq!(status, 201, "{carol}");
    let carol_id = carol["sandbox_id"].as_str().unwrap();
    server.exec(carol_id, "echo x > y").await;
    assert!(
        !server.data_dir().join("user-data/shared/carol").exists(),
        "an ephemeral sandbox created a persistent uid root"
    );

    // Nor can the file API reach alice's persistent files through it.
    let (status, _) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/home/gem/user-data/projects/a/secret.txt"),
        ))
        .await;
    assert_eq!(status, 404);

    // Links planted inside must not lead the removal outside.
    server
        .exec(
            &id,
            "ln -s /etc etc-link; mkdir -p d/e; ln -s / d/e/root; chmod 000 d",
        )
        .await;
    server.terminate(&id).await;
    assert!(!scratch.exists(), "terminate left the scratch tree");
    assert!(
        std::path::Path::new("/etc/passwd").exists(),
        "removal followed a link"
    );
    let kept = std::fs::read_to_string(server.workspace_of("alice").join("projects/a/secret.txt"));
    assert_eq!(
        kept.unwrap(),
        "private\n",
        "the persistent workspace was touched"
    );

    // The same identity comes back empty, as a new generation.
    let (status, again) = create(
        &server,
        json!({ "uid": "alice", "runtime_scope_id": "skill-fetch", "ephemeral": true, "inherit_env": false }),
    )
    .await;
    assert_eq!((status, &again["generation"]), (201, &json!(2)), "{again}");
    let result = server
        .exec(
            &id,
            "ls -A /home/gem/user-data/projects | wc -l; ls out.txt 2>&1 || true",
        )
        .await;
    assert!(
        result["stdout"].as_str().unwrap().starts_with("1\n"),
        "{result}"
    );
    assert!(output(&result).contains("No such file"), "{result}");
}

#[tokio::test]
async fn an_idle_ephemeral_sandbox_is_reaped_whole() {
    let server = TestServer::start_with(bin(), &["--idle-timeout", "1", "--reap-interval", "1"]);
    let (_, info) = create(
        &server,
        json!({ "uid": "alice", "runtime_scope_id": "tmp", "ephemeral": true }),
    )
    .await;
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    server.exec(&id, "echo x > f").await;
    let scratch = server.data_dir().join("scratch").join(&id);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, body) = server
            .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}")))
            .await;
        if body["state"] == "terminated" && !scratch.exists() {
            break;
        }
        assert!(Instant::now() < deadline, "not reaped: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_restart_adopts_a_live_ephemeral_runtime_and_removes_leftover_scratch() {
    let mut server = TestServer::start_local(bin());
    let (_, info) = create(
        &server,
        json!({ "uid": "alice", "runtime_scope_id": "tmp", "ephemeral": true }),
    )
    .await;
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    server
        .exec(&id, "echo alive > /tmp/mark; echo file > kept.txt")
        .await;
    let leftover = server
        .data_dir()
        .join("scratch/sbx-000000000000000000000000");
    std::fs::create_dir_all(leftover.join("workspace/projects")).unwrap();
    std::fs::write(leftover.join("workspace/projects/stale"), "x").unwrap();
    std::os::unix::fs::symlink("/etc", leftover.join("workspace/escape")).unwrap();

    server.restart_after_kill();
    let result = server.exec(&id, "cat /tmp/mark kept.txt").await;
    assert_eq!(
        result["stdout"], "alive\nfile\n",
        "the runtime was not adopted: {result}"
    );
    assert!(
        !leftover.exists(),
        "a leftover scratch tree survived the restart"
    );
    assert!(
        std::path::Path::new("/etc/passwd").exists(),
        "removal followed a symlink"
    );
    assert!(server.data_dir().join("scratch").join(&id).is_dir());
}

#[tokio::test]
async fn json_logs_carry_the_request_id_and_sandbox_id_on_every_request_line() {
    let server = TestServer::start_logging(bin(), &["--backend", "memory", "--log-format", "json"]);
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .header("x-request-id", "req-create-1")
                .json(&json!({ "uid": "alice", "runtime_scope_id": "t" })),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["sandbox_id"].as_str().unwrap().to_owned();
    let (status, _) = server
        .send_json(
            server
                .request(Method::DELETE, &format!("/v1/sandboxes/{id}"))
                .header("x-request-id", "req-delete-1"),
        )
        .await;
    assert_eq!(status, 200);

    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let lines = server.log_lines();
        let answered = |request_id: &str| {
            lines
                .iter()
                .any(|line| line.contains(request_id) && line.contains("finished processing"))
        };
        if answered("req-create-1") && answered("req-delete-1") {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "the requests were not logged: {lines:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut request_lines = 0;
    for line in &lines {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let Some(request) = entry["spans"]
            .as_array()
            .and_then(|spans| spans.iter().find(|span| span["name"] == "request"))
        else {
            continue;
        };
        if !matches!(
            request["request_id"].as_str(),
            Some("req-create-1" | "req-delete-1")
        ) {
            continue;
        }
        request_lines += 1;
        assert_eq!(
            request["sandbox"],
            json!(id),
            "a request line without its sandbox: {line}"
        );
    }
    // At least: "sandbox created", two answers, "sandbox terminated".
    assert!(request_lines >= 4, "{lines:#?}");
}

/// Spellings of the provisioner token that used to slip past a whole-word check, plus the
/// accidental encodings warren also looks for (I13).
fn values_holding_the_token() -> Vec<String> {
    use base64::Engine as _;
    let percent_encoded: String = TEST_TOKEN.bytes().map(|b| format!("%{b:02X}")).collect();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x:{TEST_TOKEN}"));
    vec![
        format!("x{TEST_TOKEN}"),
        format!("http://h/?access_token={TEST_TOKEN}"),
        format!("Bearer%20{TEST_TOKEN}"),
        format!("u={percent_encoded}"),
        format!("Basic {basic}"),
    ]
}

#[tokio::test]
async fn the_token_is_refused_wherever_it_hides_in_a_value_bound_for_a_sandbox() {
    let server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    for value in values_holding_the_token() {
        // The agent environment, whole and one variable at a time.
        let (status, text) = put_env(&server, "alice", json!({ "LEAK": value })).await;
        assert!(
            status == 400 && text.contains("\"token_in_env\""),
            "{value}: {status} {text}"
        );
        let (status, body) = server
            .send_json(
                server
                    .request(Method::PUT, "/v1/users/alice/env/LEAK")
                    .json(&json!({ "value": value, "secret": false })),
            )
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("token_in_env")),
            "{value}: {body}"
        );
        // A call's env, its command line (shell or argv), its cwd and its stdin.
        for (exec, code) in [
            (
                json!({ "command": "printenv LEAK", "env": { "LEAK": value } }),
                "token_in_env",
            ),
            (
                json!({ "command": format!("echo '{value}'") }),
                "token_in_command",
            ),
            (json!({ "argv": ["echo", value] }), "token_in_command"),
            (
                json!({ "command": "true", "cwd": format!("d/{value}") }),
                "token_in_command",
            ),
            (
                json!({ "command": "cat", "stdin": value }),
                "token_in_command",
            ),
        ] {
            let (status, body) = server
                .send_json(
                    server
                        .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                        .json(&exec),
                )
                .await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (400, Some(code)),
                "{exec}: {body}"
            );
            assert!(!body.to_string().contains(TEST_TOKEN), "echoed: {body}");
        }
    }
    // Nothing was stored and nothing ran: the environment is empty, and a command that
    // prints everything it was given shows no trace of the token.
    let (_, body) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/env"))
        .await;
    assert_eq!(body["variables"], json!([]), "{body}");
    let result = server.exec(&id, "printenv").await;
    assert!(!output(&result).contains(TEST_TOKEN), "{result}");

    // The MCP bash tool goes through the same rule.
    let mut mcp = warren_test_support::McpSession::open(&server, &id).await;
    let answer = mcp
        .call_tool("bash", json!({ "command": format!("echo x{TEST_TOKEN}") }))
        .await;
    assert_eq!(answer["result"]["isError"], json!(true), "{answer}");
    let text = answer["result"]["content"].to_string();
    assert!(
        text.contains("provisioner token") && !text.contains(TEST_TOKEN),
        "{text}"
    );
}

#[test]
fn a_configuration_that_holds_the_token_inside_a_value_does_not_start() {
    let data = tempfile::tempdir().unwrap();
    for (table, value) in [
        ("sandbox_env", format!("https://x/?t={TEST_TOKEN}")),
        ("sandbox_secrets", format!("Bearer%20{TEST_TOKEN}")),
    ] {
        let config = write_config(&format!("[{table}]\nURL = \"{value}\"\n"));
        let out = warren_test_support::run_to_exit(
            bin(),
            &[
                "serve",
                "--config",
                config.path().to_str().unwrap(),
                "--data-dir",
                data.path().to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ],
            &[("WARREN_TOKEN", TEST_TOKEN)],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{table}: started anyway");
        assert!(
            stderr.contains("contains the provisioner token") && !stderr.contains(TEST_TOKEN),
            "{table}: {stderr}"
        );
    }
}
