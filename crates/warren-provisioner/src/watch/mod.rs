//! Directory watches of a sandbox. On its persistent mounts, by descriptor (I1, I2): the
//! directory opened like a read ([`Provisioner::open_watch_dir`]) and watched with inotify
//! on that descriptor, recursively when asked ([`Provisioner::watch_dir`], `dir.rs`), or
//! polled where inotify cannot be had (`poll.rs`, `diff.rs`). In the runtime's own tree,
//! polled through the runtime's agent (`poll.rs`). Transports map the events to their
//! wire (E2B's `WatchDir` and watchers).
//!
//! A transport that watches a directory (E2B's envd: inotify on `/proc/self/fd/<n>`) gets
//! the directory's descriptor, resolved by virtual path exactly like a read, and never a
//! host path: what it watches is the very directory the resolution found, however the path
//! is renamed or swapped for a link afterwards, and everything it opens beneath it later
//! goes through `warren-fs` by that descriptor.

mod diff;
mod dir;
mod poll;
mod watchers;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_core::{SandboxId, VirtualPath};
use warren_fs::Entry;
use warren_store::{SandboxState, StateStore};

pub use dir::{DirWatch, WatchBatch, MAX_DIR_WATCHES, MAX_WATCHED_ENTRIES};
pub(crate) use watchers::Watches;
pub use watchers::{
    WatchSlot, WatcherChanges, LIVENESS_EVERY, MAX_WATCHER_BACKLOG, MAX_WATCHES_PER_SANDBOX,
    WATCHER_IDLE,
};

use crate::transitions::{transition, LifeEvent};
use crate::{Provisioner, ProvisionerError};

/// Why watches of the sandbox `id` end now, if they do: it is gone, paused or being ended,
/// with the error a command would get. A store that cannot answer keeps them: they end
/// later, not on a hiccup. The one rule every watch (streamed or polled) ends by.
pub(crate) async fn watch_ended(
    store: &dyn StateStore,
    id: &SandboxId,
) -> Option<ProvisionerError> {
    match store.get_sandbox(id).await {
        Ok(Some(record)) => match record.state {
            SandboxState::Pausing
            | SandboxState::Paused
            | SandboxState::Terminating
            | SandboxState::Terminated => Some(
                transition(record.state, LifeEvent::Start)
                    .err()
                    .map(|refusal| refusal.into_error(id))
                    .unwrap_or_else(|| ProvisionerError::SandboxNotFound(id.clone())),
            ),
            _ => None,
        },
        Ok(None) => Some(ProvisionerError::SandboxNotFound(id.clone())),
        Err(_) => None,
    }
}

/// A watch's check that its sandbox still runs, at most every [`LIVENESS_EVERY`].
pub(crate) struct Liveness {
    store: Arc<dyn StateStore>,
    sandbox: SandboxId,
    checked: Instant,
    /// A check found the sandbox no longer running.
    stopped: bool,
}

impl Liveness {
    pub(crate) fn new(store: Arc<dyn StateStore>, sandbox: SandboxId) -> Self {
        Self {
            store,
            sandbox,
            checked: Instant::now(),
            stopped: false,
        }
    }

    /// Whether a check found the sandbox no longer running (the watch ended for it).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// How long until the next check is due.
    pub(crate) fn due_in(&self) -> Duration {
        LIVENESS_EVERY.saturating_sub(self.checked.elapsed())
    }

    /// Why the watch ends, when a check is due and finds the sandbox no longer runs.
    pub(crate) async fn check(&mut self) -> Option<ProvisionerError> {
        if self.due_in() > Duration::ZERO {
            return None;
        }
        self.checked = Instant::now();
        let ended = watch_ended(self.store.as_ref(), &self.sandbox).await;
        self.stopped = ended.is_some();
        ended
    }
}

/// What happened to an entry of a watched directory: inotify's events as fsnotify (and so
/// E2B's envd) names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    /// Made, or moved in.
    Create,
    /// Written.
    Write,
    /// Removed.
    Remove,
    /// Moved away (the old name).
    Rename,
    /// Its permissions or owner changed.
    Chmod,
}

