//! The pod's root init step on real directories. It changes owners, so it runs as root
//! (as the suite does in CI); run elsewhere, these tests fail saying so rather than skip.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::thread::{capabilities, set_capabilities, CapabilitySet, CapabilitySets};
use warren_core::LayoutName;
use warren_kubernetes::manifests::PREPARE_CAPABILITIES;
use warren_kubernetes::prepare::MARKER;
use warren_kubernetes::{prepare, prepare_main, AccountsTask, Error, PrepareConfig, PrepareReport};

use super::support::ars;

/// Owner of everything before the migration: some other uid, as a tree written by an
/// earlier warren or by hand would have.
const LEGACY: u32 = 4242;

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the prepare tests change owners and must run as root (scripts/test does)"
    );
}

/// A USER_DATA claim in a temporary directory: `shared/alice` and `shared/bob`, each with a
/// workspace holding `projects/a/file`, and a directory outside the claim, all owned by
/// [`LEGACY`].
struct Claim {
    _dir: tempfile::TempDir,
    claim: PathBuf,
    outside: PathBuf,
}

impl Claim {
    fn new() -> Self {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let claim = dir.path().join("claim");
        let outside = dir.path().join("outside");
        for uid in ["alice", "bob"] {
            let project = claim.join("shared").join(uid).join("workspace/projects/a");
            fs::create_dir_all(&project).unwrap();
            fs::write(project.join("file"), "data").unwrap();
        }
        fs::create_dir_all(outside.join("dir")).unwrap();
        fs::write(outside.join("secret"), "secret").unwrap();
        chown_tree(dir.path(), LEGACY);
        Self {
            _dir: dir,
            claim,
            outside,
        }
    }

    /// What the prepare container sees: alice's subtree.
    fn root(&self) -> PathBuf {
        self.claim.join("shared/alice")
    }

    fn config(&self, workdir: &str) -> PrepareConfig {
        PrepareConfig::Sandbox {
            root: self.root(),
            workdir: workdir.into(),
            also_require: vec![],
            accounts: None,
        }
    }
}

fn chown_tree(path: &Path, id: u32) {
    std::os::unix::fs::lchown(path, Some(id), Some(id)).unwrap();
    if fs::symlink_metadata(path).unwrap().is_dir() {
        for entry in fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), id);
        }
    }
}

fn owner(path: &Path) -> (u32, u32) {
    let meta = fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.gid())
}

/// Every entry under `path` (itself included) with its owner.
fn owners(path: &Path) -> Vec<(PathBuf, (u32, u32))> {
    let mut out = vec![(path.to_owned(), owner(path))];
    if fs::symlink_metadata(path).unwrap().is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for entry in entries {
            out.extend(owners(&entry));
        }
    }
    out
}

#[test]
fn the_first_run_gives_the_uids_whole_subtree_to_the_sandbox_user() {
    let claim = Claim::new();
    let report = prepare(&claim.config("projects/a")).unwrap();
    assert!(report.migrated);
    assert!(!report.created_workspace, "it was there");
    for (path, owner) in owners(&claim.root()) {
        if path.ends_with(MARKER) {
            assert_eq!(owner, (0, 0), "the marker is root's");
        } else {
            assert_eq!(owner, (1000, 1000), "{path:?}");
        }
    }
    assert!(claim.root().join(MARKER).is_file());
    // shared/ itself and the claim's root are not the uid's to take.
    assert_eq!(owner(&claim.claim.join("shared")), (LEGACY, LEGACY));
}

#[test]
fn the_first_run_takes_world_write_and_set_id_bits_off_the_subtree() {
    let claim = Claim::new();
    let dir = claim.root().join("workspace/projects/a");
    let file = dir.join("file");
    // As a kubelet makes a missing subPath (the volume root's mode) and an older runtime left
    // the rest: world-writable, set-id.
    for (path, mode) in [(&claim.root(), 0o777), (&dir, 0o2777), (&file, 0o6777)] {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }
    let report = prepare(&claim.config("projects/a")).unwrap();
    assert!(report.migrated);
    for (path, mode) in [(&claim.root(), 0o775), (&dir, 0o775), (&file, 0o775)] {
        let meta = fs::symlink_metadata(path).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (1000, 1000, mode),
            "{path:?}"
        );
    }
}

