//! What every command of every runtime starts from, whichever backend hosts it: the
//! sandbox user, the clean environment, and the few fixed numbers both sides agree on.

use std::collections::BTreeMap;

use warren_core::LayoutName;

/// The uid and gid every command runs as (I11).
pub const SANDBOX_UID: u32 = 1000;
/// See [`SANDBOX_UID`].
pub const SANDBOX_GID: u32 = 1000;

/// The sandbox user's name and home. Every layout has the same ones (a test holds them
/// to it): the host profile's `/etc/passwd` is built once for all runtimes, so a layout
/// with another user or home would need a profile of its own.
pub fn sandbox_user() -> (&'static str, &'static str) {
    let layout = LayoutName::default().layout();
    (layout.user, layout.home)
}

/// The descriptor number at which a container's agent keeps `/home/gem` open, so the
/// provisioner can snapshot and seed it through `/proc/<agent>/fd/<n>`: resolved by the
/// agent inside the container, never through a path of the image's (which could hold
/// symlinks that mean something else on the host).
pub const HOME_FD: i32 = 201;

/// The loopback port inside a runtime where its egress proxy listens (network `open` or
/// `allowlist`); init hands each connection to the provisioner, which filters it.
pub const PROXY_PORT: u16 = 3128;

/// The clean environment every command starts from (I13, I14); the sandbox and call
/// environments are layered over it by the provisioner side.
pub fn base_environment() -> BTreeMap<String, String> {
    let (user, home) = sandbox_user();
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

    #[test]
    fn every_layout_has_the_one_sandbox_user_the_host_profile_names() {
        for name in LayoutName::ALL {
            let layout = name.layout();
            assert_eq!((layout.user, layout.home), sandbox_user(), "{name}");
        }
        let env = base_environment();
        assert_eq!((env["USER"].as_str(), env["HOME"].as_str()), sandbox_user());
    }
}
