//! The journal that makes an apply all or nothing, its replay, and recovery at start-up.
//!
//! A journal (`<journal_dir>/<id>.json`) names the target (an opaque key the caller maps back
//! to a tree) and the steps in order. Writing it (temporary file, `fsync`, rename, `fsync` of
//! the directory) is the commit point: before it the target is untouched and the staging
//! directory is thrown away; after it the steps are replayed until they have all been done.
//! Every step is idempotent, so a replay after any crash, even in the middle of an earlier
//! replay, ends in the same tree:
//! * a rename moves a staged entry into place only if it is still staged;
//! * a delete removes only what the plan expected there (same type, same content or link
//!   target), so it never removes what a later step put at the same path;
//! * a mkdir is `mkdir -p` then the mode; a chmod sets a mode on what is there.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{fchmod, fstat, fsync, statat, AtFlags, FileType, Mode};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use warren_fs::{rename_between, FsError, Kind as FsKind, WorkspaceRoot};

use crate::apply::{Applied, Phase};
use crate::error::MergeError;
use crate::model::{parent, to_hex, Kind, MODE_BITS};
use crate::plan::STAGING_PREFIX;
use crate::read::{Tree, LIST_LIMIT};

/// The journal's format version.
pub(crate) const FORMAT: u32 = 1;

/// One merge's journal.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Journal {
    pub(crate) format: u32,
    pub(crate) id: String,
    pub(crate) target_key: String,
    pub(crate) steps: Vec<JournalStep>,
}

/// One step as the journal keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum JournalStep {
    /// Moves the staged entry `staged` (a name in the staging directory) to `path`.
    Rename { staged: String, path: String },
    /// Removes `path` if it is what `expect` says.
    Delete { path: String, expect: Expect },
    /// Makes the directory `path` (and any missing parent) with `mode`.
    Mkdir { path: String, mode: u32 },
    /// Sets the mode of the file or directory `path`.
    Chmod { path: String, mode: u32 },
}

/// What a delete expects to remove.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Expect {
    File { hash: String },
    Symlink { target: String },
    Dir,
}

impl From<&Kind> for Expect {
    fn from(kind: &Kind) -> Self {
        match kind {
            Kind::File { hash, .. } => Expect::File { hash: to_hex(hash) },
            Kind::Symlink { target } => Expect::Symlink {
                target: target.clone(),
            },
            Kind::Dir { .. } => Expect::Dir,
        }
    }
}

/// What recovery did for one journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovered {
    /// The merge id.
    pub id: String,
    /// The target's key, as the journal named it.
    pub target_key: String,
    /// How many steps the journal held (each replayed, idempotently).
    pub steps: usize,
    /// What the replay changed (steps done before the crash are not counted again).
    pub applied: Applied,
}

/// Refuses an id that is not 1 to 64 of `A-Z a-z 0-9 _ -` (it names files and directories).
pub(crate) fn check_id(id: &str) -> Result<(), MergeError> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(MergeError::InvalidId {
            id: id.chars().take(80).collect(),
        })
    }
}

/// The staging directory's name at the target's top.
pub(crate) fn staging_name(id: &str) -> String {
    format!("{STAGING_PREFIX}{id}")
}

pub(crate) fn journal_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

fn journal_error<'a>(
    id: &'a str,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> MergeError + 'a {
    move |errno| MergeError::Journal {
        id: id.to_owned(),
        op,
        errno,
    }
}

/// Writes the journal to a temporary file beside its place, synced. Not yet committed.
pub(crate) fn write_temp(dir: &Path, journal: &Journal) -> Result<PathBuf, MergeError> {
    let id = journal.id.as_str();
    let bytes = serde_json::to_vec(journal).map_err(|e| MergeError::JournalCorrupt {
        id: id.to_owned(),
        reason: e.to_string(),
    })?;
    let temp = dir.join(format!("{id}.json.tmp"));
    let mut file = File::create(&temp).map_err(journal_error(id, "create"))?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(journal_error(id, "write"))?;
    Ok(temp)
}

/// Renames the temporary journal into place and syncs its directory: the commit point.
pub(crate) fn publish(dir: &Path, id: &str, temp: &Path) -> Result<(), MergeError> {
    std::fs::rename(temp, journal_path(dir, id)).map_err(journal_error(id, "rename"))?;
    sync_dir(dir, id)
}

fn sync_dir(dir: &Path, id: &str) -> Result<(), MergeError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(journal_error(id, "sync the directory of"))
}

