//! The client subcommands against a real server: output, exit codes and hints.

use warren_test_support::run_to_exit;

use super::{bin, server};

#[tokio::test]
async fn the_cli_creates_a_sandbox_writes_reads_and_lists_files() {
    let server = server();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let bin = bin();
    let out = run_to_exit(
        bin,
        &[
            "workdir",
            "create",
            "--uid",
            "alice",
            "--path",
            "projects/cli",
        ],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_to_exit(
        bin,
        &[
            "sandbox",
            "create",
            "--uid",
            "alice",
            "--runtime-scope",
            "t",
            "--workdir",
            "projects/cli",
        ],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = info["sandbox_id"].as_str().unwrap().to_owned();
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), "from the cli\n").unwrap();
    let out = run_to_exit(
        bin,
        &[
            "put",
            &id,
            "notes/a.txt",
            "--from",
            local.path().to_str().unwrap(),
        ],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_to_exit(bin, &["cat", &id, "notes/a.txt"], &env);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the cli\n");
    let out = run_to_exit(bin, &["ls", &id, "notes"], &env);
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("/home/gem/user-data/projects/cli/notes/a.txt"));
    let out = run_to_exit(bin, &["sandbox", "list", "--uid", "alice"], &env);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
    let out = run_to_exit(bin, &["sandbox", "rm", &id], &env);
    assert!(String::from_utf8_lossy(&out.stdout).contains("terminated"));
}

