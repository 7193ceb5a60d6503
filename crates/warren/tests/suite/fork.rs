//! Fork through the real server (issue 37): three forks of a sandbox that installed a
//! package each see the package and the source's files, and each writes its own branch:
//! a write in one is absent from the others and from the source.

use reqwest::Method;
use serde_json::{json, Value};

use super::conformance::Host;
use super::output;

rules_on!(
    local,
    Local,
    [three_forks_see_the_package_and_write_only_their_own_branch]
);
rules_on!(
    docker,
    Docker,
    [three_forks_see_the_package_and_write_only_their_own_branch]
);

/// Asserts a command exited 0; its stdout.
fn ran(result: &Value) -> String {
    assert_eq!(result["exit_code"], 0, "{}: {result}", output(result));
    result["stdout"].as_str().unwrap_or_default().to_owned()
}

async fn three_forks_see_the_package_and_write_only_their_own_branch(host: Host) {
    let server = host.start();
    let (status, workdir) = server
        .send_json(
            server
                .request(Method::POST, "/v1/users/alice/workdirs")
                .json(&json!({ "path": "projects/forked" })),
        )
        .await;
    assert!(status == 201 || status == 200, "{status} {workdir}");
    let (status, source) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "source", "workdir": "projects/forked"
        })))
        .await;
    assert_eq!(status, 201, "{source}");
    let source = source["sandbox_id"].as_str().unwrap().to_owned();
    // "Install a package" where `pip install --user` puts one: the home, which the
    // runtime snapshot a fork starts from keeps (I30); the root may be read-only (Docker).
    let installed = "$HOME/.local/lib/warren-fork-pkg/VERSION";
    ran(&server
        .exec(
            &source,
            "mkdir -p $HOME/.local/lib/warren-fork-pkg && \
             echo v1 > $HOME/.local/lib/warren-fork-pkg/VERSION && echo work > work.txt",
        )
        .await);

    let (status, forked) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{source}/fork"))
                .json(&json!({ "count": 3 })),
        )
        .await;
    assert_eq!(status, 201, "{forked}");
    assert!(forked["snapshot_id"].is_string(), "{forked}");
    assert!(
        forked["not_forked"].as_str().unwrap().contains("processes"),
        "{forked}"
    );
    let source_branch = forked["source"]["branch"].as_str().unwrap().to_owned();
    let forks: Vec<String> = forked["forks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|fork| {
            assert_eq!(fork["uid"], "alice", "{fork}");
            assert_eq!(fork["workdir"], "projects/forked", "{fork}");
            assert_ne!(
                fork["branch"].as_str(),
                Some(source_branch.as_str()),
                "{fork}"
            );
            fork["sandbox_id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(forks.len(), 3);
    for fork in &forks {
        let seen = ran(&server
            .exec(fork, &format!("cat {installed} work.txt"))
            .await);
        assert_eq!(seen, "v1\nwork\n", "{fork}");
    }
    ran(&server.exec(&forks[0], "echo mine > only-one.txt").await);
    for other in [&forks[1], &forks[2], &source] {
        let seen = ran(&server
            .exec(other, "test -e only-one.txt && echo present || echo absent")
            .await);
        assert_eq!(seen, "absent\n", "{other}");
    }
    // The source runs on, writing its own branch.
    ran(&server.exec(&source, "echo later > later.txt").await);
    let seen = ran(&server
        .exec(
            &forks[0],
            "test -e later.txt && echo present || echo absent",
        )
        .await);
    assert_eq!(seen, "absent\n");
    // A count out of 1..20 is refused, nothing made.
    let (status, refused) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{source}/fork"))
                .json(&json!({ "count": 21 })),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
}
