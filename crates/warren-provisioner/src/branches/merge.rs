//! The merger (I27): branches of a workdir merged back into it, three-way per file, all
//! or nothing, by the holder of the target sandbox's execution guard (I33).
//!
//! The target is what the sandbox the merge is asked of writes, as its guard's holder sees
//! it: its workdir, or the branch of it it is bound to. Every branch merged must be a
//! branch of that workdir made from it as it was: its baseline is the workdir itself,
//! read-only while the branches exist. Into the workdir, base and target are one tree
//! until the merge changes it, so every unmerged branch goes at once and a merged branch
//! is never merged again; into a branch, the workdir stays as it was. A checkpoint of the
//! target is taken before anything changes: restoring it (or, for a branch, making a
//! branch from it) undoes the merge. The change
//! itself is `warren-merge`'s: staged beside the target, committed by a journal, so a
//! crash (`kill -9` included) leaves the target as it was or fully merged once
//! [`Provisioner::recover_merges`] ran at the next start.

use std::path::PathBuf;

use warren_core::{BranchName, SandboxId};
use warren_fs::WorkspaceRoot;

use super::BranchTrees;
use crate::guard::FencePermit;
use crate::{Provisioner, ProvisionerError};

/// What a merge is asked to do.
#[derive(Debug, Clone)]
pub struct MergeRequest {
    /// Branches of the sandbox's workdir, merged in this order.
    pub branches: Vec<BranchName>,
    /// Plan only: list what would change and what conflicts.
    pub dry_run: bool,
}

/// What a merge did, or would do.
#[derive(Debug, Clone)]
pub struct MergeOutcome {
    /// Whether the target was changed.
    pub applied: bool,
    /// The checkpoint of the target taken before it changed.
    pub checkpoint: Option<String>,
    /// The steps, in order.
    pub steps: Vec<warren_merge::Step>,
    /// What cannot be combined (only a dry run answers with any).
    pub conflicts: Vec<warren_merge::Conflict>,
}

/// Where the journals of unfinished merges of every uid are kept: the journal's target key
/// names the uid and workdir, so recovery reopens the target from it alone.
const JOURNALS: &str = "merge-journals";

/// Where a merge under way names its target before it stages anything, so a crash before
/// its commit leaves a way to find (and discard) what it staged.
const PENDING: &str = "merge-pending";

impl Provisioner {
    fn merge_journals(&self) -> PathBuf {
        self.layout()
            .workspace_dir()
            .join(super::BRANCHES_DIR)
            .join(JOURNALS)
    }

    fn merges_pending(&self) -> PathBuf {
        self.layout()
            .workspace_dir()
            .join(super::BRANCHES_DIR)
            .join(PENDING)
    }

