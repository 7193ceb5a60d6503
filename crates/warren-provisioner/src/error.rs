//! The provisioner's error type.

use warren_backend::BackendError;
use warren_core::{CoreError, SandboxId};
use warren_fs::FsError;
use warren_store::StoreError;

/// Why the provisioner refused or failed a request.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    /// A uid, scope, sandbox id, workdir or virtual path broke a domain rule.
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// The request itself is malformed (both or neither of `command` and `argv`, ...).
    #[error("{0}")]
    BadRequest(&'static str),
    /// An environment value bound for a sandbox contains the provisioner token (I13).
    #[error(
        "the value of {name:?} contains the provisioner token, which must never enter a \
         sandbox (I13); give the agent a credential of its own"
    )]
    TokenInEnv {
        /// The variable's name (possibly shortened); never its value.
        name: String,
    },
    /// A command's line, working directory or stdin contains the provisioner token (I13).
    #[error(
        "the {part} contains the provisioner token, which must never enter a sandbox (I13); \
         give the agent a credential of its own"
    )]
    TokenInCommand {
        /// Which part: "command line", "working directory" or "stdin".
        part: &'static str,
    },
    /// The workdir does not exist in the uid's workspace (I4).
    #[error("workdir {workdir:?} does not exist in the workspace of uid {uid:?}; create it with POST /v1/users/{{uid}}/workdirs")]
    WorkdirNotFound {
        /// The uid.
        uid: String,
        /// The missing workdir.
        workdir: String,
    },
    /// The workdir exists but is not a plain directory.
    #[error("workdir {workdir:?} is not a directory")]
    WorkdirNotADirectory {
        /// The workdir.
        workdir: String,
    },
    /// No sandbox has this id.
    #[error("no sandbox {0}")]
    SandboxNotFound(SandboxId),
    /// The live sandbox of this identity is bound to another workdir (I5).
    #[error("sandbox {sandbox} of this uid and runtime scope is bound to workdir {bound:?}; a live runtime cannot be rebound to {requested:?}")]
    WorkdirConflict {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its workdir.
        bound: String,
        /// The workdir asked for.
        requested: String,
    },
    /// The live sandbox of this identity runs under another network policy (I16).
    #[error("sandbox {sandbox} of this uid and runtime scope runs with network {bound:?}; a live runtime cannot change it to {requested:?}")]
    NetworkConflict {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its policy's mode.
        bound: &'static str,
        /// The mode asked for.
        requested: &'static str,
    },
    /// The live sandbox of this identity has another environment policy (I14, I16).
    #[error("sandbox {sandbox} of this uid and runtime scope runs with inherit_env={inherit_env} and ephemeral={ephemeral}; a live runtime cannot change them (terminate it first)")]
    EnvPolicyConflict {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its `inherit_env`.
        inherit_env: bool,
        /// Its `ephemeral`.
        ephemeral: bool,
    },
    /// The live sandbox of this identity runs on another backend or image (I16).
    #[error("sandbox {sandbox} of this uid and runtime scope runs on the {backend} backend{}; a live runtime cannot move (terminate it first)", image.as_ref().map(|i| format!(" from image {i:?}")).unwrap_or_default())]
    BackendConflict {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its backend.
        backend: String,
        /// Its image.
        image: Option<String>,
    },
    /// The live sandbox of this identity has another layout (I7, I16).
    #[error("sandbox {sandbox} of this uid and runtime scope runs with the {bound} layout; a live runtime cannot change it to {requested} (terminate it first)")]
    LayoutConflict {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its layout.
        bound: warren_core::LayoutName,
        /// The layout asked for.
        requested: warren_core::LayoutName,
    },
    /// The live sandbox of this identity runs on another isolation tier (issue 19, I16).
    #[error("sandbox {sandbox} of this uid and runtime scope runs on the {bound} isolation tier; a live runtime cannot change it to {requested} (terminate it first)")]
    IsolationConflict {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its tier.
        bound: warren_core::IsolationTier,
        /// The tier asked for.
        requested: warren_core::IsolationTier,
    },
    /// The sandbox's backend cannot run the gVisor tier on this host (issue 19): refused
    /// before anything is recorded, rather than a sandbox that fails at its first exec.
    #[error("the {backend} backend cannot run the gvisor isolation tier on this server: {reason}. Ask for \"isolation\": \"kernel\" or a backend that runs gVisor, or have the operator set gVisor up")]
    IsolationUnavailable {
        /// The backend's name.
        backend: &'static str,
        /// Why not, in the backend's words (an operator can act on them).
        reason: String,
    },
    /// The sandbox's backend cannot mount a directory of warren's host (an ephemeral
    /// sandbox's scratch tree, an extra mount): refused before anything is recorded.
    #[error("the {backend} backend cannot mount {what}, which is a directory of warren's host; use another backend")]
    HostMountsUnsupported {
        /// The backend's name.
        backend: &'static str,
        /// What was asked for ("an ephemeral sandbox's scratch tree", "extra mounts").
        what: &'static str,
    },
    /// A cluster setting (node id, advertise URL, lease TTL) that cannot be used.
    #[error("{0}")]
    InvalidNode(String),
    /// The live sandbox of this identity shows other extra mounts (I16).
    #[error("sandbox {sandbox} of this uid and runtime scope runs with other extra mounts; a live runtime cannot change them (terminate it first)")]
    ExtraMountsConflict {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// An extra mount's source cannot be made or opened beneath the operator's directory.
    #[error("extra mount {target}: its source cannot be used: {source}")]
    ExtraMountSource {
        /// Where it would appear inside the runtime.
        target: String,
        /// What the file layer found (a link, a missing operator directory, ...).
        source: warren_fs::FsError,
    },
    /// The request named a backend this server does not run.
    #[error("the {requested:?} backend is not enabled on this server (enabled: {enabled}); start warren with it (`warren serve --backend docker --image NAME`, or `--docker`)")]
    BackendUnavailable {
        /// What was asked for.
        requested: String,
        /// What the server runs.
        enabled: String,
    },
    /// The image name is missing or unusable.
    #[error("{reason}")]
    InvalidImage {
        /// Why.
        reason: String,
    },
    /// An egress secret names a source the operator did not configure.
    #[error("no secret source {name:?} is configured on this server (network.secret_sources)")]
    SecretSourceUnknown {
        /// The source named.
        name: String,
    },
    /// No egress secret of that name is set there.
    #[error("no egress secret {name:?} is set here")]
    EgressSecretNotFound {
        /// The name asked for.
        name: String,
    },
    /// The uid's agent environment has no such variable.
    #[error("the agent environment of uid {uid:?} has no variable {name:?}")]
    EnvVarNotFound {
        /// The uid.
        uid: String,
        /// The name asked for.
        name: String,
    },
    /// A path given to `present_files` is not under the workdir's `outputs/` (I26).
    #[error("{path} is not under {outputs}: only files in the workdir's outputs/ can be presented as artifacts; write or move the file there first")]
    NotInOutputs {
        /// The virtual path given.
        path: String,
        /// The workdir's outputs directory, as a virtual path.
        outputs: String,
    },
    /// A file too large to present.
    #[error("{path} has {size} bytes; artifacts are at most {max} bytes")]
    ArtifactTooLarge {
        /// The virtual path.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The sandbox has no artifact with this id.
    #[error("this sandbox has no artifact {artifact:?}")]
    ArtifactNotFound {
        /// The id asked for.
        artifact: String,
    },
    /// Only an empty workdir is initialised (I32).
    #[error("workdir {workdir:?} is not empty; initialisation fills new workdirs only, so no file is overwritten")]
    WorkdirNotEmpty {
        /// The workdir.
        workdir: String,
    },
    /// No host directory of this name is allowed.
    #[error(
        "no host directory {name:?} is allowed; the operator lists them under [init] host_dirs"
    )]
    UnknownHostDir {
        /// The name asked for.
        name: String,
    },
    /// A git URL or revision that is not allowed.
    #[error("git source refused: {reason}")]
    GitSourceRefused {
        /// Why.
        reason: &'static str,
    },
    /// git could not clone or check out.
    #[error("git failed: {detail}")]
    GitFailed {
        /// git's own message, without host paths.
        detail: String,
    },
    /// No runtime snapshot with this id among the uid's sandboxes.
    #[error("no runtime snapshot {snapshot:?} of this uid")]
    SnapshotNotFound {
        /// The id asked for.
        snapshot: String,
    },
    /// `from_snapshot` was given for a sandbox that is already live.
    #[error("sandbox {sandbox} is already live; from_snapshot seeds a new sandbox or a new generation (terminate it first)")]
    SandboxAlreadyLive {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// A snapshot needs a running runtime.
    #[error("sandbox {sandbox} has no running runtime to snapshot; run a command first")]
    RuntimeNotRunning {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// The backend cannot expose a runtime's ephemeral state.
    #[error("the {backend} backend cannot snapshot runtimes")]
    SnapshotUnsupported {
        /// The backend's name.
        backend: &'static str,
    },
    /// The skill is not granted to this uid.
    #[error("skill {skill:?} is not granted to this uid")]
    SkillNotGranted {
        /// The skill asked about.
        skill: String,
    },
    /// No checkpoint with this id in this sandbox.
    #[error("this sandbox has no checkpoint {checkpoint:?}")]
    CheckpointNotFound {
        /// The id asked for.
        checkpoint: String,
    },
    /// The workdir has no branch of this name (I27).
    #[error("workdir {workdir:?} has no branch {name:?}")]
    BranchNotFound {
        /// The workdir.
        workdir: String,
        /// The branch asked for.
        name: String,
    },
    /// The workdir already has a branch of this name.
    #[error("workdir {workdir:?} already has a branch {name:?}")]
    BranchExists {
        /// The workdir.
        workdir: String,
        /// The name asked for.
        name: String,
    },
    /// Sandboxes that are not terminated are bound to the branch.
    #[error(
        "branch {name:?} is bound to sandbox(es) {sandboxes}; terminate them before deleting it"
    )]
    BranchInUse {
        /// The branch.
        name: String,
        /// The sandboxes, comma-separated.
        sandboxes: String,
    },
    /// Branches cannot be made or bound here.
    #[error("branches are unavailable: {reason}")]
    BranchesUnsupported {
        /// Why.
        reason: String,
    },
    /// A write into a baseline that has branches (I27).
    #[error(
        "{path}: workdir {workdir:?} has branches, so it is read-only until they are merged          or deleted (I27); write in a branch instead"
    )]
    WorkdirBranched {
        /// The virtual path written.
        path: String,
        /// The branched workdir.
        workdir: String,
    },
    /// A running sandbox can write the workdir a branch was asked of.
    #[error(
        "workdir {workdir:?} is writable by running sandbox(es) {sandboxes}; stop them, or          bind them to branches, before branching it"
    )]
    WorkdirInUse {
        /// The workdir.
        workdir: String,
        /// The sandboxes, comma-separated.
        sandboxes: String,
    },
    /// A branch merged already is never merged again.
    #[error("branch {name:?} was merged into its workdir already; delete it")]
    BranchMerged {
        /// The branch.
        name: String,
    },
    /// A merge into a workdir left out branches made of it.
    #[error(
        "workdir {workdir:?} has other branches ({left_out}) whose common baseline this merge \
         would change: merge them together, or delete the ones to leave out first"
    )]
    MergeIncomplete {
        /// The workdir.
        workdir: String,
        /// The branches left out, comma-separated.
        left_out: String,
    },
    /// The merge found changes it cannot combine; nothing was applied.
    #[error("the merge found {} conflict(s); nothing was applied", conflicts.len())]
    MergeConflict {
        /// Each conflict with the baseline, ours and theirs.
        conflicts: Vec<warren_merge::Conflict>,
    },
    /// The merge engine failed.
    #[error(transparent)]
    Merge(warren_merge::MergeError),
    /// Commands run in the sandbox, so its workdir cannot be swapped now.
    #[error(
        "sandbox {sandbox} is running {commands} command(s); wait for them to finish, then restore"
    )]
    SandboxBusy {
        /// The sandbox.
        sandbox: SandboxId,
        /// How many.
        commands: usize,
    },
    /// No open shell session has that id in the sandbox (or its shell has ended). The
    /// words are the ones DeerFlow looks for to open a new session and try again.
    #[error("Session not found: {id}")]
    ShellSessionNotFound {
        /// The id asked for.
        id: String,
    },
    /// A shell session still runs a command; one runs at a time.
    #[error("session {id} is still running a command ({command:?}); wait for it, kill it, or use another session")]
    ShellSessionBusy {
        /// The session.
        id: String,
        /// The command it runs (shortened).
        command: String,
    },
    /// The sandbox holds the most shell sessions it may.
    #[error(
        "sandbox {sandbox} has {max} open shell sessions, the most it may have; close one first"
    )]
    TooManyShellSessions {
        /// The sandbox.
        sandbox: SandboxId,
        /// The limit.
        max: usize,
    },
    /// A session's shell could not be started or reached.
    #[error("the shell session failed: {reason}")]
    ShellStartFailed {
        /// What went wrong, in the runtime's terms.
        reason: String,
    },
    /// No process of the sandbox this node holds has that pid (it never ran here, or ended
    /// long enough ago to be forgotten).
    #[error(
        "sandbox {sandbox} has no process {pid}; GET /v1/sandboxes/{{id}}/processes lists them"
    )]
    ProcessNotFound {
        /// The sandbox.
        sandbox: SandboxId,
        /// The pid asked for.
        pid: i32,
    },
    /// No process of the sandbox has that tag.
    #[error("sandbox {sandbox} has no process tagged {tag:?}")]
    ProcessTagNotFound {
        /// The sandbox.
        sandbox: SandboxId,
        /// The tag asked for.
        tag: String,
    },
    /// No execution context of the sandbox has that id.
    #[error("sandbox {sandbox} has no code context {context:?}; GET /v1/sandboxes/{{id}}/code/contexts lists them")]
    CodeContextNotFound {
        /// The sandbox.
        sandbox: SandboxId,
        /// The context asked for.
        context: String,
    },
    /// An execution context with that id exists already.
    #[error("sandbox {sandbox} already has a code context {context:?}")]
    CodeContextExists {
        /// The sandbox.
        sandbox: SandboxId,
        /// The context.
        context: String,
    },
    /// The sandbox has as many execution contexts as it may.
    #[error("sandbox {sandbox} has {max} code contexts, the most it may have; remove one first")]
    TooManyCodeContexts {
        /// The sandbox.
        sandbox: SandboxId,
        /// The limit.
        max: usize,
    },
    /// The runtime cannot run a code interpreter: its image lacks `python3`, `ipykernel`
    /// or `jupyter_client` (docs/code.md says what an image needs).
    #[error("the sandbox's runtime cannot run a code interpreter: {reason}")]
    CodeInterpreterUnavailable {
        /// Why, in the runtime's terms.
        reason: String,
    },
    /// No kernel for that language.
    #[error("no code interpreter for language {language:?}; warren runs \"python\" and \"bash\"")]
    UnsupportedLanguage {
        /// The language asked for.
        language: String,
    },
    /// The process's stdin was closed (or never kept open: start it with `stdin: true`).
    #[error("the stdin of process {pid} is closed; start a process with \"stdin\": true to keep it open")]
    ProcessStdinClosed {
        /// The process.
        pid: i32,
    },
    /// The client's stream of stdin broke off; what came before it was written.
    #[error("the input for process {pid} broke off: {reason}")]
    StdinInterrupted {
        /// The process.
        pid: i32,
        /// What the transport said.
        reason: String,
    },
    /// The process has ended: it takes no input, signal or resize.
    #[error("process {pid} has ended")]
    ProcessEnded {
        /// The process.
        pid: i32,
    },
    /// The directory a watch watched was removed or moved: the watch is over.
    #[error("{path}: the watched directory was removed or moved")]
    WatchedDirGone {
        /// Its virtual path.
        path: String,
    },
    /// A watch of the runtime's own tree found the runtime stopped (reaped, lost): it is
    /// over. Watching again starts the runtime.
    #[error("{path}: the runtime of sandbox {sandbox} stopped, and with it this watch of its own files; watch again to start it")]
    RuntimeStopped {
        /// The sandbox.
        sandbox: SandboxId,
        /// The runtime path watched.
        path: String,
    },
    /// A directory too large to watch.
    #[error("{path}: {reason}")]
    WatchTooLarge {
        /// Its virtual path.
        path: String,
        /// What is too many.
        reason: String,
    },
    /// A directory watch failed on the server's side (its inotify queue).
    #[error("the directory watch failed")]
    WatchFailed,
    /// The process runs without a terminal, so it has no size to set.
    #[error("process {pid} has no terminal; start it with \"pty\" to resize it")]
    NotATerminal {
        /// The process.
        pid: i32,
    },
    /// The sandbox runs the most processes it may.
    #[error("sandbox {sandbox} runs {max} processes, the most it may; end one first")]
    TooManyProcesses {
        /// The sandbox.
        sandbox: SandboxId,
        /// The limit.
        max: usize,
    },
    /// The runtime could not start the process (no such program, a working directory it
    /// cannot enter); the reason names no host path (I1).
    #[error("the process could not be started: {reason}")]
    ProcessNotStarted {
        /// Why, in the runtime's terms.
        reason: String,
    },
    /// The snapshot engine failed or found damage.
    #[error(transparent)]
    Snapshot(warren_snapshot::SnapshotError),
    /// The sandbox was terminated while the command ran: its runtime, and the command
    /// with it, were destroyed (I15), so there is no exit status to report.
    #[error(
        "sandbox {sandbox} was terminated while the command ran; the command was killed with \
         its runtime. Create the sandbox again with POST /v1/sandboxes to run it anew"
    )]
    TerminatedWhileRunning {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// The sandbox is behind its cleanup fence or gone (I15).
    #[error("sandbox {sandbox} is {state}; create it again with POST /v1/sandboxes to start a new generation")]
    SandboxTerminated {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its state.
        state: &'static str,
    },
    /// The sandbox holds as many directory watches as it may.
    #[error("the sandbox already has {max} directory watches; stop one first")]
    TooManyWatches {
        /// The bound.
        max: usize,
    },
    /// No such watcher of this sandbox on this node (removed, or forgotten when idle).
    #[error(
        "watcher {watcher:?} not found (stopped, or forgotten after 10 minutes without a poll)"
    )]
    WatcherNotFound {
        /// The id asked for.
        watcher: String,
    },
    /// The sandbox is paused or being paused: nothing runs in it until it is resumed.
    #[error("sandbox {sandbox} is {state}; resume it (POST /v1/sandboxes/{sandbox}/resume) to run commands again")]
    SandboxPaused {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its state.
        state: &'static str,
    },
    /// The lifecycle's transition table does not allow this in the sandbox's state.
    #[error("sandbox {sandbox} is {state}: it cannot {event}")]
    IllegalTransition {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its state.
        state: &'static str,
        /// What was asked, as a verb.
        event: &'static str,
    },
    /// This node fenced itself (its lease could not be renewed in time) and has not joined
    /// the cluster again yet: it runs no runtime work meanwhile (issue 14).
    #[error("node {node} lost contact with the state store and fenced itself; retry in a few seconds (another replica can serve the sandbox)")]
    NodeFenced {
        /// This node.
        node: String,
    },
    /// The runtime is owned by another node and this one has no link to forward to it.
    #[error("the runtime of sandbox {sandbox} runs on node {node}, which this node cannot reach (no cluster link configured)")]
    RuntimeElsewhere {
        /// The sandbox.
        sandbox: SandboxId,
        /// The owner.
        node: String,
    },
    /// No link to other nodes is configured.
    #[error("this node has no cluster link to forward runtime operations with")]
    NoPeerLink,
    /// The node a runtime operation was forwarded to failed it: its answer, as it gave it.
    #[error("{message}")]
    Forwarded {
        /// The HTTP status the owner answered.
        status: u16,
        /// Its stable error code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The owner could not be reached to forward a runtime operation to.
    #[error("the node {node} that runs this sandbox's runtime could not be reached: {reason}; retry in a few seconds")]
    PeerUnreachable {
        /// The owner.
        node: String,
        /// What failed.
        reason: String,
    },
    /// A runtime operation forwarded here found this node no longer owns the runtime.
    #[error("this node does not own the runtime of sandbox {sandbox}")]
    NotOwnerHere {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// The backend does not run commands (the memory backend, I20).
    #[error(
        "the {backend} backend does not execute commands; restart warren with an isolating backend"
    )]
    ExecUnsupported {
        /// The backend's name.
        backend: &'static str,
    },
    /// Another holder's execution guard is live (I33).
    #[error("the execution guard of sandbox {sandbox} is held by {holder:?} until {}; wait for it to be released or to lapse, then acquire it again", crate::guard::rfc3339(expires_at))]
    GuardHeld {
        /// The sandbox.
        sandbox: SandboxId,
        /// Who holds it.
        holder: String,
        /// When it lapses unless its holder renews it.
        expires_at: chrono::DateTime<chrono::Utc>,
    },
    /// A mutation carried a fencing token older than the newest issued: its guard passed
    /// to another holder, and nothing was changed (I33).
    #[error("fencing token {token} is stale: token {newest} was issued since, so the execution guard passed to another holder and nothing was changed; acquire the guard again")]
    FenceStale {
        /// The token the request carried.
        token: i64,
        /// The newest token issued for the sandbox.
        newest: i64,
    },
    /// A fencing token that is malformed or was never issued for the sandbox.
    #[error("{reason}")]
    FenceInvalid {
        /// What is wrong with it.
        reason: String,
    },
    /// The token is not the sandbox's live guard (released, lapsed, superseded or never
    /// issued): renewing or releasing it is refused.
    #[error("token {token} is not the live execution guard of this sandbox (released, lapsed or superseded); acquire the guard again with POST /v1/sandboxes/{{id}}/guard")]
    GuardNotFound {
        /// The token asked about.
        token: i64,
    },
    /// No live lease with this id (never taken, released, or expired).
    #[error("no live lease {lease:?} on this sandbox; take a new one")]
    LeaseNotFound {
        /// The lease id asked for.
        lease: String,
    },
    /// The working directory does not exist or is not a directory.
    #[error("cwd {path} is not an existing directory under {roots}")]
    InvalidCwd {
        /// The virtual path, or what was given.
        path: String,
        /// The mounts of the sandbox's layout.
        roots: String,
    },
    /// The uid's workspace is at its storage quota (bytes or inodes, I23).
    #[error("{path}: the storage quota of uid {uid:?} is full (bytes or inodes); delete files to make room")]
    QuotaExceeded {
        /// The uid.
        uid: String,
        /// The virtual path that could not be written.
        path: String,
    },
    /// The data filesystem has no room to allocate a new uid's workspace volume: the
    /// server's disk is full, which no delete by this uid can fix.
    #[error("the server's data disk has no room for the {bytes}-byte workspace volume of uid {uid:?}; the operator must free space or lower [quotas] bytes")]
    NoRoomForVolume {
        /// The uid's directory name.
        uid: String,
        /// The volume's size.
        bytes: u64,
    },
    /// A uid's workspace volume could not be made, mounted or read (warren's side).
    #[error("the workspace volume of {uid}: {step}: {detail}")]
    Volume {
        /// The uid's directory name.
        uid: String,
        /// What was being done (mkfs, mount, ...).
        step: &'static str,
        /// What failed.
        detail: String,
    },
    /// Quotas are enforced but these uids' workspaces were made before and are not on
    /// volumes of their own: serving them would let them escape their limits.
    #[error("quotas are enforced but the workspaces of {} were made before quotas were configured and are not on volumes (move each out of user-data/shared/<uid>/workspace and back in through the file API, or set [quotas] unenforced = true)", uids.join(", "))]
    WorkspacesWithoutVolumes {
        /// Their directory names.
        uids: Vec<String>,
    },
    /// A write was aimed at the read-only skills mount (I7).
    #[error("{path} is read-only: the skills mounted in a sandbox cannot be changed through it")]
    ReadOnlyPath {
        /// The virtual path.
        path: String,
    },
    /// The file layer refused or failed.
    #[error("{path}: {source}")]
    File {
        /// The virtual path involved.
        path: String,
        /// What the file layer said.
        #[source]
        source: FsError,
    },
    /// The state store failed.
    #[error("the state store failed")]
    Store(#[from] StoreError),
    /// The backend failed.
    #[error("the backend failed")]
    Backend(#[source] BackendError),
    /// A blocking file task panicked or was cancelled.
    #[error("a file operation was interrupted")]
    Interrupted(#[source] tokio::task::JoinError),
}

impl ProvisionerError {
    /// The HTTP status a transport speaking another API than warren's own (DeerFlow, E2B)
    /// answers this failure with: the caller's mistakes are 4xx, warren's own failures 5xx,
    /// never 422. warren's own API maps failures to statuses and codes in `warren-api`.
    pub fn transport_status(&self) -> u16 {
        self.kind().transport_status()
    }

    /// The message a client (HTTP, MCP, a model) may see: virtual paths only (I1), and
    /// nothing about the host or warren's internals for failures on warren's side, which
    /// the caller logs in full instead.
    pub fn public_message(&self) -> String {
        match self {
            Self::File { path, source } => {
                if is_internal_file_error(source) {
                    format!("{path}: a file operation failed on the server")
                } else {
                    format!("{path}: {}", strip_relative_path(&source.to_string()))
                }
            }
            // Sandbox-facing surfaces see the target, not where the operator keeps it.
            Self::ExtraMountSource { target, source } => format!(
                "extra mount {target}: its source beneath the operator's directory cannot be \
                 used: {}",
                strip_relative_path(&source.to_string())
            ),
            Self::Store(_) => "the state store failed; try again".to_owned(),
            Self::Volume { .. } | Self::WorkspacesWithoutVolumes { .. } => {
                "the workspace volume failed on the server".to_owned()
            }
            Self::Backend(
                error @ (BackendError::ExecUnsupported { .. }
                | BackendError::RuntimeNotFound { .. }),
            ) => error.to_string(),
            Self::Backend(_) => "the runtime failed on the server; try again".to_owned(),
            Self::Interrupted(_) => "the operation was interrupted; try again".to_owned(),
            Self::PeerUnreachable { node, .. } => format!(
                "the node {node} that runs this sandbox's runtime could not be reached; retry in a few seconds"
            ),
            Self::Snapshot(
                warren_snapshot::SnapshotError::Store { .. }
                | warren_snapshot::SnapshotError::Io { .. }
                | warren_snapshot::SnapshotError::InvalidKey(_),
            ) => "the snapshot store failed on the server; try again".to_owned(),
            other => other.to_string(),
        }
    }
}

/// Whether a write failed because the disk or the quota is full (ENOSPC, EDQUOT).
pub fn is_disk_full(error: &FsError) -> bool {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    matches!(
        error,
        FsError::Write { errno, .. } | FsError::Create { errno, .. }
            if matches!(errno.raw_os_error(), Some(ENOSPC | EDQUOT))
    )
}

/// File errors that are warren's problem (an errno from a syscall), not the caller's.
pub fn is_internal_file_error(error: &FsError) -> bool {
    // A full disk or quota is the caller's to know about.
    if is_disk_full(error) {
        return false;
    }
    matches!(
        error,
        FsError::RootUnavailable { .. }
            | FsError::SharedDirUnsupported { .. }
            | FsError::Open { .. }
            | FsError::Stat { .. }
            | FsError::Read { .. }
            | FsError::Write { .. }
            | FsError::Lock { .. }
            | FsError::Create { .. }
            | FsError::SetAttributes { .. }
            | FsError::Rename { .. }
            | FsError::Remove { .. }
            | FsError::List { .. }
            | FsError::Io { .. }
    )
}

/// `warren-fs` messages start with "`<root-relative path>`: "; keeps only the reason, so a
/// message never mixes the root-relative path with the virtual one.
pub fn strip_relative_path(message: &str) -> &str {
    message
        .strip_prefix('`')
        .and_then(|rest| rest.split_once("`: "))
        .map_or(message, |(_, reason)| reason)
}

/// An error with each of its sources after a `: `, for the server's log (the answer to a
/// client carries [`ProvisionerError::public_message`] instead).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
