//! The sandbox lifecycle as one table: which event moves a sandbox from which state to
//! which. Every change of a sandbox's state asks [`transition`] first and is written by
//! compare-and-set on the state it read and its generation, so a move another caller made
//! meanwhile (another request, another replica, the reaper) makes this one fail instead of
//! being undone.
//!
//! ```text
//!                 start        reclaim      pause        paused      resume      terminate    terminated  runtime lost
//! created        running      -            pausing      -           -           terminating  -           created
//! running        running      stopped      pausing      -           -           terminating  -           stopped
//! stopped        running      -            pausing      -           -           terminating  -           stopped
//! pausing        (paused)     -            -            paused      -           terminating  -           paused
//! paused         (paused)     -            -            -           stopped     terminating  -           paused
//! terminating    (fenced)     -            -            -           -           terminating  terminated  terminating
//! terminated     (fenced)     -            -            -           -           terminated   -           terminated
//! ```
//!
//! `-` is refused; `(paused)` and `(fenced)` are refusals with their own answer (resume
//! first; create the sandbox again). A new generation of a terminated sandbox is a claim,
//! not a transition: the store writes it as `created` with the generation one higher.

use warren_core::SandboxId;
use warren_store::{OwnerFence, SandboxRecord, SandboxState};

use crate::{Provisioner, ProvisionerError};

/// What happens to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifeEvent {
    /// A run or a process starts its runtime, or finds it started.
    Start,
    /// Its owner ends an idle, old or drained runtime; the files stay (I15, I30).
    Reclaim,
    /// A pause begins: nothing starts while its runtime is snapshotted and ended.
    Pause,
    /// The pause's runtime ended.
    Paused,
    /// A resume: runs may start again, the next runtime from the pause's snapshot.
    Resume,
    /// The cleanup fence goes up (I24): termination begins.
    Terminate,
    /// The terminating sandbox's runtime ended.
    Terminated,
    /// Its owner found the runtime gone (a crash, a restart).
    RuntimeLost,
}

impl LifeEvent {
    /// Every event.
    pub const ALL: [Self; 8] = [
        Self::Start,
        Self::Reclaim,
        Self::Pause,
        Self::Paused,
        Self::Resume,
        Self::Terminate,
        Self::Terminated,
        Self::RuntimeLost,
    ];

    /// What the event does, for messages: "sandbox … is paused: it cannot <verb>".
    pub fn verb(self) -> &'static str {
        match self {
            Self::Start => "start a runtime",
            Self::Reclaim => "have its runtime reclaimed",
            Self::Pause => "be paused",
            Self::Paused => "finish a pause",
            Self::Resume => "be resumed",
            Self::Terminate => "be terminated",
            Self::Terminated => "finish a termination",
            Self::RuntimeLost => "lose its runtime",
        }
    }
}

/// The state `event` moves a sandbox in state `from` to, or why it may not happen.
pub fn transition(from: SandboxState, event: LifeEvent) -> Result<SandboxState, Refusal> {
    use LifeEvent as E;
    use SandboxState as S;
    let to = match (from, event) {
        (S::Created | S::Running | S::Stopped, E::Start) => S::Running,
        (S::Running, E::Reclaim) => S::Stopped,
        (S::Created | S::Running | S::Stopped, E::Pause) => S::Pausing,
        (S::Pausing, E::Paused) => S::Paused,
        (S::Paused, E::Resume) => S::Stopped,
        (S::Created | S::Running | S::Stopped | S::Pausing | S::Paused, E::Terminate) => {
            S::Terminating
        }
        (S::Terminating, E::Terminate) => S::Terminating,
        (S::Terminated, E::Terminate) => S::Terminated,
        (S::Terminating, E::Terminated) => S::Terminated,
        (S::Running, E::RuntimeLost) => S::Stopped,
        (S::Pausing, E::RuntimeLost) => S::Paused,
        (S::Created | S::Stopped | S::Paused | S::Terminating | S::Terminated, E::RuntimeLost) => {
            from
        }
        _ => return Err(Refusal { from, event }),
    };
    Ok(to)
}

/// An event the table does not allow in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The sandbox's state.
    pub from: SandboxState,
    /// What was asked.
    pub event: LifeEvent,
}

impl Refusal {
    /// The error a caller gets: a paused sandbox says how to resume it, a fenced one how to
    /// start a new generation, any other refusal names the state and the event.
    pub fn into_error(self, sandbox: &SandboxId) -> ProvisionerError {
        let state = self.from.as_str();
        match self.from {
            SandboxState::Pausing | SandboxState::Paused if self.event == LifeEvent::Start => {
                ProvisionerError::SandboxPaused {
                    sandbox: sandbox.clone(),
                    state,
                }
            }
            SandboxState::Terminating | SandboxState::Terminated => {
                ProvisionerError::SandboxTerminated {
                    sandbox: sandbox.clone(),
                    state,
                }
            }
            _ => ProvisionerError::IllegalTransition {
                sandbox: sandbox.clone(),
                state,
                event: self.event.verb(),
            },
        }
    }
}

