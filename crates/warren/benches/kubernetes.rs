//! The Kubernetes backend's speed (issue 15), measured in one run beside the Docker backend.
//! Not a test: it asserts nothing, it prints.
//!
//! - Warm exec through the API over the agent's TCP transport (authenticated, sealed
//!   frames, a gateway relaying stdio) beside the Docker backend's agent on a Unix socket
//!   (descriptors passed, no relay): the same agent server behind both.
//! - Create sandbox + first exec against the fake API server and the simulated kubelet of
//!   `warren-kube-fake` (a real cluster's figures: `--bench kubernetes_real`): it
//!   measures warren's side (objects created, the watch, the agent's start, the key
//!   check) and this machine's namespaces and mounts, not a real cluster's scheduling,
//!   image pulls or CNI. Reported as what it is, beside Docker's create for scale.
//!
//! Run as root with dockerd running and the test image built (`scripts/docker-test-image`):
//! `cargo bench -p warren --bench kubernetes` (`-- --iterations N`, default 20).

use std::path::Path;

use warren_test_support::latency::{create_and_exec, row};
use warren_test_support::{require_docker, TestServer};

#[tokio::main]
async fn main() {
    let iterations: usize = warren_test_support::latency::iterations(20);
    require_docker();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    println!(
        "warren Kubernetes backend (agent over TCP; fake API server + simulated kubelet) vs the Docker backend (agent over a Unix socket), {iterations} cold / {} warm iterations\n",
        iterations * 10
    );

    let kubernetes = TestServer::start_kubernetes(bin, "");
    kubernetes.workdir("bench", "projects/p").await;
    let (mut k8s_create, mut k8s_warm) =
        create_and_exec(&kubernetes, iterations, iterations * 10).await;
    drop(kubernetes);

    let docker = TestServer::start_docker(bin);
    docker.workdir("bench", "projects/p").await;
    let (mut docker_create, mut docker_warm) =
        create_and_exec(&docker, iterations, iterations * 10).await;
    drop(docker);

    row(
        "kubernetes: warm exec (API, TCP agent)",
        &mut k8s_warm,
        &mut docker_warm,
        "docker (Unix agent)",
    );
    row(
        "kubernetes: create + first exec (fake)",
        &mut k8s_create,
        &mut docker_create,
        "docker create",
    );
}
