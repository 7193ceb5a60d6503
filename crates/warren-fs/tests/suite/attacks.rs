//! The path attack corpus (I2): a table of hostile paths, each run against every operation and
//! both resolvers. Every case must be refused with the right error, must never return a byte
//! of a secret outside the workspace, must never create, change or delete anything outside it,
//! and its error message must not contain a host path (I1).
//!
//! Not in the corpus: hardlinks. A hardlink inside the workspace to a file outside it is the
//! same inode as the outside file, so no path resolution can tell it apart; keeping them out is
//! the sandbox's job (no shared filesystem with anything worth linking to).

use std::fs;
use std::os::unix::fs::symlink;

use warren_fs::{FsError, InvalidPathReason, Resolver, WorkspaceRoot, WriteOptions};

use super::support::{Fixture, SECRET};

/// How a case must be refused.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// By the textual rules, before any syscall.
    Invalid(InvalidPathReason),
    /// Because a component is a symlink (or magic link).
    Symlink,
}

/// One hostile path.
struct Attack {
    what: &'static str,
    setup: fn(&Fixture),
    path: fn(&Fixture) -> String,
    expect: Expect,
    /// The *last* component is a link: operations that act on a name (remove, rename) may
    /// legitimately act on the link itself, never on its target.
    leaf_is_link: bool,
}

fn nothing(_: &Fixture) {}

/// File name used for writes through `/proc/self/cwd`; it must never appear in the real cwd.
const PROBE: &str = "warren-attack-probe.txt";

fn corpus() -> Vec<Attack> {
    use Expect::{Invalid, Symlink};
    use InvalidPathReason::*;
    vec![
        Attack {
            what: "lone dotdot",
            setup: nothing,
            path: |_| "..".into(),
            expect: Invalid(ParentComponent),
            leaf_is_link: false,
        },
        Attack {
            what: "dotdot to the outside secret",
            setup: nothing,
            path: |_| "../outside/secret.txt".into(),
            expect: Invalid(ParentComponent),
            leaf_is_link: false,
        },
        Attack {
            what: "dotdot after a real directory",
            setup: |f| f.dir("a"),
            path: |_| "a/../../outside/secret.txt".into(),
            expect: Invalid(ParentComponent),
            leaf_is_link: false,
        },
        Attack {
            what: "dotdot through the other user's tree",
            setup: nothing,
            path: |_| "../other-user/workspace/secret.txt".into(),
            expect: Invalid(ParentComponent),
            leaf_is_link: false,
        },
        Attack {
            what: "absolute /etc/passwd",
            setup: nothing,
            path: |_| "/etc/passwd".into(),
            expect: Invalid(Absolute),
            leaf_is_link: false,
        },
        Attack {
            what: "absolute path of the secret",
            setup: nothing,
            path: |f| f.outside.join("secret.txt").to_string_lossy().into_owned(),
            expect: Invalid(Absolute),
            leaf_is_link: false,
        },
        Attack {
            what: "absolute path of the other user's secret",
            setup: nothing,
            path: |f| f.other.join("secret.txt").to_string_lossy().into_owned(),
            expect: Invalid(Absolute),
            leaf_is_link: false,
        },
        Attack {
            what: "nul byte",
            setup: |f| f.file("a", "x"),
            path: |_| "a\0/../outside/secret.txt".into(),
            expect: Invalid(NulByte),
            leaf_is_link: false,
        },
        Attack {
            what: "256-byte component",
            setup: nothing,
            path: |_| "x".repeat(256),
            expect: Invalid(ComponentTooLong),
            leaf_is_link: false,
        },
        Attack {
            what: "5000-byte path",
            setup: nothing,
            path: |_| "a/".repeat(2500),
            expect: Invalid(PathTooLong),
            leaf_is_link: false,
        },
        Attack {
            what: "first component is an absolute symlink to the outside",
            setup: |f| f.symlink("link", &f.outside),
            path: |_| "link/secret.txt".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "first component is a relative symlink to the outside",
            setup: |f| f.symlink("link", "../outside"),
            path: |_| "link/secret.txt".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "middle component is an absolute symlink to the outside",
            setup: |f| f.symlink("a/link", &f.outside),
            path: |_| "a/link/secret.txt".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "middle component is a relative symlink to the outside",
            setup: |f| f.symlink("a/b/link", "../../../outside"),
            path: |_| "a/b/link/secret.txt".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "middle component is a symlink into the other user's workspace",
            setup: |f| f.symlink("a/link", "../../other-user/workspace"),
            path: |_| "a/link/secret.txt".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "last component is an absolute symlink to the secret",
            setup: |f| f.symlink("leak.txt", f.outside.join("secret.txt")),
            path: |_| "leak.txt".into(),
            expect: Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "last component is a relative symlink to the secret",
            setup: |f| f.symlink("a/leak.txt", "../../outside/secret.txt"),
            path: |_| "a/leak.txt".into(),
            expect: Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "last component is a symlink to the outside directory",
            setup: |f| f.symlink("a/out", &f.outside),
            path: |_| "a/out".into(),
            expect: Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "dangling symlink as last component pointing outside",
            setup: |f| f.symlink("new.txt", f.outside.join("created-by-attack.txt")),
            path: |_| "new.txt".into(),
            expect: Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "symlink to a file inside the root is still not followed",
            setup: |f| {
                f.file("real.txt", "inside");
                f.symlink("alias.txt", "real.txt");
            },
            path: |_| "alias.txt".into(),
            expect: Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "symlink to a directory inside the root is still not followed",
            setup: |f| {
                f.file("realdir/f.txt", "inside");
                f.symlink("dir_alias", "realdir");
            },
            path: |_| "dir_alias/f.txt".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "magic link /proc/self/root as a middle component",
            setup: |f| f.symlink("proc_root", "/proc/self/root"),
            path: |f| {
                let secret = f.outside.join("secret.txt");
                format!("proc_root{}", secret.to_string_lossy())
            },
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "magic link /proc/self/root as the last component",
            setup: |f| f.symlink("proc_root", "/proc/self/root"),
            path: |_| "proc_root".into(),
            expect: Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "magic link /proc/self/cwd as a middle component",
            setup: |f| f.symlink("proc_cwd", "/proc/self/cwd"),
            path: |_| format!("proc_cwd/{PROBE}"),
            expect: Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "symlink to /proc/self/cwd/.. reaching the cwd's parent",
            setup: |f| f.symlink("up", "/proc/self/cwd/.."),
            path: |_| "up/Cargo.toml".into(),
            expect: Symlink,
            leaf_is_link: false,
        },
    ]
}

