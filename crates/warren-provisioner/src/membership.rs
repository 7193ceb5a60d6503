//! This node's membership of the cluster (issue 14): registered in the state store under
//! its node id with a lease it renews every third of the TTL, and left cleanly when the
//! server stops.
//!
//! Membership is the ground ownership of runtimes will stand on: a node whose epoch was
//! superseded (another process registered its id) or whose lease lapsed (it was paused or
//! cut off for longer than the TTL) can no longer renew, so it registers again with a new
//! epoch and says so loudly; every replica judges lapses by the same clock, the store's.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_store::NodeRecord;

use crate::ownership::fence_deadline;
use crate::{Provisioner, ProvisionerError};

/// How often the watchdog looks at the time since the last renewal.
const WATCHDOG_TICK: Duration = Duration::from_millis(200);

/// Longest node id: DNS label length, so it can name a host or a pod.
const MAX_NODE_ID: usize = 63;

/// Who this node is in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Unique among the replicas sharing a state store: letters, digits, `.`, `_`, `-`.
    pub node_id: String,
    /// The internal URL other replicas reach this node at.
    pub advertise: String,
    /// How long the node's lease lasts unless renewed.
    pub ttl: Duration,
}

impl NodeIdentity {
    /// A checked identity: the id 1 to 63 letters, digits, `.`, `_` or `-`, starting with a
    /// letter or digit; the URL `http(s)://`; the TTL between 3 s and 10 min.
    pub fn new(
        node_id: impl Into<String>,
        advertise: impl Into<String>,
        ttl: Duration,
    ) -> Result<Self, ProvisionerError> {
        let node_id = node_id.into();
        let advertise = advertise.into();
        let id_ok = !node_id.is_empty()
            && node_id.len() <= MAX_NODE_ID
            && node_id.starts_with(|c: char| c.is_ascii_alphanumeric())
            && node_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !id_ok {
            return Err(ProvisionerError::InvalidNode(format!(
                "node id {:?} must be 1 to {MAX_NODE_ID} letters, digits, '.', '_' or '-', \
                 starting with a letter or digit",
                node_id.chars().take(80).collect::<String>()
            )));
        }
        let url_ok = advertise
            .strip_prefix("http://")
            .or_else(|| advertise.strip_prefix("https://"))
            .is_some_and(|rest| {
                !rest.is_empty()
                    && !rest.starts_with('/')
                    && !rest.chars().any(|c| c.is_whitespace() || c.is_control())
            });
        if !url_ok {
            return Err(ProvisionerError::InvalidNode(format!(
                "advertise URL {:?} must be an http:// or https:// URL other replicas can reach",
                advertise.chars().take(100).collect::<String>()
            )));
        }
        if !(Duration::from_secs(3)..=Duration::from_secs(600)).contains(&ttl) {
            return Err(ProvisionerError::InvalidNode(format!(
                "the node lease TTL must be between 3 and 600 seconds, not {}",
                ttl.as_secs_f64()
            )));
        }
        Ok(Self {
            node_id,
            advertise,
            ttl,
        })
    }
}

/// Checks that `dir` can hold the UserWorkspaces, shared by several nodes or not: atomic
/// replace, `RENAME_EXCHANGE`, `flock` on directories, and (as root) handing files to the
/// sandbox user ([`warren_fs::check_shared_dir`]). Run once at start-up.
pub fn check_workspace_dir(dir: &std::path::Path) -> Result<(), ProvisionerError> {
    let owner = rustix::process::geteuid()
        .is_root()
        .then_some(warren_fs::Owner::WORKSPACE);
    warren_fs::check_shared_dir(dir, owner).map_err(|source| ProvisionerError::File {
        path: "the workspace directory".to_owned(),
        source,
    })
}

/// The node's current epoch, 0 before it joined.
#[derive(Debug, Default)]
pub(crate) struct Epoch(AtomicI64);

impl Epoch {
    fn get(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self, epoch: i64) {
        self.0.store(epoch, Ordering::SeqCst);
    }
}

impl Provisioner {
    /// This node's identity.
    pub fn node(&self) -> &NodeIdentity {
        &self.config.node
    }

    /// Registers this node with a new epoch and a fresh lease.
    pub async fn join_cluster(&self) -> Result<NodeRecord, ProvisionerError> {
        let node = &self.config.node;
        let sent = Instant::now();
        let record = self
            .bounded(
                self.store
                    .register_node(&node.node_id, &node.advertise, node.ttl),
            )
            .await?;
        self.epoch.set(record.epoch);
        self.ownership.renewed(sent);
        tracing::info!(node = %record.node_id, epoch = record.epoch, advertise = %record.advertise, ttl_s = node.ttl.as_secs(), "joined the cluster");
        Ok(record)
    }

