//! Workdir checkpoints through the API with real runtimes (I28): record, diff, restore,
//! deduplication, the busy refusal and a damaged store.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::runtime::local;

async fn checkpoint(server: &TestServer, id: &str) -> serde_json::Value {
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/checkpoints")))
        .await;
    assert_eq!(status, 201, "{body}");
    body
}

async fn restore(server: &TestServer, id: &str, checkpoint: &str) -> (u16, serde_json::Value) {
    server
        .send_json(server.request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/checkpoints/{checkpoint}/restore"),
        ))
        .await
}

#[tokio::test]
async fn a_checkpoint_diffs_and_restores_the_workdir_and_dedups_the_next_one() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(
            &id,
            "mkdir -p src empty && echo 'fn main() {}' > src/main.rs && echo keep > keep.txt \
             && head -c 2000000 /dev/urandom > data.bin && ln -s src/main.rs link \
             && ln keep.txt hard.txt && chmod 600 keep.txt",
        )
        .await;
    let first = checkpoint(&server, &id).await;
    let cid = first["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(first["summary"]["files"], 3, "{first}");
    assert_eq!(first["summary"]["symlinks"], 1, "{first}");

    server
        .exec(
            &id,
            "echo changed > src/main.rs && rm data.bin && echo new > added.txt && rm link \
             && ln -s elsewhere link",
        )
        .await;
    let (status, diff) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/checkpoints/{cid}/diff"),
        ))
        .await;
    assert_eq!(status, 200, "{diff}");
    assert_eq!(diff["added"], json!(["added.txt"]));
    assert_eq!(diff["removed"], json!(["data.bin"]));
    let mut changed: Vec<String> = serde_json::from_value(diff["changed"].clone()).unwrap();
    changed.sort();
    assert_eq!(changed, ["link", "src/main.rs"]);

    let before_restore = server.exec(&id, "sha256sum keep.txt").await;
    let (status, body) = restore(&server, &id, &cid).await;
    assert_eq!(status, 200, "{body}");
    let result = server
        .exec(
            &id,
            "cat src/main.rs; test -e added.txt || echo no-added; readlink link; \
             stat -c '%a %h %U' keep.txt; ls -d empty; wc -c < data.bin",
        )
        .await;
    assert_eq!(
        result["stdout"], "fn main() {}\nno-added\nsrc/main.rs\n600 2 gem\nempty\n2000000\n",
        "{result}"
    );
    assert_eq!(
        server.exec(&id, "sha256sum keep.txt").await["stdout"],
        before_restore["stdout"]
    );

    // Nothing changed since: the next checkpoint stores almost nothing.
    let second = checkpoint(&server, &id).await;
    assert_eq!(second["summary"]["chunks_new"], 0, "{second}");
    let (_, list) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/checkpoints")))
        .await;
    assert_eq!(list["checkpoints"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn a_restore_is_refused_while_a_command_runs() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo v1 > f").await;
    let cid = checkpoint(&server, &id).await["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let running = {
        let request = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .json(&json!({ "command": "sleep 2; echo v2 > f" }));
        tokio::spawn(request.send())
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = restore(&server, &id, &cid).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("sandbox_busy")),
        "{body}"
    );
    running.await.unwrap().unwrap();
    let (status, _) = restore(&server, &id, &cid).await;
    assert_eq!(status, 200);
    assert_eq!(server.exec(&id, "cat f").await["stdout"], "v1\n");
}

