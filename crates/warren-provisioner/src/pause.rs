//! Pause, resume, labels and deadlines: what a sandbox's owner may do to it beyond
//! running commands, for every wire alike.
//!
//! A pause is a runtime snapshot and the runtime's end, as a reap (I30): the processes
//! end, the files and installed packages are kept, memory is not; nothing runs until a
//! resume, whose next runtime starts from the snapshot. A deadline ends (or pauses) the
//! sandbox when it passes: each replica's deadline task looks for due sandboxes every
//! [`DEADLINE_TICK`], and the move it makes is a compare-and-set on the state it read, so
//! of two replicas seeing one due sandbox exactly one acts.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warren_core::SandboxId;
use warren_store::{DeadlineAction, SandboxRecord, SandboxSettings, SandboxState};

use crate::metrics::FailureCause;
use crate::transitions::LifeEvent;
use crate::{Provisioner, ProvisionerError};

/// Most labels one sandbox carries.
pub const MAX_LABELS: usize = 64;
/// Longest label key, in characters.
pub const MAX_LABEL_KEY_CHARS: usize = 128;
/// Longest label value, in characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 1024;
/// Longest timeout a deadline is set from (a year).
pub const MAX_SANDBOX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// How often each replica looks for sandboxes past their deadline: a sandbox outlives its
/// deadline by at most about this.
pub const DEADLINE_TICK: Duration = Duration::from_millis(500);
/// Most due sandboxes one look takes on; the rest wait for the next.
const DEADLINE_BATCH: u32 = 256;

/// A change of a sandbox's settings: what is `None` stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsChange {
    /// Replaces the labels, all of them.
    pub labels: Option<BTreeMap<String, String>>,
    /// `Some(Some(t))`: the deadline becomes now + `t`; `Some(None)`: no deadline.
    pub timeout: Option<Option<Duration>>,
    /// What the deadline does when it passes.
    pub on_deadline: Option<DeadlineAction>,
}

impl SettingsChange {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.timeout.is_none() && self.on_deadline.is_none()
    }

    /// `settings` with this change made, or why it may not be.
    pub fn apply_to(
        &self,
        mut settings: SandboxSettings,
    ) -> Result<SandboxSettings, ProvisionerError> {
        if let Some(labels) = &self.labels {
            check_labels(labels)?;
            settings.labels = labels.clone();
        }
        if let Some(timeout) = self.timeout {
            settings.deadline = match timeout {
                Some(timeout) if timeout > MAX_SANDBOX_TIMEOUT => {
                    return Err(ProvisionerError::BadRequest(
                        "timeout_s must be at most 31536000 (a year)",
                    ))
                }
                Some(timeout) => Some(deadline_after(timeout)),
                None => None,
            };
        }
        if let Some(action) = self.on_deadline {
            settings.on_deadline = action;
        }
        Ok(settings)
    }
}

/// `now + timeout`.
pub fn deadline_after(timeout: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::MAX)
}

/// Refuses labels beyond the bounds, or with keys no listing filter could name.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ProvisionerError> {
    if labels.len() > MAX_LABELS {
        return Err(ProvisionerError::BadRequest(
            "a sandbox carries at most 64 labels",
        ));
    }
    let control = |text: &str| text.chars().any(char::is_control);
    for (key, value) in labels {
        if key.is_empty()
            || key.chars().count() > MAX_LABEL_KEY_CHARS
            || value.chars().count() > MAX_LABEL_VALUE_CHARS
            || control(key)
            || control(value)
        {
            return Err(ProvisionerError::BadRequest(
                "a label key is 1 to 128 characters and a value at most 1024, neither with control characters",
            ));
        }
    }
    Ok(())
}

/// What a pause did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    /// The sandbox, paused.
    pub record: SandboxRecord,
    /// The runtime snapshot the next runtime starts from; `None` when no runtime ran,
    /// the backend takes none, or it failed (`snapshot_error` says why).
    pub snapshot: Option<String>,
    /// Why no snapshot was taken of a runtime that ran.
    pub snapshot_error: Option<String>,
    /// Whether a runtime ran and was ended (its processes with it).
    pub runtime_ended: bool,
}

impl Provisioner {
    /// Changes a sandbox's labels or deadline; refused once it is terminating or gone.
    pub async fn update_settings(
        &self,
        id: &SandboxId,
        change: SettingsChange,
    ) -> Result<SandboxRecord, ProvisionerError> {
        loop {
            let record = self.sandbox(id).await?;
            if matches!(
                record.state,
                SandboxState::Terminating | SandboxState::Terminated
            ) {
                return Err(ProvisionerError::SandboxTerminated {
                    sandbox: id.clone(),
                    state: record.state.as_str(),
                });
            }
            let settings = change.apply_to(record.settings.clone())?;
            if let Some(updated) = self
                .store
                .set_sandbox_settings(id, record.generation, &settings)
                .await?
            {
                return Ok(updated);
            }
        }
    }

