//! Workspace initialisation (I32): inline files, an allowed host directory, a git
//! repository at a revision; only into an empty workdir, and nothing left half-done.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::{bin, write_config};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .expect("git is installed (scripts/test checks)");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A host directory with a template and a git repository of two commits.
struct Sources {
    dir: tempfile::TempDir,
    first_commit: String,
}

fn sources() -> Sources {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template");
    std::fs::create_dir_all(template.join("src")).unwrap();
    std::fs::write(template.join("src/main.py"), "print('hi')\n").unwrap();
    std::fs::write(template.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(template.join("run.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    symlink("/etc/passwd", template.join("passwd-link")).unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    std::fs::write(repo.join("README.md"), "first\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "--quiet", "-m", "first"]);
    let first_commit = git(&repo, &["rev-parse", "HEAD"]);
    std::fs::write(repo.join("README.md"), "second\n").unwrap();
    git(&repo, &["commit", "--quiet", "-am", "second"]);
    Sources { dir, first_commit }
}

fn server_with(sources: &Sources) -> (TestServer, tempfile::NamedTempFile) {
    let config = write_config(&format!(
        "[init.host_dirs]\ntemplate = \"{}\"\nrepos = \"{}\"\n",
        sources.dir.path().join("template").display(),
        sources.dir.path().display()
    ));
    let server = TestServer::start_with(
        bin(),
        &[
            "--backend",
            "memory",
            "--config",
            config.path().to_str().unwrap(),
        ],
    );
    (server, config)
}

async fn create(server: &TestServer, body: serde_json::Value) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(Method::POST, "/v1/users/alice/workdirs")
                .json(&body),
        )
        .await
}

#[tokio::test]
async fn a_workdir_is_filled_from_a_host_dir_a_git_revision_and_inline_files() {
    let sources = sources();
    let (server, _config) = server_with(&sources);
    let repo_url = format!("file://{}", sources.dir.path().join("repo").display());
    let (status, body) = create(
        &server,
        json!({
            "path": "projects/app",
            "init": {
                "host_dir": "template",
                "git": { "url": repo_url, "rev": sources.first_commit },
                "files": { "notes/TODO.md": "- ship it\n" },
            },
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert!(
        body["initialized"]["files"].as_u64().unwrap() >= 4,
        "{body}"
    );
    let wd = server.workspace_of("alice").join("projects/app");
    assert_eq!(
        std::fs::read_to_string(wd.join("src/main.py")).unwrap(),
        "print('hi')\n"
    );
    assert_eq!(
        std::fs::metadata(wd.join("run.sh")).unwrap().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(wd.join("passwd-link")).unwrap().to_str(),
        Some("/etc/passwd"),
        "a link is copied as a link"
    );
    assert_eq!(
        std::fs::read_to_string(wd.join("README.md")).unwrap(),
        "first\n",
        "the revision asked for"
    );
    assert!(wd.join(".git").is_dir(), "the history comes along");
    assert_eq!(
        std::fs::read_to_string(wd.join("notes/TODO.md")).unwrap(),
        "- ship it\n"
    );
    if super::running_as_root() {
        for file in ["src/main.py", "README.md", "notes/TODO.md"] {
            let meta = std::fs::metadata(wd.join(file)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{file} (I11)");
        }
    }
    assert!(
        !server
            .data_dir()
            .join("tmp")
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(false),
        "the checkout directory was left behind"
    );

    // Only an empty workdir is initialised: nothing is overwritten.
    let (status, body) = create(
        &server,
        json!({ "path": "projects/app", "init": { "files": { "README.md": "clobbered" } } }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("workdir_not_empty")),
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(wd.join("README.md")).unwrap(),
        "first\n"
    );
}

#[tokio::test]
async fn refused_or_failing_sources_leave_no_new_workdir_and_an_existing_one_untouched() {
    let sources = sources();
    let (server, _config) = server_with(&sources);
    for (init, code) in [
        (json!({ "host_dir": "nope" }), "unknown_host_dir"),
        (
            json!({ "git": { "url": "file:///etc" } }),
            "git_source_refused",
        ),
        (
            json!({ "git": { "url": format!("file://{}/../../etc", sources.dir.path().display()) } }),
            "git_source_refused",
        ),
        (
            json!({ "git": { "url": "-oProxyCommand=touch /tmp/pwned" } }),
            "git_source_refused",
        ),
        (
            json!({ "git": { "url": "ext::sh -c touch% /tmp/pwned" } }),
            "git_source_refused",
        ),
        (
            json!({ "git": { "url": "https://example.invalid/x.git", "rev": "--upload-pack=x" } }),
            "git_source_refused",
        ),
        (json!({ "files": { "../escape.txt": "x" } }), "invalid_path"),
    ] {
        let (status, body) = create(
            &server,
            json!({ "path": "projects/x", "init": init.clone() }),
        )
        .await;
        assert_eq!(
            (status / 100, body["error"]["code"].as_str()),
            (4, Some(code)),
            "{init}: {body}"
        );
        assert!(
            !server.workspace_of("alice").join("projects/x").exists(),
            "{init}: a refused init left the workdir created"
        );
    }
    assert!(!Path::new("/tmp/pwned").exists());

    // A revision that does not exist fails after the clone: the workdir stays empty.
    let repo_url = format!("file://{}", sources.dir.path().join("repo").display());
    let (status, body) = create(
        &server,
        json!({
            "path": "projects/y",
            "init": { "files": { "a.txt": "a" }, "git": { "url": repo_url, "rev": "no-such-branch" } },
        }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("git_failed")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains(&server.data_dir().to_string_lossy().into_owned()),
        "{message}"
    );
    let wd = server.workspace_of("alice").join("projects/y");
    assert!(!wd.exists(), "a failed init left the workdir created");
    // An inline file that would collide with the host template is refused whole.
    let (status, _) = create(
        &server,
        json!({ "path": "projects/z", "init": { "host_dir": "template", "files": { "run.sh": "x" } } }),
    )
    .await;
    assert_eq!(status, 412);
    assert!(!server.workspace_of("alice").join("projects/z").exists());
    let (_, listing) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/workdirs"))
        .await;
    assert_eq!(listing["workdirs"], json!([]), "failed workdirs are listed");

    // A workdir that existed before this call stays, with its files, whatever init does.
    let (status, _) = create(&server, json!({ "path": "projects/kept" })).await;
    assert_eq!(status, 201);
    let kept = server.workspace_of("alice").join("projects/kept");
    let (status, body) = create(
        &server,
        json!({ "path": "projects/kept", "init": { "git": { "url": repo_url, "rev": "no-such-branch" } } }),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(kept.is_dir(), "a failed init removed an existing workdir");
    std::fs::write(kept.join("mine.txt"), "mine\n").unwrap();
    let (status, body) = create(
        &server,
        json!({ "path": "projects/kept", "init": { "files": { "a.txt": "a" } } }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("workdir_not_empty")),
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(kept.join("mine.txt")).unwrap(),
        "mine\n"
    );
}