#[tokio::test]
async fn a_damaged_store_fails_the_restore_and_keeps_the_workdir() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(
            &id,
            "echo original > f && head -c 300000 /dev/urandom > big",
        )
        .await;
    let cid = checkpoint(&server, &id).await["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    server.exec(&id, "echo current > f").await;
    // Corrupt every pack of alice's store.
    let packs = server.data_dir().join("snapshots/alice/packs");
    let mut damaged = 0;
    for pack in std::fs::read_dir(&packs).unwrap() {
        std::fs::write(pack.unwrap().path(), b"garbage").unwrap();
        damaged += 1;
    }
    assert!(damaged > 0);
    let (status, body) = restore(&server, &id, &cid).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("checkpoint_unusable")),
        "{body}"
    );
    assert_eq!(
        server.exec(&id, "cat f; ls -A").await["stdout"],
        "current\nbig\nf\n"
    );
    let (status, body) = restore(&server, &id, "ckpt-nope").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("checkpoint_not_found"))
    );
    // Another uid's store is another directory: nothing is shared or probed across uids.
    let bob = server.sandbox("bob", "t", "projects/b").await;
    server.exec(&bob, "echo original > f").await;
    checkpoint(&server, &bob).await;
    assert!(server.data_dir().join("snapshots/bob/packs").is_dir());
}

#[tokio::test]
async fn old_checkpoints_are_dropped_and_their_unshared_chunks_collected() {
    let config = super::write_config("[snapshots]\nkeep_checkpoints = 2\ngc_grace_s = 1\n");
    let server = TestServer::start_with(
        super::bin(),
        &[
            "--backend",
            "memory",
            "--config",
            config.path().to_str().unwrap(),
        ],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let file = server.workspace_of("alice").join("projects/a/data.txt");
    let mut ids = Vec::new();
    for round in 0..3 {
        std::fs::write(&file, format!("round {round}")).unwrap();
        ids.push(
            checkpoint(&server, &id).await["checkpoint"]["checkpoint_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let (_, list) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/checkpoints")))
        .await;
    let kept: Vec<&str> = list["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["checkpoint_id"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [ids[1].as_str(), ids[2].as_str()], "the oldest goes");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, stats) = server
        .send_json(server.request(Method::POST, "/v1/users/alice/snapshots/gc"))
        .await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["chunks_kept"], 2, "{stats}");
    let packs = std::fs::read_dir(server.data_dir().join("snapshots/alice/packs"))
        .unwrap()
        .count();
    assert_eq!(
        packs, 2,
        "the first round's pack was not collected: {stats}"
    );
    // What is kept still restores.
    let (status, _) = restore(&server, &id, &ids[1]).await;
    assert_eq!(status, 200);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "round 1");
}

