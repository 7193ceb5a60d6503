//! A runtime's home as a tar stream, both ways, by descriptor: how a runtime snapshot of
//! `/home/gem` reaches warren where no host path to it exists (a pod), and how a resumed
//! runtime gets it back (I30).
//!
//! [`archive`] walks a directory from its descriptor (`openat` with `O_NOFOLLOW` at every
//! step, never crossing into another mount: the layout's persistent mounts inside the home
//! are not entered) and writes directories, regular files and symlinks (as themselves);
//! other kinds are left out, as the snapshot engine leaves them out. [`restore`] reads such
//! a stream into a directory, again only by descriptor: every name one plain component at a
//! time (no `..`, no absolute path, no empty name), parents opened with `O_NOFOLLOW`, files
//! created `O_EXCL`, so no entry can write outside the directory or through a link, whoever
//! made the stream; hard links, devices and FIFOs are never made, and no set-user-ID,
//! set-group-ID or sticky bit is kept. Both count what they moved and stop at a byte limit.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// What moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Entries written or restored.
    pub entries: u64,
    /// Bytes of file data.
    pub bytes: u64,
    /// Entries left out: unreadable files, kinds a snapshot does not keep.
    pub skipped: u64,
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("the home holds more than {limit} bytes of file data"),
    )
}

/// Writes the tree under `root` to `out` as tar, at most `limit` bytes of file data.
pub fn archive(root: BorrowedFd<'_>, out: impl Write, limit: u64) -> io::Result<Moved> {
    let dev = rustix::fs::fstat(root)?.st_dev;
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut moved = Moved::default();
    let root = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    walk(
        &mut builder,
        &root,
        PathBuf::new(),
        dev,
        limit,
        &mut moved,
        0,
    )?;
    builder.into_inner()?.flush()?;
    Ok(moved)
}

/// Deeper than any home warren keeps (warren-fs refuses the same).
const MAX_DEPTH: usize = 256;

fn walk<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &OwnedFd,
    path: PathBuf,
    dev: u64,
    limit: u64,
    moved: &mut Moved,
    depth: usize,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("the home is nested too deep"));
    }
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    names.sort();
    for name in names {
        let name = OsStr::from_bytes(&name);
        let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Gone meanwhile.
            Err(rustix::io::Errno::NOENT) => continue,
            Err(error) => return Err(error.into()),
        };
        let entry_path = path.join(name);
        let mut header = tar::Header::new_gnu();
        header.set_mode(stat.st_mode & 0o7777);
        header.set_mtime(stat.st_mtime.max(0) as u64);
        header.set_uid(u64::from(stat.st_uid));
        header.set_gid(u64::from(stat.st_gid));
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                // A mount inside the home (the layout's persistent mounts) is not the home.
                if stat.st_dev != dev {
                    continue;
                }
                let child = match rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(child) => child,
                    // A directory the sandbox user made unreadable to itself.
                    Err(rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) => {
                        moved.skipped += 1;
                        continue;
                    }
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(error) => return Err(error.into()),
                };
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, &entry_path, io::empty())?;
                moved.entries += 1;
                walk(builder, &child, entry_path, dev, limit, moved, depth + 1)?;
            }
            FileType::RegularFile => {
                let file = match rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                    Mode::empty(),
                ) {
                    Ok(file) => file,
                    // A file the sandbox user made unreadable to itself.
                    Err(rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) => {
                        moved.skipped += 1;
                        continue;
                    }
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(error) => return Err(error.into()),
                };
                let size = rustix::fs::fstat(&file)?.st_size.max(0) as u64;
                moved.bytes += size;
                if moved.bytes > limit {
                    return Err(too_large(limit));
                }
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(size);
                // Exactly `size` bytes go in, whatever the file does meanwhile.
                let data = std::fs::File::from(file)
                    .take(size)
                    .chain(io::repeat(0))
                    .take(size);
                builder.append_data(&mut header, &entry_path, data)?;
                moved.entries += 1;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder.append_link(
                    &mut header,
                    &entry_path,
                    Path::new(OsStr::from_bytes(target.to_bytes())),
                )?;
                moved.entries += 1;
            }
            _ => moved.skipped += 1,
        }
    }
    Ok(())
}