impl Provisioner {
    /// Moves the sandbox as read in `record` by `event`: the table says where to, and the
    /// store writes it only if the sandbox is still in that state and generation (under
    /// `fence`, only while this node owns its runtime). `Ok(None)`: another caller moved it
    /// first; read it again.
    pub(crate) async fn advance(
        &self,
        record: &SandboxRecord,
        event: LifeEvent,
        fence: Option<&OwnerFence>,
    ) -> Result<Option<SandboxRecord>, ProvisionerError> {
        let to =
            transition(record.state, event).map_err(|refusal| refusal.into_error(&record.id))?;
        let (id, generation, from) = (&record.id, record.generation, record.state);
        let moved = match fence {
            Some(fence) => {
                self.store
                    .set_runtime_state(id, generation, from, to, fence)
                    .await?
            }
            None => {
                self.store
                    .set_sandbox_state(id, generation, from, to)
                    .await?
            }
        };
        if let Some(moved) = &moved {
            tracing::debug!(sandbox = %id, generation, %from, to = %moved.state, ?event, "sandbox moved");
        }
        Ok(moved)
    }

    /// Moves the sandbox's current generation by `event`, reading it again each time
    /// another caller moved it first (each such loss is someone else's progress). Returns
    /// the record as it was read and as it became.
    pub(crate) async fn advance_current(
        &self,
        id: &SandboxId,
        event: LifeEvent,
    ) -> Result<(SandboxRecord, SandboxRecord), ProvisionerError> {
        loop {
            let record = self.sandbox(id).await?;
            if let Some(moved) = self.advance(&record, event, None).await? {
                return Ok((record, moved));
            }
        }
    }
}

/// Refuses unless a run may start in the sandbox now: not while it is paused (resume it)
/// nor behind its cleanup fence (I24).
pub(crate) fn refuse_unless_runnable(record: &SandboxRecord) -> Result<(), ProvisionerError> {
    transition(record.state, LifeEvent::Start)
        .map(drop)
        .map_err(|refusal| refusal.into_error(&record.id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use LifeEvent as E;
    use SandboxState as S;

    /// The whole table, written out once more by hand: `None` is refused.
    fn expected(from: S, event: E) -> Option<S> {
        let row: [Option<S>; 8] = match from {
            S::Created => [
                Some(S::Running),
                None,
                Some(S::Pausing),
                None,
                None,
                Some(S::Terminating),
                None,
                Some(S::Created),
            ],
            S::Running => [
                Some(S::Running),
                Some(S::Stopped),
                Some(S::Pausing),
                None,
                None,
                Some(S::Terminating),
                None,
                Some(S::Stopped),
            ],
            S::Stopped => [
                Some(S::Running),
                None,
                Some(S::Pausing),
                None,
                None,
                Some(S::Terminating),
                None,
                Some(S::Stopped),
            ],
            S::Pausing => [
                None,
                None,
                None,
                Some(S::Paused),
                None,
                Some(S::Terminating),
                None,
                Some(S::Paused),
            ],
            S::Paused => [
                None,
                None,
                None,
                None,
                Some(S::Stopped),
                Some(S::Terminating),
                None,
                Some(S::Paused),
            ],
            S::Terminating => [
                None,
                None,
                None,
                None,
                None,
                Some(S::Terminating),
                Some(S::Terminated),
                Some(S::Terminating),
            ],
            S::Terminated => [
                None,
                None,
                None,
                None,
                None,
                Some(S::Terminated),
                None,
                Some(S::Terminated),
            ],
        };
        let column = E::ALL.iter().position(|e| *e == event).unwrap();
        row[column]
    }

    #[test]
    fn every_state_and_event_pair_moves_as_the_table_says() {
        for from in S::ALL {
            for event in E::ALL {
                assert_eq!(
                    transition(from, event).ok(),
                    expected(from, event),
                    "{from} + {event:?}"
                );
            }
        }
    }

    #[test]
    fn no_event_leaves_a_terminated_sandbox_but_a_new_claim() {
        for event in E::ALL {
            if let Ok(to) = transition(S::Terminated, event) {
                assert_eq!(to, S::Terminated, "{event:?}");
            }
        }
    }

    #[test]
    fn a_paused_sandbox_starts_nothing_and_says_how_to_resume() {
        let id = SandboxId::derive(
            &warren_core::Uid::new("alice").unwrap(),
            &warren_core::RuntimeScope::new("t").unwrap(),
        );
        for from in [S::Pausing, S::Paused] {
            let refusal = transition(from, E::Start).unwrap_err();
            assert!(matches!(
                refusal.into_error(&id),
                ProvisionerError::SandboxPaused { .. }
            ));
        }
        let refusal = transition(S::Terminating, E::Start).unwrap_err();
        assert!(matches!(
            refusal.into_error(&id),
            ProvisionerError::SandboxTerminated { .. }
        ));
        let refusal = transition(S::Running, E::Resume).unwrap_err();
        assert!(matches!(
            refusal.into_error(&id),
            ProvisionerError::IllegalTransition { .. }
        ));
    }
}
