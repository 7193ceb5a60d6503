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
    pub fn status(self) -> u16 {
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

fn class(kind: ErrorKind, code: &'static str) -> Class {
    Class {
        kind,
        code: Cow::Borrowed(code),
    }
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
        use ErrorKind as K;
        use ProvisionerError as P;
        match self {
            P::Invalid(core) => class(K::Invalid, core_code(core)),
            P::BadRequest(_) => class(K::Invalid, "invalid_request"),
            P::TokenInEnv { .. } => class(K::Invalid, "token_in_env"),
            P::TokenInCommand { .. } => class(K::Invalid, "token_in_command"),
            P::WorkdirNotFound { .. } => class(K::NotFound, "workdir_not_found"),
            P::WorkdirNotADirectory { .. } => class(K::Invalid, "workdir_not_a_directory"),
            P::SandboxNotFound(_) => class(K::NotFound, "sandbox_not_found"),
            P::WorkdirConflict { .. } => class(K::Conflict, "workdir_conflict"),
            P::NetworkConflict { .. } => class(K::Conflict, "network_conflict"),
            P::EnvPolicyConflict { .. } => class(K::Conflict, "env_policy_conflict"),
            P::BackendConflict { .. } => class(K::Conflict, "backend_conflict"),
            P::LayoutConflict { .. } => class(K::Conflict, "layout_conflict"),
            P::ExtraMountsConflict { .. } => class(K::Conflict, "extra_mounts_conflict"),
            P::IsolationConflict { .. } => class(K::Conflict, "isolation_conflict"),
            // Well-formed, but this server cannot honour it now (issue 19): like an image
            // missing from the Docker host, not the caller's syntax error.
            P::IsolationUnavailable { .. } => class(K::Unprocessable, "isolation_unavailable"),
            P::HostMountsUnsupported { .. } => class(K::Unprocessable, "host_mounts_unsupported"),
            P::ExtraMountSource { .. } => class(K::Invalid, "extra_mount_unusable"),
            P::InvalidNode(_) => class(K::Invalid, "invalid_node"),
            P::BackendUnavailable { .. } => class(K::Invalid, "backend_unavailable"),
            P::InvalidImage { .. } => class(K::Invalid, "invalid_image"),
            P::NotInOutputs { .. } => class(K::Invalid, "not_in_outputs"),
            P::ArtifactTooLarge { .. } => class(K::Unprocessable, "too_large"),
            P::ArtifactNotFound { .. } => class(K::NotFound, "artifact_not_found"),
            P::SnapshotNotFound { .. } => class(K::NotFound, "snapshot_not_found"),
            P::SandboxAlreadyLive { .. } => class(K::Conflict, "sandbox_already_live"),
            P::RuntimeNotRunning { .. } => class(K::Conflict, "runtime_not_running"),
            P::SnapshotUnsupported { .. } => class(K::Unsupported, "snapshot_not_supported"),
            P::SkillNotGranted { .. } => class(K::NotFound, "skill_not_granted"),
            P::WorkdirNotEmpty { .. } => class(K::Conflict, "workdir_not_empty"),
            P::UnknownHostDir { .. } => class(K::Invalid, "unknown_host_dir"),
            P::GitSourceRefused { .. } => class(K::Invalid, "git_source_refused"),
            P::GitFailed { .. } => class(K::Unprocessable, "git_failed"),
            P::CheckpointNotFound { .. } => class(K::NotFound, "checkpoint_not_found"),
            P::SandboxBusy { .. } => class(K::Conflict, "sandbox_busy"),
            P::ShellSessionNotFound { .. } => class(K::NotFound, "shell_session_not_found"),
            P::ShellSessionBusy { .. } => class(K::Conflict, "shell_session_busy"),
            P::TooManyShellSessions { .. } => class(K::Conflict, "too_many_shell_sessions"),
            P::ShellStartFailed { .. } => class(K::BadGateway, "shell_start_failed"),
            P::ProcessNotFound { .. } | P::ProcessTagNotFound { .. } => {
                class(K::NotFound, "process_not_found")
            }
            P::ProcessStdinClosed { .. } => class(K::Conflict, "stdin_closed"),
            P::ProcessEnded { .. } => class(K::Conflict, "process_ended"),
            P::StdinInterrupted { .. } => class(K::Invalid, "stdin_interrupted"),
            P::NotATerminal { .. } => class(K::Conflict, "not_a_terminal"),
            P::WatchedDirGone { .. } => class(K::NotFound, "watched_dir_gone"),
            P::RuntimeStopped { .. } => class(K::Conflict, "runtime_stopped"),
            P::WatchTooLarge { .. } => class(K::TooLarge, "watch_too_large"),
            P::WatchFailed => class(K::Internal, "watch_failed"),
            P::TooManyProcesses { .. } => class(K::Conflict, "too_many_processes"),
            P::ProcessNotStarted { .. } => class(K::Unprocessable, "process_not_started"),
            P::Snapshot(error) => snapshot_class(error),
            P::EnvVarNotFound { .. } => class(K::NotFound, "env_var_not_found"),
            P::TooManyWatches { .. } => class(K::TooMany, "too_many_watches"),
            P::WatcherNotFound { .. } => class(K::NotFound, "watcher_not_found"),
            P::SandboxPaused { .. } => class(K::Conflict, "sandbox_paused"),
            P::IllegalTransition { .. } => class(K::Conflict, "sandbox_state_conflict"),
            P::SandboxTerminated { state, .. } if *state == "terminating" => {
                class(K::Conflict, "sandbox_terminating")
            }
            P::SandboxTerminated { .. } | P::TerminatedWhileRunning { .. } => {
                class(K::Conflict, "sandbox_terminated")
            }
            P::LeaseNotFound { .. } => class(K::NotFound, "lease_not_found"),
            P::GuardHeld { .. } => class(K::Conflict, "guard_held"),
            P::FenceStale { .. } => class(K::Conflict, "fence_stale"),
            P::FenceInvalid { .. } => class(K::Invalid, "fence_invalid"),
            P::GuardNotFound { .. } => class(K::NotFound, "guard_not_found"),
            P::ExecUnsupported { .. } => class(K::Unsupported, "exec_not_supported"),
            // Cluster mode (issue 14): each is retryable, and another replica may serve.
            P::NodeFenced { .. } => class(K::Unavailable, "node_fenced"),
            P::RuntimeElsewhere { .. } => class(K::Unavailable, "runtime_elsewhere"),
            P::PeerUnreachable { .. } => class(K::Unavailable, "node_unreachable"),
            P::NotOwnerHere { .. } => class(K::Conflict, crate::NOT_OWNER_CODE),
            P::NoPeerLink => class(K::Internal, "internal"),
            P::Forwarded { status, code, .. } => Class {
                kind: ErrorKind::of_status(*status),
                code: Cow::Owned(code.clone()),
            },
            P::ReadOnlyPath { .. } => class(K::Forbidden, "read_only"),
            P::InvalidCwd { .. } => class(K::Invalid, "invalid_cwd"),
            // The uid's own volume is full (I23); other uids and the server are unaffected.
            P::QuotaExceeded { .. } => class(K::InsufficientStorage, "quota_exceeded"),
            // The server's disk, not the uid's quota: its own code.
            P::NoRoomForVolume { .. } => class(K::InsufficientStorage, "insufficient_storage"),
            P::Volume { .. } | P::WorkspacesWithoutVolumes { .. } => class(K::Internal, "internal"),
            P::File { source, .. } => file_class(source),
            P::Store(warren_store::StoreError::NotOwner { .. }) => {
                class(K::Unavailable, "runtime_moved")
            }
            P::Store(warren_store::StoreError::AgentEnvFull { .. }) => {
                class(K::Conflict, "agent_env_full")
            }
            // The database is out of reach (restarting, network): nothing was half-done,
            // and the same request may succeed shortly.
            P::Store(error) if error.is_unavailable() => {
                class(K::Unavailable, "state_store_unavailable")
            }
            P::Store(_) | P::Interrupted(_) => class(K::Internal, "internal"),
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
        CoreError::InvalidUid { .. } => "invalid_uid",
        CoreError::ReservedUid { .. } => "reserved_uid",
        CoreError::InvalidRuntimeScope { .. } => "invalid_runtime_scope",
        CoreError::InvalidSandboxId { .. } => "invalid_sandbox_id",
        CoreError::InvalidWorkdir { .. } => "invalid_workdir",
        CoreError::InvalidVirtualPath { .. } => "invalid_path",
        CoreError::InvalidNetworkPolicy { .. } => "invalid_network",
        CoreError::InvalidIsolationScope { .. } => "invalid_scope",
        CoreError::InvalidEnv { .. } => "invalid_env",
        CoreError::UnknownLayout { .. } => "invalid_layout",
        CoreError::InvalidExtraMount { .. } => "invalid_extra_mount",
    }
}

fn snapshot_class(error: &SnapshotError) -> Class {
    use ErrorKind as K;
    match error {
        SnapshotError::File(source) => file_class(source),
        SnapshotError::ManifestNotFound(_)
        | SnapshotError::MissingChunk { .. }
        | SnapshotError::Corrupt { .. } => class(K::Unprocessable, "checkpoint_unusable"),
        // The data limit is the operator's ([snapshots] max_bytes): the tree must shrink.
        SnapshotError::TooLarge { .. } => class(K::Unprocessable, "snapshot_too_large"),
        SnapshotError::Cancelled { .. } => class(K::Unavailable, "snapshot_cancelled"),
        SnapshotError::Store { .. } | SnapshotError::Io { .. } | SnapshotError::InvalidKey(_) => {
            class(K::Internal, "internal")
        }
    }
}

fn backend_class(error: &BackendError) -> Class {
    use ErrorKind as K;
    match error {
        BackendError::ExecUnsupported { .. } => class(K::Unsupported, "exec_not_supported"),
        BackendError::ProcessesUnsupported { .. } => {
            class(K::Unsupported, "processes_not_supported")
        }
        BackendError::RuntimeNotFound { .. } => class(K::Unavailable, "runtime_not_found"),
        BackendError::ImageNotFound { .. } => class(K::Unprocessable, "image_not_found"),
        // The cluster's own answers (issue 15): a refusal of warren's service account is
        // the operator's to fix; overload or an outage, after the retries Kubernetes
        // allows, is worth trying again; anything else is the cluster rejecting warren.
        BackendError::Cluster { code: 403, .. } => class(K::BadGateway, "cluster_forbidden"),
        BackendError::Cluster { code, .. } if *code == 0 || *code == 429 || *code >= 500 => {
            class(K::Unavailable, "cluster_unavailable")
        }
        BackendError::Cluster { .. } => class(K::BadGateway, "cluster_refused"),
        BackendError::NotReady { .. } => class(K::Unavailable, "runtime_not_ready"),
        BackendError::Create { .. }
        | BackendError::HostDir { .. }
        | BackendError::MountRefused { .. }
        | BackendError::Exec { .. }
        | BackendError::Discover { .. }
        | BackendError::Kill { .. }
        | BackendError::Destroy { .. } => class(K::Internal, "internal"),
    }
}

/// A file-layer failure: the caller's to fix, or warren's own.
pub(crate) fn file_class(error: &FsError) -> Class {
    use ErrorKind as K;
    use FsError as F;
    match error {
        F::InvalidPath { .. } => class(K::Invalid, "invalid_path"),
        F::SymlinkRefused { .. } => class(K::Forbidden, "symlink_refused"),
        F::LinkLoop { .. } => class(K::Unprocessable, "link_loop"),
        F::MountCrossingRefused { .. } => class(K::Forbidden, "mount_crossing_refused"),
        F::RootRefused { .. } => class(K::Forbidden, "root_refused"),
        F::ReadOnly { .. } => class(K::Forbidden, "read_only"),
        F::PermissionDenied { .. } => class(K::Forbidden, "permission_denied"),
        F::NotFound { .. } => class(K::NotFound, "not_found"),
        F::NotADirectory { .. } => class(K::Invalid, "not_a_directory"),
        F::IsADirectory { .. } => class(K::Invalid, "is_a_directory"),
        F::NotAFile { .. } => class(K::Invalid, "not_a_file"),
        F::AlreadyExists { .. } => class(K::Conflict, "already_exists"),
        F::DirectoryNotEmpty { .. } => class(K::Conflict, "directory_not_empty"),
        // The file, not the request, is too large: read it in byte ranges.
        F::TooLarge { .. } => class(K::Unprocessable, "too_large"),
        F::RangeNotSatisfiable { .. } => class(K::RangeNotSatisfiable, "range_not_satisfiable"),
        F::PreconditionFailed { .. } => class(K::PreconditionFailed, "precondition_failed"),
        F::EditNoMatch { .. } => class(K::Unprocessable, "edit_no_match"),
        F::EditAmbiguous { .. } => class(K::Unprocessable, "edit_ambiguous"),
        F::EditEmptyOld { .. } => class(K::Invalid, "invalid_edit"),
        F::NotUtf8 { .. } => class(K::Unprocessable, "not_utf8"),
        F::InvalidMode { .. } => class(K::Invalid, "invalid_mode"),
        F::InvalidEtag { .. } => class(K::Invalid, "invalid_etag"),
        F::InvalidGlob { .. } => class(K::Invalid, "invalid_glob"),
        F::InvalidRegex { .. } => class(K::Invalid, "invalid_regex"),
        F::TooDeep { .. } => class(K::Unprocessable, "too_deep"),
        F::TooManyEntries { .. } => class(K::Unprocessable, "too_many_entries"),
        F::Busy { .. } => class(K::Unavailable, "file_busy"),
        F::Write { .. } | F::Create { .. } if is_disk_full(error) => {
            class(K::InsufficientStorage, "insufficient_storage")
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
        | F::Io { .. } => class(K::Internal, "internal"),
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
