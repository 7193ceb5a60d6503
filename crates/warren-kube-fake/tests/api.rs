//! The fake Kubernetes API server driven by the real `kube::Client` over real HTTP.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::{
    Container, Pod, PodCondition, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use warren_kube_fake::api::{FakeApiServer, Fault};
use warren_kube_fake::{Kubelet, StatusReporter};

const WAIT: Duration = Duration::from_secs(10);

fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn service(name: &str, service_type: &str, node_port: Option<i32>) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(service_type.to_owned()),
            selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ports: Some(vec![ServicePort {
                port: 8080,
                node_port,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `Status` of a failed call: its code and reason.
fn api_error<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason, status.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

async fn next_event<S, T>(stream: &mut S) -> T
where
    S: futures::Stream<Item = T> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event within the wait")
        .expect("the stream goes on")
}

#[tokio::test]
async fn a_created_pod_gets_server_set_metadata_and_reads_back_the_same() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let before: u64 = server.resource_version().parse().unwrap();

    let created = pods
        .create(&PostParams::default(), &pod("web-1", &[("app", "web")]))
        .await
        .unwrap();

    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert!(
        meta.uid.as_deref().is_some_and(|u| u.len() == 36),
        "{meta:?}"
    );
    let rv: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert!(rv > before);
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(pods.get("web-1").await.unwrap(), created);

    let second = pods
        .create(&PostParams::default(), &pod("web-2", &[]))
        .await
        .unwrap();
    let second_rv: u64 = second.metadata.resource_version.unwrap().parse().unwrap();
    assert!(second_rv > rv, "one global increasing counter");
}

#[tokio::test]
async fn creating_a_name_that_exists_is_409_already_exists() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod("dup", &[]))
        .await
        .unwrap();

    let (code, reason, message) =
        api_error(pods.create(&PostParams::default(), &pod("dup", &[])).await);

    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(message, r#"pods "dup" already exists"#);
}

#[tokio::test]
async fn getting_or_deleting_what_does_not_exist_is_404_not_found() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let policies: Api<NetworkPolicy> = Api::default_namespaced(server.client());

    let (code, reason, message) = api_error(pods.get("nope").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert_eq!(message, r#"pods "nope" not found"#);
    assert_eq!(pods.get_opt("nope").await.unwrap(), None);
    let (code, _, _) = api_error(pods.delete("nope", &DeleteParams::default()).await);
    assert_eq!(code, 404);
    let (_, _, message) = api_error(policies.get("nope").await);
    assert_eq!(
        message,
        r#"networkpolicies.networking.k8s.io "nope" not found"#
    );
}

#[tokio::test]
async fn names_and_labels_the_real_server_refuses_are_422_invalid() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let services: Api<Service> = Api::default_namespaced(server.client());

    for bad in ["Bad_Name", "-lead", "a..b", &"x".repeat(254)] {
        let (code, reason, message) =
            api_error(pods.create(&PostParams::default(), &pod(bad, &[])).await);
        assert_eq!((code, reason.as_str()), (422, "Invalid"), "{bad}");
        assert!(
            message.contains("metadata.name: Invalid value"),
            "{message}"
        );
    }
    let mut nameless = pod("x", &[]);
    nameless.metadata.name = None;
    let (code, _, message) = api_error(pods.create(&PostParams::default(), &nameless).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("name or generateName is required"),
        "{message}"
    );
    // A service name is a DNS-1035 label: no leading digit, no dots.
    for bad in ["1abc", "a.b"] {
        let (code, _, _) = api_error(
            services
                .create(&PostParams::default(), &service(bad, "ClusterIP", None))
                .await,
        );
        assert_eq!(code, 422, "{bad}");
    }
    let (code, _, message) = api_error(
        pods.create(
            &PostParams::default(),
            &pod("ok", &[("uid", "alice@example")]),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.labels: Invalid value"),
        "{message}"
    );
    let mut no_containers = pod("empty", &[]);
    no_containers.spec.as_mut().unwrap().containers.clear();
    let (code, _, message) = api_error(pods.create(&PostParams::default(), &no_containers).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.containers: Required value"),
        "{message}"
    );
    // The pod names with dots a pod may have are fine.
    pods.create(&PostParams::default(), &pod("a.b-c", &[]))
        .await
        .unwrap();
}

#[tokio::test]
async fn generate_name_makes_a_fresh_name_from_the_prefix() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut template = pod("x", &[]);
    template.metadata.name = None;
    template.metadata.generate_name = Some("sbx-".into());

    let a = pods
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let b = pods
        .create(&PostParams::default(), &template)
        .await
        .unwrap();

    let (a, b) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(a.starts_with("sbx-") && a.len() == 9, "{a}");
    assert_ne!(a, b);
}

