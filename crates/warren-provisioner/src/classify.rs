//! One classification of every provisioner failure, written once: its [`ErrorKind`] (what
//! the caller can do about it, hence the HTTP status every wire answers with) and its
//! stable code. `/v1`, MCP, DeerFlow's API and E2B's read these; each matches
//! [`ErrorKind`] with no catch-all, so a new variant is one change here and its status
//! class is the same on every wire.

use std::borrow::Cow;

use warren_backend::BackendError;
use warren_core::CoreError;
use warren_fs::FsError;
use warren_snapshot::SnapshotError;

use crate::{is_disk_full, ProvisionerError};

/// The class of a failure: its kind and its stable code, which must be in the table of
/// codes with the kind's status (`warren_protocol::codes`, checked at compile time).
macro_rules! class {
    ($kind:ident, $code:expr) => {
        Class {
            kind: ErrorKind::$kind,
            code: Cow::Borrowed(warren_protocol::code!(ErrorKind::$kind.status(), $code)),
        }
    };
}

/// What a caller can do about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed or names something invalid: fix it (400).
    Invalid,
    /// Well-formed, but this server cannot do it as asked: an image it does not have, a
    /// repository it cannot clone, a file too large to read whole (422; 400 on wires
    /// whose clients misread 422).
    Unprocessable,
    /// Not allowed: a read-only mount, a link in a path (403).
    Forbidden,
    /// Nothing by that name (404).
    NotFound,
    /// It exists, but its state forbids this now (409).
    Conflict,
    /// A precondition (`If-Match`) failed (412).
    PreconditionFailed,
    /// Too large to take (413).
    TooLarge,
    /// A byte range outside the file (416).
    RangeNotSatisfiable,
    /// A per-sandbox bound is reached: end something first (429).
    TooMany,
    /// The uid's quota or the server's disk is full (507).
    InsufficientStorage,
    /// This backend or server cannot do it at all (501).
    Unsupported,
    /// Not now: a store, node or runtime out of reach; retry (503).
    Unavailable,
    /// Something warren depends on refused or failed: a cluster, a shell (502).
    BadGateway,
    /// warren's own failure; the server log has the details (500).
    Internal,
}

impl ErrorKind {
    /// The status warren's own API answers with.
    pub const fn status(self) -> u16 {
        match self {
            Self::Invalid => 400,
            Self::Unprocessable => 422,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::Conflict => 409,
            Self::PreconditionFailed => 412,
            Self::TooLarge => 413,
            Self::RangeNotSatisfiable => 416,
            Self::TooMany => 429,
            Self::InsufficientStorage => 507,
            Self::Unsupported => 501,
            Self::Unavailable => 503,
            Self::BadGateway => 502,
            Self::Internal => 500,
        }
    }

    /// The status on wires whose clients misread 422 (DeerFlow's AIO SDK, contract §0.3;
    /// E2B's): 400 for it, the same as [`ErrorKind::status`] for every other kind.
    pub fn transport_status(self) -> u16 {
        match self {
            Self::Unprocessable => 400,
            other => other.status(),
        }
    }

    /// The kind of a status another node answered with (a forwarded call).
    pub fn of_status(status: u16) -> Self {
        match status {
            403 => Self::Forbidden,
            404 => Self::NotFound,
            409 => Self::Conflict,
            412 => Self::PreconditionFailed,
            413 => Self::TooLarge,
            416 => Self::RangeNotSatisfiable,
            422 => Self::Unprocessable,
            429 => Self::TooMany,
            501 => Self::Unsupported,
            502 => Self::BadGateway,
            503 => Self::Unavailable,
            507 => Self::InsufficientStorage,
            // 400 and every other refusal of the request.
            400..=499 => Self::Invalid,
            _ => Self::Internal,
        }
    }
}

/// A failure's kind and stable code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    /// What the caller can do about it.
    pub kind: ErrorKind,
    /// The stable snake_case code, e.g. `sandbox_paused`.
    pub code: Cow<'static, str>,
}

impl ProvisionerError {
    /// The failure's kind: the status every wire answers with.
    pub fn kind(&self) -> ErrorKind {
        self.classify().kind
    }

