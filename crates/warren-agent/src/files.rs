//! File operations inside the runtime, run by its agent as the sandbox user (issue 42).
//!
//! The caller has already become uid 1000 with no capability, in the runtime's mount
//! namespace with its root as `/`: a forked child of the server, or the TCP gateway of a
//! pod. Every path is walked from `/` with [`warren_fs::walk_in_root`] (links followed, never
//! out of the root, magic links read as text), and the operation itself is `warren-fs`'s,
//! on a root opened at the directory the walk reached: the same atomic write, ETag,
//! listing, search and no-follow removal as a host path gets. Permissions are the kernel's
//! for uid 1000, exactly as for a command: `/etc/passwd` is not writable here either.
//! Nothing on procfs is served (see [`walk`]).

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use warren_backend::{FileAnswer, FileEntry, FileFailure, FileOp};
use warren_fs::{FsError, GrepOptions, InRoot, WorkspaceRoot, WriteOptions};

/// The most an answer may take as JSON: it travels as one frame, at most
/// [`crate::protocol::MAX_FRAME`]; a listing or a search beyond it is cut and says so.
const ANSWER_BUDGET: usize = crate::protocol::MAX_FRAME - 64 * 1024;

/// Runs `op`; a write's bytes are read from `input` (at most its cap). Returns the answer
/// and a read's bytes.
pub fn serve(op: &FileOp, input: impl Read) -> (Result<FileAnswer, FileFailure>, Vec<u8>) {
    let shown = op.path();
    let to = match op {
        FileOp::Rename { to, .. } => Some(to.as_str()),
        _ => None,
    };
    match run(op, input) {
        Ok((answer, data)) => (Ok(within_budget(answer)), data),
        Err(Failed::Fs(error)) => (Err(FileFailure::from_fs(&error, shown, to)), Vec::new()),
        Err(Failed::Errno(errno)) => (Err(errno_failure(errno, shown)), Vec::new()),
    }
}

/// `answer`, its listing or matches cut (and marked truncated) until it fits one frame.
fn within_budget(mut answer: FileAnswer) -> FileAnswer {
    let size = |answer: &FileAnswer| serde_json::to_vec(answer).map_or(usize::MAX, |v| v.len());
    loop {
        let over = size(&answer);
        if over <= ANSWER_BUDGET {
            return answer;
        }
        match &mut answer {
            FileAnswer::Listing { entries, truncated } if !entries.is_empty() => {
                // Entries are about the same size: keep the share that fits, less a margin.
                let keep = entries.len() * ANSWER_BUDGET / over * 9 / 10;
                entries.truncate(keep.min(entries.len() - 1));
                *truncated = true;
            }
            FileAnswer::Grep {
                matches, truncated, ..
            } if !matches.is_empty() => {
                let keep = matches.len() * ANSWER_BUDGET / over * 9 / 10;
                matches.truncate(keep.min(matches.len() - 1));
                *truncated = true;
            }
            _ => return answer,
        }
    }
}

enum Failed {
    Fs(FsError),
    Errno(Errno),
}

impl From<FsError> for Failed {
    fn from(error: FsError) -> Self {
        Self::Fs(error)
    }
}

impl From<Errno> for Failed {
    fn from(errno: Errno) -> Self {
        Self::Errno(errno)
    }
}

/// A walk's or an open's refusal, for the path asked about: warren-fs's one reading of an
/// errno, but for `ELOOP`, which here means more links than a resolution follows (or a
/// link swapped in under a read), not a link refused.
fn errno_failure(errno: Errno, shown: &str) -> FileFailure {
    let error = match errno {
        Errno::LOOP => FsError::LinkLoop {
            path: shown.to_owned(),
        },
        other => FsError::on_open(other, shown),
    };
    FileFailure::from_fs(&error, shown, None)
}

fn not_found() -> Failed {
    Failed::Errno(Errno::NOENT)
}

fn root() -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        rustix::fs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Walks `path` from the runtime's root. A directory reached on procfs is refused: the
/// file API serves files, not processes, and the process serving it is a fork of the
/// runtime's own machinery (its memory, environment and descriptors are under
/// `/proc/self`, which a process may always read of itself). A command that wants
/// `/proc/cpuinfo` runs `cat`.
fn walk(path: &str, follow_last: bool) -> Result<InRoot, Errno> {
    let found = warren_fs::walk_in_root(root()?.as_fd(), OsStr::new(path), follow_last)?;
    let on = rustix::fs::fstatfs(found.dir.as_fd())?;
    if on.f_type as u64 == rustix::fs::PROC_SUPER_MAGIC as u64 {
        return Err(Errno::ACCESS);
    }
    Ok(found)
}

