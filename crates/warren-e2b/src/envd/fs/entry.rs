//! `EntryInfo` exactly as the SDKs read it (`map_entry_info` in Python, `mapEntryInfo` in
//! JS): name, type, absolute in-runtime path, size, permission bits, Go's mode string,
//! owner and group names, modification time and symlink target.

use warren_core::VirtualPath;
use warren_fs::{Entry, Kind};

use crate::envd::proto::filesystem::{EntryInfo, FileType};

/// The uid and gid of the sandbox user (I11), named `user` in E2B's template.
const SANDBOX_ID: u32 = 1000;

/// An entry the file layer reported, under the virtual path it was asked about (`base`):
/// the entry's tree-relative path is rebased onto `base`'s mount, so `path` is what the
/// runtime shows (`/home/user/...`) and never a host path (I1).
pub(crate) fn entry_info(base: &VirtualPath, entry: &Entry) -> EntryInfo {
    let path = base.rebase(&entry.path).to_string();
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    let seconds = entry.modified_unix_ms.div_euclid(1000);
    // In 0..1000 ms, so the nanoseconds fit an i32.
    let nanos = i32::try_from(entry.modified_unix_ms.rem_euclid(1000) * 1_000_000).unwrap_or(0);
    EntryInfo {
        name,
        r#type: file_type(entry.kind) as i32,
        path,
        size: i64::try_from(entry.size).unwrap_or(i64::MAX),
        // envd reports `FileMode.Perm()`: the permission bits only (`0o644`, not
        // `0o100644`); the SDK tests compare it with `0o644`.
        mode: entry.mode & 0o777,
        permissions: permissions(entry.kind, entry.mode),
        owner: account_name(entry.uid),
        group: account_name(entry.gid),
        modified_time: Some(pbjson_types::Timestamp { seconds, nanos }),
        symlink_target: entry.symlink_target.clone(),
        metadata: Default::default(),
        // Newer SDKs take `is_symlink` over `type`; older ones read `type`, which says
        // SYMLINK too, since warren never follows a link to learn its target's type (I2).
        is_symlink: entry.kind == Kind::Symlink,
    }
}

/// The wire type of an entry. Fifos, sockets and devices have no type of their own in
/// envd's enum; the SDKs skip unspecified entries in listings.
pub(crate) fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::File,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Other => FileType::Unspecified,
    }
}

/// The name of a uid or gid as the runtime's `/etc/passwd` has it: E2B's template knows
/// `root` (0) and `user` (1000); any other id is shown as its number, as `ls -l` does.
pub(crate) fn account_name(id: u32) -> String {
    match id {
        0 => "root".to_owned(),
        SANDBOX_ID => super::SANDBOX_USER.to_owned(),
        other => other.to_string(),
    }
}

/// The mode as envd prints it: Go's `os.FileMode.String()`, which is `ls -l`'s for files
/// and directories (`-rw-r--r--`, `drwxr-xr-x`) but spells a symlink `L`, prefixes the
/// setuid, setgid and sticky bits as `u`, `g` and `t` instead of folding them into the
/// `x` columns, and marks an object of unknown type `?` (warren's `Kind::Other` does not
/// say whether it is a fifo, a socket or a device).
pub(crate) fn permissions(kind: Kind, mode: u32) -> String {
    let mut text = String::with_capacity(12);
    match kind {
        Kind::Dir => text.push('d'),
        Kind::Symlink => text.push('L'),
        Kind::File => {}
        Kind::Other => text.push('?'),
    }
    // Go's order of the type letters: ...u (setuid), g (setgid), ... t (sticky).
    if mode & 0o4000 != 0 {
        text.push('u');
    }
    if mode & 0o2000 != 0 {
        text.push('g');
    }
    if mode & 0o1000 != 0 {
        text.push('t');
    }
    if text.is_empty() {
        text.push('-');
    }
    for (shift, letter) in (0..9).rev().zip("rwxrwxrwx".chars()) {
        text.push(if mode & (1 << shift) != 0 {
            letter
        } else {
            '-'
        });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_as_envd_prints_them() {
        assert_eq!(permissions(Kind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(Kind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(Kind::File, 0o600), "-rw-------");
        assert_eq!(permissions(Kind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(Kind::File, 0o4755), "urwxr-xr-x");
        assert_eq!(permissions(Kind::Dir, 0o1777), "dtrwxrwxrwx");
        assert_eq!(permissions(Kind::Other, 0o640), "?rw-r-----");
    }

    #[test]
    fn owners_are_named_as_the_template_names_them() {
        assert_eq!(account_name(1000), "user");
        assert_eq!(account_name(0), "root");
        assert_eq!(account_name(1234), "1234");
    }

    fn file(path: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            os_path: path.into(),
            kind: Kind::File,
            size: 5,
            mode: 0o644,
            modified_unix_ms: 1_700_000_000_250,
            modified_unix_ns: 1_700_000_000_250_000_000,
            uid: 1000,
            gid: 1000,
            symlink_target: None,
            os_symlink_target: None,
            inode: 7,
            links: 1,
            changed_unix_ns: 0,
        }
    }

    #[test]
    fn an_entry_shows_its_in_runtime_path_and_its_owner() {
        let workdir = warren_core::Workdir::new("e2b/abc").unwrap();
        let base =
            VirtualPath::parse("/home/user/dir", &warren_core::Layout::E2B, &[], &workdir).unwrap();
        let info = entry_info(&base, &file("e2b/abc/dir/a.txt"));
        assert_eq!(info.path, "/home/user/dir/a.txt");
        assert_eq!(info.name, "a.txt");
        assert_eq!(info.r#type, FileType::File as i32);
        assert_eq!((info.size, info.mode), (5, 0o644));
        assert_eq!(info.permissions, "-rw-r--r--");
        assert_eq!((info.owner.as_str(), info.group.as_str()), ("user", "user"));
        let time = info.modified_time.unwrap();
        assert_eq!((time.seconds, time.nanos), (1_700_000_000, 250_000_000));
        assert!(!info.is_symlink && info.symlink_target.is_none());
    }
}
