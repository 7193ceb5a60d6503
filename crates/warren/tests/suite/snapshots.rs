//! Runtime snapshots and resume (I30) with real runtimes: what a command installed in the
//! copy-on-write layer and left in /home/gem survives an idle reap.

use std::time::Duration;

use reqwest::Method;
use warren_test_support::TestServer;

use super::bin;

#[tokio::test]
async fn installs_and_home_files_survive_a_reap_and_come_back_on_the_next_use() {
    let server = TestServer::start_with(bin(), &["--idle-timeout", "1", "--reap-interval", "1"]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let setup = server
        .exec(
            &id,
            "mkdir -p /usr/local/lib/python3/dist-packages/fakepkg /home/gem/.cache/pip \
             && echo 'VERSION = 1' > /usr/local/lib/python3/dist-packages/fakepkg/__init__.py \
             && ln -s fakepkg /usr/local/lib/python3/dist-packages/alias \
             && echo cached > /home/gem/.cache/pip/wheel && echo gone > /tmp/scratch \
             && echo workspace > /home/gem/user-data/projects/a/kept.txt && echo ok",
        )
        .await;
    assert_eq!(setup["stdout"], "ok\n", "{setup}");

    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(20))
            .await,
        "the runtime was not reaped"
    );
    let (_, list) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/snapshots")))
        .await;
    let snapshots = list["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 1, "{list}");
    assert_eq!(snapshots[0]["reason"], "reap");

    let resumed = server
        .exec(
            &id,
            "cat /usr/local/lib/python3/dist-packages/fakepkg/__init__.py \
             /usr/local/lib/python3/dist-packages/alias/__init__.py /home/gem/.cache/pip/wheel \
             /home/gem/user-data/projects/a/kept.txt; test -e /tmp/scratch || echo no-tmp; \
             stat -c %U /home/gem/.cache/pip/wheel",
        )
        .await;
    assert_eq!(
        resumed["stdout"], "VERSION = 1\nVERSION = 1\ncached\nworkspace\nno-tmp\ngem\n",
        "{resumed}"
    );
    // Nothing of the seed is left on the host.
    let seeds = server.data_dir().join("seeds");
    assert!(
        !seeds.exists() || std::fs::read_dir(&seeds).unwrap().next().is_none(),
        "a seed directory was left behind"
    );
}

#[tokio::test]
async fn a_snapshot_on_demand_needs_a_running_runtime_and_a_terminated_sandbox_starts_fresh() {
    let server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/snapshots")))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("runtime_not_running"))
    );
    server.exec(&id, "echo state > /home/gem/note").await;
    // Init's handle on the copy-on-write layer is out of the sandbox user's reach.
    let probe = server
        .exec(
            &id,
            "ls /proc/1/fd/200/ >/dev/null 2>&1 && echo reachable || echo denied",
        )
        .await;
    assert_eq!(probe["stdout"], "denied\n", "{probe}");
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/snapshots")))
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(body["snapshot_id"].as_str().unwrap().starts_with("snap-"));
    // Termination ends the root execution tree: the next generation starts clean.
    server.terminate(&id).await;
    let id = server.sandbox("alice", "t", "projects/a").await;
    let fresh = server
        .exec(&id, "test -e /home/gem/note || echo fresh")
        .await;
    assert_eq!(fresh["stdout"], "fresh\n");
}

