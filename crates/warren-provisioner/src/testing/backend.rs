//! A backend double a test scripts: it tells what the next start (create), stop (destroy)
//! or exec does (succeed, fail with a given error, block until released) and reads back
//! every call. The runtimes themselves are kept by the memory backend.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use warren_backend::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, ExecOutcome, ExecRequest,
    MemoryBackend, OutputSink, ResourceUsage, RuntimeSpec, RuntimeUsage,
};
use warren_core::SandboxId;

/// A backend operation a test can script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Starting a runtime ([`Backend::create`]).
    Create,
    /// Stopping a runtime ([`Backend::destroy`]).
    Destroy,
    /// Running a command ([`Backend::exec`]).
    Exec,
    /// A file operation in the runtime ([`Backend::runtime_file`]); unscripted, it is
    /// unsupported, as on the memory backend.
    File,
}

/// One call the double received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A runtime was asked to start.
    Create(SandboxId),
    /// A runtime was asked to stop.
    Destroy(SandboxId),
    /// A command was asked to run: its argv.
    Exec(SandboxId, Vec<String>),
    /// A file operation was asked of the runtime: its path.
    File(SandboxId, String),
}

impl Call {
    fn op(&self) -> Op {
        match self {
            Call::Create(_) => Op::Create,
            Call::Destroy(_) => Op::Destroy,
            Call::Exec(..) => Op::Exec,
            Call::File(..) => Op::File,
        }
    }
}

/// What a scripted call does instead of succeeding at once.
enum Step {
    Fail(BackendError),
    Block {
        arrived: oneshot::Sender<()>,
        release: oneshot::Receiver<()>,
    },
}

/// A call held by [`ScriptedBackend::block_next`]: the test waits for it to arrive, then
/// lets it go on. Dropping the gate lets it go on too, so a failing test never hangs.
#[derive(Debug)]
pub struct Gate {
    arrived: Option<oneshot::Receiver<()>>,
    release: Option<oneshot::Sender<()>>,
}

impl Gate {
    /// Waits until the blocked call has arrived (and is held).
    pub async fn reached(&mut self) {
        if let Some(arrived) = self.arrived.take() {
            let _ = arrived.await;
        }
    }

    /// Lets the blocked call go on as an unscripted one would.
    pub fn release(mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
    }
}

#[derive(Default)]
struct Script {
    next: HashMap<Op, VecDeque<Step>>,
    calls: Vec<Call>,
    processes: HashMap<SandboxId, u64>,
}

/// A backend of kind `memory` that runs commands, for library tests: unscripted, every
/// start and stop succeeds and every command exits 0 with no output, in a runtime that must
/// exist ([`BackendError::RuntimeNotFound`] otherwise, as a real backend answers).
#[derive(Default)]
pub struct ScriptedBackend {
    runtimes: MemoryBackend,
    gvisor: bool,
    no_exec: bool,
    script: Mutex<Script>,
}

impl ScriptedBackend {
    /// A double with no runtimes, offering the kernel tier only.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same double, said to run the gVisor tier too (no backend of a unit test does).
    pub fn with_gvisor(mut self) -> Self {
        self.gvisor = true;
        self
    }

    /// The same double, saying it runs no commands, as the memory backend does: the
    /// provisioner then starts no runtime on it.
    pub fn without_exec(mut self) -> Self {
        self.no_exec = true;
        self
    }

    /// Makes the next call of `op` fail with `error`.
    pub fn fail_next(&self, op: Op, error: BackendError) {
        self.push(op, Step::Fail(error));
    }

    /// Holds the next call of `op` until the returned gate releases it.
    pub fn block_next(&self, op: Op) -> Gate {
        let (arrived, arrived_rx) = oneshot::channel();
        let (release_tx, release) = oneshot::channel();
        self.push(op, Step::Block { arrived, release });
        Gate {
            arrived: Some(arrived_rx),
            release: Some(release_tx),
        }
    }

