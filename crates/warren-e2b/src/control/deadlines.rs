//! The sandbox timeout as a real deadline: a task ends (or, with `autoPause`, pauses)
//! every sandbox whose `endAt` passed. Every replica runs it; a record is changed only at
//! the version read, so of two replicas seeing one expired sandbox only one acts.

use std::time::Duration;

use crate::state::E2bState;
use crate::{E2bError, Shared};

/// How often deadlines are looked at: a sandbox lives at most this much past its end.
const TICK: Duration = Duration::from_millis(500);

/// Starts the deadline task; it ends when the provisioner shuts down.
pub(crate) fn spawn_deadlines(shared: Shared) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if shared.provisioner.is_shutting_down() {
                return;
            }
            if let Err(error) = expire(&shared).await {
                tracing::warn!(%error, "could not end expired E2B sandboxes; trying again");
            }
        }
    })
}

/// Ends every running sandbox past its deadline, each in a task of its own so one slow
/// snapshot never holds up another sandbox's end (no tenant stalls another).
async fn expire(shared: &Shared) -> Result<(), E2bError> {
    let now = chrono::Utc::now();
    let expired: Vec<_> = super::all_sandboxes(shared)
        .await?
        .into_iter()
        .filter(|(sandbox, _)| sandbox.state == E2bState::Running && sandbox.end_at <= now)
        .collect();
    for (sandbox, version) in expired {
        if !shared
            .expiring
            .lock()
            .expect("not poisoned")
            .insert(sandbox.sandbox_id.clone())
        {
            continue;
        }
        let shared = shared.clone();
        // Detached: the next tick must not wait for a slow pause.
        tokio::spawn(async move {
            let id = sandbox.sandbox_id.clone();
            let result = if sandbox.auto_pause {
                super::lifecycle::pause_sandbox(&shared, sandbox, version)
                    .await
                    .map(|_| ())
            } else {
                super::lifecycle::kill(&shared, &sandbox, version).await
            };
            match result {
                Ok(()) => {
                    tracing::info!(sandbox = %id, "an E2B sandbox's timeout passed; ended it")
                }
                // Another request or replica changed it first: it is handled there.
                Err(E2bError::Conflict) => {}
                Err(E2bError::Provisioner(error)) if super::lifecycle::is_not_running(&error) => {}
                Err(error) => {
                    tracing::warn!(sandbox = %id, %error, "could not end an expired E2B sandbox")
                }
            }
            shared.expiring.lock().expect("not poisoned").remove(&id);
        });
    }
    Ok(())
}
