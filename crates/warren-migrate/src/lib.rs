//! The storage migrator: imports another system's stored files into warren's
//! UserWorkspaces, once, without losing a byte (I36).
//!
//! Today it knows DeerFlow's layout (`{base}/users/{user_id}/threads/{thread_id}/user-data`,
//! the older `{base}/threads/{thread_id}/user-data`, and `skills/{public,custom}`). A run
//! goes through steps, each recorded in a journal in the state store before the next one
//! starts, so a migrator killed at any point resumes from the journal on the next run:
//!
//! 1. **plan** ([`plan`]): every source item gets a deterministic target — a thread the
//!    workdir `threads/<thread_id>/user-data` of its user's UserWorkspace (the very workdir
//!    the DeerFlow drop-in binds that thread to), a public skill a directory of the
//!    operator's shared skill directory, a custom skill the uid's personal skills under
//!    `agents/skills/` (I9). A layout the migrator does not recognise fails here, before
//!    anything is copied, naming what it found. The plan goes into the journal.
//! 2. **copy** ([`copy`]): into a staging directory beside the target, by descriptors on
//!    both sides; nothing in the source is followed (a symlink is recreated as a symlink,
//!    one pointing outside its tree is reported), everything made is 1000:1000 (I11) with
//!    world-writable and set-id bits removed, and the manifest of the source (every
//!    entry's kind, mode, size, time and SHA-256) is recorded.
//! 3. **verify**: the staging tree is hashed again and must equal the manifest.
//! 4. **switch**: the staging tree is renamed into place (atomically: the target is absent
//!    or an empty directory, never a tree with files), and the workdir record is written in
//!    the same transaction as the journal step.
//! 5. **read back and commit**: the records are read back and the final tree hashed again;
//!    only then is the item committed.
//! 6. **clean** (only with `clean_source`, and only after every item committed): the
//!    source items are removed.
//!
//! A rerun re-verifies the same targets. A target that already holds *different* content
//! is a loud failure, never an overwrite; one holding the same content (the migrator was
//! killed between the rename and the journal write) is recognised and recorded.
//!
//! The caller proves the old system is stopped: [`stopped`] finds processes using the
//! source, and the binary holds the data directory's lock so no warren server runs on it
//! meanwhile.

pub mod copy;
mod error;
pub mod manifest;
pub mod plan;
mod run;
pub mod stopped;

pub use error::MigrateError;
pub use run::{
    crash_hook_from_env, migration_id, status, CrashHook, MigrateOptions, MigrationOutcome,
    Migrator, WorkspaceHost,
};