#[tokio::test]
async fn services_get_a_cluster_ip_and_node_port_services_a_node_port() {
    let server = FakeApiServer::start(None);
    let services: Api<Service> = Api::default_namespaced(server.client());

    let internal = services
        .create(
            &PostParams::default(),
            &service("internal", "ClusterIP", None),
        )
        .await
        .unwrap();
    let external = services
        .create(
            &PostParams::default(),
            &service("external", "NodePort", None),
        )
        .await
        .unwrap();

    let spec = internal.spec.unwrap();
    let ip = spec.cluster_ip.unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    assert_eq!(spec.ports.unwrap()[0].node_port, None);
    let spec = external.spec.unwrap();
    assert_ne!(spec.cluster_ip.unwrap(), ip);
    let node_port = spec.ports.unwrap()[0].node_port.unwrap();
    assert!((30000..=32767).contains(&node_port), "{node_port}");

    let (code, _, message) = api_error(
        services
            .create(
                &PostParams::default(),
                &service("clash", "NodePort", Some(node_port)),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("provided port is already allocated"),
        "{message}"
    );
    let (code, _, _) = api_error(
        services
            .create(
                &PostParams::default(),
                &service("low", "NodePort", Some(80)),
            )
            .await,
    );
    assert_eq!(code, 422);
}

#[tokio::test]
async fn a_service_keeps_its_cluster_ip_and_leaving_node_port_frees_its_port() {
    let server = FakeApiServer::start(None);
    let services: Api<Service> = Api::default_namespaced(server.client());
    let created = services
        .create(&PostParams::default(), &service("svc", "NodePort", None))
        .await
        .unwrap();
    let ip = created.spec.as_ref().unwrap().cluster_ip.clone();
    let node_port = created.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port;

    let mut to_cluster_ip = created.clone();
    let spec = to_cluster_ip.spec.as_mut().unwrap();
    spec.type_ = Some("ClusterIP".into());
    spec.cluster_ip = None;
    spec.cluster_ips = None;
    let replaced = services
        .replace("svc", &PostParams::default(), &to_cluster_ip)
        .await
        .unwrap();

    let spec = replaced.spec.unwrap();
    assert_eq!(spec.cluster_ip, ip, "an omitted clusterIP is kept");
    assert_eq!(spec.ports.unwrap()[0].node_port, None);
    services
        .create(
            &PostParams::default(),
            &service("reuse", "NodePort", node_port),
        )
        .await
        .expect("the freed node port can be taken again");
    let (code, _, message) = api_error(
        services
            .patch(
                "svc",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"clusterIP": "10.96.200.200"}})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(message.contains("may not change once set"), "{message}");
}

#[tokio::test]
async fn a_dry_run_create_answers_the_object_without_storing_it() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let before = server.resource_version();

    let answered = pods
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &pod("ghost", &[]),
        )
        .await
        .unwrap();

    assert!(answered.metadata.uid.is_some());
    assert_eq!(pods.get_opt("ghost").await.unwrap(), None);
    assert_eq!(server.resource_version(), before);
}

