//! `warren migrate deerflow` (I36): a DeerFlow deployment's files imported into warren's
//! UserWorkspaces, byte for byte and mode for mode, crash-safe at every journal step,
//! refused while anything still uses the source or the data directory, and served
//! afterwards by the native API and the DeerFlow drop-in alike.
//!
//! The deployments come from `warren_test_support::deerflow_tree` (seeded, so two
//! generations of one spec in one place are the same tree). Every check walks both sides
//! itself: `symlink_metadata`, `read_link`, contents by streaming BLAKE3.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::deerflow_tree::{
    file_digest, DeerflowTree, GeneratedTree, TreeSpec, ODD_USER,
};
use warren_test_support::{TestServer, TEST_TOKEN};

use super::bin;

/// DeerFlow's own default user id, and so the migrator's default for legacy threads.
const DEFAULT_UID: &str = "default";
/// The drop-in's provisioner key, for the test that serves the migrated files.
const DEERFLOW_KEY: &str = "deerflow-key-0123456789abcdef0123456789abcdef";
/// The sandbox user every migrated workspace file belongs to (I11).
const SANDBOX: (u32, u32) = (1000, 1000);
/// How a problem of a time kept to the millisecond only begins.
const TRUNCATED: &str = "mtime kept to the millisecond only";
/// The marker of a uid subtree whose ownership was migrated: root's, outside the
/// workspace, so that no sandbox can forge it.
const OWNERSHIP_MARKER: &[u8] = b".warren-owner-1000";

// ---------------------------------------------------------------------------------------
// Where a migration goes, and running the binary.

/// A warren to migrate into: its data directory, and beside it the operator's shared skill
/// directory and a `warren.toml` naming it.
struct Site {
    data: tempfile::TempDir,
    aux: tempfile::TempDir,
}

impl Site {
    fn new() -> Self {
        Self::with_config("")
    }

    /// With `extra` appended to the `warren.toml` (whole tables).
    fn with_config(extra: &str) -> Self {
        let data = tempfile::tempdir().unwrap();
        let aux = tempfile::tempdir().unwrap();
        let shared = aux.path().join("shared-skills");
        fs::create_dir(&shared).unwrap();
        fs::write(
            aux.path().join("warren.toml"),
            format!("[skills]\nshared_dir = \"{}\"\n{extra}", shared.display()),
        )
        .unwrap();
        Self { data, aux }
    }

    fn data(&self) -> &Path {
        self.data.path()
    }

    fn shared(&self) -> PathBuf {
        self.aux.path().join("shared-skills")
    }

    fn config(&self) -> PathBuf {
        self.aux.path().join("warren.toml")
    }

    /// The UserWorkspace of `uid` on the host.
    fn workspace(&self, uid: &str) -> PathBuf {
        workspace_in(self.data(), uid)
    }

    /// Where an item's target is on the host.
    fn target_of(&self, item: &Expected) -> PathBuf {
        match &item.uid {
            Some(uid) => self.workspace(uid).join(&item.target),
            None => self.shared().join(&item.target),
        }
    }

    /// `--config` and `--data-dir`, as every `warren migrate` here gets them.
    fn args(&self) -> Vec<OsString> {
        vec![
            "--config".into(),
            self.config().into(),
            "--data-dir".into(),
            self.data().into(),
        ]
    }
}

fn workspace_in(data_dir: &Path, uid: &str) -> PathBuf {
    let safe = warren_core::Uid::new(uid).unwrap().safe();
    data_dir
        .join("user-data/shared")
        .join(safe.as_str())
        .join("workspace")
}

/// Runs the binary with `args` and nothing of this process's environment but `PATH` (and
/// `env`), for at most ten minutes.
fn run(args: &[OsString], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin());
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("WARREN_LOG", "warn")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command.spawn().expect("start warren");
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(Duration::from_secs(600)) {
        Ok(output) => output.expect("warren ran"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("warren {args:?} did not exit within 10 minutes");
        }
    }
}

fn os_args(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// `warren migrate deerflow --source <source> --json <extra> --config … --data-dir …`.
fn migrate(site: &Site, source: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = os_args(&["migrate", "deerflow", "--source"]);
    args.push(source.into());
    args.push("--json".into());
    args.extend(os_args(extra));
    args.extend(site.args());
    run(&args, env)
}

/// A migration that must succeed; its JSON outcome.
fn migrated(site: &Site, source: &Path, extra: &[&str]) -> Value {
    let out = migrate(site, source, extra, &[]);
    success_json(&out, "warren migrate deerflow")
}

fn success_json(out: &Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{}",
        out.status,
        stderr(out)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A migration that must be refused; its message.
fn refused(site: &Site, source: &Path) -> String {
    let out = migrate(site, source, &[], &[]);
    assert!(
        !out.status.success(),
        "the migration was not refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.stdout.is_empty() || !String::from_utf8_lossy(&out.stdout).contains("\"committed\""),
        "a refused migration reports no commit: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let message = stderr(&out);
    assert!(!message.trim().is_empty(), "a refusal says why");
    message
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `warren migrate status --json` of `site` (with `extra` flags, e.g. `--state`).
fn status(site: &Site, extra: &[&str]) -> Value {
    let mut args = os_args(&["migrate", "status", "--json"]);
    args.extend(os_args(extra));
    args.extend(site.args());
    success_json(&run(&args, &[]), "warren migrate status")
}

/// The status without its timestamps, which differ from run to run.
fn timeless(mut status: Value) -> Value {
    for migration in status["migrations"].as_array_mut().into_iter().flatten() {
        let object = migration.as_object_mut().unwrap();
        object.remove("created_at");
        object.remove("updated_at");
    }
    status
}

// ---------------------------------------------------------------------------------------
// What a migration of a generated tree must produce.

/// One item the migration must report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Expected {
    kind: &'static str,
    source: String,
    uid: Option<String>,
    target: String,
}

/// The items of `tree` with legacy threads going to `default_uid`: each thread, each
/// public skill into the shared skills, each custom skill into every uid with threads.
fn expected_items(tree: &GeneratedTree, default_uid: &str) -> Vec<Expected> {
    let mut items = Vec::new();
    let mut receivers = BTreeSet::new();
    for thread in &tree.threads {
        let uid = thread
            .user
            .clone()
            .unwrap_or_else(|| default_uid.to_owned());
        receivers.insert(uid.clone());
        items.push(Expected {
            kind: "thread",
            source: thread.source.clone(),
            uid: Some(uid),
            target: format!("threads/{}/user-data", thread.thread_id),
        });
    }
    if receivers.is_empty() {
        receivers.insert(default_uid.to_owned());
    }
    for slug in &tree.public_skills {
        items.push(Expected {
            kind: "shared_skill",
            source: format!("skills/public/{slug}"),
            uid: None,
            target: slug.clone(),
        });
    }
    for slug in &tree.custom_skills {
        for uid in &receivers {
            items.push(Expected {
                kind: "personal_skill",
                source: format!("skills/custom/{slug}"),
                uid: Some(uid.clone()),
                target: format!("agents/skills/{slug}"),
            });
        }
    }
    items.sort();
    items
}

/// The items an outcome reports, in the same shape.
fn reported_items(outcome: &Value) -> Vec<Expected> {
    let mut items: Vec<Expected> = outcome["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items: {outcome}"))
        .iter()
        .map(|item| Expected {
            kind: match item["kind"].as_str() {
                Some("thread") => "thread",
                Some("shared_skill") => "shared_skill",
                Some("personal_skill") => "personal_skill",
                other => panic!("unknown kind {other:?} in {item}"),
            },
            source: item["source"].as_str().unwrap().to_owned(),
            uid: item["uid"].as_str().map(str::to_owned),
            target: item["target"].as_str().unwrap().to_owned(),
        })
        .collect();
    items.sort();
    items
}

fn item_entry<'a>(outcome: &'a Value, item: &Expected) -> &'a Value {
    outcome["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|found| {
            found["source"] == item.source.as_str()
                && found["uid"].as_str() == item.uid.as_deref()
                && found["target"] == item.target.as_str()
        })
        .unwrap_or_else(|| panic!("{item:?} is not in {outcome}"))
}