/// A writable `warren-fs` root at the directory a walk reached.
fn root_at(found: &InRoot) -> Result<WorkspaceRoot, Failed> {
    Ok(WorkspaceRoot::at_dir(found.open_dir()?)?)
}

/// The names a walk left, as one relative path (they came from the request's text or a
/// link's, and are written as given: one that is not UTF-8 is refused, not mangled).
fn rest(found: &InRoot) -> Result<String, Failed> {
    let mut joined = String::new();
    for (i, name) in found.rest.iter().enumerate() {
        if i > 0 {
            joined.push('/');
        }
        joined.push_str(name.to_str().ok_or(Failed::Errno(Errno::INVAL))?);
    }
    Ok(joined)
}

fn etag(value: &Option<String>) -> Result<Option<warren_fs::Etag>, FsError> {
    value.as_deref().map(str::parse).transpose()
}

fn run(op: &FileOp, input: impl Read) -> Result<(FileAnswer, Vec<u8>), Failed> {
    let answer = match op {
        FileOp::Describe { path } => {
            let found = walk(path, false)?;
            let name = match found.rest.as_slice() {
                [] => OsStr::new("."),
                [leaf] => leaf.as_os_str(),
                _ => return Err(not_found()),
            };
            let entry = warren_fs::describe_at(found.dir.as_fd(), name, path)?;
            FileAnswer::Entry(FileEntry::of(&entry, String::new()))
        }
        FileOp::Read {
            path,
            start,
            end,
            suffix,
            cap,
        } => {
            let found = walk(path, true)?;
            let leaf = match found.rest.as_slice() {
                [] => return Err(Failed::Errno(Errno::ISDIR)),
                [leaf] => leaf,
                _ => return Err(not_found()),
            };
            // A fifo planted there does not block the open; the type is checked on the
            // descriptor itself.
            let file = rustix::fs::openat(
                found.dir.as_fd(),
                leaf.as_os_str(),
                OFlags::RDONLY
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let range = FileOp::range(*start, *end, *suffix);
            let read = warren_fs::read_file(&std::fs::File::from(file), path, range, *cap)?;
            let answer = FileAnswer::Read {
                total_size: read.total_size,
                etag: read.etag.to_string(),
                range_start: read.range_start,
                length: read.bytes.len() as u64,
            };
            return Ok((answer, read.bytes));
        }
        FileOp::Write {
            path,
            append,
            if_match,
            if_none_match_any,
            create_parents,
            mode,
            cap,
        } => {
            let mut bytes = Vec::new();
            input
                .take(cap.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(|e| FsError::Read {
                    path: path.clone(),
                    errno: e,
                })?;
            if bytes.len() as u64 > *cap {
                return Err(FsError::TooLarge {
                    path: path.clone(),
                    size: bytes.len() as u64,
                    cap: *cap,
                }
                .into());
            }
            let found = walk(path, true)?;
            if found.rest.is_empty() {
                return Err(Failed::Errno(Errno::ISDIR));
            }
            if found.rest.len() > 1 && !create_parents {
                return Err(not_found());
            }
            let options = WriteOptions {
                if_match: etag(if_match)?,
                if_none_match_any: *if_none_match_any,
                create_parents: *create_parents,
                mode: *mode,
            };
            let root = root_at(&found)?;
            let rel = rest(&found)?;
            let written = if *append {
                root.append(&rel, &bytes, options)?
            } else {
                root.write(&rel, &bytes, options)?
            };
            FileAnswer::Written {
                etag: written.etag.to_string(),
                created: written.created,
                size: written.size,
            }
        }
        FileOp::Edit {
            path,
            old,
            new,
            replace_all,
            if_match,
        } => {
            let found = walk(path, true)?;
            let Some(leaf) = found.leaf() else {
                return Err(if found.rest.is_empty() {
                    Failed::Errno(Errno::ISDIR)
                } else {
                    not_found()
                });
            };
            let edited = root_at(&found)?.edit(
                leaf.to_str().ok_or(Failed::Errno(Errno::INVAL))?,
                old,
                new,
                *replace_all,
                etag(if_match)?.as_ref(),
            )?;
            FileAnswer::Edited {
                etag: edited.etag.to_string(),
                replacements: edited.replacements,
            }
        }
        FileOp::Mkdir { path } => {
            let found = walk(path, true)?;
            if found.rest.is_empty() {
                FileAnswer::Made { created: false }
            } else {
                FileAnswer::Made {
                    created: root_at(&found)?.mkdir_p(&rest(&found)?)?,
                }
            }
        }
        FileOp::List { path, depth, limit } => {
            let listing = directory(path)?.list("", *depth, *limit)?;
            listed(listing)
        }
        FileOp::Glob {
            path,
            pattern,
            limit,
        } => listed(directory(path)?.glob("", pattern, *limit)?),
        FileOp::Grep {
            path,
            pattern,
            glob,
            case_insensitive,
            max_matches,
            max_file_size,
        } => {
            let options = GrepOptions {
                glob: glob.clone(),
                case_insensitive: *case_insensitive,
                max_matches: *max_matches,
                max_file_size: *max_file_size,
            };
            let found = directory(path)?.grep("", pattern, options)?;
            FileAnswer::Grep {
                matches: found
                    .matches
                    .into_iter()
                    .map(|m| (m.path, m.line_number, m.line))
                    .collect(),
                truncated: found.truncated,
                files_scanned: found.files_scanned,
            }
        }
        FileOp::Remove { path, recursive } => {
            let found = walk(path, false)?;
            let Some(leaf) = found.leaf() else {
                return Err(if found.rest.is_empty() {
                    FsError::RootRefused { action: "remove" }.into()
                } else {
                    not_found()
                });
            };
            root_at(&found)?.remove(leaf, *recursive)?;
            FileAnswer::Done
        }
        FileOp::Rename {
            from,
            to,
            overwrite,
        } => {
            let source = walk(from, false)?;
            let target = walk(to, false)?;
            let (Some(from_leaf), Some(to_leaf)) = (source.leaf(), target.leaf()) else {
                return Err(match (source.rest.is_empty(), target.rest.is_empty()) {
                    (true, _) => FsError::RootRefused { action: "rename" }.into(),
                    (_, true) => FsError::RootRefused { action: "replace" }.into(),
                    _ => not_found(),
                });
            };
            let (from_dir, to_dir) = (source.open_dir()?, target.open_dir()?);
            warren_fs::rename_between(
                from_dir.as_fd(),
                from_leaf,
                to_dir.as_fd(),
                to_leaf,
                *overwrite,
                (from, to),
            )?;
            FileAnswer::Done
        }
    };
    Ok((answer, Vec::new()))
}

/// A read-write root at the directory `path` names (links followed inside the runtime).
fn directory(path: &str) -> Result<WorkspaceRoot, Failed> {
    let found = walk(path, true)?;
    match found.rest.as_slice() {
        [] => root_at(&found),
        [leaf] => {
            // There but not a directory, or not there at all.
            warren_fs::describe_at(found.dir.as_fd(), leaf, path)?;
            Err(Failed::Errno(Errno::NOTDIR))
        }
        _ => Err(not_found()),
    }
}

fn listed(listing: warren_fs::Listing) -> FileAnswer {
    FileAnswer::Listing {
        entries: listing
            .entries
            .iter()
            .map(|entry| FileEntry::of(entry, entry.path.clone()))
            .collect(),
        truncated: listing.truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(op: FileOp, input: &[u8]) -> (FileAnswer, Vec<u8>) {
        let (answer, data) = serve(&op, input);
        (answer.unwrap_or_else(|e| panic!("{op:?}: {e:?}")), data)
    }

    fn failure(op: FileOp) -> FileFailure {
        serve(&op, &b""[..]).0.unwrap_err()
    }

    #[test]
    fn a_tree_is_written_read_listed_moved_and_removed_by_absolute_path() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_str().unwrap().to_owned();
        std::os::unix::fs::symlink(&base, dir.path().join("self")).unwrap();
        let file = format!("{base}/self/a/b.txt");
        let write = |path: &str| FileOp::Write {
            path: path.into(),
            append: false,
            if_match: None,
            if_none_match_any: false,
            create_parents: true,
            mode: None,
            cap: 1 << 20,
        };
        let (written, _) = ok(write(&file), b"hello");
        assert!(matches!(
            written,
            FileAnswer::Written {
                created: true,
                size: 5,
                ..
            }
        ));
        let read = FileOp::read(file.clone(), warren_fs::ByteRange::FULL, 1 << 20);
        let (answer, bytes) = ok(read, b"");
        assert_eq!(bytes, b"hello");
        assert!(matches!(
            answer,
            FileAnswer::Read {
                length: 5,
                total_size: 5,
                ..
            }
        ));
        let (listing, _) = ok(
            FileOp::List {
                path: format!("{base}/self"),
                depth: 2,
                limit: 100,
            },
            b"",
        );
        let FileAnswer::Listing { entries, .. } = listing else {
            panic!("{listing:?}")
        };
        let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "a/b.txt", "self"]);
        let (described, _) = ok(
            FileOp::Describe {
                path: format!("{base}/self"),
            },
            b"",
        );
        assert!(
            matches!(described, FileAnswer::Entry(FileEntry { ref kind, .. }) if kind == "symlink")
        );
        ok(
            FileOp::Rename {
                from: file.clone(),
                to: format!("{base}/c.txt"),
                overwrite: false,
            },
            b"",
        );
        assert_eq!(std::fs::read(dir.path().join("c.txt")).unwrap(), b"hello");
        ok(
            FileOp::Remove {
                path: format!("{base}/self/a"),
                recursive: true,
            },
            b"",
        );
        assert!(!dir.path().join("a").exists());
        assert!(dir.path().join("self").exists());
    }

    #[test]
    fn procfs_is_never_served_even_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/proc/self", dir.path().join("me")).unwrap();
        let through = format!("{}/me/environ", dir.path().display());
        for path in [
            "/proc/self/environ",
            "/proc/self/mem",
            "/proc/1/cmdline",
            &through,
        ] {
            assert_eq!(
                failure(FileOp::read(
                    path.into(),
                    warren_fs::ByteRange::FULL,
                    1 << 20
                )),
                FileFailure::Refused {
                    kind: "permission_denied".into(),
                    path: path.into()
                },
                "{path}"
            );
        }
        assert!(matches!(
            failure(FileOp::List {
                path: "/proc".into(),
                depth: 1,
                limit: 10
            }),
            FileFailure::Refused { .. }
        ));
    }

    #[test]
    fn a_listing_larger_than_a_frame_is_cut_and_says_so() {
        let entry = |i: usize| FileEntry {
            path: format!("{i:0>200}"),
            kind: "file".into(),
            size: 1,
            mode: 0o644,
            modified_unix_ms: 0,
            modified_unix_ns: 0,
            uid: 1000,
            gid: 1000,
            symlink_target: None,
            inode: i as u64,
            links: 1,
            changed_unix_ns: 0,
        };
        let answer = within_budget(FileAnswer::Listing {
            entries: (0..20_000).map(entry).collect(),
            truncated: false,
        });
        let size = serde_json::to_vec(&answer).unwrap().len();
        let FileAnswer::Listing { entries, truncated } = answer else {
            panic!()
        };
        assert!(
            truncated && size <= ANSWER_BUDGET && entries.len() > 5_000,
            "{size}"
        );
        assert_eq!(
            entries[0].path,
            format!("{:0>200}", 0),
            "the first ones are kept"
        );
    }

    #[test]
    fn refusals_name_the_path_asked_about() {
        let dir = tempfile::tempdir().unwrap();
        let missing = format!("{}/no/such", dir.path().display());
        assert_eq!(
            failure(FileOp::read(
                missing.clone(),
                warren_fs::ByteRange::FULL,
                10
            )),
            FileFailure::Refused {
                kind: "not_found".into(),
                path: missing
            }
        );
        let directory = dir.path().display().to_string();
        assert_eq!(
            failure(FileOp::read(
                directory.clone(),
                warren_fs::ByteRange::FULL,
                10
            )),
            FileFailure::Refused {
                kind: "is_a_directory".into(),
                path: directory.clone()
            }
        );
        assert_eq!(
            failure(FileOp::Remove {
                path: "/".into(),
                recursive: true
            }),
            FileFailure::RootRefused {
                action: "remove".into()
            }
        );
        let big = FileOp::Write {
            path: format!("{directory}/big"),
            append: false,
            if_match: None,
            if_none_match_any: false,
            create_parents: false,
            mode: None,
            cap: 3,
        };
        assert!(matches!(
            serve(&big, &b"four"[..]).0,
            Err(FileFailure::TooLarge {
                size: 4,
                cap: 3,
                ..
            })
        ));
    }
}
