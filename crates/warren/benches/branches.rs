//! Branches, fork and merge (issue 37) on a 1 GiB, 20,000-file workdir, measured in one run
//! against one server (release build, local backend, loopback) beside their anchors. Not a
//! test: it asserts only that each answer is right, and prints each figure beside its
//! anchor's as a ratio, with the target ratio.
//!
//! The workdir: 200 directories of 100 files of ~52 KiB of incompressible bytes, written
//! on the host into the uid's workspace (owned by the sandbox user), then `sync`ed. The page
//! cache is warm for every side (nothing is dropped from it).
//! - Branch creation: `POST /v1/users/{uid}/branches` of the workdir with no running
//!   sandbox bound to it, median of 5 (each branch deleted after, outside the timing).
//! - Fork, create to first exec: `POST /v1/sandboxes/{id}/fork {count: 1}` of a running
//!   sandbox bound to the workdir (paused, snapshotted and resumed by the fork), until the
//!   first `exec true` in the fork answered; median of 3, each from a fresh source, its
//!   sandboxes and branches removed after.
//! - Their anchor: `cp -a` of the workdir to a directory on the same filesystem, median of 3
//!   (each copy removed and `sync`ed after, outside the timing). Target ≤ 0.05×.
//! - Merge: a branch whose sandbox appended a line to 1,000 files (not timed), merged into
//!   the workdir by a sandbox bound to it (`POST /v1/sandboxes/{id}/merge` with its guard's
//!   token), one run. A merge first checkpoints the target: two checkpoints of the same
//!   sandbox are timed before it, the full first and the incremental second, so the share
//!   of the merge's own (incremental) checkpoint shows.
//! - Its anchor: `git merge --no-edit` of a branch with the same change committed, in a
//!   repository of the same tree (committed outside the timing), from `main` which has a
//!   commit changing another file (a real three-way merge, not a fast-forward); median of 3
//!   (`git reset --hard HEAD~1` between, outside the timing; automatic gc off).
//!
//! Run as root (the local backend's namespaces, overlay mounts) with Debian's `git`:
//! `cargo bench -p warren --bench branches` (`-- --files N --mib M` for a smaller tree, a
//! quick look; the figures are the default 20,000 files and 1,024 MiB).

use std::fs;
use std::os::unix::fs::chown;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::latency::{ms, percentile};
use warren_test_support::workload::Noise;
use warren_test_support::TestServer;

const UID: &str = "bench";
const WORKDIR: &str = "projects/big";
const FILES_PER_DIR: usize = 100;
const CHANGED: usize = 1000;
/// The sandbox user, who owns the workdir's files.
const OWNER: u32 = 1000;
const FENCE: &str = "X-Warren-Fence";

fn flag(name: &str) -> Option<usize> {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
}