/// Regular files (each name) and their bytes (each inode once) under `dir`: what the
/// outcome counts for an item.
fn counts(dir: &Path) -> (u64, u64) {
    let mut inodes = BTreeSet::new();
    let (mut files, mut bytes) = (0, 0);
    for node in walk(dir, false).values() {
        if let What::File { size, .. } = node.what {
            files += 1;
            if inodes.insert(node.ino) {
                bytes += size;
            }
        }
    }
    (files, bytes)
}

// ---------------------------------------------------------------------------------------
// Walking trees.

#[derive(Debug, Clone, PartialEq, Eq)]
enum What {
    Dir,
    File {
        size: u64,
        digest: Option<[u8; 32]>,
    },
    Link(Vec<u8>),
    /// A FIFO, socket or device.
    Special,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    what: What,
    /// The permission bits (`st_mode & 0o7777`).
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
}

/// Every entry beneath `root` (the root itself under the empty path), by relative path
/// bytes; nothing followed. File contents are hashed when `hash`. A missing root is empty.
fn walk(root: &Path, hash: bool) -> BTreeMap<Vec<u8>, Node> {
    let mut out = BTreeMap::new();
    if fs::symlink_metadata(root).is_err() {
        return out;
    }
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(root.to_owned(), Vec::new())];
    while let Some((path, rel)) = stack.pop() {
        let meta =
            fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
        let kind = meta.file_type();
        let what = if kind.is_dir() {
            for entry in
                fs::read_dir(&path).unwrap_or_else(|e| panic!("list {}: {e}", path.display()))
            {
                let name = entry.unwrap().file_name();
                let mut child = rel.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(name.as_bytes());
                stack.push((path.join(&name), child));
            }
            What::Dir
        } else if kind.is_file() {
            What::File {
                size: meta.len(),
                digest: hash.then(|| {
                    file_digest(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
                }),
            }
        } else if kind.is_symlink() {
            What::Link(
                fs::read_link(&path)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            )
        } else {
            What::Special
        };
        out.insert(
            rel,
            Node {
                what,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
                ctime: (meta.ctime(), meta.ctime_nsec()),
                ino: meta.ino(),
            },
        );
    }
    out
}

/// Asserts two walks are equal, naming only the entries that differ.
fn assert_same<V: PartialEq + std::fmt::Debug>(
    found: &BTreeMap<Vec<u8>, V>,
    expected: &BTreeMap<Vec<u8>, V>,
    what: &str,
) {
    let differences: Vec<String> = expected
        .keys()
        .chain(found.keys().filter(|k| !expected.contains_key(*k)))
        .filter(|k| found.get(*k) != expected.get(*k))
        .take(20)
        .map(|k| {
            format!(
                "  {}: expected {:?}, found {:?}",
                shown(k),
                expected.get(k),
                found.get(k)
            )
        })
        .collect();
    assert!(
        differences.is_empty(),
        "{what}:\n{}",
        differences.join("\n")
    );
}

fn shown(rel: &[u8]) -> String {
    if rel.is_empty() {
        ".".to_owned()
    } else {
        format!("{:?}", String::from_utf8_lossy(rel))
    }
}

/// Compares an item's target with its source entry by entry and appends every difference
/// to `problems`: the same names and kinds (special files left out), the same bytes and
/// symlink targets, modes with world-write and set-id bits removed, the same file and
/// symlink times, `owner` everywhere, and hard links of the source as hard links of the
/// copy (a new inode, not the source's).
fn compare_item(
    label: &str,
    source: &BTreeMap<Vec<u8>, Node>,
    target: &BTreeMap<Vec<u8>, Node>,
    owner: (u32, u32),
    problems: &mut Vec<String>,
) {
    let mut problem = |rel: &[u8], what: String| {
        problems.push(format!("{label}: {}: {what}", shown(rel)));
    };
    if target.is_empty() {
        problem(b"", "the target does not exist".to_owned());
        return;
    }
    for (rel, src) in source {
        let Some(dst) = target.get(rel) else {
            if src.what != What::Special {
                problem(rel, "missing from the target".to_owned());
            }
            continue;
        };
        if src.what == What::Special {
            problem(rel, format!("a special file was copied as {:?}", dst.what));
            continue;
        }
        if src.what != dst.what {
            problem(rel, format!("source {:?}, target {:?}", src.what, dst.what));
        }
        if (dst.uid, dst.gid) != owner {
            problem(
                rel,
                format!(
                    "owned by {}:{}, not {}:{}",
                    dst.uid, dst.gid, owner.0, owner.1
                ),
            );
        }
        if !matches!(src.what, What::Link(_)) && dst.mode != src.mode & 0o1775 {
            problem(
                rel,
                format!(
                    "mode {:o}, expected {:o} (source {:o})",
                    dst.mode,
                    src.mode & 0o1775,
                    src.mode
                ),
            );
        }
        if !matches!(src.what, What::Dir)
            && src.mtime != dst.mtime
            && dst.mtime == (src.mtime.0, src.mtime.1 / 1_000_000 * 1_000_000)
        {
            problem(
                rel,
                format!(
                    "{TRUNCATED}: {}.{:09}, source {}.{:09}",
                    dst.mtime.0, dst.mtime.1, src.mtime.0, src.mtime.1
                ),
            );
        } else if !matches!(src.what, What::Dir) && src.mtime != dst.mtime {
            problem(
                rel,
                format!(
                    "mtime {}.{:09}, source {}.{:09}",
                    dst.mtime.0, dst.mtime.1, src.mtime.0, src.mtime.1
                ),
            );
        }
    }
    for rel in target.keys().filter(|rel| !source.contains_key(*rel)) {
        problem(rel, "in the target but not in the source".to_owned());
    }
    // Hard links: the names of one source inode share one target inode, a new one.
    let mut groups: HashMap<u64, Vec<&Vec<u8>>> = HashMap::new();
    for (rel, node) in source {
        if matches!(node.what, What::File { .. }) {
            groups.entry(node.ino).or_default().push(rel);
        }
    }
    for (source_ino, names) in groups {
        let inodes: BTreeSet<u64> = names
            .iter()
            .filter_map(|rel| target.get(*rel).map(|node| node.ino))
            .collect();
        if names.len() > 1 && inodes.len() != 1 {
            problem(
                names[0],
                format!(
                    "the {} hard links of one file became {} files",
                    names.len(),
                    inodes.len()
                ),
            );
        }
        if inodes.contains(&source_ino) && source.len() > 1 {
            problem(names[0], "the target is the source's own inode".to_owned());
        }
    }
}

