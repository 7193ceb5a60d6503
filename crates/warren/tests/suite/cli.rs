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
            "--scope",
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
