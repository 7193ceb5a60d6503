//! Copies one source tree into a staging directory, by descriptor on both sides, and
//! records the source's [`Manifest`] from the very bytes it copied (I36).
//!
//! This is [`WorkspaceRoot::copy_tree_from`] made fit for a migration: the listing is the
//! shared [`Tree::scan`] (sorted by path bytes, fifos and other mounts left out and
//! reported, nothing cut short silently), every file is hashed while it is streamed and
//! checked to be unchanged, hard links stay links, modes are normalised
//! ([`normalised_mode`]) and whatever may surprise an operator is reported.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use warren_fs::{FsError, Kind, WorkspaceRoot};

use crate::manifest::{
    normalised_mode, show, stream, Item, Manifest, StreamError, Tree, BUFFER_SIZE,
};
use crate::MigrateError;

/// What [`copy_tree`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// The manifest of the source, hashed from the bytes read while copying.
    pub manifest: Manifest,
    /// What the operator should know, one line each, paths relative to `from` (the caller
    /// names the tree): entries left out (fifos, sockets, devices, other mounts), symlinks
    /// pointing outside the tree, files with hard links outside it.
    pub warnings: Vec<String>,
}

/// Copies the tree `from` beneath `source` into `to` beneath `dest`.
///
/// `to` must not exist (its parent must); it is created. Files are streamed (1 MiB at a
/// time) while SHA-256 is computed on the bytes read, created `0600`, then given
/// [`normalised_mode`] and the source's modification time; directories get their
/// normalised mode and time at the end, children first; symlinks are recreated as links
/// with the target bytes as stored (never resolved) and their time; the later names of a
/// file hard-linked within the tree become hard links to its first copy. Everything created
/// belongs to `dest`'s owner (I11). Finally the destination's filesystem is synced, so the
/// copy is durable before anything is switched to it.
///
/// Left out and reported in [`CopyReport::warnings`]: fifos, sockets and devices, and
/// subdirectories on another mount. Copied but reported: a symlink whose target is absolute
/// or climbs out of `from`, and a file with hard links outside the tree (copied as a
/// separate file).
///
/// A file that is not what was listed when it is read (another size, time or inode) is
/// [`MigrateError::SourceChanged`]: the old system must be stopped first. On any error the
/// partial `to` is left for the caller to remove.
pub fn copy_tree(
    source: &WorkspaceRoot,
    from: &OsStr,
    dest: &WorkspaceRoot,
    to: &OsStr,
) -> Result<CopyReport, MigrateError> {
    let tree = Tree::scan(source, from)?;
    let mut warnings: Vec<String> = tree
        .left_out
        .iter()
        .map(|left| format!("{}: {}, not copied", show(&left.rel), left.what))
        .collect();
    let to = normalise(to);
    create_new_dir(dest, &to)?;
    let mut buffer = vec![0u8; BUFFER_SIZE];
    let mut entries = Vec::with_capacity(tree.items.len());
    // Directories get their mode and time last, children first: creating an entry inside
    // a directory moves its time, and a read-only directory is sealed after its contents.
    let mut directories = Vec::new();
    for item in &tree.items {
        let entry = &item.entry;
        let target = join(&to, &item.rel);
        let what = || format!("copy {}", show(&entry.os_path));
        let mut sha256 = None;
        match (&entry.kind, &item.link_to) {
            (Kind::Dir, _) => {
                if !item.rel.is_empty() {
                    dest.mkdir_p(&target).map_err(MigrateError::fs(what()))?;
                }
                directories.push((target, normalised_mode(entry.mode), entry.modified_unix_ns));
            }
            (Kind::Symlink, _) => {
                let link = entry.os_symlink_target.as_deref().unwrap_or_default();
                dest.create_symlink(&target, link)
                    .map_err(MigrateError::fs(what()))?;
                dest.set_attributes_ns(&target, None, entry.modified_unix_ns)
                    .map_err(MigrateError::fs(what()))?;
                if points_outside(&item.rel, link) {
                    warnings.push(format!(
                        "{} -> {}: a symlink pointing outside {}, copied as a link, never \
                         followed",
                        show(&item.rel),
                        show(link),
                        show(&tree.base)
                    ));
                }
            }
            (Kind::File, Some(first)) => {
                dest.create_hardlink(&join(&to, first), &target)
                    .map_err(MigrateError::fs(what()))?;
            }
            (Kind::File, None) => {
                sha256 = Some(copy_file(source, dest, item, &target, &mut buffer)?);
                if entry.links > item.names_in_tree {
                    warnings.push(if item.names_in_tree == 1 {
                        format!(
                            "{}: has hard links outside the tree; copied as a separate file",
                            show(&item.rel)
                        )
                    } else {
                        format!(
                            "{}: has hard links outside the tree; its {} names inside are \
                             copied as one separate file",
                            show(&item.rel),
                            item.names_in_tree
                        )
                    });
                }
            }
            // The scan keeps nothing else.
            (Kind::Other, _) => continue,
        }
        entries.push(item.manifest_entry(sha256));
    }
    for (target, mode, modified) in directories.into_iter().rev() {
        dest.set_attributes_ns(&target, Some(mode), modified)
            .map_err(MigrateError::fs(format!("copy {}", show(&target))))?;
    }
    dest.sync_filesystem()
        .map_err(MigrateError::fs(format!("sync the copy {}", show(&to))))?;
    Ok(CopyReport {
        manifest: Manifest::from_entries(entries),
        warnings,
    })
}

