//! The one mapping from failures to HTTP statuses and stable error codes.
//!
//! Every error answer is `{"error":{"code":"<stable_snake_case>","message":"<sentence>"}}`.
//! Codes are part of the API contract; messages are for people and may change. Internal
//! failures are logged in full and answered with a generic message, so no host path or
//! driver detail reaches a client (I1).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_backend::BackendError;
use warren_core::CoreError;
use warren_fs::FsError;
use warren_protocol::{ErrorBody, ErrorDetail};
use warren_provisioner::ProvisionerError;
use warren_provisioner::{is_disk_full, strip_relative_path};

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    /// Static for every answer made here; an owner's answer to a forwarded operation
    /// carries the owner's code as it came.
    code: std::borrow::Cow<'static, str>,
    message: String,
    /// `guard_held`: the holder and the expiry of the live guard, for the body.
    holder: Option<(String, String)>,
}

impl ApiError {
    /// An error with an explicit status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: std::borrow::Cow::Borrowed(code),
            message: message.into(),
            holder: None,
        }
    }

    /// 400 with a code naming what was wrong in the request.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn unauthorized(message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The human message.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn internal(what: &str, error: &dyn std::error::Error) -> Self {
        tracing::error!(error = %warren_provisioner::error_chain(error), "{what}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{what}; the server log has the details"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: ErrorDetail {
                    holder: self.holder.as_ref().map(|(holder, _)| holder.clone()),
                    expires_at: self.holder.map(|(_, expires_at)| expires_at),
                    ..ErrorDetail::new(self.code, self.message)
                },
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<ProvisionerError> for ApiError {
    fn from(error: ProvisionerError) -> Self {
        use ProvisionerError as P;
        let message = error.to_string();
        match &error {
            P::Invalid(core) => Self::bad_request(core_code(core), message),
            P::BadRequest(_) => Self::bad_request("invalid_request", message),
            P::TokenInEnv { .. } => Self::bad_request("token_in_env", message),
            P::TokenInCommand { .. } => Self::bad_request("token_in_command", message),
            P::WorkdirNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "workdir_not_found", message)
            }
            P::WorkdirNotADirectory { .. } => Self::bad_request("workdir_not_a_directory", message),
            P::SandboxNotFound(_) => Self::new(StatusCode::NOT_FOUND, "sandbox_not_found", message),
            P::WorkdirConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "workdir_conflict", message)
            }
            P::NetworkConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "network_conflict", message)
            }
            P::EnvPolicyConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "env_policy_conflict", message)
            }
            P::BackendConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "backend_conflict", message)
            }
            P::LayoutConflict { .. } => Self::new(StatusCode::CONFLICT, "layout_conflict", message),
            P::ExtraMountsConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "extra_mounts_conflict", message)
            }
            P::IsolationConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "isolation_conflict", message)
            }
            // Well-formed, but this server cannot honour it now (issue 19): like an image
            // missing from the Docker host, 422 rather than the caller's syntax error.
            P::IsolationUnavailable { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "isolation_unavailable",
                message,
            ),
            P::ExtraMountSource { .. } => Self::bad_request("extra_mount_unusable", message),
            P::InvalidNode(_) => Self::bad_request("invalid_node", message),
            P::BackendUnavailable { .. } => Self::bad_request("backend_unavailable", message),
            P::InvalidImage { .. } => Self::bad_request("invalid_image", message),
            P::NotInOutputs { .. } => Self::bad_request("not_in_outputs", message),
            P::ArtifactTooLarge { .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "too_large", message)
            }
            P::ArtifactNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "artifact_not_found", message)
            }
            P::SnapshotNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "snapshot_not_found", message)
            }
            P::SandboxAlreadyLive { .. } => {
                Self::new(StatusCode::CONFLICT, "sandbox_already_live", message)
            }
            P::RuntimeNotRunning { .. } => {
                Self::new(StatusCode::CONFLICT, "runtime_not_running", message)
            }
            P::SnapshotUnsupported { .. } => Self::new(
                StatusCode::NOT_IMPLEMENTED,
                "snapshot_not_supported",
                message,
            ),
            P::SkillNotGranted { .. } => {
                Self::new(StatusCode::NOT_FOUND, "skill_not_granted", message)
            }
            P::WorkdirNotEmpty { .. } => {
                Self::new(StatusCode::CONFLICT, "workdir_not_empty", message)
            }
            P::UnknownHostDir { .. } => Self::bad_request("unknown_host_dir", message),
            P::GitSourceRefused { .. } => Self::bad_request("git_source_refused", message),
            P::GitFailed { .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "git_failed", message)
            }
            P::CheckpointNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "checkpoint_not_found", message)
            }
            P::SandboxBusy { .. } => Self::new(StatusCode::CONFLICT, "sandbox_busy", message),
            P::ShellSessionNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "shell_session_not_found", message)
            }
            P::ShellSessionBusy { .. } => {
                Self::new(StatusCode::CONFLICT, "shell_session_busy", message)
            }
            P::TooManyShellSessions { .. } => {
                Self::new(StatusCode::CONFLICT, "too_many_shell_sessions", message)
            }
            P::ShellStartFailed { .. } => {
                Self::new(StatusCode::BAD_GATEWAY, "shell_start_failed", message)
            }
            P::ProcessNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "process_not_found", message)
            }
            P::ProcessTagNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "process_not_found", message)
            }
            P::ProcessStdinClosed { .. } => {
                Self::new(StatusCode::CONFLICT, "stdin_closed", message)
            }
            P::ProcessEnded { .. } => Self::new(StatusCode::CONFLICT, "process_ended", message),
            P::StdinInterrupted { .. } => Self::bad_request("stdin_interrupted", message),
            P::NotATerminal { .. } => Self::new(StatusCode::CONFLICT, "not_a_terminal", message),
            P::WatchedDirGone { .. } => {
                Self::new(StatusCode::NOT_FOUND, "watched_dir_gone", message)
            }
            P::WatchTooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "watch_too_large", message)
            }
            P::WatchFailed => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "watch_failed", message),
            P::TooManyProcesses { .. } => {
                Self::new(StatusCode::CONFLICT, "too_many_processes", message)
            }
            P::ProcessNotStarted { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "process_not_started",
                message,
            ),
            P::Snapshot(error) => snapshot_error(error, &message),
            P::EnvVarNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, "env_var_not_found", message)
            }
            P::SandboxTerminated { state, .. } => {
                let code = if *state == "terminating" {
                    "sandbox_terminating"
                } else {
                    "sandbox_terminated"
                };
                Self::new(StatusCode::CONFLICT, code, message)
            }
            P::TerminatedWhileRunning { .. } => {
                Self::new(StatusCode::CONFLICT, "sandbox_terminated", message)
            }
            P::LeaseNotFound { .. } => Self::new(StatusCode::NOT_FOUND, "lease_not_found", message),
            // The execution guard (I33): a holder learns who has it and until when, so it
            // can wait for the lapse instead of polling blindly.
            P::GuardHeld {
                holder, expires_at, ..
            } => Self {
                holder: Some((
                    holder.clone(),
                    expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                )),
                ..Self::new(StatusCode::CONFLICT, "guard_held", message)
            },
            P::FenceStale { .. } => Self::new(StatusCode::CONFLICT, "fence_stale", message),
            P::FenceInvalid { .. } => Self::bad_request("fence_invalid", message),
            P::GuardNotFound { .. } => Self::new(StatusCode::NOT_FOUND, "guard_not_found", message),
            P::ExecUnsupported { .. } => {
                Self::new(StatusCode::NOT_IMPLEMENTED, "exec_not_supported", message)
            }
            // Cluster mode (issue 14): each is retryable, and another replica may serve.
            P::NodeFenced { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "node_fenced", message)
            }
            P::RuntimeElsewhere { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "runtime_elsewhere",
                message,
            ),
            P::PeerUnreachable { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "node_unreachable", message)
            }
            P::NotOwnerHere { .. } => Self::new(
                StatusCode::CONFLICT,
                warren_provisioner::NOT_OWNER_CODE,
                message,
            ),
            P::NoPeerLink => Self::internal("no cluster link is configured", &error),
            P::Forwarded {
                status,
                code,
                message,
            } => Self {
                status: StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
                code: std::borrow::Cow::Owned(code.clone()),
                message: message.clone(),
                holder: None,
            },
            P::Store(warren_store::StoreError::NotOwner { .. }) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "runtime_moved",
                "the sandbox's runtime moved to another node; run the command again",
            ),
            P::ReadOnlyPath { .. } => Self::new(StatusCode::FORBIDDEN, "read_only", message),
            P::InvalidCwd { .. } => Self::bad_request("invalid_cwd", message),
            // The uid's own volume is full (I23); other uids and the server are unaffected.
            P::QuotaExceeded { .. } => {
                Self::new(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", message)
            }
            // The server's disk, not the uid's quota: 507 as well, with its own code.
            P::NoRoomForVolume { .. } => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                message,
            ),
            P::Volume { .. } | P::WorkspacesWithoutVolumes { .. } => {
                Self::internal("the workspace volume failed", &error)
            }
            P::File { path, source } => file_error(path, source),
            P::Store(e @ warren_store::StoreError::AgentEnvFull { .. }) => {
                Self::new(StatusCode::CONFLICT, "agent_env_full", e.to_string())
            }
            // The database is out of reach (restarting, network): nothing was half-done,
            // and the same request may succeed shortly.
            P::Store(e) if e.is_unavailable() => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "state_store_unavailable",
                format!("{e}; try again shortly"),
            ),
            P::Store(e) => Self::internal("the state store failed", e),
            P::Backend(e) => backend_error(e),
            P::Interrupted(e) => Self::internal("a file operation was interrupted", e),
        }
    }
}

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

