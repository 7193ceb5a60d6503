//! The memory backend: records what it is asked and isolates nothing (I20).
//!
//! It exists so the provisioner's identity, lifecycle and file rules can be tested without a
//! kernel sandbox. It refuses to execute commands: running an agent's command unisolated
//! under the provisioner's identity would be a hole, not a feature. `warren serve` uses it
//! only when asked by name, and says so loudly.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use warren_core::SandboxId;

use crate::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, ExecOutcome, ExecRequest,
    RuntimeSpec, RuntimeUsage,
};

/// One call the memory backend received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryEvent {
    /// A runtime was created.
    Created(SandboxId),
    /// A runtime was destroyed (or a destroy of a missing one was asked).
    Destroyed(SandboxId),
    /// An exec was refused.
    ExecRefused(SandboxId),
}

/// A backend that records and isolates nothing (I20).
#[derive(Debug, Default)]
pub struct MemoryBackend {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    runtimes: BTreeMap<SandboxId, RuntimeSpec>,
    events: Vec<MemoryEvent>,
    /// Figures a test set for [`Backend::usage`], per sandbox.
    usage: BTreeMap<SandboxId, RuntimeUsage>,
}

impl MemoryBackend {
    /// An empty memory backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every call received so far, oldest first.
    pub fn events(&self) -> Vec<MemoryEvent> {
        self.lock().events.clone()
    }

    /// Makes [`Backend::usage`] answer `usage` for the sandbox while its runtime exists: a
    /// seam for the rules built on the figures, since this backend runs nothing to measure.
    pub fn set_usage(&self, sandbox: &SandboxId, usage: RuntimeUsage) {
        self.lock().usage.insert(sandbox.clone(), usage);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        // A panic while holding this lock leaves only a record list behind; the data stays
        // consistent, so recovering from poisoning is sound.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Memory
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exec: false,
            isolation: false,
            survives_restart: false,
            resource_limits: false,
            gvisor: false,
            host_mounts: true,
        }
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        let mut state = self.lock();
        let spec = state
            .runtimes
            .entry(spec.sandbox.clone())
            .or_insert_with(|| spec.clone())
            .clone();
        state
            .events
            .push(MemoryEvent::Created(spec.sandbox.clone()));
        Ok(DiscoveredRuntime { spec })
    }

    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError> {
        Ok(self
            .lock()
            .runtimes
            .values()
            .map(|spec| DiscoveredRuntime { spec: spec.clone() })
            .collect())
    }

    async fn exec(
        &self,
        sandbox: &SandboxId,
        _request: &ExecRequest,
        _sink: Option<crate::OutputSink>,
    ) -> Result<ExecOutcome, BackendError> {
        self.lock()
            .events
            .push(MemoryEvent::ExecRefused(sandbox.clone()));
        Err(BackendError::ExecUnsupported { backend: "memory" })
    }

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        _request: &crate::ProcessRequest,
    ) -> Result<crate::ProcessStart, BackendError> {
        self.lock()
            .events
            .push(MemoryEvent::ExecRefused(sandbox.clone()));
        Err(BackendError::ExecUnsupported { backend: "memory" })
    }

    /// Runs nothing, so kills nothing (I20).
    async fn kill_processes(&self, _sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }

    /// What a test set with [`MemoryBackend::set_usage`], while the runtime exists.
    async fn usage(&self, sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        let state = self.lock();
        Ok(state
            .runtimes
            .contains_key(sandbox)
            .then(|| state.usage.get(sandbox).copied())
            .flatten())
    }

    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        let mut state = self.lock();
        state.runtimes.remove(sandbox);
        state.events.push(MemoryEvent::Destroyed(sandbox.clone()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use warren_core::{RuntimeScope, Uid, Workdir};

    use super::*;

    fn spec() -> RuntimeSpec {
        let uid = Uid::new("alice").unwrap();
        let scope = RuntimeScope::new("t1").unwrap();
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
                network: warren_core::NetworkPolicy::None,
                backend: BackendKind::Memory,
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
    async fn memory_backend_records_but_refuses_to_execute() {
        let backend = MemoryBackend::new();
        let spec = spec();
        backend.create(&spec).await.unwrap();
        assert_eq!(backend.discover().await.unwrap().len(), 1);
        let request = ExecRequest {
            argv: vec!["true".into()],
            cwd: "/home/gem/user-data".into(),
            env: BTreeMap::new(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(1),
            output_cap: 1024,
        };
        let err = backend
            .exec(&spec.sandbox, &request, None)
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::ExecUnsupported { .. }));
        backend.destroy(&spec.sandbox).await.unwrap();
        backend.destroy(&spec.sandbox).await.unwrap();
        assert!(backend.discover().await.unwrap().is_empty());
        assert!(!backend.capabilities().isolation);
        assert_eq!(
            backend.events(),
            vec![
                MemoryEvent::Created(spec.sandbox.clone()),
                MemoryEvent::ExecRefused(spec.sandbox.clone()),
                MemoryEvent::Destroyed(spec.sandbox.clone()),
                MemoryEvent::Destroyed(spec.sandbox.clone()),
            ]
        );
    }

    #[tokio::test]
    async fn set_figures_are_reported_only_while_the_runtime_exists() {
        let backend = MemoryBackend::new();
        let spec = spec();
        let usage = RuntimeUsage {
            memory_current: 42,
            ..RuntimeUsage::default()
        };
        backend.set_usage(&spec.sandbox, usage);
        assert_eq!(backend.usage(&spec.sandbox).await.unwrap(), None);
        backend.create(&spec).await.unwrap();
        assert_eq!(backend.usage(&spec.sandbox).await.unwrap(), Some(usage));
        backend.destroy(&spec.sandbox).await.unwrap();
        assert_eq!(backend.usage(&spec.sandbox).await.unwrap(), None);
    }
}
