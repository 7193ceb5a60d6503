//! Isolation scopes: who shares a sandbox (I29). A scope turns what a caller knows about a
//! run (user, session, agent) into the explicit identity (workspace owner, runtime scope)
//! everything else works with.

use std::fmt;

use crate::{CoreError, RuntimeScope, Uid};

/// Who shares one sandbox and one UserWorkspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IsolationScope {
    /// Every session of one user shares it (the default). Without a user id it falls back
    /// to [`IsolationScope::Session`].
    User,
    /// Each session has its own.
    Session,
    /// Every user and session of one agent shares it.
    Agent,
    /// One for everybody.
    Global,
}

/// What a caller knows about a run; each id is optional until a scope needs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunContext<'a> {
    /// The end user's id.
    pub user_id: Option<&'a str>,
    /// The conversation (session) id.
    pub session_id: Option<&'a str>,
    /// The agent's id.
    pub agent_id: Option<&'a str>,
}

/// The identity a scope derives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedIdentity {
    /// The scope in force after the USER → SESSION fallback.
    pub scope: IsolationScope,
    /// The workspace owner.
    pub uid: Uid,
    /// The runtime scope.
    pub runtime_scope: RuntimeScope,
}

impl IsolationScope {
    /// Owners derived from sessions, agents and the global scope carry these prefixes; a
    /// user id may not, or user `session:x` would share session `x`'s workspace.
    pub const RESERVED_OWNER_PREFIXES: [&'static str; 3] = ["session:", "agent:", "global:"];

    /// The reserved prefix `owner` starts with, if any.
    pub fn reserved_prefix_of(owner: &str) -> Option<&'static str> {
        Self::RESERVED_OWNER_PREFIXES
            .into_iter()
            .find(|prefix| owner.starts_with(prefix))
    }

    const ALL: [Self; 4] = [Self::User, Self::Session, Self::Agent, Self::Global];

    /// Parses `user`, `session`, `agent` or `global` (any case).
    pub fn parse(value: &str) -> Result<Self, CoreError> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.as_str().eq_ignore_ascii_case(value))
            .ok_or_else(|| CoreError::InvalidIsolationScope {
                reason: format!(
                    "unknown scope {:?}: use user, session, agent or global",
                    crate::shorten(value)
                ),
            })
    }

    /// The scope's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Session => "session",
            Self::Agent => "agent",
            Self::Global => "global",
        }
    }

    /// Derives the sandbox identity of a run. USER without a user id (absent or empty)
    /// falls back to SESSION (I29); a scope missing the id it needs is refused.
    pub fn derive(self, run: RunContext<'_>) -> Result<ScopedIdentity, CoreError> {
        let missing = |scope: Self, field: &str| CoreError::InvalidIsolationScope {
            reason: format!("scope {} needs {field}", scope.as_str()),
        };
        let (scope, owner) = match self {
            Self::User => match given(run.user_id) {
                Some(user) => {
                    if let Some(prefix) = Self::reserved_prefix_of(user) {
                        return Err(CoreError::InvalidIsolationScope {
                            reason: format!(
                                "user_id may not start with {prefix:?}: that prefix names \
                                 derived owners"
                            ),
                        });
                    }
                    (Self::User, user.to_owned())
                }
                None => match given(run.session_id) {
                    Some(session) => (Self::Session, format!("session:{session}")),
                    None => return Err(missing(self, "user_id or, as a fallback, session_id")),
                },
            },
            Self::Session => match given(run.session_id) {
                Some(session) => (Self::Session, format!("session:{session}")),
                None => return Err(missing(self, "session_id")),
            },
            Self::Agent => match given(run.agent_id) {
                Some(agent) => (Self::Agent, format!("agent:{agent}")),
                None => return Err(missing(self, "agent_id")),
            },
            Self::Global => (Self::Global, "global:shared".to_owned()),
        };
        Ok(ScopedIdentity {
            scope,
            uid: Uid::new(owner)?,
            // One runtime per owner: the owner already says who shares it.
            runtime_scope: RuntimeScope::new(scope.as_str())?,
        })
    }
}

/// An id the caller gave: absent and empty are the same (callers often send `""`).
fn given(id: Option<&str>) -> Option<&str> {
    id.filter(|id| !id.is_empty())
}

impl fmt::Display for IsolationScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derive(
        scope: &str,
        user: Option<&str>,
        session: Option<&str>,
        agent: Option<&str>,
    ) -> Result<(IsolationScope, String, String), CoreError> {
        let identity = IsolationScope::parse(scope)?.derive(RunContext {
            user_id: user,
            session_id: session,
            agent_id: agent,
        })?;
        Ok((
            identity.scope,
            identity.uid.as_str().to_owned(),
            identity.runtime_scope.as_str().to_owned(),
        ))
    }

    #[test]
    fn every_scope_derives_its_owner_and_runtime_scope() {
        let all = (Some("alice"), Some("s-1"), Some("coder"));
        let cases = [
            ("user", (IsolationScope::User, "alice", "user")),
            (
                "session",
                (IsolationScope::Session, "session:s-1", "session"),
            ),
            ("agent", (IsolationScope::Agent, "agent:coder", "agent")),
            (
                "global",
                (IsolationScope::Global, "global:shared", "global"),
            ),
            (
                "GLOBAL",
                (IsolationScope::Global, "global:shared", "global"),
            ),
        ];
        for (scope, (want_scope, owner, runtime)) in cases {
            assert_eq!(
                derive(scope, all.0, all.1, all.2).unwrap(),
                (want_scope, owner.to_owned(), runtime.to_owned()),
                "{scope}"
            );
        }
    }

    #[test]
    fn user_scope_without_a_user_id_falls_back_to_the_session() {
        for user in [None, Some("")] {
            assert_eq!(
                derive("user", user, Some("s-1"), None).unwrap(),
                (
                    IsolationScope::Session,
                    "session:s-1".into(),
                    "session".into()
                )
            );
        }
    }

    #[test]
    fn a_scope_missing_its_id_is_refused() {
        for (scope, user, session, agent) in [
            ("user", None, None, Some("coder")),
            ("session", Some("alice"), None, None),
            ("session", Some("alice"), Some(""), None),
            ("agent", Some("alice"), Some("s-1"), None),
        ] {
            let error = derive(scope, user, session, agent).unwrap_err();
            assert!(
                matches!(error, CoreError::InvalidIsolationScope { .. }),
                "{scope}: {error}"
            );
        }
    }

    #[test]
    fn a_user_id_posing_as_a_derived_owner_is_refused() {
        for user in ["session:s-1", "agent:coder", "global:shared"] {
            let error = derive("user", Some(user), None, None).unwrap_err();
            assert!(error.to_string().contains("may not start with"), "{error}");
        }
    }

    #[test]
    fn an_unknown_scope_is_refused_with_the_choices() {
        let error = IsolationScope::parse("team").unwrap_err();
        assert!(
            error.to_string().contains("user, session, agent or global"),
            "{error}"
        );
    }
}