#[tokio::test]
async fn lists_filter_by_every_label_and_field_selector_form() {
    let server = FakeApiServer::start(None);
    let client = server.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let other: Api<Pod> = Api::namespaced(client.clone(), "other");
    for (name, labels) in [
        ("a", vec![("app", "web"), ("tier", "front")]),
        ("b", vec![("app", "db")]),
        ("c", vec![("tier", "back")]),
    ] {
        pods.create(&PostParams::default(), &pod(name, &labels))
            .await
            .unwrap();
    }
    other
        .create(&PostParams::default(), &pod("z", &[("app", "web")]))
        .await
        .unwrap();

    for (selector, expected) in [
        ("app=web", vec!["a"]),
        ("app==web", vec!["a"]),
        ("app!=web", vec!["b", "c"]),
        ("app", vec!["a", "b"]),
        ("!app", vec!["c"]),
        ("app in (web,db)", vec!["a", "b"]),
        ("app notin (web)", vec!["b", "c"]),
        ("app,tier=front", vec!["a"]),
        ("app in (web, db),!tier", vec!["b"]),
    ] {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        assert_eq!(names(&list.items), expected, "{selector}");
        assert!(list.metadata.resource_version.is_some());
    }
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .unwrap();
    assert_eq!(names(&by_name.items), ["b"]);
    let everywhere: Api<Pod> = Api::all(client);
    let web = everywhere
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(names(&web.items), ["a", "z"]);
    let in_other = everywhere
        .list(&ListParams::default().fields("metadata.namespace=other"))
        .await
        .unwrap();
    assert_eq!(names(&in_other.items), ["z"]);

    let (code, reason, _) = api_error(pods.list(&ListParams::default().labels("app in ()")).await);
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    let (code, _, _) = api_error(
        pods.list(&ListParams::default().fields("spec.unknown=x"))
            .await,
    );
    assert_eq!(code, 400);
}

#[tokio::test]
async fn lists_page_with_limit_and_continue() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    for name in ["p1", "p2", "p3", "p4", "p5"] {
        pods.create(&PostParams::default(), &pod(name, &[]))
            .await
            .unwrap();
    }

    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(2);
    loop {
        let page = pods.list(&params).await.unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(names(&page.items));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }

    assert_eq!(seen, ["p1", "p2", "p3", "p4", "p5"]);
}

#[tokio::test]
async fn deletes_honour_uid_and_resource_version_preconditions() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("victim", &[]))
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();

    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let (code, reason, message) = api_error(pods.delete("victim", &wrong_uid).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(message.contains("Precondition failed: UID"), "{message}");
    let stale_rv = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    let (code, _, message) = api_error(pods.delete("victim", &stale_rv).await);
    assert_eq!(code, 409);
    assert!(
        message.contains("ResourceVersion in precondition: 1"),
        "{message}"
    );
    assert!(pods.get_opt("victim").await.unwrap().is_some());

    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: Some(rv),
        }),
        ..Default::default()
    };
    let deleted = pods.delete("victim", &right).await.unwrap();

    let deleted = deleted.left().expect("a pod delete answers the pod");
    assert_eq!(deleted.metadata.name.as_deref(), Some("victim"));
    assert_eq!(pods.get_opt("victim").await.unwrap(), None, "gone at once");
}

#[tokio::test]
async fn delete_collection_removes_only_the_selected_objects() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    for (name, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
        pods.create(&PostParams::default(), &pod(name, &[("app", app)]))
            .await
            .unwrap();
    }

    let deleted = pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=x"),
        )
        .await
        .unwrap();

    assert_eq!(names(&deleted.left().unwrap().items), ["a", "b"]);
    let left = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&left.items), ["c"]);
}

