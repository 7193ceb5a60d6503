//! The Kubernetes backend on the real cluster (issue 39) beyond the conformance rules:
//! warren itself deployed in the cluster from `warren k8s manifests`, talking to the API
//! server with nothing but its service account and Role, and the prepare init container's
//! one-time ownership migration on real claims (I19).
//!
//! These run where `scripts/test` brings the cluster up (`kubernetes_real::` tests, one at
//! a time) and fail, naming `scripts/k8s-cluster up`, where it is not.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::kube::real::{RealCluster, STORAGE_CLASS};
use warren_test_support::{TestServer, DOCKER_TEST_IMAGE, TEST_TOKEN};

use super::{bin, output};

/// The name `warren k8s manifests` gives warren's objects here (its default).
const NAME: &str = "warren";
/// The selector of warren's own pods (the manifests' `warren_pod_labels`).
const WARREN_PODS: &str = "app.kubernetes.io/name=warren,app.kubernetes.io/instance=warren";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_cross_the_boundary_and_the_claims_are_migrated_once_to_1000() {
    super::kubernetes::files_cross_the_boundary_as_1000(TestServer::start_kubernetes_real_with(
        bin(),
        "",
        &[],
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_deployed_from_its_manifests_runs_sandboxes_with_its_role_alone() {
    let cluster = RealCluster::for_manifests(bin(), NAME, TEST_TOKEN);
    let manifests = Command::new(bin())
        .args(["k8s", "manifests", "--namespace", &cluster.namespace])
        .args(["--image", cluster.warren_image])
        .args(["--sandbox-image", DOCKER_TEST_IMAGE])
        .args(["--storage-class", STORAGE_CLASS])
        .output()
        .expect("run warren k8s manifests");
    assert!(
        manifests.status.success(),
        "warren k8s manifests: {}",
        String::from_utf8_lossy(&manifests.stderr)
    );
    let manifests = String::from_utf8(manifests.stdout).expect("UTF-8 manifests");
    cluster.kubectl_with_input(&["apply", "-f", "-"], &manifests);
    cluster.wait_bound(3);
    let first = ready_warren_pod(&cluster, None);

    // What the service account may do in its namespace, as the cluster's own RBAC
    // authoriser answers: the generated Role's rules, and nothing else of any resource.
    let expected = role_rules(&manifests);
    let granted = permissions(&cluster);
    assert_eq!(
        granted, expected,
        "the service account has exactly the Role's permissions"
    );
    for (verb, resource) in [
        ("get", "secrets"),
        ("create", "pods/exec"),
        ("get", "pods/log"),
        ("patch", "pods"),
        ("create", "deployments.apps"),
        ("create", "persistentvolumeclaims"),
    ] {
        assert_eq!(
            can_i(&cluster, verb, resource),
            "no",
            "the service account may not {verb} {resource}"
        );
    }
    assert_eq!(
        can_i(&cluster, "create", "pods"),
        "yes",
        "the check can say yes"
    );

    // warren's API, through its Service, from outside the cluster.
    let service = cluster.kubectl(&["get", "service", NAME, "-o", "jsonpath={.spec.clusterIP}"]);
    let api = Api {
        url: format!("http://{}:7878", String::from_utf8_lossy(&service.stdout)),
        http: reqwest::Client::new(),
    };
    let (status, health) = api.send(Method::GET, "/health", None).await;
    assert_eq!(status, 200, "{health}");

    // A sandbox's whole life through the warren in the cluster.
    let (status, body) = api
        .send(
            Method::POST,
            "/v1/users/alice/workdirs",
            Some(json!({"path": "projects/a"})),
        )
        .await;
    assert!(status == 200 || status == 201, "workdir: {status} {body}");
    let (status, body) = api
        .send(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"uid": "alice", "runtime_scope_id": "t", "workdir": "projects/a"})),
        )
        .await;
    assert!(status == 200 || status == 201, "sandbox: {status} {body}");
    let id = body["sandbox_id"]
        .as_str()
        .expect("a sandbox id")
        .to_owned();
    let (status, body) = api
        .send(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=in.txt"),
            Some(json!("through the API")),
        )
        .await;
    assert!(status == 200 || status == 201, "upload: {status} {body}");
    let result = api
        .exec(
            &id,
            "id -u; cat in.txt; echo; echo made inside > made.txt; echo kept > /tmp/state",
        )
        .await;
    assert_eq!(output(&result), "1000\nthrough the API\n", "{result}");
    let made = cluster
        .workspace
        .path()
        .join("user-data/shared/alice/workspace/projects/a/made.txt");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "made inside\n");
    let meta = std::fs::metadata(&made).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    let pod = sandbox_object(&cluster, "pods", &id).expect("the sandbox's pod");
    let pod_uid = pod["metadata"]["uid"].clone();
    assert!(
        sandbox_object(&cluster, "services", &id).is_some(),
        "the sandbox's Service"
    );

    // warren's pod replaced (as a node drain or an upgrade does): the new one adopts the
    // sandbox's pod, through `list` and `get` alone.
    let logs_before = warren_logs(&cluster, &first);
    cluster.kubectl(&["delete", "pod", &first, "--grace-period=5"]);
    let second = ready_warren_pod(&cluster, Some(&first));
    let (status, result) = api
        .send(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": "cat /tmp/state"})),
        )
        .await;
    assert_eq!(
        (status, output(&result).as_str()),
        (200, "kept\n"),
        "the runtime was adopted: {result}\nthe first warren's log:\n{logs_before}\nthe second's:\n{}",
        warren_logs(&cluster, &second)
    );
    assert_eq!(
        sandbox_object(&cluster, "pods", &id).expect("the sandbox's pod")["metadata"]["uid"],
        pod_uid,
        "the same pod serves"
    );

    // Destroyed: its Pod, Service and NetworkPolicy go; its files stay.
    let (status, body) = api
        .send(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("terminated")),
        "{body}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    for kind in ["pods", "services", "networkpolicies"] {
        while let Some(left) = sandbox_object(&cluster, kind, &id) {
            assert!(
                Instant::now() < deadline,
                "the sandbox's {kind} is left: {left}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    assert!(made.exists(), "the workspace's files stay");

    // Nothing the Role lacks was asked for, not even where warren carries on without it.
    // (The API server words every RBAC refusal "… is forbidden: User … cannot …".)
    let logs = format!("{logs_before}{}", warren_logs(&cluster, &second));
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "warren was refused something:\n{logs}"
    );
}

