//! [`BackendSet`]: several backends behind the one [`Backend`] interface (I21).
//!
//! A sandbox chooses its backend when it is created (`RuntimeSpec::backend`); every later
//! call about it goes to the backend that hosts it. The provisioner sees one backend and
//! does not change when another is added.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use warren_core::SandboxId;

use crate::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, EphemeralRoots,
    ExecOutcome, ExecRequest, OutputSink, RuntimeSpec,
};

/// Routes each sandbox to the backend that hosts it.
pub struct BackendSet {
    default: BackendKind,
    members: Vec<Arc<dyn Backend>>,
    /// Which backend hosts each sandbox this process knows of.
    hosts: Mutex<HashMap<SandboxId, BackendKind>>,
}

impl BackendSet {
    /// A set whose default (for sandboxes that name none) is `default`, which must be one
    /// of `members`.
    pub fn new(default: Arc<dyn Backend>, others: Vec<Arc<dyn Backend>>) -> Self {
        let kind = default.kind();
        let mut members = vec![default];
        members.extend(others.into_iter().filter(|b| b.kind() != kind));
        Self {
            default: kind,
            members,
            hosts: Mutex::new(HashMap::new()),
        }
    }

    /// The backends this set holds, the default first.
    pub fn kinds(&self) -> Vec<BackendKind> {
        self.members.iter().map(|b| b.kind()).collect()
    }

    /// The member of that kind, if configured.
    pub fn member(&self, kind: BackendKind) -> Option<&Arc<dyn Backend>> {
        self.members.iter().find(|b| b.kind() == kind)
    }

    fn hosts(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, BackendKind>> {
        // A cache of facts the backends can re-establish; poisoning loses nothing.
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backend hosting `sandbox`, when this process knows it.
    fn host_of(&self, sandbox: &SandboxId) -> Option<&Arc<dyn Backend>> {
        let kind = *self.hosts().get(sandbox)?;
        self.member(kind)
    }

    fn unavailable(spec: &RuntimeSpec) -> BackendError {
        BackendError::Create {
            sandbox: spec.sandbox.clone(),
            source: std::io::Error::other(format!(
                "the {} backend is not enabled on this server",
                spec.backend.as_str()
            )),
        }
    }
}

#[async_trait]
impl Backend for BackendSet {
    fn kind(&self) -> BackendKind {
        self.default
    }

    fn capabilities(&self) -> Capabilities {
        self.members[0].capabilities()
    }

    fn capabilities_of(&self, kind: BackendKind) -> Option<Capabilities> {
        self.member(kind).map(|b| b.capabilities())
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        let backend = self
            .member(spec.backend)
            .ok_or_else(|| Self::unavailable(spec))?;
        let created = backend.create(spec).await?;
        self.hosts().insert(spec.sandbox.clone(), spec.backend);
        Ok(created)
    }

    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError> {
        let mut found = Vec::new();
        for backend in &self.members {
            for runtime in backend.discover().await? {
                self.hosts()
                    .insert(runtime.spec.sandbox.clone(), backend.kind());
                found.push(runtime);
            }
        }
        Ok(found)
    }

    async fn exec(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
        sink: Option<OutputSink>,
    ) -> Result<ExecOutcome, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.exec(sandbox, request, sink).await,
            None => Err(BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            }),
        }
    }

    async fn processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.processes(sandbox).await,
            None => Ok(None),
        }
    }

    async fn ephemeral_roots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<EphemeralRoots>, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.ephemeral_roots(sandbox).await,
            None => Ok(None),
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.members.iter().flat_map(|b| b.warnings()).collect()
    }

    /// Destroys the runtime wherever it may be: a sandbox this process has not seen yet
    /// (a record from before a restart) is asked of every backend; destroy is idempotent.
    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        let known = self.hosts().get(sandbox).copied();
        for backend in &self.members {
            if known.is_none_or(|kind| kind == backend.kind()) {
                backend.destroy(sandbox).await?;
            }
        }
        self.hosts().remove(sandbox);
        Ok(())
    }
}