#[tokio::test]
async fn replacing_with_a_stale_resource_version_is_409_conflict() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", &[]))
        .await
        .unwrap();
    let mut first = created.clone();
    first
        .metadata
        .labels
        .get_or_insert_default()
        .insert("step".into(), "1".into());
    let replaced = pods
        .replace("p", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        created.metadata.resource_version
    );

    let mut stale = created;
    stale
        .metadata
        .labels
        .get_or_insert_default()
        .insert("step".into(), "2".into());
    let (code, reason, message) =
        api_error(pods.replace("p", &PostParams::default(), &stale).await);

    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        message.contains("the object has been modified"),
        "{message}"
    );
    let mut image_change = replaced.clone();
    image_change.spec.as_mut().unwrap().containers[0].image = Some("alpine".into());
    pods.replace("p", &PostParams::default(), &image_change)
        .await
        .unwrap();
    let mut forbidden = pods.get("p").await.unwrap();
    forbidden.spec.as_mut().unwrap().containers[0].name = "renamed".into();
    let (code, _, message) = api_error(pods.replace("p", &PostParams::default(), &forbidden).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("pod updates may not change fields"),
        "{message}"
    );
}

#[tokio::test]
async fn merge_strategic_and_json_patches_change_the_object_and_its_resource_version() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", &[("a", "1")]))
        .await
        .unwrap();
    let params = PatchParams::default();

    let merged = pods
        .patch(
            "p",
            &params,
            &Patch::Merge(json!({"metadata": {"labels": {"a": null, "b": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.metadata.labels,
        Some(BTreeMap::from([("b".into(), "2".into())]))
    );
    assert_ne!(
        merged.metadata.resource_version,
        created.metadata.resource_version
    );
    let strategic = pods
        .patch(
            "p",
            &params,
            &Patch::Strategic(json!({"metadata": {"annotations": {"note": "x"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        strategic.metadata.annotations.unwrap()["note"],
        "x".to_owned()
    );
    // kube's `Patch::Json` holds a `json_patch::Patch`, deserialized here from RFC 6902 JSON.
    let operations = json!([{"op": "add", "path": "/metadata/labels/c", "value": "3"}]);
    let patched = pods
        .patch(
            "p",
            &params,
            &Patch::Json::<()>(serde_json::from_value(operations).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["c"], "3".to_owned());

    // A patch carrying a stale resourceVersion is a precondition that fails.
    let (code, _, _) = api_error(
        pods.patch(
            "p",
            &params,
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": created.metadata.resource_version}}),
            ),
        )
        .await,
    );
    assert_eq!(code, 409);
    let (code, _, _) = api_error(
        pods.patch("missing", &params, &Patch::Merge(json!({})))
            .await,
    );
    assert_eq!(code, 404);
}

#[tokio::test]
async fn a_no_op_patch_keeps_the_resource_version() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", &[("a", "1")]))
        .await
        .unwrap();

    let same = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}})),
        )
        .await
        .unwrap();

    assert_eq!(
        same.metadata.resource_version,
        created.metadata.resource_version
    );
}

#[tokio::test]
async fn server_side_apply_is_answered_415_as_not_modelled() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());

    let (code, reason, _) = api_error(
        pods.patch(
            "p",
            &PatchParams::apply("warren"),
            &Patch::Apply(pod("p", &[])),
        )
        .await,
    );

    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
}

#[tokio::test]
async fn status_patches_and_replaces_change_only_the_status() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod("p", &[("a", "1")]))
        .await
        .unwrap();

    let patched = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"a": "ignored"}},
                "status": {"phase": "Running", "podIP": "10.0.0.7"},
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(patched.metadata.labels.unwrap()["a"], "1".to_owned());

    let mut object = pods.get("p").await.unwrap();
    object.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let replaced = pods
        .replace_status("p", &PostParams::default(), &object)
        .await
        .unwrap();
    assert_eq!(replaced.status.unwrap().phase.as_deref(), Some("Succeeded"));

    // The main resource ignores a status it is given.
    let mut object = pods.get("p").await.unwrap();
    object.status.as_mut().unwrap().phase = Some("Failed".into());
    let replaced = pods
        .replace("p", &PostParams::default(), &object)
        .await
        .unwrap();
    assert_eq!(replaced.status.unwrap().phase.as_deref(), Some("Succeeded"));
}

