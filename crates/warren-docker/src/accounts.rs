//! `/etc/passwd` and `/etc/group` of warren's, for layouts whose sandbox user an image
//! does not name (I7, I11).
//!
//! A container's accounts are its image's: images for warren name the default sandbox
//! user `gem` at 1000:1000 (the ARS and DeerFlow layouts' user). A layout with another
//! user (E2B's `user`, home `/home/user`) gets both files from warren instead, bound
//! read-only over the image's: `root`, `nobody` and the layout's user at 1000:1000
//! ([`warren_core::passwd_with`]), so `whoami`, `id` and `~` agree with `USER` and
//! `HOME`. The files are written once per layout under `<data>/docker/accounts/<layout>`
//! (a tree of warren's, by its path, like the agent bundle) and never change while a
//! container uses them: the same layout always gets the same bytes.
//!
//! Known limit: the image's other system accounts are not listed for such a layout.

use std::path::{Path, PathBuf};

use warren_core::{Layout, LayoutName};

/// Where the accounts file goes inside the container.
pub(crate) const PASSWD_MOUNT: &str = "/etc/passwd";
/// See [`PASSWD_MOUNT`].
pub(crate) const GROUP_MOUNT: &str = "/etc/group";

/// The accounts every such file lists besides the sandbox user.
const BASE_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                           nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const BASE_GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// Whether containers of `layout` get warren's accounts files: only a layout whose user
/// is not the one images name (the default layout's); the others keep the image's.
pub(crate) fn needed(layout: &Layout) -> bool {
    layout.user != Layout::ARS.user
}

/// The host files bound for `layout` (source, target), empty when the image's serve.
pub(crate) fn binds(root: &Path, layout: LayoutName) -> Vec<(PathBuf, &'static str)> {
    if !needed(layout.layout()) {
        return Vec::new();
    }
    let dir = root.join(layout.as_str());
    vec![
        (dir.join("passwd"), PASSWD_MOUNT),
        (dir.join("group"), GROUP_MOUNT),
    ]
}

/// Writes the files of every layout that needs them under `root` (world-readable, so the
/// sandbox user can read them; written beside and renamed into place).
pub(crate) fn write_all(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for name in LayoutName::ALL {
        let layout = name.layout();
        if !needed(layout) {
            continue;
        }
        let dir = root.join(name.as_str());
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        for (file, content) in [
            ("passwd", warren_core::passwd_with(BASE_PASSWD, layout)),
            ("group", warren_core::group_with(BASE_GROUP, layout)),
        ] {
            let target = dir.join(file);
            if std::fs::read(&target).is_ok_and(|old| old == content.as_bytes()) {
                continue;
            }
            let staging = dir.join(format!(".{file}.{}", std::process::id()));
            std::fs::write(&staging, content)?;
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o644))?;
            std::fs::rename(&staging, &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_layout_with_another_user_gets_warrens_accounts() {
        let root = tempfile::tempdir().unwrap();
        write_all(root.path()).unwrap();
        assert!(binds(root.path(), LayoutName::Ars).is_empty());
        assert!(binds(root.path(), LayoutName::Deerflow).is_empty());
        let e2b = binds(root.path(), LayoutName::E2b);
        assert_eq!(
            e2b.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
            [PASSWD_MOUNT, GROUP_MOUNT]
        );
        let passwd = std::fs::read_to_string(&e2b[0].0).unwrap();
        assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
        assert!(
            passwd.ends_with("user:x:1000:1000:user:/home/user:/bin/sh\n"),
            "{passwd}"
        );
        let group = std::fs::read_to_string(&e2b[1].0).unwrap();
        assert!(group.ends_with("user:x:1000:\n"), "{group}");
        write_all(root.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&e2b[0].0).unwrap(), passwd);
    }
}
