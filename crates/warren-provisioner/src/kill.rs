//! Killing a sandbox's processes without ending the sandbox: the way out of a fork bomb,
//! or any background process, that outlived its command and holds the process limit
//! (I23, I24).

use warren_core::SandboxId;

use crate::exec::Route;
use crate::transitions::refuse_unless_runnable;
use crate::{Provisioner, ProvisionerError};

impl Provisioner {
    /// Kills every process of the sandbox's runtime but the runtime's own machinery (its
    /// init, or a container's agent) and returns how many were killed. The runtime, its
    /// files and the sandbox stay: the next exec runs in the same runtime. Commands
    /// running meanwhile end by SIGKILL, which their callers get as their result. A
    /// sandbox whose runtime is not running has nothing to kill (0).
    ///
    /// Refused with 409 `sandbox_terminated` behind the cleanup fence (I24): a runtime
    /// being destroyed is killed by its destroy.
    pub async fn kill_processes(&self, id: &SandboxId) -> Result<u64, ProvisionerError> {
        self.kill_routed(id, Route::ToOwner).await
    }

    /// [`Provisioner::kill_processes`] forwarded here by another node: only here.
    pub async fn kill_processes_as_owner(&self, id: &SandboxId) -> Result<u64, ProvisionerError> {
        self.kill_routed(id, Route::HereOnly).await
    }

    async fn kill_routed(&self, id: &SandboxId, route: Route) -> Result<u64, ProvisionerError> {
        let record = self.sandbox(id).await?;
        // A pause ends the processes of the runtime it is about to snapshot.
        if record.state != warren_store::SandboxState::Pausing {
            refuse_unless_runnable(&record)?;
        }
        if let Err(owner) = self.place_for(id, route).await? {
            self.metrics.forwarded();
            let killed = self.peer_link()?.kill_processes(&owner, id).await;
            return self.after_forward(id, killed);
        }
        // A runtime being started or destroyed right now is never half killed.
        let lock = self.lifecycle_lock(id);
        let _held = lock.lock().await;
        let killed = self
            .backend
            .kill_processes(id)
            .await
            .map_err(ProvisionerError::Backend)?;
        Ok(killed.unwrap_or(0))
    }
}
