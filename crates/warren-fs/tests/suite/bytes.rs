//! Names that are not UTF-8: the tree operations take them as exact bytes (`OsStr`),
//! listings report them as they are, and every refusal is the one the same path gets as a
//! `&str` (`..`, absolute paths, NUL, links in any component, a link as the last one).

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::PathBuf;

use warren_fs::{FsError, Kind, Resolver, WorkspaceRoot};

use super::support::{Fixture, SECRET};

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

fn host(f: &Fixture, rel: &[u8]) -> PathBuf {
    f.root.join(os(rel))
}

fn listed_names_keep_their_exact_bytes_and_show_a_lossy_path(r: Resolver) {
    let f = Fixture::new();
    std::fs::create_dir(host(&f, b"d\xff")).unwrap();
    std::fs::write(host(&f, b"d\xff/caf\xe9"), "x").unwrap();
    symlink(os(b"t\xe9rget"), host(&f, b"l\xe9")).unwrap();
    let listing = f.ws(r).list("", 3, 100).unwrap();
    let seen: Vec<(&[u8], &str)> = listing
        .entries
        .iter()
        .map(|e| (e.os_path.as_bytes(), e.path.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (b"d\xff".as_slice(), "d\u{FFFD}"),
            (b"d\xff/caf\xe9".as_slice(), "d\u{FFFD}/caf\u{FFFD}"),
            (b"l\xe9".as_slice(), "l\u{FFFD}"),
        ]
    );
    let link = &listing.entries[2];
    assert_eq!(link.kind, Kind::Symlink);
    assert_eq!(
        link.os_symlink_target.as_deref().map(OsStrExt::as_bytes),
        Some(b"t\xe9rget".as_slice())
    );
    assert_eq!(link.symlink_target.as_deref(), Some("t\u{FFFD}rget"));
    // A UTF-8 name is the same either way.
    f.file("plain.txt", "p");
    let entry = f.ws(r).stat("plain.txt").unwrap();
    assert_eq!(
        (entry.path.as_str(), entry.os_path.as_os_str()),
        ("plain.txt", os(b"plain.txt"))
    );
    // Listing beneath a directory named by its bytes reports paths from the root.
    let inner = f.ws(r).list(os(b"d\xff"), 1, 100).unwrap();
    assert_eq!(inner.entries[0].os_path, os(b"d\xff/caf\xe9"));
}

fn the_tree_operations_make_and_read_names_byte_for_byte(r: Resolver) {
    let f = Fixture::new();
    let ws = f.ws(r);
    assert!(ws.mkdir_p(os(b"d\xff/sub\xfe")).unwrap());
    let mut file = ws.create_file(os(b"d\xff/caf\xe9"), 0o640).unwrap();
    file.write_all(b"bytes").unwrap();
    drop(file);
    assert_eq!(std::fs::read(host(&f, b"d\xff/caf\xe9")).unwrap(), b"bytes");
    let mut read = String::new();
    std::io::Read::read_to_string(&mut ws.open_file(os(b"d\xff/caf\xe9")).unwrap(), &mut read)
        .unwrap();
    assert_eq!(read, "bytes");
    ws.create_symlink(os(b"l\xe9"), os(b"/nowhere/\xff"))
        .unwrap();
    assert_eq!(
        std::fs::read_link(host(&f, b"l\xe9"))
            .unwrap()
            .into_os_string(),
        OsString::from_vec(b"/nowhere/\xff".to_vec())
    );
    ws.create_hardlink(os(b"d\xff/caf\xe9"), os(b"h\xe9"))
        .unwrap();
    assert_eq!(std::fs::metadata(host(&f, b"h\xe9")).unwrap().nlink(), 2);
    ws.set_attributes(os(b"h\xe9"), Some(0o600), 5_000).unwrap();
    let meta = std::fs::metadata(host(&f, b"d\xff/caf\xe9")).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.mtime()), (0o600, 5));
    assert_eq!(ws.stat(os(b"d\xff/sub\xfe")).unwrap().kind, Kind::Dir);
    ws.rename(os(b"h\xe9"), os(b"h2\xe9"), false).unwrap();
    ws.remove(os(b"h2\xe9"), false).unwrap();
    ws.remove(os(b"d\xff"), true).unwrap();
    assert!(!host(&f, b"d\xff").exists());
    // Two names that differ only in bytes a lossy conversion would merge stay two.
    ws.create_file(os(b"x\xfe"), 0o600).unwrap();
    ws.create_file(os(b"x\xff"), 0o600).unwrap();
    assert!(host(&f, b"x\xfe").exists() && host(&f, b"x\xff").exists());
}

