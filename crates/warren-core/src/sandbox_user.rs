//! The sandbox user as `/etc/passwd` and `/etc/group` name it (I7, I11).
//!
//! Every layout runs commands as 1000:1000; only the name and home differ (`gem` and
//! `/home/gem`, or E2B's `user` and `/home/user`). Backends that give a runtime its
//! `/etc/passwd` and `/etc/group` (the local backend's host profile, Docker's files for a
//! layout whose user an image does not name) build them here from a base text, so
//! `whoami`, `id` and `~` agree with `USER` and `HOME`.

use crate::Layout;

/// The uid every command runs as (I11), in every layout.
pub const SANDBOX_UID: u32 = 1000;
/// The gid every command runs as (I11), in every layout.
pub const SANDBOX_GID: u32 = 1000;

/// `base` (a passwd file's text, possibly empty) with the layout's sandbox user: every
/// line naming that user or uid 1000 is dropped, password fields become `x` (never a
/// hash, even a legacy one kept in passwd), and the user's own line is added last.
pub fn passwd_with(base: &str, layout: &Layout) -> String {
    let user = layout.user;
    let line = format!(
        "{user}:x:{SANDBOX_UID}:{SANDBOX_GID}:{user}:{}:/bin/sh",
        layout.home
    );
    merged(base, user, SANDBOX_UID, &line)
}

/// `base` (a group file's text, possibly empty) with the sandbox user's group: every line
/// naming that group or gid 1000 is dropped, and the group's own line is added last.
pub fn group_with(base: &str, layout: &Layout) -> String {
    let user = layout.user;
    merged(base, user, SANDBOX_GID, &format!("{user}:x:{SANDBOX_GID}:"))
}

fn merged(base: &str, name: &str, id: u32, own: &str) -> String {
    let id = id.to_string();
    let mut lines: Vec<String> = base
        .lines()
        .filter(|line| !line.trim().is_empty())
        .filter(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            fields.first() != Some(&name) && fields.get(2) != Some(&id.as_str())
        })
        .map(|line| {
            let mut fields: Vec<&str> = line.split(':').collect();
            if fields.len() > 1 {
                fields[1] = "x";
            }
            fields.join(":")
        })
        .collect();
    lines.push(own.to_owned());
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LayoutName;

    const HOST: &str = "root:$1$legacy:0:0:root:/root:/bin/bash\n\
                        gem:x:1000:1000::/home/gem:/bin/bash\n\
                        user:x:1001:1001::/home/user:/bin/bash\n\
                        nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n";

    #[test]
    fn each_layout_names_its_own_user_at_1000() {
        let ars = passwd_with(HOST, LayoutName::Ars.layout());
        assert!(
            ars.ends_with("gem:x:1000:1000:gem:/home/gem:/bin/sh\n"),
            "{ars}"
        );
        assert!(ars.contains("root:x:0:0:root:/root:/bin/bash"), "{ars}");
        assert!(!ars.contains("$1$"), "{ars}");
        assert!(
            ars.contains("user:x:1001"),
            "another uid's line stays: {ars}"
        );
        let e2b = passwd_with(HOST, LayoutName::E2b.layout());
        assert!(
            e2b.ends_with("user:x:1000:1000:user:/home/user:/bin/sh\n"),
            "{e2b}"
        );
        assert!(!e2b.contains("gem:"), "uid 1000 is user's alone: {e2b}");
        assert!(!e2b.contains(":1001:"), "the name is user's alone: {e2b}");
        assert_eq!(e2b.matches(":1000:").count(), 1, "{e2b}");
        assert!(e2b.contains("nobody:x:65534"), "{e2b}");
        let group = group_with(
            "root:x:0:\ngem:x:1000:\nstaff:x:50:gem\n",
            LayoutName::E2b.layout(),
        );
        assert_eq!(group, "root:x:0:\nstaff:x:50:gem\nuser:x:1000:\n");
        assert_eq!(
            passwd_with("", LayoutName::E2b.layout()),
            "user:x:1000:1000:user:/home/user:/bin/sh\n"
        );
    }
}
