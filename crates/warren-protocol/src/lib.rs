//! Wire types of warren's HTTP API (`/v1`), shared by the server and the client.
//!
//! These are the contract other issues and clients rely on: field names are stable, new
//! fields are added as optional. Paths in every type are virtual paths (I1); no host path
//! ever appears in a response.

#![deny(missing_docs)]

pub mod codes;
mod process;
pub mod strict;

pub use process::{
    ProcessEvent, ProcessInfo, ProcessList, ProcessOutput, SignalName, SignalProcess, StartProcess,
    StdinWritten, TerminalSize, SIGNALS,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: `{"error":{"code":"…","message":"…"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A stable machine-readable code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code, e.g. `workdir_conflict`.
    pub code: String,
    /// What went wrong and, where possible, what to do.
    pub message: String,
    /// With `guard_held`: who holds the sandbox's execution guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// With `guard_held`: when the holder's guard lapses unless renewed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl ErrorDetail {
    /// A code and a message, no details.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            holder: None,
            expires_at: None,
        }
    }
}

/// `GET /health`: the process and its backend are initialised — nothing more (I17).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the server answers.
    pub status: String,
    /// warren's version.
    pub version: String,
    /// The default backend's name.
    pub backend: String,
    /// Every backend a sandbox may choose on this server (`"backend"` on create), the
    /// default first.
    #[serde(default)]
    pub backends: Vec<String>,
    /// Whether the default backend isolates runtimes; false for `memory` (I20).
    pub isolation: bool,
    /// Whether the default backend executes commands.
    pub exec: bool,
    /// What the backend cannot enforce on this host (missing cgroup controllers, no
    /// Landlock, ...); empty when everything is in force.
    pub warnings: Vec<String>,
    /// How workspace storage quotas are enforced (I23): `off` (none configured),
    /// `volumes` (a filesystem per uid: bytes and inodes enforced by the kernel) or
    /// `unenforced` (configured, but this host cannot enforce them).
    #[serde(default)]
    pub quotas: String,
    /// Whether this host can run the gVisor tier, as probed once at start-up (issue 19).
    #[serde(default)]
    pub gvisor: GvisorHealth,
}

/// [`Health::gvisor`]: what the gVisor probe found when the server started (issue 19).
/// Whether a given backend runs the tier is its own matter: a sandbox asking for it where
/// its backend cannot is refused with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GvisorHealth {
    /// runsc is installed and a sandbox ran on one of its platforms here.
    pub available: bool,
    /// The platform gVisor sandboxes run on; null when unavailable.
    pub platform: Option<GvisorPlatform>,
    /// Why this platform, or why gVisor is unavailable.
    pub reason: Option<String>,
    /// What `runsc --version` reports; null when runsc was not found or did not answer.
    pub runsc_version: Option<String>,
    /// What a sandbox on the gVisor tier cannot do here, or does differently from the
    /// kernel tier; empty when the tier is unavailable.
    #[serde(default)]
    pub limitations: Vec<String>,
}

/// The runsc platform that intercepts a gVisor sandbox's system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GvisorPlatform {
    /// ptrace: works wherever ptrace is allowed.
    Ptrace,
    /// kvm: hardware virtualization (vmx/svm).
    Kvm,
}

/// `GET /v1/users/{uid}/usage`: a uid's workspace storage against its quota (I23), from the
/// kernel's accounting of the uid's own filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceUsage {
    /// The uid.
    pub uid: String,
    /// `off`, `volumes` or `unenforced` (see [`Health::quotas`]).
    pub enforcement: String,
    /// Bytes (the filesystem's metadata included).
    pub bytes: UsageFigure,
    /// Inodes: files, directories and links.
    pub inodes: UsageFigure,
}

/// One quantity of [`WorkspaceUsage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageFigure {
    /// In use; `null` where the kernel does not account for the workspace on its own.
    pub used: Option<u64>,
    /// The limit; `null` without a quota.
    pub limit: Option<u64>,
}

/// `POST /v1/users/{uid}/workdirs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkdir {
    /// Relative workdir, e.g. `projects/x`; default `projects/<uuid>` (I8).
    #[serde(default)]
    pub path: Option<String>,
    /// Fill the (new or empty) workdir from these sources (I32); 409 `workdir_not_empty`
    /// otherwise, so no file is ever overwritten.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::object"
    )]
    pub init: Option<InitSpec>,
}