/// One event: the entry's path relative to the watched directory and what happened; the
/// entry as it now is, when the watch includes entries and it still exists under that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchChange {
    /// Path relative to the watched directory.
    pub name: String,
    /// What happened.
    pub kind: WatchKind,
    /// The entry now at `name`, if asked for and any.
    pub entry: Option<Entry>,
}

impl Provisioner {
    /// Opens the directory `path` of the sandbox `id` for a watch: its virtual path (parsed
    /// against the sandbox's layout, mounts and workdir like every file operation) and a
    /// descriptor of it (`O_RDONLY | O_DIRECTORY`), resolved beneath the mount's tree with no
    /// `..`, no link in any component (the last one included) and no mount crossing (I2).
    ///
    /// Read access: it is allowed in every sandbox state and on read-only mounts (I17).
    /// Unlike the other file operations it does **not** count as sandbox activity: a watch
    /// is opened once and then sees changes made by others, so a caller that wants the
    /// watch's start counted records that itself, and nothing it does per event or per
    /// tick keeps a sandbox from being reaped.
    pub async fn open_watch_dir(
        &self,
        id: &SandboxId,
        path: &str,
    ) -> Result<(VirtualPath, OwnedFd), ProvisionerError> {
        let record = self.sandbox(id).await?;
        // The roots exactly as a read opens them (`files.rs`), without the activity a
        // file operation records.
        let roots = self.roots_of(&record).await?;
        let path = roots.resolve(path)?;
        let fd = self.open_resolved_dir(roots, path.clone()).await?;
        Ok((path, fd))
    }

    /// [`Self::open_watch_dir`] of a path resolved on one of the mounts of `roots`.
    pub(crate) async fn open_resolved_dir(
        &self,
        roots: crate::files::SandboxRoots,
        path: VirtualPath,
    ) -> Result<OwnedFd, ProvisionerError> {
        self.blocking(move || {
            let root = roots.open(&path)?;
            root.open_dir(path.relative())
                .map_err(|source| ProvisionerError::File {
                    path: path.to_string(),
                    source,
                })
        })
        .await
    }
}

/// How long [`Provisioner::wait_for_changes`] keeps collecting after the first change, so
/// one save's several events come back together.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