    /// Merges `request.branches` into what the sandbox writes: its workdir, or the branch of
    /// it it is bound to. Refused without the guard (`permit` must be fenced, except for a
    /// dry run), while commands run in the sandbox, and, listing every conflict with its
    /// three versions, when anything cannot be combined: then nothing is applied.
    pub async fn merge_branches(
        &self,
        id: &SandboxId,
        request: MergeRequest,
        permit: &FencePermit,
    ) -> Result<MergeOutcome, ProvisionerError> {
        self.refuse_unsupported()?;
        let record = self.sandbox(id).await?;
        if !request.dry_run && !permit.is_fenced() {
            return Err(ProvisionerError::BadRequest(
                "a merge is made by the holder of the target sandbox's execution guard: \
                 acquire it (POST /v1/sandboxes/{id}/guard) and send its token as X-Warren-Fence",
            ));
        }
        // Into a branch: its view is the target, the workdir stays the baseline.
        let into = match &record.binding.branch {
            Some(name) => {
                let branch = self
                    .branch(&record.uid, &record.binding.workdir, name)
                    .await?;
                if branch.checkpoint.is_some() {
                    return Err(ProvisionerError::BadRequest(
                        "a branch made from a checkpoint has another baseline than the \
                         branches of the workdir: merge into the workdir or a branch made of it",
                    ));
                }
                if request.branches.contains(name) {
                    return Err(ProvisionerError::BadRequest(
                        "a branch is not merged into itself",
                    ));
                }
                Some(branch)
            }
            None => None,
        };
        if record.binding.ephemeral {
            return Err(ProvisionerError::BadRequest(
                "an ephemeral sandbox's workdir has no branches",
            ));
        }
        if request.branches.is_empty() || request.branches.len() > 64 {
            return Err(ProvisionerError::BadRequest(
                "branches must name 1 to 64 branches of the sandbox's workdir",
            ));
        }
        let mut trees = Vec::new();
        for name in &request.branches {
            if trees
                .iter()
                .any(|(n, _): &(BranchName, BranchTrees)| n == name)
            {
                return Err(ProvisionerError::BadRequest("a branch is named twice"));
            }
            let branch = self
                .branch(&record.uid, &record.binding.workdir, name)
                .await?;
            if branch.checkpoint.is_some() {
                return Err(ProvisionerError::BadRequest(
                    "a branch made from a checkpoint has another baseline than the workdir: \
                     merge only branches made from the workdir itself",
                ));
            }
            if branch.merged_at.is_some() {
                return Err(ProvisionerError::BranchMerged {
                    name: name.to_string(),
                });
            }
            trees.push((name.clone(), self.branch_trees(&branch).await?));
        }
        // Into the workdir itself: it is the common baseline of every branch made of it.
        if into.is_none() {
            self.refuse_baseline_change(&record, &request.branches)
                .await?;
        }
        // Under the lifecycle lock no runtime starts or ends meanwhile.
        let lock = self.lifecycle_lock(id);
        let _lifecycle = lock.lock().await;
        let running = self.inflight(id);
        if running > 0 {
            return Err(ProvisionerError::SandboxBusy {
                sandbox: id.clone(),
                commands: running,
            });
        }
        let workspace = self.layout().user_workspace(&record.uid.safe());
        let workdir = record.binding.workdir.clone();
        let target_view = match &into {
            Some(branch) => Some(self.branch_tree(branch).await?),
            None => None,
        };
        let planning = (workspace.clone(), workdir.clone(), target_view.clone());
        let plan = self
            .blocking(move || {
                let (workspace, workdir, target_view) = planning;
                let base = open_workdir(&workspace, workdir.as_str())?;
                let target = match &target_view {
                    Some(view) => WorkspaceRoot::open(view).map_err(super::branch_file_error)?,
                    None => open_workdir(&workspace, workdir.as_str())?,
                };
                let mut opened = Vec::new();
                for (name, trees) in &trees {
                    let (base, upper, merged) = trees.open()?;
                    let changes = warren_merge::branch_changes(&base, &upper, &merged)
                        .map_err(ProvisionerError::Merge)?;
                    opened.push((name.to_string(), merged, changes));
                }
                let inputs: Vec<warren_merge::BranchInput<'_>> = opened
                    .iter()
                    .map(|(name, merged, changes)| warren_merge::BranchInput {
                        name: name.clone(),
                        tree: merged,
                        changes: changes.clone(),
                    })
                    .collect();
                warren_merge::plan(&base, &target, &inputs).map_err(ProvisionerError::Merge)
            })
            .await?;
        let steps = plan.steps.clone();
        let conflicts = plan.conflicts.clone();
        if request.dry_run {
            return Ok(MergeOutcome {
                applied: false,
                checkpoint: None,
                steps,
                conflicts,
            });
        }
        if !conflicts.is_empty() {
            return Err(ProvisionerError::MergeConflict { conflicts });
        }
        if steps.is_empty() {
            // Nothing to bring back: the branches changed nothing the target lacks.
            return Ok(MergeOutcome {
                applied: false,
                checkpoint: None,
                steps,
                conflicts,
            });
        }
        let (checkpoint, _) = self.create_checkpoint(id).await?;
        let journals = self.merge_journals();
        let pending = self.merges_pending();
        let key = target_key(
            &record.uid,
            workdir.as_str(),
            into.as_ref().map(|branch| branch.name.as_str()),
        );
        let merge_id = format!("merge-{}", uuid::Uuid::new_v4().simple());
        self.blocking(move || {
            let failed = |source: std::io::Error| ProvisionerError::BranchesUnsupported {
                reason: format!("the merge's journal could not be written: {source}"),
            };
            std::fs::create_dir_all(&journals).map_err(failed)?;
            std::fs::create_dir_all(&pending).map_err(failed)?;
            // Named before anything is staged, gone once the apply returned: a crash in
            // between leaves it for recovery to find the staging by.
            let marker = pending.join(&merge_id);
            std::fs::write(&marker, &key).map_err(failed)?;
            std::fs::File::open(&pending)
                .and_then(|dir| dir.sync_all())
                .map_err(failed)?;
            let target = match &target_view {
                Some(view) => WorkspaceRoot::open(view).map_err(super::branch_file_error)?,
                None => open_workdir(&workspace, workdir.as_str())?,
            };
            let applied = warren_merge::apply(&target, &plan, &journals, &merge_id, &key)
                .map_err(ProvisionerError::Merge);
            let _ = std::fs::remove_file(&marker);
            applied
        })
        .await?;
        // Into the workdir, their baseline changed: they are never merged again. Into a
        // branch, the workdir did not change, and they may still go elsewhere.
        if into.is_none() {
            for name in &request.branches {
                self.store
                    .mark_branch_merged(&record.uid, &record.binding.workdir, name)
                    .await?;
            }
        }
        tracing::info!(sandbox = %id, checkpoint = %checkpoint.id, steps = steps.len(), "branches merged");
        Ok(MergeOutcome {
            applied: true,
            checkpoint: Some(checkpoint.id),
            steps,
            conflicts,
        })
    }