/// Streams the regular file `item` from `source` into the new file `target` in `dest`,
/// hashing what it reads, then gives the copy its normalised mode and the source's time.
fn copy_file(
    source: &WorkspaceRoot,
    dest: &WorkspaceRoot,
    item: &Item,
    target: &OsStr,
    buffer: &mut [u8],
) -> Result<[u8; 32], MigrateError> {
    let entry = &item.entry;
    let what = || format!("copy {}", show(&entry.os_path));
    let input = source
        .open_file(&entry.os_path)
        .map_err(MigrateError::fs(what()))?;
    let mut output = dest
        .create_file(target, 0o600)
        .map_err(MigrateError::fs(what()))?;
    let sha256 = stream(&input, entry, Some(&mut output), buffer).map_err(|e| match e {
        StreamError::Read(e) => MigrateError::io(format!("{}: read", what()))(e),
        StreamError::Write(e) => MigrateError::io(format!("{}: write", what()))(e),
        StreamError::Changed(how) => MigrateError::SourceChanged {
            path: show(&entry.os_path),
            how,
        },
    })?;
    drop(output);
    dest.set_attributes_ns(
        target,
        Some(normalised_mode(entry.mode)),
        entry.modified_unix_ns,
    )
    .map_err(MigrateError::fs(what()))?;
    Ok(sha256)
}

/// Creates the directory `to` (its normalised path), which must not exist, in an existing
/// parent.
fn create_new_dir(dest: &WorkspaceRoot, to: &OsStr) -> Result<(), MigrateError> {
    let what = || format!("create the copy {}", show(to));
    let bytes = to.as_bytes();
    if bytes.is_empty() {
        return Err(MigrateError::fs(what())(FsError::RootRefused {
            action: "copy into",
        }));
    }
    let parent = match bytes.iter().rposition(|b| *b == b'/') {
        Some(slash) => OsStr::from_bytes(&bytes[..slash]),
        None => OsStr::new(""),
    };
    let parent_entry = dest.stat(parent).map_err(MigrateError::fs(what()))?;
    if parent_entry.kind != Kind::Dir {
        return Err(MigrateError::fs(what())(FsError::NotADirectory {
            path: parent_entry.path,
        }));
    }
    // The parent exists, so `mkdir_p` creates `to` alone, or nothing if it exists.
    if !dest.mkdir_p(to).map_err(MigrateError::fs(what()))? {
        return Err(MigrateError::fs(what())(FsError::AlreadyExists {
            path: to.to_string_lossy().into_owned(),
        }));
    }
    Ok(())
}

