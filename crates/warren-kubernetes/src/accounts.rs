//! `/etc/passwd` and `/etc/group` of warren's, for a pod whose layout's sandbox user images
//! do not name (I7, I11): E2B's `user`, home `/home/user`.
//!
//! A pod's accounts are its image's, and images for warren name the default sandbox user
//! `gem` at 1000:1000 (the ARS and DeerFlow layouts' user). A layout with another user gets
//! both files from warren instead, as on the Docker backend (warren-docker's `accounts.rs`):
//! `root`, `nobody` and the layout's user at 1000:1000 ([`warren_core::passwd_with`]), so
//! `whoami`, `id` and `~` agree with `USER` and `HOME`.
//!
//! No file of warren's host reaches a pod, so the prepare init container (root, warren's
//! image, [`crate::prepare`](mod@crate::prepare)) writes them into the pod's `accounts`
//! `emptyDir`, and the sandbox container mounts each file read-only by subPath at
//! `/etc/passwd` and `/etc/group`; nothing else of that volume is mounted in it, so the
//! sandbox can neither change them nor add to them. Chosen over a ConfigMap per pod: no
//! object beyond a sandbox's three (no Role rule for ConfigMaps, nothing more to adopt,
//! check or delete), and the bytes come from the same builder every backend uses.
//!
//! Known limit (as on Docker): the image's other system accounts are not listed for such a
//! layout.

use warren_core::Layout;

/// The accounts `emptyDir`'s files and where each appears in the sandbox container.
pub const FILES: [(&str, &str); 2] = [("passwd", "/etc/passwd"), ("group", "/etc/group")];

/// The size limit of the accounts `emptyDir`, bytes: two short text files.
pub const VOLUME_BYTES: u64 = 64 * 1024;

/// The accounts every such file lists besides the sandbox user (the same as Docker's).
const BASE_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                           nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const BASE_GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// Whether pods of `layout` get warren's accounts files: only a layout whose user is not
/// the one images name (the default layout's); the others keep the image's.
pub fn needed(layout: &Layout) -> bool {
    layout.user != Layout::ARS.user
}

/// The files' contents for `layout`, by the names in [`FILES`].
pub fn contents(layout: &Layout) -> [(&'static str, String); 2] {
    [
        (FILES[0].0, warren_core::passwd_with(BASE_PASSWD, layout)),
        (FILES[1].0, warren_core::group_with(BASE_GROUP, layout)),
    ]
}

#[cfg(test)]
mod tests {
    use warren_core::LayoutName;

    use super::*;

    #[test]
    fn only_a_layout_with_another_user_gets_warrens_accounts_naming_it_at_1000() {
        assert!(!needed(LayoutName::Ars.layout()));
        assert!(!needed(LayoutName::Deerflow.layout()));
        assert!(needed(LayoutName::E2b.layout()));
        let [(passwd_name, passwd), (group_name, group)] = contents(LayoutName::E2b.layout());
        assert_eq!((passwd_name, group_name), ("passwd", "group"));
        assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
        assert!(
            passwd.ends_with("user:x:1000:1000:user:/home/user:/bin/sh\n"),
            "I11: {passwd}"
        );
        assert_eq!(passwd.matches(":1000:").count(), 1, "{passwd}");
        assert!(group.ends_with("user:x:1000:\n"), "{group}");
    }
}
