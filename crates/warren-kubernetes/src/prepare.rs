//! What a sandbox pod's root init container runs (`warren __k8s-prepare <json>`), before
//! anything of the sandbox does.
//!
//! It sees one uid's subtree of the USER_DATA claim (`shared/<safe_uid>`, at
//! `/warren/user-data`) and nothing else, and:
//!
//! 1. makes `workspace/` (the UserWorkspace, the sandbox container's subPath root) if it is
//!    missing, owned by the sandbox user;
//! 2. once per uid (a marker file in the subtree, outside `workspace/`, so no sandbox can
//!    forge or remove it), gives every entry of the subtree to 1000:1000 (I11) and takes
//!    world-write and setuid/setgid bits off its directories and regular files: walked by
//!    directory descriptor, each name opened with `O_NOFOLLOW` beneath its parent's
//!    descriptor (I2), a symlink changed as itself (never its target), nothing on another
//!    mount (device and mount id compared with the subtree's) entered or changed, and a
//!    non-directory with other hard links left alone unless already the sandbox user's
//!    (its other names may lie outside the subtree). The walk lives in warren-fs's
//!    `ownership` module ([`warren_fs::migrate_subtree_once`]), which the storage migrator
//!    runs too, so both leave the same tree behind. Changing an entry's mode once it is
//!    the sandbox user's needs `CAP_FOWNER`, which is why the pod's prepare container keeps
//!    `FOWNER` beside `CHOWN` and `DAC_OVERRIDE` ([`crate::manifests::PREPARE_CAPABILITIES`]);
//! 3. checks that the workdir exists (textually by [`Workdir`]'s rules, then opened one
//!    component at a time with `O_NOFOLLOW`), and any other directory of the UserWorkspace
//!    a mount shows. It never creates them, nor `uploads/` or `outputs/`: a workdir that is
//!    missing here was removed behind warren's back, and the pod must not start on an
//!    empty stand-in (the kubelet would make a missing subPath as root);
//! 4. for a layout whose user images do not name (E2B's `user`), writes warren's
//!    `/etc/passwd` and `/etc/group` ([`crate::accounts`]) into the pod's accounts
//!    `emptyDir` ([`AccountsTask`]), owned by root and world-readable, which the sandbox
//!    container mounts read-only by subPath.
//!
//! warren's own pod runs the [`PrepareConfig::ClaimRoots`] task instead: it gives the
//! root directory of each claim (not what is in it) to the user warren runs as, so a
//! freshly provisioned claim owned by root is usable by an unprivileged warren.
//!
//! Residual risk, named plainly: a subPath that lies inside the UserWorkspace (DeerFlow's
//! workdir, `agents/skills`, E2B's workdir at the home) is resolved again by the kubelet when the sandbox container
//! starts; the kubelet refuses links leading out of the *claim*, not out of the uid's
//! tree. Between this check and that start, a process of another running sandbox of the
//! same uid could swap a component for a link into the claim. The ARS layout is not
//! affected: its subPaths' components (`shared/<uid>/workspace`) are not writable by any
//! sandbox.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{
    chownat, fchmod, fchown, fstat, mkdirat, openat, renameat, statat, AtFlags, FileType, Gid,
    Mode, OFlags, Uid, CWD,
};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use warren_core::{LayoutName, Workdir};
use warren_fs::{migrate_subtree_once, MountPlace, SANDBOX_ID};

use crate::names::WORKSPACE_DIR;
use crate::Error;

/// The marker saying the subtree's ownership was migrated (kept in the uid's subtree,
/// beside `workspace/`): warren-fs's [`warren_fs::OWNERSHIP_MARKER`], under the name this
/// module has always given it.
pub use warren_fs::OWNERSHIP_MARKER as MARKER;

/// What the root init step is asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "snake_case", deny_unknown_fields)]
pub enum PrepareConfig {
    /// A sandbox pod's init container.
    Sandbox {
        /// Where the uid's subtree (`shared/<safe_uid>` of USER_DATA) is mounted.
        root: PathBuf,
        /// The authoritative workdir, relative to the UserWorkspace: must exist.
        workdir: String,
        /// Other directories of the UserWorkspace that mounts show (DeerFlow's
        /// `agents/skills`): must exist too.
        #[serde(default)]
        also_require: Vec<String>,
        /// Where to write warren's accounts files, for a layout whose user images do not
        /// name (E2B's); absent for the others, whose pods keep the image's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        accounts: Option<AccountsTask>,
    },
    /// warren's own pod: the claims' root directories become the sandbox user's.
    ClaimRoots {
        /// The claims' mount points.
        roots: Vec<PathBuf>,
    },
}