/// `path` without empty and `.` components, `/`-joined, as exact bytes.
fn normalise(path: &OsStr) -> OsString {
    let parts: Vec<&[u8]> = path
        .as_bytes()
        .split(|b| *b == b'/')
        .filter(|part| !part.is_empty() && *part != b".")
        .collect();
    OsStr::from_bytes(&parts.join(&b'/')).to_owned()
}

/// `rel` (relative to the tree) beneath `base`.
fn join(base: &OsStr, rel: &OsStr) -> OsString {
    let mut out = base.to_owned();
    if !rel.is_empty() {
        if !out.is_empty() {
            out.push("/");
        }
        out.push(rel);
    }
    out
}

/// Whether the symlink at `link` (relative to the tree root) points outside the tree,
/// lexically: an absolute target, or a relative one whose `..` climb above the root,
/// counted against the link's depth. Never resolved: what the components are is not known,
/// only their names.
fn points_outside(link: &OsStr, target: &OsStr) -> bool {
    let target = target.as_bytes();
    if target.first() == Some(&b'/') {
        return true;
    }
    // The directory holding the link is as deep as the link's path has parents.
    let mut depth = link.as_bytes().iter().filter(|b| **b == b'/').count();
    for part in target.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => match depth.checked_sub(1) {
                Some(up) => depth = up,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{manifest_of, EntryKind};
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
    use std::path::{Path, PathBuf};
    use warren_fs::Owner;

    const WORKSPACE: (u32, u32) = (1000, 1000);

    fn non_utf8() -> OsString {
        OsString::from_vec(b"caf\xe9 \xff.txt".to_vec())
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A source tree with everything a copy must handle; returns the base directory, which
    /// holds `src` (the tree) and `outside` (what its links point at).
    fn source_tree() -> tempfile::TempDir {
        let base = tempfile::tempdir().unwrap();
        let src = base.path().join("src");
        let outside = base.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"outside the tree").unwrap();
        for dir in ["workspace/nested/deep", "outputs", "empty", "sticky"] {
            std::fs::create_dir_all(src.join(dir)).unwrap();
        }
        std::fs::write(src.join("workspace/a.txt"), b"alpha\n").unwrap();
        // Several buffers and a ragged end.
        let big: Vec<u8> = (0..(3 * BUFFER_SIZE + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(src.join("workspace/nested/deep/big.bin"), &big).unwrap();
        std::fs::write(src.join("workspace").join(non_utf8()), b"latin-1 name").unwrap();
        std::fs::write(src.join("workspace/with space.txt"), b"spaces").unwrap();
        std::fs::write(src.join("workspace/new\nline.txt"), b"newline").unwrap();
        std::fs::write(src.join("workspace/empty.txt"), b"").unwrap();
        symlink("/etc/passwd", src.join("outputs/passwd")).unwrap();
        symlink("../../../outside/secret", src.join("outputs/climb")).unwrap();
        symlink("../workspace/a.txt", src.join("outputs/inside")).unwrap();
        std::fs::write(src.join("workspace/linked"), b"two names").unwrap();
        std::fs::hard_link(src.join("workspace/linked"), src.join("outputs/also")).unwrap();
        std::fs::write(src.join("outputs/shared"), b"one name inside").unwrap();
        std::fs::hard_link(src.join("outputs/shared"), outside.join("shared")).unwrap();
        std::fs::write(src.join("workspace/world.txt"), b"anyone").unwrap();
        set_mode(&src.join("workspace/world.txt"), 0o666);
        std::fs::write(src.join("workspace/setuid"), b"#!/bin/sh\n").unwrap();
        set_mode(&src.join("workspace/setuid"), 0o4755);
        set_mode(&src.join("sticky"), 0o1777);
        set_mode(&src.join("empty"), 0o700);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("outputs/pipe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        // Someone else's file: the copy is the workspace owner's all the same.
        std::os::unix::fs::lchown(src.join("workspace/a.txt"), Some(1234), Some(5678)).unwrap();
        let old =
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(1_234_567_890_123);
        std::fs::File::options()
            .write(true)
            .open(src.join("workspace/a.txt"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        base
    }

    fn roots(base: &Path) -> (WorkspaceRoot, WorkspaceRoot, PathBuf) {
        let dest_dir = base.join("dest");
        std::fs::create_dir_all(dest_dir.join("threads")).unwrap();
        let source = WorkspaceRoot::open(base).unwrap().read_only();
        let dest = WorkspaceRoot::open(&dest_dir)
            .unwrap()
            .with_owner(Some(Owner::WORKSPACE));
        (source, dest, dest_dir)
    }

    /// Copies the tree `src` of `source` to `to` in `dest`.
    fn copy(
        source: &WorkspaceRoot,
        dest: &WorkspaceRoot,
        to: &str,
    ) -> Result<CopyReport, MigrateError> {
        copy_tree(source, OsStr::new("src"), dest, OsStr::new(to))
    }

    /// Writes `bytes` to `file` and gives it the time `modified`.
    fn rewrite(file: &Path, bytes: &[u8], modified: std::time::SystemTime) {
        std::fs::write(file, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(modified)
            .unwrap();
    }

    /// Every path below `dir` (not following links), relative, sorted.
    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = vec![];
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for child in std::fs::read_dir(dir.join(&rel)).unwrap() {
                let child = child.unwrap();
                let path = rel.join(child.file_name());
                if child.file_type().unwrap().is_dir() {
                    stack.push(path.clone());
                }
                out.push(path);
            }
        }
        out.sort();
        out
    }

    fn find<'m>(manifest: &'m Manifest, path: &str) -> &'m crate::manifest::ManifestEntry {
        manifest
            .entries
            .iter()
            .find(|e| e.path == path)
            .unwrap_or_else(|| panic!("{path} not in the manifest"))
    }

    #[test]
    fn a_tree_is_copied_exactly_owned_by_the_workspace_user_and_equals_its_manifest() {
        let base = source_tree();
        let (source, dest, dest_dir) = roots(base.path());
        let report = copy(&source, &dest, "threads/staging").unwrap();
        let copy = dest_dir.join("threads/staging");
        let src = base.path().join("src");

        // The manifest of the copy, and of the source read again, equal the one recorded.
        let copied = manifest_of(&dest, OsStr::new("threads/staging"), Some(WORKSPACE)).unwrap();
        assert_eq!(report.manifest.first_difference(&copied), None);
        assert_eq!(copied, report.manifest);
        assert_eq!(copied.digest(), report.manifest.digest());
        let again = manifest_of(&source, OsStr::new("src"), None).unwrap();
        assert_eq!(again, report.manifest);
        // The source is someone else's: the owner check names it.
        let error = manifest_of(&source, OsStr::new("src"), Some(WORKSPACE)).unwrap_err();
        assert!(
            error.to_string().contains("owned by 0:0, not 1000:1000"),
            "{error}"
        );

        // Everything but the fifo, byte for byte, everything 1000:1000.
        let mut expected = walk(&src);
        expected.retain(|p| p != Path::new("outputs/pipe"));
        assert_eq!(walk(&copy), expected);
        for rel in &expected {
            let (a, b) = (src.join(rel), copy.join(rel));
            let (meta_a, meta_b) = (a.symlink_metadata().unwrap(), b.symlink_metadata().unwrap());
            assert_eq!((meta_b.uid(), meta_b.gid()), WORKSPACE, "{rel:?}");
            assert_eq!(meta_a.file_type(), meta_b.file_type(), "{rel:?}");
            // Every time, of files, links and directories, to the nanosecond (as `cp -a`).
            assert_eq!(
                (meta_a.mtime(), meta_a.mtime_nsec()),
                (meta_b.mtime(), meta_b.mtime_nsec()),
                "{rel:?}"
            );
            if meta_a.is_file() {
                assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
            }
            if meta_a.is_symlink() {
                assert_eq!(
                    std::fs::read_link(&a).unwrap(),
                    std::fs::read_link(&b).unwrap()
                );
            }
            if !meta_a.is_symlink() {
                assert_eq!(
                    meta_b.mode() & 0o7777,
                    normalised_mode(meta_a.mode()),
                    "{rel:?}"
                );
            }
        }
        let mode = |rel: &str| copy.join(rel).symlink_metadata().unwrap().mode() & 0o7777;
        assert_eq!(mode("workspace/world.txt"), 0o664);
        assert_eq!(mode("workspace/setuid"), 0o755);
        assert_eq!(mode("sticky"), 0o1775);
        assert_eq!(mode("empty"), 0o700);
        let a = copy.join("workspace/a.txt").metadata().unwrap();
        assert_eq!((a.mtime(), a.mtime_nsec()), (1234, 567_890_123));
        assert_eq!(
            find(&report.manifest, "workspace/a.txt").modified_unix_ns,
            Some(1_234_567_890_123)
        );

        // Links stay links, the outside is never touched; the hard-link pair is one inode.
        let ino = |rel: &str| copy.join(rel).metadata().unwrap().ino();
        assert_eq!(ino("workspace/linked"), ino("outputs/also"));
        assert_eq!(
            find(&report.manifest, "workspace/linked").kind,
            EntryKind::HardLink {
                to: "outputs/also".into()
            }
        );
        assert_eq!(copy.join("outputs/shared").metadata().unwrap().nlink(), 1);
        assert!(copy
            .join("outputs/passwd")
            .symlink_metadata()
            .unwrap()
            .is_symlink());
        assert_eq!(
            std::fs::read(base.path().join("outside/secret")).unwrap(),
            b"outside the tree"
        );
        assert_eq!(
            find(&report.manifest, "outputs/climb").kind,
            EntryKind::Symlink {
                target: "../../../outside/secret".into()
            }
        );
        assert!(report
            .manifest
            .entries
            .iter()
            .any(|e| e.path == Path::new("workspace").join(non_utf8()).as_os_str()));

        // What the operator is told, and nothing more.
        let mut warnings = report.warnings.clone();
        warnings.sort();
        assert_eq!(
            warnings,
            [
                "outputs/climb -> ../../../outside/secret: a symlink pointing outside src, \
                 copied as a link, never followed",
                "outputs/passwd -> /etc/passwd: a symlink pointing outside src, copied as a \
                 link, never followed",
                "outputs/pipe: a fifo, not copied",
                "outputs/shared: has hard links outside the tree; copied as a separate file",
            ]
        );
        // Files are counted per name, as `find -type f | wc -l` counts them: the pair
        // `workspace/linked` and `outputs/also` is two files of one content.
        let files = expected
            .iter()
            .filter(|rel| src.join(rel).symlink_metadata().unwrap().is_file())
            .count() as u64;
        assert_eq!(report.manifest.files, files);
        let contents: u64 = report
            .manifest
            .entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum();
        assert_eq!(report.manifest.bytes, contents);
    }

    #[test]
    fn a_changed_byte_a_missing_file_and_a_changed_mode_are_named() {
        let base = source_tree();
        let (source, dest, dest_dir) = roots(base.path());
        let report = copy(&source, &dest, "copy").unwrap();
        let at = OsStr::new("copy");
        let first = manifest_of(&dest, at, None).unwrap();
        assert_eq!(
            first.digest(),
            manifest_of(&dest, at, None).unwrap().digest()
        );

        // One byte, same size, same time.
        let file = dest_dir.join("copy/workspace/nested/deep/big.bin");
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[BUFFER_SIZE + 1] ^= 1;
        let modified = file.metadata().unwrap().modified().unwrap();
        rewrite(&file, &bytes, modified);
        let changed = manifest_of(&dest, at, None).unwrap();
        assert_ne!(changed.digest(), report.manifest.digest());
        assert_eq!(
            report.manifest.first_difference(&changed).unwrap(),
            "workspace/nested/deep/big.bin: content differs"
        );
        bytes[BUFFER_SIZE + 1] ^= 1;
        rewrite(&file, &bytes, modified);
        assert_eq!(manifest_of(&dest, at, None).unwrap(), report.manifest);

        set_mode(&dest_dir.join("copy/workspace/with space.txt"), 0o600);
        assert_eq!(
            report
                .manifest
                .first_difference(&manifest_of(&dest, at, None).unwrap())
                .unwrap(),
            "workspace/with space.txt: mode 0644 in the source, 0600 in the copy"
        );

        std::fs::remove_file(dest_dir.join("copy/workspace/new\nline.txt")).unwrap();
        assert_eq!(
            report
                .manifest
                .first_difference(&manifest_of(&dest, at, None).unwrap())
                .unwrap(),
            "workspace/new\\nline.txt: missing in the copy"
        );
    }

    #[test]
    fn the_target_must_be_new_and_its_parent_must_exist() {
        let base = source_tree();
        let (source, dest, dest_dir) = roots(base.path());
        let error = copy(&source, &dest, "threads").unwrap_err();
        assert!(error.to_string().contains("already exists"), "{error}");
        let error = copy(&source, &dest, "nowhere/copy").unwrap_err();
        assert!(
            error.to_string().contains("no such file or directory"),
            "{error}"
        );
        assert!(!dest_dir.join("nowhere").exists());
        // A source tree that is a link is refused, not followed.
        symlink("src", base.path().join("via-link")).unwrap();
        let error = copy_tree(&source, OsStr::new("via-link"), &dest, OsStr::new("x")).unwrap_err();
        assert!(error.to_string().contains("symlinks"), "{error}");
        assert!(!dest_dir.join("x").exists());
    }

    #[test]
    fn a_file_that_changed_since_it_was_listed_is_refused() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join("f"), b"12345").unwrap();
        let root = WorkspaceRoot::open(base.path()).unwrap();
        let mut buffer = vec![0u8; 4];
        let listed = root.stat("f").unwrap();
        let file = root.open_file("f").unwrap();
        assert!(stream(&file, &listed, None, &mut buffer).is_ok());
        for (content, how) in [
            (
                &b"123456"[..],
                "grew while it was read (5 bytes listed, more read)",
            ),
            (
                &b"1234"[..],
                "shrank while it was read (5 bytes listed, 4 read)",
            ),
        ] {
            std::fs::write(base.path().join("f"), content).unwrap();
            let file = root.open_file("f").unwrap();
            match stream(&file, &listed, None, &mut buffer) {
                Err(StreamError::Changed(said)) => assert_eq!(said, how),
                other => panic!("{other:?}"),
            }
        }
        // The same bytes again, one nanosecond later than listed: a change all the same.
        let listed_time = std::time::SystemTime::UNIX_EPOCH
            + std::time::Duration::from_nanos(u64::try_from(listed.modified_unix_ns).unwrap());
        rewrite(
            &base.path().join("f"),
            b"12345",
            listed_time + std::time::Duration::from_nanos(1),
        );
        let file = root.open_file("f").unwrap();
        assert!(matches!(
            stream(&file, &listed, None, &mut buffer),
            Err(StreamError::Changed(said)) if said == "was modified while it was read"
        ));
        rewrite(&base.path().join("f"), b"12345", listed_time);
        let file = root.open_file("f").unwrap();
        assert!(stream(&file, &listed, None, &mut buffer).is_ok());
        // Same size, written again later: its time moved.
        std::fs::write(base.path().join("f"), b"54321").unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        let file = std::fs::File::options()
            .write(true)
            .open(base.path().join("f"))
            .unwrap();
        file.set_modified(later).unwrap();
        let file = root.open_file("f").unwrap();
        assert!(matches!(
            stream(&file, &listed, None, &mut buffer),
            Err(StreamError::Changed(_))
        ));
    }

    /// A tmpfs mounted on a directory, unmounted when dropped.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }

    #[test]
    fn a_subdirectory_on_another_mount_is_left_out_and_reported() {
        let base = tempfile::tempdir().unwrap();
        let src = base.path().join("src");
        std::fs::create_dir_all(src.join("mnt")).unwrap();
        std::fs::write(src.join("kept"), b"kept").unwrap();
        if let Err(error) = rustix::mount::mount(
            "none",
            src.join("mnt"),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        ) {
            eprintln!("cannot mount a tmpfs here ({error}); nothing to check");
            return;
        }
        let _mounted = Mounted(src.join("mnt"));
        std::fs::write(src.join("mnt/elsewhere"), b"on the other mount").unwrap();
        let (source, dest, dest_dir) = roots(base.path());
        let report = copy(&source, &dest, "copy").unwrap();
        assert_eq!(
            report.warnings,
            ["mnt: a directory on another mount, not copied"]
        );
        assert!(!dest_dir.join("copy/mnt").exists());
        assert!(dest_dir.join("copy/kept").exists());
        assert_eq!(
            manifest_of(&source, OsStr::new("src"), None).unwrap(),
            report.manifest
        );
        assert_eq!(
            manifest_of(&dest, OsStr::new("copy"), Some(WORKSPACE)).unwrap(),
            report.manifest
        );
    }

    #[test]
    fn a_tree_deeper_than_a_walk_goes_is_refused_not_cut() {
        let base = tempfile::tempdir().unwrap();
        let levels = warren_fs::MAX_WALK_DEPTH as usize;
        let deepest: PathBuf = std::iter::once("src".to_owned())
            .chain(std::iter::repeat_n("d".to_owned(), levels))
            .collect();
        std::fs::create_dir_all(base.path().join(&deepest)).unwrap();
        let (source, dest, dest_dir) = roots(base.path());
        // As deep as the walk goes, and empty down there: copied whole.
        copy(&source, &dest, "whole").unwrap();
        assert!(dest_dir
            .join("whole")
            .join(deepest.strip_prefix("src").unwrap())
            .is_dir());
        // One entry more, below the last level the walk enters: refused.
        std::fs::write(base.path().join(&deepest).join("lost"), b"x").unwrap();
        let error = copy(&source, &dest, "cut").unwrap_err();
        assert!(
            error.to_string().contains("deeper than 256 levels"),
            "{error}"
        );
        assert!(!dest_dir.join("cut").exists());
    }

    #[test]
    fn a_symlink_points_outside_when_it_is_absolute_or_climbs_above_the_root() {
        for (link, target, outside) in [
            ("l", "/etc/passwd", true),
            ("l", "a", false),
            ("l", "..", true),
            ("l", "./../x", true),
            ("a/l", "../x", false),
            ("a/l", "../../x", true),
            ("a/b/l", "../../x", false),
            ("a/b/l", "../../../x", true),
            ("a/l", "x/../../y", false),
            ("l", "x/../../y", true),
            ("a/l", "x//./y", false),
        ] {
            assert_eq!(
                points_outside(OsStr::new(link), OsStr::new(target)),
                outside,
                "{link} -> {target}"
            );
        }
    }

    #[test]
    fn a_path_is_normalised_and_joined_as_bytes() {
        assert_eq!(normalise(OsStr::new("a//b/./c/")), "a/b/c");
        assert_eq!(normalise(OsStr::new("./")), "");
        assert_eq!(join(OsStr::new("a"), OsStr::new("")), "a");
        assert_eq!(join(OsStr::new("a"), OsStr::new("b/c")), "a/b/c");
        assert_eq!(join(OsStr::new(""), OsStr::new("b")), "b");
    }
}