    /// The failure's stable code.
    pub fn code(&self) -> Cow<'static, str> {
        self.classify().code
    }

    /// The failure's kind and code, every variant named.
    pub fn classify(&self) -> Class {
        use ProvisionerError as P;
        match self {
            // `core_code` checks each of its codes against the table with 400.
            P::Invalid(core) => Class {
                kind: ErrorKind::Invalid,
                code: Cow::Borrowed(core_code(core)),
            },
            P::BadRequest(_) => class!(Invalid, "invalid_request"),
            P::TokenInEnv { .. } => class!(Invalid, "token_in_env"),
            P::SecretSourceUnknown { .. } => class!(Invalid, "invalid_secret"),
            P::TokenInCommand { .. } => class!(Invalid, "token_in_command"),
            P::WorkdirNotFound { .. } => class!(NotFound, "workdir_not_found"),
            P::WorkdirNotADirectory { .. } => class!(Invalid, "workdir_not_a_directory"),
            P::SandboxNotFound(_) => class!(NotFound, "sandbox_not_found"),
            P::WorkdirConflict { .. } => class!(Conflict, "workdir_conflict"),
            P::NetworkConflict { .. } => class!(Conflict, "network_conflict"),
            P::EnvPolicyConflict { .. } => class!(Conflict, "env_policy_conflict"),
            P::BackendConflict { .. } => class!(Conflict, "backend_conflict"),
            P::LayoutConflict { .. } => class!(Conflict, "layout_conflict"),
            P::ExtraMountsConflict { .. } => class!(Conflict, "extra_mounts_conflict"),
            P::IsolationConflict { .. } => class!(Conflict, "isolation_conflict"),
            // Well-formed, but this server cannot honour it now (issue 19): like an image
            // missing from the Docker host, not the caller's syntax error.
            P::IsolationUnavailable { .. } => class!(Unprocessable, "isolation_unavailable"),
            P::HostMountsUnsupported { .. } => class!(Unprocessable, "host_mounts_unsupported"),
            P::ExtraMountSource { .. } => class!(Invalid, "extra_mount_unusable"),
            P::InvalidNode(_) => class!(Invalid, "invalid_node"),
            P::BackendUnavailable { .. } => class!(Invalid, "backend_unavailable"),
            P::InvalidImage { .. } => class!(Invalid, "invalid_image"),
            P::NotInOutputs { .. } => class!(Invalid, "not_in_outputs"),
            P::ArtifactTooLarge { .. } => class!(Unprocessable, "too_large"),
            P::ArtifactNotFound { .. } => class!(NotFound, "artifact_not_found"),
            P::SnapshotNotFound { .. } => class!(NotFound, "snapshot_not_found"),
            P::SandboxAlreadyLive { .. } => class!(Conflict, "sandbox_already_live"),
            P::RuntimeNotRunning { .. } => class!(Conflict, "runtime_not_running"),
            P::SnapshotUnsupported { .. } => class!(Unsupported, "snapshot_not_supported"),
            P::SkillNotGranted { .. } => class!(NotFound, "skill_not_granted"),
            P::WorkdirNotEmpty { .. } => class!(Conflict, "workdir_not_empty"),
            P::UnknownHostDir { .. } => class!(Invalid, "unknown_host_dir"),
            P::GitSourceRefused { .. } => class!(Invalid, "git_source_refused"),
            P::GitFailed { .. } => class!(Unprocessable, "git_failed"),
            P::CheckpointNotFound { .. } => class!(NotFound, "checkpoint_not_found"),
            P::BranchNotFound { .. } => class!(NotFound, "branch_not_found"),
            P::BranchExists { .. } => class!(Conflict, "branch_exists"),
            P::BranchInUse { .. } => class!(Conflict, "branch_in_use"),
            P::BranchesUnsupported { .. } => class!(Unprocessable, "branches_unsupported"),
            P::WorkdirBranched { .. } => class!(Conflict, "workdir_branched"),
            P::WorkdirInUse { .. } => class!(Conflict, "workdir_in_use"),
            P::MergeConflict { .. } => class!(Conflict, "merge_conflict"),
            P::BranchMerged { .. } => class!(Conflict, "branch_merged"),
            P::MergeIncomplete { .. } => class!(Conflict, "merge_incomplete"),
            P::Merge(error) => merge_class(error),
            P::SandboxBusy { .. } => class!(Conflict, "sandbox_busy"),
            P::ShellSessionNotFound { .. } => class!(NotFound, "shell_session_not_found"),
            P::ShellSessionBusy { .. } => class!(Conflict, "shell_session_busy"),
            P::TooManyShellSessions { .. } => class!(Conflict, "too_many_shell_sessions"),
            P::ShellStartFailed { .. } => class!(BadGateway, "shell_start_failed"),
            P::ProcessNotFound { .. } | P::ProcessTagNotFound { .. } => {
                class!(NotFound, "process_not_found")
            }
            P::CodeContextNotFound { .. } => class!(NotFound, "code_context_not_found"),
            P::CodeContextExists { .. } => class!(Conflict, "code_context_exists"),
            P::TooManyCodeContexts { .. } => class!(TooMany, "too_many_code_contexts"),
            P::CodeInterpreterUnavailable { .. } => {
                class!(Unprocessable, "code_interpreter_unavailable")
            }
            P::UnsupportedLanguage { .. } => class!(Invalid, "unsupported_language"),
            P::ProcessStdinClosed { .. } => class!(Conflict, "stdin_closed"),
            P::ProcessEnded { .. } => class!(Conflict, "process_ended"),
            P::StdinInterrupted { .. } => class!(Invalid, "stdin_interrupted"),
            P::NotATerminal { .. } => class!(Conflict, "not_a_terminal"),
            P::WatchedDirGone { .. } => class!(NotFound, "watched_dir_gone"),
            P::RuntimeStopped { .. } => class!(Conflict, "runtime_stopped"),
            P::WatchTooLarge { .. } => class!(TooLarge, "watch_too_large"),
            P::WatchFailed => class!(Internal, "watch_failed"),
            P::TooManyProcesses { .. } => class!(Conflict, "too_many_processes"),
            P::ProcessNotStarted { .. } => class!(Unprocessable, "process_not_started"),
            P::Snapshot(error) => snapshot_class(error),
            P::EnvVarNotFound { .. } => class!(NotFound, "env_var_not_found"),
            P::EgressSecretNotFound { .. } => class!(NotFound, "egress_secret_not_found"),
            P::TooManyWatches { .. } => class!(TooMany, "too_many_watches"),
            P::WatcherNotFound { .. } => class!(NotFound, "watcher_not_found"),
            P::SandboxPaused { .. } => class!(Conflict, "sandbox_paused"),
            P::IllegalTransition { .. } => class!(Conflict, "sandbox_state_conflict"),
            P::SandboxTerminated { state, .. } if *state == "terminating" => {
                class!(Conflict, "sandbox_terminating")
            }
            P::SandboxTerminated { .. } | P::TerminatedWhileRunning { .. } => {
                class!(Conflict, "sandbox_terminated")
            }
            P::LeaseNotFound { .. } => class!(NotFound, "lease_not_found"),
            P::GuardHeld { .. } => class!(Conflict, "guard_held"),
            P::FenceStale { .. } => class!(Conflict, "fence_stale"),
            P::FenceInvalid { .. } => class!(Invalid, "fence_invalid"),
            P::GuardNotFound { .. } => class!(NotFound, "guard_not_found"),
            P::ExecUnsupported { .. } => class!(Unsupported, "exec_not_supported"),
            // Cluster mode (issue 14): each is retryable, and another replica may serve.
            P::NodeFenced { .. } => class!(Unavailable, "node_fenced"),
            P::RuntimeElsewhere { .. } => class!(Unavailable, "runtime_elsewhere"),
            P::PeerUnreachable { .. } => class!(Unavailable, "node_unreachable"),
            P::NotOwnerHere { .. } => class!(Conflict, crate::NOT_OWNER_CODE),
            P::NoPeerLink => class!(Internal, "internal"),
            P::Forwarded { status, code, .. } => Class {
                kind: ErrorKind::of_status(*status),
                code: Cow::Owned(code.clone()),
            },
            P::ReadOnlyPath { .. } => class!(Forbidden, "read_only"),
            P::InvalidCwd { .. } => class!(Invalid, "invalid_cwd"),
            // The uid's own volume is full (I23); other uids and the server are unaffected.
            P::QuotaExceeded { .. } => class!(InsufficientStorage, "quota_exceeded"),
            // The server's disk, not the uid's quota: its own code.
            P::NoRoomForVolume { .. } => class!(InsufficientStorage, "insufficient_storage"),
            P::Volume { .. } | P::WorkspacesWithoutVolumes { .. } => class!(Internal, "internal"),
            P::File { source, .. } => file_class(source),
            P::Store(warren_store::StoreError::NotOwner { .. }) => {
                class!(Unavailable, "runtime_moved")
            }
            P::Store(warren_store::StoreError::AgentEnvFull { .. }) => {
                class!(Conflict, "agent_env_full")
            }
            P::Store(warren_store::StoreError::EgressSecretsFull { .. }) => {
                class!(Conflict, "egress_secrets_full")
            }
            // The database is out of reach (restarting, network): nothing was half-done,
            // and the same request may succeed shortly.
            P::Store(error) if error.is_unavailable() => {
                class!(Unavailable, "state_store_unavailable")
            }
            P::Store(_) | P::Interrupted(_) => class!(Internal, "internal"),
            P::Backend(error) => backend_class(error),
        }
    }
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [Self; 14] = [
        Self::Invalid,
        Self::Unprocessable,
        Self::Forbidden,
        Self::NotFound,
        Self::Conflict,
        Self::PreconditionFailed,
        Self::TooLarge,
        Self::RangeNotSatisfiable,
        Self::TooMany,
        Self::InsufficientStorage,
        Self::Unsupported,
        Self::Unavailable,
        Self::BadGateway,
        Self::Internal,
    ];
}

