//! Kubernetes for tests, faked (issue 15; moved out of the test support crate by issue 39):
//! a small stateful API server ([`api`]) that the real `kube::Client` talks to over real
//! HTTP, and a test-side kubelet ([`kubelet`]) that runs the pods it is told about on this
//! machine. Both are fakes, named as such.
//!
//! A real single-node cluster (`scripts/k8s-cluster`, 1.20.2) now runs in CI and holds the
//! Kubernetes backend to what a real API server and kubelet do (`kubernetes_real::` tests).
//! This crate stays for what a real cluster cannot be made to do on demand: injected faults
//! (429, 5xx, a refused connection, a 409 or 410 on the n-th request), 410 storms on
//! watches, fields newer than 1.20 (validated offline against the 1.37 schemas), a kubelet
//! that reports any state a test needs (an unpullable image, an unschedulable pod), a
//! request log (what the RBAC test reads), and speed (its tests run in the main suite in
//! parallel, where a real pod needs one of the node's two CPUs).
//!
//! The API server behaviours it emulates, and which the real-cluster run now checks
//! against kube-apiserver 1.20.2:
//!
//! | emulated here | checked on the real cluster by |
//! |---|---|
//! | create, get, list of pods, services, network policies; `uid`, `resourceVersion`, `creationTimestamp` | every `kubernetes_real::` test (each makes and reads its sandbox's objects) |
//! | label selectors on lists and watches | `discover`'s listing at start-up: `a_runtime_survives_a_killed_server_and_is_adopted_after_restart` |
//! | watch from a resourceVersion, pods' status changes as events | readiness on every sandbox create; `destroy_leaves_nothing_running_and_keeps_the_workspace` (destroy waits, by watch, until nothing runs) |
//! | delete with a grace period, uid preconditions | `one_identity_gets_one_runtime_and_a_new_generation_starts_fresh` (a pod of the same name replaces a stopped one) |
//! | a pod's container states as the kubelet reports them (waiting, running, terminated) | `destroy_leaves_nothing_running_and_keeps_the_workspace` (waits until no container runs) |
//! | init containers before the main one, their mounts of the claims' subPaths | `files_cross_the_boundary_and_the_claims_are_migrated_once_to_1000` |
//! | authorization of each request (not modelled: the request log is compared with the Role) | `warren_deployed_from_its_manifests_runs_sandboxes_with_its_role_alone` (the real RBAC authoriser) |
//!
//! Not checked on the real cluster, so emulated only: `410 Expired` on a compacted watch
//! (`a_readiness_watch_that_expires_is_resumed_and_the_pod_still_ready`), 429/5xx retries
//! and refused connections (`the_clusters_errors_are_mapped_and_retried_where_kubernetes_allows`),
//! an image that cannot be pulled and a pod that cannot be scheduled (their waiting
//! reasons), a container's terminated reasons, and egress through
//! warren's proxy under a sandbox's policy
//! (`a_pods_egress_goes_through_warrens_proxy_under_its_sandboxs_policy`). NetworkPolicy is
//! enforced by neither: the real cluster's bridge CNI stores policies and enforces none,
//! and the fake stores them for the tests to read back.
//!
//! They meet at [`Kubelet`]: the API server tells its kubelet about every pod created and
//! deleted, and the kubelet reports each pod's status back through a [`StatusReporter`], as
//! a real kubelet patches `pods/status`. PyPI's `kmock` (0.8) was the first choice for the
//! API server and is not enough: its Kubernetes emulator answers every list with
//! `resourceVersion: "..."`, filters by namespace and name only (no label or field
//! selectors), replays every object on each watch whatever resourceVersion it is asked
//! from, and never answers 410 Gone: the backend's discovery, readiness watch and relist
//! rely on all four.

pub mod api;
pub mod kubelet;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// What runs the pods an API server holds.
pub trait Kubelet: Send + Sync + 'static {
    /// A pod was created (its `metadata` complete: name, namespace, uid, resourceVersion).
    /// The kubelet starts it in the background and reports through `status` as it goes;
    /// it must not block.
    fn pod_created(&self, pod: Pod, status: StatusReporter);
    /// A pod was deleted: everything of it stops and is cleaned up. Must not block long.
    fn pod_deleted(&self, namespace: &str, name: &str);
}

