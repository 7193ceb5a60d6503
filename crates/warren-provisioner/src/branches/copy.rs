//! Copies a branch's upper layer into a new branch's (a fork of a sandbox bound to a
//! branch): what the branch changed, as overlayfs keeps it, so the copy shows the same tree
//! over the same baseline. Costs what the branch changed, not the workdir.
//!
//! Every entry is reached from its directory's descriptor with no link followed: regular
//! files, directories with their `trusted.overlay.*` marks (an opaque directory stays
//! opaque), symbolic links as their text, and whiteouts (0/0 character devices, a deleted
//! path). Owners and permission bits are kept. Anything else (a fifo, a socket, another
//! device) is refused: an upper layer warren mounted never holds one a runtime could not
//! make, and no device is ever created from it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Deepest tree copied.
const MAX_DEPTH: usize = 512;

/// Copies the contents of directory `from` into the empty directory `to`.
pub(super) fn copy_upper(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    copy_dir(from, to, 0)
}

fn open_dir(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn copy_dir(from: BorrowedFd<'_>, to: BorrowedFd<'_>, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("the branch is deeper than a copy goes"));
    }
    for entry in rustix::fs::Dir::read_from(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let stat = rustix::fs::statat(from, name, AtFlags::SYMLINK_NOFOLLOW)?;
        let owner = (
            Some(rustix::fs::Uid::from_raw(stat.st_uid)),
            Some(rustix::fs::Gid::from_raw(stat.st_gid)),
        );
        let mode = Mode::from_raw_mode(stat.st_mode & 0o7777);
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                rustix::fs::mkdirat(to, name, Mode::from_raw_mode(0o700))?;
                let source = open_dir(from, name)?;
                let target = open_dir(to, name)?;
                copy_overlay_marks(source.as_fd(), target.as_fd())?;
                copy_dir(source.as_fd(), target.as_fd(), depth + 1)?;
                rustix::fs::fchown(&target, owner.0, owner.1)?;
                rustix::fs::fchmod(&target, mode)?;
            }
            FileType::RegularFile => {
                let source = rustix::fs::openat(
                    from,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let target = rustix::fs::openat(
                    to,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                copy_overlay_marks(source.as_fd(), target.as_fd())?;
                let mut reader = std::fs::File::from(source);
                let mut writer = std::fs::File::from(target);
                io::copy(&mut reader, &mut writer)?;
                rustix::fs::fchown(&writer, owner.0, owner.1)?;
                rustix::fs::fchmod(&writer, mode)?;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(from, name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), to, name)?;
                rustix::fs::chownat(to, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)?;
            }
            // A whiteout: the path is deleted in the branch.
            FileType::CharacterDevice if stat.st_rdev == 0 => {
                rustix::fs::mknodat(to, name, FileType::CharacterDevice, Mode::empty(), 0)?;
                rustix::fs::chownat(to, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)?;
            }
            _ => {
                return Err(io::Error::other(format!(
                    "the branch holds a special file ({:?}), which is never copied",
                    name
                )))
            }
        }
    }
    Ok(())
}

/// Copies overlayfs's own marks (`trusted.overlay.*`: opaque directories, redirects).
fn copy_overlay_marks(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let mut names = vec![0u8; 4096];
    let length = match rustix::fs::flistxattr(from, &mut names[..]) {
        Ok(length) => length,
        Err(rustix::io::Errno::NOTSUP) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    for name in names[..length].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if !name.starts_with(b"trusted.overlay.") {
            continue;
        }
        let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
        let mut value = vec![0u8; 4096];
        let size = rustix::fs::fgetxattr(from, name.as_c_str(), &mut value[..])?;
        rustix::fs::fsetxattr(
            to,
            name.as_c_str(),
            &value[..size],
            rustix::fs::XattrFlags::empty(),
        )?;
    }
    Ok(())
}