fn snapshot_error(error: &warren_snapshot::SnapshotError, message: &str) -> ApiError {
    use warren_snapshot::SnapshotError as S;
    match error {
        S::File(source) => file_error("the workdir", source),
        S::ManifestNotFound(_) | S::MissingChunk { .. } | S::Corrupt { .. } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "checkpoint_unusable",
            message.to_owned(),
        ),
        // The data limit is the operator's ([snapshots] max_bytes): the tree must shrink.
        S::TooLarge { .. } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "snapshot_too_large",
            message.to_owned(),
        ),
        S::Cancelled { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "snapshot_cancelled",
            message.to_owned(),
        ),
        S::Store { .. } | S::Io { .. } | S::InvalidKey(_) => {
            ApiError::internal("the snapshot store failed", error)
        }
    }
}

fn backend_error(error: &BackendError) -> ApiError {
    match error {
        BackendError::ExecUnsupported { .. } => ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "exec_not_supported",
            error.to_string(),
        ),
        BackendError::ProcessesUnsupported { .. } => ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "processes_not_supported",
            error.to_string(),
        ),
        BackendError::RuntimeNotFound { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "runtime_not_found",
            format!("{error}; try again"),
        ),
        // Staging failures (`warren_backend::staging`) arise while a runtime starts.
        BackendError::Create { .. }
        | BackendError::HostDir { .. }
        | BackendError::MountRefused { .. } => {
            ApiError::internal("the runtime could not be started", error)
        }
        BackendError::Exec { .. } => ApiError::internal("the command could not be run", error),
        BackendError::ImageNotFound { .. } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "image_not_found",
            error.to_string(),
        ),
        BackendError::Discover { .. } => {
            ApiError::internal("the backend's runtimes could not be listed", error)
        }
        BackendError::Kill { .. } => {
            ApiError::internal("the runtime's processes could not be killed", error)
        }
        BackendError::Destroy { .. } => {
            ApiError::internal("the runtime could not be destroyed", error)
        }
        // The cluster's own answers (issue 15): a refusal of warren's service account is
        // the operator's to fix; overload or an outage, after the retries Kubernetes
        // allows, is worth trying again; anything else is the cluster rejecting warren.
        BackendError::Cluster { code: 403, .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "cluster_forbidden",
            format!(
                "{error}; grant warren's service account the Role `warren k8s manifests` writes"
            ),
        ),
        BackendError::Cluster { code, .. } if *code == 0 || *code == 429 || *code >= 500 => {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "cluster_unavailable",
                format!("{error}; try again"),
            )
        }
        BackendError::Cluster { .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "cluster_refused",
            error.to_string(),
        ),
        BackendError::NotReady { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "runtime_not_ready",
            error.to_string(),
        ),
    }
}