/// Every operation of the API, aimed at the attack path.
#[derive(Debug, Clone, Copy)]
enum Operation {
    Stat,
    Etag,
    Read,
    Write,
    WriteCreatingParents,
    Append,
    Edit,
    List,
    Glob,
    Grep,
    MkdirP,
    Remove,
    RemoveRecursive,
    RenameFrom,
    RenameTo,
    RenameToOverwriting,
}

const OPERATIONS: [Operation; 16] = [
    Operation::Stat,
    Operation::Etag,
    Operation::Read,
    Operation::Write,
    Operation::WriteCreatingParents,
    Operation::Append,
    Operation::Edit,
    Operation::List,
    Operation::Glob,
    Operation::Grep,
    Operation::MkdirP,
    Operation::Remove,
    Operation::RemoveRecursive,
    Operation::RenameFrom,
    Operation::RenameTo,
    Operation::RenameToOverwriting,
];

/// Runs `op` on `path`; returns a debug rendering of the result (checked for secrets) and
/// whether it failed, with the error.
fn perform(
    ws: &WorkspaceRoot,
    f: &Fixture,
    op: Operation,
    path: &str,
) -> (String, Option<FsError>) {
    fn done<T: std::fmt::Debug>(r: Result<T, FsError>) -> (String, Option<FsError>) {
        let shown = format!("{r:?}");
        (shown, r.err())
    }
    let bytes = b"PWNED".as_slice();
    match op {
        Operation::Stat => done(ws.stat(path)),
        Operation::Etag => done(ws.etag(path)),
        Operation::Read => done(ws.read(path, Default::default(), 1 << 20)),
        Operation::Write => done(ws.write(path, bytes, WriteOptions::default())),
        Operation::WriteCreatingParents => done(ws.write(
            path,
            bytes,
            WriteOptions {
                create_parents: true,
                ..Default::default()
            },
        )),
        Operation::Append => done(ws.append(path, bytes, WriteOptions::default())),
        Operation::Edit => done(ws.edit(path, "TOP", "PWNED", true, None)),
        Operation::List => done(ws.list(path, 3, 100)),
        Operation::Glob => done(ws.glob(path, "**", 100)),
        Operation::Grep => done(ws.grep(path, "SECRET", Default::default())),
        Operation::MkdirP => done(ws.mkdir_p(path)),
        Operation::Remove => done(ws.remove(path, false)),
        Operation::RemoveRecursive => done(ws.remove(path, true)),
        Operation::RenameFrom => done(ws.rename(path, "moved", false)),
        Operation::RenameTo | Operation::RenameToOverwriting => {
            f.file("src.txt", "src");
            let overwrite = matches!(op, Operation::RenameToOverwriting);
            done(ws.rename("src.txt", path, overwrite))
        }
    }
}