/// A tree as two runs must leave it identically: paths, kinds, contents, link targets,
/// modes, owners, file and symlink times, and which names are hard links of which (not
/// inode numbers or directory times). The ownership marker's time is its run's.
fn canonical(root: &Path) -> BTreeMap<Vec<u8>, String> {
    let nodes = walk(root, true);
    let mut first_name: HashMap<u64, &Vec<u8>> = HashMap::new();
    let mut out = BTreeMap::new();
    for (rel, node) in &nodes {
        let marker = rel.ends_with(OWNERSHIP_MARKER);
        let what = match &node.what {
            What::File { .. } => match first_name.get(&node.ino) {
                Some(first) => format!("hard link of {}", shown(first)),
                None => {
                    first_name.insert(node.ino, rel);
                    format!("{:?}", node.what)
                }
            },
            other => format!("{other:?}"),
        };
        let time = if matches!(node.what, What::Dir) || marker {
            String::new()
        } else {
            format!(" {}.{:09}", node.mtime.0, node.mtime.1)
        };
        out.insert(
            rel.clone(),
            format!("{what} {:o} {}:{}{time}", node.mode, node.uid, node.gid),
        );
    }
    out
}

/// What a migration left in `site`: every UserWorkspace tree and the shared skills.
fn final_trees(site: &Site) -> (BTreeMap<Vec<u8>, String>, BTreeMap<Vec<u8>, String>) {
    (
        canonical(&site.data().join("user-data")),
        canonical(&site.shared()),
    )
}

/// The metadata of everything in the source, to prove it was not touched (ctime moves
/// with any chmod, chown, rename or write).
fn untouched(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    walk(root, false)
}

/// The paths under the data directory's `user-data` (every UserWorkspace), and the
/// shared skills: what a refused migration must not have added to.
fn workspace_entries(site: &Site) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    (
        walk(&site.data().join("user-data"), false)
            .into_keys()
            .collect(),
        walk(&site.shared(), false).into_keys().collect(),
    )
}

fn generate(dir: &Path, spec: &TreeSpec) -> GeneratedTree {
    DeerflowTree::generate(dir, spec).expect("generate a DeerFlow tree")
}

/// A small deployment with the odd content (no special files).
fn small_spec() -> TreeSpec {
    TreeSpec {
        odd: true,
        ..TreeSpec::default()
    }
}

// ---------------------------------------------------------------------------------------
// The migration itself.