#[tokio::test]
async fn cli_errors_say_what_went_wrong_and_what_to_do() {
    let server = server();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let bin = bin();
    let out = run_to_exit(bin, &["cat", "sbx-0123456789abcdef01234567", "x"], &env);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sandbox_not_found"));
    let id = server.sandbox("alice", "t", "projects/a").await;
    let out = run_to_exit(bin, &["exec", &id, "echo", "hi"], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exec_not_supported"));
    let wrong = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", "wrong-token-wrong-token-wrong-token"),
    ];
    let out = run_to_exit(bin, &["sandbox", "list"], &wrong);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hint: WARREN_TOKEN"));
    let out = run_to_exit(
        bin,
        &["sandbox", "list"],
        &[("WARREN_URL", "http://127.0.0.1:9"), ("WARREN_TOKEN", "x")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `warren serve` running"));
    let out = run_to_exit(
        bin,
        &["sandbox", "list"],
        &[("WARREN_URL", server.url.as_str())],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("set WARREN_TOKEN"));
}

#[tokio::test]
async fn cli_exec_passes_output_and_exit_status_through() {
    let server = super::runtime::local();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let id = server.sandbox("alice", "t", "projects/a").await;
    let out = run_to_exit(
        bin(),
        &["exec", &id, "--", "python3", "-c", "print(6*7)"],
        &env,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    assert_eq!(out.status.code(), Some(0));
    let out = run_to_exit(bin(), &["exec", &id, "echo to-err >&2; exit 3"], &env);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to-err\n");
    assert_eq!(out.status.code(), Some(3));
    let out = run_to_exit(bin(), &["exec", &id, "--timeout", "1", "sleep 30"], &env);
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
}

#[tokio::test]
async fn the_cli_sets_a_secret_from_stdin_and_never_prints_it() {
    use std::io::Write;
    let server = server();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let mut child = std::process::Command::new(bin())
        .args(["env", "set", "--uid", "alice", "API_KEY"])
        .envs(env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"sk-cli-0123456789abcd\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!printed.contains("sk-cli-0123456789abcd"), "{printed}");
    let entry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The trailing newline of stdin is not part of the value.
    assert_eq!(
        (&entry["length"], &entry["secret"]),
        (&21.into(), &true.into())
    );

    let out = run_to_exit(bin(), &["env", "list", "--uid", "alice"], &env);
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        list.contains("API_KEY") && !list.contains("sk-cli"),
        "{list}"
    );

    let out = run_to_exit(bin(), &["env", "rm", "--uid", "alice", "API_KEY"], &env);
    assert!(out.status.success());
    let out = run_to_exit(bin(), &["env", "rm", "--uid", "alice", "API_KEY"], &env);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no variable \"API_KEY\""));
}

#[tokio::test]
async fn the_cli_binds_an_egress_secret_and_shows_the_audit_without_the_value() {
    use std::io::Write;
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let mut child = std::process::Command::new(bin())
        .args(["secret", "set", "--uid", "alice", "GH_TOKEN"])
        .args([
            "--target",
            "api.github.com/repos/",
            "--target",
            "uploads.github.com:443,8443",
        ])
        .args(["--header", "Authorization:token "])
        .envs(env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"ghp-cli-0123456789abcdef\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(entry["length"], 24, "{entry}");
    assert_eq!(entry["env"], "WARREN_SECRET_GH_TOKEN");
    assert_eq!(
        entry["targets"],
        serde_json::json!([
            {"host": "api.github.com", "path_prefix": "/repos/"},
            {"host": "uploads.github.com", "ports": [443, 8443]},
        ])
    );
    assert_eq!(
        entry["present"],
        serde_json::json!({"type": "header", "name": "Authorization", "prefix": "token "})
    );
    for args in [
        &["secret", "list", "--uid", "alice"][..],
        &["secret", "list", "--sandbox", &id],
    ] {
        let out = run_to_exit(bin(), args, &env);
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(
            list.contains("GH_TOKEN") && !list.contains("ghp-cli"),
            "{list}"
        );
    }
    // A malformed secret is the server's clear refusal, exit 2.
    let out = run_to_exit(
        bin(),
        &[
            "secret",
            "set",
            "--uid",
            "alice",
            "lower-case",
            "--target",
            "h.example",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("secret name"));
    let out = run_to_exit(bin(), &["egress", &id], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(log["connections"], serde_json::json!([]));
    let out = run_to_exit(bin(), &["secret", "rm", "--uid", "alice", "GH_TOKEN"], &env);
    assert!(out.status.success());
    let out = run_to_exit(bin(), &["secret", "rm", "--uid", "alice", "GH_TOKEN"], &env);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no egress secret"));
}

#[tokio::test]
async fn the_cli_records_diffs_and_restores_a_checkpoint() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let file = server.workspace_of("alice").join("projects/a/notes.md");
    std::fs::write(&file, "before\n").unwrap();
    let out = run_to_exit(bin(), &["checkpoint", "create", &id], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains("1 files") && summary.contains("chunks new"),
        "{summary}"
    );
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cid = created["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();

    std::fs::write(&file, "after\n").unwrap();
    std::fs::write(file.with_file_name("new.md"), "x").unwrap();
    let out = run_to_exit(bin(), &["checkpoint", "diff", &id, &cid], &env);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "+ new.md\n~ notes.md\n"
    );
    let out = run_to_exit(bin(), &["checkpoint", "restore", &id, &cid], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "before\n");
    assert!(!file.with_file_name("new.md").exists());
    let out = run_to_exit(bin(), &["checkpoint", "restore", &id, "ckpt-missing"], &env);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no checkpoint"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_branches_a_workdir_and_merges_it_back() {
    // Branches are overlay mounts on warren's host: the local backend, as root.
    let server = super::runtime::local();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let warren = |args: &[&str]| run_to_exit(bin(), args, &env);
    let ok = |args: &[&str]| {
        let out = warren(args);
        assert!(
            out.status.success(),
            "warren {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let create_sandbox = |scope: &str, branch: Option<&str>| {
        let mut args = vec![
            "sandbox",
            "create",
            "--uid",
            "alice",
            "--runtime-scope",
            scope,
            "--workdir",
            "projects/br",
        ];
        args.extend(
            branch
                .map(|branch| ["--branch", branch])
                .into_iter()
                .flatten(),
        );
        let info = json(&ok(&args));
        assert_eq!(info["branch"].as_str(), branch, "{info}");
        info["sandbox_id"].as_str().unwrap().to_owned()
    };

    ok(&[
        "workdir",
        "create",
        "--uid",
        "alice",
        "--path",
        "projects/br",
    ]);
    // The target: a sandbox bound to the workdir itself. Writing a file starts no runtime,
    // so nothing running can write the workdir when the branch is made.
    let target = create_sandbox("main", None);
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), "one\ntwo\nthree\n").unwrap();
    ok(&[
        "put",
        &target,
        "a.txt",
        "--from",
        local.path().to_str().unwrap(),
    ]);

    let branch = json(&ok(&["branch", "create", "alice", "projects/br", "b1"]));
    assert_eq!(
        (branch["workdir"].as_str(), branch["name"].as_str()),
        (Some("projects/br"), Some("b1")),
        "{branch}"
    );
    let list = json(&ok(&[
        "branch",
        "list",
        "alice",
        "--workdir",
        "projects/br",
    ]));
    assert_eq!(list["branches"][0]["name"], "b1", "{list}");

    let worker = create_sandbox("worker", Some("b1"));
    ok(&["exec", &worker, "--", "sed", "-i", "s/one/ONE/", "a.txt"]);
    // The branch has the change; the workdir is as it was until the merge.
    let out = ok(&["cat", &worker, "a.txt"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ONE\ntwo\nthree\n");
    let out = ok(&["cat", &target, "a.txt"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\nthree\n");
    let out = ok(&["branch", "diff", "alice", "projects/br", "b1"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "~ a.txt\n");

    // A dry run needs no guard and changes nothing.
    let planned = json(&ok(&["merge", &target, "b1", "--dry-run"]));
    assert_eq!(
        (
            &planned["applied"],
            &planned["steps"][0]["path"],
            &planned["conflicts"]
        ),
        (&false.into(), &"a.txt".into(), &serde_json::json!([])),
        "{planned}"
    );
    let out = ok(&["cat", &target, "a.txt"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\nthree\n");

    let merged = json(&ok(&["merge", &target, "b1", "--holder", "cli-test"]));
    assert_eq!(merged["applied"], true, "{merged}");
    assert!(
        merged["checkpoint_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("ckpt-")),
        "{merged}"
    );
    let out = ok(&["cat", &target, "a.txt"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ONE\ntwo\nthree\n");
    // The guard the merge took was given back.
    let out = warren(&["guard", "show", &target]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("guard_not_found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A branch a live sandbox is bound to stays.
    let out = warren(&["branch", "rm", "alice", "projects/br", "b1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("branch_in_use"), "{stderr}");
    let out = ok(&["sandbox", "rm", &worker]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("terminated"));
    ok(&["branch", "rm", "alice", "projects/br", "b1"]);
    let list = json(&ok(&["branch", "list", "alice"]));
    assert_eq!(list["branches"], serde_json::json!([]), "{list}");

    // A fork: two new sandboxes, each on a branch of its own, and the source on one too.
    let forked = json(&ok(&["sandbox", "fork", &target, "--count", "2"]));
    assert_eq!(
        forked["forks"].as_array().map(Vec::len),
        Some(2),
        "{forked}"
    );
    assert!(forked["source"]["branch"].is_string(), "{forked}");
    let list = json(&ok(&[
        "branch",
        "list",
        "alice",
        "--workdir",
        "projects/br",
    ]));
    assert_eq!(list["branches"].as_array().map(Vec::len), Some(3), "{list}");
}

/// Runs `warren <args>` with its stdout a pipe whose reader is already gone, as when
/// `warren … | head -1` has what it wanted.
fn run_into_a_closed_pipe(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = std::process::Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .env_remove("WARREN_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn output_piped_into_a_reader_that_stopped_ends_quietly_with_the_sigpipe_status() {
    let server = server();
    server.sandbox("alice", "t", "projects/a").await;
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    for args in [&["openapi"][..], &["sandbox", "list"], &["doctor"]] {
        let out = run_into_a_closed_pipe(args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} printed: {stderr}");
    }
}

#[tokio::test]
async fn sandbox_create_takes_a_runtime_scope_or_who_shares_the_sandbox() {
    let server = server();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let create = |args: &[&str]| {
        let mut all = vec!["sandbox", "create"];
        all.extend_from_slice(args);
        run_to_exit(bin(), &all, &env)
    };
    let info = |out: &std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let explicit = info(&create(&["--uid", "alice", "--runtime-scope", "t"]));
    assert_eq!(
        (&explicit["uid"], &explicit["runtime_scope_id"]),
        (&"alice".into(), &"t".into())
    );
    // `--isolation` is the old spelling of `--scope`.
    let old = info(&create(&["--isolation", "session", "--session-id", "s-1"]));
    assert_eq!(old["uid"], "session:s-1");
    for (args, uid, runtime_scope) in [
        (
            &["--scope", "session", "--session-id", "s-1"][..],
            "session:s-1",
            "session",
        ),
        (
            &[
                "--scope",
                "user",
                "--user-id",
                "alice",
                "--session-id",
                "s-2",
            ],
            "alice",
            "user",
        ),
        (
            &["--scope", "agent", "--agent-id", "coder"],
            "agent:coder",
            "agent",
        ),
        (&["--scope", "global"], "global:shared", "global"),
    ] {
        let derived = info(&create(args));
        assert_eq!(
            (
                derived["uid"].as_str(),
                derived["runtime_scope_id"].as_str()
            ),
            (Some(uid), Some(runtime_scope)),
            "{args:?}"
        );
    }
    // Usage errors: no identity, both forms, an id without a scope, an unknown scope, a
    // scope missing its id (the server's refusal).
    for args in [
        &["--workdir", "projects/a"][..],
        &[
            "--uid",
            "alice",
            "--runtime-scope",
            "t",
            "--scope",
            "global",
        ],
        &[
            "--uid",
            "alice",
            "--runtime-scope",
            "t",
            "--session-id",
            "s",
        ],
        &["--scope", "team"],
        &["--scope", "session"],
        &["--scope", "global", "--allow", "example.com"],
    ] {
        let out = create(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let help = run_to_exit(bin(), &["sandbox", "create", "--help"], &[]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--runtime-scope") && help.contains("--scope") && help.contains("--tier"),
        "{help}"
    );
    assert!(
        !help.contains("--isolation "),
        "the old spelling is not advertised: {help}"
    );
}

#[tokio::test]
async fn cli_errors_name_the_cli_command_or_flag_that_fixes_them() {
    use std::io::Write;
    let server = server();
    let env = [
        ("WARREN_URL", server.url.as_str()),
        ("WARREN_TOKEN", server.token.as_str()),
    ];
    let out = run_to_exit(
        bin(),
        &[
            "sandbox",
            "create",
            "--uid",
            "alice",
            "--runtime-scope",
            "t",
            "--workdir",
            "projects/missing",
        ],
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("warren workdir create") && !stderr.contains("POST /v1"),
        "{stderr}"
    );

    let mut child = std::process::Command::new(bin())
        .args(["env", "set", "--uid", "alice", "PIN"])
        .envs(env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"1234\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--plain") && !stderr.contains("\"secret\""),
        "{stderr}"
    );
}

#[test]
fn doctor_never_ends_on_an_empty_list_and_config_errors_point_to_the_example_file() {
    let out = run_to_exit(bin(), &["doctor"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        !last.trim_end().ends_with(':'),
        "doctor ends with {last:?}:\n{text}"
    );

    let help = run_to_exit(bin(), &["serve", "--help"], &[]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("warren.example.toml"), "{help}");
    let data = tempfile::tempdir().unwrap();
    let config = super::write_config("no_such_key = 1\n");
    let out = run_to_exit(
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
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("warren.example.toml"),
        "{stderr}"
    );
}