    /// Pauses a sandbox: no run starts from now on; its processes end, its runtime is
    /// snapshotted and ended, wherever it runs. Refused when it is paused already.
    ///
    /// It takes no lifecycle lock: its first move is a compare-and-set, and a runtime
    /// that starts meanwhile cannot be marked running (its own move fails) and goes.
    pub async fn pause_sandbox(&self, id: &SandboxId) -> Result<Paused, ProvisionerError> {
        let (before, pausing) = self.advance_current(id, LifeEvent::Pause).await?;
        self.finish_pause(before, pausing).await
    }

    /// The rest of a pause once the sandbox is `pausing`; `before` is how it was.
    async fn finish_pause(
        &self,
        before: SandboxRecord,
        pausing: SandboxRecord,
    ) -> Result<Paused, ProvisionerError> {
        let id = &pausing.id;
        let mut paused = Paused {
            record: pausing.clone(),
            snapshot: None,
            snapshot_error: None,
            runtime_ended: false,
        };
        if before.state == SandboxState::Running {
            // Processes end first, so the snapshot sees the files at rest.
            if let Err(error) = self.kill_processes(id).await {
                tracing::warn!(sandbox = %id, %error, "could not end the processes of a runtime being paused; its end ends them");
            }
            match self.snapshot_runtime(id, "pause").await {
                Ok(snapshot) => paused.snapshot = Some(snapshot.id),
                Err(ProvisionerError::SnapshotUnsupported { .. }) => {}
                Err(error) => {
                    // As at a reap: the workspace is kept whatever happens (I15); what
                    // changed since the latest snapshot is not, and the answer says so.
                    self.metrics.failed(FailureCause::Snapshot);
                    tracing::warn!(sandbox = %id, %error, "could not snapshot a runtime being paused; pausing it anyway");
                    paused.snapshot_error = Some(error.public_message());
                }
            }
            self.end_runtime(id, Duration::ZERO).await?;
            paused.runtime_ended = true;
        }
        paused.record = match self.advance(&pausing, LifeEvent::Paused, None).await? {
            Some(record) => record,
            // Terminated meanwhile: that is what it is now.
            None => self.sandbox(id).await?,
        };
        tracing::info!(sandbox = %id, snapshot = ?paused.snapshot, "sandbox paused; workspace kept");
        Ok(paused)
    }

    /// Finishes a pause its pauser left behind (it died mid-pause): the runtime ends
    /// wherever it runs, without a new snapshot (the latest one stands), and the sandbox
    /// is paused. Nothing when another caller moved it first.
    pub(crate) async fn finish_stale_pause(
        &self,
        pausing: SandboxRecord,
    ) -> Result<(), ProvisionerError> {
        tracing::warn!(sandbox = %pausing.id, "finishing a pause left behind; what changed since the runtime's latest snapshot is lost");
        self.end_runtime(&pausing.id, Duration::ZERO).await?;
        self.advance(&pausing, LifeEvent::Paused, None).await?;
        Ok(())
    }

    /// Resumes a paused sandbox and starts its runtime from the pause's snapshot. Its
    /// settings change first by `change`; a deadline that passed while it slept goes
    /// unless `change` sets one (it would end the sandbox again at once).
    pub async fn resume_sandbox(
        &self,
        id: &SandboxId,
        mut change: SettingsChange,
    ) -> Result<SandboxRecord, ProvisionerError> {
        let record = self.sandbox(id).await?;
        // The table's answer, before anything changes.
        crate::transition(record.state, LifeEvent::Resume)
            .map_err(|refusal| refusal.into_error(id))?;
        let passed = record
            .settings
            .deadline
            .is_some_and(|deadline| deadline <= chrono::Utc::now());
        if change.timeout.is_none() && passed {
            change.timeout = Some(None);
        }
        if !change.is_empty() {
            self.update_settings(id, change).await?;
        }
        self.advance_current(id, LifeEvent::Resume).await?;
        tracing::info!(sandbox = %id, "sandbox resumed");
        match self.start_runtime(id).await {
            Ok(record) => Ok(record),
            // A backend that runs no commands has no runtime to start.
            Err(ProvisionerError::ExecUnsupported { .. }) => self.sandbox(id).await,
            Err(error) => Err(error),
        }
    }

