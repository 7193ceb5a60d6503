//! What bounds every watch of a sandbox, and the watchers a client polls.
//!
//! **Slots.** Each watch ([`Provisioner::watch_dir`]: a stream of any wire, or a
//! watcher) holds one of its sandbox's [`MAX_WATCHES_PER_SANDBOX`] slots while it lives.
//!
//! **Watchers.** A watcher is a watch whose events wait in an inbox until its client polls
//! ([`Provisioner::watcher_changes`]): at most [`MAX_WATCHER_BACKLOG`] undelivered events
//! (the oldest go first); one nobody polled for [`WATCHER_IDLE`] or whose sandbox no
//! longer runs is forgotten. One whose directory went away tells every poll so. A watcher lives
//! on the node that made it. Neither watching nor polling counts as sandbox activity.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use warren_core::{SandboxId, VirtualPath};

use super::{DirWatch, WatchBatch, WatchChange};
use crate::{Provisioner, ProvisionerError};

/// The most watches one sandbox holds at once, streams and watchers together.
pub const MAX_WATCHES_PER_SANDBOX: usize = 8;

/// The most undelivered events a watcher keeps.
pub const MAX_WATCHER_BACKLOG: usize = 4096;

/// How long a watcher lives without a poll.
pub const WATCHER_IDLE: Duration = Duration::from_secs(10 * 60);

/// How often a watcher lists its directory between polls where it polls (inotify cannot
/// be had); a poll lists once more before answering.
const WATCHER_TICK: Duration = Duration::from_millis(500);

/// How often a watch checks that its sandbox still runs.
pub const LIVENESS_EVERY: Duration = Duration::from_secs(5);

/// How long a poll waits for its watcher to take in what the kernel holds.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Every watch of this node: the watchers by id, and how many watches each sandbox holds.
#[derive(Default)]
pub(crate) struct Watches {
    inner: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    watchers: HashMap<String, Arc<Watcher>>,
    active: HashMap<SandboxId, usize>,
}

impl Watches {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        // Plain maps behind the lock: still usable after a panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one of the sandbox's watch slots, refused when all are taken.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        sandbox: &SandboxId,
    ) -> Result<WatchSlot, ProvisionerError> {
        let mut registry = self.registry();
        let count = registry.active.entry(sandbox.clone()).or_default();
        if *count >= MAX_WATCHES_PER_SANDBOX {
            return Err(ProvisionerError::TooManyWatches {
                max: MAX_WATCHES_PER_SANDBOX,
            });
        }
        *count += 1;
        Ok(WatchSlot {
            watches: Arc::clone(self),
            sandbox: sandbox.clone(),
        })
    }

    /// The sandbox's watcher `id`; another sandbox's is not found.
    fn get(&self, sandbox: &SandboxId, id: &str) -> Option<Arc<Watcher>> {
        self.registry()
            .watchers
            .get(id)
            .filter(|watcher| &watcher.sandbox == sandbox)
            .cloned()
    }

    /// Forgets the sandbox's watcher `id`; whether it existed.
    fn remove(&self, sandbox: &SandboxId, id: &str) -> bool {
        let mut registry = self.registry();
        let owned = registry
            .watchers
            .get(id)
            .is_some_and(|watcher| &watcher.sandbox == sandbox);
        let removed = owned.then(|| registry.watchers.remove(id)).flatten();
        // The lock goes before the watcher: its slot takes the lock to give itself back.
        drop(registry);
        removed.is_some()
    }
}

/// One of a sandbox's watch slots, given back when dropped.
pub struct WatchSlot {
    watches: Arc<Watches>,
    sandbox: SandboxId,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut registry = self.watches.registry();
        if let Some(count) = registry.active.get_mut(&self.sandbox) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                registry.active.remove(&self.sandbox);
            }
        }
    }
}

/// What a watcher's poll takes: the events since the last one, relative to `base`.
#[derive(Debug)]
pub struct WatcherChanges {
    /// The watched directory.
    pub base: VirtualPath,
    /// What changed, in order.
    pub changes: Vec<WatchChange>,
}

/// A watcher: its events wait in an inbox until a poll takes them. Its task owns the watch
/// and ends when the watcher is dropped (its `flush` sender with it).
struct Watcher {
    sandbox: SandboxId,
    base: VirtualPath,
    inbox: Arc<Mutex<Inbox>>,
    /// Asks the task to take in everything the watch holds now, answering when it has.
    flush: mpsc::Sender<oneshot::Sender<()>>,
}

struct Inbox {
    backlog: VecDeque<WatchChange>,
    /// Why the watch ended (the directory went away); told once the backlog is drained.
    failed: Option<ProvisionerError>,
    last_polled: Instant,
}

impl Inbox {
    fn deliver(&mut self, batch: WatchBatch) {
        for change in batch.changes {
            if self.backlog.len() >= MAX_WATCHER_BACKLOG {
                // Bounded: the newest events are the ones a late poller needs.
                self.backlog.pop_front();
            }
            self.backlog.push_back(change);
        }
        if self.failed.is_none() {
            self.failed = batch.end;
        }
    }
}

