//! The provisioner: decides which runtime serves a run, when it starts and ends, and serves
//! file operations on the UserWorkspace by virtual path.
//!
//! Transports (HTTP, CLI, MCP) parse requests and call [`Provisioner`]; all rules live here.
//!
//! **Architecture invariants:**
//! - a sandbox's identity is (uid, runtime scope) and its id is derived from nothing else (I5);
//! - creating a sandbox never starts a runtime; the first exec does (I12);
//! - no code path here deletes a UserWorkspace file on runtime cleanup (I15);
//! - every file operation goes through `warren-fs`, by file descriptor (I2);
//! - a mutation fenced with an execution guard token is checked and performed under the
//!   sandbox's fence gate, so none lands after a newer token was issued (I33).

#![deny(missing_docs)]

mod aliases;
mod artifacts;
mod branches;
mod checkpoints;
mod classify;
mod code;
mod drain;
mod egress;
mod env;
mod error;
mod exec;
mod files;
mod guard;
mod init;
mod kill;
mod lifecycle;
mod membership;
mod metrics;
mod ownership;
mod pause;
mod processes;
mod quotas;
mod records;
mod recovery;
mod runs;
mod sandboxes;
mod shell;
mod skills;
mod snapshots;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transitions;
mod usage;
mod watch;
mod workspaces;
pub use sandboxes::{
    check_isolation, Created, SandboxRequest, DEFAULT_TERMINATE_GRACE, MAX_TERMINATE_GRACE,
};

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_core::NetworkPolicy;

pub use artifacts::{is_active_content, media_type, MAX_PRESENTED_FILES};
pub use branches::{unmount_branches, Forked, MergeOutcome, MergeRequest, MAX_FORKS};
pub use classify::{one_of_every_kind, Class, ErrorKind};
pub use code::{
    check_language, default_context_id, CodeContext, CodeEvent, ExecutionStatus, NewContext,
    RunCode, DEFAULT_CONTEXT, LANGUAGES, MAX_CODE_BYTES, MAX_CONTEXTS,
};
pub use drain::DrainReport;
pub use egress::SecretSource;
pub use error::{
    error_chain, is_disk_full, is_internal_file_error, strip_relative_path, ProvisionerError,
};
pub use exec::{ExecInput, ExecReport, ProgramSpec, NOT_OWNER_CODE};
pub use files::{FileRead, Located, Written};
pub use guard::{FencePermit, FenceToken, FENCE_HEADER, MAX_GUARD_HOLDER_BYTES, MAX_GUARD_TTL};
pub use init::{CreatedWorkdir, GitSource, InitReport, WorkdirInit};
pub use lifecycle::{ReapReport, MAX_LEASE_TTL};
pub use membership::{check_workspace_dir, NodeIdentity};
pub use ownership::{PeerLink, PeerNode, FENCE_AFTER};
pub use pause::{
    check_labels, deadline_after, Paused, SettingsChange, DEADLINE_TICK, MAX_LABELS,
    MAX_LABEL_KEY_CHARS, MAX_LABEL_VALUE_CHARS, MAX_SANDBOX_TIMEOUT,
};
pub use processes::{
    OutputEvent, OutputPiece, OutputRead, ProcessAnswer, ProcessCall, ProcessInfo, ProcessRead,
    ProcessState, StartProcess, MAX_OUTPUT_WAIT, MAX_PROCESSES,
};
pub use quotas::{
    volumes_unsupported_reason, QuotaEnforcement, QuotaLimits, QuotaSettings, WorkspaceUsage,
    MIN_QUOTA_BYTES, MIN_QUOTA_INODES,
};
pub use records::{RecordWrite, TransportRecord};
pub use recovery::RecoveryReport;
pub use shell::{
    check_session_id, CommandReport, CommandStatus, CommandWait, SessionInfo, SessionKind,
    SessionRequest, SessionStatus, ShellCommand, DEFAULT_NO_CHANGE_TIMEOUT,
    MAX_IMPLICIT_SHELL_SESSIONS, MAX_SESSION_ID_BYTES, MAX_SHELL_COMMAND_BYTES, MAX_SHELL_SESSIONS,
};
pub use skills::{check_skill_name, SkillSources, SkillSyncReport};
pub use transitions::{transition, LifeEvent, Refusal};
pub use usage::{SandboxDisk, UsageSample, FRESH_GAP};
use warren_backend::{Backend, BackendKind};
use warren_core::{DataLayout, SandboxId};
pub use warren_snapshot::{GcStats, S3Config};
use warren_store::StateStore;
pub use warren_store::{DeadlineAction, NodeRecord, NodeState, SandboxSettings};
pub use watch::{
    DirWatch, WatchBatch, WatchChange, WatchKind, WatchSlot, WatcherChanges, LIVENESS_EVERY,
    MAX_DIR_WATCHES, MAX_WATCHED_ENTRIES, MAX_WATCHER_BACKLOG, MAX_WATCHES_PER_SANDBOX,
    WATCHER_IDLE,
};
pub use workspaces::Workspaces;