/// Where a workdir's first files come from; any combination, applied in the order
/// host_dir, git, files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InitSpec {
    /// The name of a host directory the operator allowed (`[init] host_dirs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_dir: Option<String>,
    /// A git repository cloned whole and checked out at `rev`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::object"
    )]
    pub git: Option<GitSpec>,
    /// Files by workdir-relative path, with their text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
}

/// A git repository and revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitSpec {
    /// `https://`, `http://`, `ssh://` or `git://` (`file://` only inside an allowed host
    /// directory).
    pub url: String,
    /// A branch, tag or commit; default: the remote's default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rev: Option<String>,
}

/// A workdir of a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkdirInfo {
    /// Relative workdir inside the UserWorkspace.
    pub workdir: String,
    /// The same directory as a virtual path.
    pub path: String,
    /// When warren recorded it (RFC 3339).
    pub created_at: String,
    /// What initialisation put in, when `init` was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialized: Option<InitSummary>,
}

/// `GET /v1/users/{uid}/workdirs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkdirList {
    /// The workdirs, oldest first.
    pub workdirs: Vec<WorkdirInfo>,
}

/// `POST /v1/sandboxes`: either the explicit identity (`uid` and `runtime_scope_id`, the
/// primary form) or an isolation scope with the ids it needs (I29), never both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// The workspace owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The runtime scope: the root conversation's thread id (I6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_scope_id: Option<String>,
    /// Instead of `uid` and `runtime_scope_id`: `user` (every session of the user shares
    /// the sandbox; without `user_id` it falls back to `session`), `session`, `agent` or
    /// `global`. The derived owner is the user id, `session:<id>`, `agent:<id>` or
    /// `global:shared`; the runtime scope is the scope's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// With `scope`: the end user's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// With `scope`: the session (conversation) id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// With `scope`: the agent's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Relative workdir; when absent, the live sandbox's workdir is kept or a fresh
    /// `projects/<uuid>` is created (I8).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Network policy; default `{"mode":"none"}` (loopback only). Part of the binding: a
    /// live sandbox cannot change it (409 `network_conflict`).
    #[serde(default, deserialize_with = "strict::object")]
    pub network: Option<NetworkSpec>,
    /// Whether commands get the global sandbox environment and the uid's agent environment
    /// (default true). `false` gives them only the clean base and each call's own `env`
    /// (I14). Part of the binding (409 `env_policy_conflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherit_env: Option<bool>,
    /// A temporary scope with no persistent uid mount (default false): the runtime gets a
    /// scratch `/home/gem/user-data` and an empty `/home/gem/skills`, both removed when the
    /// sandbox is terminated or reaped (I14). The uid's workspace is never created or
    /// touched. Part of the binding (409 `env_policy_conflict`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
    /// A runtime snapshot (`snap-…`) of one of the uid's sandboxes: the first runtime of
    /// this new sandbox (or new generation) starts from it (I30). 409 `sandbox_already_live`
    /// when the sandbox is live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// The backend hosting the runtime: `local` or `docker` (when the server enables it).
    /// Default: the server's default backend, or the live sandbox's. Part of the binding
    /// (409 `backend_conflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// For `docker`: the image the container runs (`name[:tag]` or `name@sha256:…`,
    /// already present on the Docker host; warren never pulls). Default: the server's
    /// `--image`. Part of the binding (409 `backend_conflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// What the runtime looks like from inside. `ars` (the default): the UserWorkspace at
    /// `/home/gem/user-data`, the skill projection at `/home/gem/skills`. `deerflow`: the
    /// workdir at `/mnt/user-data` (with `workspace/`, `uploads/` and `outputs/` made in
    /// it), the skill projection at `/mnt/skills/public` and the uid's personal skills at
    /// `/mnt/skills/custom`, both read-only. `e2b`: sandbox user `user`, the workdir
    /// itself mounted (writable) as the home `/home/user`. File paths of the sandbox use
    /// the same names. Part of the binding (409 `layout_conflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<SandboxLayout>,
    /// How strongly the runtime is separated from the host kernel (issue 19). `kernel`:
    /// namespaces, cgroups, seccomp and Landlock on the host kernel. `gvisor`: every
    /// system call is served by gVisor's user-space kernel, for untrusted code; 422
    /// `isolation_unavailable` when the sandbox's backend cannot run it on this server.
    /// Default: the server's (`isolation` in warren.toml), or the live sandbox's. Part of
    /// the binding (409 `isolation_conflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<SandboxIsolation>,
    /// Seconds from now until the sandbox's deadline, when `on_deadline` happens to it (at
    /// most 31536000); default: no deadline. Given for a live sandbox, it moves its
    /// deadline. `PATCH /v1/sandboxes/{id}` moves it later.
    #[serde(
        default,
        deserialize_with = "strict::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_s: Option<u64>,
    /// What the deadline does: `terminate` (the default) or `pause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_deadline: Option<OnDeadline>,
    /// The caller's labels (at most 64, 16 KiB in all), which `GET /v1/sandboxes?label=k=v`
    /// filters on. Given for a live sandbox, they replace its labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// What happens to a sandbox when its deadline passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnDeadline {
    /// Terminated: its runtime ends, its workspace files stay.
    #[default]
    Terminate,
    /// Paused, as `POST /v1/sandboxes/{id}/pause` does.
    Pause,
}