/// How a kubelet reports a pod's status: each call replaces the pod's whole `status`
/// (a new resourceVersion, a `MODIFIED` watch event), as long as the pod exists.
#[derive(Clone)]
pub struct StatusReporter {
    report: Arc<dyn Fn(PodStatus) + Send + Sync>,
}

impl StatusReporter {
    /// A reporter calling `report` with each new status.
    pub fn new(report: impl Fn(PodStatus) + Send + Sync + 'static) -> Self {
        Self {
            report: Arc::new(report),
        }
    }

    /// Replaces the pod's status.
    pub fn update(&self, status: PodStatus) {
        (self.report)(status)
    }
}

/// A Kubernetes cluster for tests: the fake API server, the simulated kubelet running its
/// pods on this machine, and the directories standing in for the two claims (warren's
/// workspace directory is the SKILLS claim, its `user-data/` the USER_DATA claim, as
/// `warren k8s manifests` mounts them).
pub struct TestCluster {
    /// The API server.
    pub api: api::FakeApiServer,
    /// Its kubelet.
    pub kubelet: Arc<kubelet::SimulatedKubelet>,
    /// warren's workspace directory (the claims).
    pub workspace: tempfile::TempDir,
    _state: tempfile::TempDir,
}

/// The namespace of the test cluster's sandboxes.
pub const NAMESPACE: &str = "warren-test";
/// The USER_DATA claim's name.
pub const USER_DATA_CLAIM: &str = "warren-user-data";
/// The SKILLS claim's name.
pub const SKILLS_CLAIM: &str = "warren-skills";
/// The "image" of test sandboxes: the simulated kubelet runs every image as the host's
/// own root filesystem.
pub const SANDBOX_IMAGE: &str = "debian-test:1";
/// An image the simulated kubelet cannot pull.
pub const UNPULLABLE_IMAGE: &str = "registry.invalid/missing:1";

impl TestCluster {
    /// A fresh cluster whose containers naming `warren` run `bin`.
    pub fn start(bin: &std::path::Path) -> Self {
        let workspace = tempfile::tempdir().expect("a workspace directory");
        std::fs::create_dir_all(workspace.path().join("user-data")).expect("the user-data claim");
        let state = tempfile::tempdir().expect("the kubelet's state directory");
        let kubelet = Arc::new(kubelet::SimulatedKubelet::new(kubelet::KubeletConfig {
            warren_binary: bin.to_owned(),
            claims: std::collections::BTreeMap::from([
                (
                    USER_DATA_CLAIM.to_owned(),
                    workspace.path().join("user-data"),
                ),
                (SKILLS_CLAIM.to_owned(), workspace.path().to_owned()),
            ]),
            state_dir: state.path().to_owned(),
            unpullable_images: vec![UNPULLABLE_IMAGE.to_owned()],
            cpu_capacity_millis: 64_000,
        }));
        let api = api::FakeApiServer::start(Some(kubelet.clone() as Arc<dyn Kubelet>));
        Self {
            api,
            kubelet,
            workspace,
            _state: state,
        }
    }

    /// A warren.toml that serves this cluster with the Kubernetes backend (instance
    /// `instance`), `extra` appended to its `[kubernetes]` section.
    pub fn config(&self, instance: &str, extra: &str) -> String {
        format!(
            r#"backend = "kubernetes"
workspace_dir = "{workspace}"

[kubernetes]
image = "{SANDBOX_IMAGE}"
namespace = "{NAMESPACE}"
warren_image = "warren-image:test"
user_data_claim = "{USER_DATA_CLAIM}"
skills_claim = "{SKILLS_CLAIM}"
service_type = "ClusterIP"
instance = "{instance}"
api_url = "{url}"
agent_clients_cidr = "10.232.0.0/16"
ready_timeout_s = 60
# Pods reach warren's proxy at their node's address (the host side of their veth here).
proxy_port = 0
proxy_host = "node"
{extra}
[kubernetes.warren_pod_labels]
"app.kubernetes.io/name" = "warren"
"#,
            workspace = self.workspace.path().display(),
            url = self.api.url(),
        )
    }
}