/// One failure of every kind, in [`ErrorKind::ALL`]'s order: what the transports' tests
/// walk through their wires to show the status classes agree.
#[doc(hidden)]
pub fn one_of_every_kind() -> Vec<ProvisionerError> {
    let sandbox = warren_core::SandboxId::derive(
        &warren_core::Uid::new("alice").expect("a valid uid"),
        &warren_core::RuntimeScope::new("walk").expect("a valid scope"),
    );
    let file = |source: FsError| ProvisionerError::File {
        path: "/home/gem/user-data/f".to_owned(),
        source,
    };
    vec![
        ProvisionerError::BadRequest("a bad request"),
        ProvisionerError::GitFailed {
            detail: "no such repository".to_owned(),
        },
        ProvisionerError::ReadOnlyPath {
            path: "/home/gem/skills/x".to_owned(),
        },
        ProvisionerError::SandboxNotFound(sandbox.clone()),
        ProvisionerError::SandboxPaused {
            sandbox: sandbox.clone(),
            state: "paused",
        },
        file(FsError::PreconditionFailed {
            path: "f".to_owned(),
            current: None,
        }),
        ProvisionerError::WatchTooLarge {
            path: "/home/gem/user-data".to_owned(),
            reason: "too many directories".to_owned(),
        },
        file(FsError::RangeNotSatisfiable {
            path: "f".to_owned(),
            size: 1,
        }),
        ProvisionerError::TooManyWatches { max: 8 },
        ProvisionerError::QuotaExceeded {
            uid: "alice".to_owned(),
            path: "/home/gem/user-data/f".to_owned(),
        },
        ProvisionerError::ExecUnsupported { backend: "memory" },
        ProvisionerError::RuntimeElsewhere {
            sandbox,
            node: "node-1".to_owned(),
        },
        ProvisionerError::ShellStartFailed {
            reason: "bash exited".to_owned(),
        },
        ProvisionerError::WatchFailed,
    ]
}