/// Sends a request (a JSON body, a fence token) and asserts its status; the JSON answer.
async fn call(
    server: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
    fence: Option<&str>,
    want: u16,
) -> Value {
    let mut request = server.request(method.clone(), path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    if let Some(token) = fence {
        request = request.header(FENCE, token);
    }
    let (status, answer) = server.send_json(request).await;
    assert_eq!(status, want, "{method} {path}: {answer}");
    answer
}

/// A sandbox of `scope` bound to the workdir, or to `branch` of it; its id.
async fn bind(server: &TestServer, scope: &str, branch: Option<&str>) -> String {
    let mut body = json!({"uid": UID, "runtime_scope_id": scope, "workdir": WORKDIR});
    if let Some(branch) = branch {
        body["branch"] = json!(branch);
    }
    let (status, answer) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
        .await;
    assert!(
        status == 201 || status == 200,
        "bind {scope}: {status} {answer}"
    );
    answer["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_owned()
}

async fn exec_ok(server: &TestServer, id: &str, command: &str) {
    let result = server.exec(id, command).await;
    assert_eq!(result["exit_code"], 0, "{command:.80}: {result}");
}

/// Deletes every branch of the workdir (their sandboxes terminated first).
async fn clear_branches(server: &TestServer) {
    let path = format!(
        "/v1/users/{UID}/branches?workdir={}",
        WORKDIR.replace('/', "%2F")
    );
    let list = call(server, Method::GET, &path, None, None, 200).await;
    for branch in list["branches"].as_array().expect("branches") {
        let name = branch["name"].as_str().expect("a name");
        let path = format!(
            "/v1/users/{UID}/branches/{name}?workdir={}",
            WORKDIR.replace('/', "%2F")
        );
        let (status, answer) = server
            .send_json(server.request(Method::DELETE, &path))
            .await;
        assert_eq!(status, 204, "delete branch {name}: {answer}");
    }
}

/// Writes `files` files of `size` random bytes under `root`, `FILES_PER_DIR` a directory,
/// owned by the sandbox user; their paths relative to `root`.
fn write_tree(root: &Path, files: usize, size: usize) -> Vec<String> {
    let own = |path: &Path| chown(path, Some(OWNER), Some(OWNER)).expect("chown");
    let mut noise = Noise(0x2545_f491_4f6c_dd1d);
    let mut bytes = vec![0u8; size];
    let mut names = Vec::with_capacity(files);
    for n in 0..files {
        let dir = format!("d{:03}", n / FILES_PER_DIR);
        if n % FILES_PER_DIR == 0 {
            fs::create_dir(root.join(&dir)).expect("create a directory");
            own(&root.join(&dir));
        }
        let name = format!("{dir}/f{:03}.bin", n % FILES_PER_DIR);
        noise.fill(&mut bytes);
        fs::write(root.join(&name), &bytes).expect("write a file");
        own(&root.join(&name));
        names.push(name);
    }
    names
}

/// Runs a program to success; how long it took.
fn timed(program: &str, args: &[&str], cwd: &Path) -> Duration {
    let started = Instant::now();
    let status = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(status.success(), "{program} {args:?}: {status}");
    started.elapsed()
}

/// The tree is the sandbox user's and git runs as root: the repository is trusted.
const GIT_SETTINGS: [&str; 6] = [
    "-c",
    "user.name=bench",
    "-c",
    "user.email=bench@example.invalid",
    "-c",
    "safe.directory=*",
];

fn git(repo: &Path, args: &[&str]) -> Duration {
    let mut all = GIT_SETTINGS.to_vec();
    all.extend_from_slice(args);
    timed("git", &all, repo)
}

fn git_output(repo: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(GIT_SETTINGS)
        .args(args)
        .current_dir(repo)
        .output()
        .expect("run git");
    assert!(output.status.success(), "git {args:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn median(samples: &mut [Duration]) -> Duration {
    percentile(samples, 0.5)
}

fn table_row(operation: &str, ours: Duration, anchor: &str, theirs: Duration, target: &str) {
    let ratio = ours.as_secs_f64() / theirs.as_secs_f64();
    println!(
        "{operation:<44} {:>12}   {anchor:<28} {:>12}   {:>8}   {target}",
        ms(ours),
        ms(theirs),
        format!("{ratio:.4}x")
    );
}

#[tokio::main]
async fn main() {
    let files = flag("--files").unwrap_or(20_000).max(CHANGED + 1);
    let mib = flag("--mib").unwrap_or(1024);
    let size = (mib << 20).div_ceil(files);
    let server = TestServer::start_local(Path::new(env!("CARGO_BIN_EXE_warren")));
    server.workdir(UID, WORKDIR).await;
    let workdir = server.workspace_of(UID).join(WORKDIR);
    let written = Instant::now();
    let names = write_tree(&workdir, files, size);
    timed("sync", &[], &workdir);
    let total = files * size;
    println!(
        "branches, fork and merge: a workdir of {files} files in {} directories, {:.0} MiB \
         ({size} bytes each, random), written in {:.1} s; page cache warm throughout\n",
        files.div_ceil(FILES_PER_DIR),
        total as f64 / 1048576.0,
        written.elapsed().as_secs_f64()
    );

    // The anchor of branch creation and fork: `cp -a` on the same filesystem.
    let scratch = tempfile::tempdir_in(server.data_dir().parent().expect("a parent"))
        .expect("a scratch directory");
    let copy = scratch.path().join("copy");
    let mut copies = Vec::new();
    for run in 0..3 {
        if run > 0 {
            fs::remove_dir_all(&copy).expect("remove the copy");
            timed("sync", &[], scratch.path());
        }
        let (from, to) = (workdir.to_str().unwrap(), copy.to_str().unwrap());
        copies.push(timed("cp", &["-a", from, to], scratch.path()));
    }
    timed("sync", &[], scratch.path());

    // Branch creation, with no sandbox bound to the workdir.
    let mut branches = Vec::new();
    for n in 0..5 {
        let name = format!("bench-{n}");
        let started = Instant::now();
        let body = json!({"workdir": WORKDIR, "name": name});
        let path = format!("/v1/users/{UID}/branches");
        call(&server, Method::POST, &path, Some(body), None, 201).await;
        branches.push(started.elapsed());
        clear_branches(&server).await;
    }

    // Fork of a running sandbox bound to the workdir, to the first exec in the fork.
    let mut forks = Vec::new();
    for n in 0..3 {
        let source = bind(&server, &format!("source-{n}"), None).await;
        exec_ok(&server, &source, "true").await;
        let started = Instant::now();
        let path = format!("/v1/sandboxes/{source}/fork");
        let forked = call(
            &server,
            Method::POST,
            &path,
            Some(json!({"count": 1})),
            None,
            201,
        )
        .await;
        let fork = forked["forks"][0]["sandbox_id"]
            .as_str()
            .unwrap_or_else(|| panic!("a fork: {forked}"))
            .to_owned();
        exec_ok(&server, &fork, "true").await;
        forks.push(started.elapsed());
        server.terminate(&fork).await;
        server.terminate(&source).await;
        clear_branches(&server).await;
    }

    // Merge: a branch with 1,000 changed files (not timed), merged into the workdir.
    let per_dir = CHANGED.div_ceil(files.div_ceil(FILES_PER_DIR));
    let changed: Vec<&str> = names
        .iter()
        .enumerate()
        .filter(|(n, _)| n % FILES_PER_DIR < per_dir)
        .map(|(_, name)| name.as_str())
        .take(CHANGED)
        .collect();
    let other = names.last().expect("files").as_str();
    assert!(!changed.contains(&other), "the other file is not changed");
    let change = format!(
        "for f in {}; do echo changed >> \"$f\"; done",
        changed.join(" ")
    );
    let body = json!({"workdir": WORKDIR, "name": "change"});
    let path = format!("/v1/users/{UID}/branches");
    call(&server, Method::POST, &path, Some(body), None, 201).await;
    let editor = bind(&server, "editor", Some("change")).await;
    exec_ok(&server, &editor, &change).await;
    server.terminate(&editor).await;
    let merger = bind(&server, "merger", None).await;
    let guard = call(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{merger}/guard"),
        Some(json!({"holder": "bench", "ttl_s": 3600})),
        None,
        201,
    )
    .await;
    let token = guard["token"].as_i64().expect("a token").to_string();
    let mut checkpoints = Vec::new();
    for _ in 0..2 {
        let started = Instant::now();
        let path = format!("/v1/sandboxes/{merger}/checkpoints");
        let made = call(&server, Method::POST, &path, None, Some(&token), 201).await;
        checkpoints.push((started.elapsed(), made["summary"].clone()));
    }
    let started = Instant::now();
    let path = format!("/v1/sandboxes/{merger}/merge");
    let body = json!({"branches": ["change"]});
    let merged = call(&server, Method::POST, &path, Some(body), Some(&token), 200).await;
    let merge = started.elapsed();
    assert_eq!(merged["applied"], true, "{merged}");
    let steps = merged["steps"].as_array().map_or(0, Vec::len);
    assert_eq!(steps, CHANGED, "one step a changed file: {merged}");
    let first = changed[0];
    let text = fs::read(workdir.join(first)).expect("read a merged file");
    assert!(text.ends_with(b"changed\n"), "{first} was merged");
    drop(server);

    // The anchor of merge: git, in a repository of the same tree (the last copy).
    let repo = copy.as_path();
    git(repo, &["init", "-q", "-b", "main"]);
    git(repo, &["config", "gc.auto", "0"]);
    git(repo, &["config", "maintenance.auto", "false"]);
    let committed = Instant::now();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "base"]);
    let commit_time = committed.elapsed();
    git(repo, &["checkout", "-q", "-b", "change"]);
    timed("sh", &["-c", &change], repo);
    git(repo, &["commit", "-q", "-a", "-m", "change"]);
    git(repo, &["checkout", "-q", "main"]);
    timed("sh", &["-c", &format!("echo other >> {other}")], repo);
    git(repo, &["commit", "-q", "-a", "-m", "other"]);
    let mut git_merges = Vec::new();
    for run in 0..3 {
        if run > 0 {
            git(repo, &["reset", "-q", "--hard", "HEAD~1"]);
        }
        git_merges.push(git(repo, &["merge", "-q", "--no-edit", "change"]));
        let parents = git_output(repo, &["rev-list", "--parents", "-n", "1", "HEAD"]);
        assert_eq!(parents.split(' ').count(), 3, "a merge commit: {parents}");
    }
    drop(scratch);

    let cp = median(&mut copies);
    println!(
        "{:<44} {:>12}   {:<28} {:>12}   {:>8}   target",
        "operation", "warren", "anchor", "anchor", "ratio"
    );
    table_row(
        "branch creation (median of 5)",
        median(&mut branches),
        "cp -a (median of 3)",
        cp,
        "<= 0.05x",
    );
    table_row(
        "fork, create to first exec (median of 3)",
        median(&mut forks),
        "cp -a (median of 3)",
        cp,
        "<= 0.05x",
    );
    table_row(
        "merge of 1,000 changed files (1 run)",
        merge,
        "git merge (median of 3)",
        median(&mut git_merges),
        "-",
    );
    // `cp -a` varies much from run to run on a shared machine: the fastest run as well.
    let fastest = copies[0];
    let ratio = |d: Duration| d.as_secs_f64() / fastest.as_secs_f64();
    println!(
        "against the fastest cp -a ({}): branch creation {:.4}x, fork {:.4}x",
        ms(fastest),
        ratio(branches[branches.len() / 2]),
        ratio(forks[forks.len() / 2])
    );
    let (full, incremental) = (&checkpoints[0], &checkpoints[1]);
    println!(
        "\nthe merge includes a checkpoint of the target: incremental here, as the one timed \
         just before it on the same sandbox took {} ({} bytes read), {:.0}% of the merge; a \
         first, full checkpoint of the workdir took {} ({} bytes read, {} stored)",
        ms(incremental.0),
        incremental.1["bytes_read"],
        100.0 * incremental.0.as_secs_f64() / merge.as_secs_f64(),
        ms(full.0),
        full.1["bytes_read"],
        full.1["bytes_stored"],
    );
    println!(
        "branch runs: {:?}\nfork runs: {:?}\ncp -a runs: {:?}\ngit merge runs: {:?}\n\
         (git add + commit of the tree, not timed in the table: {:.1} s)",
        branches.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        forks.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        copies.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        git_merges.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        commit_time.as_secs_f64()
    );
}
