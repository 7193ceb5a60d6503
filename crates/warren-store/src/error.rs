//! The one error type of the state store.
//!
//! Each variant names the operation that failed and keeps the driver's error as its source,
//! so a log shows both what warren was doing and why the database refused.

use sqlx::error::ErrorKind;
use warren_core::{RuntimeScope, SandboxId, Uid};

/// Why a state store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file could not be created or given its private permissions.
    #[error("could not create the state store file")]
    CreateFile(#[source] std::io::Error),

    /// The database could not be opened or configured.
    #[error("could not open the state store")]
    Open(#[source] sqlx::Error),

    /// The database was written by a newer warren: its schema is unknown to this binary, and
    /// running against it could corrupt it.
    #[error(
        "the state store has schema version {found}, newer than version {known} known to this \
         warren; upgrade warren or use another database"
    )]
    SchemaTooNew {
        /// The newest migration recorded in the database.
        found: i64,
        /// The newest migration this binary ships.
        known: i64,
    },

    /// Another warren server uses this PostgreSQL database; until cluster mode, one
    /// database serves one server.
    #[error(
        "another warren server is using this PostgreSQL database; one database serves one \
         server (stop the other, or give this one its own database)"
    )]
    DatabaseInUse,

    /// Applying the schema migrations failed.
    #[error("could not migrate the state store schema")]
    Migrate(#[source] sqlx::migrate::MigrateError),

    /// The database cannot be reached: the connection broke, the server is restarting or
    /// refuses connections, or no pooled connection came free in time. Nothing was
    /// written that the caller must undo: each operation is one transaction. Retrying
    /// after a while may succeed; the API answers 503 `state_store_unavailable`.
    #[error("the state store is unavailable: could not {operation}")]
    Unavailable {
        /// What the store was doing.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },

    /// A statement failed.
    #[error("could not {operation} in the state store")]
    Query {
        /// What the store was doing, e.g. "claim a sandbox".
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },

    /// A stored value breaks the rules of its type; the database was changed outside warren
    /// or by a buggy version.
    #[error("the state store holds an invalid value in {table}.{column}: {detail}")]
    Corrupt {
        /// The table holding the value.
        table: &'static str,
        /// The column holding the value.
        column: &'static str,
        /// Why the value was refused.
        detail: String,
    },

    /// A sandbox claim whose id is not the one derived from its uid and runtime scope.
    #[error("sandbox id {id} is not the id of uid {uid:?} with runtime scope {scope:?}")]
    SandboxIdMismatch {
        /// The id given.
        id: SandboxId,
        /// The uid given.
        uid: Uid,
        /// The runtime scope given.
        scope: RuntimeScope,
    },

    /// No sandbox with this id was ever claimed.
    #[error("sandbox {id} is not recorded")]
    UnknownSandbox {
        /// The id asked for.
        id: SandboxId,
    },

    /// A transport record changed (or appeared) since it was read: read it again.
    #[error("{namespace} record {key:?} changed since it was read")]
    RecordConflict {
        /// The record's namespace.
        namespace: String,
        /// Its key.
        key: String,
    },

    /// A transport record's key or value is out of bounds.
    #[error("invalid record: {reason}")]
    RecordInvalid {
        /// Why.
        reason: &'static str,
    },

    /// A migration with this id was planned from another plan: the source changed since it
    /// was planned, so resuming the recorded migration would move what is no longer there.
    #[error(
        "migration {id:?} was planned with plan digest {planned}, but the plan now has digest \
         {requested}: the source changed since it was planned; finish or abandon the planned \
         migration before planning it again"
    )]
    MigrationConflict {
        /// The migration's id.
        id: String,
        /// The digest of the plan recorded when it was begun.
        planned: String,
        /// The digest of the plan it was begun with now.
        requested: String,
    },

    /// A migration or its items break the journal's rules (no id, a plan that is not JSON,
    /// an item key twice); nothing was written.
    #[error("invalid migration {id:?}: {reason}")]
    MigrationInvalid {
        /// The migration's id.
        id: String,
        /// Why.
        reason: String,
    },

    /// The alias already names another sandbox; an alias is never moved.
    #[error("{namespace} sandbox {alias:?} already names sandbox {bound}")]
    AliasConflict {
        /// The alias's namespace.
        namespace: String,
        /// The alias.
        alias: String,
        /// The sandbox it names.
        bound: SandboxId,
    },

    /// A write about a runtime was made under an ownership that was superseded: another
    /// node took the runtime over (issue 14).
    #[error("this node no longer owns the runtime of sandbox {sandbox} (fencing token {token} was superseded)")]
    NotOwner {
        /// The sandbox.
        sandbox: SandboxId,
        /// The token the write was made under.
        token: i64,
    },

    /// No run with this id was ever started.
    #[error("run {run_id:?} is not recorded")]
    UnknownRun {
        /// The id asked for.
        run_id: String,
    },

    /// A run with this id was already started.
    #[error("run {run_id:?} is already recorded")]
    DuplicateRun {
        /// The id given.
        run_id: String,
    },

    /// The run already has an outcome, which is never overwritten.
    #[error("run {run_id:?} has already finished")]
    RunAlreadyFinished {
        /// The id given.
        run_id: String,
    },

    /// Adding the variable would give the uid's agent environment more than `max` variables.
    #[error("the agent environment of uid {uid:?} already holds the most variables allowed ({max}); remove one first")]
    AgentEnvFull {
        /// The uid.
        uid: Uid,
        /// The limit.
        max: usize,
    },

    /// Adding the secret would give the uid (or the sandbox) more than `max` egress secrets.
    #[error("at most {max} egress secrets may be set here; remove one first")]
    EgressSecretsFull {
        /// The limit.
        max: usize,
    },
}