/// The capabilities the sandbox pod's prepare container adds (after dropping ALL), read
/// from the pod warren builds.
fn pod_prepare_capabilities() -> Vec<String> {
    let pod = serde_json::to_value(warren_kubernetes::build(&ars()).unwrap().pod).unwrap();
    let prepare = &pod["spec"]["initContainers"][0];
    assert_eq!(prepare["name"], "prepare");
    let capabilities = &prepare["securityContext"]["capabilities"];
    assert_eq!(capabilities["drop"], serde_json::json!(["ALL"]));
    serde_json::from_value(capabilities["add"].clone()).unwrap()
}

/// Runs `config` as root holding exactly `names` (effective and permitted; nothing
/// inheritable), as a container that drops ALL and adds them does. Capabilities belong to a
/// thread, so the task runs on one of its own and the rest of the suite keeps root's.
fn prepare_with_capabilities(
    config: &PrepareConfig,
    names: &[String],
) -> Result<PrepareReport, Error> {
    let set = names.iter().fold(CapabilitySet::empty(), |set, name| {
        set | CapabilitySet::from_name(name).unwrap_or_else(|| panic!("no capability {name}"))
    });
    let config = config.clone();
    std::thread::spawn(move || {
        set_capabilities(
            None,
            CapabilitySets {
                effective: set,
                permitted: set,
                inheritable: CapabilitySet::empty(),
            },
        )
        .unwrap();
        assert_eq!(capabilities(None).unwrap().effective, set);
        prepare(&config)
    })
    .join()
    .unwrap()
}