fn a_tree_copy_keeps_names_that_are_not_utf8(r: Resolver) {
    let f = Fixture::new();
    std::fs::create_dir_all(host(&f, b"src/d\xff")).unwrap();
    std::fs::write(host(&f, b"src/d\xff/caf\xe9"), "c").unwrap();
    symlink(os(b"d\xff/caf\xe9"), host(&f, b"src/l\xe9")).unwrap();
    let ws = f.ws(r);
    let source = ws.subroot("src").unwrap();
    let stats = ws.copy_tree_from(&source, "", os(b"dst\xfe")).unwrap();
    assert_eq!((stats.files, stats.dirs, stats.symlinks), (1, 1, 1));
    assert_eq!(
        std::fs::read(host(&f, b"dst\xfe/d\xff/caf\xe9")).unwrap(),
        b"c"
    );
    assert_eq!(
        std::fs::read_link(host(&f, b"dst\xfe/l\xe9"))
            .unwrap()
            .into_os_string(),
        os(b"d\xff/caf\xe9")
    );
    // And a subtree named by its bytes.
    ws.copy_tree_from(&source, os(b"d\xff"), "only").unwrap();
    assert_eq!(
        std::fs::read(f.path("only").join(os(b"caf\xe9"))).unwrap(),
        b"c"
    );
}

/// How an attack must be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Invalid(warren_fs::InvalidPathReason),
    Symlink,
}

/// One hostile path, written with `~` where the byte form has `\xe9` (not UTF-8) and the
/// text form has `e`: both forms are run, and must be refused the same way.
struct Attack {
    what: &'static str,
    setup: fn(&Fixture, Form),
    path: &'static str,
    expect: Expect,
    leaf_is_link: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Text,
    Bytes,
}

fn spell(template: &str, form: Form) -> OsString {
    let long = "~".repeat(256);
    let template = if template == "TOO_LONG" {
        &long
    } else {
        template
    };
    let mut out = Vec::new();
    for byte in template.bytes() {
        match (byte, form) {
            (b'~', Form::Bytes) => out.push(0xe9),
            (b'~', Form::Text) => out.push(b'e'),
            (other, _) => out.push(other),
        }
    }
    OsString::from_vec(out)
}

fn plant_link(f: &Fixture, form: Form, rel: &str, target: impl AsRef<OsStr>) {
    let path = f.root.join(spell(rel, form));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    symlink(target.as_ref(), path).unwrap();
}

fn nothing(_: &Fixture, _: Form) {}

fn corpus() -> Vec<Attack> {
    use warren_fs::InvalidPathReason::*;
    vec![
        Attack {
            what: "dotdot after a name that is not UTF-8",
            setup: nothing,
            path: "d~/../../outside/secret.txt",
            expect: Expect::Invalid(ParentComponent),
            leaf_is_link: false,
        },
        Attack {
            what: "dotdot as the last component after a name that is not UTF-8",
            setup: nothing,
            path: "~/..",
            expect: Expect::Invalid(ParentComponent),
            leaf_is_link: false,
        },
        Attack {
            what: "absolute path with a name that is not UTF-8",
            setup: nothing,
            path: "/etc/pass~d",
            expect: Expect::Invalid(Absolute),
            leaf_is_link: false,
        },
        Attack {
            what: "embedded nul after a name that is not UTF-8",
            setup: nothing,
            path: "a~\0/../outside/secret.txt",
            expect: Expect::Invalid(NulByte),
            leaf_is_link: false,
        },
        Attack {
            what: "a 256-byte component that is not UTF-8",
            setup: nothing,
            path: "TOO_LONG",
            expect: Expect::Invalid(ComponentTooLong),
            leaf_is_link: false,
        },
        Attack {
            what: "first component, not UTF-8, is a symlink to the outside",
            setup: |f, form| plant_link(f, form, "l~nk", &f.outside),
            path: "l~nk/secret.txt",
            expect: Expect::Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "middle component, not UTF-8, is a relative symlink to the outside",
            setup: |f, form| plant_link(f, form, "d~/l~nk", "../../outside"),
            path: "d~/l~nk/secret.txt",
            expect: Expect::Symlink,
            leaf_is_link: false,
        },
        Attack {
            what: "a name that is not UTF-8 is a symlink to the outside secret",
            setup: |f, form| plant_link(f, form, "l~ak", f.outside.join("secret.txt")),
            path: "l~ak",
            expect: Expect::Symlink,
            leaf_is_link: true,
        },
        Attack {
            what: "a name that is not UTF-8 is a symlink to the outside directory",
            setup: |f, form| plant_link(f, form, "d~/o~t", &f.outside),
            path: "d~/o~t",
            expect: Expect::Symlink,
            leaf_is_link: true,
        },
    ]
}

/// The tree operations, aimed at the attack path.
#[derive(Debug, Clone, Copy)]
enum Operation {
    Stat,
    List,
    OpenFile,
    CreateFile,
    CreateSymlink,
    HardlinkFrom,
    HardlinkTo,
    SetAttributes,
    MkdirP,
    Remove,
    Exchange,
    CopyFrom,
    CopyTo,
}

const OPERATIONS: [Operation; 13] = [
    Operation::Stat,
    Operation::List,
    Operation::OpenFile,
    Operation::CreateFile,
    Operation::CreateSymlink,
    Operation::HardlinkFrom,
    Operation::HardlinkTo,
    Operation::SetAttributes,
    Operation::MkdirP,
    Operation::Remove,
    Operation::Exchange,
    Operation::CopyFrom,
    Operation::CopyTo,
];

