//! Workdir branches and their merger through the real server (issue 37, I27): parallel
//! executors each write their own branch of a read-only baseline, an explicit merger brings
//! the results back three-way, all or nothing (a `kill -9` mid-merge included), and no
//! branch or merge route is a way out of the user's workspace.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_test_support::TestServer;

use super::conformance::Host;
use super::output;
use super::runtime_files::{get as read, put};

rules_on!(
    local,
    Local,
    [
        two_sandboxes_on_two_branches_edit_different_lines_and_the_merge_holds_both,
        a_conflicting_edit_is_reported_with_all_three_versions_and_nothing_is_applied,
        the_baseline_refuses_writes_while_branched,
        a_merge_killed_midway_leaves_the_target_whole,
        path_attacks_through_branch_and_merge_routes_are_refused
    ]
);
rules_on!(
    docker,
    Docker,
    [
        two_sandboxes_on_two_branches_edit_different_lines_and_the_merge_holds_both,
        a_conflicting_edit_is_reported_with_all_three_versions_and_nothing_is_applied,
        the_baseline_refuses_writes_while_branched,
        a_merge_killed_midway_leaves_the_target_whole,
        path_attacks_through_branch_and_merge_routes_are_refused
    ]
);

const FENCE: &str = "X-Warren-Fence";

/// The name every merge's staging directory begins with, at the target's top.
const STAGING_PREFIX: &str = ".warren-merge-";

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// `line 1` to `line {n}`, one a line.
fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

/// `text` with line `number` (1-based) replaced by `line`.
fn with_line(text: &str, number: usize, line: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(i, old)| {
            if i + 1 == number {
                format!("{line}\n")
            } else {
                format!("{old}\n")
            }
        })
        .collect()
}

/// Asserts a command exited 0; its result.
fn ran(result: Value) -> Value {
    assert_eq!(result["exit_code"], 0, "{}: {result}", output(&result));
    result
}

/// `POST /v1/sandboxes` for (uid, scope) bound to `workdir`, or to `branch` of it.
async fn bind(
    server: &TestServer,
    uid: &str,
    scope: &str,
    workdir: &str,
    branch: Option<&str>,
) -> (u16, Value) {
    let mut body = json!({ "uid": uid, "runtime_scope_id": scope, "workdir": workdir });
    if let Some(branch) = branch {
        body["branch"] = json!(branch);
    }
    server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
        .await
}

/// [`bind`], asserting it made the sandbox; its id. Its runtime starts on its first command.
async fn bound(
    server: &TestServer,
    uid: &str,
    scope: &str,
    workdir: &str,
    branch: Option<&str>,
) -> String {
    let (status, body) = bind(server, uid, scope, workdir, branch).await;
    assert!(
        status == 201 || status == 200,
        "bind {uid}/{scope} to {workdir} {branch:?}: {status} {body}"
    );
    assert_eq!(body["branch"].as_str(), branch, "{body}");
    body["sandbox_id"].as_str().unwrap().to_owned()
}

async fn create_branch(server: &TestServer, uid: &str, workdir: &str, name: &str) -> (u16, Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/users/{uid}/branches"))
                .json(&json!({ "workdir": workdir, "name": name })),
        )
        .await
}

async fn branch(server: &TestServer, uid: &str, workdir: &str, name: &str) {
    let (status, body) = create_branch(server, uid, workdir, name).await;
    assert_eq!(status, 201, "branch {name} of {workdir}: {body}");
    assert_eq!(
        (&body["workdir"], &body["name"]),
        (&json!(workdir), &json!(name))
    );
}

