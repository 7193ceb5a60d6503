//! What envd's file surfaces (`filesystem.Filesystem` and `/files`) share: the paths and
//! users a request may name, the provisioner's failures as envd's errors, `EntryInfo`,
//! signed URLs, upload bodies and the snapshots directory watches diff.
//!
//! Every path goes to the provisioner's file functions as the client wrote it (after `~`
//! expansion), by the sandbox's warren id: the provisioner parses it against the sandbox's
//! layout and `warren-fs` resolves it by descriptor beneath the mount's tree, so a `..`, a
//! planted symlink or a path outside `/home/user` is refused there, exactly as on the
//! native API (I2). Nothing here resolves or checks host paths.

pub(crate) mod entry;
pub(crate) mod signature;
#[cfg(test)]
mod smoke_tests;
pub(crate) mod upload;

use warren_fs::FsError;
use warren_provisioner::ProvisionerError;

use super::connect::{Code, ConnectError};
use crate::E2bError;

/// The sandbox user's home, where relative paths start: the E2B layout shows the
/// sandbox's workdir there, so a relative path is the workdir's (`VirtualPath::parse`).
pub(crate) const HOME: &str = warren_core::Layout::E2B.home;

/// The sandbox user (uid and gid 1000, I11): the only user whose files exist.
pub(crate) const SANDBOX_USER: &str = warren_core::Layout::E2B.user;

/// The path a client wrote, with envd's `~` expansion: `~` and `~/…` name the home.
///
/// Only the tilde is rewritten; everything else reaches the provisioner's parser untouched,
/// which refuses what it must (I2).
pub(crate) fn expand_home(path: &str) -> String {
    match path.strip_prefix('~') {
        Some("") => HOME.to_owned(),
        Some(rest) if rest.starts_with('/') => format!("{HOME}{rest}"),
        _ => path.to_owned(),
    }
}

/// Why a user named by a request is not one envd knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user {0:?} does not exist in the sandbox (only `user` and `root` do)")]
pub(crate) struct UnknownUser(pub(crate) String);

/// Checks the user a request acts as. E2B's template has `user` (the default) and `root`;
/// both reach the same files, which belong to the sandbox user whoever asks (I11), so the
/// name only has to exist, as envd's user lookup demands.
pub(crate) fn check_user(user: Option<&str>) -> Result<(), UnknownUser> {
    match user {
        None | Some("") | Some("user") | Some("root") => Ok(()),
        Some(other) => Err(UnknownUser(crate::error::shorten(other))),
    }
}

/// A provisioner failure as envd's Connect error: the codes the SDKs branch on
/// (`not_found` → `FileNotFoundException`, `already_exists` → `make_dir` answering false).
/// The message is `public_message()`: virtual paths only, never a host path (I1).
pub(crate) fn connect_error(error: ProvisionerError) -> ConnectError {
    match &error {
        ProvisionerError::File {
            source: FsError::AlreadyExists { .. },
            ..
        } => ConnectError::new(Code::AlreadyExists, error.public_message()),
        _ => E2bError::Provisioner(error).into_connect(),
    }
}

/// Whether a provisioner failure says the path does not exist.
pub(crate) fn is_not_found(error: &ProvisionerError) -> bool {
    matches!(
        error,
        ProvisionerError::File {
            source: FsError::NotFound { .. },
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tilde_names_the_home_and_nothing_else_is_rewritten() {
        assert_eq!(expand_home("~"), "/home/user");
        assert_eq!(expand_home("~/a/b"), "/home/user/a/b");
        assert_eq!(expand_home("~root/x"), "~root/x");
        assert_eq!(expand_home("a/../b"), "a/../b");
        assert_eq!(expand_home("/etc/passwd"), "/etc/passwd");
    }

    #[test]
    fn only_the_template_users_exist() {
        assert!(check_user(None).is_ok());
        assert!(check_user(Some("user")).is_ok());
        assert!(check_user(Some("root")).is_ok());
        assert!(check_user(Some("mallory")).is_err());
    }
}