    /// Starts this replica's deadline task: every [`DEADLINE_TICK`] it takes on the
    /// sandboxes past their deadline, each in a task of its own (at most
    /// `reap_concurrency` at once with the reaper's), so one slow snapshot never holds up
    /// another sandbox's end. Stops once the provisioner shuts down.
    pub fn spawn_deadlines(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let provisioner = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(DEADLINE_TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if provisioner.is_shutting_down() {
                    return;
                }
                if let Err(error) = provisioner.fire_deadlines().await {
                    tracing::warn!(%error, "could not look for sandboxes past their deadline; trying again");
                }
            }
        })
    }

    /// Starts the end of every sandbox past its deadline that no task here works on
    /// yet; returns the sandboxes it started on.
    pub async fn fire_deadlines(self: &Arc<Self>) -> Result<Vec<SandboxId>, ProvisionerError> {
        let due = self
            .store
            .sandboxes_due(chrono::Utc::now(), DEADLINE_BATCH)
            .await?;
        let mut started = Vec::new();
        for record in due {
            let Some(claim) = DeadlineClaim::take(&self.firing, &record.id) else {
                continue;
            };
            started.push(record.id.clone());
            let provisioner = Arc::clone(self);
            tokio::spawn(async move {
                let _claim = claim;
                let id = record.id.clone();
                let Ok(_slot) = provisioner.reap_slots.acquire().await else {
                    return;
                };
                if let Err(error) = provisioner.fire_deadline(record).await {
                    tracing::warn!(sandbox = %id, %error, "could not end a sandbox past its deadline");
                }
            });
        }
        Ok(started)
    }

    /// Ends or pauses one sandbox read past its deadline, if no one moved it since:
    /// the first move is a compare-and-set on the state read, so it happens once.
    async fn fire_deadline(&self, record: SandboxRecord) -> Result<(), ProvisionerError> {
        let id = record.id.clone();
        let action = record.settings.on_deadline;
        match action {
            DeadlineAction::Terminate => {
                // As every termination: under this node's lifecycle lock.
                let lock = self.lifecycle_lock(&id);
                let _guard = lock.lock().await;
                let Some(fenced) = self.advance(&record, LifeEvent::Terminate, None).await? else {
                    // Another request or replica moved it first: it is handled there.
                    return Ok(());
                };
                self.deadline_fired(&id, action);
                self.finish_termination(fenced, Duration::ZERO).await?;
            }
            DeadlineAction::Pause => {
                let Some(pausing) = self.advance(&record, LifeEvent::Pause, None).await? else {
                    return Ok(());
                };
                self.deadline_fired(&id, action);
                self.finish_pause(record, pausing).await?;
            }
        }
        Ok(())
    }

    fn deadline_fired(&self, id: &SandboxId, action: DeadlineAction) {
        self.metrics.deadline_fired(action);
        tracing::info!(sandbox = %id, action = action.as_str(), "a sandbox's deadline passed");
    }
}

/// A sandbox this replica's deadline task works on; forgotten when dropped.
struct DeadlineClaim {
    firing: Arc<Mutex<HashSet<SandboxId>>>,
    sandbox: SandboxId,
}

impl DeadlineClaim {
    fn take(firing: &Arc<Mutex<HashSet<SandboxId>>>, id: &SandboxId) -> Option<Self> {
        let mut set = firing.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(id.clone()).then(|| Self {
            firing: Arc::clone(firing),
            sandbox: id.clone(),
        })
    }
}

impl Drop for DeadlineClaim {
    fn drop(&mut self) {
        self.firing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.sandbox);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn provisioner() -> (Arc<Provisioner>, SandboxRecord, crate::testing::Fixture) {
        let fixture = crate::testing::Fixture::builder()
            // A resumed sandbox stays stopped: there is no runtime to start.
            .backend(crate::testing::ScriptedBackend::new().without_exec())
            .configure(|config| {
                // A pause is stale at once: see the test of a pause left behind.
                config.stale_pause_after = Duration::ZERO;
                config.reap_deadline = Duration::ZERO;
            })
            .build()
            .await;
        let record = fixture.sandbox("alice", "t", "projects/a").await;
        (fixture.provisioner.clone(), record, fixture)
    }

    #[tokio::test]
    async fn a_pause_cut_short_by_a_restart_is_finished_by_recovery() {
        let (provisioner, record, _fixture) = provisioner().await;
        provisioner
            .store
            .set_sandbox_state(&record.id, 1, SandboxState::Created, SandboxState::Pausing)
            .await
            .unwrap()
            .unwrap();
        let report = provisioner.recover().await.unwrap();
        assert_eq!(report.pauses_finished, 1);
        let after = provisioner.sandbox(&record.id).await.unwrap();
        assert_eq!(after.state, SandboxState::Paused);
        // And it resumes.
        let resumed = provisioner
            .resume_sandbox(&record.id, SettingsChange::default())
            .await
            .unwrap();
        assert_eq!(resumed.state, SandboxState::Stopped);
    }