/// Where and for which layout the accounts files are written ([`crate::accounts`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountsTask {
    /// Where the accounts `emptyDir` is mounted in the prepare container.
    pub dir: PathBuf,
    /// The layout whose sandbox user the files name (at 1000:1000, I11).
    pub layout: LayoutName,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PrepareReport {
    /// The walk ran (no marker was there).
    pub migrated: bool,
    /// Entries whose owner or mode the walk changed (each counted once); for
    /// [`PrepareConfig::ClaimRoots`], roots whose owner changed.
    pub changed: u64,
    /// Entries left alone, relative to the subtree, and why.
    pub skipped: Vec<String>,
    /// `workspace/` was made.
    pub created_workspace: bool,
    /// The accounts files were written.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub wrote_accounts: bool,
}

/// `warren __k8s-prepare <json>`: runs the task, reports on stderr, and answers the exit
/// status (0 done, 1 refused: the message is the container's termination message).
pub fn prepare_main(config: &str) -> i32 {
    let result = serde_json::from_str::<PrepareConfig>(config)
        .map_err(|error| Error::PrepareConfig(error.to_string()))
        .and_then(|config| prepare(&config));
    match result {
        Ok(report) => {
            eprintln!(
                "warren __k8s-prepare: done: {}",
                serde_json::to_string(&report).expect("a report serialises")
            );
            0
        }
        Err(error) => {
            eprintln!("warren __k8s-prepare: {error}");
            1
        }
    }
}

/// Runs one task.
pub fn prepare(config: &PrepareConfig) -> Result<PrepareReport, Error> {
    match config {
        PrepareConfig::Sandbox {
            root,
            workdir,
            also_require,
            accounts,
        } => {
            let mut report = prepare_sandbox(root, workdir, also_require)?;
            if let Some(accounts) = accounts {
                write_accounts(accounts)?;
                report.wrote_accounts = true;
            }
            Ok(report)
        }
        PrepareConfig::ClaimRoots { roots } => claim_roots(roots),
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK
}

fn open_root(path: &std::path::Path) -> Result<OwnedFd, Error> {
    let shown = path.display().to_string();
    openat(CWD, path, dir_flags(), Mode::empty())
        .map_err(|errno| not_a_dir_or(errno, &shown, "open"))
}

fn sandbox_ids() -> (Uid, Gid) {
    (Uid::from_raw(SANDBOX_ID), Gid::from_raw(SANDBOX_ID))
}

fn place(fd: BorrowedFd<'_>, path: &str) -> Result<MountPlace, Error> {
    MountPlace::of(fd).map_err(Error::io("stat", path))
}

fn prepare_sandbox(
    root: &std::path::Path,
    workdir: &str,
    also_require: &[String],
) -> Result<PrepareReport, Error> {
    // Textual rules first: nothing is touched for a workdir warren would never issue.
    let workdir = Workdir::new(workdir).map_err(|error| Error::PrepareConfig(error.to_string()))?;
    for dir in also_require {
        if let Some(reason) = crate::manifests::path_problem(dir) {
            return Err(Error::PrepareConfig(format!(
                "also_require {dir:?}: {reason}"
            )));
        }
    }
    let root_fd = open_root(root)?;
    let home = place(root_fd.as_fd(), ".")?;
    let mut report = PrepareReport::default();

    let workspace = ensure_workspace(root_fd.as_fd(), home, &mut report)?;

    // The one routine the storage migrator runs too (warren-fs's `ownership`): owners to
    // 1000:1000 (I11) and no world-writable or setuid/setgid modes, once per subtree.
    let ownership = migrate_subtree_once(root_fd.as_fd())?;
    report.migrated = ownership.migrated;
    report.changed = ownership.changed;
    report.skipped = ownership.skipped;

    for dir in std::iter::once(workdir.as_str()).chain(also_require.iter().map(String::as_str)) {
        require_dir(workspace.as_fd(), home, dir)?;
    }
    Ok(report)
}

/// Opens `workspace/`, making it (the sandbox user's, 0755) when missing.
fn ensure_workspace(
    root: BorrowedFd<'_>,
    home: MountPlace,
    report: &mut PrepareReport,
) -> Result<OwnedFd, Error> {
    let fd = match openat(root, WORKSPACE_DIR, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            match mkdirat(root, WORKSPACE_DIR, Mode::from_raw_mode(0o755)) {
                Ok(()) => report.created_workspace = true,
                Err(Errno::EXIST) => {} // made meanwhile by a sibling pod of the uid
                Err(errno) => return Err(Error::io("mkdir", WORKSPACE_DIR)(errno)),
            }
            let fd = openat(root, WORKSPACE_DIR, dir_flags(), Mode::empty())
                .map_err(|errno| not_a_dir_or(errno, WORKSPACE_DIR, "open"))?;
            if report.created_workspace {
                let (uid, gid) = sandbox_ids();
                fchown(&fd, Some(uid), Some(gid)).map_err(Error::io("chown", WORKSPACE_DIR))?;
            }
            fd
        }
        Err(errno) => return Err(not_a_dir_or(errno, WORKSPACE_DIR, "open")),
    };
    if place(fd.as_fd(), WORKSPACE_DIR)? != home {
        return Err(Error::NotADirectory(format!(
            "{WORKSPACE_DIR} (a mount point)"
        )));
    }
    Ok(fd)
}

