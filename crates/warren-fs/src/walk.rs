//! Tree walks: listing, glob and grep.
//!
//! The walk descends by descriptor: each subdirectory is opened relative to its parent's
//! descriptor through the resolver, with `O_NOFOLLOW` and the mount check (I2). Symlinks are
//! reported as [`Kind::Symlink`] with their stored target but never descended into, and a
//! subdirectory that turns out to be a link or another mount by the time it is opened is simply
//! not descended into.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

use globset::{GlobBuilder, GlobMatcher};
use regex::bytes::{Regex, RegexBuilder};
use rustix::fs::{readlinkat, statat, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{FsError, Op};
use crate::path::{join, join_os, RelPath};
use crate::remove::read_names;
use crate::resolve::Meta;
use crate::root::{check_regular, entry_from_meta, read_all_capped, read_flags, WorkspaceRoot};
use crate::types::{
    Entry, GrepMatch, GrepOptions, GrepResult, Kind, Listing, GREP_LINE_MAX_CHARS, MAX_WALK_DEPTH,
};

/// How much of a file is inspected for a NUL byte to call it binary.
const BINARY_SNIFF_LEN: usize = 8 * 1024;

/// Whether a walk goes on after a visit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// One entry met by the walk.
struct Visit<'a> {
    /// The directory holding the entry, for `*at` calls.
    dir: BorrowedFd<'a>,
    /// The entry's raw name in `dir`.
    name: &'a OsStr,
    /// The entry's path relative to the walk's base directory.
    rel_to_base: &'a str,
    entry: Entry,
}

impl WorkspaceRoot {
    /// The entry at `rel` as a listing shows it: a link in the last component described
    /// (its kind and target, read with `readlinkat`) and never followed. A link in any
    /// earlier component is refused, as on every other path.
    pub fn describe(&self, rel: &(impl AsRef<OsStr> + ?Sized)) -> Result<Entry, FsError> {
        let path = RelPath::parse(rel)?;
        let Some((parents, leaf)) = path.split_leaf() else {
            // The root itself is a directory, never a link.
            return self.stat(rel);
        };
        let parent = self.resolve_dir(parents, path.as_str())?;
        stat_entry(
            parent.as_fd(),
            &leaf.to_os_string(),
            path.as_str().to_owned(),
            path.to_os_string(),
        )?
        .ok_or_else(|| FsError::NotFound {
            path: path.as_str().to_owned(),
        })
    }