/// A subtree no marker covers yet, as an older runtime or a hand left it: a world-writable
/// directory, a setgid directory, a setgid program and a world-writable file, all another
/// uid's. Answers each with the mode the migration must leave.
fn plant_loose_modes(claim: &Claim) -> Vec<(PathBuf, u32)> {
    let a = claim.root().join("workspace/projects/a");
    let entries = [
        (a.join("scratch"), true, 0o777, 0o775),
        (claim.root().join("workspace/team"), true, 0o2775, 0o775),
        (a.join("tool"), false, 0o2755, 0o755),
        (a.join("notes"), false, 0o666, 0o664),
    ];
    entries
        .into_iter()
        .map(|(path, dir, mode, after)| {
            if dir {
                fs::create_dir(&path).unwrap();
            } else {
                fs::write(&path, "#!/bin/sh\n").unwrap();
            }
            std::os::unix::fs::lchown(&path, Some(LEGACY), Some(LEGACY)).unwrap();
            // After the chown, which may clear set-id bits.
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(mode_of(&path), mode, "{path:?}");
            (path, after)
        })
        .collect()
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn with_exactly_the_pods_capabilities_it_strips_loose_modes_from_another_uids_entries() {
    let capabilities = pod_prepare_capabilities();
    assert_eq!(capabilities, ["CHOWN", "DAC_OVERRIDE", "FOWNER"]);
    assert_eq!(capabilities, PREPARE_CAPABILITIES);
    let claim = Claim::new();
    let planted = plant_loose_modes(&claim);
    let report = prepare_with_capabilities(&claim.config("projects/a"), &capabilities).unwrap();
    assert!(report.migrated);
    for (path, mode) in &planted {
        assert_eq!(owner(path), (1000, 1000), "{path:?}");
        assert_eq!(mode_of(path), *mode, "{path:?}");
    }
    assert!(claim.root().join(MARKER).is_file());
    assert!(owners(&claim.root())
        .iter()
        .all(|(path, owner)| path.ends_with(MARKER) || *owner == (1000, 1000)));
}

#[test]
fn without_fowner_as_an_earlier_pod_had_it_fails_and_leaves_the_next_run_to_finish() {
    let claim = Claim::new();
    let planted = plant_loose_modes(&claim);
    // The previous version's prepare container: chown, but no chmod of what is not root's.
    let earlier = ["CHOWN".to_owned(), "DAC_OVERRIDE".to_owned()];
    match prepare_with_capabilities(&claim.config("projects/a"), &earlier) {
        Err(Error::Io {
            op: "chmod",
            path,
            errno: Errno::PERM,
        }) => assert_eq!(path, "workspace/projects/a/notes"),
        other => panic!("{other:?}"),
    }
    assert!(!claim.root().join(MARKER).exists(), "no marker on failure");
    // The pod this version builds finishes the job on the same tree.
    let report =
        prepare_with_capabilities(&claim.config("projects/a"), &pod_prepare_capabilities())
            .unwrap();
    assert!(report.migrated);
    for (path, mode) in &planted {
        assert_eq!(
            (owner(path), mode_of(path)),
            ((1000, 1000), *mode),
            "{path:?}"
        );
    }
    assert!(claim.root().join(MARKER).is_file());
}

#[test]
fn a_second_uids_directory_beside_it_is_untouched() {
    let claim = Claim::new();
    let bob = claim.claim.join("shared/bob");
    let before = owners(&bob);
    prepare(&claim.config("projects/a")).unwrap();
    assert_eq!(owners(&bob), before);
    assert!(owners(&bob)
        .iter()
        .all(|(_, owner)| *owner == (LEGACY, LEGACY)));
}

#[test]
fn a_symlink_planted_at_every_level_is_changed_as_itself_and_its_target_never() {
    let claim = Claim::new();
    let root = claim.root();
    let workspace = root.join("workspace");
    let links = [
        (root.join("link-root"), claim.outside.clone()),
        (
            workspace.join("link-workspace"),
            claim.outside.join("secret"),
        ),
        (
            workspace.join("projects/link-projects"),
            claim.outside.join("dir"),
        ),
        (
            workspace.join("projects/a/link-file"),
            claim.outside.join("secret"),
        ),
        (
            workspace.join("projects/a/link-up"),
            PathBuf::from("../../../../bob"),
        ),
        (
            workspace.join("projects/a/dangling"),
            PathBuf::from("/nonexistent"),
        ),
    ];
    for (link, target) in &links {
        symlink(target, link).unwrap();
        std::os::unix::fs::lchown(link, Some(LEGACY), Some(LEGACY)).unwrap();
    }
    let outside_before = owners(&claim.outside);
    let bob_before = owners(&claim.claim.join("shared/bob"));
    let report = prepare(&claim.config("projects/a")).unwrap();
    assert!(report.migrated);
    for (link, _) in &links {
        assert_eq!(owner(link), (1000, 1000), "the link itself: {link:?}");
    }
    assert_eq!(
        owners(&claim.outside),
        outside_before,
        "no target was changed"
    );
    assert_eq!(owners(&claim.claim.join("shared/bob")), bob_before);
}

#[test]
fn a_workdir_reached_through_a_symlink_is_refused() {
    let claim = Claim::new();
    let workspace = claim.root().join("workspace");
    // `projects2 -> outside` makes `projects2/dir` resolve, and `projects/b` is a link to
    // a directory outside: both would be real directories to anything that follows links.
    symlink(&claim.outside, workspace.join("projects2")).unwrap();
    symlink(claim.outside.join("dir"), workspace.join("projects/b")).unwrap();
    for (workdir, component) in [("projects2/dir", "projects2"), ("projects/b", "projects/b")] {
        match prepare(&claim.config(workdir)) {
            Err(Error::WorkdirMissing {
                workdir: named,
                reason,
            }) => {
                assert_eq!(named, workdir);
                assert_eq!(reason, format!("{component} is a symlink"));
            }
            other => panic!("{workdir}: {other:?}"),
        }
    }
    assert_eq!(owner(&claim.outside.join("dir")), (LEGACY, LEGACY));
}

#[test]
fn a_workspace_that_is_a_symlink_is_refused_before_anything_changes() {
    let claim = Claim::new();
    let root = claim.root();
    fs::remove_dir_all(root.join("workspace")).unwrap();
    symlink(
        claim.claim.join("shared/bob/workspace"),
        root.join("workspace"),
    )
    .unwrap();
    assert_eq!(
        prepare(&claim.config("projects/a")).unwrap_err(),
        Error::NotADirectory("workspace".into())
    );
    assert!(!root.join(MARKER).exists());
    assert_eq!(owner(&root), (LEGACY, LEGACY));
    assert!(owners(&claim.claim.join("shared/bob"))
        .iter()
        .all(|(_, owner)| *owner == (LEGACY, LEGACY)));
}

#[test]
fn a_root_that_is_a_symlink_is_refused() {
    let claim = Claim::new();
    let link = claim.claim.join("shared/link");
    symlink(claim.claim.join("shared/bob"), &link).unwrap();
    let config = PrepareConfig::Sandbox {
        root: link.clone(),
        workdir: "projects/a".into(),
        also_require: vec![],
        accounts: None,
    };
    assert!(matches!(prepare(&config), Err(Error::NotADirectory(_))));
    assert_eq!(owner(&claim.claim.join("shared/bob")), (LEGACY, LEGACY));
}

#[test]
fn a_hard_link_whose_other_name_may_lie_outside_is_left_alone() {
    let claim = Claim::new();
    let inside = claim.root().join("workspace/projects/a/linked");
    fs::hard_link(claim.outside.join("secret"), &inside).unwrap();
    let report = prepare(&claim.config("projects/a")).unwrap();
    assert_eq!(owner(&claim.outside.join("secret")), (LEGACY, LEGACY));
    assert_eq!(owner(&inside), (LEGACY, LEGACY));
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.contains("projects/a/linked")),
        "{report:?}"
    );
}