#[tokio::test]
async fn network_policies_are_served_under_networking_k8s_io() {
    let server = FakeApiServer::start(None);
    let policies: Api<NetworkPolicy> = Api::default_namespaced(server.client());
    let policy = NetworkPolicy {
        metadata: ObjectMeta {
            name: Some("deny-egress".into()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            policy_types: Some(vec!["Egress".into()]),
            ..Default::default()
        }),
    };

    let created = policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let listed = policies.list(&ListParams::default()).await.unwrap();
    let deleted = policies
        .delete("deny-egress", &DeleteParams::default())
        .await
        .unwrap();

    assert!(created.metadata.uid.is_some());
    assert_eq!(listed.items.len(), 1);
    assert!(
        deleted.is_right(),
        "a network policy delete answers a Status"
    );
    assert!(server
        .requests()
        .iter()
        .any(|(_, path)| path.starts_with("/apis/networking.k8s.io/v1/namespaces/default/")));
}

#[tokio::test]
async fn a_watcher_sees_added_modified_and_deleted() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod("before", &[]))
        .await
        .unwrap();
    let mut events = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::Init
    ));
    match next_event(&mut events).await.unwrap() {
        Event::InitApply(pod) => assert_eq!(pod.metadata.name.as_deref(), Some("before")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::InitDone
    ));

    pods.create(&PostParams::default(), &pod("after", &[]))
        .await
        .unwrap();
    pods.patch(
        "after",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    pods.delete("after", &DeleteParams::default())
        .await
        .unwrap();

    match next_event(&mut events).await.unwrap() {
        Event::Apply(pod) => assert!(pod.metadata.labels.unwrap_or_default().is_empty()),
        other => panic!("{other:?}"),
    }
    match next_event(&mut events).await.unwrap() {
        Event::Apply(pod) => assert_eq!(pod.metadata.labels.unwrap()["x"], "y".to_owned()),
        other => panic!("{other:?}"),
    }
    match next_event(&mut events).await.unwrap() {
        Event::Delete(pod) => assert_eq!(pod.metadata.name.as_deref(), Some("after")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_its_initial_state_and_the_end_bookmark() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod("one", &[]))
        .await
        .unwrap();
    let mut events =
        watcher::watcher(pods.clone(), watcher::Config::default().streaming_lists()).boxed();

    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::Init
    ));
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::InitApply(_)
    ));
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::InitDone
    ));
    pods.create(&PostParams::default(), &pod("two", &[]))
        .await
        .unwrap();
    match next_event(&mut events).await.unwrap() {
        Event::Apply(pod) => assert_eq!(pod.metadata.name.as_deref(), Some("two")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_watch_with_a_label_selector_sees_objects_move_in_and_out_as_added_and_deleted() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", &[]))
        .await
        .unwrap();
    let mut stream = pods
        .watch(
            &WatchParams::default().labels("app=web"),
            created.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let label = |value: Option<&str>| Patch::Merge(json!({"metadata": {"labels": {"app": value}}}));

    pods.patch("p", &PatchParams::default(), &label(Some("web")))
        .await
        .unwrap();
    pods.patch("p", &PatchParams::default(), &label(Some("db")))
        .await
        .unwrap();

    assert!(matches!(
        next_event(&mut stream).await.unwrap(),
        WatchEvent::Added(_)
    ));
    assert!(matches!(
        next_event(&mut stream).await.unwrap(),
        WatchEvent::Deleted(_)
    ));
}

#[tokio::test]
async fn a_raw_watch_from_a_compacted_resource_version_gets_a_410_expired_error_event() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", &[]))
        .await
        .unwrap();
    let old_rv = created.metadata.resource_version.unwrap();
    pods.create(&PostParams::default(), &pod("q", &[]))
        .await
        .unwrap();
    server.compact();

    let mut stream = pods
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await.unwrap() {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(status.message.starts_with("too old resource version"));
        }
        other => panic!("{other:?}"),
    }
    assert!(tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .is_none());

    // On the wire: HTTP 200 and one ERROR line carrying a Status, as the real server.
    let response = reqwest::get(format!(
        "{}/api/v1/namespaces/default/pods?watch=true&resourceVersion={old_rv}",
        server.url()
    ))
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let line: serde_json::Value =
        serde_json::from_str(response.text().await.unwrap().trim()).unwrap();
    assert_eq!(line["type"], "ERROR");
    assert_eq!(line["object"]["kind"], "Status");
    assert_eq!(line["object"]["status"], "Failure");
    assert_eq!(line["object"]["code"], 410);
    assert_eq!(line["object"]["reason"], "Expired");
}

