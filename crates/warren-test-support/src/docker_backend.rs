//! The Docker engine as the Docker backend's tests use it: the test image, the engine's
//! client, and the containers and networks a server on a data directory made.

use std::path::Path;
use std::process::Command;

/// The image the Docker backend's tests run (built by `scripts/docker-test-image`).
pub const DOCKER_TEST_IMAGE: &str = "warren-test:bookworm-3";

/// Panics with what to do unless a Docker engine answers and has [`DOCKER_TEST_IMAGE`].
pub fn require_docker() {
    let engine = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    match engine {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "the Docker backend tests need a running Docker engine (scripts/test starts dockerd): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(error) => panic!(
            "the Docker backend tests need the docker client and a running engine (apt-get install docker.io; scripts/test does): {error}"
        ),
    }
    let image = Command::new("docker")
        .args(["image", "inspect", DOCKER_TEST_IMAGE])
        .output()
        .expect("run docker image inspect");
    assert!(
        image.status.success(),
        "the Docker backend tests need the image {DOCKER_TEST_IMAGE}: build it with scripts/docker-test-image (scripts/test does)"
    );
}

/// The instance name a warren on `data_dir` gives its runtimes: the label value of its
/// Docker containers, the prefix of its local runtimes' cgroups.
pub fn docker_instance(data_dir: &Path) -> String {
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_owned());
    blake3::hash(canonical.as_os_str().as_encoded_bytes()).to_hex()[..8].to_owned()
}

/// Runs the docker client and returns its trimmed stdout (empty on failure).
pub fn docker(args: &[&str]) -> String {
    Command::new("docker")
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Ids of the containers the Docker backend of `data_dir` made (running or not).
pub fn docker_containers(data_dir: &Path) -> Vec<String> {
    let filter = format!("label=dev.warren.instance={}", docker_instance(data_dir));
    docker(&["ps", "-aq", "--no-trunc", "--filter", &filter])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Names of the networks the Docker backend of `data_dir` made.
pub fn docker_networks(data_dir: &Path) -> Vec<String> {
    let filter = format!("label=dev.warren.instance={}", docker_instance(data_dir));
    docker(&["network", "ls", "-q", "--filter", &filter])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Removes every container and network the Docker backend of `data_dir` made.
pub fn remove_docker_runtimes(data_dir: &Path) {
    if !data_dir.join("docker").exists() {
        return;
    }
    for container in docker_containers(data_dir) {
        docker(&["rm", "-f", &container]);
    }
    for network in docker_networks(data_dir) {
        docker(&["network", "rm", &network]);
    }
    // Each sandbox's socket directory is a small tmpfs on the host.
    if let Ok(entries) = std::fs::read_dir(data_dir.join("docker/sockets")) {
        for entry in entries.flatten() {
            let _ = Command::new("umount").arg("-l").arg(entry.path()).output();
        }
    }
    // Staged binds (`<data>/docker/binds/<sandbox>/<n>`) live only while a container
    // starts; one a killed server left must not be walked when the data dir is removed.
    for sandbox in std::fs::read_dir(data_dir.join("docker/binds"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for staged in std::fs::read_dir(sandbox.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = Command::new("umount").arg("-l").arg(staged.path()).output();
        }
    }
}