/// The code of an invalid identifier, path or policy.
fn core_code(error: &CoreError) -> &'static str {
    match error {
        CoreError::InvalidUid { .. } => warren_protocol::code!(400, "invalid_uid"),
        CoreError::ReservedUid { .. } => warren_protocol::code!(400, "reserved_uid"),
        CoreError::InvalidRuntimeScope { .. } => {
            warren_protocol::code!(400, "invalid_runtime_scope")
        }
        CoreError::InvalidSandboxId { .. } => warren_protocol::code!(400, "invalid_sandbox_id"),
        CoreError::InvalidWorkdir { .. } => warren_protocol::code!(400, "invalid_workdir"),
        CoreError::InvalidBranch { .. } => warren_protocol::code!(400, "invalid_branch"),
        CoreError::InvalidVirtualPath { .. } => warren_protocol::code!(400, "invalid_path"),
        CoreError::InvalidNetworkPolicy { .. } => warren_protocol::code!(400, "invalid_network"),
        CoreError::InvalidIsolationScope { .. } => warren_protocol::code!(400, "invalid_scope"),
        CoreError::InvalidEnv { .. } => warren_protocol::code!(400, "invalid_env"),
        CoreError::InvalidEgressSecret { .. } => warren_protocol::code!(400, "invalid_secret"),
        CoreError::UnknownLayout { .. } => warren_protocol::code!(400, "invalid_layout"),
        CoreError::InvalidExtraMount { .. } => warren_protocol::code!(400, "invalid_extra_mount"),
    }
}