#[tokio::test]
async fn a_new_sandbox_can_start_from_a_snapshot_of_the_same_uid_only() {
    let server = TestServer::start_local(bin());
    let source = server.sandbox("alice", "base", "projects/a").await;
    server
        .exec(&source, "mkdir -p /opt/tool && echo v7 > /opt/tool/VERSION")
        .await;
    let (status, snapshot) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{source}/snapshots")))
        .await;
    assert_eq!(status, 201, "{snapshot}");
    let snapshot_id = snapshot["snapshot_id"].as_str().unwrap().to_owned();
    let create = |uid: &str, scope: &str| {
        server
            .request(Method::POST, "/v1/sandboxes")
            .json(&serde_json::json!({
                "uid": uid, "runtime_scope_id": scope, "workdir": "projects/a",
                "from_snapshot": snapshot_id,
            }))
    };
    let (status, body) = server.send_json(create("alice", "fork")).await;
    assert_eq!(status, 201, "{body}");
    let fork = body["sandbox_id"].as_str().unwrap().to_owned();
    let seen = server.exec(&fork, "cat /opt/tool/VERSION").await;
    assert_eq!(seen["stdout"], "v7\n", "{seen}");

    // Another user cannot start from alice's state, and a live sandbox cannot be re-seeded.
    server.workdir("bob", "projects/a").await;
    let (status, body) = server.send_json(create("bob", "fork")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("snapshot_not_found")),
        "{body}"
    );
    let (status, body) = server.send_json(create("alice", "fork")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("sandbox_already_live")),
        "{body}"
    );
}

#[tokio::test]
async fn another_server_process_resumes_a_runtime_whose_node_died() {
    let mut server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    server
        .exec(
            &id,
            "mkdir -p /usr/local/share/dep && echo installed > /usr/local/share/dep/marker",
        )
        .await;
    let (status, _) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/snapshots")))
        .await;
    assert_eq!(status, 201);
    // The node dies: the server and every runtime on it are gone.
    server.kill();
    warren_test_support::reap_runtimes(&server.data_dir());
    // Another server process on the same store and workspace directory takes over.
    server.restart_after_kill();
    let resumed = server.exec(&id, "cat /usr/local/share/dep/marker").await;
    assert_eq!(resumed["stdout"], "installed\n", "{resumed}");
}

#[tokio::test]
async fn only_the_latest_runtime_snapshots_are_kept() {
    let server = TestServer::start_local(bin());
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mut taken = Vec::new();
    for round in 0..7 {
        server
            .exec(&id, &format!("echo {round} > /home/gem/round"))
            .await;
        let (status, body) = server
            .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/snapshots")))
            .await;
        assert_eq!(status, 201, "{body}");
        taken.push(body["snapshot_id"].as_str().unwrap().to_owned());
    }
    let (_, list) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/snapshots")))
        .await;
    let kept: Vec<&str> = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot_id"].as_str().unwrap())
        .collect();
    let newest: Vec<&str> = taken[2..].iter().map(String::as_str).collect();
    assert_eq!(kept, newest, "the oldest two go");
}

#[tokio::test]
async fn names_that_are_not_utf8_in_home_and_the_layers_survive_a_reap() {
    use super::checkpoints::{CHECK_NON_UTF8, NON_UTF8_PLANTED, PLANT_NON_UTF8};
    let server = TestServer::start_with(bin(), &["--idle-timeout", "1", "--reap-interval", "1"]);
    let id = server.sandbox("alice", "t", "projects/a").await;
    let setup = server
        .exec(
            &id,
            &format!(
                "mkdir -p /home/gem/odd /usr/local/odd && cd /home/gem/odd && {PLANT_NON_UTF8} \
                 && cd /usr/local/odd && {PLANT_NON_UTF8}"
            ),
        )
        .await;
    assert_eq!(setup["stdout"], "planted\nplanted\n", "{setup}");

    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(20))
            .await,
        "the runtime was not reaped"
    );
    let (_, list) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/snapshots")))
        .await;
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1, "{list}");

    // A resumed runtime's seed is copied in file by file, so hard links come back as
    // copies whatever their names: only names, contents and targets are compared.
    let resumed = server
        .exec(
            &id,
            &format!("cd /home/gem/odd && {CHECK_NON_UTF8}; cd /usr/local/odd && {CHECK_NON_UTF8}"),
        )
        .await;
    assert_eq!(
        resumed["stdout"],
        format!("{NON_UTF8_PLANTED}{NON_UTF8_PLANTED}"),
        "{resumed}"
    );
}