#[test]
fn a_deerflow_deployment_migrates_with_every_byte_mode_time_and_link_kept() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(
        &dir.path().join("deer-flow"),
        &TreeSpec::everything(1 << 30),
    );
    let odd = tree.odd.clone().unwrap();
    let site = Site::new();
    let items = expected_items(&tree, DEFAULT_UID);
    let sources: BTreeMap<String, BTreeMap<Vec<u8>, Node>> = items
        .iter()
        .map(|item| {
            (
                item.source.clone(),
                walk(&tree.root.join(&item.source), true),
            )
        })
        .collect();
    let before = untouched(&tree.root);
    let passwd_before = (
        fs::symlink_metadata("/etc/passwd").unwrap(),
        file_digest(Path::new("/etc/passwd")).unwrap(),
    );

    let outcome = migrated(&site, &tree.root, &[]);

    // The outcome: every item committed with its counts, what was left alone, warnings.
    assert_eq!(outcome["state"], "committed", "{outcome}");
    assert_eq!(outcome["dry_run"], false, "{outcome}");
    assert!(
        outcome["migration_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("mig-")),
        "{outcome}"
    );
    assert_eq!(reported_items(&outcome), items);
    // Differences are collected, so that one run shows all of them.
    let mut problems = Vec::new();
    let (mut files, mut bytes) = (0, 0);
    for item in &items {
        let entry = item_entry(&outcome, item);
        assert_eq!(entry["state"], "committed", "{entry}");
        assert!(
            entry["key"].as_str().is_some_and(|key| !key.is_empty()),
            "{entry}"
        );
        // Files counted once per name (as the plan counts them), bytes once per inode.
        let (f, b) = counts(&tree.root.join(&item.source));
        let reported = (entry["files"].as_u64(), entry["bytes"].as_u64());
        if reported != (Some(f), Some(b)) {
            problems.push(format!(
                "{}: the outcome counts {reported:?} (files, bytes), the source holds ({f}, {b})",
                item.source
            ));
        }
        (files, bytes) = (files + f, bytes + b);
    }
    let reported = (outcome["files"].as_u64(), outcome["bytes"].as_u64());
    if reported != (Some(files), Some(bytes)) {
        problems.push(format!(
            "the outcome's totals are {reported:?} (files, bytes), the sources hold ({files}, {bytes})"
        ));
    }
    assert!(bytes > 1 << 30, "the large file is counted: {bytes}");
    let left_alone: BTreeSet<String> = outcome["left_alone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| path.as_str().unwrap().trim_end_matches('/').to_owned())
        .collect();
    assert_eq!(
        left_alone,
        tree.left_alone.iter().cloned().collect::<BTreeSet<_>>(),
        "{outcome}"
    );
    let warnings: Vec<&str> = outcome["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let first = &tree.threads[0];
    let named = |path: &Path| {
        let rel = path.strip_prefix(tree.thread_dir(first)).unwrap();
        let rel = rel.to_str().unwrap().to_owned();
        warnings.iter().any(|w| w.contains(&rel))
    };
    for path in [
        &odd.link_to_etc,
        &odd.link_to_passwd,
        &odd.link_to_other_user,
        &odd.relative_link_out,
        odd.fifo.as_ref().unwrap(),
    ]
    .into_iter()
    .chain(odd.device.as_ref())
    {
        assert!(
            named(path),
            "no warning names {}: {warnings:#?}",
            path.display()
        );
    }
    assert!(
        warnings.iter().any(|w| w.contains("/etc")),
        "the link to /etc is reported: {warnings:#?}"
    );
    for path in &odd.links_inside {
        assert!(
            !named(path),
            "a link inside its thread is no warning: {}: {warnings:#?}",
            path.display()
        );
    }

    // Every item's target against its source, entry by entry.
    let shared_owner = {
        let meta = fs::metadata(site.shared()).unwrap();
        (meta.uid(), meta.gid())
    };
    for item in &items {
        let target = walk(&site.target_of(item), true);
        // The operator's shared skill directory keeps its owner's files; a UserWorkspace
        // is the sandbox user's (I11).
        let owner = if item.uid.is_some() {
            SANDBOX
        } else {
            shared_owner
        };
        let label = format!("{} -> {:?}:{}", item.source, item.uid, item.target);
        compare_item(
            &label,
            &sources[&item.source],
            &target,
            owner,
            &mut problems,
        );
    }
    // Everything the migration made in a uid's subtree is the sandbox user's, the
    // directories above the targets included; no staging directory is left.
    let uids: BTreeSet<&String> = items.iter().filter_map(|item| item.uid.as_ref()).collect();
    for uid in &uids {
        let subtree = site.workspace(uid).parent().unwrap().to_owned();
        for (rel, node) in walk(&subtree, false) {
            if rel == OWNERSHIP_MARKER {
                continue;
            }
            if (node.uid, node.gid) != SANDBOX {
                problems.push(format!(
                    "{}/{}: owned by {}:{}",
                    subtree.display(),
                    shown(&rel),
                    node.uid,
                    node.gid
                ));
            }
            if String::from_utf8_lossy(&rel).contains("warren-migrate") {
                problems.push(format!("a staging directory is left: {}", shown(&rel)));
            }
            if node.mode & 0o6002 != 0 && !matches!(node.what, What::Link(_)) {
                problems.push(format!("{}: mode {:o}", shown(&rel), node.mode));
            }
        }
    }
    // Times cut to the millisecond are one finding, however many entries show it.
    let (truncated, mut problems): (Vec<String>, Vec<String>) =
        problems.into_iter().partition(|p| p.contains(TRUNCATED));
    if let Some(example) = truncated.first() {
        problems.push(format!(
            "{} files and symlinks have their {TRUNCATED}, e.g. {example}",
            truncated.len()
        ));
    }
    assert!(
        problems.is_empty(),
        "{} difference(s) between the sources and the targets:\n{}",
        problems.len(),
        problems.join("\n")
    );

    // The odd content, spelled out.
    let target_dir = site
        .workspace(first.user.as_deref().unwrap())
        .join(format!("threads/{}/user-data", first.thread_id));
    let in_target =
        |path: &Path| target_dir.join(path.strip_prefix(tree.thread_dir(first)).unwrap());
    let etc_link = fs::symlink_metadata(in_target(&odd.link_to_etc)).unwrap();
    assert!(
        etc_link.file_type().is_symlink(),
        "the link to /etc stays a link"
    );
    assert_eq!(
        fs::read_link(in_target(&odd.link_to_etc)).unwrap(),
        Path::new("/etc")
    );
    let passwd_after = (
        fs::symlink_metadata("/etc/passwd").unwrap(),
        file_digest(Path::new("/etc/passwd")).unwrap(),
    );
    assert_eq!(
        (
            passwd_after.0.uid(),
            passwd_after.0.gid(),
            passwd_after.0.mode(),
            passwd_after.0.ctime(),
            passwd_after.0.ctime_nsec(),
            passwd_after.1
        ),
        (
            passwd_before.0.uid(),
            passwd_before.0.gid(),
            passwd_before.0.mode(),
            passwd_before.0.ctime(),
            passwd_before.0.ctime_nsec(),
            passwd_before.1
        ),
        "/etc/passwd is untouched"
    );
    let links: BTreeSet<u64> = odd
        .hard_links
        .iter()
        .map(|path| fs::metadata(in_target(path)).unwrap().ino())
        .collect();
    assert_eq!(links.len(), 1, "the hard links share an inode");
    assert_eq!(
        fs::metadata(in_target(&odd.hard_links[0])).unwrap().nlink(),
        odd.hard_links.len() as u64
    );
    for name in &odd.odd_names {
        assert_eq!(fs::read(in_target(name)).unwrap(), fs::read(name).unwrap());
    }
    for empty in &odd.empty_dirs {
        assert_eq!(fs::read_dir(in_target(empty)).unwrap().count(), 0);
    }
    assert!(fs::symlink_metadata(in_target(odd.fifo.as_ref().unwrap())).is_err());
    let large = tree.large_file.as_ref().unwrap();
    assert_eq!(fs::metadata(in_target(large)).unwrap().len(), 1 << 30);
    // The uid that is not safe as a directory name lands in its hashed directory.
    let eve = site.workspace(ODD_USER);
    assert!(eve.to_str().unwrap().contains("/uid-"), "{}", eve.display());
    let eve_thread = tree
        .threads
        .iter()
        .find(|t| t.user.as_deref() == Some(ODD_USER))
        .unwrap();
    assert_eq!(
        fs::read_to_string(eve.join(format!(
            "threads/{}/user-data/{}",
            eve_thread.thread_id, eve_thread.notes
        )))
        .unwrap(),
        eve_thread.notes_text
    );

    // The journal says committed; the source is all there, untouched.
    let status = status(&site, &[]);
    let migrations = status["migrations"].as_array().unwrap();
    assert_eq!(migrations.len(), 1, "{status}");
    let migration = &migrations[0];
    assert_eq!(migration["id"], outcome["migration_id"], "{status}");
    assert_eq!(migration["kind"], "deerflow", "{status}");
    assert_eq!(migration["state"], "committed", "{status}");
    assert_eq!(
        migration["source"].as_str(),
        tree.root.canonicalize().unwrap().to_str(),
        "{status}"
    );
    assert_eq!(
        migration["items"],
        json!({"planned": 0, "copied": 0, "verified": 0, "switched": 0,
               "committed": items.len(), "cleaned": 0}),
        "{status}"
    );
    assert_same(&untouched(&tree.root), &before, "the source was changed");

    // Run again: nothing to do, the same outcome.
    let again = migrated(&site, &tree.root, &[]);
    assert_eq!(again["state"], "committed", "{again}");
    assert_eq!(again["migration_id"], outcome["migration_id"]);
    assert_eq!(reported_items(&again), items);
}

// ---------------------------------------------------------------------------------------
// Crashes.

/// Every journal step the crash hook can stop after, with later occurrences of the steps
/// every item takes.
const CRASH_POINTS: [&str; 13] = [
    "planned",
    "copied",
    "copied:2",
    "verified",
    "verified:3",
    "switched",
    "switched:2",
    "committed",
    "committed:2",
    "committed:5",
    "migration_committed",
    "cleaned",
    "cleaned:2",
];

/// For every crash point: a fresh copy of one small deployment (always in the same place,
/// so the migration has the same id), a run killed by the hook, then a plain rerun; the
/// final trees and the journal must be exactly an uninterrupted run's.
fn crash_series(extra: &[&str]) {
    let clean = extra.contains(&"--clean-source");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("deer-flow");
    let spec = small_spec();
    let fresh = || {
        if root.exists() {
            fs::remove_dir_all(&root).unwrap();
        }
        generate(&root, &spec)
    };

    let tree = fresh();
    let items = expected_items(&tree, DEFAULT_UID);
    assert!(items.len() >= 5, "the crash points need items: {items:?}");
    let baseline_site = Site::new();
    let baseline = migrated(&baseline_site, &tree.root, extra);
    let final_state = if clean { "cleaned" } else { "committed" };
    assert_eq!(baseline["state"], final_state, "{baseline}");
    let baseline_trees = final_trees(&baseline_site);
    let baseline_status = timeless(status(&baseline_site, &[]));
    assert_eq!(
        baseline_status["migrations"][0]["items"][final_state],
        items.len(),
        "{baseline_status}"
    );
    drop(baseline_site);

    for point in CRASH_POINTS {
        if point.starts_with("cleaned") && !clean {
            continue;
        }
        let tree = fresh();
        let pristine = untouched(&tree.root);
        let site = Site::new();
        let crashed = migrate(
            &site,
            &tree.root,
            extra,
            &[("WARREN_MIGRATE_CRASH_AFTER", point)],
        );
        assert_eq!(
            crashed.status.signal(),
            Some(9),
            "{point}: the hook kills the migrator with SIGKILL ({:?}):\n{}",
            crashed.status,
            stderr(&crashed)
        );
        if point.starts_with("cleaned") {
            let left = tree
                .item_sources()
                .iter()
                .filter(|source| tree.root.join(source).exists())
                .count();
            assert!(left > 0, "{point}: the source is cleaned only at the end");
        } else {
            assert_same(
                &untouched(&tree.root),
                &pristine,
                &format!("{point}: the source was changed before the migration committed"),
            );
        }
        let journal = status(&site, &[]);
        assert_eq!(
            journal["migrations"].as_array().map(Vec::len),
            Some(1),
            "{point}: {journal}"
        );
        assert_killed_after(point, &journal["migrations"][0], items.len());

        let resumed = migrated(&site, &tree.root, extra);
        assert_eq!(resumed["state"], final_state, "{point}: {resumed}");
        assert_eq!(
            resumed["migration_id"], baseline["migration_id"],
            "{point}: {resumed}"
        );
        assert_eq!(reported_items(&resumed), items, "{point}");
        let trees = final_trees(&site);
        assert_same(
            &trees.0,
            &baseline_trees.0,
            &format!("{point}: the UserWorkspaces differ from an uninterrupted run's"),
        );
        assert_same(
            &trees.1,
            &baseline_trees.1,
            &format!("{point}: the shared skills differ from an uninterrupted run's"),
        );
        assert_eq!(
            timeless(status(&site, &[])),
            baseline_status,
            "{point}: the journal differs from an uninterrupted run's"
        );
        if clean {
            for source in tree.item_sources() {
                assert!(
                    !tree.root.join(&source).exists(),
                    "{point}: {source} was kept"
                );
            }
            for kept in &tree.left_alone {
                assert!(tree.root.join(kept).exists(), "{point}: {kept} was removed");
            }
        } else {
            assert_same(
                &untouched(&tree.root),
                &pristine,
                &format!("{point}: the source was changed"),
            );
        }
    }
}

/// Asserts the journal of a migration killed at `point` shows that step's n-th write as
/// its last: items are taken through their steps one after another.
fn assert_killed_after(point: &str, migration: &Value, total: usize) {
    let (step, nth) = match point.split_once(':') {
        Some((step, nth)) => (step, nth.parse::<u64>().unwrap()),
        None => (point, 1),
    };
    let count = |state: &str| migration["items"][state].as_u64().unwrap();
    let total = total as u64;
    let order = ["copied", "verified", "switched", "committed", "cleaned"];
    let (state, reached) = match step {
        "planned" => ("planned", count("planned") == total),
        "migration_committed" => ("committed", count("committed") == total),
        "cleaned" => ("committed", count("cleaned") == nth),
        _ => {
            let at = order.iter().position(|s| *s == step).unwrap();
            let past: u64 = order[at..order.len() - 1].iter().map(|s| count(s)).sum();
            ("planned", past == nth)
        }
    };
    assert!(
        reached && migration["state"] == state,
        "{point}: the journal does not end at this step: {migration}"
    );
}

#[test]
fn a_migration_killed_after_any_journal_step_resumes_to_the_same_result() {
    crash_series(&[]);
}

#[test]
fn a_cleaning_migration_killed_after_any_journal_step_resumes_and_cleans_only_at_the_end() {
    crash_series(&["--clean-source"]);
}

// ---------------------------------------------------------------------------------------
// Refusals.

/// Asserts that a refused migration left the workspaces as `before` and journaled nothing.
fn assert_nothing_migrated(site: &Site, before: &(Vec<Vec<u8>>, Vec<Vec<u8>>), what: &str) {
    let after = workspace_entries(site);
    for (found, expected, tree) in [
        (&after.0, &before.0, "the UserWorkspaces (user-data/)"),
        (&after.1, &before.1, "the shared skills"),
    ] {
        let added: Vec<String> = found
            .iter()
            .filter(|p| !expected.contains(p))
            .map(|p| shown(p))
            .collect();
        let removed: Vec<String> = expected
            .iter()
            .filter(|p| !found.contains(p))
            .map(|p| shown(p))
            .collect();
        assert!(
            added.is_empty() && removed.is_empty(),
            "{what}: a refused migration changed {tree}: made {added:?}, removed {removed:?}"
        );
    }
}

#[test]
fn a_running_warren_server_on_the_data_dir_stops_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &TreeSpec::default());
    let pristine = untouched(&tree.root);
    let server = TestServer::start(bin());
    let site = Site::new();
    let before = (
        walk(&server.data_dir().join("user-data"), false)
            .into_keys()
            .collect::<Vec<_>>(),
        workspace_entries(&site).1,
    );
    let mut args = os_args(&["migrate", "deerflow", "--source"]);
    args.push(tree.root.clone().into());
    args.extend(os_args(&["--config"]));
    args.push(site.config().into());
    args.push("--data-dir".into());
    args.push(server.data_dir().into());
    let out = run(&args, &[]);
    assert!(!out.status.success(), "refused while a server runs");
    let message = stderr(&out);
    assert!(
        message.contains("warren server") && message.contains("stop it"),
        "{message}"
    );
    let after: Vec<Vec<u8>> = walk(&server.data_dir().join("user-data"), false)
        .into_keys()
        .collect();
    assert_eq!(
        after, before.0,
        "nothing is made in the server's workspaces"
    );
    assert_eq!(workspace_entries(&site).1, before.1);
    assert_same(&untouched(&tree.root), &pristine, "the source was changed");
}