/// `PATCH /v1/sandboxes/{id}`: what is absent stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// Seconds from now until the deadline (at most 31536000); `null` removes it.
    #[serde(
        default,
        deserialize_with = "strict::nullable_whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>, nullable)]
    pub timeout_s: Option<Option<u64>>,
    /// What the deadline does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_deadline: Option<OnDeadline>,
    /// Replace the labels, all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// `POST /v1/sandboxes/{id}/resume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSandbox {
    /// Seconds from now until a new deadline; default: the deadline stays, or goes if it
    /// passed while the sandbox was paused.
    #[serde(
        default,
        deserialize_with = "strict::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_s: Option<u64>,
}

/// Answer of `POST /v1/sandboxes/{id}/pause`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PausedSandbox {
    /// The sandbox, `paused`.
    pub sandbox: SandboxInfo,
    /// Whether a runtime ran and was ended: its running processes ended with it, and its
    /// memory is not kept. Files and installed packages are.
    pub processes_ended: bool,
    /// The runtime snapshot a resume starts from; absent when no runtime ran or the
    /// backend takes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_snapshot: Option<String>,
    /// Why a runtime that ran was not snapshotted: what changed in it since its latest
    /// snapshot is lost (the workspace never is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_error: Option<String>,
}

/// One event of a directory watch (`GET /v1/sandboxes/{id}/watch`): NDJSON lines, or SSE
/// events named by `type`. `name` is the entry's path relative to the watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The watch runs; the first event.
    Start {
        /// The watched directory, as a virtual path.
        path: String,
    },
    /// An entry was made, or moved in.
    Create {
        /// Relative to the watched directory.
        name: String,
    },
    /// A file was written.
    Write {
        /// Relative to the watched directory.
        name: String,
    },
    /// An entry was removed.
    Remove {
        /// Relative to the watched directory.
        name: String,
    },
    /// An entry was moved away (its old name).
    Rename {
        /// Relative to the watched directory.
        name: String,
    },
    /// An entry's permissions changed.
    Chmod {
        /// Relative to the watched directory.
        name: String,
    },
    /// Nothing happened for a while; the watch still runs.
    Keepalive,
    /// The watch ended (the directory went away, the sandbox stopped running); nothing
    /// follows.
    Error {
        /// Why.
        error: ErrorDetail,
    },
}

