//! Domain types of warren: who owns files, where they live, and which runtime a run uses.
//!
//! This crate is pure: no I/O, no async runtime. Every other crate builds on these types, so
//! a value that exists here has already passed the rules the seed documents set
//! (I3, I4, I5, I7, I8, I9). Checks that need the filesystem (a workdir must *exist*, no
//! component may be a symlink) happen in `warren-fs`, by file descriptor.

#![deny(missing_docs)]

mod binding;
mod branch;
mod data_dir;
mod egress;
mod env;
mod extra_mount;
mod identity;
mod isolation_tier;
mod layout;
mod network;
mod sandbox_user;
mod scope;
mod token;
mod virtual_path;
mod workdir;

pub use binding::{BackendKind, Binding, BindingPart};
pub use branch::BranchName;
pub use data_dir::DataLayout;
pub use egress::{
    check_source_name, placeholder, EgressEvent, EgressSecret, EgressVerdict, Presentation,
    SecretName, SecretRule, SecretTarget, MAX_EGRESS_SECRETS, MAX_SECRET_TARGETS,
    MAX_SECRET_VALUE_BYTES, PLACEHOLDER_PREFIX, SECRET_ENV_PREFIX,
};
pub use env::{
    check_env_name, check_env_value, AgentEnvVar, MaskingStream, SecretMasker, MAX_AGENT_ENV_VARS,
    MAX_ENV_NAME_BYTES, MAX_ENV_VALUE_BYTES, MIN_SECRET_BYTES,
};
pub use extra_mount::{view_mounts, ExtraMount, ViewMount, EXTRA_MOUNT_PARENT, MAX_EXTRA_MOUNTS};
pub use identity::{RuntimeScope, SafeUid, SandboxId, Uid};
pub use isolation_tier::IsolationTier;
pub use layout::{Layout, LayoutMount, LayoutName, MountSource, VirtualRoot, PERSONAL_SKILLS};
pub use network::{embedded_ipv4, is_internal, NetworkPolicy};
pub use sandbox_user::{group_with, passwd_with, SANDBOX_GID, SANDBOX_UID};
pub use scope::{IsolationScope, RunContext, ScopedIdentity};
pub use token::TokenFinder;
pub use virtual_path::{roots as mount_roots, VirtualPath, SKILLS_MOUNT, USER_DATA_MOUNT};
pub use workdir::{within, Workdir};

/// Why a value was refused by the domain rules.
///
/// Messages are lowercase sentences a person (or an agent) can act on; they never contain a
/// host path (I1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// The uid is empty or too long to be a user id.
    #[error("invalid uid {uid:?}: {reason}")]
    InvalidUid {
        /// The refused uid (possibly shortened).
        uid: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A uid named directly by a client starts with a prefix reserved for owners that
    /// isolation scopes derive (I29).
    #[error(
        "uid {uid:?} starts with {prefix:?}, which is reserved for owners that an isolation \
         scope derives; choose another uid, or reach that owner through its scope"
    )]
    ReservedUid {
        /// The refused uid (possibly shortened).
        uid: String,
        /// The reserved prefix it starts with.
        prefix: &'static str,
    },
    /// The runtime scope id is empty, too long or contains control characters.
    #[error("invalid runtime scope id {scope:?}: {reason}")]
    InvalidRuntimeScope {
        /// The refused scope id (possibly shortened).
        scope: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A sandbox id that warren could not have issued.
    #[error("invalid sandbox id {id:?}: expected \"sbx-\" followed by 24 lowercase hex digits")]
    InvalidSandboxId {
        /// The refused id (possibly shortened).
        id: String,
    },
    /// The workdir breaks one of the workdir rules (I4).
    #[error("invalid workdir {path:?}: {reason}")]
    InvalidWorkdir {
        /// The refused workdir (possibly shortened).
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A branch name breaks the branch-name rules.
    #[error("invalid branch name {name:?}: {reason}")]
    InvalidBranch {
        /// The refused name (possibly shortened).
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A network policy entry is malformed.
    #[error("invalid network policy entry {entry:?}: {reason}")]
    InvalidNetworkPolicy {
        /// The refused entry (possibly shortened).
        entry: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// An egress secret's name, binding, presentation or value is malformed.
    #[error("invalid egress secret {entry:?}: {reason}")]
    InvalidEgressSecret {
        /// The refused part (possibly shortened); never a value.
        entry: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// An isolation-scope request that names an unknown scope or lacks the id it needs (I29).
    #[error("invalid isolation scope: {reason}")]
    InvalidIsolationScope {
        /// What is wrong and what to send instead.
        reason: String,
    },
    /// An environment variable name or value that cannot be given to a command (I14).
    #[error("invalid environment variable {name:?}: {reason}")]
    InvalidEnv {
        /// The variable's name (possibly shortened); never its value.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The layout name is not one warren knows.
    #[error(
        "unknown layout {name:?}: warren knows \"ars\" (the default), \"deerflow\" and \"e2b\""
    )]
    UnknownLayout {
        /// The refused name (possibly shortened).
        name: String,
    },
    /// The path is not under one of the layout's mounts, or breaks a path rule (I1).
    #[error(
        "invalid path {path:?}: {reason}; paths must be relative to the workdir or start with \
         {roots}"
    )]
    InvalidVirtualPath {
        /// The refused path (possibly shortened).
        path: String,
        /// Why it was refused.
        reason: &'static str,
        /// The mounts of the sandbox's layout (and its extra mounts), for the message.
        roots: String,
    },
    /// An extra mount that cannot be shown in this layout.
    #[error("invalid extra mount {target:?}: {reason}")]
    InvalidExtraMount {
        /// The refused target (possibly shortened; empty when the set as a whole is).
        target: String,
        /// Why it was refused.
        reason: String,
    },
}

/// Shortens user input for inclusion in an error message, so a megabyte-long path does not
/// become a megabyte-long error.
pub(crate) fn shorten(input: &str) -> String {
    const MAX: usize = 200;
    if input.len() <= MAX {
        return input.to_owned();
    }
    let mut end = MAX;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &input[..end])
}

/// Checks one relative path component against the rules shared by workdirs and virtual
/// paths: no NUL, not longer than a Linux file name may be.
pub(crate) fn component_problem(component: &str) -> Option<&'static str> {
    if component.contains('\0') {
        Some("it contains a NUL byte")
    } else if component.len() > 255 {
        Some("a component is longer than 255 bytes")
    } else {
        None
    }
}

/// Longest path warren accepts, in bytes (Linux PATH_MAX).
pub(crate) const MAX_PATH_BYTES: usize = 4096;
