//! Mount crossings (I2): a mount point inside the workspace is never entered. Needs root and
//! `mount(8)`; where mounting is not possible the tests fail and say so.

use std::path::{Path, PathBuf};
use std::process::Command;

use warren_fs::{ByteRange, FsError, Kind, Resolver, WriteOptions};

use super::support::{Fixture, SECRET};

/// A mount that is lazily unmounted when dropped, even if the test panics.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount(args: &[&str], target: &Path) -> Mounted {
    std::fs::create_dir_all(target).unwrap();
    let ok = Command::new("mount")
        .args(args)
        .arg(target)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "mount {args:?} failed: the mount-crossing tests need root and mount(8)"
    );
    Mounted(target.to_owned())
}

fn crossing(err: &FsError) -> bool {
    matches!(err, FsError::MountCrossingRefused { .. })
}

fn a_tmpfs_mounted_inside_the_workspace_is_not_entered(r: Resolver) {
    let f = Fixture::new();
    let _mnt = mount(&["-t", "tmpfs", "none"], &f.path("mnt"));
    std::fs::write(f.path("mnt/inner.txt"), "on another fs").unwrap();
    let ws = f.ws(r);
    let err = ws.stat("mnt").unwrap_err();
    assert!(crossing(&err), "{err:?}");
    let err = ws.read("mnt/inner.txt", ByteRange::FULL, 100).unwrap_err();
    assert!(crossing(&err), "{err:?}");
    let err = ws
        .write("mnt/new.txt", b"x", WriteOptions::default())
        .unwrap_err();
    assert!(crossing(&err), "{err:?}");
    // Listed (as the directory it looks like) but never descended into.
    let listing = ws.list("", 5, 100).unwrap();
    let paths: Vec<_> = listing.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["mnt"]);
    assert_eq!(listing.entries[0].kind, Kind::Dir);
    let err = ws.remove("mnt", true).unwrap_err();
    assert!(crossing(&err), "{err:?}");
    assert!(f.path("mnt/inner.txt").exists());
}

fn a_bind_mount_of_the_outside_is_not_entered(r: Resolver) {
    let f = Fixture::new();
    let outside = f.outside.to_string_lossy().into_owned();
    let _mnt = mount(&["--bind", &outside], &f.path("bind"));
    let ws = f.ws(r);
    let err = ws
        .read("bind/secret.txt", ByteRange::FULL, 100)
        .unwrap_err();
    assert!(crossing(&err), "{err:?}");
    let err = ws.remove("bind", true).unwrap_err();
    assert!(crossing(&err), "{err:?}");
    let res = ws.grep("", "SECRET", Default::default()).unwrap();
    assert!(res.matches.is_empty());
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        SECRET
    );
}

for_both_resolvers!(
    a_tmpfs_mounted_inside_the_workspace_is_not_entered,
    a_bind_mount_of_the_outside_is_not_entered,
);