/// Limits and defaults of one provisioner.
#[derive(Debug, Clone)]
pub struct ProvisionerConfig {
    /// warren's data directory: this node's own (see [`DataLayout`]).
    pub data_dir: PathBuf,
    /// The directory every replica shares (UserWorkspaces, skill projections, artifacts,
    /// the local snapshot store); `None` keeps them in the data directory (one machine).
    pub workspace_dir: Option<PathBuf>,
    /// Largest byte span one file read returns.
    pub read_cap: u64,
    /// Exec timeout when a call gives none.
    pub default_exec_timeout: Duration,
    /// Longest exec timeout a call may ask for.
    pub max_exec_timeout: Duration,
    /// Most bytes kept of each of stdout and stderr.
    pub output_cap: usize,
    /// The global sandbox environment (I14), given to sandboxes that inherit it.
    pub sandbox_env: BTreeMap<String, String>,
    /// Global secrets: given like `sandbox_env`, and their values masked in command output.
    pub sandbox_secrets: BTreeMap<String, String>,
    /// A runtime nobody used (no lease, no command, no running process) for this long is
    /// reclaimed.
    pub idle_timeout: Duration,
    /// A runtime older than this is reclaimed whatever holds it.
    pub max_lifetime: Duration,
    /// Checkpoints kept per sandbox; the oldest go (and their unshared chunks with them).
    pub keep_checkpoints: usize,
    /// Store objects younger than this are never collected: they may belong to a snapshot
    /// still being written.
    pub gc_grace: Duration,
    /// Where snapshot chunks and manifests go.
    pub snapshot_store: SnapshotStoreConfig,
    /// Host directories a workdir may be initialised from, by name (I32).
    pub init_host_dirs: BTreeMap<String, PathBuf>,
    /// The operator's skill directories the projections are built from (I32).
    pub skill_sources: SkillSources,
    /// Snapshot a runtime before the reaper reclaims it (I30).
    pub snapshot_before_reap: bool,
    /// Start a reaped sandbox's next runtime from its latest snapshot (I30).
    pub resume_from_snapshots: bool,
    /// Most bytes of file data one snapshot or checkpoint reads (holes of sparse files not
    /// counted); over it the snapshot fails with `snapshot_too_large`.
    pub snapshot_max_bytes: u64,
    /// Sandboxes the reaper works on at once: one slow sandbox (a big snapshot) takes one
    /// slot and never holds the others up.
    pub reap_concurrency: usize,
    /// How long the reaper spends on one sandbox's snapshot before it reclaims the runtime
    /// without it.
    pub reap_deadline: Duration,
    /// How long a sandbox may stay `pausing` before the reaper takes it for a pause whose
    /// pauser died and finishes it (never sooner than twice `reap_deadline`).
    pub stale_pause_after: Duration,
    /// Per backend that takes images (Docker, Kubernetes), the image of its sandboxes
    /// that name none (I18); a backend missing here needs the sandbox to name one.
    pub default_images: std::collections::HashMap<BackendKind, String>,
    /// The isolation tier of sandboxes that name none (issue 19): `kernel` unless the
    /// operator chose gVisor for the server.
    pub default_isolation: warren_core::IsolationTier,
    /// The network policy of a sandbox whose request names none (I23): the one default
    /// every transport shares; a transport whose protocol says otherwise passes its own.
    pub default_network: NetworkPolicy,
    /// Storage quotas on UserWorkspaces (I23).
    pub quotas: QuotaSettings,
    /// Finds the provisioner token in every value bound for a sandbox, which is then
    /// refused (I13). `None` only where no token exists (a provisioner embedded without a
    /// transport, as the library's own tests run it).
    pub token_finder: Option<warren_core::TokenFinder>,
    /// This node's identity in the cluster (issue 14): one node, `local`, by default.
    pub node: NodeIdentity,
    /// Roots (PEM) the egress proxy trusts for bound HTTPS destinations beside the host's
    /// own (issue 38): a private CA an operator's services use.
    pub egress_upstream_roots: Option<String>,
    /// The operator's sources of short-lived secrets, by name (issue 38): a secret naming
    /// one has its value minted per sandbox, never stored.
    pub secret_sources: BTreeMap<String, SecretSource>,
}

