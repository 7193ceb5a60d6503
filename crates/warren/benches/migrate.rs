//! Migration throughput (issue 18): `warren migrate deerflow` on a generated DeerFlow
//! deployment of 20,000 files and 1 GiB ([`TreeSpec::bench`]), beside what an operator
//! would do by hand to copy and verify the same tree: `cp -a SRC DST`, then
//! `find … -type f -print0 | xargs -0 sha256sum` on both sides, sorted and compared. Not a
//! test: it asserts nothing beyond each side's answer being right, it prints.
//!
//! What each side does with the data:
//! - warren: reads the source once (copying it by descriptors into staging while hashing
//!   it with SHA-256), writes it once, syncs the filesystem, re-reads the staging copy
//!   (verify), renames it into place and re-reads the final tree (read-back), every step
//!   journaled in SQLite. 3 reads, 1 write, durable.
//! - the anchor: `cp -a` reads the source once and writes it once, then `sha256sum` reads
//!   both sides. 3 reads, 1 write, not synced; a row with a final `sync` is printed too.
//!
//! Before every measured run the filesystem is synced and the page cache dropped
//! (`sync; echo 3 > /proc/sys/vm/drop_caches`, as root), so both sides start cold: only the
//! first read of the source comes from disk, the later reads of data just written or read
//! are usually served by the page cache on either side (and on a virtual disk the host's
//! cache may still serve the first). As many warm runs of each follow (the source in the
//! page cache, only a `sync` before each). Each warren run migrates into a fresh data
//! directory and each anchor run copies into a fresh directory, both on the filesystem of
//! the source (under cargo's `target/tmp`, never a tmpfs); the two interleave, so a slow
//! spell of this machine lands on both.
//!
//! Run as root: `cargo bench -p warren --bench migrate` (`-- --iterations N`, default 3
//! cold and 3 warm runs of each side; `--files N --mib M` generate a smaller tree for a
//! quick look, the figure is the default).

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use warren_test_support::deerflow_tree::{DeerflowTree, GeneratedTree, TreeSpec};
use warren_test_support::latency::percentile;

const MIB: f64 = 1024.0 * 1024.0;

/// The settings a `warren` process could pick up from the machine instead of the bench.
const WARREN_ENV: [&str; 6] = [
    "WARREN_CONFIG",
    "WARREN_DATA_DIR",
    "WARREN_WORKSPACE_DIR",
    "WARREN_STATE",
    "WARREN_TOKEN",
    "WARREN_MIGRATE_CRASH_AFTER",
];

fn flag<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
}

/// `sync`, then drops the page cache, dentries and inodes; false if the kernel refused.
fn drop_caches() -> bool {
    sync();
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn sync() {
    let status = Command::new("sync").status().expect("run sync");
    assert!(status.success(), "sync failed");
}

/// Regular files and their bytes under `root` (symlinks not followed).
fn count(root: &Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.file_type().is_file() {
                files += 1;
                bytes += meta.len();
            }
        }
    }
    (files, bytes)
}

/// The filesystem type of `path` (`findmnt`, else `stat -f`, which names ext4 ext2/ext3).
fn fs_type(path: &Path) -> String {
    let out = Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "--target"])
        .arg(path)
        .output();
    if let Some(out) = out.ok().filter(|o| o.status.success()) {
        return String::from_utf8_lossy(&out.stdout).trim().to_owned();
    }
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .expect("run stat -f");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One `warren migrate deerflow` run.
struct WarrenRun {
    wall: Duration,
    /// What the outcome counts: each item's files and bytes, so a custom skill once per
    /// uid that receives it.
    files: u64,
    bytes: u64,
    /// The migrator's own `elapsed_ms` (in-process, after start-up and opening the store).
    reported: Duration,
}

