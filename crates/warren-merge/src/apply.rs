//! Applying a clean [`Plan`] to its target, all or nothing.
//!
//! 1. Stage: a directory `.warren-merge-<id>` at the target's top (same filesystem, so a
//!    rename out of it is atomic), made by this process's user with mode 0700 so the sandbox
//!    user can neither enter it nor change what is in it. Every new file and link is written
//!    there (files streamed from their branch and checked against the plan's hash, handed to
//!    the target's owner, given their mode, synced). Before anything is staged, every
//!    target entry the plan read is read again: one that changed refuses the apply.
//! 2. Commit: the journal is written durably ([`crate::journal`]).
//! 3. Apply: the journal's steps, in order, each idempotent; touched directories are synced.
//! 4. Clean up: the staging directory goes, then the journal.
//!
//! A crash before the commit leaves the target as it was (the staging directory is thrown
//! away by [`crate::discard_staging`]); after it, [`crate::recover`] rolls forward.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{
    chownat, fchmod, fchown, fsync, mkdirat, openat, statat, symlinkat, AtFlags, Gid, Mode, OFlags,
    Uid,
};
use rustix::io::Errno;
use serde::Serialize;
use warren_fs::{FsError, WorkspaceRoot};

use crate::error::MergeError;
use crate::journal::{
    check_id, check_staging, finish, journal_path, publish, replay, staging_name, write_temp,
    Journal, JournalStep, FORMAT,
};
use crate::model::{Kind, MODE_BITS};
use crate::ours::Bytes;
use crate::plan::{Plan, Work};
use crate::read::Tree;

/// Where an apply is, for [`apply_with`]'s progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// A file or link was staged (the count so far); nothing in the target changed yet.
    Staging,
    /// The journal was written: from here on the merge happens, now or at recovery.
    Committed,
    /// A step was applied (the count so far).
    Applying,
}

/// What an apply changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Files and links renamed into place.
    pub files_written: usize,
    /// Files, links and directories removed.
    pub deleted: usize,
    /// Directories made.
    pub dirs_made: usize,
    /// Modes set on existing files and directories.
    pub modes_changed: usize,
}

/// Applies `plan` (which must have no conflicts) to `target`, all or nothing, through the
/// journal `<journal_dir>/<id>.json` naming the target by `target_key`.
///
/// `id` is 1 to 64 of `A-Z a-z 0-9 _ -`. `journal_dir` is a host directory of warren's own.
/// An error after the commit leaves the journal behind: [`crate::recover`] finishes it.
///
/// The branches' trees are read only while staging, before the commit: from the commit on,
/// the merge needs nothing but the target, the staging directory and the journal (so a
/// branch's overlay may be unmounted once `apply` returns, or after a crash).
/// The caller keeps other writers out of the target meanwhile; what the plan read is
/// checked again all the same, and a difference refuses the apply before anything changes.
pub fn apply(
    target: &WorkspaceRoot,
    plan: &Plan,
    journal_dir: &Path,
    id: &str,
    target_key: &str,
) -> Result<Applied, MergeError> {
    apply_with(target, plan, journal_dir, id, target_key, &mut |_, _| {})
}

