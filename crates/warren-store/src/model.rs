//! The records the state store keeps, and the inputs that create them.
//!
//! These types are the store's vocabulary, independent of any database: a PostgreSQL store
//! returns exactly the same values as the SQLite one.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use warren_core::{BackendKind, Binding, BindingPart, RuntimeScope, SandboxId, Uid, Workdir};

/// A workdir created for a uid.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkdirRecord {
    /// The owner.
    pub uid: Uid,
    /// The workdir, relative to the owner's workspace.
    pub workdir: Workdir,
    /// When it was first recorded.
    pub created_at: DateTime<Utc>,
}

/// A branch of a workdir (I27): a writable view over a read-only baseline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BranchRecord {
    /// The owner.
    pub uid: Uid,
    /// The workdir it is a branch of.
    pub workdir: Workdir,
    /// Its name, unique among the workdir's branches.
    pub name: warren_core::BranchName,
    /// The name of its storage in the data directory (`br-<hex>`).
    pub id: String,
    /// The checkpoint it was made from; `None` when made from the workdir as it was.
    pub checkpoint: Option<String>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When a merge brought it into its workdir; it is never merged again.
    pub merged_at: Option<DateTime<Utc>>,
}

/// What a caller asks for when it claims the sandbox of a (uid, runtime scope).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NewSandbox {
    /// Must be `SandboxId::derive(&uid, &runtime_scope)`.
    pub id: SandboxId,
    /// The owner.
    pub uid: Uid,
    /// The runtime scope the sandbox serves.
    pub runtime_scope: RuntimeScope,
    /// What the new generation is bound to (I5, I16): a claim joins a live generation
    /// only with an equal binding.
    pub binding: Binding,
    /// A runtime snapshot the new generation starts from (I30); not part of the binding,
    /// and ignored when the claim joins a live generation.
    pub seed_snapshot: Option<String>,
    /// Labels and deadline of a new generation; not part of the binding, and ignored when
    /// the claim joins a live generation.
    pub settings: SandboxSettings,
}

impl NewSandbox {
    /// A claim for the sandbox of `(uid, runtime_scope)`, with the id derived from both.
    pub fn new(
        uid: Uid,
        runtime_scope: RuntimeScope,
        workdir: Workdir,
        backend: BackendKind,
    ) -> Self {
        Self {
            id: SandboxId::derive(&uid, &runtime_scope),
            uid,
            runtime_scope,
            binding: Binding::new(workdir, backend),
            seed_snapshot: None,
            settings: SandboxSettings::default(),
        }
    }
}

/// What a sandbox's owner may change at any time, unlike its binding: its labels and its
/// deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SandboxSettings {
    /// The caller's labels, filtered on by listings.
    pub labels: std::collections::BTreeMap<String, String>,
    /// When the sandbox's deadline passes, if it has one.
    pub deadline: Option<DateTime<Utc>>,
    /// What happens to it then.
    pub on_deadline: DeadlineAction,
}

/// What happens to a sandbox whose deadline passed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineAction {
    /// It is terminated: runtime gone, workspace kept (I15).
    #[default]
    Terminate,
    /// It is paused: a runtime snapshot, then the runtime goes; a resume starts from it.
    Pause,
}

impl DeadlineAction {
    /// Every action.
    pub const ALL: [Self; 2] = [Self::Terminate, Self::Pause];

    /// The snake_case name, as stored and serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminate => "terminate",
            Self::Pause => "pause",
        }
    }
}

impl FromStr for DeadlineAction {
    type Err = ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|action| action.as_str() == s)
            .ok_or_else(|| ParseEnumError::new("deadline action", s))
    }
}

/// The result of [`StateStore::claim_sandbox`](crate::StateStore::claim_sandbox).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
pub enum SandboxClaim {
    /// This caller recorded a new generation of the sandbox.
    Created(SandboxRecord),
    /// A live generation with an equal binding exists; the caller joins it.
    Existing(SandboxRecord),
    /// A live generation is bound otherwise, and a live runtime's binding never changes
    /// (I5, I16): `part` names the first difference.
    Conflict {
        /// Where the bindings differ first.
        part: BindingPart,
        /// The live generation.
        sandbox: SandboxRecord,
    },
}

impl SandboxClaim {
    /// The answer to a claim of `new` that found the live (not terminated) `record`: it
    /// joins the runtime when the binding is equal, and names the first difference
    /// otherwise.
    pub(crate) fn join_or_conflict(record: SandboxRecord, new: &NewSandbox) -> Self {
        match record.binding.difference(&new.binding) {
            None => Self::Existing(record),
            Some(part) => Self::Conflict {
                part,
                sandbox: record,
            },
        }
    }

    /// The sandbox record, whichever way the claim went.
    pub fn record(&self) -> &SandboxRecord {
        match self {
            Self::Created(record) | Self::Existing(record) => record,
            Self::Conflict { sandbox, .. } => sandbox,
        }
    }

