//! The crate's one error type: a plan or option warren cannot turn into objects, a Pod that
//! is not exactly what warren would have made (the reason `discover` logs), and what the
//! pod's root init step refused.

use rustix::io::Errno;
use warren_fs::FsError;

/// Everything this crate refuses, each with a sentence a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An instance name that cannot be a label value and part of object names.
    #[error("invalid instance name {instance:?}: {reason}")]
    InvalidInstance {
        /// The refused name.
        instance: String,
        /// Why.
        reason: &'static str,
    },
    /// A value of a plan or of deployment options that Kubernetes would not accept, or
    /// that breaks one of warren's rules.
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// Which value (`mount target`, `subPath`, `namespace`, ...).
        what: &'static str,
        /// The refused value.
        value: String,
        /// Why.
        reason: String,
    },
    /// A sandbox with egress, but no address of warren's proxy to allow egress to.
    #[error("network {mode:?} needs the address of warren's egress proxy in the plan")]
    NoProxy {
        /// The network mode.
        mode: &'static str,
    },

    // ---- Reading a Pod back (`discover`, I16). ----
    /// A label or annotation warren writes is missing.
    #[error("{0} is missing")]
    MissingMetadata(&'static str),
    /// A label or annotation does not parse, or disagrees with the others or with the spec.
    #[error("{0} is not valid")]
    BadMetadata(&'static str),
    /// Another warren instance's object: never adopted, never removed by this one.
    #[error("it belongs to warren instance {found:?}, not this one")]
    ForeignInstance {
        /// The instance label it carries.
        found: String,
    },
    /// It runs with privileges warren never grants.
    #[error("it runs with privileges warren never grants: {0}")]
    Privileges(String),
    /// It mounts a directory of the node.
    #[error("volume {0:?} is a hostPath, which warren never uses")]
    HostPath(String),
    /// A volume warren never makes.
    #[error("volume {0:?} is not one warren makes")]
    UnexpectedVolume(String),
    /// A container warren never makes (or one of warren's missing).
    #[error("container {0:?} is not one warren makes, or one of warren's is missing")]
    UnexpectedContainer(String),
    /// Legacy layout: an old `/home/gem/projects` mount.
    #[error("legacy layout: it mounts /home/gem/projects")]
    ProjectsMount,
    /// Legacy layout: a mount inside a persistent mount (`/home/gem/user-data/...`).
    #[error("legacy layout: a nested mount at {0}")]
    NestedMount(String),
    /// Legacy layout: a mount the layout makes read-only (the skills) is writable.
    #[error("legacy layout: {0} is writable")]
    Writable(String),
    /// A mount the layout makes writable is read-only.
    #[error("{0} is read-only, which its layout makes writable")]
    ReadOnly(String),
    /// A mount warren never makes at that place, or of that volume.
    #[error("it mounts {0}, which warren never mounts there")]
    UnexpectedMount(String),
    /// A persistent mount showing a directory other than its layout's for this uid.
    #[error("{target} shows {sub_path:?}, not the directory its layout shows for this uid")]
    ForeignSubPath {
        /// The mount's target.
        target: String,
        /// The subPath it mounts.
        sub_path: String,
    },
    /// One of its layout's persistent mounts is missing.
    #[error("it lacks one of its layout's persistent mounts")]
    MissingMounts,
    /// The main container has no agent key, so warren cannot reach its agent.
    #[error("its container carries no agent key")]
    MissingAgentKey,
    /// Its containers have ended (restartPolicy Never: it never runs again) or it is being
    /// deleted.
    #[error("it has ended ({0})")]
    Ended(String),
    /// It is well-formed but another runtime than the one the sandbox's record asks for.
    #[error("it is another runtime: {0}")]
    Mismatch(String),
    /// The pod's Service or NetworkPolicy is missing or is not what warren makes for it.
    #[error("its {kind} {problem}")]
    Companion {
        /// `Service` or `NetworkPolicy`.
        kind: &'static str,
        /// What is wrong with it.
        problem: String,
    },

    // ---- The root init step (`warren __k8s-prepare`). ----
    /// The configuration passed on the command line does not parse.
    #[error("invalid prepare configuration: {0}")]
    PrepareConfig(String),
    /// A system call failed on a path (relative to the mounted subtree).
    #[error("{op} {path:?}: {errno}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Where, relative to the mounted subtree.
        path: String,
        /// The kernel's answer.
        errno: Errno,
    },
    /// The workdir (or another directory a mount shows) does not exist, or one of its
    /// components is not a directory or is a symlink. It is never created here.
    #[error(
        "{workdir:?} does not exist as a directory of the UserWorkspace ({reason}); warren \
         never creates it at pod start"
    )]
    WorkdirMissing {
        /// The directory, relative to the UserWorkspace.
        workdir: String,
        /// Which component and why.
        reason: String,
    },
    /// An entry that must be a directory is a symlink or something else.
    #[error("{0:?} is not a directory (a symlink is never followed)")]
    NotADirectory(String),
    /// The tree is deeper than the walk goes.
    #[error("{path:?} is nested deeper than {limit} directories")]
    TooDeep {
        /// Where the walk stopped.
        path: String,
        /// The depth limit.
        limit: usize,
    },
    /// Any other refusal of warren-fs's ownership migration, as its message (the walk
    /// answers [`FsError::Io`] and [`FsError::TooDeep`], which map to [`Error::Io`] and
    /// [`Error::TooDeep`]; this keeps the mapping total).
    #[error("ownership migration: {0}")]
    Ownership(String),
}

/// The ownership migration's errors ([`warren_fs::migrate_subtree_once`]) as this crate's,
/// with the same messages the init step gave when the walk lived here. `FsError` carries
/// `std::io::Error`, which is neither `Clone` nor `Eq`, so it is mapped rather than wrapped.
impl From<FsError> for Error {
    fn from(error: FsError) -> Self {
        match error {
            FsError::Io { op, path, errno } => Self::Io {
                op,
                path,
                errno: Errno::from_io_error(&errno).unwrap_or(Errno::IO),
            },
            FsError::TooDeep { path, limit } => Self::TooDeep {
                path,
                limit: limit as usize,
            },
            other => Self::Ownership(other.to_string()),
        }
    }
}

impl Error {
    pub(crate) fn invalid(
        what: &'static str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<String>) -> impl FnOnce(Errno) -> Self {
        let path = path.into();
        move |errno| Self::Io { op, path, errno }
    }
}
