//! The server's own state: `GET /health`, the gVisor probe and the cluster's nodes.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
