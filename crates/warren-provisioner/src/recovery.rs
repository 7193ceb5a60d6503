//! Start-up reconciliation: what the state store says against what the backend hosts
//! (I16, I17, I24). Runs once, before the API serves.

use std::collections::HashMap;

use warren_store::SandboxState;

use crate::transitions::LifeEvent;
use crate::{Provisioner, ProvisionerError};

/// What reconciliation found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Runs that were in flight when the previous process died, now closed as failed.
    pub runs_failed: u64,
    /// Live runtimes whose identity matches their sandbox exactly, kept.
    pub runtimes_adopted: usize,
    /// Runtimes nobody owns any more (unknown, terminated, other generation or identity),
    /// destroyed.
    pub runtimes_destroyed: usize,
    /// Sandboxes recorded as running whose runtime is gone, marked stopped.
    pub sandboxes_stopped: usize,
    /// Sandboxes caught behind their cleanup fence, now terminated.
    pub terminations_finished: usize,
    /// Sandboxes caught in a pause, their runtime ended, now paused.
    pub pauses_finished: usize,
    /// Scratch trees of ephemeral sandboxes that had ended, removed.
    pub scratch_removed: usize,
    /// Cleanups that failed (logged); they are retried on the next start.
    pub cleanup_failures: usize,
}