/// Where snapshot chunks and manifests are stored (I31). Each uid gets its own namespace
/// in it: a directory, or a key prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SnapshotStoreConfig {
    /// `<data>/snapshots/<uid>`: the embedded default.
    #[default]
    Local,
    /// `snapshots/<uid>/` in an S3-compatible bucket.
    S3(warren_snapshot::S3Config),
    /// Rows of the state store itself (small workspaces; one shared database).
    Sql,
    /// Values in a Redis server (small workspaces), under `warren:snapshots:<uid>:`.
    Redis {
        /// `redis://host:port/db`.
        url: String,
    },
}

impl ProvisionerConfig {
    /// The defaults for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            workspace_dir: None,
            read_cap: 64 * 1024 * 1024,
            default_exec_timeout: Duration::from_secs(60),
            max_exec_timeout: Duration::from_secs(3600),
            output_cap: 1024 * 1024,
            sandbox_env: BTreeMap::new(),
            sandbox_secrets: BTreeMap::new(),
            idle_timeout: Duration::from_secs(15 * 60),
            max_lifetime: Duration::from_secs(24 * 3600),
            keep_checkpoints: 50,
            gc_grace: Duration::from_secs(3600),
            snapshot_store: SnapshotStoreConfig::Local,
            init_host_dirs: BTreeMap::new(),
            skill_sources: SkillSources::default(),
            snapshot_before_reap: true,
            resume_from_snapshots: true,
            snapshot_max_bytes: warren_snapshot::DEFAULT_MAX_BYTES,
            reap_concurrency: 4,
            reap_deadline: Duration::from_secs(60),
            stale_pause_after: Duration::from_secs(600),
            default_images: std::collections::HashMap::new(),
            default_isolation: warren_core::IsolationTier::Kernel,
            default_network: NetworkPolicy::None,
            quotas: QuotaSettings::default(),
            token_finder: None,
            egress_upstream_roots: None,
            secret_sources: BTreeMap::new(),
            node: NodeIdentity {
                node_id: "local".to_owned(),
                advertise: "http://127.0.0.1:7878".to_owned(),
                ttl: Duration::from_secs(15),
            },
        }
    }
}

