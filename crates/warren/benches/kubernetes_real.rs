//! The Kubernetes backend's create on a real cluster (issue 39), measured in one run beside
//! a bare pod and beside the local backend. Not a test: it asserts nothing, it prints.
//!
//! - warren: `POST /v1/sandboxes` + the first `exec` of the command `true`, through warren on the host
//!   with `[kubernetes] kubeconfig` (its Pod, Service and NetworkPolicy made, the pod
//!   scheduled, two init containers, the agent started and its key checked over TCP).
//! - The anchor: `kubectl run --restart=Never` of the same image (already on the node,
//!   pulled `Never`) and `kubectl wait --for=condition=Ready`: the cluster's own floor for a
//!   pod, with kubectl's start-up twice in it, as a user would time it.
//! - The local backend's create + first exec, for scale.
//!
//! Each sandbox and pod is deleted (untimed) before the next is made: a sandbox pod requests
//! one of the node's two CPUs.
//!
//! Run as root with dockerd running, the test image built (`scripts/docker-test-image`) and
//! the cluster up (`scripts/k8s-cluster up`):
//! `WARREN_TEST_K8S_KUBECONFIG=/run/warren-k8s/kubeconfig cargo bench -p warren --bench
//! kubernetes_real` (`-- --iterations N`, default 10).

use std::path::Path;
use std::time::{Duration, Instant};

use warren_test_support::latency::{create_and_first_exec, row};
use warren_test_support::{require_docker, TestServer, DOCKER_TEST_IMAGE};

/// Creations before the timed ones (images into the page cache, connections opened).
const WARM_UP: usize = 2;

#[tokio::main]
async fn main() {
    let iterations = warren_test_support::latency::iterations(10);
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    println!(
        "warren Kubernetes backend on a real single-node cluster (scripts/k8s-cluster, 1.20.2) vs `kubectl run` to Ready and the local backend, {iterations} iterations each\n"
    );

    let kubernetes = TestServer::start_kubernetes_real_with(bin, "", &[]);
    let mut k8s = create_exec_destroy(&kubernetes, iterations).await;
    let cluster = kubernetes.real_cluster().expect("a real cluster");
    let mut pods = Vec::new();
    for i in 0..iterations + WARM_UP {
        let name = format!("bench-{i}");
        let started = Instant::now();
        cluster.kubectl(&[
            "run",
            &name,
            "--image",
            DOCKER_TEST_IMAGE,
            "--restart=Never",
            "--image-pull-policy=Never",
            "--command",
            "--",
            "sleep",
            "3600",
        ]);
        cluster.kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=120s",
        ]);
        if i >= WARM_UP {
            pods.push(started.elapsed());
        }
        cluster.kubectl(&["delete", "pod", &name, "--grace-period=1"]);
    }
    drop(kubernetes);

    let local = TestServer::start_local(bin);
    let mut local_create = create_exec_destroy(&local, iterations).await;
    drop(local);

    row(
        "kubernetes (real): create + first exec",
        &mut k8s,
        &mut pods,
        "kubectl run to Ready",
    );
    row(
        "kubernetes (real): create + first exec",
        &mut k8s,
        &mut local_create,
        "local create + exec",
    );
}

/// Times `iterations` creations + first execs, each sandbox destroyed before the next.
async fn create_exec_destroy(server: &TestServer, iterations: usize) -> Vec<Duration> {
    server.workdir("bench", "projects/p").await;
    let mut times = Vec::new();
    for i in 0..iterations + WARM_UP {
        let (took, id) = create_and_first_exec(server, &format!("cold-{i}")).await;
        if i >= WARM_UP {
            times.push(took);
        }
        server.terminate(&id).await;
    }
    times
}
