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
    ExecOutcome, ExecRequest, OutputSink, ProcessPressure, RuntimeSpec, RuntimeUsage,
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
                spec.binding.backend.as_str()
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

    fn gvisor_unavailable(&self, kind: BackendKind) -> Option<String> {
        match self.member(kind) {
            Some(backend) => backend.gvisor_unavailable(kind),
            None => Some(format!(
                "the {} backend is not enabled on this server",
                kind.as_str()
            )),
        }
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        let backend = self
            .member(spec.binding.backend)
            .ok_or_else(|| Self::unavailable(spec))?;
        let created = backend.create(spec).await?;
        self.hosts()
            .insert(spec.sandbox.clone(), spec.binding.backend);
        Ok(created)
    }

    async fn check_image(
        &self,
        sandbox: &SandboxId,
        kind: BackendKind,
        image: &str,
    ) -> Result<(), BackendError> {
        // A kind the set lacks is refused by the provisioner before it asks.
        match self.member(kind) {
            Some(backend) => backend.check_image(sandbox, kind, image).await,
            None => Ok(()),
        }
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

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &crate::ProcessRequest,
    ) -> Result<crate::ProcessStart, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.start_process(sandbox, request).await,
            None => Err(BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            }),
        }
    }

    async fn runtime_file(
        &self,
        sandbox: &SandboxId,
        op: &crate::FileOp,
        data: Vec<u8>,
    ) -> Result<crate::FileReply, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.runtime_file(sandbox, op, data).await,
            None => Err(BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            }),
        }
    }

    async fn processes(
        &self,
        sandbox: &SandboxId,
        quiet: &[i32],
    ) -> Result<Option<u64>, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.processes(sandbox, quiet).await,
            None => Ok(None),
        }
    }

    async fn kill_processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.kill_processes(sandbox).await,
            None => Ok(None),
        }
    }

    async fn process_pressure(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<ProcessPressure>, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.process_pressure(sandbox).await,
            None => Ok(None),
        }
    }

    async fn usage(&self, sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        match self.host_of(sandbox) {
            Some(backend) => backend.usage(sandbox).await,
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

    fn attach_egress(&self, broker: crate::SharedBroker) {
        for member in &self.members {
            member.attach_egress(broker.clone());
        }
    }

    /// Every member's warnings; with more than one member, each names its backend.
    fn warnings(&self) -> Vec<String> {
        let named = self.members.len() > 1;
        self.members
            .iter()
            .flat_map(|b| {
                b.warnings().into_iter().map(move |w| {
                    if named {
                        format!("{} backend: {w}", b.kind().as_str())
                    } else {
                        w
                    }
                })
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use warren_core::{NetworkPolicy, RuntimeScope, Uid, Workdir};

    use super::*;
    use crate::MemoryBackend;

    fn spec(scope: &str, backend: BackendKind) -> RuntimeSpec {
        let uid = Uid::new("alice").unwrap();
        let scope = RuntimeScope::new(scope).unwrap();
        RuntimeSpec {
            sandbox: SandboxId::derive(&uid, &scope),
            generation: 1,
            uid,
            runtime_scope: scope,
            user_workspace: "/data/ws".into(),
            skill_projection: "/data/skills".into(),
            env: BTreeMap::new(),
            seed: None,
            branch: None,
            frozen: Vec::new(),
            binding: warren_core::Binding {
                workdir: Workdir::new("projects/a").unwrap(),
                network: NetworkPolicy::None,
                backend,
                image: None,
                inherit_env: true,
                ephemeral: false,
                layout: warren_core::LayoutName::Ars,
                extra_mounts: Vec::new(),
                isolation: warren_core::IsolationTier::Kernel,
                branch: None,
            },
        }
    }

    #[tokio::test]
    async fn a_set_routes_each_sandbox_to_its_backend_and_refuses_one_it_lacks() {
        let memory = Arc::new(MemoryBackend::new());
        let set = BackendSet::new(memory.clone(), Vec::new());
        assert_eq!(set.kinds(), [BackendKind::Memory]);
        assert!(set.capabilities_of(BackendKind::Memory).is_some());
        assert!(set.capabilities_of(BackendKind::Docker).is_none());
        let here = spec("t1", BackendKind::Memory);
        set.create(&here).await.unwrap();
        assert_eq!(memory.discover().await.unwrap().len(), 1);
        let elsewhere = spec("t2", BackendKind::Docker);
        let refused = set.create(&elsewhere).await.unwrap_err();
        let reason = std::error::Error::source(&refused).map(|s| s.to_string());
        assert!(
            reason.is_some_and(|r| r.contains("docker backend is not enabled")),
            "{refused:?}"
        );
        // Routed: the memory backend answers for its own sandbox, nobody for another.
        assert!(matches!(
            set.exec(&elsewhere.sandbox, &request(), None).await,
            Err(BackendError::RuntimeNotFound { .. })
        ));
        assert!(matches!(
            set.exec(&here.sandbox, &request(), None).await,
            Err(BackendError::ExecUnsupported { .. })
        ));
        set.destroy(&here.sandbox).await.unwrap();
        assert!(memory.discover().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_set_asks_the_hosting_backend_for_a_runtimes_usage() {
        let memory = Arc::new(MemoryBackend::new());
        let set = BackendSet::new(memory.clone(), Vec::new());
        let here = spec("t1", BackendKind::Memory);
        let usage = RuntimeUsage {
            cpu_usage_usec: 7,
            memory_current: 1 << 20,
            ..RuntimeUsage::default()
        };
        memory.set_usage(&here.sandbox, usage);
        // Not created through the set: it knows no host for the sandbox.
        assert_eq!(set.usage(&here.sandbox).await.unwrap(), None);
        set.create(&here).await.unwrap();
        assert_eq!(set.usage(&here.sandbox).await.unwrap(), Some(usage));
    }

    fn request() -> ExecRequest {
        ExecRequest {
            argv: vec!["true".into()],
            cwd: "/home/gem/user-data".into(),
            env: BTreeMap::new(),
            stdin: Vec::new(),
            timeout: std::time::Duration::from_secs(1),
            output_cap: 1024,
        }
    }
}