    /// The sandbox record, whichever way the claim went.
    pub fn into_record(self) -> SandboxRecord {
        match self {
            Self::Created(record) | Self::Existing(record) => record,
            Self::Conflict { sandbox, .. } => sandbox,
        }
    }
}

/// The stored state of the sandbox of one (uid, runtime scope).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SandboxRecord {
    /// Derived from `uid` and `runtime_scope` (I5).
    pub id: SandboxId,
    /// The owner.
    pub uid: Uid,
    /// The runtime scope the sandbox serves.
    pub runtime_scope: RuntimeScope,
    /// What the current generation is bound to (I5, I16).
    #[serde(flatten)]
    pub binding: Binding,
    /// The runtime snapshot the current generation was created from, if any.
    pub seed_snapshot: Option<String>,
    /// The current generation's labels and deadline.
    #[serde(flatten)]
    pub settings: SandboxSettings,
    /// Where the current generation is in its life.
    pub state: SandboxState,
    /// Starts at 1 and grows by one each time a terminated sandbox is claimed again; a
    /// caller holding an older generation can no longer change the sandbox.
    pub generation: i64,
    /// When the current generation was claimed.
    pub created_at: DateTime<Utc>,
    /// When the sandbox was last used: set when a generation is created and by
    /// [`StateStore::touch_sandbox`](crate::StateStore::touch_sandbox).
    pub last_active_at: DateTime<Utc>,
    /// When the binding or state last changed.
    pub updated_at: DateTime<Utc>,
}

/// Where a sandbox generation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// The record exists but no runtime was started: runtimes are lazy (I12).
    Created,
    /// A runtime exists.
    Running,
    /// The runtime was reaped; its files are kept. The next run starts a runtime again.
    Stopped,
    /// A pause is under way: no run starts while the runtime is snapshotted and ended.
    Pausing,
    /// Paused: its runtime was snapshotted and ended; no run starts until it is resumed,
    /// and a resumed sandbox's next runtime starts from that snapshot.
    Paused,
    /// The cleanup fence is up: no new run may start while the runtime is torn down.
    Terminating,
    /// The runtime was destroyed; the workspace is kept (I15). The next claim starts a new
    /// generation.
    Terminated,
}

impl SandboxState {
    /// Every state, in life order.
    pub const ALL: [Self; 7] = [
        Self::Created,
        Self::Running,
        Self::Stopped,
        Self::Pausing,
        Self::Paused,
        Self::Terminating,
        Self::Terminated,
    ];

    /// The snake_case name, as stored and serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Pausing => "pausing",
            Self::Paused => "paused",
            Self::Terminating => "terminating",
            Self::Terminated => "terminated",
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxState {
    type Err = ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseEnumError::new("sandbox state", s))
    }
}

/// A name that is not one of the values of a state store enumeration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct ParseEnumError {
    /// Which enumeration, e.g. "sandbox state".
    pub kind: &'static str,
    /// The refused name.
    pub value: String,
}

impl ParseEnumError {
    pub(crate) fn new(kind: &'static str, value: &str) -> Self {
        // Stored values are short; anything long is garbage and need not be echoed whole.
        let value = value.chars().take(64).collect();
        Self { kind, value }
    }
}

/// What a caller records when a run starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NewRun {
    /// Generated by the caller (a UUID), so it can be logged before the store answers.
    pub id: String,
    /// The sandbox the run executes in.
    pub sandbox_id: SandboxId,
    /// The sandbox generation the run executes in.
    pub generation: i64,
    /// The command line, or a JSON argv, as text.
    pub command: String,
    /// The working directory as a virtual path (never a host path, I1).
    pub cwd: String,
    /// Who asked for the run.
    pub requested_by: String,
    /// What kind of run it is.
    pub kind: RunKind,
    /// The caller's own label for the run, if it gave one.
    pub tag: Option<String>,
    /// Whether the command runs on a terminal.
    pub pty: bool,
    /// The node executing it and the ownership it holds: the run is refused with
    /// [`StoreError::NotOwner`](crate::StoreError::NotOwner) once another node took the
    /// runtime over. `None`: unfenced, and no node recorded.
    pub owner: Option<crate::OwnerFence>,
}

/// How a run ended, as recorded by [`StateStore::finish_run`](crate::StateStore::finish_run).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunOutcome {
    /// The exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the process, when it was killed.
    pub signal: Option<i32>,
    /// Whether warren killed it for running too long.
    pub timed_out: bool,
    /// Wall-clock run time.
    pub duration_ms: i64,
    /// User CPU time, when measured.
    pub cpu_user_ms: Option<i64>,
    /// System CPU time, when measured.
    pub cpu_system_ms: Option<i64>,
    /// Peak resident memory, when measured.
    pub peak_memory_bytes: Option<i64>,
    /// Why warren could not run the command to completion; `Some` makes the run
    /// [`RunStatus::Failed`]. A command that ran and exited non-zero is not a failure.
    pub failure: Option<String>,
}