/// Migrates `tree` into the fresh directory `run`: its data directory `run/data`, the shared
/// skills (where the public ones go) `run/shared-skills`, named by `run/warren.toml`.
fn warren_migrate(bin: &Path, tree: &GeneratedTree, run: &Path) -> WarrenRun {
    let shared = run.join("shared-skills");
    fs::create_dir_all(&shared).unwrap();
    let config = run.join("warren.toml");
    fs::write(
        &config,
        format!("[skills]\nshared_dir = \"{}\"\n", shared.display()),
    )
    .unwrap();
    let mut command = Command::new(bin);
    command
        .args(["migrate", "deerflow", "--json", "--source"])
        .arg(&tree.root)
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(run.join("data"))
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null());
    for key in WARREN_ENV {
        command.env_remove(key);
    }
    let started = Instant::now();
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let wall = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "warren migrate deerflow failed ({}):\nstderr:\n{stderr}\nstdout:\n{stdout}",
        out.status
    );
    let outcome: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("warren migrate printed no JSON ({e}):\n{stdout}\n{stderr}"));
    assert_eq!(outcome["state"], "committed", "{outcome:#}");
    assert_eq!(outcome["resumed"], false, "{outcome:#}");
    // Every thread and skill; the custom skills once per uid with threads (the users and
    // `default`, which receives the legacy threads).
    let receivers = tree.users().len() + usize::from(tree.threads.iter().any(|t| t.user.is_none()));
    let items =
        tree.threads.len() + tree.public_skills.len() + tree.custom_skills.len() * receivers;
    assert_eq!(
        outcome["items"].as_array().map(Vec::len),
        Some(items),
        "items: {outcome:#}"
    );
    let files = outcome["files"].as_u64().unwrap();
    let bytes = outcome["bytes"].as_u64().unwrap();
    assert!(
        files >= tree.files && bytes >= tree.bytes,
        "the outcome counts {files} files, {bytes} bytes; the tree holds {} files, {} bytes \
         to migrate",
        tree.files,
        tree.bytes
    );
    let warnings = outcome["warnings"].as_array().map_or(0, Vec::len);
    assert_eq!(warnings, 0, "warnings: {outcome:#}");
    WarrenRun {
        wall,
        files,
        bytes,
        reported: Duration::from_millis(outcome["elapsed_ms"].as_u64().unwrap_or(0)),
    }
}

/// One anchor run: its phases.
struct AnchorRun {
    cp: Duration,
    sha_src: Duration,
    sha_dst: Duration,
    /// `cp` + both `sha256sum`s + sorting and comparing the digests.
    total: Duration,
    /// The `sync` after all that.
    sync: Duration,
}

