//! The snapshot engine on a generated workspace, beside `tar | zstd -1` and `restic` (when
//! installed) in the same run. Not a test: it asserts nothing, it prints figures and ratios.
//!
//! `cargo bench -p warren-snapshot --bench snapshot -- --size-mib 1024` (default 1024).
//! Targets (issue 5): full snapshot within 1.25× of `tar | zstd -1`; an incremental
//! snapshot after changing ~1% of files at least 10× faster than a full `tar | zstd -1`
//! and faster than `restic backup`; restore at least as fast as `zstd -d | tar x`; peak
//! RSS ≤ 64 MiB whatever the size.
//!
//! Each engine step runs in a child process (this same binary, `--child ...`) so its peak
//! RSS (VmHWM) is its own. warren makes a snapshot durable (one `syncfs` before the
//! manifest, one before a restored tree is swapped in), so the anchors end with
//! `sync -f` on what they wrote: the same work, compared.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use warren_fs::WorkspaceRoot;
use warren_snapshot::{restore, snapshot, LocalStore};
use warren_test_support::workload::{generate_workspace, sh, tar_zstd};

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `--child snapshot|restore <root> <base> <store> [<manifest>]`: one engine step (the
/// manifest is the parent of a snapshot, the source of a restore); prints
/// `manifest bytes_stored peak_kib`.
fn child(args: &[String]) {
    let root = WorkspaceRoot::open(Path::new(&args[1])).expect("open the root");
    let store = LocalStore::open(&args[3]).expect("open the store");
    match args[0].as_str() {
        "snapshot" => {
            let parent = args.get(4).map(String::as_str);
            let (id, stats) = snapshot(&root, &args[2], &store, parent).expect("snapshot");
            println!("{id} {} {}", stats.bytes_stored, peak_rss_kib());
        }
        "restore" => {
            restore(&root, &args[2], &store, &args[4]).expect("restore");
            println!("- 0 {}", peak_rss_kib());
        }
        other => panic!("unknown child step {other}"),
    }
}

fn run_child(step: &[&str]) -> (Duration, String, u64, u64) {
    let started = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--child")
        .args(step)
        .output()
        .expect("run the child");
    let elapsed = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let id = parts.next().unwrap_or_default().to_owned();
    let stored = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let peak = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    (elapsed, id, stored, peak)
}

fn ratio(ours: Duration, theirs: Duration) -> String {
    format!("{:.2}x", ours.as_secs_f64() / theirs.as_secs_f64())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(&args[1..]);
        return;
    }
    let size_mib: u64 = args
        .iter()
        .position(|a| a == "--size-mib")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let wd = root.join("projects/w");
    std::fs::create_dir_all(&wd).unwrap();
    let files = generate_workspace(&wd, size_mib * 1024 * 1024);
    let store = work.path().join("store");
    let tar_out = work.path().join("full.tar.zst");
    let (root_s, store_s) = (root.to_str().unwrap(), store.to_str().unwrap());
    println!(
        "warren snapshot engine vs anchors ({} files, {size_mib} MiB, this machine)\n",
        files.len()
    );
    sh("sync");

    let tar_full = tar_zstd(&wd, &tar_out);
    let tar_size = std::fs::metadata(&tar_out).unwrap().len();
    let (ours_full, manifest, stored_full, peak_full) =
        run_child(&["snapshot", root_s, "projects/w", store_s]);
    println!(
        "full snapshot        warren {:>8.2} s ({} MiB stored, peak RSS {} MiB)   tar|zstd -1 {:>6.2} s ({} MiB)   ratio {}",
        ours_full.as_secs_f64(),
        stored_full >> 20,
        peak_full >> 10,
        tar_full.as_secs_f64(),
        tar_size >> 20,
        ratio(ours_full, tar_full)
    );

    // restic, when installed: the same tree, then the same change.
    let restic_repo = work.path().join("restic");
    let restic = Command::new("restic")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    let restic_env = format!(
        "RESTIC_PASSWORD=bench RESTIC_REPOSITORY={} restic --quiet --no-cache",
        restic_repo.display()
    );
    if restic {
        sh(&format!("{restic_env} init >/dev/null"));
        let full = sh(&format!(
            "cd {} && {restic_env} backup . >/dev/null",
            wd.display()
        ));
        println!(
            "                     restic backup (full) {:>6.2} s",
            full.as_secs_f64()
        );
    }

    // Change ~1% of the files: append to some, rewrite a few.
    let mut changed_bytes = 0u64;
    for (i, path) in files.iter().enumerate().filter(|(i, _)| i % 100 == 0) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.extend_from_slice(format!("// change {i}\n").as_bytes());
        changed_bytes += bytes.len() as u64;
        std::fs::write(path, bytes).unwrap();
    }
    sh("sync");
    let (ours_incr, manifest_2, stored_incr, peak_incr) =
        run_child(&["snapshot", root_s, "projects/w", store_s, &manifest]);
    let tar_again = tar_zstd(&wd, &tar_out);
    print!(
        "incremental (1% of files, {} MiB touched)  warren {:.2} s, {} KiB stored (peak RSS {} MiB)   full tar|zstd -1 {:.2} s   ratio {}",
        changed_bytes >> 20,
        ours_incr.as_secs_f64(),
        stored_incr >> 10,
        peak_incr >> 10,
        tar_again.as_secs_f64(),
        ratio(ours_incr, tar_again)
    );
    if restic {
        let incr = sh(&format!(
            "cd {} && {restic_env} backup . >/dev/null",
            wd.display()
        ));
        print!(
            "   restic backup {:.2} s   ratio {}",
            incr.as_secs_f64(),
            ratio(ours_incr, incr)
        );
    } else {
        print!("   restic: not installed (apt-get install restic)");
    }
    println!();

    // Restore into a fresh place, beside zstd -d | tar x.
    std::fs::remove_dir_all(&wd).unwrap();
    std::fs::create_dir_all(&wd).unwrap();
    sh("sync");
    let (ours_restore, _, _, peak_restore) =
        run_child(&["restore", root_s, "projects/w", store_s, &manifest_2]);
    let untar = work.path().join("untar");
    std::fs::create_dir_all(&untar).unwrap();
    let tar_restore = sh(&format!(
        "zstd -d -q -c {} | tar -xf - -C {} && sync -f {}",
        tar_out.display(),
        untar.display(),
        untar.display()
    ));
    println!(
        "restore              warren {:>8.2} s (peak RSS {} MiB)   zstd -d|tar x {:>6.2} s   ratio {}",
        ours_restore.as_secs_f64(),
        peak_restore >> 10,
        tar_restore.as_secs_f64(),
        ratio(ours_restore, tar_restore)
    );
}
