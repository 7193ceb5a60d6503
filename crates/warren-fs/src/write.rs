//! The mutating side of the API: atomic writes, appends, edits and `mkdir -p`.
//!
//! Every mutation resolves the *parent* directory to a descriptor (I2) and names the last
//! component only through `*at` calls with `O_NOFOLLOW` relative to it, so a symlink planted
//! at the leaf is refused, never followed.
//!
//! Conditional writes hold `flock(LOCK_EX)` on the parent directory from the precondition check
//! to the final rename (I27). `flock` locks belong to an open file description and every
//! operation opens its own, so the lock serialises threads of this process as well as other
//! processes using this crate; no two read-compare-write cycles interleave and no update is
//! lost. Writers that bypass the crate (the agent inside its sandbox) are not serialised, but
//! they still only ever see a whole old or whole new file, because content is replaced by
//! `renameat` of a fully written and synced temporary file.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{
    fchmod, fsync, mkdirat, renameat_with, unlinkat, AtFlags, Mode, OFlags, RenameFlags,
};
use rustix::io::Errno;

use crate::error::{FsError, Op};
use crate::etag::Etag;
use crate::path::{join, RelPath};
use crate::resolve::Meta;
use crate::root::{
    check_regular, hash_file, lock_exclusive, read_all_capped, read_flags, WorkspaceRoot,
};
use crate::types::{EditResult, WriteOptions, WriteResult, EDIT_MAX_SIZE};

/// Mode of a new file when the caller gives none.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of a created directory.
const DIR_MODE: u32 = 0o755;

/// A parent directory opened and locked for a conditional mutation of one of its entries.
/// The lock is released when `dir` is closed, i.e. when this value is dropped.
struct LockedParent<'a> {
    dir: OwnedFd,
    leaf: &'a OsStr,
}

