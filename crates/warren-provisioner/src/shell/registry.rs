//! The sessions of every sandbox, and their bounds.

use super::*;

/// The sessions of every sandbox.
#[derive(Default)]
pub(crate) struct Registry {
    pub(super) sessions: Mutex<HashMap<SandboxId, Vec<Arc<Session>>>>,
    pub(super) open_locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Registry {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Vec<Arc<Session>>>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        // Ended sessions stay readable for a while, then go.
        sessions.retain(|_, list| {
            list.retain(|session| {
                session
                    .lock()
                    .ended
                    .is_none_or(|(_, at)| at.elapsed() < ENDED_KEPT)
            });
            !list.is_empty()
        });
        sessions
    }

    pub(super) fn open_lock(&self, sandbox: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.open_locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(sandbox.clone()).or_default().clone()
    }

    pub(super) fn get(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
    ) -> Option<Arc<Session>> {
        self.lock()
            .get(sandbox)?
            .iter()
            .find(|session| session.kind == kind && session.id == id)
            .cloned()
    }

    pub(super) fn find(
        &self,
        sandbox: &SandboxId,
        kind: SessionKind,
        id: &str,
    ) -> Result<Arc<Session>, ProvisionerError> {
        self.get(sandbox, kind, id)
            .ok_or_else(|| ProvisionerError::ShellSessionNotFound {
                id: id.chars().take(MAX_SESSION_ID_BYTES).collect(),
            })
    }

    pub(super) fn of(&self, sandbox: &SandboxId, kind: SessionKind) -> Vec<Arc<Session>> {
        self.lock()
            .get(sandbox)
            .map(|list| {
                list.iter()
                    .filter(|session| session.kind == kind)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn insert(&self, session: Arc<Session>) {
        self.lock()
            .entry(session.sandbox.clone())
            .or_default()
            .push(session);
    }

    pub(super) fn forget(&self, session: &Arc<Session>) {
        let mut sessions = self.lock();
        if let Some(list) = sessions.get_mut(&session.sandbox) {
            list.retain(|other| !Arc::ptr_eq(other, session));
        }
    }

    /// Makes room for one more live session in the sandbox: ended ones are dropped, then,
    /// at a bound, the least recently used idle session made for a command without a
    /// session id (its client never said it wants it again) is closed; a sandbox full of
    /// sessions its clients named is full.
    pub(super) fn make_room(
        &self,
        sandbox: &SandboxId,
        implicit: bool,
    ) -> Result<(), ProvisionerError> {
        let mut sessions = self.lock();
        let Some(list) = sessions.get_mut(sandbox) else {
            return Ok(());
        };
        list.retain(|session| !session.ended());
        let implicit_count = list.iter().filter(|session| session.implicit).count();
        if list.len() < MAX_SHELL_SESSIONS
            && !(implicit && implicit_count >= MAX_IMPLICIT_SHELL_SESSIONS)
        {
            return Ok(());
        }
        let victim = list
            .iter()
            .filter(|session| session.implicit && session.info().status == SessionStatus::Ready)
            .min_by_key(|session| session.lock().last_used)
            .cloned();
        match victim {
            Some(victim) => {
                list.retain(|other| !Arc::ptr_eq(other, &victim));
                victim.request_close();
                Ok(())
            }
            // Implicit sessions all busy, under the overall bound: one more is fine.
            None if list.len() < MAX_SHELL_SESSIONS => Ok(()),
            None => Err(ProvisionerError::TooManyShellSessions {
                sandbox: sandbox.clone(),
                max: MAX_SHELL_SESSIONS,
            }),
        }
    }
}