/// Starts `program` with `args` in `cwd`; when `ready` it waits for a line on stdout.
fn hold(program: &str, args: &[&OsStr], cwd: &Path, ready: bool) -> Child {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    if ready {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    child
}

#[test]
fn processes_still_using_the_source_stop_the_migration_and_are_named_by_pid() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &TreeSpec::default());
    let site = Site::new();
    let before = workspace_entries(&site);
    let thread = tree.thread_dir(&tree.threads[0]);
    let notes = thread.join(&tree.threads[0].notes);
    // A program that lives in the source: its executable is a mapping there.
    let tool = thread.join("workspace/tool");
    fs::copy("/bin/sleep", &tool).unwrap();
    let pristine = untouched(&tree.root);

    let workspace = thread.join("workspace");
    type Start<'a> = Box<dyn Fn() -> Child + 'a>;
    let cases: Vec<(&str, Start)> = vec![
        (
            "cwd",
            Box::new(|| hold("sleep", &[OsStr::new("600")], &workspace, false)),
        ),
        (
            "open file",
            Box::new(|| {
                hold(
                    "sh",
                    &[
                        OsStr::new("-c"),
                        OsStr::new("exec 3<\"$1\"; echo ready; exec sleep 600"),
                        OsStr::new("sh"),
                        notes.as_os_str(),
                    ],
                    Path::new("/"),
                    true,
                )
            }),
        ),
        (
            "workspace/tool",
            Box::new(|| {
                hold(
                    tool.to_str().unwrap(),
                    &[OsStr::new("600")],
                    Path::new("/"),
                    false,
                )
            }),
        ),
    ];
    for (holds, start) in cases {
        let mut child = start();
        let pid = child.id();
        let out = migrate(&site, &tree.root, &[], &[]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!out.status.success(), "{holds}: not refused");
        let message = stderr(&out);
        assert!(
            message.contains(&format!("pid {pid} ")),
            "the message names pid {pid} ({holds}): {message}"
        );
        assert!(message.contains(holds), "{holds}: {message}");
        assert_nothing_migrated(&site, &before, holds);
        assert_eq!(
            status(&site, &[])["migrations"],
            json!([]),
            "{holds}: nothing is journaled"
        );
    }
    assert_same(&untouched(&tree.root), &pristine, "the source was changed");

    // Once they are gone, the same migration goes through.
    let outcome = migrated(&site, &tree.root, &[]);
    assert_eq!(outcome["state"], "committed", "{outcome}");
}