/// [`apply`], telling `progress` after each staged file or link, at the commit, and after
/// each applied step: how tests stop an apply anywhere.
pub fn apply_with(
    target: &WorkspaceRoot,
    plan: &Plan,
    journal_dir: &Path,
    id: &str,
    target_key: &str,
    progress: &mut dyn FnMut(Phase, usize),
) -> Result<Applied, MergeError> {
    if !plan.conflicts.is_empty() {
        return Err(MergeError::Conflicts {
            count: plan.conflicts.len(),
        });
    }
    check_id(id)?;
    if target.is_read_only() {
        return Err(MergeError::write(FsError::ReadOnly {
            path: String::new(),
        }));
    }
    if journal_path(journal_dir, id).symlink_metadata().is_ok() {
        return Err(MergeError::JournalExists { id: id.to_owned() });
    }
    let mut staging = Staging::create(target, id)?;
    check_target(target, plan)?;

    let mut steps = Vec::with_capacity(plan.steps.len());
    let mut staged = 0;
    for (index, (step, work)) in plan.steps.iter().zip(&plan.work).enumerate() {
        let path = step.path.clone();
        let name = format!("s{index}");
        steps.push(match work {
            Work::Write {
                mode,
                size,
                hash,
                bytes,
            } => {
                let want = Want {
                    path: &path,
                    mode: *mode,
                    size: *size,
                    hash,
                };
                staging.file(plan, &name, &want, bytes)?;
                staged += 1;
                progress(Phase::Staging, staged);
                JournalStep::Rename { staged: name, path }
            }
            Work::Symlink { target: link } => {
                staging.link(&name, link)?;
                staged += 1;
                progress(Phase::Staging, staged);
                JournalStep::Rename { staged: name, path }
            }
            Work::Delete { expect } => JournalStep::Delete {
                path,
                expect: expect.into(),
            },
            Work::Mkdir { mode } => JournalStep::Mkdir { path, mode: *mode },
            Work::Chmod { mode } => JournalStep::Chmod { path, mode: *mode },
        });
    }
    fsync(&staging.fd).map_err(|e| staging.error("sync", e))?;

    let journal = Journal {
        format: FORMAT,
        id: id.to_owned(),
        target_key: target_key.to_owned(),
        steps,
    };
    let temp = write_temp(journal_dir, &journal)?;
    // From the rename on, the journal may exist: the staging directory is recovery's.
    staging.armed = false;
    publish(journal_dir, id, &temp)?;
    progress(Phase::Committed, 0);

    let applied = replay(target, &journal, Some(&staging.fd), progress)?;
    drop(staging);
    finish(target, id, journal_dir)?;
    Ok(applied)
}

/// Refuses the apply when the target is no longer what the plan read, or when a directory
/// the plan removes holds something the plan does not remove first.
fn check_target(target: &WorkspaceRoot, plan: &Plan) -> Result<(), MergeError> {
    let tree = Tree::new(target, "target");
    for (path, seen) in &plan.seen {
        if tree.kind_at(path)? != *seen {
            return Err(MergeError::TargetChanged { path: path.clone() });
        }
    }
    let mut removed = std::collections::HashSet::new();
    for (step, work) in plan.steps.iter().zip(&plan.work) {
        if let Work::Delete { expect } = work {
            if matches!(expect, Kind::Dir { .. }) {
                if let Some(left) = tree
                    .children(&step.path)?
                    .into_iter()
                    .find(|child| !removed.contains(child.path.as_str()))
                {
                    return Err(MergeError::TargetChanged { path: left.path });
                }
            }
            removed.insert(step.path.as_str());
        }
    }
    Ok(())
}

/// A file the plan wants staged.
struct Want<'a> {
    path: &'a str,
    mode: u32,
    size: u64,
    hash: &'a [u8; 32],
}

/// The staging directory of one apply; removed on drop until the journal takes it over.
struct Staging<'t> {
    target: &'t WorkspaceRoot,
    id: &'t str,
    fd: OwnedFd,
    armed: bool,
}

