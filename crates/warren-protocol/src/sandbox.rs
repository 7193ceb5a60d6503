//! Wire types of sandboxes: creating, updating, pausing, resuming and terminating one, and
//! what one looks like.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::strict;

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
    /// A branch of the workdir (`POST /v1/users/{uid}/branches`) this sandbox writes
    /// instead of the workdir itself: its runtimes and file operations see the branch where
    /// the workdir is (I27). Part of the binding. Absent: a live sandbox's is kept when no
    /// workdir is named, else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Network policy; default: the server's (`[network] default`, loopback only unless
    /// configured). Part of the binding: a live sandbox cannot change it (409
    /// `network_conflict`).
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
    /// The backend hosting the runtime: `local`, `docker` or `kubernetes` (those the
    /// server enables).
    /// Default: the server's default backend, or the live sandbox's. Part of the binding
    /// (409 `backend_conflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// For `docker` or `kubernetes`: the image the runtime runs (`name[:tag]` or
    /// `name@sha256:…`; on Docker already present, warren never pulls). Default: the
    /// server's image for that backend (`docker.image`, `kubernetes.image`). Part of the
    /// binding (409 `backend_conflict`).
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
    /// Default: the server's (`tier` in warren.toml), or the live sandbox's. Part of the
    /// binding (409 `isolation_conflict`).
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
    /// Egress secrets of the sandbox's own (issue 38), over its uid's of the same name:
    /// inside, `WARREN_SECRET_<NAME>` holds a placeholder, and warren's proxy presents the
    /// value only to the destinations each is bound to. At most 64 (a name given twice:
    /// the last one counts); gone when the sandbox ends. Given for a live sandbox, they are
    /// set (rotated) on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::NewEgressSecret>,
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
    /// For `open` and `allowlist`: destinations refused whatever else allows them, by name
    /// before any lookup and by resolved address (same forms as `allow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
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
    /// The branch of the workdir it writes instead, if bound to one (I27).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
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

/// `POST /v1/sandboxes/{id}/terminate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminateSandbox {
    /// Seconds commands already running get to finish before they are killed (0 to
    /// 300); default 10. New commands and leases are refused from the start.
    #[serde(default, deserialize_with = "strict::whole_number")]
    pub grace_s: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    /// How many forks: 1 to 20 (default 1).
    #[serde(
        default,
        deserialize_with = "strict::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub count: Option<u64>,
    /// Seconds each fork lives before its deadline; default: none.
    #[serde(
        default,
        deserialize_with = "strict::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_s: Option<u64>,
    /// Labels of every fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Answer of `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForkedSandboxes {
    /// The source as it is now: bound to a branch of its workdir, its runtime started
    /// again (if one ran) from the snapshot the forks start from.
    pub source: SandboxInfo,
    /// The new sandboxes, each bound to its own branch of the same workdir.
    pub forks: Vec<SandboxInfo>,
    /// The runtime snapshot every fork starts from; absent when the source never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// What a fork does not carry: memory and running processes (the runtime is a process
    /// tree, not a VM). The source's running processes ended, as at a pause.
    pub not_forked: String,
}