fn not_a_dir_or(errno: Errno, path: &str, op: &'static str) -> Error {
    match errno {
        Errno::LOOP | Errno::NOTDIR => Error::NotADirectory(path.to_owned()),
        errno => Error::Io {
            op,
            path: path.to_owned(),
            errno,
        },
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    }
}

/// Opens `dir` beneath the workspace one component at a time, never following a link nor
/// crossing a mount; refuses (naming it) when it is not there.
fn require_dir(workspace: BorrowedFd<'_>, home: MountPlace, dir: &str) -> Result<(), Error> {
    let missing = |reason: String| Error::WorkdirMissing {
        workdir: dir.to_owned(),
        reason,
    };
    let mut current: Option<OwnedFd> = None;
    let mut walked = String::new();
    for component in dir.split('/') {
        walked = join(&walked, component);
        let parent = current.as_ref().map_or(workspace, |fd| fd.as_fd());
        let next = openat(parent, component, dir_flags(), Mode::empty()).map_err(|errno| {
            match errno {
                Errno::NOENT => missing(format!("{walked} does not exist")),
                // O_NOFOLLOW | O_DIRECTORY answers ENOTDIR (or ELOOP) for a symlink: say
                // which it is, from the entry itself.
                Errno::LOOP | Errno::NOTDIR => {
                    let link = statat(parent, component, AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                    missing(format!(
                        "{walked} is {}",
                        if link { "a symlink" } else { "not a directory" }
                    ))
                }
                errno => Error::Io {
                    op: "open",
                    path: format!("{WORKSPACE_DIR}/{walked}"),
                    errno,
                },
            }
        })?;
        if place(next.as_fd(), &walked)? != home {
            return Err(missing(format!("{walked} is on another mount")));
        }
        current = Some(next);
    }
    Ok(())
}

/// Writes the accounts files of `task.layout` into `task.dir` (the pod's accounts
/// `emptyDir`): each to a staging name opened with `O_NOFOLLOW` beneath the directory's
/// descriptor, made 0644 (the sandbox user reads them; root, running this, owns them), then
/// renamed over the final name, so a container that ran before (the init step runs again
/// when a pod's sandbox is recreated) never sees a half-written file.
fn write_accounts(task: &AccountsTask) -> Result<(), Error> {
    let layout = task.layout.layout();
    if !crate::accounts::needed(layout) {
        return Err(Error::PrepareConfig(format!(
            "the {} layout keeps the image's accounts",
            task.layout
        )));
    }
    let dir = open_root(&task.dir)?;
    for (name, content) in crate::accounts::contents(layout) {
        let staging = format!(".{name}.new");
        let fd = openat(
            &dir,
            staging.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(Error::io("create", &staging))?;
        // Whatever the umask: the sandbox user must read them.
        fchmod(&fd, Mode::from_raw_mode(0o644)).map_err(Error::io("chmod", &staging))?;
        let mut rest = content.as_bytes();
        while !rest.is_empty() {
            let written = rustix::io::write(&fd, rest).map_err(Error::io("write", &staging))?;
            rest = &rest[written..];
        }
        rustix::fs::fsync(&fd).map_err(Error::io("sync", &staging))?;
        renameat(&dir, staging.as_str(), &dir, name).map_err(Error::io("rename", name))?;
    }
    Ok(())
}

/// Gives each claim's root directory itself (nothing in it) to the sandbox user. Opened
/// `O_PATH`, which needs no permission on the directory: the container keeps `CHOWN` only.
fn claim_roots(roots: &[PathBuf]) -> Result<PrepareReport, Error> {
    let mut report = PrepareReport::default();
    for root in roots {
        let shown = root.display().to_string();
        let fd = openat(
            CWD,
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| not_a_dir_or(errno, &shown, "open"))?;
        let st = fstat(&fd).map_err(Error::io("stat", &shown))?;
        if st.st_uid == SANDBOX_ID && st.st_gid == SANDBOX_ID {
            continue;
        }
        let (uid, gid) = sandbox_ids();
        // By descriptor: `fd` is the directory opened without following anything (I2). Its
        // mode is left alone: this container has `CHOWN` and nothing else.
        chownat(&fd, "", Some(uid), Some(gid), AtFlags::EMPTY_PATH)
            .map_err(Error::io("chown", &shown))?;
        report.changed += 1;
    }
    Ok(report)
}
