//! What an operator sets up for E2B clients (issue 42). Templates that seed the home,
//! through the official Python SDK: a template's `home`, a directory the operator allowed
//! by name (`[init.host_dirs]`), is copied into each new sandbox's home, owned by the
//! sandbox user with its modes, so a toolchain installed in `~` ships with the template;
//! `base` gets none of it, and a template naming a directory nobody allowed stops the
//! server at start-up. And `warren e2b key create` before the server ever ran.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use warren_test_support::{run_to_exit, TestServer};

use super::{bin, write_config};

const SCENARIO: &str = r#"
from e2b import Sandbox

def check(ok, what, seen):
    if not ok:
        raise AssertionError(f"{what}: {seen!r}")

sbx = Sandbox.create("seeded", timeout=120)
try:
    run = sbx.commands.run("~/.tools/bin/hello && stat -c '%u:%g %a' ~/.tools/bin/hello ~/.tools")
    check(run.stdout.splitlines() == ["hello from the template", "1000:1000 755", "1000:1000 750"],
          "the template's home, runnable and the user's", run.stdout)
    check(sbx.files.read("/home/user/notes.txt") == "seeded\n", "a seeded file reads back", None)
    # The home stays the user's own: it writes over what the template put there.
    sbx.files.write("/home/user/notes.txt", "mine\n")
    check(sbx.files.read("/home/user/notes.txt") == "mine\n", "the user's write wins", None)
finally:
    sbx.kill()

plain = Sandbox.create("base", timeout=60)
try:
    check(not plain.files.exists("/home/user/.tools"), "base seeds nothing", plain.files.list("/home/user"))
finally:
    plain.kill()
print("TEMPLATES PASSED", flush=True)
"#;

/// A template home: a runnable tool and a file, with the modes a toolchain has.
fn seed_dir() -> tempfile::TempDir {
    let seed = tempfile::tempdir().unwrap();
    let bin = seed.path().join(".tools/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let hello = bin.join("hello");
    std::fs::write(&hello, "#!/bin/sh\necho hello from the template\n").unwrap();
    std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        seed.path().join(".tools"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::fs::write(seed.path().join("notes.txt"), "seeded\n").unwrap();
    seed
}

#[test]
fn a_templates_home_seeds_each_new_sandbox_and_base_gets_none() {
    let seed = seed_dir();
    let toml = format!(
        "[init.host_dirs]\ntoolchain = {:?}\n[e2b.templates]\nseeded = {{ home = \"toolchain\" }}\n",
        seed.path().to_str().unwrap()
    );
    let server = TestServer::start_e2b(bin(), &[], &toml);
    server.run_python_sdk(
        "the template scenario",
        SCENARIO,
        "TEMPLATES PASSED",
        Duration::from_secs(180),
    );
}

#[test]
fn a_template_home_nobody_allowed_stops_the_server_at_start_up() {
    let data = tempfile::tempdir().unwrap();
    let config = write_config("[e2b.templates]\nseeded = { home = \"nowhere\" }\n");
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
    assert!(!out.status.success(), "started anyway");
    assert!(
        stderr.contains("e2b.templates.seeded.home") && stderr.contains("[init.host_dirs]"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_key_is_created_before_the_first_start_and_the_server_then_takes_it() {
    let data = tempfile::tempdir().unwrap();
    // Not there yet: the key makes it as `serve` would.
    std::fs::remove_dir(data.path()).unwrap();
    let nested = data.path().to_owned();
    let created = run_to_exit(
        bin(),
        &[
            "e2b",
            "key",
            "create",
            "--uid",
            "alice",
            "--data-dir",
            nested.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let key = String::from_utf8(created.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("e2b_") && key.len() == 44, "{key}");
    let mode = std::fs::metadata(&nested).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data directory is private");

    // The server on that directory takes the key; another is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let server = TestServer::start_in(
        bin(),
        data,
        &["--backend", "local", "--e2b-listen", &listen],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "no E2B listener on {listen}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let client = reqwest::Client::new();
    let list = |key: String| {
        client
            .get(format!("http://{listen}/sandboxes"))
            .header("X-API-Key", key)
            .send()
    };
    let answer = list(key).await.unwrap();
    assert_eq!(answer.status(), 200);
    let other = list(format!("e2b_{}", "0".repeat(40))).await.unwrap();
    assert_eq!(other.status(), 401);
    drop(server);
}
