//! Fork (issue 37): new sandboxes of the same uid that start from a sandbox's runtime
//! state and its files as they are now, each writing its own branch, so forks never write
//! into each other or into their source.
//!
//! The runtime is a process tree, not a VM: memory and running processes are not forked.
//! What is: the runtime's ephemeral state (installed packages, the home) through a runtime
//! snapshot taken now (I30), and the workdir through branches (I27):
//! - a source bound to its workdir moves onto a new branch of it, and each fork gets a
//!   new, empty branch of it: the workdir is then their shared read-only baseline;
//! - a source bound to a branch keeps it, and each fork gets a new branch of the same
//!   workdir holding a copy of what the source's branch changed (it costs those changes).
//!
//! A running source is paused for it (its processes end, its runtime is snapshotted and
//! ended, as `pause` does) and resumed after: its runtime starts again from the same
//! snapshot the forks start from.

use warren_core::{BranchName, RuntimeScope, SandboxId};
use warren_store::{SandboxRecord, SandboxState};

use crate::{Provisioner, ProvisionerError, SandboxRequest, SettingsChange};

/// Most forks one call makes (E2B's bound).
pub const MAX_FORKS: usize = 20;

/// What a fork made.
#[derive(Debug, Clone)]
pub struct Forked {
    /// The source, as it is after the fork (bound to its branch, running again if it ran).
    pub source: SandboxRecord,
    /// The new sandboxes, in order.
    pub forks: Vec<SandboxRecord>,
    /// The runtime snapshot they start from; `None` when the source never ran.
    pub snapshot: Option<String>,
}

impl Provisioner {
    /// Makes `count` forks of the sandbox `id` (see the module's documentation); each gets
    /// `settings` (labels, a deadline) as a new sandbox would.
    pub async fn fork_sandbox(
        &self,
        id: &SandboxId,
        count: usize,
        settings: SettingsChange,
    ) -> Result<Forked, ProvisionerError> {
        self.refuse_unsupported()?;
        if count == 0 || count > MAX_FORKS {
            return Err(ProvisionerError::BadRequest(
                "count must be between 1 and 20",
            ));
        }
        let record = self.sandbox(id).await?;
        crate::transitions::refuse_unless_runnable(&record).or_else(|error| {
            // A paused sandbox forks from its pause's snapshot.
            if record.state == SandboxState::Paused {
                Ok(())
            } else {
                Err(error)
            }
        })?;
        if record.binding.ephemeral {
            return Err(ProvisionerError::BadRequest(
                "an ephemeral sandbox's scratch workdir is not forked",
            ));
        }
        if record.binding.backend == warren_core::BackendKind::Kubernetes {
            return Err(ProvisionerError::BranchesUnsupported {
                reason: "the kubernetes backend mounts claims, not warren's host".to_owned(),
            });
        }
        // A branch a fork copies must not change meanwhile: nothing else may write it.
        if let Some(name) = &record.binding.branch {
            let others: Vec<String> = self
                .store
                .list_sandboxes(Some(&record.uid))
                .await?
                .into_iter()
                .filter(|other| {
                    other.id != record.id
                        && other.state != SandboxState::Terminated
                        && other.binding.workdir == record.binding.workdir
                        && other.binding.branch.as_ref() == Some(name)
                })
                .map(|other| other.id.to_string())
                .collect();
            if !others.is_empty() {
                return Err(ProvisionerError::BranchInUse {
                    name: name.to_string(),
                    sandboxes: others.join(", "),
                });
            }
        }
        let was_running = matches!(record.state, SandboxState::Running | SandboxState::Pausing);
        let snapshot = if was_running {
            let paused = self.pause_sandbox(id).await?;
            if let Some(error) = paused.snapshot_error {
                // Without the snapshot the forks would start from nothing: resume the
                // source as it was and refuse.
                let _ = self.resume_sandbox(id, SettingsChange::default()).await;
                tracing::warn!(sandbox = %id, %error, "no snapshot to fork from");
                return Err(ProvisionerError::BranchesUnsupported {
                    reason: format!("the source's runtime could not be snapshotted: {error}"),
                });
            }
            paused.snapshot
        } else {
            self.store
                .list_runtime_snapshots(id)
                .await?
                .into_iter()
                .rfind(|snapshot| snapshot.generation == record.generation)
                .map(|snapshot| snapshot.id)
        };
        let made = self
            .fork_paused(id, count, settings, snapshot.clone())
            .await;
        if was_running {
            if let Err(error) = self.resume_sandbox(id, SettingsChange::default()).await {
                tracing::warn!(sandbox = %id, %error, "could not resume a forked source");
            }
        }
        let forks = made?;
        Ok(Forked {
            source: self.sandbox(id).await?,
            forks,
            snapshot,
        })
    }