impl Provisioner {
    /// Reconciles the state store with the backend after a start (or a crash).
    ///
    /// A runtime is adopted only if it matches its sandbox's record exactly: same id,
    /// generation, uid, runtime scope, the whole [`warren_core::Binding`] and the trees it
    /// mounts (I16, issue 19). Anything else the backend hosts is destroyed;
    /// workspace files are never touched (I15).
    ///
    /// In a cluster (issue 14) it is this node's reconciliation only: it must have joined
    /// (a new epoch) first. It closes this node's runs, adopts a runtime only while the
    /// store still names this node its owner (re-owned at the new epoch, same token),
    /// destroys one another node took over meanwhile, and leaves the sandboxes other nodes
    /// own alone.
    pub async fn recover(&self) -> Result<RecoveryReport, ProvisionerError> {
        // A merge a crash interrupted is finished or undone before anything reads its
        // target (I27).
        // One that cannot be finished (an I/O error) stays journaled for the next start;
        // it never keeps the server from serving everything else.
        match self.recover_merges().await {
            Ok(0) => {}
            Ok(merges) => tracing::info!(merges, "interrupted merges recovered"),
            Err(error) => {
                tracing::error!(error = %crate::error_chain(&error), "an interrupted merge could not be finished; it is tried again at the next start")
            }
        }
        let me = self.config.node.node_id.clone();
        let mut report = RecoveryReport {
            runs_failed: self
                .store
                .fail_running_runs(&me, "provisioner_restarted")
                .await?,
            ..RecoveryReport::default()
        };
        let owners: HashMap<_, _> = self
            .store
            .runtime_owners()
            .await?
            .into_iter()
            .map(|owner| (owner.sandbox_id.clone(), owner))
            .collect();
        // A sandbox nobody owns is this node's to reconcile (a lone node's, from before
        // ownership was recorded); one another node owns is that node's.
        let ours = |id: &warren_core::SandboxId| {
            owners
                .get(id)
                .is_none_or(|owner| owner.node_id.as_deref() == Some(me.as_str()))
        };
        let records: HashMap<_, _> = self
            .store
            .list_sandboxes(None)
            .await?
            .into_iter()
            .map(|record| (record.id.clone(), record))
            .collect();
        let discovered = self
            .backend
            .discover()
            .await
            .map_err(ProvisionerError::Backend)?;
        let mut live = std::collections::HashSet::new();
        for runtime in discovered {
            let spec = &runtime.spec;
            let owner = records.get(&spec.sandbox).filter(|record| {
                record.generation == spec.generation
                    && record.uid == spec.uid
                    && record.runtime_scope == spec.runtime_scope
                    // The whole binding: a runtime of another tier, layout, network,
                    // image or environment policy never serves the sandbox (I16).
                    && record.binding == spec.binding
                    && (spec.user_workspace.clone(), spec.skill_projection.clone())
                        == self.mounts(record)
                    && matches!(record.state, SandboxState::Running | SandboxState::Created)
            });
            let adopted = match owner {
                Some(_) => self
                    .store
                    .adopt_runtime(&spec.sandbox, &me, self.node_epoch())
                    .await?
                    .inspect(|token| self.ownership.insert(&spec.sandbox, *token)),
                None => None,
            };
            if adopted.is_some() {
                live.insert(spec.sandbox.clone());
                report.runtimes_adopted += 1;
            } else {
                tracing::warn!(sandbox = %spec.sandbox, generation = spec.generation, "destroying a runtime no sandbox owns");
                match self.backend.destroy(&spec.sandbox).await {
                    Ok(()) => report.runtimes_destroyed += 1,
                    Err(error) => {
                        tracing::error!(sandbox = %spec.sandbox, %error, "could not destroy an orphaned runtime");
                        report.cleanup_failures += 1;
                    }
                }
            }
        }
        for record in records.values() {
            if !ours(&record.id) {
                continue;
            }
            match record.state {
                SandboxState::Running if !live.contains(&record.id) => {
                    match owners.get(&record.id) {
                        Some(owner) => {
                            let fence = warren_store::OwnerFence {
                                node_id: me.clone(),
                                token: owner.token,
                            };
                            match self
                                .advance(record, LifeEvent::RuntimeLost, Some(&fence))
                                .await
                            {
                                Ok(_) => {
                                    self.store
                                        .release_runtime(&record.id, &me, owner.token)
                                        .await?;
                                }
                                // Taken over since the list was read: the new owner's.
                                Err(ProvisionerError::Store(
                                    warren_store::StoreError::NotOwner { .. },
                                )) => continue,
                                Err(error) => return Err(error),
                            }
                        }
                        None => {
                            self.advance(record, LifeEvent::RuntimeLost, None).await?;
                        }
                    }
                    report.sandboxes_stopped += 1;
                }
                SandboxState::Created if live.contains(&record.id) => {
                    // The runtime started but the record never said so (a crash between).
                    if let Some(fence) = self.owner_fence(&record.id) {
                        self.advance(record, LifeEvent::Start, Some(&fence)).await?;
                    }
                }
                // A pause cut short by the restart: its runtime goes (what changed since the
                // latest snapshot with it, as when a snapshot fails at a reap), and the
                // sandbox is paused as asked.
                SandboxState::Pausing => match self.backend.destroy(&record.id).await {
                    Ok(()) => {
                        self.release_runtime(&record.id).await;
                        self.advance(record, LifeEvent::RuntimeLost, None).await?;
                        report.pauses_finished += 1;
                    }
                    Err(error) => {
                        tracing::error!(sandbox = %record.id, %error, "could not finish a pause");
                        report.cleanup_failures += 1;
                    }
                },
                SandboxState::Terminating => match self.backend.destroy(&record.id).await {
                    Ok(()) => {
                        self.release_runtime(&record.id).await;
                        self.advance(record, LifeEvent::Terminated, None).await?;
                        report.terminations_finished += 1;
                    }
                    Err(error) => {
                        // It stays behind its fence; a DELETE or the next start retries.
                        tracing::error!(sandbox = %record.id, %error, "could not finish a termination");
                        report.cleanup_failures += 1;
                    }
                },
                _ => {}
            }
        }
        // Scratch trees outlive their ephemeral sandbox only when a cleanup was cut short;
        // whatever no live ephemeral sandbox owns goes now (I14).
        let scratch_dir = self
            .layout()
            .workspace_dir()
            .join(warren_core::DataLayout::SCRATCH_RELATIVE);
        let entries = match std::fs::read_dir(&scratch_dir) {
            Ok(entries) => entries.filter_map(Result::ok).collect::<Vec<_>>(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => {
                tracing::error!(%error, "could not list the scratch directory");
                report.cleanup_failures += 1;
                Vec::new()
            }
        };
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let owned = warren_core::SandboxId::parse(&name)
                .ok()
                .and_then(|id| records.get(&id))
                .is_some_and(|record| {
                    record.binding.ephemeral
                        && !matches!(
                            record.state,
                            SandboxState::Terminating | SandboxState::Terminated
                        )
                });
            if owned {
                continue;
            }
            match self.remove_scratch_entry(name.clone()).await {
                Ok(()) => report.scratch_removed += 1,
                Err(error) => {
                    tracing::error!(entry = %name, %error, "could not remove a leftover scratch tree");
                    report.cleanup_failures += 1;
                }
            }
        }
        // Leftovers of work cut short by the crash: git checkouts of workspace
        // initialisation, and skill projections retired while a runtime still ran.
        if let Err(error) = std::fs::remove_dir_all(self.layout().data_dir().join("tmp")) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::error!(%error, "could not clear the scratch space of <data>/tmp");
                report.cleanup_failures += 1;
            }
        }
        if let Err(error) = self.reclaim_all_retired_projections().await {
            tracing::error!(%error, "could not reclaim retired skill projections");
            report.cleanup_failures += 1;
        }
        Ok(report)
    }
}
