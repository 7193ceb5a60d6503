//! Race tests (I2): while one thread keeps swapping a path component between a real directory
//! (or file) and a symlink to the outside, another thread hammers the API through it. Because
//! resolution happens by descriptor, root to leaf, with no check-then-use gap, no read may ever
//! return the secret and no write may ever land outside.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use rustix::fs::{renameat_with, RenameFlags, CWD};
use warren_fs::{ByteRange, FsError, Resolver, WriteOptions};

use super::support::{host_names, Fixture, SECRET};

const ITERATIONS: usize = 2000;

/// Atomically exchanges `a` and `b` until `stop` is set; returns how many swaps happened.
fn swap_until(a: &Path, b: &Path, stop: &AtomicBool, swaps: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).expect("exchange");
        swaps.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sets the stop flag when dropped, so a failing assertion in the hammering thread stops the
/// swapper too (otherwise `thread::scope` would wait for it forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn refused_or_missing(err: &FsError) -> bool {
    matches!(
        err,
        FsError::SymlinkRefused { .. } | FsError::NotFound { .. }
    )
}

fn swapping_a_middle_directory_for_a_symlink_never_leaks_or_escapes(r: Resolver) {
    let f = Fixture::new();
    f.file("d/f.txt", "inside");
    f.symlink("d_alt", &f.outside);
    let ws = f.ws(r);
    let stop = AtomicBool::new(false);
    let swaps = AtomicU64::new(0);
    let (mut inside_reads, mut refusals) = (0u32, 0u32);
    thread::scope(|s| {
        s.spawn(|| swap_until(&f.path("d"), &f.path("d_alt"), &stop, &swaps));
        let _stop = StopOnDrop(&stop);
        for i in 0..ITERATIONS {
            match ws.read("d/secret.txt", ByteRange::FULL, 1024) {
                Ok(res) => panic!(
                    "read through the link returned {:?}",
                    String::from_utf8_lossy(&res.bytes)
                ),
                Err(err) => assert!(refused_or_missing(&err), "{err:?}"),
            }
            match ws.read("d/f.txt", ByteRange::FULL, 1024) {
                Ok(res) => {
                    assert_eq!(res.bytes, b"inside");
                    inside_reads += 1;
                }
                Err(err) => {
                    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
                    refusals += 1;
                }
            }
            if let Err(err) = ws.write(
                "d/new.txt",
                i.to_string().as_bytes(),
                WriteOptions::default(),
            ) {
                assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
            }
            if let Ok(listing) = ws.list("d", 1, 100) {
                assert!(listing
                    .entries
                    .iter()
                    .all(|e| !e.path.ends_with("secret.txt")));
            }
            if let Err(err) = ws.edit("d/secret.txt", SECRET, "PWNED", true, None) {
                assert!(refused_or_missing(&err), "{err:?}");
            }
        }
    });
    assert!(
        swaps.load(Ordering::Relaxed) > 10,
        "the swapper must have run"
    );
    eprintln!(
        "{r:?}: {inside_reads} reads inside, {refusals} refused, {} swaps",
        swaps.load(Ordering::Relaxed)
    );
    assert_eq!(
        host_names(&f.outside),
        ["secret.txt"],
        "nothing may land outside"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        SECRET
    );
}

fn swapping_the_last_component_for_a_symlink_never_leaks(r: Resolver) {
    let f = Fixture::new();
    f.file("leaf.txt", "inside");
    f.symlink("leaf_alt", f.outside.join("secret.txt"));
    let ws = f.ws(r);
    let stop = AtomicBool::new(false);
    let swaps = AtomicU64::new(0);
    thread::scope(|s| {
        s.spawn(|| swap_until(&f.path("leaf.txt"), &f.path("leaf_alt"), &stop, &swaps));
        let _stop = StopOnDrop(&stop);
        for _ in 0..ITERATIONS {
            match ws.read("leaf.txt", ByteRange::FULL, 1024) {
                Ok(res) => assert_eq!(res.bytes, b"inside"),
                Err(err) => assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}"),
            }
            if let Ok(entry) = ws.stat("leaf.txt") {
                assert_eq!(entry.size, 6, "stat must describe the inside file");
            }
            if let Err(err) = ws.append("leaf.txt", b"", WriteOptions::default()) {
                assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
            }
        }
    });
    assert!(
        swaps.load(Ordering::Relaxed) > 10,
        "the swapper must have run"
    );
    assert_eq!(host_names(&f.outside), ["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        SECRET
    );
}

for_both_resolvers!(
    swapping_a_middle_directory_for_a_symlink_never_leaks_or_escapes,
    swapping_the_last_component_for_a_symlink_never_leaks,
);