    /// The branches and sandboxes of a fork, the source having no runtime.
    async fn fork_paused(
        &self,
        id: &SandboxId,
        count: usize,
        settings: SettingsChange,
        snapshot: Option<String>,
    ) -> Result<Vec<SandboxRecord>, ProvisionerError> {
        let record = self.sandbox(id).await?;
        let (uid, workdir) = (record.uid.clone(), record.binding.workdir.clone());
        let fresh = || {
            let short = uuid::Uuid::new_v4().simple().to_string();
            BranchName::new(format!("fork-{}", &short[..12])).expect("a valid branch name")
        };
        let copied = match &record.binding.branch {
            Some(name) => Some(self.branch(&uid, &workdir, name).await?),
            None => {
                // The source moves onto a branch of its own: the workdir becomes the
                // forks' shared read-only baseline.
                let own = fresh();
                self.create_branch(&uid, &workdir, own.clone(), None)
                    .await?;
                let moved = self
                    .store
                    .set_sandbox_branch(id, record.generation, Some(&own))
                    .await?;
                if moved.is_none() {
                    let _ = self.delete_branch(&uid, &workdir, &own).await;
                    return Err(ProvisionerError::IllegalTransition {
                        sandbox: id.clone(),
                        state: self.sandbox(id).await?.state.as_str(),
                        event: "be forked while it starts",
                    });
                }
                None
            }
        };
        let mut forks = Vec::with_capacity(count);
        for _ in 0..count {
            match self
                .fork_one(&record, &snapshot, &settings, copied.as_ref(), &fresh)
                .await
            {
                Ok(fork) => forks.push(fork),
                Err(error) => {
                    // All or none: the forks made so far go, with their branches.
                    for fork in &forks {
                        self.discard_fork(fork).await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(forks)
    }

    /// One fork of `record`: its branch, then its sandbox; neither is left when the
    /// sandbox cannot be made.
    async fn fork_one(
        &self,
        record: &SandboxRecord,
        snapshot: &Option<String>,
        settings: &SettingsChange,
        copied: Option<&warren_store::BranchRecord>,
        fresh: &impl Fn() -> BranchName,
    ) -> Result<SandboxRecord, ProvisionerError> {
        let (uid, workdir) = (&record.uid, &record.binding.workdir);
        let name = fresh();
        self.create_branch_with(uid, workdir, name.clone(), None, copied)
            .await?;
        let scope = RuntimeScope::new(format!("fork-{}", uuid::Uuid::new_v4().simple()))?;
        let binding = &record.binding;
        let made = self
            .create_sandbox(SandboxRequest {
                workdir: Some(workdir.to_string()),
                branch: Some(name.to_string()),
                network: Some(binding.network.clone()),
                inherit_env: binding.inherit_env,
                from_snapshot: snapshot.clone(),
                backend: Some(binding.backend.as_str().to_owned()),
                image: binding.image.clone(),
                layout: Some(binding.layout),
                extra_mounts: Some(binding.extra_mounts.clone()),
                isolation: Some(binding.isolation),
                settings: settings.clone(),
                ..SandboxRequest::new(uid.clone(), scope)
            })
            .await;
        match made {
            Ok((fork, _)) => {
                tracing::info!(source = %record.id, fork = %fork.id, branch = %name, "sandbox forked");
                Ok(fork)
            }
            Err(error) => {
                let _ = self.delete_branch(uid, workdir, &name).await;
                Err(error)
            }
        }
    }

    /// Ends a fork made by a fork call that failed, and deletes its branch.
    async fn discard_fork(&self, fork: &SandboxRecord) {
        if let Err(error) = self
            .terminate_sandbox(&fork.id, std::time::Duration::ZERO)
            .await
        {
            tracing::warn!(fork = %fork.id, %error, "could not end a fork of a failed fork call");
        }
        if let Some(name) = &fork.binding.branch {
            if let Err(error) = self
                .delete_branch(&fork.uid, &fork.binding.workdir, name)
                .await
            {
                tracing::warn!(fork = %fork.id, %error, "could not delete the branch of a fork of a failed fork call");
            }
        }
    }
}