async fn branches(server: &TestServer, uid: &str, workdir: &str) -> Vec<String> {
    let (status, body) = server
        .send_json(
            server
                .request(Method::GET, &format!("/v1/users/{uid}/branches"))
                .query(&[("workdir", workdir)]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn diff(server: &TestServer, uid: &str, workdir: &str, name: &str) -> (u16, Value) {
    server
        .send_json(
            server
                .request(
                    Method::GET,
                    &format!("/v1/users/{uid}/branches/{name}/diff"),
                )
                .query(&[("workdir", workdir)]),
        )
        .await
}

/// The `(path, change, after)` of each change a branch made, asserting the diff answered.
async fn changes(
    server: &TestServer,
    uid: &str,
    workdir: &str,
    name: &str,
) -> Vec<(String, String, String)> {
    let (status, body) = diff(server, uid, workdir, name).await;
    assert_eq!(status, 200, "diff {name}: {body}");
    body["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["change"].as_str().unwrap().to_owned(),
                c["after"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

async fn delete_branch(server: &TestServer, uid: &str, workdir: &str, name: &str) -> (u16, Value) {
    server
        .send_json(
            server
                .request(Method::DELETE, &format!("/v1/users/{uid}/branches/{name}"))
                .query(&[("workdir", workdir)]),
        )
        .await
}

async fn read_ok(server: &TestServer, id: &str, path: &str) -> String {
    let (status, text) = read(server, id, path).await;
    assert_eq!(status, 200, "read {path}: {text}");
    text
}

/// Takes the sandbox's execution guard; its token.
async fn guard(server: &TestServer, id: &str) -> String {
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/guard"))
                .json(&json!({ "holder": "merger", "ttl_s": 300 })),
        )
        .await;
    assert_eq!(status, 201, "guard: {body}");
    body["token"].as_i64().expect("a token").to_string()
}

async fn release(server: &TestServer, id: &str, token: &str) {
    let (status, body) = server
        .send_json(
            server
                .request(Method::DELETE, &format!("/v1/sandboxes/{id}/guard"))
                .query(&[("token", token)]),
        )
        .await;
    assert_eq!(status, 204, "release: {body}");
}

fn merge_request(
    server: &TestServer,
    id: &str,
    token: &str,
    names: &[&str],
    dry_run: bool,
) -> reqwest::RequestBuilder {
    server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/merge"))
        .header(FENCE, token)
        .json(&json!({ "branches": names, "dry_run": dry_run }))
}

/// Merges `names` into the workdir of `id` as the holder of its guard (taken and released
/// around it).
async fn merge(server: &TestServer, id: &str, names: &[&str], dry_run: bool) -> (u16, Value) {
    let token = guard(server, id).await;
    let answer = server
        .send_json(merge_request(server, id, &token, names, dry_run))
        .await;
    release(server, id, &token).await;
    answer
}

/// Every byte but ASCII letters, digits, `_` and `-` percent-encoded (`.` and `/` too).
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Sends `method target` as written on a raw connection (no client normalizes a `..`
/// segment away); the status and the JSON body.
async fn raw(server: &TestServer, method: &str, target: &str) -> (u16, Value) {
    let address = server.url.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {}\r\n\
         connection: close\r\n\r\n",
        server.token
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The staging directories of merges at the top of `dir` on the host.
fn staging_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|name| name.starts_with(STAGING_PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

async fn two_sandboxes_on_two_branches_edit_different_lines_and_the_merge_holds_both(host: Host) {
    let server = host.start();
    let workdir = "projects/p";
    let original = numbered(10);
    server.workdir("alice", workdir).await;
    // Bound to the workdir itself; its runtime starts only at its first command, after the
    // branches exist, so it never could write the baseline.
    let merger = bound(&server, "alice", "merger", workdir, None).await;
    let (status, body) = put(&server, &merger, "a.txt", &original).await;
    assert_eq!(status, 201, "{body}");

    branch(&server, "alice", workdir, "one").await;
    branch(&server, "alice", workdir, "two").await;
    assert_eq!(branches(&server, "alice", workdir).await, ["one", "two"]);
    let one = bound(&server, "alice", "agent-1", workdir, Some("one")).await;
    let two = bound(&server, "alice", "agent-2", workdir, Some("two")).await;

    // Each edits its own line in its runtime, and adds a file.
    ran(server
        .exec(
            &one,
            "sed -i 's/^line 2$/line 2 by one/' a.txt && echo 'from one' > new-1.txt",
        )
        .await);
    ran(server
        .exec(
            &two,
            "sed -i 's/^line 9$/line 9 by two/' a.txt && echo 'from two' > new-2.txt",
        )
        .await);
    let by_one = with_line(&original, 2, "line 2 by one");
    let by_two = with_line(&original, 9, "line 9 by two");
    assert_eq!(ran(server.exec(&one, "cat a.txt").await)["stdout"], by_one);
    assert_eq!(ran(server.exec(&two, "cat a.txt").await)["stdout"], by_two);
    // Neither sees the other's new file; the baseline is as it was.
    ran(server.exec(&one, "test ! -e new-2.txt").await);
    ran(server.exec(&two, "test ! -e new-1.txt").await);
    assert_eq!(read_ok(&server, &one, "a.txt").await, by_one);
    assert_eq!(read(&server, &one, "new-2.txt").await.0, 404);
    let host_a = server.workspace_of("alice").join(workdir).join("a.txt");
    assert_eq!(std::fs::read_to_string(&host_a).unwrap(), original);
    assert_eq!(read_ok(&server, &merger, "a.txt").await, original);

    for (name, new) in [("one", "new-1.txt"), ("two", "new-2.txt")] {
        assert_eq!(
            changes(&server, "alice", workdir, name).await,
            [
                ("a.txt".to_owned(), "modified".to_owned(), "file".to_owned()),
                (new.to_owned(), "added".to_owned(), "file".to_owned()),
            ],
            "diff of {name}"
        );
    }

    let (status, merged) = merge(&server, &merger, &["one", "two"], false).await;
    assert_eq!(status, 200, "{merged}");
    assert_eq!(merged["applied"], true, "{merged}");
    assert_eq!(merged["conflicts"], json!([]), "{merged}");
    let checkpoint = merged["checkpoint_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a checkpoint id: {merged}"))
        .to_owned();
    let a_step = merged["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == "a.txt")
        .unwrap_or_else(|| panic!("a step for a.txt: {merged}"));
    assert_eq!(a_step["merged_lines"], true, "{merged}");

    let both = with_line(&by_one, 9, "line 9 by two");
    let seen = ran(server.exec(&merger, "cat a.txt new-1.txt new-2.txt").await);
    assert_eq!(
        seen["stdout"],
        format!("{both}from one\nfrom two\n"),
        "{seen}"
    );
    assert_eq!(read_ok(&server, &merger, "a.txt").await, both);
    assert_eq!(read_ok(&server, &merger, "new-1.txt").await, "from one\n");
    assert_eq!(read_ok(&server, &merger, "new-2.txt").await, "from two\n");
    assert_eq!(std::fs::read_to_string(&host_a).unwrap(), both);

    // The baseline is read-only while branched: the branches go first, then the merge is
    // undone by restoring its checkpoint.
    for (id, name) in [(&one, "one"), (&two, "two")] {
        let (status, body) = delete_branch(&server, "alice", workdir, name).await;
        assert_eq!((status, code(&body)), (409, "branch_in_use"), "{body}");
        server.terminate(id).await;
        let (status, body) = delete_branch(&server, "alice", workdir, name).await;
        assert_eq!(status, 204, "delete {name}: {body}");
    }
    assert!(branches(&server, "alice", workdir).await.is_empty());
    let (status, body) = server
        .send_json(server.request(
            Method::POST,
            &format!("/v1/sandboxes/{merger}/checkpoints/{checkpoint}/restore"),
        ))
        .await;
    assert_eq!(status, 200, "restore: {body}");
    assert_eq!(read_ok(&server, &merger, "a.txt").await, original);
    assert_eq!(read(&server, &merger, "new-1.txt").await.0, 404);
    assert_eq!(std::fs::read_to_string(&host_a).unwrap(), original);
    let seen = server
        .exec(
            &merger,
            "cat a.txt; test ! -e new-1.txt && test ! -e new-2.txt && echo gone",
        )
        .await;
    assert_eq!(seen["stdout"], format!("{original}gone\n"), "{seen}");
}

async fn a_conflicting_edit_is_reported_with_all_three_versions_and_nothing_is_applied(host: Host) {
    let server = host.start();
    let workdir = "projects/c";
    let original = numbered(10);
    server.workdir("alice", workdir).await;
    let merger = bound(&server, "alice", "merger", workdir, None).await;
    assert_eq!(put(&server, &merger, "a.txt", &original).await.0, 201);
    branch(&server, "alice", workdir, "x").await;
    branch(&server, "alice", workdir, "y").await;
    let x = bound(&server, "alice", "x", workdir, Some("x")).await;
    let y = bound(&server, "alice", "y", workdir, Some("y")).await;
    ran(server
        .exec(
            &x,
            "sed -i 's/^line 5$/line 5 from x/' a.txt && echo clean > only-x.txt",
        )
        .await);
    ran(server
        .exec(&y, "sed -i 's/^line 5$/line 5 from y/' a.txt")
        .await);
    let from_x = with_line(&original, 5, "line 5 from x");
    let from_y = with_line(&original, 5, "line 5 from y");

    let check = |conflicts: &Value| {
        let list = conflicts
            .as_array()
            .unwrap_or_else(|| panic!("{conflicts}"));
        assert_eq!(list.len(), 1, "{conflicts}");
        let conflict = &list[0];
        assert_eq!(
            (&conflict["path"], &conflict["branch"]),
            (&json!("a.txt"), &json!("y")),
            "{conflict}"
        );
        assert!(
            conflict["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{conflict}"
        );
        for (side, text) in [("base", &original), ("ours", &from_x), ("theirs", &from_y)] {
            assert_eq!(conflict[side]["type"], "text", "{side}: {conflict}");
            assert_eq!(
                conflict[side]["text"].as_str(),
                Some(text.as_str()),
                "{side}: {conflict}"
            );
        }
    };
    // A dry run lists it and changes nothing.
    let (status, dry) = merge(&server, &merger, &["x", "y"], true).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["applied"], false, "{dry}");
    check(&dry["conflicts"]);

    let (status, refused) = merge(&server, &merger, &["x", "y"], false).await;
    assert_eq!(
        (status, code(&refused)),
        (409, "merge_conflict"),
        "{refused}"
    );
    check(&refused["error"]["conflicts"]);

    // Nothing applied: not the conflicting file, nor x's clean new file.
    assert_eq!(read_ok(&server, &merger, "a.txt").await, original);
    assert_eq!(read(&server, &merger, "only-x.txt").await.0, 404);
    let target = server.workspace_of("alice").join(workdir);
    assert_eq!(
        std::fs::read_to_string(target.join("a.txt")).unwrap(),
        original
    );
    assert!(!target.join("only-x.txt").exists());
    assert!(staging_dirs(&target).is_empty());
    let seen = server
        .exec(&merger, "cat a.txt; test ! -e only-x.txt && echo absent")
        .await;
    assert_eq!(seen["stdout"], format!("{original}absent\n"), "{seen}");
    // The branches keep their work.
    assert_eq!(read_ok(&server, &x, "only-x.txt").await, "clean\n");
    assert_eq!(read_ok(&server, &y, "a.txt").await, from_y);
}

async fn the_baseline_refuses_writes_while_branched(host: Host) {
    let server = host.start();
    let workdir = "projects/p";
    server.workdir("alice", workdir).await;
    let merger = bound(&server, "alice", "merger", workdir, None).await;
    assert_eq!(put(&server, &merger, "a.txt", "baseline\n").await.0, 201);
    assert_eq!(put(&server, &merger, "sub/b.txt", "nested\n").await.0, 201);
    branch(&server, "alice", workdir, "b").await;

    // The file API of a sandbox bound to the workdir writes none of it.
    for path in [
        "a.txt",
        "new.txt",
        "sub/b.txt",
        "/home/gem/user-data/projects/p/c.txt",
    ] {
        let (status, body) = put(&server, &merger, path, "overwritten").await;
        assert_eq!(
            (status, code(&body)),
            (409, "workdir_branched"),
            "PUT {path}: {body}"
        );
    }
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{merger}/files/edit"))
                .json(&json!({ "path": "a.txt", "old": "baseline", "new": "edited" })),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (409, "workdir_branched"),
        "edit: {body}"
    );
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{merger}/files/mkdir"))
                .json(&json!({ "path": "made" })),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (409, "workdir_branched"),
        "mkdir: {body}"
    );
    // Nor removes or moves it, a file in it, or a directory holding it.
    for path in [
        "a.txt",
        ".",
        "/home/gem/user-data/projects/p",
        "/home/gem/user-data/projects",
    ] {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::DELETE, &format!("/v1/sandboxes/{merger}/files"))
                    .query(&[("path", path), ("recursive", "true")]),
            )
            .await;
        assert_eq!(
            (status, code(&body)),
            (409, "workdir_branched"),
            "DELETE {path}: {body}"
        );
    }
    for (from, to) in [
        (
            "/home/gem/user-data/projects/p",
            "/home/gem/user-data/moved",
        ),
        ("/home/gem/user-data/projects", "/home/gem/user-data/moved"),
        ("a.txt", "renamed.txt"),
    ] {
        let (status, body) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{merger}/files/move"))
                    .json(&json!({ "from": from, "to": to })),
            )
            .await;
        assert_eq!(
            (status, code(&body)),
            (409, "workdir_branched"),
            "move {from}: {body}"
        );
    }
    let target = server.workspace_of("alice").join(workdir);
    assert_eq!(
        std::fs::read_to_string(target.join("a.txt")).unwrap(),
        "baseline\n"
    );
    assert_eq!(
        std::fs::read_to_string(target.join("sub/b.txt")).unwrap(),
        "nested\n"
    );
    assert!(!target.join("new.txt").exists() && !target.join("made").exists());
    assert!(!server.workspace_of("alice").join("moved").exists());

    // A runtime started after the branch exists sees the baseline read-only.
    for command in [
        "echo x > a.txt",
        "echo x > new.txt",
        "rm a.txt",
        "mkdir made",
    ] {
        let result = server.exec(&merger, command).await;
        assert_ne!(result["exit_code"], 0, "{command}: {result}");
        assert!(
            output(&result).contains("Read-only file system"),
            "{command}: {result}"
        );
    }
    assert_eq!(
        ran(server.exec(&merger, "cat a.txt").await)["stdout"],
        "baseline\n"
    );
    assert_eq!(
        std::fs::read_to_string(target.join("a.txt")).unwrap(),
        "baseline\n"
    );

    // No branch is made of a workdir a running sandbox can write.
    let writer = server.sandbox("carol", "writer", "projects/w").await;
    ran(server.exec(&writer, "echo mine > w.txt").await);
    let (status, body) = create_branch(&server, "carol", "projects/w", "b").await;
    assert_eq!((status, code(&body)), (409, "workdir_in_use"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(&writer),
        "{body}"
    );
    assert!(branches(&server, "carol", "projects/w").await.is_empty());
    // Once it stops being able to, the branch is made.
    server.terminate(&writer).await;
    branch(&server, "carol", "projects/w", "b").await;
}

async fn a_merge_killed_midway_leaves_the_target_whole(host: Host) {
    const FILES: usize = 2000;
    const SIZE: usize = 64 * 1024;
    let mut server = host.start();
    let workdir = "projects/big";
    // What `yes {tag}-{i} | head -c 65536` writes.
    let content = |tag: &str, i: usize| {
        let mut text = format!("{tag}-{i}\n").repeat(SIZE / 6 + 1);
        text.truncate(SIZE);
        text.into_bytes()
    };
    let fill = |tag: &str| {
        format!(
            "i=1; while [ $i -le {FILES} ]; do yes {tag}-$i | head -c {SIZE} > f$i || exit 1; \
             i=$((i + 1)); done"
        )
    };

    // The baseline, written by a sandbox that is gone before the branch is made.
    let setup = server.sandbox("alice", "setup", workdir).await;
    ran(server
        .exec_with(&setup, json!({ "command": fill("old"), "timeout_s": 600 }))
        .await);
    server.terminate(&setup).await;
    let target = server.workspace_of("alice").join(workdir);
    assert_eq!(std::fs::read(target.join("f7")).unwrap(), content("old", 7));

    branch(&server, "alice", workdir, "big").await;
    let agent = bound(&server, "alice", "agent", workdir, Some("big")).await;
    ran(server
        .exec_with(&agent, json!({ "command": fill("new"), "timeout_s": 600 }))
        .await);
    assert_eq!(
        read_ok(&server, &agent, "f7").await.into_bytes(),
        content("new", 7)
    );
    let changed = changes(&server, "alice", workdir, "big").await;
    assert_eq!(
        changed.len(),
        FILES,
        "{:?}",
        &changed[..changed.len().min(5)]
    );
    assert!(changed.iter().all(|(_, change, _)| change == "modified"));

    let merger = bound(&server, "alice", "merger", workdir, None).await;
    let token = guard(&server, &merger).await;
    let merging = tokio::spawn(merge_request(&server, &merger, &token, &["big"], false).send());
    // Kill the server once the merge is mid-way: its staging directory is in the target.
    let deadline = Instant::now() + Duration::from_secs(600);
    let midway = loop {
        if !staging_dirs(&target).is_empty() {
            break true;
        }
        if merging.is_finished() {
            break false;
        }
        assert!(
            Instant::now() < deadline,
            "the merge neither staged nor ended"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    server.kill();
    let answer = merging.await.unwrap();
    eprintln!(
        "killed {}: the merge's answer was {:?}",
        if midway {
            "mid-way (staging seen)"
        } else {
            "after the merge ended"
        },
        answer.as_ref().map(reqwest::Response::status)
    );
    if !midway {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
    }

    // The next start finishes or undoes it.
    server.start_again();
    let mut old = 0;
    let mut new = 0;
    let mut other = Vec::new();
    for i in 1..=FILES {
        let bytes = std::fs::read(target.join(format!("f{i}"))).unwrap_or_default();
        if bytes == content("old", i) {
            old += 1;
        } else if bytes == content("new", i) {
            new += 1;
        } else {
            other.push(i);
        }
    }
    eprintln!(
        "after the restart: {old} old, {new} new, {} neither",
        other.len()
    );
    assert!(other.is_empty(), "files neither old nor new: {other:?}");
    assert!(
        old == FILES || new == FILES,
        "the target is half merged: {old} old, {new} new"
    );
    assert_eq!(
        staging_dirs(&target),
        Vec::<String>::new(),
        "a staging directory is left in the target ({} files old, {} new)",
        old,
        new
    );
    let mut names: Vec<String> = std::fs::read_dir(&target)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = (1..=FILES).map(|i| format!("f{i}")).collect();
    expected.sort();
    assert_eq!(names, expected, "the target holds exactly its files");
    let journals = server.data_dir().join("branches/merge-journals");
    let left: Vec<_> = std::fs::read_dir(&journals)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "journals left: {left:?}");
    // The server serves the target as it is on disk.
    let expected = if new == FILES { "new" } else { "old" };
    assert_eq!(
        read_ok(&server, &merger, "f1999").await.into_bytes(),
        content(expected, 1999)
    );
}

async fn path_attacks_through_branch_and_merge_routes_are_refused(host: Host) {
    let server = host.start();
    let workdir = "projects/a";
    server.workdir("alice", workdir).await;
    let merger = bound(&server, "alice", "merger", workdir, None).await;
    assert_eq!(put(&server, &merger, "a.txt", "alice\n").await.0, 201);
    branch(&server, "alice", workdir, "b").await;

    // Names that are no branch name, wherever a branch is named.
    let long = "a".repeat(65);
    let bad_names = ["..", "../x", "a/b", ".x", "-rf", long.as_str()];
    let query = format!("workdir={}", encoded(workdir));
    for name in bad_names {
        let (status, body) = create_branch(&server, "alice", workdir, name).await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_branch"),
            "create {name:?}: {body}"
        );
        let (status, body) = bind(&server, "alice", "bad", workdir, Some(name)).await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_branch"),
            "bind {name:?}: {body}"
        );
        let token = guard(&server, &merger).await;
        let (status, body) = server
            .send_json(merge_request(&server, &merger, &token, &[name], false))
            .await;
        release(&server, &merger, &token).await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_branch"),
            "merge {name:?}: {body}"
        );
        let mut segments = vec![encoded(name)];
        if !name.contains('/') {
            segments.push(name.to_owned());
        }
        for segment in segments {
            let base = format!("/v1/users/alice/branches/{segment}");
            for (method, target) in [
                ("GET", format!("{base}/diff?{query}")),
                ("DELETE", format!("{base}?{query}")),
            ] {
                let (status, body) = raw(&server, method, &target).await;
                assert_eq!(
                    (status, code(&body)),
                    (400, "invalid_branch"),
                    "{method} {target}: {body}"
                );
            }
        }
    }
    // Workdirs outside the user's projects, wherever a workdir is named.
    for bad in ["../etc", "/etc", "agents/skills"] {
        let (status, body) = create_branch(&server, "alice", bad, "c").await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_workdir"),
            "create in {bad}: {body}"
        );
        for (method, path) in [
            (Method::GET, "/v1/users/alice/branches".to_owned()),
            (Method::GET, "/v1/users/alice/branches/b/diff".to_owned()),
            (Method::DELETE, "/v1/users/alice/branches/b".to_owned()),
        ] {
            let (status, body) = server
                .send_json(
                    server
                        .request(method.clone(), &path)
                        .query(&[("workdir", bad)]),
                )
                .await;
            assert_eq!(
                (status, code(&body)),
                (400, "invalid_workdir"),
                "{method} {path}?workdir={bad}: {body}"
            );
        }
        let (status, body) = bind(&server, "alice", "bad", bad, Some("b")).await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_workdir"),
            "bind to {bad}: {body}"
        );
    }

    // Another uid never finds alice's branch, even with a workdir of the same name.
    server.workdir("bob", workdir).await;
    let (status, body) = diff(&server, "bob", workdir, "b").await;
    assert_eq!(
        (status, code(&body)),
        (404, "branch_not_found"),
        "bob's diff: {body}"
    );
    let (status, body) = delete_branch(&server, "bob", workdir, "b").await;
    assert_eq!(
        (status, code(&body)),
        (404, "branch_not_found"),
        "bob's delete: {body}"
    );
    let (status, body) = bind(&server, "bob", "t", workdir, Some("b")).await;
    assert_eq!(
        (status, code(&body)),
        (404, "branch_not_found"),
        "bob's bind: {body}"
    );
    assert!(branches(&server, "bob", workdir).await.is_empty());
    assert_eq!(branches(&server, "alice", workdir).await, ["b"]);

    // A workdir swapped for a link to /etc (or under one) is never branched.
    server.workdir("eve", "projects/s").await;
    let eve = server.workspace_of("eve");
    std::fs::remove_dir(eve.join("projects/s")).unwrap();
    std::os::unix::fs::symlink("/etc", eve.join("projects/s")).unwrap();
    std::os::unix::fs::symlink("/etc", eve.join("linked")).unwrap();
    for swapped in ["projects/s", "linked/ssl"] {
        let (status, body) = create_branch(&server, "eve", swapped, "b").await;
        assert_eq!(
            (status, code(&body)),
            (403, "symlink_refused"),
            "branch of {swapped} through a link: {body}"
        );
        assert!(branches(&server, "eve", swapped).await.is_empty());
    }
    let eve_branches = server.data_dir().join("branches/eve");
    let made: Vec<_> = std::fs::read_dir(&eve_branches)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(made.is_empty(), "branch trees left for eve: {made:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = server.data_dir().join("branches/eve");
    assert!(
        !mounts.contains(root.to_string_lossy().as_ref()),
        "a branch of eve is mounted"
    );

    // A link to the host's passwd made in a branch merges as a link, never as its target.
    let agent = bound(&server, "alice", "agent", workdir, Some("b")).await;
    ran(server.exec(&agent, "ln -s /etc/passwd leak").await);
    assert_eq!(
        changes(&server, "alice", workdir, "b").await,
        [("leak".to_owned(), "added".to_owned(), "symlink".to_owned())]
    );
    let (status, merged) = merge(&server, &merger, &["b"], false).await;
    assert_eq!(status, 200, "{merged}");
    assert_eq!(merged["applied"], true, "{merged}");
    let leak = server.workspace_of("alice").join(workdir).join("leak");
    assert!(std::fs::symlink_metadata(&leak).unwrap().is_symlink());
    assert_eq!(std::fs::read_link(&leak).unwrap(), Path::new("/etc/passwd"));
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for id in [&merger, &agent] {
        let (status, text) = read(&server, id, "leak").await;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(
            (status, code(&body)),
            (403, "symlink_refused"),
            "read leak: {text}"
        );
        assert!(
            !text.contains("root:") && !text.contains(passwd.trim()),
            "{text}"
        );
    }
}

/// The Kubernetes backend mounts claims, not warren's host: no branch is made or bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_refuses_a_sandbox_bound_to_a_branch() {
    let server = Host::Kubernetes.start();
    server.workdir("alice", "projects/a").await;
    let (status, body) = create_branch(&server, "alice", "projects/a", "b").await;
    assert_eq!(
        (status, code(&body)),
        (422, "branches_unsupported"),
        "{body}"
    );
    let (status, body) = bind(&server, "alice", "t", "projects/a", Some("b")).await;
    assert_eq!(
        (status, code(&body)),
        (422, "branches_unsupported"),
        "{body}"
    );
    let (status, body) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes?uid=alice"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["sandboxes"], json!([]), "{body}");
}