#[test]
fn a_layout_the_migrator_does_not_know_is_refused_before_anything_is_copied() {
    type Plant = fn(&GeneratedTree) -> String;
    let cases: [(&str, Plant); 5] = [
        ("an unknown directory in a thread", |tree| {
            let thread = tree.threads.iter().find(|t| t.user.is_none()).unwrap();
            let path = format!("threads/{}/strange", thread.thread_id);
            fs::create_dir(tree.root.join(&path)).unwrap();
            fs::write(tree.root.join(&path).join("x"), b"?").unwrap();
            path
        }),
        ("an unknown file at the top", |tree| {
            fs::write(tree.root.join("weird.db"), b"SQLite format 3\0").unwrap();
            "weird.db".to_owned()
        }),
        ("a symlink where a user's directory belongs", |tree| {
            std::os::unix::fs::symlink("/tmp", tree.root.join("users/zed")).unwrap();
            "users/zed".to_owned()
        }),
        ("a symlink where a thread's user-data belongs", |tree| {
            let thread = &tree.threads[0];
            let user_data = tree.thread_dir(thread);
            let elsewhere = tree.root.parent().unwrap().join("elsewhere");
            fs::rename(&user_data, &elsewhere).unwrap();
            std::os::unix::fs::symlink(&elsewhere, &user_data).unwrap();
            thread.source.clone()
        }),
        ("a file among the public skills", |tree| {
            fs::write(tree.root.join("skills/public/README.md"), b"# skills\n").unwrap();
            "skills/public/README.md".to_owned()
        }),
    ];
    for (what, plant) in cases {
        let dir = tempfile::tempdir().unwrap();
        let tree = generate(&dir.path().join("deer-flow"), &TreeSpec::default());
        let path = plant(&tree);
        let site = Site::new();
        let before = workspace_entries(&site);
        let pristine = untouched(&tree.root);
        let message = refused(&site, &tree.root);
        assert!(
            message.contains(&path),
            "{what}: the message names {path}: {message}"
        );
        assert!(message.contains("nothing was copied"), "{what}: {message}");
        assert_nothing_migrated(&site, &before, what);
        assert_eq!(status(&site, &[])["migrations"], json!([]), "{what}");
        assert_same(&untouched(&tree.root), &pristine, what);
    }
}

#[test]
fn public_skills_without_a_shared_skill_directory_are_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &TreeSpec::default());
    let site = Site::new();
    fs::write(site.config(), "").unwrap();
    let before = workspace_entries(&site);
    let message = refused(&site, &tree.root);
    assert!(message.contains("[skills] shared_dir"), "{message}");
    assert_nothing_migrated(&site, &before, "no shared_dir");
}

