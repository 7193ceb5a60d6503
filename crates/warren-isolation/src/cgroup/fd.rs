//! cgroupfs by descriptor: directories and files opened beneath a directory descriptor.

use super::*;

pub(super) fn is_gone(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(code) if code == Errno::NOENT.raw_os_error() || code == Errno::NODEV.raw_os_error()
    )
}

pub(super) fn open_dir<P: rustix::path::Arg>(parent: impl AsFd, path: P) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

pub(super) fn open_dir_optional<P: rustix::path::Arg>(
    parent: impl AsFd,
    path: P,
) -> io::Result<Option<OwnedFd>> {
    match open_dir(parent, path) {
        Ok(fd) => Ok(Some(fd)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// `mkdir` (existing is fine: reuse after a crash) and open.
pub(super) fn make_dir(parent: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    let mode = Mode::RWXU | Mode::RGRP | Mode::XGRP | Mode::ROTH | Mode::XOTH;
    match rustix::fs::mkdirat(parent, name, mode) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(errno) => return Err(errno.into()),
    }
    open_dir(parent, name)
}

pub(super) fn open_procs(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        "cgroup.procs",
        OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// One `write` of the whole value: cgroup files take each write as one command.
pub(super) fn write_fd(fd: BorrowedFd<'_>, data: &[u8]) -> Result<(), Errno> {
    loop {
        match rustix::io::write(fd, data) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(errno),
        }
    }
}

pub(super) fn write_file(dir: BorrowedFd<'_>, file: &str, data: &[u8]) -> io::Result<()> {
    let fd = rustix::fs::openat(dir, file, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(write_fd(fd.as_fd(), data)?)
}

pub(super) fn read_file(dir: BorrowedFd<'_>, file: &str) -> io::Result<String> {
    let fd = rustix::fs::openat(dir, file, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match rustix::io::read(&fd, &mut buf[..]) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(Errno::INTR) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
    String::from_utf8(out).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
}

pub(super) fn read_u64(dir: BorrowedFd<'_>, file: &str) -> Option<u64> {
    read_file(dir, file).ok()?.trim().parse().ok()
}

pub(super) fn file_exists(dir: BorrowedFd<'_>, file: &str) -> bool {
    rustix::fs::accessat(dir, file, Access::EXISTS, AtFlags::empty()).is_ok()
}

/// Names of the subdirectories (child cgroups) of `dir`.
pub(super) fn child_dirs(dir: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy();
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            // Some filesystems leave d_type out; cgroupfs fills it, but be safe.
            FileType::Unknown => {
                rustix::fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            }
            _ => false,
        };
        if is_dir {
            names.push(name.into_owned());
        }
    }
    Ok(names)
}