/// The provisioner of one warren process.
pub struct Provisioner {
    config: ProvisionerConfig,
    /// The workspace rules that need no backend: UserWorkspaces, volumes, quotas.
    workspaces: Workspaces,
    store: Arc<dyn StateStore>,
    backend: Arc<dyn Backend>,
    /// Serialises lifecycle changes (runtime start, destroy) of one sandbox, without making
    /// different sandboxes wait for each other.
    lifecycle_locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// Commands running per sandbox: activity the reaper must respect.
    inflight: InflightHandle,
    /// Long-running processes of the runtimes this node owns (`processes`).
    processes: processes::Table,
    /// Serialises the creation of a sandbox's default code contexts (`code`).
    code_creation: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// Serialises mounting branches (`branches`), and the branch ids this process mounted.
    branch_mounts: tokio::sync::Mutex<std::collections::HashSet<String>>,
    metrics: metrics::Metrics,
    /// Set once the server shuts down: snapshots and restores on blocking threads stop at
    /// their next chunk, and the reaper stops.
    shutdown: warren_snapshot::CancelFlag,
    /// Sandboxes a reaper pass is working on, so overlapping passes never take one twice.
    reaping: Mutex<std::collections::HashSet<SandboxId>>,
    /// The sandboxes past their deadline this node's deadline task works on.
    firing: Arc<Mutex<std::collections::HashSet<SandboxId>>>,
    /// The previous CPU sample of each sandbox measured lately ([`Provisioner::sample_usage`]).
    cpu_samples: Mutex<usage::CpuSamples>,
    /// Every directory watch of this node: their slots and the polled watchers.
    watches: Arc<watch::Watches>,
    /// Per running sandbox, the runtime generation and how many forks its pids limit had
    /// refused when a reaper pass last looked: the next pass tells from it whether the
    /// limit was hit in between (`lifecycle.rs`).
    fork_refusals: Mutex<HashMap<SandboxId, (i64, u64)>>,
    /// Bounds the sandboxes all reaper passes work on at once.
    reap_slots: Arc<tokio::sync::Semaphore>,
    /// The execution guard's fence gate: fenced mutations against guard acquisitions,
    /// per sandbox (I33; see `guard.rs`).
    fence_gates: Arc<guard::FenceGates>,
    /// Persistent shell sessions, per sandbox (`shell.rs`).
    shells: shell::Registry,
    /// This node's epoch in the cluster (`membership.rs`).
    epoch: membership::Epoch,
    /// The runtimes this node owns, and whether it is fenced (`ownership.rs`).
    ownership: ownership::Ownership,
    /// How runtime operations reach their owner elsewhere; `None` on a lone node.
    peers: Mutex<Option<Arc<dyn ownership::PeerLink>>>,
    /// What runtimes' egress proxies ask (`egress.rs`), with its minted secrets.
    egress_broker: Arc<egress::Broker>,
}

impl Provisioner {
    /// A provisioner over an opened state store and backend.
    pub fn new(
        config: ProvisionerConfig,
        store: Arc<dyn StateStore>,
        backend: Arc<dyn Backend>,
    ) -> Self {
        let reap_slots = Arc::new(tokio::sync::Semaphore::new(config.reap_concurrency.max(1)));
        let egress_broker = Arc::new(egress::Broker::new(
            store.clone(),
            config.egress_upstream_roots.clone(),
            config.secret_sources.clone(),
        ));
        backend.attach_egress(egress_broker.clone());
        Self {
            egress_broker,
            workspaces: Workspaces::new(&config),
            config,
            store,
            backend,
            lifecycle_locks: Mutex::new(HashMap::new()),
            inflight: InflightHandle::default(),
            processes: processes::Table::default(),
            code_creation: Mutex::default(),
            branch_mounts: tokio::sync::Mutex::default(),
            metrics: metrics::Metrics::new(),
            shutdown: warren_snapshot::CancelFlag::new(),
            reaping: Mutex::new(std::collections::HashSet::new()),
            firing: Arc::default(),
            cpu_samples: Mutex::new(usage::CpuSamples::new()),
            watches: Arc::default(),
            fork_refusals: Mutex::new(HashMap::new()),
            reap_slots,
            fence_gates: Arc::default(),
            shells: shell::Registry::default(),
            epoch: membership::Epoch::default(),
            ownership: ownership::Ownership::default(),
            peers: Mutex::new(None),
        }
    }