    /// Lists the directory `rel` down to `depth` levels (1 = direct children; 0 is treated as
    /// 1), at most `limit` entries, sorted by path.
    /// Each entry carries its path both lossily (`path`, what clients see) and as the exact
    /// bytes of its names (`os_path`).
    pub fn list(
        &self,
        rel: &(impl AsRef<OsStr> + ?Sized),
        depth: u32,
        limit: usize,
    ) -> Result<Listing, FsError> {
        let path = RelPath::parse(rel)?;
        let dir = self.resolve(&path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut listing = Listing::default();
        self.walk(dir, &path, depth.clamp(1, MAX_WALK_DEPTH), &mut |visit| {
            if listing.entries.len() >= limit {
                listing.truncated = true;
                return Ok(Flow::Stop);
            }
            listing.entries.push(visit.entry);
            Ok(Flow::Continue)
        })?;
        Ok(listing)
    }

    /// Finds entries under the directory `base` whose path relative to `base` matches the glob
    /// `pattern` (`*` stays within one component, `**` spans any number), at most `limit`.
    /// Returned paths are relative to the workspace root.
    pub fn glob(&self, base: &str, pattern: &str, limit: usize) -> Result<Listing, FsError> {
        let path = RelPath::parse(base)?;
        let matcher = compile_glob(pattern)?;
        let dir = self.resolve(&path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut listing = Listing::default();
        self.walk(dir, &path, MAX_WALK_DEPTH, &mut |visit| {
            if !matcher.is_match(visit.rel_to_base) {
                return Ok(Flow::Continue);
            }
            if listing.entries.len() >= limit {
                listing.truncated = true;
                return Ok(Flow::Stop);
            }
            listing.entries.push(visit.entry);
            Ok(Flow::Continue)
        })?;
        Ok(listing)
    }

    /// Searches the regular files under `base` (or `base` itself if it is a file) for lines
    /// matching the regular expression `pattern`. Binary files (a NUL in the first 8 KiB) and
    /// files larger than `opts.max_file_size` are skipped; symlinks are never followed.
    pub fn grep(
        &self,
        base: &str,
        pattern: &str,
        opts: GrepOptions,
    ) -> Result<GrepResult, FsError> {
        let path = RelPath::parse(base)?;
        let regex = RegexBuilder::new(pattern)
            .case_insensitive(opts.case_insensitive)
            .build()
            .map_err(|e| FsError::InvalidRegex {
                pattern: crate::error::shorten(pattern),
                reason: e.to_string(),
            })?;
        let filter = opts.glob.as_deref().map(GrepFilter::new).transpose()?;
        let mut search = Search {
            regex,
            opts: &opts,
            result: GrepResult::default(),
        };
        let fd = self.resolve(&path, read_flags())?;
        let meta =
            Meta::of(fd.as_fd()).map_err(|e| FsError::from_errno(e, path.as_str(), Op::Stat))?;
        if !meta.is_dir() {
            check_regular(&meta, path.as_str())?;
            let name = path
                .comps()
                .last()
                .map(|name| name.to_string_lossy())
                .unwrap_or_default();
            if filter.as_ref().is_none_or(|f| f.matches(&name, &name))
                && meta.size <= opts.max_file_size
            {
                search.file(File::from(fd), path.as_str())?;
            }
            return Ok(search.result);
        }
        self.walk(fd, &path, MAX_WALK_DEPTH, &mut |visit| {
            if visit.entry.kind != Kind::File || visit.entry.size > opts.max_file_size {
                return Ok(Flow::Continue);
            }
            let file_name = visit.name.to_string_lossy();
            if filter
                .as_ref()
                .is_some_and(|f| !f.matches(visit.rel_to_base, &file_name))
            {
                return Ok(Flow::Continue);
            }
            let file = match self.anchor.open_beneath(
                visit.dir,
                &[visit.name],
                read_flags(),
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Gone, or swapped for a link or a mount since it was listed: skip it.
                Err(Errno::NOENT | Errno::LOOP | Errno::XDEV) => return Ok(Flow::Continue),
                Err(e) => return Err(FsError::from_errno(e, &visit.entry.path, Op::Open)),
            };
            match Meta::of(file.as_fd()) {
                Ok(meta) if meta.is_file() && meta.size <= opts.max_file_size => {}
                Ok(_) => return Ok(Flow::Continue),
                Err(e) => return Err(FsError::from_errno(e, &visit.entry.path, Op::Stat)),
            }
            search.file(File::from(file), &visit.entry.path)
        })?;
        Ok(search.result)
    }

    /// Depth-first walk of the directory `dir` (at root-relative `path`), children in bytewise
    /// name order, descending at most `max_depth` levels.
    fn walk(
        &self,
        dir: OwnedFd,
        path: &RelPath<'_>,
        max_depth: u32,
        visit: &mut dyn FnMut(Visit<'_>) -> Result<Flow, FsError>,
    ) -> Result<(), FsError> {
        let at = Place {
            shown: path.as_str(),
            exact: &path.to_os_string(),
        };
        self.walk_dir(dir, at, "", 1, max_depth, visit).map(|_| ())
    }

    fn walk_dir(
        &self,
        dir: OwnedFd,
        at: Place<'_>,
        rel_to_base: &str,
        depth: u32,
        max_depth: u32,
        visit: &mut dyn FnMut(Visit<'_>) -> Result<Flow, FsError>,
    ) -> Result<Flow, FsError> {
        let (stream, names) = read_names(dir, at.shown)?;
        let dir_fd = stream
            .fd()
            .map_err(|e| FsError::from_errno(e, at.shown, Op::List))?;
        for name in &names {
            let lossy = name.to_string_lossy();
            let child_path = join(at.shown, &lossy);
            let child_rel = join(rel_to_base, &lossy);
            let child_os_path = join_os(at.exact, name);
            let Some(entry) = stat_entry(dir_fd, name, child_path, child_os_path)? else {
                continue; // removed since the directory was read
            };
            let is_dir = entry.kind == Kind::Dir;
            let (entry_path, entry_os_path) = (entry.path.clone(), entry.os_path.clone());
            let flow = visit(Visit {
                dir: dir_fd,
                name,
                rel_to_base: &child_rel,
                entry,
            })?;
            if flow == Flow::Stop {
                return Ok(Flow::Stop);
            }
            if !is_dir || depth >= max_depth {
                continue;
            }
            let child = match self.anchor.open_beneath(
                dir_fd,
                &[name.as_os_str()],
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Gone, replaced by a link or a file, a mount point, or unreadable: list it,
                // don't enter it.
                Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::XDEV | Errno::ACCESS) => {
                    continue
                }
                Err(e) => return Err(FsError::from_errno(e, &entry_path, Op::Open)),
            };
            let child_at = Place {
                shown: &entry_path,
                exact: &entry_os_path,
            };
            if self.walk_dir(child, child_at, &child_rel, depth + 1, max_depth, visit)?
                == Flow::Stop
            {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }
}

/// Describes the entry `name` of the directory `dir` as a listing would (a link described,
/// never followed; a mount point's own directory, not what is under it), shown as `shown`:
/// for a caller that resolved the directory itself (a runtime's agent).
pub fn describe_at(dir: BorrowedFd<'_>, name: &OsStr, shown: &str) -> Result<Entry, FsError> {
    stat_entry(
        dir,
        &name.to_os_string(),
        shown.to_owned(),
        OsString::from(shown),
    )?
    .ok_or_else(|| FsError::NotFound {
        path: shown.to_owned(),
    })
}

/// Where a walk is: a directory's root-relative path as shown and as exact bytes.
#[derive(Clone, Copy)]
struct Place<'a> {
    shown: &'a str,
    exact: &'a OsStr,
}

/// `lstat`s one directory entry; `None` if it vanished.
fn stat_entry(
    dir: BorrowedFd<'_>,
    name: &OsString,
    path: String,
    os_path: OsString,
) -> Result<Option<Entry>, FsError> {
    let st = match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(FsError::from_errno(e, &path, Op::Stat)),
    };
    let meta = Meta::from_stat(&st);
    let target = if meta.is_symlink() {
        match readlinkat(dir, name, Vec::new()) {
            Ok(target) => Some(OsString::from_vec(target.into_bytes())),
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(FsError::from_errno(e, &path, Op::Stat)),
        }
    } else {
        None
    };
    Ok(Some(entry_from_meta(path, os_path, &meta, target)))
}

fn compile_glob(pattern: &str) -> Result<GlobMatcher, FsError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| FsError::InvalidGlob {
            pattern: crate::error::shorten(pattern),
            reason: e.kind().to_string(),
        })
}

/// The optional file filter of grep: a pattern without `/` is matched against the file name
/// (so `*.rs` finds Rust files at any depth), one with `/` against the path below the base.
struct GrepFilter {
    matcher: GlobMatcher,
    by_name: bool,
}

impl GrepFilter {
    fn new(pattern: &str) -> Result<Self, FsError> {
        Ok(Self {
            matcher: compile_glob(pattern)?,
            by_name: !pattern.contains('/'),
        })
    }

