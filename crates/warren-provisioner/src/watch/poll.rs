//! Polled watches: the directory listed every tick and two listings diffed (`diff.rs`).
//!
//! Two kinds of directory are polled. One of a persistent mount where inotify cannot be had
//! (out of instances or watches) is listed by its descriptor, as the inotify watch would
//! have watched it. One of the runtime's own tree (`/tmp`, the home, the image's files) is
//! listed by the runtime's agent as the sandbox user, resolved beneath the runtime's root
//! exactly as a read of it is (`files.rs`); warren holds no descriptor there to put an
//! inotify watch on.
//!
//! A runtime watch never keeps its runtime up: its first listing starts the runtime like
//! any runtime file operation (I12), but no later one starts it again or counts as
//! activity. Once the runtime stops (reaped, lost) the watch ends with `runtime_stopped`;
//! watching again starts it. A paused or ended sandbox ends it with the reason a command
//! would get (`sandbox_paused`, `sandbox_terminated`), as every watch ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_backend::FileOp;
use warren_core::{SandboxId, VirtualPath};
use warren_fs::{FsError, WorkspaceRoot};

use super::diff::{diff, Snapshot};
use super::dir::{directory_gone, file_error, WatchBatch, MAX_WATCHED_ENTRIES};
use crate::files::IfStopped;
use crate::{Provisioner, ProvisionerError};

/// Where a polled watch's listings come from.
pub(super) enum Lister {
    /// A directory of a persistent mount, by its descriptor.
    Host(Arc<WorkspaceRoot>),
    /// A directory of the runtime's own tree, listed by the runtime's agent.
    Runtime {
        provisioner: Arc<Provisioner>,
        sandbox: SandboxId,
        path: VirtualPath,
    },
}

impl Lister {
    /// Lists the directory to `depth` levels: its first listing, or a later one. Only a
    /// runtime's first listing may start the runtime.
    async fn list(
        &self,
        base: &str,
        depth: u32,
        first: bool,
    ) -> Result<Snapshot, ProvisionerError> {
        match self {
            Self::Host(view) => {
                let (view, base) = (Arc::clone(view), base.to_owned());
                tokio::task::spawn_blocking(move || list_host(&view, &base, depth))
                    .await
                    .unwrap_or_else(|error| {
                        tracing::warn!(%error, "a directory watch's listing was interrupted");
                        Err(ProvisionerError::WatchFailed)
                    })
            }
            Self::Runtime {
                provisioner,
                sandbox,
                path,
            } => list_runtime(provisioner, sandbox, path, base, depth, first).await,
        }
    }
}

/// How many levels a watch lists.
fn depth(recursive: bool) -> u32 {
    if recursive {
        warren_fs::MAX_WALK_DEPTH
    } else {
        1
    }
}

/// A watch that lists its directory every tick and diffs the snapshots.
pub(super) struct Poller {
    lister: Lister,
    base: String,
    depth: u32,
    tick: Duration,
    next_at: Instant,
    snapshot: Snapshot,
}

impl Poller {
    /// Takes the first snapshot. A tree too large to list, or a directory that is not
    /// there, fails here.
    pub(super) async fn open(
        lister: Lister,
        base: String,
        recursive: bool,
        tick: Duration,
    ) -> Result<Self, ProvisionerError> {
        let depth = depth(recursive);
        let snapshot = lister.list(&base, depth, true).await?;
        Ok(Self::from_snapshot(lister, base, depth, tick, snapshot))
    }

    /// [`Self::open`] of a persistent mount's directory, listed on this thread (an inotify
    /// watch that ran out of watches turns into this once, and must not lose the switch to
    /// a cancelled await).
    pub(super) fn open_host_here(
        view: Arc<WorkspaceRoot>,
        base: String,
        recursive: bool,
        tick: Duration,
    ) -> Result<Self, ProvisionerError> {
        let depth = depth(recursive);
        let snapshot = list_host(&view, &base, depth)?;
        Ok(Self::from_snapshot(
            Lister::Host(view),
            base,
            depth,
            tick,
            snapshot,
        ))
    }

    fn from_snapshot(
        lister: Lister,
        base: String,
        depth: u32,
        tick: Duration,
        snapshot: Snapshot,
    ) -> Self {
        Self {
            lister,
            base,
            depth,
            tick,
            next_at: Instant::now() + tick,
            snapshot,
        }
    }

    /// Whether it watches the runtime's own tree.
    pub(super) fn in_runtime(&self) -> bool {
        matches!(self.lister, Lister::Runtime { .. })
    }

