//! The Role `warren k8s manifests` writes grants exactly what the Kubernetes backend does:
//! every request the backend made through a sandbox's whole life (create, exec, a restart's
//! adoption, destroy, a new generation), read from the fake API server's request log, is a
//! verb the Role grants on that resource. A request the Role lacks would be 403 on a real
//! cluster, which the fake API server (no RBAC) does not enforce.

use std::collections::{BTreeMap, BTreeSet};

use warren_test_support::TestServer;

use super::bin;

/// (resource, verbs) of the Role in the generated manifests.
fn granted() -> BTreeMap<String, BTreeSet<String>> {
    let options = warren_kubernetes::DeployOptions::new("sandboxes", "registry.example/warren:1");
    let manifests = warren_kubernetes::deployment_manifests(&options).unwrap();
    role_rules(&manifests)
        .into_iter()
        .map(|((_, resource), verbs)| (resource, verbs))
        .collect()
}

/// (API group, resource) → verbs of the Role in `manifests` (`warren k8s manifests`).
pub(crate) fn role_rules(manifests: &str) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut granted = BTreeMap::new();
    for document in manifests.split("\n---\n") {
        let json: String = document
            .lines()
            .filter(|line| !line.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let object: serde_json::Value = serde_json::from_str(&json).unwrap();
        if object["kind"] != "Role" {
            continue;
        }
        for rule in object["rules"].as_array().unwrap() {
            let group = rule["apiGroups"][0].as_str().unwrap().to_owned();
            for resource in rule["resources"].as_array().unwrap() {
                let verbs: &mut BTreeSet<String> = granted
                    .entry((group.clone(), resource.as_str().unwrap().to_owned()))
                    .or_default();
                for verb in rule["verbs"].as_array().unwrap() {
                    verbs.insert(verb.as_str().unwrap().to_owned());
                }
            }
        }
    }
    assert!(!granted.is_empty(), "the manifests hold a Role");
    granted
}

/// The resource and verb of one logged request (`/api/v1/namespaces/ns/pods/name?…`).
fn resource_and_verb(method: &reqwest::Method, path_and_query: &str) -> (String, String) {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let at = parts
        .iter()
        .position(|p| *p == "namespaces")
        .expect("every request of the backend is namespaced");
    let resource = parts[at + 2].to_owned();
    let named = parts.len() > at + 3;
    let resource = match parts.get(at + 4) {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource,
    };
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verb = match (method.as_str(), named, watch) {
        (_, _, true) => "watch",
        ("GET", true, _) => "get",
        ("GET", false, _) => "list",
        ("POST", _, _) => "create",
        ("DELETE", true, _) => "delete",
        ("DELETE", false, _) => "deletecollection",
        ("PUT", _, _) => "update",
        ("PATCH", _, _) => "patch",
        (other, _, _) => panic!("an unexpected method {other}"),
    };
    (resource, verb.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_sandboxs_life_is_one_the_generated_role_grants() {
    assert!(
        super::running_as_root(),
        "the Kubernetes tests need root: the simulated kubelet makes namespaces"
    );
    let mut server = TestServer::start_kubernetes(bin(), "");
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(server.exec(&id, "true").await["exit_code"], 0);
    // A restart: discover lists and adopts.
    server.restart_after_kill();
    assert_eq!(server.exec(&id, "true").await["exit_code"], 0);
    // Destroy, then a new generation.
    server.terminate(&id).await;
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(server.exec(&id, "true").await["exit_code"], 0);
    server.terminate(&id).await;

    let granted = granted();
    let cluster = server.cluster().unwrap();
    let requests = cluster.api.requests();
    let mut used = BTreeSet::new();
    for (method, path) in &requests {
        used.insert(resource_and_verb(method, path));
    }
    for (resource, verb) in &used {
        assert!(
            granted
                .get(resource)
                .is_some_and(|verbs| verbs.contains(verb)),
            "the backend {verb}s {resource}, which the Role does not grant: {granted:?}"
        );
    }
    // And a life uses what the Role grants on pods (`get` only serves a create that finds
    // the pod already there).
    for verb in ["create", "delete", "list", "watch"] {
        assert!(
            used.contains(&("pods".to_owned(), verb.to_owned())),
            "the Role grants {verb} on pods, which the backend never used: {used:?}"
        );
    }
}