/// Reads a tar stream into the directory `root` (which should be empty), at most `limit`
/// bytes of file data. Entries of other kinds (hard links, devices, FIFOs) are skipped.
pub fn restore(root: BorrowedFd<'_>, input: impl Read, limit: u64) -> io::Result<Moved> {
    let mut archive = tar::Archive::new(input);
    let mut moved = Moved::default();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let names = plain_components(&path)?;
        let Some((last, parents)) = names.split_last() else {
            continue;
        };
        let parent = open_parents(root, parents)?;
        // Permission bits only: no set-user-ID, set-group-ID or sticky bit comes from a
        // stream (warren unpacks one as root on its host).
        let mode = Mode::from_raw_mode(entry.header().mode()? & 0o777);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                match rustix::fs::mkdirat(&parent, last.as_os_str(), Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(error) => return Err(error.into()),
                }
                let dir = rustix::fs::openat(
                    &parent,
                    last.as_os_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                rustix::fs::fchmod(&dir, mode)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                moved.bytes += entry.header().size()?;
                if moved.bytes > limit {
                    return Err(too_large(limit));
                }
                let file = rustix::fs::openat(
                    &parent,
                    last.as_os_str(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                let mut file = std::fs::File::from(file);
                io::copy(&mut entry, &mut file)?;
                rustix::fs::fchmod(&file, mode)?;
                let mtime = entry.header().mtime().unwrap_or(0) as i64;
                let time = rustix::fs::Timespec {
                    tv_sec: mtime,
                    tv_nsec: 0,
                };
                let _ = rustix::fs::futimens(
                    &file,
                    &rustix::fs::Timestamps {
                        last_access: time,
                        last_modification: time,
                    },
                );
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name()?.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "a symlink with no target")
                })?;
                // The target is only data: it is never followed here.
                rustix::fs::symlinkat(target.as_os_str(), &parent, last.as_os_str())?;
            }
            _ => {
                moved.skipped += 1;
                continue;
            }
        }
        moved.entries += 1;
    }
    Ok(moved)
}

/// The names of a relative path made only of plain components.
fn plain_components(path: &Path) -> io::Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) if !name.is_empty() => names.push(PathBuf::from(name)),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("an entry outside the directory: {}", path.display()),
                ))
            }
        }
    }
    Ok(names)
}

/// Opens (making the missing ones) the directories `parents` beneath `root`, never
/// following a link.
fn open_parents(root: BorrowedFd<'_>, parents: &[PathBuf]) -> io::Result<OwnedFd> {
    let mut dir = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    for name in parents {
        let open = |dir: &OwnedFd| {
            rustix::fs::openat(
                dir,
                name.as_os_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        };
        dir = match open(&dir) {
            Ok(next) => next,
            Err(rustix::io::Errno::NOENT) => {
                rustix::fs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(0o700))?;
                open(&dir)?
            }
            Err(error) => return Err(error.into()),
        };
    }
    Ok(dir)
}