fn perform(ws: &WorkspaceRoot, op: Operation, path: &OsStr) -> (String, Option<FsError>) {
    fn done<T: std::fmt::Debug>(r: Result<T, FsError>) -> (String, Option<FsError>) {
        (format!("{r:?}"), r.err())
    }
    match op {
        Operation::Stat => done(ws.stat(path)),
        Operation::List => done(ws.list(path, 3, 100)),
        Operation::OpenFile => done(ws.open_file(path).map(|mut file| {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).unwrap();
            String::from_utf8_lossy(&bytes).into_owned()
        })),
        Operation::CreateFile => done(ws.create_file(path, 0o644).map(|mut file| {
            file.write_all(b"PWNED").unwrap();
        })),
        Operation::CreateSymlink => done(ws.create_symlink(path, "x")),
        Operation::HardlinkFrom => done(ws.create_hardlink(path, "stolen")),
        Operation::HardlinkTo => done(ws.create_hardlink("plain.txt", path)),
        Operation::SetAttributes => done(ws.set_attributes(path, Some(0o777), 1_000)),
        Operation::MkdirP => done(ws.mkdir_p(path)),
        Operation::Remove => done(ws.remove(path, true)),
        Operation::Exchange => done(ws.exchange("plain.txt", path)),
        Operation::CopyFrom => done(ws.copy_tree_from(ws, path, "copy")),
        Operation::CopyTo => {
            let source = ws.subroot("src").unwrap();
            done(ws.copy_tree_from(&source, "", path))
        }
    }
}

/// Operations that name the last component without following it meet a leaf link as an
/// entry: they may remove or swap it, or find the name taken, never reach its target.
fn refused_as_expected(attack: &Attack, op: Operation, err: Option<&FsError>) -> bool {
    use Operation::*;
    match (attack.expect, err) {
        (Expect::Invalid(want), Some(FsError::InvalidPath { reason, .. })) => *reason == want,
        (Expect::Symlink, Some(FsError::SymlinkRefused { .. })) => true,
        (Expect::Symlink, Some(FsError::AlreadyExists { .. })) => {
            attack.leaf_is_link && matches!(op, CreateFile | CreateSymlink | HardlinkTo)
        }
        (Expect::Symlink, Some(FsError::NotAFile { .. })) => {
            attack.leaf_is_link && matches!(op, HardlinkFrom)
        }
        (Expect::Symlink, None) => attack.leaf_is_link && matches!(op, Remove | Exchange),
        _ => false,
    }
}

/// The outcome's shape: which error (and refusal rule), or success.
fn outcome(err: Option<&FsError>) -> String {
    match err {
        None => "ok".to_owned(),
        Some(FsError::InvalidPath { reason, .. }) => format!("invalid path: {reason:?}"),
        Some(other) => format!("{:?}", std::mem::discriminant(other)),
    }
}

fn every_attack_spelled_in_bytes_is_refused_as_its_text_twin(r: Resolver) {
    let mut failures = Vec::new();
    for attack in corpus() {
        for op in OPERATIONS {
            let mut outcomes = Vec::new();
            for form in [Form::Text, Form::Bytes] {
                let f = Fixture::new();
                f.file("plain.txt", "plain");
                f.file("src/inner.txt", "inner");
                (attack.setup)(&f, form);
                let path = spell(attack.path, form);
                let before = f.snapshot_outside();
                let ws = f.ws(r);
                let (shown, err) = perform(&ws, op, &path);
                let label = format!("{} / {op:?} / {form:?}", attack.what);
                if shown.contains(SECRET) {
                    failures.push(format!("{label}: returned secret bytes: {shown}"));
                }
                if !refused_as_expected(&attack, op, err.as_ref()) {
                    failures.push(format!(
                        "{label}: expected {:?}, got {shown}",
                        attack.expect
                    ));
                }
                if f.snapshot_outside() != before {
                    failures.push(format!("{label}: something outside the workspace changed"));
                }
                if std::fs::read(f.path("stolen")).is_ok_and(|b| b == SECRET.as_bytes()) {
                    failures.push(format!("{label}: hard-linked the secret"));
                }
                outcomes.push(outcome(err.as_ref()));
            }
            if outcomes[0] != outcomes[1] {
                failures.push(format!(
                    "{} / {op:?}: as text {}, as bytes {}",
                    attack.what, outcomes[0], outcomes[1]
                ));
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

fn a_symlink_target_with_a_nul_is_refused(r: Resolver) {
    let f = Fixture::new();
    let err = f.ws(r).create_symlink("l", os(b"a\0b")).unwrap_err();
    assert!(!f.path("l").exists(), "{err:?}");
}

for_both_resolvers!(
    listed_names_keep_their_exact_bytes_and_show_a_lossy_path,
    the_tree_operations_make_and_read_names_byte_for_byte,
    a_tree_copy_keeps_names_that_are_not_utf8,
    every_attack_spelled_in_bytes_is_refused_as_its_text_twin,
    a_symlink_target_with_a_nul_is_refused,
);
