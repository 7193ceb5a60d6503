//! The skill projection (I7, I32) with real runtimes: built from built-in, shared and
//! granted skills, incremental, switched in whole, and never changing under a runtime.

use reqwest::Method;

use warren_test_support::TestServer;

use super::{bin, write_config};

struct Skills {
    dir: tempfile::TempDir,
}

impl Skills {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let put = |path: &str, text: &str| {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        put("builtin/hello/SKILL.md", "built-in hello\n");
        put("builtin/base/SKILL.md", "base\n");
        put("shared/hello/SKILL.md", "shared hello\n");
        put("shared/docs/SKILL.md", "docs\n");
        put("shared/docs/ref/guide.md", "guide\n");
        put("catalog/pdf/SKILL.md", "pdf\n");
        put("catalog/pdf/scripts/fill.py", "print('fill')\n");
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("shared/docs/host-link"))
            .unwrap();
        Self { dir }
    }

    fn config(&self) -> tempfile::NamedTempFile {
        let p = self.dir.path();
        write_config(&format!(
            "[skills]\nbuiltin_dir = \"{}\"\nshared_dir = \"{}\"\ncatalog_dir = \"{}\"\n",
            p.join("builtin").display(),
            p.join("shared").display(),
            p.join("catalog").display()
        ))
    }
}

async fn call(server: &TestServer, method: Method, path: &str) -> (u16, serde_json::Value) {
    server.send_json(server.request(method, path)).await
}

#[tokio::test]
async fn the_projection_holds_builtin_shared_and_granted_skills_and_switches_whole() {
    let skills = Skills::new();
    let config = skills.config();
    let server = TestServer::start_with(bin(), &["--config", config.path().to_str().unwrap()]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let listing = server
        .exec(&id, "ls /home/gem/skills; cat /home/gem/skills/hello/SKILL.md; readlink /home/gem/skills/docs/host-link; touch /home/gem/skills/x 2>&1 | grep -c 'Read-only'")
        .await;
    assert_eq!(
        listing["stdout"], "base\ndocs\nhello\nshared hello\n/etc/hostname\n1\n",
        "{listing}"
    );

    // Granting adds the skill to the next projection; the running runtime keeps its own.
    let (status, report) = call(&server, Method::PUT, "/v1/users/alice/skills/pdf").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["switched"], true);
    assert_eq!(report["files_copied"], 2, "{report}");
    assert!(report["files_reused"].as_u64().unwrap() >= 4, "{report}");
    let same = server.exec(&id, "ls /home/gem/skills").await;
    assert_eq!(
        same["stdout"], "base\ndocs\nhello\n",
        "the mounted projection changed under a runtime"
    );
    server.terminate(&id).await;
    let id = server.sandbox("alice", "t", "projects/a").await;
    let fresh = server
        .exec(
            &id,
            "ls /home/gem/skills; cat /home/gem/skills/pdf/scripts/fill.py",
        )
        .await;
    assert_eq!(
        fresh["stdout"], "base\ndocs\nhello\npdf\nprint('fill')\n",
        "{fresh}"
    );

    // Nothing changed: nothing is switched. One file changed: one is copied.
    let (_, report) = call(&server, Method::POST, "/v1/users/alice/skills/sync").await;
    assert_eq!(
        (report["switched"].clone(), report["files_copied"].clone()),
        (false.into(), 0.into()),
        "{report}"
    );
    std::fs::write(
        skills.dir.path().join("shared/docs/ref/guide.md"),
        "guide v2\n",
    )
    .unwrap();
    let (_, report) = call(&server, Method::POST, "/v1/users/alice/skills/sync").await;
    assert_eq!(report["files_copied"], 1, "{report}");
    assert_eq!(report["switched"], true);

    // Revoking removes it from the next projection; bob never had it.
    let (status, report) = call(&server, Method::DELETE, "/v1/users/alice/skills/pdf").await;
    assert_eq!(
        (status, report["files_removed"].clone()),
        (200, 2.into()),
        "{report}"
    );
    let (status, body) = call(&server, Method::DELETE, "/v1/users/alice/skills/pdf").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("skill_not_granted"))
    );
    let (status, _) = call(&server, Method::PUT, "/v1/users/alice/skills/..%2Fescape").await;
    assert_eq!(status, 400);
    let (_, granted) = call(&server, Method::GET, "/v1/users/bob/skills").await;
    assert_eq!(granted["granted"], serde_json::json!([]));
}

#[tokio::test]
async fn a_replaced_projection_is_kept_while_a_runtime_runs_then_reclaimed() {
    let skills = Skills::new();
    let config = skills.config();
    let server = TestServer::start_with(bin(), &["--config", config.path().to_str().unwrap()]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "true").await;
    call(&server, Method::PUT, "/v1/users/alice/skills/pdf").await;
    let retired = server.data_dir().join("skill-projections/.retired");
    assert_eq!(
        std::fs::read_dir(&retired).unwrap().count(),
        1,
        "the old projection is kept for the runtime"
    );
    // The runtime still reads its whole projection.
    let still = server
        .exec(&id, "cat /home/gem/skills/docs/ref/guide.md")
        .await;
    assert_eq!(still["stdout"], "guide\n");
    server.terminate(&id).await;
    call(&server, Method::POST, "/v1/users/alice/skills/sync").await;
    assert_eq!(
        std::fs::read_dir(&retired).unwrap().count(),
        0,
        "a retired projection outlived its runtimes"
    );
}

#[tokio::test]
async fn a_restart_clears_leftover_checkouts_and_retired_projections_nobody_uses() {
    let mut server = TestServer::start_with(bin(), &["--backend", "memory"]);
    server.workdir("alice", "projects/a").await;
    let data = server.data_dir();
    let leftover = data.join("tmp/git-0123/repo");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("file"), "x").unwrap();
    let retired = data.join("skill-projections/.retired/alice.0123abcd");
    std::fs::create_dir_all(retired.join("old-skill")).unwrap();
    // A rebuild for alice reclaims alice's retired trees only, not those of "alice.smith".
    let other = data.join("skill-projections/.retired/alice.smith.0456abcd");
    std::fs::create_dir_all(&other).unwrap();
    let (status, _) = call(&server, Method::POST, "/v1/users/alice/skills/sync").await;
    assert_eq!(status, 200);
    assert!(
        !retired.exists() && other.exists(),
        "the wrong retired tree was reclaimed"
    );
    std::fs::create_dir_all(retired.join("old-skill")).unwrap();
    server.restart_after_kill();
    assert!(
        !data.join("tmp").exists(),
        "a leftover checkout survived the restart"
    );
    assert!(
        !retired.exists(),
        "a retired projection nobody uses survived the restart"
    );
}
