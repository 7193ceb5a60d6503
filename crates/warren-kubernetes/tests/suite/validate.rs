//! Every manifest warren generates, held offline to the real Kubernetes schemas
//! (`kubernetes-validate --strict`, which refuses unknown fields too).

use warren_core::{LayoutName, NetworkPolicy};
use warren_kubernetes::{
    deployment_manifests, DeployOptions, Peer, S3Options, SecretKey, ServiceType,
};

use super::support::{assert_valid, kubernetes_validate, plan, sandbox_stream};

fn allowlist() -> NetworkPolicy {
    NetworkPolicy::Allowlist {
        allow: vec!["pypi.org".into(), "*.pythonhosted.org".into()],
        deny: vec![],
    }
    .validate()
    .unwrap()
}

/// The sandbox objects of `network` for both service types and both layouts.
fn assert_sandbox_objects_valid(network: NetworkPolicy) {
    for service_type in [ServiceType::ClusterIp, ServiceType::NodePort] {
        for layout in LayoutName::ALL {
            let plan = plan(layout, network.clone(), service_type);
            assert_valid(
                &format!("{} {} {layout}", network.mode(), service_type.as_str()),
                &sandbox_stream(&plan),
            );
        }
    }
}

#[test]
fn sandbox_objects_without_network_are_valid_kubernetes_objects() {
    assert_sandbox_objects_valid(NetworkPolicy::None);
}

#[test]
fn sandbox_objects_with_open_egress_are_valid_kubernetes_objects() {
    assert_sandbox_objects_valid(NetworkPolicy::Open { deny: vec![] });
}

#[test]
fn sandbox_objects_with_an_allowlist_are_valid_kubernetes_objects() {
    assert_sandbox_objects_valid(allowlist());
}

#[test]
fn sandbox_objects_for_a_warren_outside_the_cluster_are_valid_kubernetes_objects() {
    // warren outside the cluster: NodePort, and its addresses as the NetworkPolicy's peers.
    for network in [
        NetworkPolicy::None,
        NetworkPolicy::Open { deny: vec![] },
        allowlist(),
    ] {
        let mut plan = plan(LayoutName::Ars, network.clone(), ServiceType::NodePort);
        plan.agent_clients = Peer::IpBlock {
            cidr: "10.20.0.0/16".into(),
        };
        if let Some(proxy) = &mut plan.proxy {
            proxy.peer = Peer::IpBlock {
                cidr: "192.0.2.10".into(),
            };
        }
        assert_valid(
            &format!("outside, {}", network.mode()),
            &sandbox_stream(&plan),
        );
    }
}

#[test]
fn sandbox_objects_for_a_warren_in_another_namespace_are_valid_kubernetes_objects() {
    let mut plan = plan(
        LayoutName::Ars,
        NetworkPolicy::Open { deny: vec![] },
        ServiceType::ClusterIp,
    );
    let peer = Peer::Pods {
        pod_labels: [("app.kubernetes.io/name".to_owned(), "warren".to_owned())].into(),
        namespace_labels: Some(
            [(
                "kubernetes.io/metadata.name".to_owned(),
                "warren-system".to_owned(),
            )]
            .into(),
        ),
    };
    plan.agent_clients = peer.clone();
    plan.proxy.as_mut().unwrap().peer = peer;
    assert_valid("another namespace", &sandbox_stream(&plan));
}

fn s3() -> S3Options {
    S3Options {
        endpoint: "https://s3.example.com".into(),
        bucket: "warren-snapshots".into(),
        region: Some("eu-west-1".into()),
        access_key_id: SecretKey::new("warren-s3", "access-key-id"),
        secret_access_key: SecretKey::new("warren-s3", "secret-access-key"),
    }
}

#[test]
fn deployment_manifests_with_sqlite_and_local_snapshots_are_valid_kubernetes_objects() {
    let options = DeployOptions::new("warren", "ghcr.io/example/warren:1.0");
    assert_valid("sqlite", &deployment_manifests(&options).unwrap());
}

#[test]
fn deployment_manifests_with_postgresql_are_valid_kubernetes_objects() {
    let options = DeployOptions {
        postgres: Some(SecretKey::new("warren-postgres", "url")),
        ..DeployOptions::new("warren", "ghcr.io/example/warren:1.0")
    };
    assert_valid("postgresql", &deployment_manifests(&options).unwrap());
}

#[test]
fn deployment_manifests_with_s3_snapshots_are_valid_kubernetes_objects() {
    let options = DeployOptions {
        s3: Some(s3()),
        ..DeployOptions::new("warren", "ghcr.io/example/warren:1.0")
    };
    assert_valid("s3", &deployment_manifests(&options).unwrap());
}

#[test]
fn deployment_manifests_with_postgresql_s3_and_every_option_are_valid_kubernetes_objects() {
    let options = DeployOptions {
        name: "warren-prod".into(),
        postgres: Some(SecretKey::new("warren-postgres", "url")),
        s3: Some(S3Options {
            region: None,
            ..s3()
        }),
        storage_class: Some("efs-sc".into()),
        sandbox_image: Some("python:3.12-slim".into()),
        sandbox_service_type: ServiceType::NodePort,
        port: 8080,
        ..DeployOptions::new("agents", "registry.example.com/warren@sha256:0123")
    };
    assert_valid("everything", &deployment_manifests(&options).unwrap());
}

#[test]
fn the_validator_refuses_what_kubernetes_would_refuse() {
    // The checks above mean something only if the validator does refuse: a field no
    // Pod has (strict mode), a wrongly typed value, a kind with no schema.
    let mut pod: serde_json::Value = serde_json::to_value(
        warren_kubernetes::build(&super::support::ars())
            .unwrap()
            .pod,
    )
    .unwrap();
    pod["spec"]["sandboxEscape"] = serde_json::json!(true);
    let (valid, said) = kubernetes_validate(&pod.to_string());
    assert!(!valid, "an unknown field passed:\n{said}");

    let mut pod: serde_json::Value = serde_json::to_value(
        warren_kubernetes::build(&super::support::ars())
            .unwrap()
            .pod,
    )
    .unwrap();
    pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = serde_json::json!("root");
    let (valid, said) = kubernetes_validate(&pod.to_string());
    assert!(!valid, "a string uid passed:\n{said}");

    let (valid, said) =
        kubernetes_validate(r#"{"apiVersion":"v1","kind":"Frobnicator","metadata":{"name":"x"}}"#);
    let accepted = said.contains(" passed for resource ");
    assert!(!(valid && accepted), "an unknown kind passed:\n{said}");
}