/// Opens the staging directory of merge `id`, if it is there, refusing one that is not the
/// merge's own (another owner, or open to others).
pub(crate) fn open_staging(
    target: &WorkspaceRoot,
    id: &str,
) -> Result<Option<OwnedFd>, MergeError> {
    let fd = match target.open_dir(staging_name(id).as_str()) {
        Ok(fd) => fd,
        Err(FsError::NotFound { .. }) => return Ok(None),
        Err(FsError::SymlinkRefused { .. } | FsError::NotADirectory { .. }) => {
            return Err(MergeError::StagingTampered { id: id.to_owned() })
        }
        Err(e) => return Err(MergeError::write(e)),
    };
    check_staging(&fd, id)?;
    Ok(Some(fd))
}

/// A staging directory is the merge's own: a directory of this process's user, mode 0700.
pub(crate) fn check_staging(fd: &OwnedFd, id: &str) -> Result<(), MergeError> {
    let st = fstat(fd).map_err(|e| MergeError::Staging {
        id: id.to_owned(),
        op: "stat",
        errno: e.into(),
    })?;
    let ours = FileType::from_raw_mode(st.st_mode) == FileType::Directory
        && st.st_uid == rustix::process::geteuid().as_raw()
        && st.st_mode & 0o7777 == 0o700;
    if !ours {
        return Err(MergeError::StagingTampered { id: id.to_owned() });
    }
    Ok(())
}

/// Carries out the journal's steps in order, each idempotent, then syncs every directory
/// it touched. `progress` is told after each step.
pub(crate) fn replay(
    target: &WorkspaceRoot,
    journal: &Journal,
    staging: Option<&OwnedFd>,
    progress: &mut dyn FnMut(Phase, usize),
) -> Result<Applied, MergeError> {
    let tree = Tree::new(target, "target");
    let mut applied = Applied::default();
    let mut touched = std::collections::BTreeSet::new();
    let staging_shown = staging_name(&journal.id);
    for (index, step) in journal.steps.iter().enumerate() {
        match step {
            JournalStep::Rename { staged, path } => {
                // Nothing staged survives without the staging directory: all were renamed.
                let Some(staging) = staging else { continue };
                match statat(staging, staged.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Err(Errno::NOENT) => {}
                    Err(e) => {
                        return Err(MergeError::Staging {
                            id: journal.id.clone(),
                            op: "stat",
                            errno: e.into(),
                        })
                    }
                    Ok(_) => {
                        let (dir, leaf) = split(path);
                        let dir_fd = target.open_dir(dir).map_err(MergeError::write)?;
                        let shown = format!("{staging_shown}/{staged}");
                        rename_between(
                            staging.as_fd(),
                            OsStr::new(staged),
                            dir_fd.as_fd(),
                            OsStr::new(leaf),
                            true,
                            (&shown, path),
                        )
                        .map_err(MergeError::write)?;
                        touched.insert(dir.to_owned());
                        applied.files_written += 1;
                    }
                }
            }
            JournalStep::Delete { path, expect } => {
                if let Some(entry) = tree.describe(path)? {
                    let is_expected = match (expect, entry.kind) {
                        (Expect::Dir, FsKind::Dir) => true,
                        (Expect::Symlink { target }, FsKind::Symlink) => {
                            entry.symlink_target.as_ref() == Some(target)
                        }
                        (Expect::File { hash }, FsKind::File) => {
                            to_hex(&tree.hash_file(path)?.0) == *hash
                        }
                        _ => false,
                    };
                    if is_expected {
                        target.remove(path, false).map_err(MergeError::write)?;
                        touched.insert(parent(path).to_owned());
                        applied.deleted += 1;
                    }
                }
            }
            JournalStep::Mkdir { path, mode } => {
                if target.mkdir_p(path).map_err(MergeError::write)? {
                    applied.dirs_made += 1;
                }
                set_mode(target, path, FsKind::Dir, *mode)?;
                touched.insert(parent(path).to_owned());
            }
            JournalStep::Chmod { path, mode } => {
                if let Some(entry) = tree.describe(path)? {
                    if set_mode(target, path, entry.kind, *mode)? {
                        applied.modes_changed += 1;
                    }
                }
            }
        }
        progress(Phase::Applying, index + 1);
    }
    for dir in touched {
        match target.open_dir(dir.as_str()) {
            Ok(fd) => fsync(&fd).map_err(|e| MergeError::SetMode {
                path: dir.clone(),
                errno: e.into(),
            })?,
            // Removed or replaced by a later step: its parent was synced instead.
            Err(FsError::NotFound { .. } | FsError::NotADirectory { .. }) => {}
            Err(e) => return Err(MergeError::write(e)),
        }
    }
    Ok(applied)
}