    /// A membership call to the store, bounded by a third of the TTL: one that hangs (a
    /// partition) fails and is tried again at the next tick.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, warren_store::StoreError>>,
    ) -> Result<T, ProvisionerError> {
        match tokio::time::timeout(self.config.node.ttl / 3, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(ProvisionerError::NodeFenced {
                node: self.config.node.node_id.clone(),
            }),
        }
    }

    /// Joins again with a new epoch once a fence is complete, and lifts it.
    async fn rejoin_after_fence(&self) -> Result<NodeRecord, ProvisionerError> {
        // The fence's kills finish before anything of this node may run again.
        let _fencing = self.ownership.fencing.lock().await;
        let record = self.join_cluster().await?;
        self.unfence();
        Ok(record)
    }

    /// One renewal of this node's lease. A superseded or lapsed epoch fences this node
    /// first (its runtimes may be taken over by now) and registers again; so does a node
    /// that fenced itself because renewals failed for too long. Only the store calls are
    /// bounded in time: a fence, once begun, is never cut short.
    pub async fn renew_membership(&self) -> Result<NodeRecord, ProvisionerError> {
        let node = &self.config.node;
        let epoch = self.epoch.get();
        if self.ownership.is_fenced() {
            return self.rejoin_after_fence().await;
        }
        let sent = Instant::now();
        match self
            .bounded(self.store.renew_node(&node.node_id, epoch, node.ttl))
            .await?
        {
            Some(record) => {
                self.ownership.renewed(sent);
                Ok(record)
            }
            None if self.is_clustered() => {
                tracing::error!(node = %node.node_id, epoch, "this node's lease lapsed or another process registered its id; fencing, then joining again with a new epoch");
                self.fence_self().await;
                self.rejoin_after_fence().await
            }
            None => {
                // The only server on its store (no other replica can have taken anything
                // over): it joins again and keeps its runtimes at the new epoch.
                tracing::warn!(node = %node.node_id, epoch, "this node's lease lapsed (the state store was out of reach); joining again with a new epoch and keeping its runtimes");
                let record = self.join_cluster().await?;
                self.readopt_owned().await?;
                Ok(record)
            }
        }
    }

    /// Renews the lease every third of the TTL until the node leaves; a renewal that
    /// fails (the store unreachable, or no answer within a third of the TTL) is retried
    /// at the next tick. Beside it
    /// a watchdog fences this node once no renewal succeeded for [`fence_deadline`] of the
    /// TTL, whatever the renewal itself is stuck on.
    pub fn spawn_membership(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let provisioner = Arc::clone(self);
        let watchdog = Arc::clone(self);
        let limit = fence_deadline(self.config.node.ttl);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCHDOG_TICK).await;
                if watchdog.ownership.has_left() {
                    return;
                }
                // Only a replica among others fences itself: a lone server's runtimes can
                // be taken by nobody, so it keeps them through an outage of its store.
                if watchdog.is_clustered()
                    && !watchdog.ownership.is_fenced()
                    && watchdog.ownership.overdue(limit)
                {
                    watchdog.fence_self().await;
                }
            }
        });
        tokio::spawn(async move {
            let every = provisioner.config.node.ttl / 3;
            // Renewals go on through a shutdown's drain, which may outlast the TTL: the
            // runtimes being handed back are still this node's until then.
            loop {
                tokio::time::sleep(every).await;
                if provisioner.ownership.has_left() {
                    return;
                }
                if let Err(error) = provisioner.renew_membership().await {
                    tracing::warn!(%error, "could not renew this node's lease; retrying");
                }
            }
        })
    }

    /// Ends this node's lease now: the server is stopping. Renewals stop.
    pub async fn leave_cluster(&self) -> Result<bool, ProvisionerError> {
        let node = &self.config.node;
        self.ownership.leave();
        Ok(self
            .store
            .leave_node(&node.node_id, self.epoch.get())
            .await?)
    }

    /// Every node registered in the state store, by id.
    pub async fn cluster_nodes(&self) -> Result<Vec<NodeRecord>, ProvisionerError> {
        Ok(self.store.list_nodes().await?)
    }

    /// Every runtime some node owns, as the state store records it.
    pub async fn runtime_owners(
        &self,
    ) -> Result<Vec<warren_store::RuntimeOwner>, ProvisionerError> {
        Ok(self.store.runtime_owners().await?)
    }

    /// This node's current epoch (0 before it joined).
    pub fn node_epoch(&self) -> i64 {
        self.epoch.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_identity_is_checked_in_words() {
        let ttl = Duration::from_secs(15);
        assert!(NodeIdentity::new("node-a.1_x", "http://10.0.0.1:7878", ttl).is_ok());
        for bad in ["", "-a", "a b", "a/b", &"a".repeat(64)] {
            let err = NodeIdentity::new(bad, "http://x", ttl).unwrap_err();
            assert!(err.to_string().contains("node id"), "{bad}: {err}");
        }
        for bad in [
            "10.0.0.1:7878",
            "ftp://x",
            "http://",
            "http:///x",
            "http://a b",
        ] {
            let err = NodeIdentity::new("a", bad, ttl).unwrap_err();
            assert!(err.to_string().contains("advertise URL"), "{bad}: {err}");
        }
        for bad in [Duration::from_secs(2), Duration::from_secs(601)] {
            let err = NodeIdentity::new("a", "http://x", bad).unwrap_err();
            assert!(err.to_string().contains("TTL"), "{bad:?}: {err}");
        }
    }
}
