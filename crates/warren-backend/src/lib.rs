//! The seam between the provisioner and whatever hosts runtimes (I20, I21).
//!
//! A [`Backend`] creates, discovers, runs commands in and destroys runtimes. The provisioner
//! decides *when* (lazily, I12; behind the cleanup fence, I15); a backend decides *how*. Agent
//! code and tools never see which backend serves them (I21).
//!
//! **Architecture invariant:** a backend never deletes a UserWorkspace file. It receives the
//! host paths of the two persistent mounts only to mount them (I7, I15).

#![deny(missing_docs)]

mod complete;
mod egress;
mod limits;
mod memory;
mod mount;
mod process;
mod runtime_files;
mod set;
mod spec;
pub mod staging;
mod usage;

use async_trait::async_trait;

pub use complete::{run_to_completion, OutputReader, OUTPUT_GRACE};
pub use egress::{Authority, EgressBroker, SharedBroker};
pub use limits::RuntimeLimits;
pub use memory::{MemoryBackend, MemoryEvent};
pub use mount::bind_fd;
pub use process::{
    Control, ProcessControl, ProcessExit, ProcessHandle, ProcessInput, ProcessOutput,
    ProcessRequest, ProcessSignal, ProcessStart, ProcessWait, RuntimeInstant, TerminalSize,
    APPLY_WAIT,
};
pub use runtime_files::{FileAnswer, FileEntry, FileFailure, FileOp, FileReply};
pub use set::BackendSet;
pub use spec::{
    BackendKind, Capabilities, DiscoveredRuntime, EphemeralRoots, ExecOutcome, ExecRequest,
    HostMount, OutputChunk, OutputSink, OutputStream, ProcessPressure, ResourceUsage, RuntimeSpec,
};
pub use usage::RuntimeUsage;
use warren_core::SandboxId;

/// Why a backend could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend does not execute commands at all (the memory backend, I20).
    #[error(
        "the {backend} backend does not execute commands; start warren with an isolating backend"
    )]
    ExecUnsupported {
        /// The backend's name.
        backend: &'static str,
    },
    /// The backend runs commands to completion but cannot keep a process running with its
    /// stdin open (not yet built for it).
    #[error("the {backend} backend cannot start long-running processes yet")]
    ProcessesUnsupported {
        /// The backend's name.
        backend: &'static str,
    },
    /// There is no runtime for the sandbox.
    #[error("no runtime exists for sandbox {sandbox}")]
    RuntimeNotFound {
        /// The sandbox asked about.
        sandbox: SandboxId,
    },
    /// Creating the runtime failed.
    #[error("could not create the runtime of sandbox {sandbox}")]
    Create {
        /// The sandbox being created.
        sandbox: SandboxId,
        /// What failed underneath.
        #[source]
        source: std::io::Error,
    },
    /// Talking to the runtime failed while running a command.
    #[error("could not run the command in sandbox {sandbox}")]
    Exec {
        /// The sandbox.
        sandbox: SandboxId,
        /// What failed underneath.
        #[source]
        source: std::io::Error,
    },
    /// The sandbox's image is not where the backend runs images (it never pulls).
    #[error("image {image:?} is not on the Docker host; build or pull it there first (warren never pulls)")]
    ImageNotFound {
        /// The sandbox being created.
        sandbox: SandboxId,
        /// The image.
        image: String,
    },
    /// Listing the backend's runtimes failed.
    #[error("could not list the backend's runtimes")]
    Discover {
        /// What failed underneath.
        #[source]
        source: std::io::Error,
    },
    /// Killing the runtime's processes failed; some may still run.
    #[error("could not kill the processes of sandbox {sandbox}")]
    Kill {
        /// The sandbox.
        sandbox: SandboxId,
        /// What failed underneath.
        #[source]
        source: std::io::Error,
    },
    /// A host directory of warren's could not be made or removed (staging, `staging`).
    #[error("cannot prepare {what}")]
    HostDir {
        /// Which directory.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A persistent mount's source cannot be bound as the view needs (a link or another
    /// mount in its path, no permission to stage it); the reason names no host path (I1).
    #[error("cannot mount {target}: {reason}")]
    MountRefused {
        /// The mount point inside the runtime.
        target: String,
        /// Why.
        reason: String,
    },
    /// The cluster refused or failed a request about the sandbox's runtime (after the
    /// retries Kubernetes allows for its answer).
    #[error("the cluster answered {code} {reason} to {operation}: {message}")]
    Cluster {
        /// The sandbox, when the request was about one.
        sandbox: Option<SandboxId>,
        /// What was being done (`create the pod`, `list pods`, ...).
        operation: String,
        /// The HTTP status (0 when no answer came).
        code: u16,
        /// The Kubernetes reason (`Forbidden`, `TooManyRequests`, ...).
        reason: String,
        /// The cluster's message.
        message: String,
    },
    /// The runtime did not become ready; the reason names what the cluster reported
    /// (`ImagePullBackOff`, `Unschedulable`, a failed init container, the wait's end).
    #[error("the runtime of sandbox {sandbox} did not become ready: {reason}")]
    NotReady {
        /// The sandbox.
        sandbox: SandboxId,
        /// Why, in the cluster's words.
        reason: String,
    },
    /// Destroying the runtime failed; it may still hold resources.
    #[error("could not destroy the runtime of sandbox {sandbox}")]
    Destroy {
        /// The sandbox being destroyed.
        sandbox: SandboxId,
        /// What failed underneath.
        #[source]
        source: std::io::Error,
    },
}