#[tokio::test]
async fn the_watcher_recovers_from_410_by_listing_again() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    // Watches end after 1 s; the watcher then resumes from the last resourceVersion it saw.
    let config = watcher::Config::default().labels("app=watched").timeout(1);
    let mut events = watcher::watcher(pods.clone(), config).boxed();
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::Init
    ));
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::InitDone
    ));

    // Changes the watcher does not see move the store past its resourceVersion, then
    // compaction drops them: resuming is `410 Expired`.
    pods.create(&PostParams::default(), &pod("unwatched", &[]))
        .await
        .unwrap();
    pods.create(
        &PostParams::default(),
        &pod("watched", &[("app", "watched")]),
    )
    .await
    .unwrap();
    match next_event(&mut events).await.unwrap() {
        Event::Apply(pod) => assert_eq!(pod.metadata.name.as_deref(), Some("watched")),
        other => panic!("{other:?}"),
    }
    pods.create(&PostParams::default(), &pod("unwatched-2", &[]))
        .await
        .unwrap();
    server.compact();

    match next_event(&mut events).await {
        Err(watcher::Error::WatchError(status)) => assert_eq!(status.code, 410),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::Init
    ));
    match next_event(&mut events).await.unwrap() {
        Event::InitApply(pod) => assert_eq!(pod.metadata.name.as_deref(), Some("watched")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        Event::InitDone
    ));
    let lists = server
        .requests()
        .iter()
        .filter(|(method, path)| {
            method == Method::GET && path.contains("/pods?") && !path.contains("watch=")
        })
        .count();
    assert_eq!(lists, 2, "{:#?}", server.requests());
}

#[tokio::test]
async fn expiring_watches_ends_every_open_watch_with_410() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut stream = pods
        .watch(&WatchParams::default(), &server.resource_version())
        .await
        .unwrap()
        .boxed();
    // `watch` returns once the server answered the headers: the watch is registered.

    server.expire_watches();

    match next_event(&mut stream).await.unwrap() {
        WatchEvent::Error(status) => assert_eq!(status.code, 410),
        other => panic!("{other:?}"),
    }
}

/// Reports every pod Running and Ready at once, with an IP, and records deletions.
#[derive(Default)]
struct RunningKubelet {
    deleted: Mutex<Vec<String>>,
    reporters: Mutex<Vec<StatusReporter>>,
}

impl Kubelet for RunningKubelet {
    fn pod_created(&self, pod: Pod, status: StatusReporter) {
        assert!(pod.metadata.uid.is_some() && pod.metadata.resource_version.is_some());
        self.reporters.lock().unwrap().push(status.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            status.update(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("10.244.0.5".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        });
    }

    fn pod_deleted(&self, namespace: &str, name: &str) {
        self.deleted
            .lock()
            .unwrap()
            .push(format!("{namespace}/{name}"));
    }
}

#[tokio::test]
async fn a_kubelet_reports_a_pod_running_and_hears_of_its_deletion() {
    let kubelet = Arc::new(RunningKubelet::default());
    let server = FakeApiServer::start(Some(kubelet.clone()));
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("runner", &[]))
        .await
        .unwrap();