fn lock(inbox: &Mutex<Inbox>) -> MutexGuard<'_, Inbox> {
    inbox.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Provisioner {
    /// Starts a watcher of the directory `path` of the sandbox ([`Provisioner::watch_dir`]);
    /// returns its id, which [`Provisioner::watcher_changes`] polls.
    pub async fn create_watcher(
        self: &Arc<Self>,
        id: &SandboxId,
        path: &str,
        recursive: bool,
        include_entry: bool,
    ) -> Result<String, ProvisionerError> {
        let (base, watch) = self
            .watch_dir(id, path, recursive, include_entry, WATCHER_TICK)
            .await?;
        let watcher_id = uuid::Uuid::new_v4().simple().to_string();
        let inbox = Arc::new(Mutex::new(Inbox {
            backlog: VecDeque::new(),
            failed: None,
            last_polled: Instant::now(),
        }));
        let (flush, requests) = mpsc::channel(8);
        let watcher = Arc::new(Watcher {
            sandbox: id.clone(),
            base,
            inbox: Arc::clone(&inbox),
            flush,
        });
        self.watches
            .registry()
            .watchers
            .insert(watcher_id.clone(), watcher);
        tokio::spawn(Arc::clone(self).run_watcher(
            watcher_id.clone(),
            id.clone(),
            watch,
            inbox,
            requests,
        ));
        Ok(watcher_id)
    }

    /// What the watcher saw since the last poll, everything the kernel holds taken in
    /// first. Once its directory went away and everything before was taken, polls fail
    /// with why.
    pub async fn watcher_changes(
        &self,
        id: &SandboxId,
        watcher_id: &str,
    ) -> Result<WatcherChanges, ProvisionerError> {
        let watcher = self
            .watches
            .get(id, watcher_id)
            .ok_or_else(|| watcher_not_found(watcher_id))?;
        lock(&watcher.inbox).last_polled = Instant::now();
        let (reply, flushed) = oneshot::channel();
        // A busy or finished task answers with what the inbox holds.
        let _ = tokio::time::timeout(FLUSH_WAIT, async {
            if watcher.flush.send(reply).await.is_ok() {
                let _ = flushed.await;
            }
        })
        .await;
        let mut inbox = lock(&watcher.inbox);
        let changes: Vec<WatchChange> = inbox.backlog.drain(..).collect();
        if changes.is_empty() {
            if let Some(error) = &inbox.failed {
                // Told on every poll until the client removes the watcher.
                return Err(match error {
                    ProvisionerError::WatchedDirGone { path } => {
                        ProvisionerError::WatchedDirGone { path: path.clone() }
                    }
                    _ => ProvisionerError::WatchFailed,
                });
            }
        }
        Ok(WatcherChanges {
            base: watcher.base.clone(),
            changes,
        })
    }

    /// Forgets a watcher (its task and watch end with it).
    pub fn remove_watcher(&self, id: &SandboxId, watcher_id: &str) -> Result<(), ProvisionerError> {
        if self.watches.remove(id, watcher_id) {
            Ok(())
        } else {
            Err(watcher_not_found(watcher_id))
        }
    }

    /// Runs a watcher's watch until the watcher is removed, idle, or its sandbox no longer
    /// runs: events go to the inbox as the kernel (or a polling tick) reports them, and a
    /// poll's flush request takes in everything there is before it is answered.
    async fn run_watcher(
        self: Arc<Self>,
        watcher_id: String,
        sandbox: SandboxId,
        mut watch: DirWatch,
        inbox: Arc<Mutex<Inbox>>,
        mut flush: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        let mut ended = false;
        let mut checked = Instant::now();
        loop {
            tokio::select! {
                biased;
                request = flush.recv() => {
                    let Some(reply) = request else {
                        return; // the watcher was removed
                    };
                    if !ended {
                        let batch = watch.flush().await;
                        ended = batch.end.is_some();
                        lock(&inbox).deliver(batch);
                    }
                    let _ = reply.send(());
                }
                batch = watch.next(LIVENESS_EVERY), if !ended => {
                    ended = batch.end.is_some();
                    lock(&inbox).deliver(batch);
                }
                () = tokio::time::sleep(LIVENESS_EVERY), if ended => {}
            }
            let idle = lock(&inbox).last_polled.elapsed() >= WATCHER_IDLE;
            // A running watch asks itself whether its sandbox still runs; one that ended
            // for another reason (its directory went) no longer does, so this asks for it.
            let dead = watch.sandbox_stopped()
                || (ended && checked.elapsed() >= LIVENESS_EVERY && {
                    checked = Instant::now();
                    super::watch_ended(self.store.as_ref(), &sandbox)
                        .await
                        .is_some()
                });
            if idle || dead || self.is_shutting_down() {
                self.watches.remove(&sandbox, &watcher_id);
                return;
            }
        }
    }
}

fn watcher_not_found(id: &str) -> ProvisionerError {
    ProvisionerError::WatcherNotFound {
        watcher: id.chars().take(100).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(scope: &str) -> SandboxId {
        SandboxId::derive(
            &warren_core::Uid::new("alice").unwrap(),
            &warren_core::RuntimeScope::new(scope).unwrap(),
        )
    }

    #[test]
    fn a_sandbox_holds_a_bounded_number_of_watches_and_gets_each_back() {
        let watches = Arc::new(Watches::default());
        let (a, b) = (sandbox("a"), sandbox("b"));
        let slots: Vec<WatchSlot> = (0..MAX_WATCHES_PER_SANDBOX)
            .map(|_| watches.acquire(&a).unwrap())
            .collect();
        assert!(matches!(
            watches.acquire(&a),
            Err(ProvisionerError::TooManyWatches { .. })
        ));
        // Another sandbox's slots are its own.
        let other = watches.acquire(&b).unwrap();
        drop(slots);
        assert!(watches.acquire(&a).is_ok());
        drop(other);
        assert!(watches.registry().active.is_empty());
    }
}