    /// Finishes or undoes the merges a crash interrupted: a journal that was committed is
    /// rolled forward; a merge that never committed has its staging removed. Run at
    /// start-up, before serving.
    pub async fn recover_merges(&self) -> Result<usize, ProvisionerError> {
        let journals = self.merge_journals();
        let pending = self.merges_pending();
        let layout = self.layout().clone();
        // A merge into a branch names it: its view is mounted first (after a reboot it is
        // not), by the marker every merge under way left.
        let mut views = std::collections::HashMap::new();
        for marker in std::fs::read_dir(&pending).into_iter().flatten().flatten() {
            let key = std::fs::read_to_string(marker.path()).unwrap_or_default();
            if let Some((uid, workdir, Some(name))) = parse_target_key(&key) {
                match self.branch(&uid, &workdir, &name).await {
                    Ok(branch) => {
                        views.insert(key, self.branch_tree(&branch).await?);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "an interrupted merge's target branch is gone")
                    }
                }
            }
        }
        self.blocking(move || {
            let open = |key: &str| -> Result<WorkspaceRoot, warren_merge::MergeError> {
                let (uid, workdir, branch) = parse_target_key(key).ok_or_else(|| {
                    warren_merge::MergeError::JournalCorrupt {
                        id: "?".to_owned(),
                        reason: "its target is not one warren writes".to_owned(),
                    }
                })?;
                let opened = match (branch, views.get(key)) {
                    (None, _) => WorkspaceRoot::open(&layout.user_workspace(&uid.safe()))
                        .and_then(|root| root.subroot(workdir.as_str())),
                    (Some(_), Some(view)) => WorkspaceRoot::open(view),
                    (Some(name), None) => Err(warren_fs::FsError::NotFound {
                        path: format!("branch {name}"),
                    }),
                };
                opened.map_err(|source| warren_merge::MergeError::Read {
                    tree: "target",
                    source,
                })
            };
            let mut recovered = 0;
            if journals.exists() {
                recovered += warren_merge::recover(&journals, open)
                    .map_err(ProvisionerError::Merge)?
                    .len();
            }
            // Merges that named their target and never committed (or committed and were
            // rolled forward just now): whatever staging is left of them goes.
            let markers = match std::fs::read_dir(&pending) {
                Ok(markers) => markers.flatten().collect::<Vec<_>>(),
                Err(_) => Vec::new(),
            };
            for marker in markers {
                let key = std::fs::read_to_string(marker.path()).unwrap_or_default();
                match open(&key) {
                    Ok(target) => {
                        recovered +=
                            warren_merge::discard_staging(&target).map_err(ProvisionerError::Merge)?;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "an interrupted merge's target is gone; nothing to discard")
                    }
                }
                let _ = std::fs::remove_file(marker.path());
            }
            Ok(recovered)
        })
        .await
    }
}