impl WorkspaceRoot {
    /// Replaces the content of the file at `rel` atomically (temporary file, fsync, rename),
    /// creating it if missing, subject to the preconditions in `opts` (I27).
    pub fn write(
        &self,
        rel: &str,
        bytes: &[u8],
        opts: WriteOptions,
    ) -> Result<WriteResult, FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        check_mode(opts.mode, path.as_str())?;
        let parent = self.lock_parent(&path, opts.create_parents)?;
        let existing = self.open_existing(&parent, path.as_str())?;
        let current = match &existing {
            Some((file, _)) if opts.if_match.is_some() || opts.if_none_match_any => {
                Some(hash_file(file, path.as_str())?.0)
            }
            _ => None,
        };
        check_preconditions(&opts, existing.is_some(), current, path.as_str())?;
        // Replacing keeps the permission bits but never set-id or sticky bits: content the
        // agent wrote must not gain privileges it did not have.
        let mode = opts
            .mode
            .or(existing.as_ref().map(|(_, meta)| meta.mode & 0o777))
            .unwrap_or(DEFAULT_FILE_MODE);
        // Without a precondition a plain replace is right; with `if_none_match_any` the
        // rename itself also refuses to replace, in case a writer outside the lock raced us.
        self.replace_locked(&parent, path.as_str(), bytes, mode, opts.if_none_match_any)?;
        Ok(WriteResult {
            etag: Etag::of(bytes),
            created: existing.is_none(),
            size: bytes.len() as u64,
        })
    }

    /// Appends `bytes` to the file at `rel` (created, owned by the workspace owner, if
    /// missing), under the same lock and preconditions as [`WorkspaceRoot::write`], and
    /// returns the ETag of the whole new content.
    pub fn append(
        &self,
        rel: &str,
        bytes: &[u8],
        opts: WriteOptions,
    ) -> Result<WriteResult, FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        check_mode(opts.mode, path.as_str())?;
        let parent = self.lock_parent(&path, opts.create_parents)?;
        let p = path.as_str();
        let leaf = [parent.leaf];
        let append_flags = OFlags::RDWR | OFlags::APPEND | OFlags::NONBLOCK | OFlags::NOCTTY;
        let (file, created) =
            match self
                .anchor
                .open_beneath(parent.dir.as_fd(), &leaf, append_flags, Mode::empty())
            {
                Ok(fd) => {
                    let meta =
                        Meta::of(fd.as_fd()).map_err(|e| FsError::from_errno(e, p, Op::Stat))?;
                    check_regular(&meta, p)?;
                    (File::from(fd), false)
                }
                Err(Errno::NOENT) => {
                    check_preconditions(&opts, false, None, p)?;
                    let fd = self
                        .anchor
                        .open_beneath(
                            parent.dir.as_fd(),
                            &leaf,
                            append_flags | OFlags::CREATE | OFlags::EXCL,
                            Mode::from_raw_mode(0o600),
                        )
                        .map_err(|e| FsError::from_errno(e, p, Op::Create))?;
                    self.chown_new(fd.as_fd(), p)?;
                    let mode = opts.mode.unwrap_or(DEFAULT_FILE_MODE);
                    fchmod(fd.as_fd(), Mode::from_raw_mode(mode))
                        .map_err(|e| FsError::from_errno(e, p, Op::SetAttributes))?;
                    (File::from(fd), true)
                }
                // O_RDWR on a directory fails with EISDIR, mapped like everything else.
                Err(e) => return Err(FsError::from_errno(e, p, Op::Open)),
            };
        if !created && (opts.if_match.is_some() || opts.if_none_match_any) {
            let current = hash_file(&file, p)?.0;
            check_preconditions(&opts, true, Some(current), p)?;
        }
        (&file)
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| FsError::from_io(&e, p, Op::Write))?;
        if created {
            sync_dir(parent.dir.as_fd(), p)?;
        }
        let (etag, size) = hash_file(&file, p)?;
        Ok(WriteResult {
            etag,
            created,
            size,
        })
    }

    /// Replaces `old` by `new` in the UTF-8 text file at `rel`: exactly one occurrence, or
    /// every occurrence with `replace_all`. Read, compare and write happen under one lock, so
    /// two concurrent edits never lose one (I27).
    pub fn edit(
        &self,
        rel: &str,
        old: &str,
        new: &str,
        replace_all: bool,
        if_match: Option<&Etag>,
    ) -> Result<EditResult, FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        let p = path.as_str();
        let parent = self.lock_parent(&path, false)?;
        let Some((file, meta)) = self.open_existing(&parent, p)? else {
            return Err(FsError::NotFound { path: p.to_owned() });
        };
        if meta.size > EDIT_MAX_SIZE {
            return Err(FsError::TooLarge {
                path: p.to_owned(),
                size: meta.size,
                cap: EDIT_MAX_SIZE,
            });
        }
        let content = read_all_capped(&file, EDIT_MAX_SIZE, p)?;
        if let Some(want) = if_match {
            let current = Etag::of(&content);
            if &current != want {
                return Err(FsError::PreconditionFailed {
                    path: p.to_owned(),
                    current: Some(current),
                });
            }
        }
        let text =
            std::str::from_utf8(&content).map_err(|_| FsError::NotUtf8 { path: p.to_owned() })?;
        if old.is_empty() {
            return Err(FsError::EditEmptyOld { path: p.to_owned() });
        }
        let count = text.matches(old).count();
        let (updated, replacements) = match count {
            0 => return Err(FsError::EditNoMatch { path: p.to_owned() }),
            1 => (text.replacen(old, new, 1), 1),
            _ if replace_all => (text.replace(old, new), count),
            _ => {
                return Err(FsError::EditAmbiguous {
                    path: p.to_owned(),
                    count,
                })
            }
        };
        self.replace_locked(&parent, p, updated.as_bytes(), meta.mode & 0o777, false)?;
        Ok(EditResult {
            etag: Etag::of(updated.as_bytes()),
            replacements,
        })
    }

    /// Creates the directory `rel` and any missing parents (mode `0o755`, owned by the
    /// workspace owner, I11). Returns whether anything was created. An existing component
    /// that is a symlink is refused, one that is a file gives [`FsError::NotADirectory`].
    pub fn mkdir_p(&self, rel: &(impl AsRef<OsStr> + ?Sized)) -> Result<bool, FsError> {
        self.ensure_writable(rel)?;
        let path = RelPath::parse(rel)?;
        let (_, created) = self.mkdir_all(path.comps(), path.as_str())?;
        Ok(created)
    }

    // ----- helpers -----

    /// Creates (if needed) and opens each of `comps` in turn, one component at a time relative
    /// to the previous one, so a link planted anywhere is refused by the resolver (I2).
    pub(crate) fn mkdir_all(
        &self,
        comps: &[&OsStr],
        path: &str,
    ) -> Result<(OwnedFd, bool), FsError> {
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let mut current = self
            .anchor
            .open_beneath(self.root_fd(), &[], dir_flags, Mode::empty())
            .map_err(|e| FsError::from_errno(e, "", Op::Open))?;
        let mut created_any = false;
        let mut done = String::new();
        for comp in comps {
            done = join(&done, &comp.to_string_lossy());
            let name = [*comp];
            let open = |dir: BorrowedFd<'_>| {
                self.anchor
                    .open_beneath(dir, &name, dir_flags, Mode::empty())
            };
            let next = match open(current.as_fd()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    let created =
                        match mkdirat(current.as_fd(), *comp, Mode::from_raw_mode(DIR_MODE)) {
                            Ok(()) => true,
                            // Someone else created it meanwhile: fine, it is checked on open.
                            Err(Errno::EXIST) => false,
                            Err(e) => return Err(FsError::from_errno(e, &done, Op::Create)),
                        };
                    let fd = open(current.as_fd())
                        .map_err(|e| FsError::from_errno(e, &done, Op::Open))?;
                    if created {
                        // Owner and mode are set through the descriptor of the directory just
                        // opened safely, never by name (I11); fchmod undoes the umask.
                        self.chown_new(fd.as_fd(), &done)?;
                        fchmod(fd.as_fd(), Mode::from_raw_mode(DIR_MODE))
                            .map_err(|e| FsError::from_errno(e, &done, Op::SetAttributes))?;
                        created_any = true;
                    }
                    fd
                }
                Err(e) => return Err(FsError::from_errno(e, path, Op::Open)),
            };
            current = next;
        }
        Ok((current, created_any))
    }

    /// Resolves (or creates) the parent of `path` and takes its exclusive write lock (I27).
    fn lock_parent<'p>(
        &self,
        path: &RelPath<'p>,
        create_parents: bool,
    ) -> Result<LockedParent<'p>, FsError> {
        let Some((parents, leaf)) = path.split_leaf() else {
            return Err(FsError::IsADirectory {
                path: String::new(),
            });
        };
        let dir = if create_parents {
            self.mkdir_all(parents, path.as_str())?.0
        } else {
            self.resolve_dir(parents, path.as_str())?
        };
        lock_exclusive(dir.as_fd(), path.as_str())?;
        Ok(LockedParent { dir, leaf })
    }

    /// Opens the current file at the locked leaf for reading, `None` if there is none. A
    /// symlink there is refused (`O_NOFOLLOW`), a directory or special file too.
    fn open_existing(
        &self,
        parent: &LockedParent<'_>,
        path: &str,
    ) -> Result<Option<(File, Meta)>, FsError> {
        let leaf = [parent.leaf];
        match self
            .anchor
            .open_beneath(parent.dir.as_fd(), &leaf, read_flags(), Mode::empty())
        {
            Ok(fd) => {
                let meta =
                    Meta::of(fd.as_fd()).map_err(|e| FsError::from_errno(e, path, Op::Stat))?;
                check_regular(&meta, path)?;
                Ok(Some((File::from(fd), meta)))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(FsError::from_errno(e, path, Op::Open)),
        }
    }

    /// Writes `bytes` to a new temporary file next to the leaf and renames it over the leaf.
    /// The caller holds the parent's lock.
    fn replace_locked(
        &self,
        parent: &LockedParent<'_>,
        path: &str,
        bytes: &[u8],
        mode: u32,
        no_replace: bool,
    ) -> Result<(), FsError> {
        let dir = parent.dir.as_fd();
        let temp = TempFile::create(dir, path)?;
        // chown first: changing the owner clears set-id bits, so the mode is set after it.
        self.chown_new(temp.fd.as_fd(), path)?;
        fchmod(temp.fd.as_fd(), Mode::from_raw_mode(mode))
            .map_err(|e| FsError::from_errno(e, path, Op::SetAttributes))?;
        let mut file = File::from(
            temp.fd
                .try_clone()
                .map_err(|e| FsError::from_io(&e, path, Op::Write))?,
        );
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| FsError::from_io(&e, path, Op::Write))?;
        let flags = if no_replace {
            RenameFlags::NOREPLACE
        } else {
            RenameFlags::empty()
        };
        renameat_with(dir, temp.name.as_str(), dir, parent.leaf, flags).map_err(|e| match e {
            Errno::EXIST => FsError::PreconditionFailed {
                path: path.to_owned(),
                current: None,
            },
            e => FsError::from_errno(e, path, Op::Write),
        })?;
        temp.disarm();
        sync_dir(dir, path)
    }
}