fn merge_class(error: &warren_merge::MergeError) -> Class {
    use warren_merge::MergeError as M;
    match error {
        M::Read { source, .. } | M::Write { source } => file_class(source),
        M::SpecialFile { .. } | M::NotUtf8 { .. } | M::ReservedName { .. } => {
            class!(Unprocessable, "merge_refused")
        }
        M::TooManyEntries { .. } => class!(Unprocessable, "too_many_entries"),
        M::ChangedWhilePlanning { .. } | M::BranchChanged { .. } | M::TargetChanged { .. } => {
            class!(Conflict, "merge_stale")
        }
        M::Conflicts { .. } => class!(Conflict, "merge_conflict"),
        M::InvalidChange { .. }
        | M::InvalidId { .. }
        | M::JournalExists { .. }
        | M::Staging { .. }
        | M::StagingTampered { .. }
        | M::SetMode { .. }
        | M::Journal { .. }
        | M::JournalCorrupt { .. } => class!(Internal, "internal"),
    }
}

fn snapshot_class(error: &SnapshotError) -> Class {
    match error {
        SnapshotError::File(source) => file_class(source),
        SnapshotError::ManifestNotFound(_)
        | SnapshotError::MissingChunk { .. }
        | SnapshotError::Corrupt { .. } => class!(Unprocessable, "checkpoint_unusable"),
        // The data limit is the operator's ([snapshots] max_bytes): the tree must shrink.
        SnapshotError::TooLarge { .. } => class!(Unprocessable, "snapshot_too_large"),
        SnapshotError::Cancelled { .. } => class!(Unavailable, "snapshot_cancelled"),
        SnapshotError::Store { .. } | SnapshotError::Io { .. } | SnapshotError::InvalidKey(_) => {
            class!(Internal, "internal")
        }
    }
}

fn backend_class(error: &BackendError) -> Class {
    match error {
        BackendError::ExecUnsupported { .. } => class!(Unsupported, "exec_not_supported"),
        BackendError::ProcessesUnsupported { .. } => {
            class!(Unsupported, "processes_not_supported")
        }
        BackendError::RuntimeNotFound { .. } => class!(Unavailable, "runtime_not_found"),
        BackendError::ImageNotFound { .. } => class!(Unprocessable, "image_not_found"),
        // The cluster's own answers (issue 15): a refusal of warren's service account is
        // the operator's to fix; overload or an outage, after the retries Kubernetes
        // allows, is worth trying again; anything else is the cluster rejecting warren.
        BackendError::Cluster { code: 403, .. } => class!(BadGateway, "cluster_forbidden"),
        BackendError::Cluster { code, .. } if *code == 0 || *code == 429 || *code >= 500 => {
            class!(Unavailable, "cluster_unavailable")
        }
        BackendError::Cluster { .. } => class!(BadGateway, "cluster_refused"),
        BackendError::NotReady { .. } => class!(Unavailable, "runtime_not_ready"),
        BackendError::Create { .. }
        | BackendError::HostDir { .. }
        | BackendError::MountRefused { .. }
        | BackendError::Exec { .. }
        | BackendError::Discover { .. }
        | BackendError::Kill { .. }
        | BackendError::Destroy { .. } => class!(Internal, "internal"),
    }
}