    /// Waits until the next tick (at most `wait`) and diffs, if the tick came.
    pub(super) async fn next(&mut self, wait: Duration) -> WatchBatch {
        let until = self.next_at.min(Instant::now() + wait);
        tokio::time::sleep_until(until.into()).await;
        if Instant::now() < self.next_at {
            return WatchBatch::default();
        }
        self.poll().await
    }

    /// Lists now and diffs against the last snapshot.
    pub(super) async fn poll(&mut self) -> WatchBatch {
        self.next_at = Instant::now() + self.tick;
        match self.lister.list(&self.base, self.depth, false).await {
            Ok(now) => {
                let changes = diff(&self.snapshot, &now);
                self.snapshot = now;
                WatchBatch { changes, end: None }
            }
            Err(error) => WatchBatch {
                changes: Vec::new(),
                end: Some(error),
            },
        }
    }
}

/// The refusal of a watch too large to list.
fn too_large(base: &str, depth: u32, what: &str) -> ProvisionerError {
    ProvisionerError::WatchTooLarge {
        path: base.to_owned(),
        reason: format!(
            "{what}; watch a smaller directory{}",
            if depth > 1 { " or not recursively" } else { "" }
        ),
    }
}

/// Lists the watched directory to `depth` by its descriptor, at most
/// [`MAX_WATCHED_ENTRIES`]; a directory that was removed (no links left) ends the watch.
fn list_host(view: &WorkspaceRoot, base: &str, depth: u32) -> Result<Snapshot, ProvisionerError> {
    let this = view.stat("").map_err(|e| file_error(base, e))?;
    if this.links == 0 {
        return Err(directory_gone(base));
    }
    let listing = view
        .list("", depth, MAX_WATCHED_ENTRIES)
        .map_err(|e| file_error(base, e))?;
    if listing.truncated {
        return Err(too_large(
            base,
            depth,
            &format!("more than {MAX_WATCHED_ENTRIES} entries to watch"),
        ));
    }
    Ok(Snapshot::of_listing("", listing.entries))
}

/// Lists a directory of the runtime's tree (`base` is its virtual path) to `depth`
/// through its agent; only the first listing may start the runtime. Once the directory is
/// no longer there (or no longer a directory), the watch is over.
async fn list_runtime(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    path: &VirtualPath,
    base: &str,
    depth: u32,
    first: bool,
) -> Result<Snapshot, ProvisionerError> {
    let op = FileOp::List {
        path: base.to_owned(),
        depth,
        limit: MAX_WATCHED_ENTRIES,
    };
    let if_stopped = if first {
        IfStopped::Start
    } else {
        IfStopped::Refuse
    };
    let listing = match provisioner
        .listed_in_runtime(sandbox, path.clone(), op, if_stopped)
        .await
    {
        Ok(listed) => listed.value,
        Err(ProvisionerError::File {
            source: FsError::NotFound { .. } | FsError::NotADirectory { .. },
            ..
        }) if !first => return Err(directory_gone(base)),
        Err(error) => return Err(error),
    };
    if listing.truncated {
        // Cut at the limit, or where the answer filled the agent's frame.
        return Err(too_large(
            base,
            depth,
            &format!(
                "more entries to watch than one listing holds (at most {MAX_WATCHED_ENTRIES})"
            ),
        ));
    }
    Ok(Snapshot::of_listing(path.relative(), listing.entries))
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use super::*;
    use crate::watch::WatchKind;

    #[tokio::test]
    async fn the_polling_fallback_sees_what_a_listing_sees_and_ends_with_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let watched = dir.path().join("watched");
        std::fs::create_dir(&watched).unwrap();
        let fd = OwnedFd::from(std::fs::File::open(&watched).unwrap());
        let view = Arc::new(WorkspaceRoot::from_dir_fd(fd).unwrap());
        let tick = Duration::from_millis(10);
        let mut poller = Poller::open(Lister::Host(view), "/w/watched".into(), true, tick)
            .await
            .unwrap();
        std::fs::create_dir(watched.join("d")).unwrap();
        std::fs::write(watched.join("d/x.txt"), b"x").unwrap();
        let batch = poller.poll().await;
        let seen: Vec<(&str, WatchKind)> = batch
            .changes
            .iter()
            .map(|c| (c.name.as_str(), c.kind))
            .collect();
        assert_eq!(
            seen,
            [
                ("d", WatchKind::Create),
                ("d/x.txt", WatchKind::Create),
                ("d/x.txt", WatchKind::Write)
            ]
        );
        std::fs::remove_dir_all(&watched).unwrap();
        let end = poller.poll().await.end;
        assert!(
            matches!(&end, Some(ProvisionerError::WatchedDirGone { path }) if path == "/w/watched"),
            "{end:?}"
        );
    }
}