/// Sets the mode of the directory or regular file at `path` through a descriptor of it
/// (links have none and are left alone). Returns whether a mode was set.
fn set_mode(
    target: &WorkspaceRoot,
    path: &str,
    kind: FsKind,
    mode: u32,
) -> Result<bool, MergeError> {
    let fd: OwnedFd = match kind {
        FsKind::Dir => target.open_dir(path).map_err(MergeError::write)?,
        FsKind::File => target.open_file(path).map_err(MergeError::write)?.into(),
        FsKind::Symlink | FsKind::Other => return Ok(false),
    };
    fchmod(&fd, Mode::from_raw_mode(mode & MODE_BITS)).map_err(|e| MergeError::SetMode {
        path: path.to_owned(),
        errno: e.into(),
    })?;
    Ok(true)
}

/// The parent directory and last name of a relative path.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// The end of an apply or a recovery: the staging directory goes, then the journal.
pub(crate) fn finish(
    target: &WorkspaceRoot,
    id: &str,
    journal_dir: &Path,
) -> Result<(), MergeError> {
    match target.remove(staging_name(id).as_str(), true) {
        Ok(()) | Err(FsError::NotFound { .. }) => {}
        Err(e) => return Err(MergeError::write(e)),
    }
    let top = target.open_dir("").map_err(MergeError::write)?;
    fsync(&top).map_err(|e| MergeError::Staging {
        id: id.to_owned(),
        op: "sync the target after removing",
        errno: e.into(),
    })?;
    match std::fs::remove_file(journal_path(journal_dir, id)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(journal_error(id, "remove")(e)),
    }
    sync_dir(journal_dir, id)
}

/// At start-up: rolls every committed journal in `journal_dir` forward on the tree
/// `open(target_key)` returns, then removes its staging directory and the journal. A
/// journal that was never committed (a leftover temporary file) is removed: its target was
/// never touched. Staging directories without a journal are not found from here; call
/// [`discard_staging`] on each target that has none.
pub fn recover(
    journal_dir: &Path,
    mut open: impl FnMut(&str) -> Result<WorkspaceRoot, MergeError>,
) -> Result<Vec<Recovered>, MergeError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(journal_dir).map_err(journal_error("*", "list"))? {
        let entry = entry.map_err(journal_error("*", "list"))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    names.sort();
    for name in &names {
        if let Some(id) = name.strip_suffix(".json.tmp") {
            if check_id(id).is_ok() {
                std::fs::remove_file(journal_dir.join(name))
                    .map_err(journal_error(id, "remove"))?;
            }
        }
    }
    let mut recovered = Vec::new();
    for name in &names {
        let Some(id) = name.strip_suffix(".json").filter(|id| check_id(id).is_ok()) else {
            continue;
        };
        let bytes = std::fs::read(journal_dir.join(name)).map_err(journal_error(id, "read"))?;
        let journal: Journal =
            serde_json::from_slice(&bytes).map_err(|e| MergeError::JournalCorrupt {
                id: id.to_owned(),
                reason: e.to_string(),
            })?;
        if journal.id != id || journal.format != FORMAT {
            return Err(MergeError::JournalCorrupt {
                id: id.to_owned(),
                reason: "its id or format does not match".to_owned(),
            });
        }
        let target = open(&journal.target_key)?;
        let staging = open_staging(&target, id)?;
        let applied = replay(&target, &journal, staging.as_ref(), &mut |_, _| {})?;
        drop(staging);
        finish(&target, id, journal_dir)?;
        recovered.push(Recovered {
            id: id.to_owned(),
            target_key: journal.target_key.clone(),
            steps: journal.steps.len(),
            applied,
        });
    }
    sync_dir(journal_dir, "*")?;
    Ok(recovered)
}

/// Removes every staging directory (`.warren-merge-*`) at the top of `target`, for a target
/// that has no journal and no apply running: whatever they hold was never committed.
/// Returns how many it removed.
/// Removal walks by descriptor and follows nothing.
pub fn discard_staging(target: &WorkspaceRoot) -> Result<usize, MergeError> {
    let listing = target
        .list("", 1, LIST_LIMIT)
        .map_err(MergeError::read("target"))?;
    let mut removed = 0;
    for entry in listing.entries {
        if entry.path.starts_with(STAGING_PREFIX) {
            match target.remove(entry.os_path.as_os_str(), true) {
                Ok(()) | Err(FsError::NotFound { .. }) => removed += 1,
                Err(e) => return Err(MergeError::write(e)),
            }
        }
    }
    Ok(removed)
}