/// The isolation tier a sandbox's runtimes run on (issue 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxIsolation {
    /// Namespaces, cgroups, seccomp and Landlock on the host kernel; the default.
    Kernel,
    /// gVisor: the runtime's system calls are served by a user-space kernel (runsc).
    Gvisor,
}

/// What a sandbox's runtime looks like from inside (its layout, I7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxLayout {
    /// The UserWorkspace at `/home/gem/user-data`, the skill projection at
    /// `/home/gem/skills` (read-only); the default.
    Ars,
    /// The workdir at `/mnt/user-data`, the skill projection and the uid's personal
    /// skills at `/mnt/skills/public` and `/mnt/skills/custom` (read-only): DeerFlow's
    /// AIO sandbox view.
    Deerflow,
    /// E2B's `base` template view: user `user`, the workdir mounted (writable) as the
    /// home `/home/user`; no skill mount.
    E2b,
}

/// Where a sandbox's processes may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// `none` (loopback only), `open` (HTTP/HTTPS egress through warren's proxy to public
    /// destinations) or `allowlist` (only the listed destinations, through the proxy).
    pub mode: String,
    /// For `allowlist`: host names, `*.suffix` wildcards, IP addresses or CIDR ranges.
    /// Internal addresses (loopback, private, link-local) are reachable only when listed
    /// as an address or range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

/// A sandbox: the identity of one (uid, runtime scope) and the state of its runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    /// Stable id derived from uid and runtime scope only (I5).
    pub sandbox_id: String,
    /// The workspace owner.
    pub uid: String,
    /// The runtime scope.
    pub runtime_scope_id: String,
    /// Relative workdir inside the UserWorkspace.
    pub workdir: String,
    /// The workdir as a virtual path: the default cwd of commands.
    pub workdir_path: String,
    /// What the runtime looks like from inside.
    pub layout: SandboxLayout,
    /// The isolation tier its runtimes run on.
    pub isolation: SandboxIsolation,
    /// The network policy.
    pub network: NetworkSpec,
    /// The backend hosting the runtime.
    pub backend: String,
    /// The image of a Docker sandbox's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Whether commands get the global and the uid's agent environment.
    pub inherit_env: bool,
    /// Whether the runtime mounts scratch space instead of the uid's workspace.
    pub ephemeral: bool,
    /// `created` (no runtime yet, I12), `running`, `stopped`, `pausing`, `paused` (no run
    /// starts until it is resumed), `terminating`, `terminated`.
    pub state: String,
    /// The caller's labels.
    pub labels: BTreeMap<String, String>,
    /// When its deadline passes (RFC 3339), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// What the deadline does.
    pub on_deadline: OnDeadline,
    /// Incremented each time the identity is reused after termination.
    pub generation: i64,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub last_active_at: String,
    /// What this sandbox's isolation tier cannot do on this server, or does differently:
    /// the gVisor tier's limitations as probed at start-up (issue 19); empty on the kernel
    /// tier.
    pub warnings: Vec<String>,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    /// The sandboxes, oldest first.
    pub sandboxes: Vec<SandboxInfo>,
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecCommand {
    /// A shell command line, run with `/bin/sh -c`. Exactly one of `command` and `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory as a virtual path; default: the workdir.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment for this call.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The shell for `command`: `sh` (default, `/bin/sh -c`) or `bash`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Wall-clock limit in seconds (default 60, at most 3600).
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub timeout_s: Option<u64>,
    /// Text written to the command's stdin.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// The result of one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// The run record's id (I22).
    pub run_id: String,
    /// Exit status, when the command exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Standard output (invalid UTF-8 replaced).
    pub stdout: String,
    /// Standard error (invalid UTF-8 replaced).
    pub stderr: String,
    /// Output was cut at the output cap.
    pub truncated: bool,
    /// The timeout ended the command.
    pub timed_out: bool,
    /// Wall-clock time in milliseconds.
    pub duration_ms: u64,
}

