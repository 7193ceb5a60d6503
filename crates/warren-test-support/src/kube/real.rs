//! A real Kubernetes cluster for tests (issue 39): the single-node cluster that
//! `scripts/k8s-cluster up` starts on this machine (kube-apiserver, kubelet and containerd
//! built from Debian's packages), which `scripts/test` brings up and names in
//! `WARREN_TEST_K8S_KUBECONFIG`.
//!
//! Each [`RealCluster`] is one test's share of it: a namespace of its own, and the two
//! claims warren's pods mount (hostPath volumes on a directory of the test's, bound to
//! exactly those claims), all removed when it is dropped. warren runs on the host, outside
//! the cluster, as an operator's warren does with a kubeconfig: it reaches the API server
//! and its pods over the cluster's veth, from [`HOST_IP`]. Or, with
//! [`RealCluster::for_manifests`], warren runs in the cluster from the manifests `warren k8s
//! manifests` prints, on volumes made for the claims they make.
//!
//! A sandbox pod requests the CPU it is limited to (one CPU by default) and the node has
//! two: these tests run one at a time (`--test-threads=1`, as `scripts/test` runs them), so
//! that the two pods a test may make always fit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The variable naming the cluster's kubeconfig; `scripts/test` sets it.
pub const KUBECONFIG_VAR: &str = "WARREN_TEST_K8S_KUBECONFIG";
/// The host's address on the cluster's network: where pods reach warren's egress proxy and
/// where warren's connections to their agents come from.
pub const HOST_IP: &str = "10.213.0.1";
/// The network warren's connections to agents come from.
pub const AGENT_CLIENTS_CIDR: &str = "10.213.0.0/24";
/// The storage class of the tests' volumes and claims (no provisioner: each volume is made
/// by the test, for one claim).
pub const STORAGE_CLASS: &str = "warren-test";

/// The cluster's kubeconfig. Panics, naming what to run, when no cluster was brought up: a
/// real-cluster test never passes without one.
pub fn kubeconfig() -> PathBuf {
    match std::env::var_os(KUBECONFIG_VAR) {
        Some(path) if Path::new(&path).is_file() => PathBuf::from(path),
        Some(path) => panic!(
            "{KUBECONFIG_VAR}={} names no file: is the cluster down? (scripts/k8s-cluster up)",
            Path::new(&path).display()
        ),
        None => panic!(
            "no real Kubernetes cluster: {KUBECONFIG_VAR} is unset. scripts/test brings one up \
             (scripts/k8s-cluster up) and sets it to /run/warren-k8s/kubeconfig"
        ),
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/k8s-cluster")
}

fn run(command: &mut Command, what: &str) -> Output {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The images sandbox pods run, in the cluster's containerd: the Docker test image (the
/// sandboxes' image) and warren's image (that image with `bin` as warren, for the pods'
/// init containers and agent). Built and imported once per test process; returns warren's.
pub fn warren_image(bin: &Path) -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let meta = std::fs::metadata(bin).expect("the warren binary");
        let stamp = format!(
            "{}-{}-{}",
            meta.len(),
            std::os::unix::fs::MetadataExt::mtime(&meta),
            std::os::unix::fs::MetadataExt::mtime_nsec(&meta)
        );
        let tag = format!(
            "warren-k8s-test:{}",
            &blake3::hash(stamp.as_bytes()).to_hex()[..16]
        );
        let context = tempfile::tempdir().expect("a build context");
        std::fs::copy(bin, context.path().join("warren")).expect("copy the warren binary");
        std::fs::write(
            context.path().join("Dockerfile"),
            format!(
                "FROM {}\nCOPY warren /usr/local/bin/warren\n",
                crate::DOCKER_TEST_IMAGE
            ),
        )
        .expect("write the Dockerfile");
        run(
            Command::new("docker")
                .args(["build", "-q", "-t", &tag])
                .arg(context.path()),
            "docker build of warren's image for the cluster",
        );
        run(
            Command::new("bash")
                .arg(script())
                .args(["import", crate::DOCKER_TEST_IMAGE, &tag]),
            "scripts/k8s-cluster import",
        );
        // Images of earlier builds go: each holds a copy of the binary.
        let tags = run(
            Command::new("docker").args(["images", "warren-k8s-test", "--format", "{{.Tag}}"]),
            "docker images",
        );
        for old in String::from_utf8_lossy(&tags.stdout).lines() {
            if format!("warren-k8s-test:{old}") != tag {
                let _ = Command::new("docker")
                    .args(["rmi", &format!("warren-k8s-test:{old}")])
                    .output();
            }
        }
        tag
    })
}