/// Hosts runtimes: one per sandbox.
///
/// Implementations must be safe to call concurrently for different sandboxes; the
/// provisioner serialises lifecycle calls (create, destroy) for one sandbox.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What this backend can do; callers check before relying on a feature.
    fn capabilities(&self) -> Capabilities;

    /// What the backend of that kind can do, when this backend serves sandboxes of that
    /// kind (a [`BackendSet`] serves several).
    fn capabilities_of(&self, kind: BackendKind) -> Option<Capabilities> {
        (kind == self.kind()).then(|| self.capabilities())
    }

    /// Why the backend of that kind cannot run the gVisor tier on this host now, in words
    /// an operator can act on; `None` when it can (issue 19). A backend with no such tier
    /// says so.
    fn gvisor_unavailable(&self, kind: BackendKind) -> Option<String> {
        Some(format!("the {} backend has no gVisor tier", kind.as_str()))
    }

    /// Starts the runtime described by `spec`. Creating a runtime that already exists with
    /// the same identity returns it unchanged.
    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError>;

    /// Lists the runtimes this backend hosts now, with the identity each was created with,
    /// so a restarted provisioner can adopt exactly matching ones (I16).
    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError>;

    /// Runs one command in the sandbox's runtime and waits for it. With a `sink`, output is
    /// also sent there as it arrives; a closed sink kills the command (I24). A process
    /// ([`Backend::start_process`]) followed to its end ([`run_to_completion`]).
    async fn exec(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
        sink: Option<OutputSink>,
    ) -> Result<ExecOutcome, BackendError> {
        let began = std::time::Instant::now();
        let started = self.start_process(sandbox, &request.process()).await?;
        run_to_completion(started, request, sink, began).await
    }

    /// Starts a long-running process in the sandbox's runtime and hands it over: its stdin
    /// stays open until the handle closes it, its output streams as it comes, and it can be
    /// signalled, resized (on a terminal) and killed. Dropping the whole handle kills its
    /// tree (I24). A runtime that cannot start it answers [`ProcessStart::Failed`].
    async fn start_process(
        &self,
        _sandbox: &SandboxId,
        _request: &ProcessRequest,
    ) -> Result<ProcessStart, BackendError> {
        Err(BackendError::ProcessesUnsupported {
            backend: self.kind().as_str(),
        })
    }

    /// How many processes run in the sandbox's runtime besides its own machinery and the
    /// trees of the `quiet` pids (processes that wait for work, such as an idle code
    /// kernel), or `None` when the backend cannot tell (or no runtime runs). Running
    /// processes count as activity: an idle reaper must not end a runtime that still works.
    async fn processes(
        &self,
        _sandbox: &SandboxId,
        _quiet: &[i32],
    ) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }

    /// Kills every process of the sandbox's runtime but the runtime's own machinery (its
    /// init, or a container's agent): running commands (their callers get the signal as
    /// their result) and whatever was left running in the background, such as a fork bomb
    /// holding the process limit. The runtime and its files stay. Returns how many
    /// processes were killed, or `None` when no runtime runs.
    async fn kill_processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError>;

    /// How close the sandbox's runtime is to its process limit: tasks (processes and
    /// threads) charged now against the limit, or `None` when the backend cannot tell (or
    /// no runtime runs). A runtime pinned at its limit can start nothing, so the reaper may
    /// treat it as stuck rather than busy.
    async fn process_pressure(
        &self,
        _sandbox: &SandboxId,
    ) -> Result<Option<ProcessPressure>, BackendError> {
        Ok(None)
    }

    /// What the sandbox's runtime consumes now, as the kernel accounts it for the runtime
    /// as a whole (I22), with the limits it enforces (I23); `None` when no runtime of the
    /// sandbox runs here or the backend cannot measure it. Reading never starts, stops or
    /// slows a runtime.
    async fn usage(&self, _sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        Ok(None)
    }

    /// Where a running runtime's ephemeral state can be read for a snapshot (I30), or
    /// `None` when the backend cannot offer it or no runtime runs.
    async fn ephemeral_roots(
        &self,
        _sandbox: &SandboxId,
    ) -> Result<Option<EphemeralRoots>, BackendError> {
        Ok(None)
    }

    /// Checks, before a sandbox is bound to it, that the backend of `kind` can start a
    /// runtime from `image`, so a sandbox is never created only to fail at its first exec:
    /// the Docker backend never pulls, so the image must already be on its host
    /// ([`BackendError::ImageNotFound`]). Backends without images accept any.
    async fn check_image(
        &self,
        _sandbox: &SandboxId,
        _kind: BackendKind,
        _image: &str,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    /// Gives the backend what its runtimes' egress proxies ask for secrets, their authority
    /// and the audit (issue 38). Called once, before any runtime is created or found; a
    /// backend that serves no egress ignores it.
    fn attach_egress(&self, _broker: SharedBroker) {}

    /// Conditions an operator must know about (a limit that cannot be enforced, a missing
    /// kernel feature), reported once at start-up and in `/health`.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Runs one file operation inside the sandbox's runtime, by its agent, as the sandbox
    /// user, on the runtime's own paths (`/tmp`, the home, the image's tree): `data` is
    /// what a write sends. [`BackendError::RuntimeNotFound`] when no runtime of the sandbox
    /// runs here.
    async fn runtime_file(
        &self,
        _sandbox: &SandboxId,
        _op: &FileOp,
        _data: Vec<u8>,
    ) -> Result<FileReply, BackendError> {
        Err(BackendError::ExecUnsupported {
            backend: self.kind().as_str(),
        })
    }

    /// Ends every process of the runtime and removes its ephemeral state. Destroying a
    /// runtime that does not exist succeeds: cleanup must be safe to repeat (I24).
    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError>;
}