impl Provisioner {
    /// Waits up to `timeout` for something under the directory `path` to change
    /// ([`Provisioner::watch_dir`]), and returns the directory and what changed: as soon as
    /// changes came and a moment passed with no more, at most `limit` of them; none when
    /// the time is up first. A watch that ended with nothing seen is its error.
    pub async fn wait_for_changes(
        self: &Arc<Self>,
        id: &SandboxId,
        path: &str,
        recursive: bool,
        timeout: std::time::Duration,
        limit: usize,
    ) -> Result<(VirtualPath, Vec<WatchChange>), ProvisionerError> {
        let tick = std::time::Duration::from_millis(250);
        let (base, mut watch) = self.watch_dir(id, path, recursive, false, tick).await?;
        let until = tokio::time::Instant::now() + timeout;
        let mut changes = Vec::new();
        loop {
            let now = tokio::time::Instant::now();
            if now >= until || changes.len() >= limit {
                break;
            }
            // Once something changed, only a moment more for the rest of it.
            let wait = if changes.is_empty() {
                until - now
            } else {
                SETTLE.min(until - now)
            };
            let batch = watch.next(wait).await;
            let quiet = batch.changes.is_empty();
            changes.extend(batch.changes);
            match batch.end {
                Some(error) if changes.is_empty() => return Err(error),
                Some(_) => break,
                None if quiet && !changes.is_empty() => break,
                None => {}
            }
        }
        changes.truncate(limit);
        Ok((base, changes))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::sync::Arc;

    use warren_fs::{FsError, WorkspaceRoot};

    use super::*;
    use crate::testing;

    struct Fixture {
        provisioner: Arc<Provisioner>,
        id: SandboxId,
        /// The host directory of the sandbox's workdir.
        workdir: std::path::PathBuf,
        data_dir: std::path::PathBuf,
        _fixture: testing::Fixture,
    }

    async fn fixture() -> Fixture {
        let fixture = testing::Fixture::new().await;
        let provisioner = fixture.provisioner.clone();
        let data_dir = fixture.data_dir().to_owned();
        let record = fixture.sandbox("alice", "t", "projects/a").await;
        let workdir = provisioner.mounts(&record).0.join("projects/a");
        std::fs::create_dir_all(workdir.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(data_dir.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(data_dir.join("elsewhere"), workdir.join("link")).unwrap();
        std::os::unix::fs::symlink("sub", workdir.join("rel_link")).unwrap();
        std::fs::write(workdir.join("file"), b"x").unwrap();
        Fixture {
            provisioner,
            id: record.id,
            workdir,
            data_dir,
            _fixture: fixture,
        }
    }

    #[tokio::test]
    async fn a_watch_ends_with_the_reason_once_its_sandbox_no_longer_runs() {
        let f = fixture().await;
        let (_, mut watch) = f
            .provisioner
            .watch_dir(&f.id, ".", true, false, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(watch.next(Duration::ZERO).await.end.is_none(), "it runs");
        f.provisioner.join_cluster().await.unwrap();
        f.provisioner
            .terminate_sandbox(&f.id, Duration::ZERO)
            .await
            .unwrap();
        // The next check is at most LIVENESS_EVERY away; `next` wakes for it.
        let started = Instant::now();
        let end = loop {
            let batch = watch.next(LIVENESS_EVERY * 2).await;
            if let Some(end) = batch.end {
                break end;
            }
            assert!(started.elapsed() < LIVENESS_EVERY * 2, "the watch goes on");
        };
        assert!(started.elapsed() <= LIVENESS_EVERY + Duration::from_secs(1));
        assert!(
            matches!(end, ProvisionerError::SandboxTerminated { .. }),
            "{end:?}"
        );
        assert!(watch.sandbox_stopped(), "the watch says why it ended");
    }

    #[tokio::test]
    async fn a_directory_opens_by_descriptor_under_its_virtual_path() {
        let f = fixture().await;
        let before = f.provisioner.sandbox(&f.id).await.unwrap().last_active_at;
        let (path, fd) = f.provisioner.open_watch_dir(&f.id, "sub").await.unwrap();
        assert_eq!(path.relative(), "projects/a/sub");
        // The descriptor is the directory itself: its child is there by name.
        let root = WorkspaceRoot::from_dir_fd(fd).unwrap();
        assert_eq!(root.stat("deeper").unwrap().kind, warren_fs::Kind::Dir);
        let (_, fd) = f.provisioner.open_watch_dir(&f.id, ".").await.unwrap();
        assert!(warren_fs::open_child_dir(fd.as_fd(), "sub".as_ref()).is_ok());
        // Opening a watch is not activity.
        let after = f.provisioner.sandbox(&f.id).await.unwrap().last_active_at;
        assert_eq!(before, after);
    }

    #[tokio::test]
    async fn links_parents_and_paths_outside_the_mounts_are_refused() {
        let f = fixture().await;
        let refused =
            |result: Result<(VirtualPath, OwnedFd), ProvisionerError>| result.expect_err("refused");
        for link in ["link", "rel_link", "link/x", "rel_link/deeper"] {
            let error = refused(f.provisioner.open_watch_dir(&f.id, link).await);
            assert!(
                matches!(
                    error,
                    ProvisionerError::File {
                        source: FsError::SymlinkRefused { .. },
                        ..
                    }
                ),
                "{link}: {error:?}"
            );
        }
        for outside in ["../b", "sub/../../x", "/etc", "/proc/self"] {
            let error = refused(f.provisioner.open_watch_dir(&f.id, outside).await);
            assert!(
                matches!(error, ProvisionerError::Invalid(_)),
                "{outside}: {error:?}"
            );
            // No host path in what a client is shown (I1).
            let message = error.public_message();
            assert!(!message.contains(f.data_dir.to_str().unwrap()), "{message}");
        }
        let error = refused(f.provisioner.open_watch_dir(&f.id, "file").await);
        assert!(matches!(
            error,
            ProvisionerError::File {
                source: FsError::NotADirectory { .. },
                ..
            }
        ));
        let error = refused(f.provisioner.open_watch_dir(&f.id, "missing").await);
        assert!(matches!(
            error,
            ProvisionerError::File {
                source: FsError::NotFound { .. },
                ..
            }
        ));
        assert!(f.workdir.join("link").is_symlink());
    }
}
