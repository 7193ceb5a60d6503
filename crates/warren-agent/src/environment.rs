//! What every command of every runtime starts from, whichever backend hosts it: the
//! sandbox user, the clean environment, and the few fixed numbers both sides agree on.

use std::collections::BTreeMap;

use warren_core::Layout;

/// The uid every command runs as (I11), whatever the layout.
pub const SANDBOX_UID: u32 = warren_core::SANDBOX_UID;
/// See [`SANDBOX_UID`].
pub const SANDBOX_GID: u32 = warren_core::SANDBOX_GID;

/// The descriptor number at which a container's agent keeps the layout's home open (when
/// it is ephemeral state, I30: not where the home is the persistent workdir), so the
/// provisioner can snapshot and seed it through `/proc/<agent>/fd/<n>`: resolved by the
/// agent inside the container, never through a path of the image's (which could hold
/// symlinks that mean something else on the host).
pub const HOME_FD: i32 = 201;

/// The loopback port inside a runtime where its egress proxy listens (network `open` or
/// `allowlist`); init hands each connection to the provisioner, which filters it.
pub const PROXY_PORT: u16 = 3128;

/// The clean environment every command of a runtime of `layout` starts from (I13, I14):
/// `HOME`, `USER` and `LOGNAME` name the layout's sandbox user (I7); the sandbox and call
/// environments are layered over it by the provisioner side.
pub fn base_environment(layout: &Layout) -> BTreeMap<String, String> {
    let (user, home) = (layout.user, layout.home);
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", home),
        ("USER", user),
        ("LOGNAME", user),
        ("SHELL", "/bin/sh"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("TERM", "dumb"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_core::LayoutName;

    #[test]
    fn the_environment_names_each_layouts_own_user_and_home() {
        for name in LayoutName::ALL {
            let layout = name.layout();
            let env = base_environment(layout);
            assert_eq!(env["USER"], layout.user, "{name}");
            assert_eq!(env["LOGNAME"], layout.user, "{name}");
            assert_eq!(env["HOME"], layout.home, "{name}");
        }
        let e2b = base_environment(LayoutName::E2b.layout());
        assert_eq!(
            (e2b["USER"].as_str(), e2b["HOME"].as_str()),
            ("user", "/home/user")
        );
        let ars = base_environment(LayoutName::Ars.layout());
        assert_eq!(
            (ars["USER"].as_str(), ars["HOME"].as_str()),
            ("gem", "/home/gem")
        );
    }
}