/// warren's API in the cluster, with the provisioner token.
struct Api {
    url: String,
    http: reqwest::Client,
}

impl Api {
    /// The status and JSON body (`null` when not JSON) of one request.
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(TEST_TOKEN);
        if let Some(body) = body {
            request = match body {
                Value::String(text) => request.body(text),
                body => request.json(&body),
            };
        }
        let response = request.send().await.expect("warren in the cluster answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a readable body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Runs `command` in the sandbox, asserting the request and the command succeed.
    async fn exec(&self, id: &str, command: &str) -> Value {
        let (status, result) = self
            .send(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": command})),
            )
            .await;
        assert_eq!((status, &result["exit_code"]), (200, &json!(0)), "{result}");
        result
    }
}

/// Waits until one warren pod (not `old`) is Ready; its name. Shows the pods' state and
/// warren's log when none is within three minutes.
fn ready_warren_pod(cluster: &RealCluster, old: Option<&str>) -> String {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let pods = cluster.kubectl(&["get", "pods", "-l", WARREN_PODS, "-o", "json"]);
        let pods: Value = serde_json::from_slice(&pods.stdout).expect("kubectl prints JSON");
        let ready = pods["items"].as_array().into_iter().flatten().find(|pod| {
            pod["metadata"]["name"].as_str() != old
                && pod["metadata"]["deletionTimestamp"].is_null()
                && pod["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if let Some(pod) = ready {
            return pod["metadata"]["name"].as_str().expect("a name").to_owned();
        }
        if Instant::now() > deadline {
            let logs = cluster
                .command()
                .args(["logs", "-l", WARREN_PODS, "--all-containers", "--tail=50"])
                .output();
            panic!(
                "no warren pod is Ready after 180 s: {pods}\nlogs: {:?}",
                logs.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The log of warren's container in `pod`.
fn warren_logs(cluster: &RealCluster, pod: &str) -> String {
    let logs = cluster.kubectl(&["logs", pod, "-c", "warren"]);
    String::from_utf8_lossy(&logs.stdout).into_owned()
}

/// A sandbox's object of `kind` (by its `warren.dev/sandbox` label), if there is one.
fn sandbox_object(cluster: &RealCluster, kind: &str, id: &str) -> Option<Value> {
    let selector = format!("warren.dev/sandbox={id}");
    let list = cluster.kubectl(&["get", kind, "-l", &selector, "-o", "json"]);
    let list: Value = serde_json::from_slice(&list.stdout).expect("kubectl prints JSON");
    list["items"]
        .as_array()
        .and_then(|items| items.first())
        .cloned()
}

/// resource (`<resource>.<group>` outside the core group, as `kubectl auth can-i` names
/// it) → verbs of the Role in the manifests.
fn role_rules(manifests: &str) -> BTreeMap<String, BTreeSet<String>> {
    super::kubernetes_rbac::role_rules(manifests)
        .into_iter()
        .map(|((group, resource), verbs)| match group.as_str() {
            "" => (resource, verbs),
            group => (format!("{resource}.{group}"), verbs),
        })
        .collect()
}

/// The service account's own name, for `kubectl --as`.
fn service_account(cluster: &RealCluster) -> String {
    format!("system:serviceaccount:{}:{NAME}", cluster.namespace)
}

/// resource → verbs the service account may use in its namespace (`kubectl auth can-i
/// --list`), leaving out the reviews every authenticated user may create about itself.
fn permissions(cluster: &RealCluster) -> BTreeMap<String, BTreeSet<String>> {
    let list = cluster.kubectl(&["auth", "can-i", "--list", "--as", &service_account(cluster)]);
    let mut granted = BTreeMap::new();
    for line in String::from_utf8_lossy(&list.stdout).lines().skip(1) {
        // `Resources  Non-Resource URLs  Resource Names  Verbs`: a resource's row starts
        // with its name; a non-resource URL's with blanks.
        if line.starts_with(' ') {
            continue;
        }
        let resource = line.split_whitespace().next().expect("a resource");
        if resource.starts_with("selfsubject") {
            continue;
        }
        let verbs = line
            .rsplit_once('[')
            .and_then(|(_, verbs)| verbs.strip_suffix(']'))
            .unwrap_or_else(|| panic!("the verbs of {line:?}"));
        granted.insert(
            resource.to_owned(),
            verbs.split_whitespace().map(str::to_owned).collect(),
        );
    }
    granted
}

/// `kubectl auth can-i <verb> <resource>` as the service account (`pods/exec`: the
/// subresource `exec` of `pods`): `yes` or `no`.
fn can_i(cluster: &RealCluster, verb: &str, resource: &str) -> String {
    let mut command = cluster.command();
    command.args(["auth", "can-i", verb, "--as", &service_account(cluster)]);
    match resource.split_once('/') {
        Some((resource, sub)) => command.args([resource, "--subresource", sub]),
        None => command.arg(resource),
    };
    let output = command.output().expect("run kubectl");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