/// `cd DIR && find . -type f -print0 | xargs -0 sha256sum`, its lines sorted.
fn sha256sum_tree(dir: &Path) -> Vec<Vec<u8>> {
    let out = Command::new("sh")
        .args([
            "-c",
            "cd \"$1\" && find . -type f -print0 | xargs -0 sha256sum",
            "sh",
        ])
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run find | xargs sha256sum");
    assert!(
        out.status.success(),
        "sha256sum of {} failed ({}): {}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<Vec<u8>> = out
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    lines.sort_unstable();
    lines
}

fn anchor(src: &Path, dst: &Path, files: u64) -> AnchorRun {
    let started = Instant::now();
    let status = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dst)
        .stdin(Stdio::null())
        .status()
        .expect("run cp -a");
    assert!(status.success(), "cp -a failed: {status}");
    let cp = started.elapsed();
    let at = Instant::now();
    let left = sha256sum_tree(src);
    let sha_src = at.elapsed();
    let at = Instant::now();
    let right = sha256sum_tree(dst);
    let sha_dst = at.elapsed();
    assert_eq!(left.len() as u64, files, "sha256sum saw another file count");
    if left != right {
        let differ = left
            .iter()
            .zip(&right)
            .find(|(a, b)| a != b)
            .map(|(a, _)| String::from_utf8_lossy(a).into_owned());
        panic!("the copy differs from the source: {differ:?}");
    }
    let total = started.elapsed();
    let at = Instant::now();
    sync();
    AnchorRun {
        cp,
        sha_src,
        sha_dst,
        total,
        sync: at.elapsed(),
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Median, and the range when there is more than one sample.
fn spread(samples: &mut [Duration]) -> String {
    let median = percentile(samples, 0.5);
    if samples.len() == 1 {
        format!("{:.2} s", secs(median))
    } else {
        format!(
            "{:.2} s (min {:.2}, max {:.2})",
            secs(median),
            secs(samples[0]),
            secs(samples[samples.len() - 1])
        )
    }
}

fn header() {
    println!(
        "  {:<44} {:>7} {:>8} {:>9} {:>9} {:>8}  {:>5} {:>6}",
        "", "files", "MiB", "seconds", "files/s", "MiB/s", "reads", "writes"
    );
}

fn throughput_row(name: &str, files: u64, bytes: u64, time: Duration, reads: u32) {
    let s = secs(time);
    println!(
        "  {name:<44} {files:>7} {:>8.1} {s:>9.2} {:>9.0} {:>8.1}  {reads:>5} {:>6}",
        bytes as f64 / MIB,
        files as f64 / s,
        bytes as f64 / MIB / s,
        1
    );
}

/// The samples of one page-cache state.
#[derive(Default)]
struct Samples {
    warren: Vec<Duration>,
    warren_reported: Vec<Duration>,
    /// Files and bytes warren moved (the same every run).
    warren_counts: (u64, u64),
    cp: Vec<Duration>,
    sha_src: Vec<Duration>,
    sha_dst: Vec<Duration>,
    anchor: Vec<Duration>,
    anchor_sync: Vec<Duration>,
}

impl Samples {
    fn warren(&mut self, run: WarrenRun) {
        self.warren.push(run.wall);
        self.warren_reported.push(run.reported);
        self.warren_counts = (run.files, run.bytes);
    }

    fn anchor(&mut self, run: AnchorRun) {
        self.cp.push(run.cp);
        self.sha_src.push(run.sha_src);
        self.sha_dst.push(run.sha_dst);
        self.anchor.push(run.total);
        self.anchor_sync.push(run.total + run.sync);
    }

    fn report(&mut self, title: &str, whole: (u64, u64)) {
        let n = self.warren.len();
        println!("{title}, {n} run(s) of each side, median:");
        header();
        let warren = percentile(&mut self.warren, 0.5);
        let anchor = percentile(&mut self.anchor, 0.5);
        let anchor_sync = percentile(&mut self.anchor_sync, 0.5);
        throughput_row(
            "warren migrate deerflow (process, wall)",
            self.warren_counts.0,
            self.warren_counts.1,
            warren,
            3,
        );
        throughput_row("cp -a + sha256sum both sides", whole.0, whole.1, anchor, 3);
        throughput_row(
            "cp -a + sha256sum both sides + sync",
            whole.0,
            whole.1,
            anchor_sync,
            3,
        );
        println!(
            "  ratio warren/anchor (time): {:.2}x   (warren/anchor with sync: {:.2}x)",
            secs(warren) / secs(anchor),
            secs(warren) / secs(anchor_sync)
        );
        println!("  warren wall          {}", spread(&mut self.warren));
        println!(
            "  warren elapsed_ms    {}   (the migrator's own: no process start, store open)",
            spread(&mut self.warren_reported)
        );
        println!("  anchor               {}", spread(&mut self.anchor));
        println!("    cp -a              {}", spread(&mut self.cp));
        println!("    sha256sum SRC      {}", spread(&mut self.sha_src));
        println!("    sha256sum DST      {}", spread(&mut self.sha_dst));
        println!("  anchor + sync        {}", spread(&mut self.anchor_sync));
        println!();
    }
}

fn main() {
    let iterations: usize = flag("--iterations").unwrap_or(3).max(1);
    let mut spec = TreeSpec::bench();
    if let Some(files) = flag("--files") {
        spec.files = files;
    }
    if let Some(mib) = flag::<u64>("--mib") {
        spec.bytes = mib << 20;
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));

    // On the disk cargo builds on (target/tmp), never a tmpfs; removed at the end, and on
    // a panic as it unwinds.
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    fs::create_dir_all(target_tmp).unwrap();
    let base = tempfile::Builder::new()
        .prefix("warren-bench-migrate-")
        .tempdir_in(target_tmp)
        .unwrap();
    let fs_kind = fs_type(base.path());
    assert!(
        !matches!(fs_kind.as_str(), "tmpfs" | "ramfs"),
        "{} is on {fs_kind}: the bench needs a real disk",
        base.path().display()
    );

    let generating = Instant::now();
    let tree = DeerflowTree::generate(&base.path().join("deer-flow"), &spec).unwrap();
    let generated = generating.elapsed();
    let whole = count(&tree.root);
    let items = tree.item_sources().len();

    println!(
        "warren migrate deerflow vs `cp -a` + `sha256sum` of both sides (issue 18): throughput \
         of copying and verifying one tree\n"
    );
    println!(
        "tree: TreeSpec::bench() (seed {}{}): {} files of {:.1} MiB in {items} items ({} \
         threads, {} skills) to migrate; {} files, {:.1} MiB in the whole tree `cp -a` \
         copies (with DeerFlow's memory.json and agents/, which the migrator leaves alone); \
         generated in {:.1} s",
        spec.seed,
        if spec == TreeSpec::bench() {
            String::new()
        } else {
            format!(
                ", resized to {} bulk files, {} bytes",
                spec.files, spec.bytes
            )
        },
        tree.files,
        tree.bytes as f64 / MIB,
        tree.threads.len(),
        tree.public_skills.len() + tree.custom_skills.len(),
        whole.0,
        whole.1 as f64 / MIB,
        secs(generated)
    );
    println!(
        "where: {} ({fs_kind}); each warren run into a fresh data directory and shared skills \
         directory there, each cp -a into a fresh directory there",
        base.path().display()
    );
    println!(
        "warren: `{} migrate deerflow --source SRC --config C --data-dir DATA --json` (C: \
         `[skills] shared_dir`, where the public skills go), timed from spawn to exit: reads \
         the source once (copy + SHA-256), writes once, syncs, re-reads the staging copy \
         (verify) and the final tree (read-back), journaled in SQLite: 3 reads, 1 write; its \
         files and bytes are the outcome's, a custom skill counted once per uid receiving it",
        bin.display()
    );
    println!(
        "anchor: `cp -a SRC DST`, then `find . -type f -print0 | xargs -0 sha256sum` in SRC \
         and in DST, sorted and compared: 1 read + 1 write (cp), 2 reads (sha256sum) = 3 \
         reads, 1 write, not synced (the `+ sync` row adds a final `sync`)"
    );
    println!(
        "reproduce: cargo bench -p warren --bench migrate (-- --iterations N, default 3 cold \
         + 3 warm)\n"
    );

    let (mut cold, mut warm) = (Samples::default(), Samples::default());
    let mut dropped = true;
    let mut run_number = 0;
    // Cold runs first, then warm ones (the source stays in the page cache: every run reads
    // it, and only the copies are removed). The sides interleave, each iteration starting
    // with the other one, so a slow spell of this machine lands on both.
    for (samples, drop_first) in [(&mut cold, true), (&mut warm, false)] {
        for i in 0..iterations {
            for side in [i % 2, (i + 1) % 2] {
                if drop_first {
                    dropped &= drop_caches();
                } else {
                    sync();
                }
                run_number += 1;
                let out = base.path().join(format!("run-{run_number}"));
                if side == 0 {
                    samples.warren(warren_migrate(bin, &tree, &out));
                } else {
                    samples.anchor(anchor(&tree.root, &out, whole.0));
                }
                remove(&out);
            }
        }
    }

    let title = if dropped {
        "cold: `sync; echo 3 > /proc/sys/vm/drop_caches` before each run".to_owned()
    } else {
        "NOT cold: the page cache could not be dropped (not root?); `sync` before each run"
            .to_owned()
    };
    cold.report(&title, whole);
    warm.report(
        "warm: the source in the page cache, `sync` before each run",
        whole,
    );
    drop(base);
}

/// Removes a run's output, outside the timing (the next run starts with a `sync`).
fn remove(path: &Path) {
    fs::remove_dir_all(path).unwrap_or_else(|e| panic!("remove {}: {e}", path.display()));
}