impl<'t> Staging<'t> {
    /// Makes `.warren-merge-<id>` at the target's top, mode 0700, replacing a leftover of an
    /// apply that never committed (there is no journal for this id).
    fn create(target: &'t WorkspaceRoot, id: &'t str) -> Result<Self, MergeError> {
        let name = staging_name(id);
        let fail = |op, e: Errno| MergeError::Staging {
            id: id.to_owned(),
            op,
            errno: e.into(),
        };
        let top = target.open_dir("").map_err(MergeError::write)?;
        match statat(&top, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => target
                .remove(name.as_str(), true)
                .map_err(MergeError::write)?,
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fail("stat", e)),
        }
        mkdirat(&top, name.as_str(), Mode::from_raw_mode(0o700)).map_err(|e| fail("create", e))?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = openat(&top, name.as_str(), flags, Mode::empty()).map_err(|e| fail("open", e))?;
        let staging = Self {
            target,
            id,
            fd,
            armed: true,
        };
        fchmod(&staging.fd, Mode::from_raw_mode(0o700)).map_err(|e| fail("chmod", e))?;
        check_staging(&staging.fd, id)?;
        Ok(staging)
    }

    fn error(&self, op: &'static str, errno: Errno) -> MergeError {
        MergeError::Staging {
            id: self.id.to_owned(),
            op,
            errno: errno.into(),
        }
    }

    /// Stages a file: content streamed and checked against the plan's hash, then owner,
    /// mode (after the owner: a chown clears set-id bits) and `fsync`.
    fn file(
        &self,
        plan: &Plan,
        name: &str,
        want: &Want<'_>,
        bytes: &Bytes,
    ) -> Result<(), MergeError> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = openat(&self.fd, name, flags, Mode::from_raw_mode(0o600))
            .map_err(|e| self.error("create a file in", e))?;
        let mut out = File::from(fd);
        let mut hasher = blake3::Hasher::new();
        let (written, changed) = match bytes {
            Bytes::Memory(content) => {
                hasher.update(content);
                out.write_all(content)
                    .map_err(|e| self.io_error("write", &e))?;
                let changed = MergeError::TargetChanged {
                    path: want.path.to_owned(),
                };
                (content.len() as u64, changed)
            }
            Bytes::Branch(branch, path) => {
                let (branch, tree) = &plan.sources[*branch];
                let input = tree
                    .open_file(path.as_str())
                    .map_err(MergeError::read("branch"))?;
                let written = self.copy(input, &mut out, &mut hasher, "branch", path)?;
                let changed = MergeError::BranchChanged {
                    branch: branch.clone(),
                    path: path.clone(),
                };
                (written, changed)
            }
            Bytes::Target(path) => {
                let input = self
                    .target
                    .open_file(path.as_str())
                    .map_err(MergeError::read("target"))?;
                let written = self.copy(input, &mut out, &mut hasher, "target", path)?;
                (written, MergeError::TargetChanged { path: path.clone() })
            }
        };
        if written != want.size || hasher.finalize().as_bytes() != want.hash {
            return Err(changed);
        }
        if let Some(owner) = self.target.owner() {
            fchown(
                &out,
                Some(Uid::from_raw(owner.uid)),
                Some(Gid::from_raw(owner.gid)),
            )
            .map_err(|e| self.error("chown a file in", e))?;
        }
        fchmod(&out, Mode::from_raw_mode(want.mode & MODE_BITS))
            .map_err(|e| self.error("chmod a file in", e))?;
        out.sync_all().map_err(|e| self.io_error("sync", &e))
    }

    /// Stages a link with `target` stored as is (never resolved), owned like the target.
    fn link(&self, name: &str, target: &str) -> Result<(), MergeError> {
        symlinkat(target, &self.fd, name).map_err(|e| self.error("create a link in", e))?;
        if let Some(owner) = self.target.owner() {
            chownat(
                &self.fd,
                name,
                Some(Uid::from_raw(owner.uid)),
                Some(Gid::from_raw(owner.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| self.error("chown a link in", e))?;
        }
        Ok(())
    }

    /// Streams `input` into `out`, hashing it; returns how many bytes it copied.
    fn copy(
        &self,
        mut input: File,
        out: &mut File,
        hasher: &mut blake3::Hasher,
        tree: &'static str,
        path: &str,
    ) -> Result<u64, MergeError> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        loop {
            let n = input.read(&mut buf).map_err(|e| MergeError::Read {
                tree,
                source: FsError::Read {
                    path: path.to_owned(),
                    errno: std::io::Error::new(e.kind(), e.to_string()),
                },
            })?;
            if n == 0 {
                return Ok(total);
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| self.io_error("write", &e))?;
            total += n as u64;
        }
    }

    fn io_error(&self, op: &'static str, error: &std::io::Error) -> MergeError {
        MergeError::Staging {
            id: self.id.to_owned(),
            op,
            errno: std::io::Error::new(error.kind(), error.to_string()),
        }
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the apply is failing with its own error; a leftover is removed by
            // the next apply with this id or by `discard_staging`.
            let _ = self.target.remove(staging_name(self.id).as_str(), true);
        }
    }
}