    fn matches(&self, rel_to_base: &str, file_name: &str) -> bool {
        self.matcher
            .is_match(if self.by_name { file_name } else { rel_to_base })
    }
}

struct Search<'o> {
    regex: Regex,
    opts: &'o GrepOptions,
    result: GrepResult,
}

impl Search<'_> {
    /// Searches one opened regular file line by line.
    fn file(&mut self, file: File, path: &str) -> Result<Flow, FsError> {
        let content = match read_all_capped(&file, self.opts.max_file_size, path) {
            Ok(content) => content,
            // Grew past the limit while being read: skip it like any oversized file.
            Err(FsError::TooLarge { .. }) => return Ok(Flow::Continue),
            Err(e) => return Err(e),
        };
        if content[..content.len().min(BINARY_SNIFF_LEN)].contains(&0) {
            return Ok(Flow::Continue);
        }
        self.result.files_scanned += 1;
        let body = content.strip_suffix(b"\n").unwrap_or(&content);
        if content.is_empty() {
            return Ok(Flow::Continue);
        }
        for (index, line) in body.split(|b| *b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !self.regex.is_match(line) {
                continue;
            }
            if self.result.matches.len() >= self.opts.max_matches {
                self.result.truncated = true;
                return Ok(Flow::Stop);
            }
            self.result.matches.push(GrepMatch {
                path: path.to_owned(),
                line_number: index as u64 + 1,
                line: String::from_utf8_lossy(line)
                    .chars()
                    .take(GREP_LINE_MAX_CHARS)
                    .collect(),
            });
        }
        Ok(Flow::Continue)
    }
}