/// Opens a directory to archive or restore into, without following a link at its end.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The runtime's home as the agent keeps it: the directory opened at its start and held at
/// [`crate::environment::HOME_FD`] (inherited by its children), opened again through it,
/// so no path of the home's is resolved now.
pub fn open_kept_home() -> io::Result<OwnedFd> {
    let kept = format!("/proc/self/fd/{}", crate::environment::HOME_FD);
    Ok(rustix::fs::open(
        kept.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn tree(dir: &Path) {
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/file"), b"content").unwrap();
        std::fs::write(dir.join("top"), b"x".repeat(100_000)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        std::os::unix::fs::symlink("a", dir.join("dirlink")).unwrap();
    }

    #[test]
    fn a_tree_goes_through_tar_and_back_with_links_as_links() {
        let source = tempfile::tempdir().unwrap();
        tree(source.path());
        let mut stream = Vec::new();
        let written = archive(
            open_dir(source.path()).unwrap().as_fd(),
            &mut stream,
            u64::MAX,
        )
        .unwrap();
        assert_eq!(written.entries, 6);
        assert_eq!(written.bytes, 100_007);
        let target = tempfile::tempdir().unwrap();
        let read = restore(
            open_dir(target.path()).unwrap().as_fd(),
            stream.as_slice(),
            u64::MAX,
        )
        .unwrap();
        assert_eq!(read.entries, 6);
        assert_eq!(
            std::fs::read(target.path().join("a/b/file")).unwrap(),
            b"content"
        );
        assert_eq!(
            std::fs::read(target.path().join("top")).unwrap().len(),
            100_000
        );
        assert_eq!(
            std::fs::read_link(target.path().join("link")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(std::fs::symlink_metadata(target.path().join("dirlink"))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn the_byte_limit_stops_both_ways() {
        let source = tempfile::tempdir().unwrap();
        tree(source.path());
        let refused = archive(open_dir(source.path()).unwrap().as_fd(), Vec::new(), 1000);
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        let mut stream = Vec::new();
        archive(
            open_dir(source.path()).unwrap().as_fd(),
            &mut stream,
            u64::MAX,
        )
        .unwrap();
        let target = tempfile::tempdir().unwrap();
        let refused = restore(
            open_dir(target.path()).unwrap().as_fd(),
            stream.as_slice(),
            1000,
        );
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::FileTooLarge);
    }

    /// A hand-made stream with one entry named `name` (bypassing tar's own path checks).
    fn stream_with(name: &[u8], kind: tar::EntryType, link: Option<&str>) -> Vec<u8> {
        let mut header = tar::Header::new_gnu();
        {
            let gnu = header.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name);
        }
        header.set_entry_type(kind);
        header.set_mode(0o644);
        header.set_size(if kind == tar::EntryType::Regular {
            4
        } else {
            0
        });
        if let Some(link) = link {
            header.set_link_name(link).unwrap();
        }
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        if kind == tar::EntryType::Regular {
            let mut block = [0u8; 512];
            block[..4].copy_from_slice(b"evil");
            out.extend_from_slice(&block);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn no_entry_writes_outside_or_through_a_link() {
        let outside = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let root = open_dir(target.path()).unwrap();
        for name in [b"../escape".as_slice(), b"/abs/escape", b"a/../../escape"] {
            let stream = stream_with(name, tar::EntryType::Regular, None);
            assert!(
                restore(root.as_fd(), stream.as_slice(), u64::MAX).is_err(),
                "{name:?}"
            );
        }
        // A symlink planted first, then a file through it: refused, nothing outside.
        std::os::unix::fs::symlink(outside.path(), target.path().join("out")).unwrap();
        let stream = stream_with(b"out/escape", tar::EntryType::Regular, None);
        assert!(restore(root.as_fd(), stream.as_slice(), u64::MAX).is_err());
        // A file over an existing symlink: O_EXCL refuses it.
        std::os::unix::fs::symlink(outside.path().join("f"), target.path().join("f")).unwrap();
        let stream = stream_with(b"f", tar::EntryType::Regular, None);
        assert!(restore(root.as_fd(), stream.as_slice(), u64::MAX).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // Hard links and devices are skipped, never made.
        let stream = stream_with(b"hard", tar::EntryType::Link, Some("/etc/shadow"));
        let moved = restore(root.as_fd(), stream.as_slice(), u64::MAX).unwrap();
        assert_eq!((moved.entries, moved.skipped), (0, 1));
        assert!(!target.path().join("hard").exists());
    }

    #[test]
    fn a_mount_inside_the_tree_is_not_entered() {
        let source = tempfile::tempdir().unwrap();
        tree(source.path());
        std::fs::create_dir(source.path().join("mnt")).unwrap();
        let path = source.path().to_owned();
        // In a mount namespace of this thread's own (root needed), as the layout's
        // persistent mounts sit inside a runtime's home.
        let moved = std::thread::spawn(move || {
            crate::sys::unshare(rustix::thread::UnshareFlags::NEWNS)
                .expect("a mount namespace of the test's own (the test needs root)");
            rustix::mount::mount_change(
                "/",
                rustix::mount::MountPropagationFlags::PRIVATE
                    | rustix::mount::MountPropagationFlags::REC,
            )
            .unwrap();
            rustix::mount::mount(
                "tmpfs",
                path.join("mnt"),
                "tmpfs",
                rustix::mount::MountFlags::empty(),
                None,
            )
            .unwrap();
            std::fs::write(path.join("mnt/inside-the-mount"), b"not the home's").unwrap();
            let mut stream = Vec::new();
            let moved = archive(open_dir(&path).unwrap().as_fd(), &mut stream, u64::MAX).unwrap();
            let names: Vec<String> = tar::Archive::new(stream.as_slice())
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().display().to_string())
                .collect();
            (moved, names)
        })
        .join()
        .unwrap();
        assert_eq!(moved.0.entries, 6, "{:?}", moved.1);
        assert!(
            moved.1.iter().all(|n| !n.starts_with("mnt")),
            "{:?}",
            moved.1
        );
    }
}