#[tokio::test]
async fn checkpoints_can_live_in_an_s3_compatible_store() {
    let s3 = warren_test_support::S3Server::start();
    let config = super::write_config(&s3.snapshots_config());
    let server = TestServer::start_with(
        super::bin(),
        &[
            "--backend",
            "memory",
            "--config",
            config.path().to_str().unwrap(),
        ],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let file = server.workspace_of("alice").join("projects/a/report.md");
    std::fs::write(&file, "# v1\n").unwrap();
    let created = checkpoint(&server, &id).await;
    assert_eq!(created["summary"]["chunks_new"], 1, "{created}");
    assert!(
        !server.data_dir().join("snapshots").exists(),
        "an S3-backed server wrote snapshots locally"
    );
    std::fs::write(&file, "# v2\n").unwrap();
    let cid = created["checkpoint"]["checkpoint_id"].as_str().unwrap();
    let (status, body) = restore(&server, &id, cid).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "# v1\n");

    // A half-described S3 store stops warren at start-up, naming what is missing.
    let broken = super::write_config(
        "[snapshots]\nstore = \"s3\"\n[snapshots.s3]\nendpoint = \"http://127.0.0.1:1\"\n",
    );
    let data = tempfile::tempdir().unwrap();
    let out = warren_test_support::run_to_exit(
        super::bin(),
        &[
            "serve",
            "--config",
            broken.path().to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("snapshots.s3.bucket is required"));
}

/// Serves with `config_text`, checkpoints a file, changes it and restores it; returns
/// the server so the caller can check where the checkpoint was kept.
async fn checkpoint_round_trip(config_text: &str, content: &str) -> TestServer {
    let config = super::write_config(config_text);
    let server = TestServer::start_with(
        super::bin(),
        &[
            "--backend",
            "memory",
            "--config",
            config.path().to_str().unwrap(),
        ],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let file = server.workspace_of("alice").join("projects/a/notes.md");
    std::fs::write(&file, content).unwrap();
    let cid = checkpoint(&server, &id).await["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::write(&file, "changed\n").unwrap();
    let (status, body) = restore(&server, &id, &cid).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), content);
    server
}

#[tokio::test]
async fn checkpoints_can_live_in_the_state_store() {
    let server = checkpoint_round_trip("[snapshots]\nstore = \"sql\"\n", "kept in SQL\n").await;
    assert!(!server.data_dir().join("snapshots").exists());
}

#[tokio::test]
async fn checkpoints_can_live_in_redis() {
    let redis = warren_test_support::RedisServer::start();
    let config = format!(
        "[snapshots]\nstore = \"redis\"\n[snapshots.redis]\nurl = \"{}\"\n",
        redis.url
    );
    let server = checkpoint_round_trip(&config, "kept in Redis\n").await;
    assert!(!server.data_dir().join("snapshots").exists());
}

/// Makes, in the current directory: `caf\xe9` (a file), `d\xff\xfe/` holding `in\xe9` and
/// `h\xe9` (a hard link of `caf\xe9`), and `l\xe9`, a symlink to `/nowhere/\xff`. None of
/// these names or the target is UTF-8.
pub(crate) const PLANT_NON_UTF8: &str = r#"c=$(printf 'caf\351'); d=$(printf 'd\377\376'); \
    echo latin > "$c" && mkdir "$d" && echo inside > "$d/$(printf 'in\351')" \
    && ln "$c" "$d/$(printf 'h\351')" && ln -s "$(printf '/nowhere/\377')" "$(printf 'l\351')" \
    && echo planted"#;

/// Prints what [`PLANT_NON_UTF8`] made, read back by the exact names: the three contents,
/// the link's target in hex, and how many names the directory holds.
pub(crate) const CHECK_NON_UTF8: &str = r#"c=$(printf 'caf\351'); d=$(printf 'd\377\376'); \
    cat "$c" "$d/$(printf 'in\351')" "$d/$(printf 'h\351')"; \
    readlink "$(printf 'l\351')" | od -An -tx1; ls -A | wc -l"#;

/// What [`CHECK_NON_UTF8`] prints when every name came back.
pub(crate) const NON_UTF8_PLANTED: &str =
    "latin\ninside\nlatin\n 2f 6e 6f 77 68 65 72 65 2f ff 0a\n3\n";

#[tokio::test]
async fn names_that_are_not_utf8_come_back_byte_for_byte_after_a_restore() {
    let server = local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let setup = server.exec(&id, PLANT_NON_UTF8).await;
    assert_eq!(setup["stdout"], "planted\n", "{setup}");
    let first = checkpoint(&server, &id).await;
    let cid = first["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(first["summary"]["files"], 2, "{first}");
    assert_eq!(first["summary"]["symlinks"], 1, "{first}");

    let wiped = server.exec(&id, "rm -rf ./* && ls -A | wc -l").await;
    assert_eq!(wiped["stdout"], "0\n", "{wiped}");
    // The API shows such names lossily, as it always did.
    let (status, diff) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/checkpoints/{cid}/diff"),
        ))
        .await;
    assert_eq!(status, 200, "{diff}");
    let mut removed: Vec<String> = serde_json::from_value(diff["removed"].clone()).unwrap();
    removed.sort();
    assert_eq!(
        removed,
        [
            "caf\u{FFFD}",
            "d\u{FFFD}\u{FFFD}",
            "d\u{FFFD}\u{FFFD}/h\u{FFFD}",
            "d\u{FFFD}\u{FFFD}/in\u{FFFD}",
            "l\u{FFFD}"
        ]
    );

    let (status, body) = restore(&server, &id, &cid).await;
    assert_eq!(status, 200, "{body}");
    let result = server.exec(&id, CHECK_NON_UTF8).await;
    assert_eq!(result["stdout"], NON_UTF8_PLANTED, "{result}");
    let links = server
        .exec(&id, r#"stat -c %h "$(printf 'd\377\376/h\351')""#)
        .await;
    assert_eq!(
        links["stdout"], "2\n",
        "the hard link came back as one: {links}"
    );
}