/// What kind of run a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// A command the caller waits for (`exec`); every run recorded before kinds existed.
    Exec,
    /// A long-running process the caller starts and comes back to.
    Process,
    /// One execution of code in a code context's kernel (its tag is the context's id).
    Code,
}

impl RunKind {
    /// Every kind.
    pub const ALL: [Self; 3] = [Self::Exec, Self::Process, Self::Code];

    /// The snake_case name, as stored and serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Process => "process",
            Self::Code => "code",
        }
    }
}

impl fmt::Display for RunKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunKind {
    type Err = ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| ParseEnumError::new("run kind", s))
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Started and not yet finished.
    Running,
    /// The command ran to an end (any exit code, signal or timeout).
    Finished,
    /// warren could not run the command to completion; see `failure_reason`.
    Failed,
}

impl RunStatus {
    /// Every status, in life order.
    pub const ALL: [Self; 3] = [Self::Running, Self::Finished, Self::Failed];

    /// The snake_case name, as stored and serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| ParseEnumError::new("run status", s))
    }
}

/// The stored record of one run (I22).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunRecord {
    /// The caller-generated id.
    pub id: String,
    /// The sandbox the run executed in.
    pub sandbox_id: SandboxId,
    /// The sandbox generation the run executed in.
    pub generation: i64,
    /// The command line, or a JSON argv, as text.
    pub command: String,
    /// The working directory as a virtual path.
    pub cwd: String,
    /// Who asked for the run.
    pub requested_by: String,
    /// What kind of run it is.
    pub kind: RunKind,
    /// The caller's own label for the run, if it gave one.
    pub tag: Option<String>,
    /// Whether the command ran on a terminal.
    pub pty: bool,
    /// Where the run is in its life.
    pub status: RunStatus,
    /// When the run was recorded as started.
    pub started_at: DateTime<Utc>,
    /// When the run was recorded as finished or failed.
    pub finished_at: Option<DateTime<Utc>>,
    /// The exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the process, when it was killed.
    pub signal: Option<i32>,
    /// Whether warren killed it for running too long.
    pub timed_out: bool,
    /// Wall-clock run time, once finished.
    pub duration_ms: Option<i64>,
    /// User CPU time, when measured.
    pub cpu_user_ms: Option<i64>,
    /// System CPU time, when measured.
    pub cpu_system_ms: Option<i64>,
    /// Peak resident memory, when measured.
    pub peak_memory_bytes: Option<i64>,
    /// Why the run failed, when it did.
    pub failure_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_states_round_trip_through_their_snake_case_names() {
        for state in SandboxState::ALL {
            assert_eq!(state.as_str().parse::<SandboxState>(), Ok(state));
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{}\"", state.as_str())
            );
            let back: SandboxState =
                serde_json::from_str(&format!("\"{}\"", state.as_str())).unwrap();
            assert_eq!(back, state);
        }
        assert_eq!(SandboxState::Terminating.to_string(), "terminating");
    }

    #[test]
    fn run_statuses_round_trip_through_their_snake_case_names() {
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>(), Ok(status));
            assert_eq!(
                serde_json::to_string(&status).unwrap(),
                format!("\"{}\"", status.as_str())
            );
        }
    }

    #[test]
    fn run_kinds_round_trip_through_their_snake_case_names() {
        for kind in RunKind::ALL {
            assert_eq!(kind.as_str().parse::<RunKind>(), Ok(kind));
            assert_eq!(
                serde_json::to_string(&kind).unwrap(),
                format!("\"{}\"", kind.as_str())
            );
        }
        assert_eq!(
            "shell".parse::<RunKind>().unwrap_err().to_string(),
            "unknown run kind \"shell\""
        );
    }

    #[test]
    fn unknown_names_are_refused_with_a_message_naming_the_kind() {
        let err = "Running".parse::<SandboxState>().unwrap_err();
        assert_eq!(err.to_string(), "unknown sandbox state \"Running\"");
        let err = "done".parse::<RunStatus>().unwrap_err();
        assert_eq!(err.to_string(), "unknown run status \"done\"");
        let long = "x".repeat(1000);
        assert_eq!(long.parse::<RunStatus>().unwrap_err().value.len(), 64);
    }

    #[test]
    fn a_new_sandbox_derives_its_id_from_uid_and_scope() {
        let uid = Uid::new("alice").unwrap();
        let scope = RuntimeScope::new("thread-1").unwrap();
        let new = NewSandbox::new(
            uid.clone(),
            scope.clone(),
            Workdir::new("projects/a").unwrap(),
            warren_core::BackendKind::Local,
        );
        assert_eq!(new.id, SandboxId::derive(&uid, &scope));
        assert_eq!(new.binding.backend, BackendKind::Local);
    }
}