/// One event of a streaming exec (`Accept: application/x-ndjson` gives one JSON object per
/// line; `Accept: text/event-stream` gives the same objects as SSE `data:` with the `type`
/// as the event name). Output arrives as it is written; `exit` (or `error`) comes last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// Bytes on standard output, base64-encoded (binary-safe).
    Stdout {
        /// Base64 of the bytes.
        data: String,
    },
    /// Bytes on standard error, base64-encoded.
    Stderr {
        /// Base64 of the bytes.
        data: String,
    },
    /// The command ended; `stdout`/`stderr` in the result hold what was kept under the cap.
    Exit {
        /// The result.
        result: ExecResult,
    },
    /// The exec failed; no `exit` follows.
    Error {
        /// The error.
        error: ErrorDetail,
    },
}

/// `POST /v1/sandboxes/{id}/leases`: a run's hold on the sandbox's runtime (I25).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLease {
    /// Who holds it: the run id of a root run or one of its child runs.
    pub holder: String,
    /// Seconds until it lapses unless renewed (1 to 3600).
    #[serde(deserialize_with = "strict::required_whole_number")]
    pub ttl_s: u64,
}

/// `POST /v1/sandboxes/{id}/terminate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminateSandbox {
    /// Seconds commands already running get to finish before they are killed (0 to
    /// 300); default 10. New commands and leases are refused from the start.
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub grace_s: Option<u64>,
}

/// Answer of `POST /v1/sandboxes/{id}/kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KilledProcesses {
    /// The sandbox whose processes were killed; it keeps running.
    pub sandbox_id: String,
    /// How many processes were killed (0 when its runtime was not running).
    pub killed: u64,
}

/// `POST /v1/sandboxes/{id}/leases/{lease_id}/renew`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewLease {
    /// New lifetime in seconds from now (1 to 3600); default 60.
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub ttl_s: Option<u64>,
}

/// A lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseInfo {
    /// The lease's id.
    pub lease_id: String,
    /// Who holds it.
    pub holder: String,
    /// The sandbox generation it holds.
    pub generation: i64,
    /// When it lapses unless renewed (RFC 3339).
    pub expires_at: String,
}

/// `POST /v1/sandboxes/{id}/guard`: the sandbox's execution guard for one executor (I33).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGuard {
    /// Who holds it: a run, worker or replica id, 1 to 256 bytes of printable text. Other
    /// holders see it in their `guard_held` answers.
    pub holder: String,
    /// Seconds until it lapses unless renewed (1 to 3600). Renew at a third of it.
    #[serde(deserialize_with = "strict::required_whole_number")]
    pub ttl_s: u64,
}

/// `POST /v1/sandboxes/{id}/guard/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewGuard {
    /// The token the acquisition returned.
    #[serde(deserialize_with = "strict::required_whole_number")]
    pub token: u64,
    /// New lifetime in seconds from now (1 to 3600); without it, the lifetime the guard
    /// was last granted or renewed for.
    #[serde(
        default,
        deserialize_with = "strict::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_s: Option<u64>,
}

/// A sandbox's execution guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GuardInfo {
    /// The fencing token: larger than every token issued before for this sandbox. Send it
    /// as `X-Warren-Fence` with every change to the sandbox.
    pub token: i64,
    /// Who holds it.
    pub holder: String,
    /// When it was acquired (RFC 3339).
    pub acquired_at: String,
    /// When it lapses unless renewed (RFC 3339, the server's clock).
    pub expires_at: String,
}