/// How the name of every temporary file an atomic write makes begins: it lives for the
/// write's duration next to its target, and watchers hide it (what a client wrote is the
/// target, not the temporary name).
pub const TEMP_PREFIX: &str = ".warren-tmp-";

/// A temporary file in the target's directory, unlinked on drop unless renamed into place.
struct TempFile<'d> {
    dir: BorrowedFd<'d>,
    name: String,
    fd: OwnedFd,
    armed: bool,
}

impl<'d> TempFile<'d> {
    fn create(dir: BorrowedFd<'d>, path: &str) -> Result<Self, FsError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let name = format!(
                "{TEMP_PREFIX}{}-{}-{nanos}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            // O_EXCL|O_NOFOLLOW: never reuse or follow anything that already has this name.
            match rustix::fs::openat(
                dir,
                name.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => {
                    return Ok(Self {
                        dir,
                        name,
                        fd,
                        armed: true,
                    })
                }
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(FsError::from_errno(e, path, Op::Create)),
            }
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the error path already reports the original failure.
            let _ = unlinkat(self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

/// Makes a directory entry change durable.
fn sync_dir(dir: BorrowedFd<'_>, path: &str) -> Result<(), FsError> {
    fsync(dir).map_err(|e| FsError::from_errno(e, path, Op::Write))
}

fn check_mode(mode: Option<u32>, path: &str) -> Result<(), FsError> {
    match mode {
        Some(mode) if mode & !0o777 != 0 => Err(FsError::InvalidMode {
            path: path.to_owned(),
            mode,
        }),
        _ => Ok(()),
    }
}

/// Evaluates `If-Match` / `If-None-Match: *` against the current state (I27).
fn check_preconditions(
    opts: &WriteOptions,
    exists: bool,
    current: Option<Etag>,
    path: &str,
) -> Result<(), FsError> {
    let failed = (opts.if_none_match_any && exists)
        || opts
            .if_match
            .as_ref()
            .is_some_and(|want| current.as_ref() != Some(want) || !exists);
    if failed {
        return Err(FsError::PreconditionFailed {
            path: path.to_owned(),
            current,
        });
    }
    Ok(())
}