impl StoreError {
    /// A closure turning a driver error into [`StoreError::Query`] for `operation`, for use
    /// with `map_err`.
    ///
    /// A driver error that means the database is out of reach (see [`is_unavailable`])
    /// becomes [`StoreError::Unavailable`] instead, so every operation reports a lost
    /// connection the same way.
    pub(crate) fn query(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| {
            if is_unavailable(&source) {
                Self::Unavailable { operation, source }
            } else {
                Self::Query { operation, source }
            }
        }
    }

    /// Like [`StoreError::query`], for a write whose row names `sandbox` by foreign key: a
    /// sandbox that was never claimed is [`StoreError::UnknownSandbox`].
    pub(crate) fn on_sandbox<'a>(
        operation: &'static str,
        sandbox: &'a SandboxId,
    ) -> impl FnOnce(sqlx::Error) -> Self + 'a {
        move |source| match violation(&source) {
            Some(ErrorKind::ForeignKeyViolation) => Self::UnknownSandbox {
                id: sandbox.clone(),
            },
            _ => Self::query(operation)(source),
        }
    }

    /// Whether the database was out of reach, as opposed to refusing the operation: the
    /// caller may retry later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Open(source) => is_unavailable(source),
            _ => false,
        }
    }
}

/// The kind of constraint a failed statement broke, if that is why it failed.
pub(crate) fn violation(error: &sqlx::Error) -> Option<ErrorKind> {
    match error {
        sqlx::Error::Database(database) => Some(database.kind()),
        _ => None,
    }
}

/// Whether a driver error means the database could not be reached or dropped the
/// connection, rather than refusing a statement.
///
/// PostgreSQL reports a server going away with SQLSTATE class 08 (connection exception)
/// and 57P01..57P03 (shut down by the administrator, crash shutdown, cannot connect now);
/// the driver reports a broken socket as an I/O or protocol error and an exhausted pool as
/// a time-out.
pub(crate) fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(database) => database.code().is_some_and(|code| {
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lowercase_and_name_the_operation() {
        let err = StoreError::query("claim a sandbox")(sqlx::Error::RowNotFound);
        assert_eq!(
            err.to_string(),
            "could not claim a sandbox in the state store"
        );
        assert!(std::error::Error::source(&err).is_some());

        let err = StoreError::SchemaTooNew { found: 7, known: 1 };
        let message = err.to_string();
        assert!(message.starts_with("the state store has schema version 7"));
        assert!(message.contains("upgrade warren"));
    }

    #[test]
    fn a_broken_connection_is_reported_as_unavailable_and_a_refusal_is_not() {
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let err = StoreError::query("start a run")(sqlx::Error::Io(broken));
        assert!(err.is_unavailable(), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the state store is unavailable: could not start a run"
        );
        assert!(StoreError::query("start a run")(sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(!StoreError::query("start a run")(sqlx::Error::RowNotFound).is_unavailable());
    }
}