#[test]
fn a_target_holding_other_content_is_refused_and_nothing_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &TreeSpec::default());
    let thread = tree
        .threads
        .iter()
        .find(|t| t.user.as_deref() == Some("alice"))
        .unwrap();
    fs::write(
        tree.thread_dir(thread).join("workspace/x"),
        b"DeerFlow's bytes\n",
    )
    .unwrap();
    let site = Site::new();
    let thread_target = site
        .workspace("alice")
        .join(format!("threads/{}", thread.thread_id));
    let theirs = thread_target.join("user-data/workspace/x");
    fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    fs::write(&theirs, b"warren's own bytes\n").unwrap();
    // As warren itself leaves a UserWorkspace: the sandbox user's (I11).
    let chown = Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(site.data().join("user-data"))
        .status()
        .unwrap();
    assert!(chown.success());
    let theirs_before = fs::symlink_metadata(&theirs).unwrap();
    let before = workspace_entries(&site);
    let pristine = untouched(&tree.root);

    // A dry run names the conflict and the first difference, and changes nothing.
    let plan = migrated(&site, &tree.root, &["--dry-run"]);
    let conflicts = plan["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{plan}");
    let conflict = conflicts[0].as_str().unwrap();
    assert!(
        conflict.contains(&format!(
            "uid alice: threads/{}/user-data",
            thread.thread_id
        )) && conflict.contains("nothing was overwritten"),
        "the dry run names the target: {conflict}"
    );

    let message = refused(&site, &tree.root);
    assert!(
        message.contains(&format!("threads/{}/user-data", thread.thread_id))
            && message.contains("alice"),
        "the message names the target: {message}"
    );
    assert!(message.contains("nothing was overwritten"), "{message}");
    assert_eq!(fs::read(&theirs).unwrap(), b"warren's own bytes\n");
    let theirs_after = fs::symlink_metadata(&theirs).unwrap();
    assert_eq!(
        (
            theirs_after.ino(),
            theirs_after.mtime(),
            theirs_after.mtime_nsec(),
            theirs_after.mode(),
            theirs_after.uid()
        ),
        (
            theirs_before.ino(),
            theirs_before.mtime(),
            theirs_before.mtime_nsec(),
            theirs_before.mode(),
            theirs_before.uid()
        ),
        "the existing file is untouched"
    );
    assert_same(&untouched(&tree.root), &pristine, "the source was changed");
    assert_nothing_migrated(&site, &before, "a conflicting target");

    // Moved away, the same migration goes through.
    fs::remove_dir_all(&thread_target).unwrap();
    let outcome = migrated(&site, &tree.root, &[]);
    assert_eq!(outcome["state"], "committed", "{outcome}");
    assert_eq!(
        fs::read(site.workspace("alice").join(format!(
            "threads/{}/user-data/workspace/x",
            thread.thread_id
        )))
        .unwrap(),
        b"DeerFlow's bytes\n"
    );
}

#[test]
fn a_target_already_holding_exactly_the_source_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &small_spec());
    let thread = tree
        .threads
        .iter()
        .find(|t| t.user.as_deref() == Some("alice"))
        .unwrap();
    let relative = format!("threads/{}", thread.thread_id);
    let first = Site::new();
    migrated(&first, &tree.root, &[]);

    // Another warren already holds exactly what the migration makes of alice's thread.
    let second = Site::new();
    let parent = second.workspace("alice").join("threads");
    fs::create_dir_all(&parent).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(first.workspace("alice").join(&relative))
        .arg(&parent)
        .status()
        .unwrap();
    assert!(copied.success());
    let outcome = migrated(&second, &tree.root, &[]);
    assert_eq!(outcome["state"], "committed", "{outcome}");
    assert!(
        outcome["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains(&relative)),
        "the recognised target is reported: {outcome}"
    );
    assert_eq!(
        canonical(&second.workspace("alice").join(&relative)),
        canonical(&first.workspace("alice").join(&relative))
    );
    assert_eq!(final_trees(&second), final_trees(&first));
    assert_eq!(
        timeless(status(&second, &[])),
        timeless(status(&first, &[]))
    );
}

// ---------------------------------------------------------------------------------------
// Dry runs.

#[test]
fn a_dry_run_prints_the_plan_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &small_spec());
    let site = Site::new();
    let items = expected_items(&tree, DEFAULT_UID);
    let pristine = untouched(&tree.root);

    let plan = migrated(&site, &tree.root, &["--dry-run"]);
    assert_eq!(
        (plan["state"].as_str(), plan["dry_run"].as_bool()),
        (Some("dry_run"), Some(true)),
        "{plan}"
    );
    assert_eq!(reported_items(&plan), items);
    let (mut files, mut bytes) = (0, 0);
    for item in &items {
        let entry = item_entry(&plan, item);
        let (f, b) = counts(&tree.root.join(&item.source));
        assert_eq!(
            (
                entry["state"].as_str(),
                entry["files"].as_u64(),
                entry["bytes"].as_u64()
            ),
            (Some("planned"), Some(f), Some(b)),
            "{entry}"
        );
        (files, bytes) = (files + f, bytes + b);
    }
    assert_eq!(
        (plan["files"].as_u64(), plan["bytes"].as_u64()),
        (Some(files), Some(bytes)),
        "{plan}"
    );
    assert_eq!(
        plan["left_alone"].as_array().unwrap().len(),
        tree.left_alone.len()
    );

    // The same as text.
    let mut args = os_args(&["migrate", "deerflow", "--dry-run", "--source"]);
    args.push(tree.root.clone().into());
    args.extend(site.args());
    let text = run(&args, &[]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("would migrate"), "{text}");
    assert!(text.contains(&format!("{} item(s)", items.len())), "{text}");
    assert!(text.contains(&format!("{files} file(s)")), "{text}");
    assert!(text.contains(&format!("{bytes} byte(s)")), "{text}");

    assert_eq!(
        walk(&site.data().join("user-data"), false).len(),
        0,
        "a dry run makes no workspace"
    );
    assert_eq!(walk(&site.shared(), false).len(), 1, "nor a shared skill");
    assert_eq!(status(&site, &[])["migrations"], json!([]));
    assert_same(&untouched(&tree.root), &pristine, "the source was changed");
}

// ---------------------------------------------------------------------------------------
// After the migration.