    /// Makes [`Backend::processes`] report `count` processes in the sandbox's runtime while
    /// it exists (unscripted: `None`, the backend cannot tell).
    pub fn set_processes(&self, sandbox: &SandboxId, count: u64) {
        self.lock().processes.insert(sandbox.clone(), count);
    }

    /// Makes [`Backend::usage`] report `usage` while the sandbox's runtime exists.
    pub fn set_usage(&self, sandbox: &SandboxId, usage: RuntimeUsage) {
        self.runtimes.set_usage(sandbox, usage);
    }

    /// Every call received so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// How many calls of `op` were received.
    pub fn count(&self, op: Op) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|call| call.op() == op)
            .count()
    }

    /// The runtime the sandbox has now, if any.
    pub async fn runtime_of(&self, sandbox: &SandboxId) -> Option<RuntimeSpec> {
        self.runtimes
            .discover()
            .await
            .ok()?
            .into_iter()
            .find(|runtime| &runtime.spec.sandbox == sandbox)
            .map(|runtime| runtime.spec)
    }

    /// The runtime vanishes behind the provisioner's back (killed, the host rebooted): no
    /// call is recorded.
    pub async fn lose_runtime(&self, sandbox: &SandboxId) {
        let _ = self.runtimes.destroy(sandbox).await;
    }

    fn push(&self, op: Op, step: Step) {
        self.lock().next.entry(op).or_default().push_back(step);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        // A test that panicked while holding it left only records behind.
        self.script.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the call and plays its scripted step, if any: `Err` for a scripted failure.
    async fn called(&self, call: Call) -> Result<(), BackendError> {
        let step = {
            let mut script = self.lock();
            let op = call.op();
            script.calls.push(call);
            script.next.get_mut(&op).and_then(VecDeque::pop_front)
        };
        match step {
            None => Ok(()),
            Some(Step::Fail(error)) => Err(error),
            Some(Step::Block { arrived, release }) => {
                let _ = arrived.send(());
                let _ = release.await;
                Ok(())
            }
        }
    }

    async fn exists(&self, sandbox: &SandboxId) -> bool {
        self.runtime_of(sandbox).await.is_some()
    }
}

#[async_trait]
impl Backend for ScriptedBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Memory
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exec: !self.no_exec,
            gvisor: self.gvisor,
            ..self.runtimes.capabilities()
        }
    }

    fn gvisor_unavailable(&self, kind: BackendKind) -> Option<String> {
        if self.gvisor {
            None
        } else {
            self.runtimes.gvisor_unavailable(kind)
        }
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        self.called(Call::Create(spec.sandbox.clone())).await?;
        self.runtimes.create(spec).await
    }

    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError> {
        self.runtimes.discover().await
    }

    async fn exec(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
        _sink: Option<OutputSink>,
    ) -> Result<ExecOutcome, BackendError> {
        self.called(Call::Exec(sandbox.clone(), request.argv.clone()))
            .await?;
        if !self.exists(sandbox).await {
            return Err(BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            });
        }
        Ok(ExecOutcome {
            exit_code: Some(0),
            signal: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
            timed_out: false,
            duration: Duration::ZERO,
            usage: ResourceUsage::default(),
        })
    }

    async fn processes(
        &self,
        sandbox: &SandboxId,
        _quiet: &[i32],
    ) -> Result<Option<u64>, BackendError> {
        let scripted = self.lock().processes.get(sandbox).copied();
        Ok(match scripted {
            Some(count) if self.exists(sandbox).await => Some(count),
            _ => None,
        })
    }

    async fn kill_processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        self.runtimes.kill_processes(sandbox).await
    }

    async fn usage(&self, sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        self.runtimes.usage(sandbox).await
    }

    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        self.called(Call::Destroy(sandbox.clone())).await?;
        self.runtimes.destroy(sandbox).await
    }

    async fn runtime_file(
        &self,
        sandbox: &SandboxId,
        op: &warren_backend::FileOp,
        data: Vec<u8>,
    ) -> Result<warren_backend::FileReply, BackendError> {
        self.called(Call::File(sandbox.clone(), op.path().to_owned()))
            .await?;
        self.runtimes.runtime_file(sandbox, op, data).await
    }
}