/// One test's share of the real cluster: its namespace and its two claims.
pub struct RealCluster {
    /// The namespace of this test's sandbox pods.
    pub namespace: String,
    /// warren's workspace directory: the SKILLS claim's volume, its `user-data/` the
    /// USER_DATA claim's.
    pub workspace: tempfile::TempDir,
    /// warren's image, as the cluster knows it.
    pub warren_image: &'static str,
    /// The volume of the state claim of warren running in the cluster
    /// ([`RealCluster::for_manifests`]).
    state: Option<tempfile::TempDir>,
    kubeconfig: PathBuf,
}

/// Whether a volume's claim is made with it, or left for what is applied later.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Claim {
    Made,
    Awaited,
}

impl RealCluster {
    /// A namespace with the two claims, bound to directories of a new workspace.
    pub fn start(bin: &Path) -> Self {
        let cluster = Self::empty(bin, false);
        cluster.volumes(
            &[
                (
                    super::USER_DATA_CLAIM,
                    cluster.workspace.path().join("user-data"),
                ),
                (super::SKILLS_CLAIM, cluster.workspace.path().to_owned()),
            ],
            Claim::Made,
        );
        cluster.wait_bound(2);
        cluster
    }

    /// A namespace for `warren k8s manifests --name <name> --storage-class warren-test`:
    /// the volumes of its three claims (USER_DATA, SKILLS, and the SQLite state), each
    /// bound to the claim of that name once the manifests make it, and the Secret of the
    /// provisioner token `token` (`warren-token/token`). [`RealCluster::wait_bound`] waits
    /// for the claims.
    pub fn for_manifests(bin: &Path, name: &str, token: &str) -> Self {
        let cluster = Self::empty(bin, true);
        let state = cluster.state.as_ref().expect("a state volume").path();
        cluster.volumes(
            &[
                (
                    &format!("{name}-user-data"),
                    cluster.workspace.path().join("user-data"),
                ),
                (
                    &format!("{name}-skills"),
                    cluster.workspace.path().to_owned(),
                ),
                (&format!("{name}-state"), state.to_owned()),
            ],
            Claim::Awaited,
        );
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "warren-token", "namespace": cluster.namespace},
            "stringData": {"token": token},
        });
        cluster.apply(&secret);
        cluster
    }

    /// A new namespace and workspace (and a state directory), nothing in them yet.
    fn empty(bin: &Path, state: bool) -> Self {
        let kubeconfig = kubeconfig();
        let warren_image = warren_image(bin);
        let workspace = tempfile::tempdir().expect("a workspace directory");
        std::fs::create_dir_all(workspace.path().join("user-data")).expect("the user-data claim");
        let namespace = format!("wt-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let cluster = Self {
            namespace,
            workspace,
            warren_image,
            state: state.then(|| tempfile::tempdir().expect("a state directory")),
            kubeconfig,
        };
        cluster.apply(&serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": cluster.namespace},
        }));
        cluster
    }

    /// hostPath volumes on `(claim, directory)`, each reserved for the claim of that name
    /// in this namespace, and the claims themselves when `claims` is [`Claim::Made`].
    fn volumes(&self, volumes: &[(&str, PathBuf)], claims: Claim) {
        let mut objects = Vec::new();
        for (claim, path) in volumes {
            let volume = format!("{}-{claim}", self.namespace);
            objects.push(serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": volume, "labels": {"dev.warren.test": self.namespace}},
                "spec": {
                    // Nominal (a hostPath volume has no size): at least what any claim asks,
                    // the manifests' 100 GiB included.
                    "capacity": {"storage": "1Ti"},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "hostPath": {"path": path, "type": "Directory"},
                    "claimRef": {"namespace": self.namespace, "name": claim},
                },
            }));
            if claims == Claim::Made {
                objects.push(serde_json::json!({
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": self.namespace},
                    "spec": {
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": STORAGE_CLASS,
                        "resources": {"requests": {"storage": "1Gi"}},
                        "volumeName": volume,
                    },
                }));
            }
        }
        self.apply(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}));
    }

    /// `kubectl apply` of one object (or a `List`).
    fn apply(&self, object: &serde_json::Value) {
        self.kubectl_with_input(&["apply", "-f", "-"], &object.to_string());
    }

    /// Waits until this namespace has `count` claims, all bound. The controller manager
    /// binds a claim a moment after it is made; a pod created before is unschedulable, and
    /// warren reports that at once.
    pub fn wait_bound(&self, count: usize) {
        let bound = vec!["Bound"; count].join(" ");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let phases = self.kubectl(&["get", "pvc", "-o", "jsonpath={.items[*].status.phase}"]);
            if String::from_utf8_lossy(&phases.stdout) == bound {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the claims of {} are not {bound} after 60 s: {}",
                self.namespace,
                String::from_utf8_lossy(&phases.stdout)
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// `kubectl` against the cluster, in this namespace, for a test that reads a failure.
    pub fn command(&self) -> Command {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", &self.namespace]);
        command
    }

    /// `kubectl <args>` against the cluster, in this namespace; panics when it fails.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        run(
            self.command().args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// `kubectl <args>` with `input` on its stdin; panics when it fails.
    pub fn kubectl_with_input(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child = self
            .command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child
            .stdin
            .take()
            .expect("kubectl's stdin")
            .write_all(input.as_bytes())
            .expect("write to kubectl");
        let output = child.wait_with_output().expect("kubectl ends");
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// One object of this namespace (`kind` as kubectl names it: `pods`,
    /// `networkpolicies`), as JSON; `None` when there is none.
    pub fn object(&self, kind: &str, name: &str) -> Option<serde_json::Value> {
        let output = self.kubectl(&["get", kind, name, "--ignore-not-found", "-o", "json"]);
        if output.stdout.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(serde_json::from_slice(&output.stdout).expect("kubectl prints JSON"))
    }

    /// A warren.toml that serves this namespace with the Kubernetes backend (instance
    /// `instance`), `extra` appended to its `[kubernetes]` section.
    pub fn config(&self, instance: &str, extra: &str) -> String {
        format!(
            r#"backend = "kubernetes"
workspace_dir = "{workspace}"

[kubernetes]
image = "{image}"
namespace = "{namespace}"
warren_image = "{warren_image}"
user_data_claim = "{user_data}"
skills_claim = "{skills}"
service_type = "ClusterIP"
instance = "{instance}"
kubeconfig = "{kubeconfig}"
agent_clients_cidr = "{AGENT_CLIENTS_CIDR}"
ready_timeout_s = 120
# Pods reach warren's proxy at the host's end of the cluster's veth.
proxy_port = 0
proxy_host = "{HOST_IP}"
{extra}
[kubernetes.warren_pod_labels]
"app.kubernetes.io/name" = "warren"
"#,
            workspace = self.workspace.path().display(),
            image = crate::DOCKER_TEST_IMAGE,
            namespace = self.namespace,
            warren_image = self.warren_image,
            user_data = super::USER_DATA_CLAIM,
            skills = super::SKILLS_CLAIM,
            kubeconfig = self.kubeconfig.display(),
        )
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        // What makes pods goes before them (warren's own Deployment, when it runs in the
        // cluster), so none comes back. The pods go next, their containers stopped and their mounts of the workspace
        // gone before the workspace directory is (`kubectl delete` waits until the kubelet
        // has removed them), with a short grace: a namespace's deletion would give each
        // pod its own (30 s by default).
        let controllers = self
            .command()
            .args(["delete", "deployments,replicasets", "--all"])
            .stdin(Stdio::null())
            .output();
        let pods = self
            .command()
            .args(["delete", "pods", "--all", "--grace-period=1"])
            .arg("--timeout=120s")
            .stdin(Stdio::null())
            .output();
        // With no pod left, nothing mounts the workspace: the namespace and the volumes
        // are objects only, and go in the background (a namespace takes seconds).
        let namespace = format!("namespace/{}", self.namespace);
        let deleted = self
            .command()
            .args(["delete", &namespace, "--wait=false"])
            .stdin(Stdio::null())
            .output();
        let volumes = self
            .command()
            .args(["delete", "pv", "--wait=false", "-l"])
            .arg(format!("dev.warren.test={}", self.namespace))
            .stdin(Stdio::null())
            .output();
        if !std::thread::panicking() {
            for (what, output) in [
                ("the controllers", controllers),
                ("the pods", pods),
                ("the namespace", deleted),
                ("the volumes", volumes),
            ] {
                let output = output.expect("run kubectl");
                assert!(
                    output.status.success(),
                    "deleting {what} of {}: {}",
                    self.namespace,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
    }
}