    #[tokio::test]
    async fn the_reaper_finishes_a_pause_its_pauser_left_behind() {
        let (provisioner, record, _fixture) = provisioner().await;
        // A node ends runtimes only once it joined the cluster (a lone one too).
        provisioner.join_cluster().await.unwrap();
        provisioner
            .store
            .set_sandbox_state(&record.id, 1, SandboxState::Created, SandboxState::Pausing)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        provisioner.reap().await.unwrap();
        assert_eq!(
            provisioner.sandbox(&record.id).await.unwrap().state,
            SandboxState::Paused
        );
    }

    #[tokio::test]
    async fn a_deadline_fires_once_for_every_caller_that_sees_it_due() {
        let (provisioner, record, _fixture) = provisioner().await;
        let change = SettingsChange {
            timeout: Some(Some(Duration::from_millis(1))),
            on_deadline: Some(DeadlineAction::Pause),
            ..SettingsChange::default()
        };
        provisioner
            .update_settings(&record.id, change)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let due = provisioner
            .store
            .sandboxes_due(chrono::Utc::now(), 10)
            .await
            .unwrap();
        assert_eq!(due.len(), 1);
        // Two callers (two replicas' tasks) with the same view: one moves it.
        let (a, b) = tokio::join!(
            provisioner.fire_deadline(due[0].clone()),
            provisioner.fire_deadline(due[0].clone())
        );
        a.unwrap();
        b.unwrap();
        let after = provisioner.sandbox(&record.id).await.unwrap();
        assert_eq!(after.state, SandboxState::Paused);
        let metrics = provisioner.render_metrics().await.unwrap();
        assert!(
            metrics.contains("warren_deadlines_total{action=\"pause\"} 1\n"),
            "{metrics}"
        );
        assert!(provisioner
            .store
            .sandboxes_due(chrono::Utc::now(), 10)
            .await
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_change_replaces_what_it_names_and_keeps_the_rest() {
        let before = SandboxSettings {
            labels: [("a".to_owned(), "1".to_owned())].into(),
            deadline: None,
            on_deadline: DeadlineAction::Pause,
        };
        let change = SettingsChange {
            timeout: Some(Some(Duration::from_secs(60))),
            ..SettingsChange::default()
        };
        let after = change.apply_to(before.clone()).unwrap();
        assert_eq!(
            (&after.labels, after.on_deadline),
            (&before.labels, DeadlineAction::Pause)
        );
        let left = after.deadline.unwrap() - chrono::Utc::now();
        assert!(left > chrono::Duration::seconds(55) && left <= chrono::Duration::seconds(60));
        let cleared = SettingsChange {
            timeout: Some(None),
            labels: Some(BTreeMap::new()),
            ..SettingsChange::default()
        };
        assert_eq!(
            cleared.apply_to(after).unwrap(),
            SandboxSettings {
                on_deadline: DeadlineAction::Pause,
                ..SandboxSettings::default()
            }
        );
        assert!(SettingsChange::default().is_empty());
    }

    #[test]
    fn labels_beyond_the_bounds_or_unnameable_are_refused() {
        let many: BTreeMap<String, String> = (0..=MAX_LABELS)
            .map(|n| (n.to_string(), String::new()))
            .collect();
        assert!(check_labels(&many).is_err());
        let big = [("k".to_owned(), "v".repeat(MAX_LABEL_VALUE_CHARS + 1))].into();
        assert!(check_labels(&big).is_err());
        let long_key = [("k".repeat(MAX_LABEL_KEY_CHARS + 1), String::new())].into();
        assert!(check_labels(&long_key).is_err());
        let widest = [(
            "é".repeat(MAX_LABEL_KEY_CHARS),
            "é".repeat(MAX_LABEL_VALUE_CHARS),
        )]
        .into();
        assert!(check_labels(&widest).is_ok());
        assert!(check_labels(&[(String::new(), "v".to_owned())].into()).is_err());
        assert!(check_labels(&[("k".to_owned(), "a\nb".to_owned())].into()).is_err());
        assert!(check_labels(&[("team a=b".to_owned(), "x&y".to_owned())].into()).is_ok());
        let too_long = SettingsChange {
            timeout: Some(Some(MAX_SANDBOX_TIMEOUT + Duration::from_secs(1))),
            ..SettingsChange::default()
        };
        assert!(too_long.apply_to(SandboxSettings::default()).is_err());
    }
}