/// Maps a file-layer error. The message names the *virtual* path (I1) followed by the file
/// layer's reason with its own (root-relative) path stripped, so one message never mixes
/// two path spaces.
fn file_error(path: &str, error: &FsError) -> ApiError {
    use FsError as F;
    let (status, code) = match error {
        F::InvalidPath { .. } => (StatusCode::BAD_REQUEST, "invalid_path"),
        F::SymlinkRefused { .. } => (StatusCode::FORBIDDEN, "symlink_refused"),
        F::MountCrossingRefused { .. } => (StatusCode::FORBIDDEN, "mount_crossing_refused"),
        F::RootRefused { .. } => (StatusCode::FORBIDDEN, "root_refused"),
        F::ReadOnly { .. } => (StatusCode::FORBIDDEN, "read_only"),
        F::PermissionDenied { .. } => (StatusCode::FORBIDDEN, "permission_denied"),
        F::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
        F::NotADirectory { .. } => (StatusCode::BAD_REQUEST, "not_a_directory"),
        F::IsADirectory { .. } => (StatusCode::BAD_REQUEST, "is_a_directory"),
        F::NotAFile { .. } => (StatusCode::BAD_REQUEST, "not_a_file"),
        F::AlreadyExists { .. } => (StatusCode::CONFLICT, "already_exists"),
        F::DirectoryNotEmpty { .. } => (StatusCode::CONFLICT, "directory_not_empty"),
        // The file, not the request, is too large: read it in byte ranges.
        F::TooLarge { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "too_large"),
        F::RangeNotSatisfiable { .. } => {
            (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable")
        }
        F::PreconditionFailed { .. } => (StatusCode::PRECONDITION_FAILED, "precondition_failed"),
        F::EditNoMatch { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "edit_no_match"),
        F::EditAmbiguous { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "edit_ambiguous"),
        F::EditEmptyOld { .. } => (StatusCode::BAD_REQUEST, "invalid_edit"),
        F::NotUtf8 { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "not_utf8"),
        F::InvalidMode { .. } => (StatusCode::BAD_REQUEST, "invalid_mode"),
        F::InvalidEtag { .. } => (StatusCode::BAD_REQUEST, "invalid_etag"),
        F::InvalidGlob { .. } => (StatusCode::BAD_REQUEST, "invalid_glob"),
        F::InvalidRegex { .. } => (StatusCode::BAD_REQUEST, "invalid_regex"),
        F::TooDeep { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "too_deep"),
        F::TooManyEntries { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "too_many_entries"),
        F::Busy { .. } => (StatusCode::SERVICE_UNAVAILABLE, "file_busy"),
        F::Write { .. } | F::Create { .. } if is_disk_full(error) => {
            (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
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
        | F::Io { .. } => return ApiError::internal("a file operation failed", error),
    };
    ApiError::new(
        status,
        code,
        format!("{path}: {}", strip_relative_path(&error.to_string())),
    )
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "route_not_found",
        "no such endpoint; GET /v1/openapi.json lists them",
    )
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not accept that method; GET /v1/openapi.json lists them",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_layer_paths_are_stripped_from_messages() {
        assert_eq!(
            strip_relative_path("`a/b`: not a directory"),
            "not a directory"
        );
        assert_eq!(
            strip_relative_path("invalid glob \"[\""),
            "invalid glob \"[\""
        );
    }
}