/// Whether `err` is the refusal `expect` asks for. Operations that name the last component
/// without following it (remove, rename) meet a leaf link as an ordinary entry.
fn refused_as_expected(attack: &Attack, op: Operation, err: Option<&FsError>) -> bool {
    let acts_on_link_itself = attack.leaf_is_link
        && matches!(
            op,
            Operation::Remove
                | Operation::RemoveRecursive
                | Operation::RenameFrom
                | Operation::RenameTo
                | Operation::RenameToOverwriting
        );
    match (attack.expect, err) {
        (Expect::Invalid(want), Some(FsError::InvalidPath { reason, .. })) => *reason == want,
        (Expect::Symlink, Some(FsError::SymlinkRefused { .. })) => true,
        (Expect::Symlink, Some(FsError::AlreadyExists { .. })) => {
            acts_on_link_itself && matches!(op, Operation::RenameTo)
        }
        (Expect::Symlink, None) => acts_on_link_itself && !matches!(op, Operation::RenameTo),
        _ => false,
    }
}

fn run_corpus(resolver: Resolver) {
    let cwd = std::env::current_dir().expect("cwd");
    let mut failures = Vec::new();
    for attack in corpus() {
        for op in OPERATIONS {
            let f = Fixture::new();
            (attack.setup)(&f);
            let path = (attack.path)(&f);
            let before = f.snapshot_outside();
            let ws = f.ws(resolver);
            let (shown, err) = perform(&ws, &f, op, &path);
            let label = format!("{} / {op:?}", attack.what);
            if shown.contains(SECRET) {
                failures.push(format!("{label}: returned secret bytes: {shown}"));
            }
            if !refused_as_expected(&attack, op, err.as_ref()) {
                failures.push(format!(
                    "{label}: expected {:?}, got {shown}",
                    attack.expect
                ));
            }
            if let Some(err) = &err {
                let message = err.to_string();
                let host = f.base.to_string_lossy();
                if message.contains(host.as_ref()) && !path.contains(host.as_ref()) {
                    failures.push(format!("{label}: message leaks a host path: {message}"));
                }
            }
            if f.snapshot_outside() != before {
                failures.push(format!("{label}: something outside the workspace changed"));
            }
            if cwd.join(PROBE).exists() {
                let _ = fs::remove_file(cwd.join(PROBE));
                failures.push(format!("{label}: wrote through /proc/self/cwd"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The whole table: every attack against every operation.
fn every_attack_is_refused_by_every_operation(r: Resolver) {
    run_corpus(r);
}

fn refusal_messages_name_the_relative_path_only(r: Resolver) {
    let f = Fixture::new();
    f.symlink("a/link", &f.outside);
    let err = f
        .ws(r)
        .read("a/link/secret.txt", Default::default(), 100)
        .unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "`a/link/secret.txt`: symlinks are not followed inside the workspace"
    );
}

fn symlink_in_middle_component_is_refused(r: Resolver) {
    let f = Fixture::new();
    f.symlink("a/b", &f.outside);
    let err = f.ws(r).stat("a/b/secret.txt").unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
}

fn writes_never_create_files_through_a_dangling_leaf_link(r: Resolver) {
    let f = Fixture::new();
    let target = f.outside.join("created.txt");
    f.symlink("new.txt", &target);
    let ws = f.ws(r);
    assert!(ws.write("new.txt", b"x", WriteOptions::default()).is_err());
    assert!(ws.append("new.txt", b"x", WriteOptions::default()).is_err());
    assert!(!target.exists());
}

fn a_link_swapped_in_for_a_directory_is_seen_by_the_next_operation(r: Resolver) {
    let f = Fixture::new();
    f.file("d/f.txt", "inside");
    let ws = f.ws(r);
    assert_eq!(
        ws.read("d/f.txt", Default::default(), 100).unwrap().bytes,
        b"inside"
    );
    fs::rename(f.path("d"), f.path("d_real")).unwrap();
    symlink(&f.outside, f.path("d")).unwrap();
    let err = ws
        .read("d/secret.txt", Default::default(), 100)
        .unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err:?}");
}

for_both_resolvers!(
    every_attack_is_refused_by_every_operation,
    refusal_messages_name_the_relative_path_only,
    symlink_in_middle_component_is_refused,
    writes_never_create_files_through_a_dangling_leaf_link,
    a_link_swapped_in_for_a_directory_is_seen_by_the_next_operation,
);