/// The cluster as the state store records it (issue 14): every node that registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterInfo {
    /// The node that answered.
    pub node_id: String,
    /// Every node that ever registered, by id.
    pub nodes: Vec<ClusterNode>,
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterNode {
    /// Its `--node-id`.
    pub node_id: String,
    /// The internal URL other replicas reach it at.
    pub advertise: String,
    /// Grows at every registration of this id; an older epoch can no longer act.
    pub epoch: i64,
    /// Its lease, by the state store's clock.
    pub state: ClusterNodeState,
    /// When this epoch registered (RFC 3339).
    pub registered_at: String,
    /// When the lease was last renewed (RFC 3339).
    pub renewed_at: String,
    /// When the lease lapses unless renewed (RFC 3339).
    pub expires_at: String,
    /// When it left cleanly (RFC 3339), if it did.
    pub left_at: Option<String>,
    /// Runtimes the state store records this node as owning at this epoch.
    pub runtimes: u64,
}

/// Where a node's lease is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterNodeState {
    /// Renewed within its TTL.
    Live,
    /// Not renewed within its TTL: dead, paused or cut off.
    Lapsed,
    /// Left cleanly when its server stopped.
    Left,
}

/// One file system entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    /// Virtual path.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits, e.g. 420 for 0644.
    pub mode: u32,
    /// Last modification (RFC 3339).
    pub modified: String,
}

/// `GET /v1/sandboxes/{id}/files/list`, and the answer of `glob`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    /// The directory listed or searched, as a virtual path.
    pub path: String,
    /// Entries sorted by path.
    pub entries: Vec<FileEntry>,
    /// More entries exist than were returned.
    pub truncated: bool,
}

/// The answer of a write, append or edit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WriteResult {
    /// Virtual path.
    pub path: String,
    /// The new ETag (also in the `ETag` header).
    pub etag: String,
    /// New size in bytes.
    pub size: u64,
    /// The file did not exist before.
    pub created: bool,
}

/// `POST /v1/sandboxes/{id}/files/edit`: exact string replacement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFile {
    /// Virtual path of a UTF-8 text file.
    pub path: String,
    /// Text to find; must match exactly once unless `replace_all`.
    pub old: String,
    /// Replacement text.
    pub new: String,
    /// Replace every match.
    #[serde(default)]
    pub replace_all: bool,
    /// Apply only if the file's ETag still is this one (also accepted as `If-Match`).
    #[serde(default)]
    pub if_match: Option<String>,
}

/// The answer of an edit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EditResult {
    /// Virtual path.
    pub path: String,
    /// The new ETag.
    pub etag: String,
    /// How many matches were replaced.
    pub replacements: u64,
}

/// `POST /v1/sandboxes/{id}/files/glob`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobFiles {
    /// Glob pattern relative to `path`, e.g. `**/*.py`.
    pub pattern: String,
    /// Directory to search (virtual path); default: the workdir.
    #[serde(default)]
    pub path: Option<String>,
    /// Most entries returned (default 1000, at most 10000).
    #[serde(default, deserialize_with = "strict::whole_count")]
    pub limit: Option<usize>,
}

/// `POST /v1/sandboxes/{id}/files/grep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepFiles {
    /// Regular expression (Rust `regex` syntax).
    pub pattern: String,
    /// Directory or file to search (virtual path); default: the workdir.
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files whose path matches this glob.
    #[serde(default)]
    pub glob: Option<String>,
    /// Match without regard to case.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Most matches returned (default 200, at most 10000).
    #[serde(default, deserialize_with = "strict::whole_count")]
    pub max_matches: Option<usize>,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrepMatch {
    /// Virtual path of the file.
    pub path: String,
    /// 1-based line number.
    pub line_number: u64,
    /// The line (long lines are shortened).
    pub line: String,
}

/// The answer of a grep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrepResult {
    /// Matches in path and line order.
    pub matches: Vec<GrepMatch>,
    /// More matches exist than were returned.
    pub truncated: bool,
    /// How many files were searched.
    pub files_scanned: u64,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDirectory {
    /// Virtual path; missing parents are created too.
    pub path: String,
}

