//! What the tests share: plans as the backend makes them, and the schema validator.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Command;

use warren_core::{LayoutName, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};
use warren_kubernetes::{AgentPlan, Endpoint, Limits, Peer, PersistentMount, PodPlan, ServiceType};

/// The Kubernetes version whose schemas the manifests are held to: the one k8s-openapi is
/// built for (its `v1_37` feature in the workspace's Cargo.toml).
pub const KUBERNETES_VERSION: &str = "1.37.0";
/// The validator's release scripts/test installs.
pub const VALIDATOR: &str = "kubernetes-validate==1.37.0";

const MIB: u64 = 1024 * 1024;

/// warren's pods, as a NetworkPolicy peer (warren in the cluster).
pub fn warren_pods() -> Peer {
    Peer::Pods {
        pod_labels: BTreeMap::from([
            ("app.kubernetes.io/name".into(), "warren".into()),
            ("app.kubernetes.io/instance".into(), "warren".into()),
        ]),
        namespace_labels: None,
    }
}

/// A sandbox's plan as the backend would make it.
pub fn plan(layout: LayoutName, network: NetworkPolicy, service_type: ServiceType) -> PodPlan {
    let uid = Uid::new("alice").unwrap();
    let runtime_scope = RuntimeScope::new("thread-1").unwrap();
    let workdir = Workdir::new(match layout {
        LayoutName::Ars => "projects/a",
        LayoutName::Deerflow => "threads/t1/user-data",
        LayoutName::E2b => "e2b/s1",
    })
    .unwrap();
    PodPlan {
        instance: "i1".into(),
        namespace: "warren".into(),
        sandbox: SandboxId::derive(&uid, &runtime_scope),
        mounts: PersistentMount::for_layout(layout, &uid.safe(), &workdir),
        uid,
        runtime_scope,
        workdir,
        generation: 1,
        layout,
        network,
        image: "python:3.12-slim".into(),
        inherit_env: true,
        user_data_claim: "warren-user-data".into(),
        skills_claim: "warren-skills".into(),
        limits: Limits {
            cpu_millis: 1500,
            memory_bytes: 2048 * MIB,
            ephemeral_storage_bytes: 4096 * MIB,
            home_bytes: 256 * MIB,
            tmp_bytes: 256 * MIB,
        },
        agent: AgentPlan {
            image: "ghcr.io/example/warren:1.0".into(),
            bundle_command: vec![
                "/usr/local/bin/warren".into(),
                "__agent-bundle".into(),
                "/opt/warren-agent".into(),
            ],
            prepare_command: vec!["/usr/local/bin/warren".into(), "__k8s-prepare".into()],
            command: vec![
                "/opt/warren-agent/ld.so".into(),
                "/opt/warren-agent/warren".into(),
                "__container-agent".into(),
                "--listen".into(),
                "0.0.0.0:7879".into(),
            ],
            port: 7879,
            key: "0123456789abcdef".repeat(4),
            bundle_bytes: 256 * MIB,
        },
        service_type,
        proxy: Some(Endpoint {
            peer: warren_pods(),
            port: 3128,
        }),
        agent_clients: warren_pods(),
    }
}

/// The default plan: ARS, no network, ClusterIP.
pub fn ars() -> PodPlan {
    plan(LayoutName::Ars, NetworkPolicy::None, ServiceType::ClusterIp)
}

/// The sandbox objects of `plan` as one multi-document stream (JSON documents).
pub fn sandbox_stream(plan: &PodPlan) -> String {
    let objects = warren_kubernetes::build(plan).unwrap();
    [
        serde_json::to_string_pretty(&objects.pod).unwrap(),
        serde_json::to_string_pretty(&objects.service).unwrap(),
        serde_json::to_string_pretty(&objects.network_policy).unwrap(),
    ]
    .join("\n---\n")
}

/// Runs `kubernetes-validate --strict` on `manifests` (one or more documents); answers
/// whether they are valid and what the validator said. A missing validator fails the test:
/// these checks are never skipped.
pub fn kubernetes_validate(manifests: &str) -> (bool, String) {
    let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    file.write_all(manifests.as_bytes()).unwrap();
    file.flush().unwrap();
    let output = Command::new("kubernetes-validate")
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(file.path())
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run kubernetes-validate ({error}): install it with \
                 `python3 -m pip install '{VALIDATOR}'` (scripts/test does)"
            )
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// Asserts that `manifests` are valid Kubernetes objects: every document, strictly.
pub fn assert_valid(what: &str, manifests: &str) {
    let documents = manifests.split("\n---\n").count();
    let (valid, said) = kubernetes_validate(manifests);
    assert!(
        valid,
        "{what}: kubernetes-validate refused it:\n{said}\n{manifests}"
    );
    // One "passed" line per document: none was skipped as a kind it has no schema for.
    let accepted = said
        .lines()
        .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
        .count();
    assert_eq!(
        accepted, documents,
        "{what}: {documents} documents, but the validator accepted {accepted}:\n{said}"
    );
}