    /// The default backend.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// The backends sandboxes may choose on this server, the default first.
    pub fn backends(&self) -> Vec<BackendKind> {
        let default = self.backend.kind();
        std::iter::once(default)
            .chain(
                BackendKind::ALL
                    .into_iter()
                    .filter(|k| *k != default && self.backend.capabilities_of(*k).is_some()),
            )
            .collect()
    }

    /// Where things live in the data and workspace directories.
    pub fn layout(&self) -> &DataLayout {
        self.workspaces.layout()
    }

    /// The workspace rules (UserWorkspaces, volumes, quotas), which need no backend.
    pub fn workspaces(&self) -> &Workspaces {
        &self.workspaces
    }

    /// The configuration in force.
    pub fn config(&self) -> &ProvisionerConfig {
        &self.config
    }

    /// Begins shutting down: snapshots, checkpoints and restores in flight stop at their
    /// next chunk (`snapshot_cancelled`), and the reaper starts no more work. Runtimes keep
    /// running; the next server adopts them (I16).
    pub fn shut_down(&self) {
        self.shutdown.cancel();
    }

    /// Whether [`Provisioner::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// What bounds one snapshot, diff or restore: the data limit, the shutdown flag and
    /// an optional deadline.
    fn snapshot_limits(
        &self,
        deadline: Option<std::time::Instant>,
    ) -> warren_snapshot::SnapshotLimits {
        warren_snapshot::SnapshotLimits {
            max_bytes: self.config.snapshot_max_bytes,
            cancel: Some(self.shutdown.clone()),
            deadline,
        }
    }

    fn inflight(&self, sandbox: &SandboxId) -> usize {
        self.inflight.count(sandbox)
    }

    /// Counts a command as running in `sandbox` until the guard drops.
    fn command_running(&self, sandbox: &SandboxId) -> InflightHold {
        self.inflight.hold(sandbox.clone())
    }

    fn lifecycle_lock(&self, sandbox: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        // Poisoning cannot leave the map inconsistent: entries are only inserted.
        let mut locks = self
            .lifecycle_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        locks.entry(sandbox.clone()).or_default().clone()
    }
}

/// Commands and processes running per sandbox: activity the reaper and a termination's
/// grace respect. Shared with the tasks that follow long-running processes.
#[derive(Debug, Clone, Default)]
pub(crate) struct InflightHandle(Arc<Mutex<HashMap<SandboxId, usize>>>);

impl InflightHandle {
    fn count(&self, sandbox: &SandboxId) -> usize {
        let inflight = self.0.lock().unwrap_or_else(|e| e.into_inner());
        inflight.get(sandbox).copied().unwrap_or(0)
    }

    fn started(&self, sandbox: &SandboxId) {
        let mut inflight = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *inflight.entry(sandbox.clone()).or_default() += 1;
    }

    fn ended(&self, sandbox: &SandboxId) {
        let mut inflight = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = inflight.get_mut(sandbox) {
            *count -= 1;
            if *count == 0 {
                inflight.remove(sandbox);
            }
        }
    }

    /// Counts one command as running in `sandbox` until the hold drops.
    pub(crate) fn hold(&self, sandbox: SandboxId) -> InflightHold {
        self.started(&sandbox);
        InflightHold {
            inflight: self.clone(),
            sandbox,
        }
    }
}

/// One running command, counted until dropped ([`InflightHandle::hold`]).
#[derive(Debug)]
pub(crate) struct InflightHold {
    inflight: InflightHandle,
    sandbox: SandboxId,
}

impl Drop for InflightHold {
    fn drop(&mut self) {
        self.inflight.ended(&self.sandbox);
    }
}