/// The answer of a mkdir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MakeDirectoryResult {
    /// Virtual path.
    pub path: String,
    /// The directory did not exist before.
    pub created: bool,
}

/// `POST /v1/sandboxes/{id}/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveFile {
    /// Virtual path to move.
    pub from: String,
    /// Virtual destination path.
    pub to: String,
    /// Replace an existing destination.
    #[serde(default)]
    pub overwrite: bool,
}

/// The answer of a move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MoveResult {
    /// Virtual source path.
    pub from: String,
    /// Virtual destination path.
    pub to: String,
}

/// One value in `PUT /v1/users/{uid}/env`: a bare string is a secret; the object form says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum AgentEnvValue {
    /// A secret value: masked in command output.
    Secret(String),
    /// A value with its secrecy stated.
    Detailed(SetAgentEnvVar),
}

/// A string or an object, as documented: serde's untagged derive would also read the
/// object form from an array.
impl<'de> Deserialize<'de> for AgentEnvValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(value) => Ok(Self::Secret(value)),
            value @ serde_json::Value::Object(_) => serde_json::from_value(value)
                .map(Self::Detailed)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "expected a string (a secret) or an object {\"value\", \"secret\"}",
            )),
        }
    }
}

/// `PUT /v1/users/{uid}/env/{name}`, and the object form of [`AgentEnvValue`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetAgentEnvVar {
    /// The value (at most 32 KiB, no NUL byte).
    pub value: String,
    /// Whether the value is masked in command output (default true). A secret is at least
    /// 6 bytes long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
}

/// `PUT /v1/users/{uid}/env`: the uid's whole agent environment, replacing the old one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaceAgentEnv {
    /// Variable name → value. Names are `[A-Za-z_][A-Za-z0-9_]*`; at most 256 variables.
    pub env: BTreeMap<String, AgentEnvValue>,
}

/// One variable as read back: never its value (I13).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentEnvEntry {
    /// The name.
    pub name: String,
    /// Whether the value is masked in command output.
    pub secret: bool,
    /// The value's length in bytes.
    pub length: usize,
    /// The last four characters, for values of 16 characters or more; nothing otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// RFC 3339: when it was last set.
    pub updated_at: String,
}

/// `GET /v1/users/{uid}/env`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentEnv {
    /// The uid.
    pub uid: String,
    /// Its variables, by name.
    pub variables: Vec<AgentEnvEntry>,
}

/// `POST /v1/sandboxes/{id}/artifacts`: files under the workdir's `outputs/` to present.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PresentFiles {
    /// Virtual paths (or paths relative to the workdir), each under `<workdir>/outputs/`.
    pub paths: Vec<String>,
}

/// A presented file (I26): its bytes were copied when it was presented and stay readable
/// after the runtime is reclaimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactInfo {
    /// `art-…`.
    pub artifact_id: String,
    /// The virtual path it was presented from.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the bytes, lowercase hex.
    pub sha256: String,
    /// Media type, from the file name.
    pub media_type: String,
    /// RFC 3339.
    pub created_at: String,
    /// Where to download it (same Bearer token).
    pub download_url: String,
}

/// `GET /v1/sandboxes/{id}/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactList {
    /// Oldest first.
    pub artifacts: Vec<ArtifactInfo>,
}

/// `POST /v1/viewer-links`: a link that opens the Viewer on one workdir of one uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateViewerLink {
    /// The workspace owner.
    pub uid: String,
    /// The workdir the link opens (it must exist); nothing outside it is reachable.
    pub workdir: String,
    /// Seconds the link (and the session it opens) lives: 1 to 604800, default 3600.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::whole_number"
    )]
    pub ttl_s: Option<u64>,
}