impl Provisioner {
    /// Refuses a merge into `record`'s workdir that would change the baseline of a branch
    /// it does not take: changed under a branch left out, that branch's own merge would
    /// later compare against the merged tree and undo what this one brings. So every
    /// unmerged branch of the workdir goes at once, and no workdir holding it or inside it
    /// may have unmerged branches.
    async fn refuse_baseline_change(
        &self,
        record: &warren_store::SandboxRecord,
        merging: &[BranchName],
    ) -> Result<(), ProvisionerError> {
        let request_branches = merging;
        // The workdir is the common baseline of every branch made of it: changed under a
        // branch left out, that branch's own merge would later compare against the wrong
        // baseline and undo what this one brings. All of them go at once.
        let left_out: Vec<String> = self
            .store
            .list_branches(&record.uid, Some(&record.binding.workdir))
            .await?
            .into_iter()
            .filter(|branch| {
                branch.checkpoint.is_none()
                    && branch.merged_at.is_none()
                    && !request_branches.contains(&branch.name)
            })
            .map(|branch| branch.name.to_string())
            .collect();
        if !left_out.is_empty() {
            return Err(ProvisionerError::MergeIncomplete {
                workdir: record.binding.workdir.to_string(),
                left_out: left_out.join(", "),
            });
        }
        // Nor may it change the baseline of a workdir it holds or lies in.
        if let Some(other) = self
            .store
            .list_branches(&record.uid, None)
            .await?
            .into_iter()
            .find(|branch| {
                branch.checkpoint.is_none()
                    && branch.merged_at.is_none()
                    && branch.workdir != record.binding.workdir
                    && branch.workdir.overlaps(&record.binding.workdir)
            })
        {
            return Err(ProvisionerError::MergeIncomplete {
                workdir: other.workdir.to_string(),
                left_out: other.name.to_string(),
            });
        }
        Ok(())
    }
}

fn open_workdir(
    workspace: &std::path::Path,
    workdir: &str,
) -> Result<WorkspaceRoot, ProvisionerError> {
    WorkspaceRoot::open(workspace)
        .and_then(|root| root.subroot(workdir))
        .map_err(|source| crate::sandboxes::workdir_error(workdir, source))
}

/// The journal's name of a merge target: the uid, the workdir and the branch of it (if the
/// target is one), as JSON.
fn target_key(uid: &warren_core::Uid, workdir: &str, branch: Option<&str>) -> String {
    serde_json::json!({ "uid": uid.as_str(), "workdir": workdir, "branch": branch }).to_string()
}

fn parse_target_key(
    key: &str,
) -> Option<(warren_core::Uid, warren_core::Workdir, Option<BranchName>)> {
    let value: serde_json::Value = serde_json::from_str(key).ok()?;
    let uid = warren_core::Uid::new(value.get("uid")?.as_str()?).ok()?;
    let workdir = warren_core::Workdir::new(value.get("workdir")?.as_str()?).ok()?;
    let branch = match value.get("branch") {
        None | Some(serde_json::Value::Null) => None,
        Some(name) => Some(BranchName::new(name.as_str()?).ok()?),
    };
    Some((uid, workdir, branch))
}