/// DeerFlow's own sandbox id: `sha256("{user_id}:{thread_id}")[:8]`.
fn deerflow_id(user: &str, thread: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("{user}:{thread}")))[..8].to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn migrated_threads_are_served_by_the_native_api_and_the_deerflow_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &small_spec());
    let site = Site::with_config(&format!("[deerflow]\napi_key = \"{DEERFLOW_KEY}\"\n"));
    let outcome = migrated(&site, &tree.root, &[]);
    assert_eq!(outcome["state"], "committed", "{outcome}");

    let Site { data, aux } = site;
    let config = aux.path().join("warren.toml");
    let server = TestServer::start_in(
        bin(),
        data,
        &["--backend", "local", "--config", config.to_str().unwrap()],
        Some(TEST_TOKEN),
    );
    let http = reqwest::Client::new();

    let alice = tree
        .threads
        .iter()
        .find(|t| t.user.as_deref() == Some("alice"))
        .unwrap();
    let legacy = tree.threads.iter().find(|t| t.user.is_none()).unwrap();
    let workdir = format!("threads/{}/user-data", alice.thread_id);

    // The state store has the workdir: listed, and found (200) rather than made (201).
    let (status, listed) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/workdirs"))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert!(
        listed["workdirs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["workdir"] == workdir.as_str()),
        "{listed}"
    );
    let (status, made) = server
        .send_json(
            server
                .request(Method::POST, "/v1/users/alice/workdirs")
                .json(&json!({ "path": workdir })),
        )
        .await;
    assert_eq!(status, 200, "the migrated workdir exists already: {made}");

    // The native API reads the migrated files, odd names and binary content included.
    let id = server.sandbox("alice", "after-migration", &workdir).await;
    let source = tree.thread_dir(alice);
    let odd = tree.odd.as_ref().unwrap();
    let binary = fs::read_dir(source.join("uploads"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_file() && fs::metadata(p).unwrap().len() > 0)
        .expect("a binary upload");
    let mut paths: Vec<PathBuf> = vec![source.join(&alice.notes), binary];
    paths.extend(
        odd.odd_names
            .iter()
            .filter(|p| p.to_str().is_some_and(|s| !s.contains('\n')))
            .cloned(),
    );
    for path in &paths {
        let relative = path.strip_prefix(&source).unwrap().to_str().unwrap();
        let response = server
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", relative)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{relative}");
        assert_eq!(
            response.bytes().await.unwrap().as_ref(),
            fs::read(path).unwrap().as_slice(),
            "{relative} through the native API"
        );
    }
    let result = server.exec(&id, &format!("cat {}", alice.notes)).await;
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], alice.notes_text.as_str(), "{result}");
    server.terminate(&id).await;

    // The DeerFlow drop-in binds (user_id, thread_id) to the same workdir; a legacy
    // thread is DeerFlow's default user's.
    for (user, thread) in [("alice", alice), (DEFAULT_UID, legacy)] {
        let (status, created) = server
            .send_json(
                http.post(format!("{}/deerflow/api/sandboxes", server.url))
                    .header("X-API-Key", DEERFLOW_KEY)
                    .json(&json!({
                        "sandbox_id": deerflow_id(user, &thread.thread_id),
                        "thread_id": thread.thread_id,
                        "user_id": user,
                        "include_legacy_skills": false,
                        "provision_lark_cli_runtime": false,
                        "provision_lark_cli_broker": false,
                    })),
            )
            .await;
        assert_eq!(status, 200, "{created}");
        let url = created["sandbox_url"].as_str().unwrap();
        let (status, read) = server
            .send_json(http.post(format!("{url}/v1/file/read")).json(&json!({
                "file": format!("/mnt/user-data/{}", thread.notes)
            })))
            .await;
        assert_eq!(
            (status, read["data"]["content"].as_str()),
            (200, Some(thread.notes_text.as_str())),
            "{user}/{}: {read}",
            thread.thread_id
        );
        let (status, deleted) = server
            .send_json(
                http.delete(format!(
                    "{}/deerflow/api/sandboxes/{}",
                    server.url,
                    deerflow_id(user, &thread.thread_id)
                ))
                .header("X-API-Key", DEERFLOW_KEY),
            )
            .await;
        assert_eq!(status, 200, "{deleted}");
    }
    drop(aux);
}

#[test]
fn a_migration_into_a_postgres_state_store_records_its_workdirs_there() {
    let postgres = super::state_postgres::shared_postgres();
    let url = postgres.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &TreeSpec::default());
    let site = Site::new();
    let items = expected_items(&tree, DEFAULT_UID);

    let outcome = migrated(&site, &tree.root, &["--state", &url]);
    assert_eq!(outcome["state"], "committed", "{outcome}");
    assert_eq!(reported_items(&outcome), items);
    assert!(
        !site.data().join("warren.db").exists(),
        "the journal is in PostgreSQL, not SQLite"
    );

    let recorded: BTreeSet<String> = postgres
        .psql_in(&url, "SELECT uid || ' ' || workdir FROM workdirs")
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = items
        .iter()
        .filter(|item| item.kind == "thread")
        .map(|item| format!("{} {}", item.uid.as_deref().unwrap(), item.target))
        .collect();
    assert_eq!(recorded, expected);
    for item in &items {
        let (files, _) = counts(&site.target_of(item));
        assert_eq!(files, counts(&tree.root.join(&item.source)).0, "{item:?}");
    }

    let journal = status(&site, &["--state", &url]);
    assert_eq!(journal["migrations"][0]["state"], "committed", "{journal}");
    assert_eq!(
        journal["migrations"][0]["items"]["committed"],
        items.len(),
        "{journal}"
    );
    // The SQLite store of the data directory knows nothing of it.
    assert_eq!(status(&site, &[])["migrations"], json!([]));
}

#[test]
fn a_source_written_to_after_its_migration_is_never_cleaned_and_the_change_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let tree = generate(&dir.path().join("deer-flow"), &small_spec());
    let site = Site::new();
    let first = migrated(&site, &tree.root, &[]);
    assert_eq!(first["state"], "committed", "{first}");

    // DeerFlow ran again on the old directory: a thread got a new file.
    let thread = &tree.threads[0];
    let late = tree.thread_dir(thread).join("outputs/written-after.txt");
    fs::create_dir_all(late.parent().unwrap()).unwrap();
    fs::write(&late, b"written after the migration\n").unwrap();

    // A plain rerun says so and imports nothing new.
    let again = migrated(&site, &tree.root, &[]);
    assert_eq!(again["state"], "committed", "{again}");
    assert!(
        again["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("was not imported")),
        "{again}"
    );

    // Cleaning refuses that thread, and loses nothing of it.
    let mut args = os_args(&["migrate", "deerflow", "--source"]);
    args.push(tree.root.clone().into());
    args.extend(os_args(&["--clean-source"]));
    args.extend(site.args());
    let out = run(&args, &[]);
    assert!(!out.status.success(), "the cleaning was not refused");
    let message = stderr(&out);
    assert!(
        message.contains("was written to after it was migrated"),
        "{message}"
    );
    assert_eq!(fs::read(&late).unwrap(), b"written after the migration\n");
    assert!(tree.thread_dir(thread).join("workspace").exists());
    let journal = status(&site, &[]);
    assert_eq!(journal["migrations"][0]["state"], "committed", "{journal}");
}