    let running = tokio::time::timeout(
        WAIT,
        await_condition(pods.clone(), "runner", conditions::is_pod_running()),
    )
    .await
    .unwrap()
    .unwrap()
    .unwrap();

    let status = running.status.unwrap();
    assert_eq!(status.pod_ip.as_deref(), Some("10.244.0.5"));
    assert_ne!(
        running.metadata.resource_version,
        created.metadata.resource_version
    );
    pods.delete("runner", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(*kubelet.deleted.lock().unwrap(), ["default/runner"]);

    // A late report for a pod that is gone (or replaced under the same name) is dropped.
    pods.create(&PostParams::default(), &pod("runner", &[]))
        .await
        .unwrap();
    let stale = kubelet.reporters.lock().unwrap()[0].clone();
    tokio::time::timeout(
        WAIT,
        await_condition(pods.clone(), "runner", conditions::is_pod_running()),
    )
    .await
    .unwrap()
    .unwrap();
    let fresh = pods.get("runner").await.unwrap();
    stale.update(PodStatus {
        phase: Some("Failed".into()),
        ..Default::default()
    });
    assert_eq!(pods.get("runner").await.unwrap(), fresh);
}

#[tokio::test]
async fn an_injected_429_is_retried_by_kube_and_then_succeeds() {
    let server = FakeApiServer::start(None);
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    server.inject(Fault {
        method: Some(Method::POST),
        path_contains: "/pods".into(),
        status: 429,
        times: 1,
        retry_after: Some(1),
    });

    pods.create(&PostParams::default(), &pod("p", &[]))
        .await
        .unwrap();

    let posts: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|(method, _)| method == Method::POST)
        .collect();
    assert_eq!(posts.len(), 2, "one refused, one retried: {posts:?}");
}

#[tokio::test]
async fn injected_faults_answer_real_statuses_without_touching_state() {
    let server = FakeApiServer::start(None);
    let mut config = server.config();
    config.default_retry = false;
    let pods: Api<Pod> = Api::default_namespaced(kube::Client::try_from(config).unwrap());

    for (status, reason) in [
        (403, "Forbidden"),
        (409, "Conflict"),
        (410, "Gone"),
        (422, "Invalid"),
        (429, "TooManyRequests"),
        (500, "InternalError"),
        (503, "ServiceUnavailable"),
    ] {
        server.inject(Fault::new(status, "/namespaces/default/pods"));
        let (code, got, _) = api_error(pods.create(&PostParams::default(), &pod("p", &[])).await);
        assert_eq!((code, got.as_str()), (status, reason));
    }
    assert_eq!(
        pods.get_opt("p").await.unwrap(),
        None,
        "no fault touched state"
    );

    server.inject(Fault {
        method: Some(Method::GET),
        path_contains: "watch=true".into(),
        status: 503,
        times: 2,
        retry_after: Some(3),
    });
    let response = reqwest::get(format!(
        "{}/api/v1/namespaces/default/pods?watch=true",
        server.url()
    ))
    .await
    .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "3");
    let status: serde_json::Value = response.json().await.unwrap();
    assert_eq!(status["details"]["retryAfterSeconds"], 3);
    // A fault only matches its method.
    pods.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn the_server_answers_version_and_discovery() {
    let server = FakeApiServer::start(None);
    let client = server.client();

    let version = client.apiserver_version().await.unwrap();
    let core = client.list_core_api_resources("v1").await.unwrap();
    let groups = client.list_api_groups().await.unwrap();

    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37")
    );
    assert!(core.resources.iter().any(|r| r.name == "pods/status"));
    assert_eq!(groups.groups[0].name, "networking.k8s.io");
}

#[test]
fn a_plain_test_can_start_query_and_drop_the_server() {
    let server = FakeApiServer::start(None);
    let address = server.url().trim_start_matches("http://").to_owned();

    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    drop(server);

    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""kind":"PodList""#), "{response}");
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "the port is closed once the server is dropped"
    );
}