/// A signed Viewer link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ViewerLink {
    /// Path of the link on this server (`/viewer/open?t=…`); prefix the server's address.
    /// It carries a signed grant, never the provisioner token.
    pub url: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// A workdir checkpoint (I28).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInfo {
    /// `ckpt-…`.
    pub checkpoint_id: String,
    /// The workdir it records.
    pub workdir: String,
    /// Regular files recorded.
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// RFC 3339.
    pub created_at: String,
}

/// What taking a checkpoint did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointSummary {
    /// Regular files (hard links counted once).
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Sockets, fifos and devices, which are not kept.
    pub skipped: u64,
    /// Bytes read from the workdir.
    pub bytes_read: u64,
    /// Compressed bytes newly stored; chunks already stored for this uid cost nothing.
    pub bytes_stored: u64,
    /// Chunks the files were cut into, and how many were new.
    pub chunks: u64,
    /// See `chunks`.
    pub chunks_new: u64,
    /// `bytes_read / bytes_stored` (how much deduplication and compression saved).
    pub dedup_ratio: f64,
    /// Wall-clock time.
    pub elapsed_ms: u64,
}

/// `POST /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointCreated {
    /// The checkpoint.
    pub checkpoint: CheckpointInfo,
    /// What it took.
    pub summary: CheckpointSummary,
}

/// `GET /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    /// Oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
}

/// `GET /v1/sandboxes/{id}/checkpoints/{cid}/diff`: paths relative to the workdir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointDiff {
    /// There now, not in the checkpoint.
    pub added: Vec<String>,
    /// In the checkpoint, not there now.
    pub removed: Vec<String>,
    /// In both, with other content, type, mode or link target.
    pub changed: Vec<String>,
}

/// What a workdir initialisation put in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InitSummary {
    /// Regular files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// What kind of run a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// A command the caller waited for (`POST /v1/sandboxes/{id}/exec`, a shell command).
    Exec,
    /// A long-running process the caller started and comes back to.
    Process,
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Started and not yet finished.
    Running,
    /// The command ran to an end: any exit code, signal or timeout.
    Finished,
    /// warren could not run the command to completion; see `failure_reason`.
    Failed,
}

/// The record of one run (I22): what ran, where, for whom, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunInfo {
    /// The run's id (an exec answers it as `run_id`).
    pub id: String,
    /// The sandbox it ran in.
    pub sandbox_id: String,
    /// The sandbox generation it ran in.
    pub generation: i64,
    /// What kind of run it is.
    pub kind: RunKind,
    /// The caller's own label for it, if it gave one.
    pub tag: Option<String>,
    /// Whether it ran on a terminal.
    pub pty: bool,
    /// The command line, or the argv as JSON, with injected secrets masked.
    pub command: String,
    /// Its working directory, as a virtual path.
    pub cwd: String,
    /// Who asked for it.
    pub requested_by: String,
    /// Where it is in its life.
    pub status: RunStatus,
    /// When it started (RFC 3339, milliseconds): a `since` that includes it.
    pub started_at: String,
    /// When it finished or failed (RFC 3339, milliseconds).
    pub finished_at: Option<String>,
    /// The exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether warren ended it for running too long.
    pub timed_out: bool,
    /// Wall-clock run time in milliseconds, once it ended.
    pub duration_ms: Option<u64>,
    /// User CPU time in milliseconds, when measured.
    pub cpu_user_ms: Option<u64>,
    /// System CPU time in milliseconds, when measured.
    pub cpu_system_ms: Option<u64>,
    /// Peak resident memory in bytes, when measured.
    pub peak_memory_bytes: Option<u64>,
    /// Why warren could not run it to completion, when it failed.
    pub failure_reason: Option<String>,
}

/// `GET /v1/sandboxes/{id}/runs`, `GET /v1/users/{uid}/runs`: one page of run records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// Newest first (by start time, then id).
    pub runs: Vec<RunInfo>,
    /// Pass as `page_token` for the next page; null on the last page.
    pub next_page_token: Option<String>,
}
