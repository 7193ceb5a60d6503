//! Kubernetes where no kube-apiserver or kubelet can be installed (issue 15): a small
//! stateful API server (`api`) that the real `kube::Client` talks to over real HTTP, and a
//! test-side kubelet (`kubelet`) that runs the pods it is told about on this machine.
//!
//! A real cluster (`real`, issue 39) now runs here too, and holds the backend to the rules
//! a real kubelet enforces; the fakes stay for what a real API server cannot be made to do
//! on demand (faults, 429s and 5xx, 410 storms, newer fields).
//!
//! Both are fakes, named as such: admission, scheduling, kube-proxy and a real kubelet are
//! not exercised. PyPI's `kmock` (0.8) was the first choice for the API server and is not
//! enough: its Kubernetes emulator answers every list with `resourceVersion: "..."`,
//! filters by namespace and name only (no label or field selectors), replays every object
//! on each watch whatever resourceVersion it is asked from, and never answers 410 Gone:
//! the backend's discovery, readiness watch and relist rely on all four. They meet at [`Kubelet`]: the API server tells its kubelet about every
//! pod created and deleted, and the kubelet reports each pod's status back through a
//! [`StatusReporter`], as a real kubelet patches `pods/status`.

pub mod api;
pub mod kubelet;
pub mod real;

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