#[test]
fn the_marker_makes_the_second_run_leave_owners_alone() {
    let claim = Claim::new();
    assert!(prepare(&claim.config("projects/a")).unwrap().migrated);
    // Changed after the migration: not the init step's business any more.
    let file = claim.root().join("workspace/projects/a/file");
    std::os::unix::fs::lchown(&file, Some(LEGACY), Some(LEGACY)).unwrap();
    let second = prepare(&claim.config("projects/a")).unwrap();
    assert!(!second.migrated);
    assert_eq!(second.changed, 0);
    assert_eq!(owner(&file), (LEGACY, LEGACY));
}

#[test]
fn a_missing_workdir_is_refused_by_name_and_never_created() {
    let claim = Claim::new();
    let workspace = claim.root().join("workspace");
    match prepare(&claim.config("projects/missing")) {
        Err(error @ Error::WorkdirMissing { .. }) => {
            let message = error.to_string();
            assert!(message.contains("\"projects/missing\""), "{message}");
            assert!(
                message.contains("projects/missing does not exist"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!workspace.join("projects/missing").exists());
    for made_on_first_use in ["uploads", "outputs"] {
        assert!(!workspace.join(made_on_first_use).exists());
        assert!(!workspace
            .join("projects/missing")
            .join(made_on_first_use)
            .exists());
    }
}

#[test]
fn the_workspace_is_made_for_a_new_uid_but_its_workdir_still_must_exist() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("shared/carol");
    fs::create_dir_all(&root).unwrap();
    let config = PrepareConfig::Sandbox {
        root: root.clone(),
        workdir: "projects/a".into(),
        also_require: vec![],
        accounts: None,
    };
    assert!(matches!(
        prepare(&config),
        Err(Error::WorkdirMissing { .. })
    ));
    assert!(root.join("workspace").is_dir());
    assert_eq!(owner(&root.join("workspace")), (1000, 1000));
    assert!(!root.join("workspace/projects").exists());
    fs::create_dir_all(root.join("workspace/projects/a")).unwrap();
    let report = prepare(&config).unwrap();
    assert!(!report.created_workspace);
}

#[test]
fn other_directories_a_mount_shows_must_exist_too() {
    let claim = Claim::new();
    let config = PrepareConfig::Sandbox {
        root: claim.root(),
        workdir: "projects/a".into(),
        also_require: vec!["agents/skills".into()],
        accounts: None,
    };
    match prepare(&config) {
        Err(Error::WorkdirMissing { workdir, .. }) => assert_eq!(workdir, "agents/skills"),
        other => panic!("{other:?}"),
    }
    assert!(!claim.root().join("workspace/agents").exists());
}

#[test]
fn a_workdir_that_breaks_the_workdir_rules_is_refused_before_anything_changes() {
    let claim = Claim::new();
    for workdir in [
        "../bob/workspace",
        "/etc",
        "agents/skills",
        "projects//a",
        "",
    ] {
        assert!(
            matches!(
                prepare(&claim.config(workdir)),
                Err(Error::PrepareConfig(_))
            ),
            "{workdir:?}"
        );
    }
    assert!(!claim.root().join(MARKER).exists());
    assert_eq!(owner(&claim.root()), (LEGACY, LEGACY));
}

#[test]
fn prepare_main_answers_zero_when_done_and_one_when_refused() {
    let claim = Claim::new();
    let config = serde_json::to_string(&claim.config("projects/a")).unwrap();
    assert_eq!(prepare_main(&config), 0);
    assert_eq!(prepare_main("{\"task\":\"sandbox\"}"), 1);
    assert_eq!(prepare_main("not json"), 1);
    let unknown = config.replace("\"workdir\"", "\"also\":1,\"workdir\"");
    assert_eq!(prepare_main(&unknown), 1, "unknown keys are refused");
    let missing = serde_json::to_string(&claim.config("projects/missing")).unwrap();
    assert_eq!(prepare_main(&missing), 1);
}

#[test]
fn claim_roots_gives_only_the_roots_themselves_to_the_sandbox_user() {
    let claim = Claim::new();
    let roots = vec![claim.claim.clone(), claim.outside.clone()];
    let report = prepare(&PrepareConfig::ClaimRoots {
        roots: roots.clone(),
    })
    .unwrap();
    assert_eq!(report.changed, 2);
    for root in &roots {
        assert_eq!(owner(root), (1000, 1000));
    }
    assert_eq!(owner(&claim.claim.join("shared")), (LEGACY, LEGACY));
    assert_eq!(owner(&claim.outside.join("secret")), (LEGACY, LEGACY));
    let link = claim.outside.join("link");
    symlink(&claim.claim, &link).unwrap();
    assert!(matches!(
        prepare(&PrepareConfig::ClaimRoots { roots: vec![link] }),
        Err(Error::NotADirectory(_))
    ));
}

#[test]
fn an_e2b_pod_gets_warrens_accounts_files_naming_user_at_1000() {
    let claim = Claim::new();
    fs::create_dir_all(claim.root().join("workspace/e2b/s1")).unwrap();
    let accounts = tempfile::tempdir().unwrap();
    // The emptyDir as a kubelet makes it: world-writable.
    fs::set_permissions(accounts.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let config = PrepareConfig::Sandbox {
        root: claim.root(),
        workdir: "e2b/s1".into(),
        also_require: vec![],
        accounts: Some(AccountsTask {
            dir: accounts.path().into(),
            layout: LayoutName::E2b,
        }),
    };
    // Twice: a pod whose sandbox is recreated runs its init containers again.
    for _ in 0..2 {
        let report = prepare(&config).unwrap();
        assert!(report.wrote_accounts, "{report:?}");
        let passwd = fs::read_to_string(accounts.path().join("passwd")).unwrap();
        assert!(
            passwd.ends_with("user:x:1000:1000:user:/home/user:/bin/sh\n"),
            "I11: {passwd}"
        );
        assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
        let group = fs::read_to_string(accounts.path().join("group")).unwrap();
        assert!(group.ends_with("user:x:1000:\n"), "{group}");
        for file in ["passwd", "group"] {
            let meta = fs::metadata(accounts.path().join(file)).unwrap();
            assert_eq!(
                (meta.uid(), meta.mode() & 0o7777),
                (0, 0o644),
                "{file}: root's, readable by the sandbox user"
            );
        }
        let names: Vec<_> = fs::read_dir(accounts.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no staging file is left: {names:?}");
    }
}

#[test]
fn accounts_are_refused_for_a_layout_whose_user_the_image_names_or_through_a_link() {
    let claim = Claim::new();
    let accounts = tempfile::tempdir().unwrap();
    let task = |dir: PathBuf, layout| PrepareConfig::Sandbox {
        root: claim.root(),
        workdir: "projects/a".into(),
        also_require: vec![],
        accounts: Some(AccountsTask { dir, layout }),
    };
    assert!(matches!(
        prepare(&task(accounts.path().into(), LayoutName::Ars)),
        Err(Error::PrepareConfig(_))
    ));
    let link = accounts.path().join("link");
    symlink(&claim.outside, &link).unwrap();
    assert!(matches!(
        prepare(&task(link, LayoutName::E2b)),
        Err(Error::NotADirectory(_))
    ));
    assert!(!claim.outside.join("passwd").exists());
}