/// A file-layer failure: the caller's to fix, or warren's own.
pub(crate) fn file_class(error: &FsError) -> Class {
    use FsError as F;
    match error {
        F::InvalidPath { .. } => class!(Invalid, "invalid_path"),
        F::SymlinkRefused { .. } => class!(Forbidden, "symlink_refused"),
        F::LinkLoop { .. } => class!(Unprocessable, "link_loop"),
        F::MountCrossingRefused { .. } => class!(Forbidden, "mount_crossing_refused"),
        F::RootRefused { .. } => class!(Forbidden, "root_refused"),
        F::ReadOnly { .. } => class!(Forbidden, "read_only"),
        F::PermissionDenied { .. } => class!(Forbidden, "permission_denied"),
        F::NotFound { .. } => class!(NotFound, "not_found"),
        F::NotADirectory { .. } => class!(Invalid, "not_a_directory"),
        F::IsADirectory { .. } => class!(Invalid, "is_a_directory"),
        F::NotAFile { .. } => class!(Invalid, "not_a_file"),
        F::AlreadyExists { .. } => class!(Conflict, "already_exists"),
        F::DirectoryNotEmpty { .. } => class!(Conflict, "directory_not_empty"),
        // The file, not the request, is too large: read it in byte ranges.
        F::TooLarge { .. } => class!(Unprocessable, "too_large"),
        F::RangeNotSatisfiable { .. } => class!(RangeNotSatisfiable, "range_not_satisfiable"),
        F::PreconditionFailed { .. } => class!(PreconditionFailed, "precondition_failed"),
        F::EditNoMatch { .. } => class!(Unprocessable, "edit_no_match"),
        F::EditAmbiguous { .. } => class!(Unprocessable, "edit_ambiguous"),
        F::EditEmptyOld { .. } => class!(Invalid, "invalid_edit"),
        F::NotUtf8 { .. } => class!(Unprocessable, "not_utf8"),
        F::InvalidMode { .. } => class!(Invalid, "invalid_mode"),
        F::InvalidEtag { .. } => class!(Invalid, "invalid_etag"),
        F::InvalidGlob { .. } => class!(Invalid, "invalid_glob"),
        F::InvalidRegex { .. } => class!(Invalid, "invalid_regex"),
        F::TooDeep { .. } => class!(Unprocessable, "too_deep"),
        F::TooManyEntries { .. } => class!(Unprocessable, "too_many_entries"),
        F::Busy { .. } => class!(Unavailable, "file_busy"),
        F::Write { .. } | F::Create { .. } if is_disk_full(error) => {
            class!(InsufficientStorage, "insufficient_storage")
        }
        F::RootUnavailable { .. }
        | F::SharedDirUnsupported { .. }
        | F::Open { .. }
        | F::Stat { .. }
        | F::Read { .. }
        | F::Write { .. }
        | F::Lock { .. }
        | F::Create { .. }
        | F::SetAttributes { .. }
        | F::Rename { .. }
        | F::Remove { .. }
        | F::List { .. }
        | F::Io { .. } => class!(Internal, "internal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_has_one_failure_of_every_kind_in_order() {
        let kinds: Vec<ErrorKind> = one_of_every_kind().iter().map(|e| e.kind()).collect();
        assert_eq!(kinds, ErrorKind::ALL);
    }

    #[test]
    fn every_wire_answers_a_kind_in_the_same_status_class() {
        for kind in ErrorKind::ALL {
            assert_eq!(
                kind.status() / 100,
                kind.transport_status() / 100,
                "{kind:?}"
            );
            assert_ne!(kind.transport_status(), 422, "{kind:?}");
            // A status another node answered means the same kind here.
            assert_eq!(ErrorKind::of_status(kind.status()), kind);
        }
    }

    #[test]
    fn a_replica_without_the_runtime_is_unavailable_on_every_wire_not_a_bad_request() {
        let elsewhere = ProvisionerError::RuntimeElsewhere {
            sandbox: warren_core::SandboxId::derive(
                &warren_core::Uid::new("alice").unwrap(),
                &warren_core::RuntimeScope::new("t").unwrap(),
            ),
            node: "node-0".to_owned(),
        };
        assert_eq!(elsewhere.transport_status(), 503);
        assert_eq!(elsewhere.code(), "runtime_elsewhere");
    }
}
