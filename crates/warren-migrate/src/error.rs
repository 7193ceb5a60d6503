//! What can go wrong in a migration. Every message says what to do about it.

use std::path::PathBuf;

/// One error enum for the crate.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The source directory cannot be opened.
    #[error("cannot open the source {}: {reason}", path.display())]
    Source {
        /// The source as given.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The source holds something the migrator does not know: an unreleased or foreign
    /// layout. Nothing was copied.
    #[error(
        "the source is not a DeerFlow layout this migrator knows: {path} is {found} \
         (expected {expected}); nothing was copied"
    )]
    UnknownSchema {
        /// Where, relative to the source.
        path: String,
        /// What was found there.
        found: String,
        /// What the migrator expected at that level.
        expected: String,
    },
    /// Two source items would land on one target.
    #[error("{first} and {second} would both become {target}; nothing was copied")]
    PlanConflict {
        /// One source item.
        first: String,
        /// The other.
        second: String,
        /// The shared target.
        target: String,
    },
    /// The plan needs something the configuration does not give.
    #[error("{0}")]
    Config(String),
    /// Processes still use the source: the old system is not stopped.
    #[error(
        "the old system is still running: {} (stop it, then run the migration again)",
        processes.join("; ")
    )]
    SourceInUse {
        /// Each process and what it holds, e.g. `pid 42 (python3): cwd users/alice`.
        processes: Vec<String>,
    },
    /// A source file changed while it was copied: something still writes the source.
    #[error(
        "{path} {how} while it was copied: something still writes the source; stop the old \
         system, then run the migration again (it resumes)"
    )]
    SourceChanged {
        /// The file, relative to the source.
        path: String,
        /// What changed.
        how: String,
    },
    /// A committed item of the source was written to after its migration: cleaning it
    /// would lose what was written.
    #[error(
        "{path} was written to after it was migrated, so the source is not cleaned and \
         nothing of it is removed (migrate what is new into another data directory, or \
         remove it by hand)"
    )]
    ChangedSinceMigration {
        /// The item, relative to the source.
        path: String,
    },
    /// A target already holds other content: never overwritten.
    #[error(
        "{target} already holds content that differs from {source_item} ({detail}); \
         nothing was overwritten: move it away, or migrate into another data directory"
    )]
    TargetConflict {
        /// The target, as `uid <uid>: <workdir>` or `shared skills: <slug>`.
        target: String,
        /// The source item.
        source_item: String,
        /// The first difference found.
        detail: String,
    },
    /// A copy does not match its source after the copy or after the switch.
    #[error("{what} does not match its source: {detail}; the source is untouched")]
    VerifyFailed {
        /// Which tree.
        what: String,
        /// The first difference found.
        detail: String,
    },
    /// The journal says something the files contradict, or a journal write lost a race.
    #[error("the migration journal and the files disagree: {0}")]
    Journal(String),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Fs {
        /// What was being done, on which relative path.
        what: String,
        /// The file layer's error (no host paths).
        #[source]
        source: warren_fs::FsError,
    },
    /// A system call outside the file layer failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The state store failed.
    #[error("the state store: {0}")]
    Store(#[from] warren_store::StoreError),
    /// The workspace host (the provisioner) could not prepare a UserWorkspace.
    #[error("cannot prepare the UserWorkspace of uid {uid}: {reason}")]
    Workspace {
        /// The uid.
        uid: String,
        /// Why.
        reason: String,
    },
}

impl MigrateError {
    /// A file-layer error while doing `what`.
    pub fn fs(what: impl Into<String>) -> impl FnOnce(warren_fs::FsError) -> Self {
        let what = what.into();
        move |source| Self::Fs { what, source }
    }

    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}
