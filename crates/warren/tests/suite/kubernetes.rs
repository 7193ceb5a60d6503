//! The Kubernetes backend end to end (issue 15): the real `warren serve --backend
//! kubernetes` on the real `kube::Client`, against the fake API server of the test support
//! crate (there is no kube-apiserver here), whose simulated kubelet runs each pod on this
//! machine: the root init container, the agent-bundle init container, and the sandbox
//! container running the real agent from that bundle, reached over its TCP transport.
//! Admission, scheduling, kube-proxy, NetworkPolicy enforcement and a real kubelet are
//! not exercised.
//!
//! The tests read the cluster back through the fake API server with a `kube::Client` of
//! their own (as `kubectl` would), inject the cluster's errors into it ([`Fault`]), and
//! look at the pods' processes on this machine, where the simulated kubelet runs them.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::kube::api::Fault;
use warren_test_support::kube::{NAMESPACE, UNPULLABLE_IMAGE};
use warren_test_support::TestServer;

use super::{bin, output};

fn server() -> TestServer {
    server_with("")
}

/// A server on a fresh test cluster, `extra` appended to its warren.toml's `[kubernetes]`
/// section: more keys of it, or whole tables after them (`[limits]`, `[sandbox_env]`).
fn server_with(extra: &str) -> TestServer {
    assert!(
        super::running_as_root(),
        "the Kubernetes tests need root: the simulated kubelet makes namespaces"
    );
    TestServer::start_kubernetes(bin(), extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_runs_in_a_pod_whose_agent_answers_over_tcp() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, result) = server
        .send_json(
            server
                .request(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&json!({"command": "id -u; id -g; pwd; cat /proc/1/cmdline | tr '\\0' ' '"})),
        )
        .await;
    assert_eq!(
        status,
        200,
        "{result}\n{}\n{}",
        logs(&server, &id, "agent-bundle"),
        logs(&server, &id, "sandbox")
    );
    let text = output(&result);
    assert_eq!(result["exit_code"], 0, "{result}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..3],
        ["1000", "1000", "/home/gem/user-data/projects/a"],
        "{text}"
    );
    assert!(
        lines[3].starts_with("/opt/warren-agent/ld.so --argv0 warren-agent"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_cross_the_boundary_between_warren_and_the_pod_as_1000() {
    files_cross_the_boundary_as_1000(server()).await;
}

/// Files written through the API and inside the pod are the sandbox user's on both sides;
/// files of the uid's subtree from before any pod (root's) are given to it once, by the
/// prepare init container (I19). On the fake cluster and on the real one
/// (`kubernetes_real::`).
pub(crate) async fn files_cross_the_boundary_as_1000(server: TestServer) {
    let id = server.sandbox("alice", "t", "projects/a").await;
    // Files of the uid's subtree from before any pod (root's, as an operator's copy
    // leaves them): the prepare init container gives them to the sandbox user, once.
    let subtree = user_data(&server).join("alice");
    let host_dir = subtree.join("workspace/projects/a");
    std::fs::create_dir_all(host_dir.join("old")).unwrap();
    std::fs::write(host_dir.join("old/root.txt"), "from root\n").unwrap();
    assert_eq!(std::fs::metadata(host_dir.join("old")).unwrap().uid(), 0);
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", "in/from-api.txt")])
                .body("written through the API\n"),
        )
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");

    let inside = server
        .exec(
            &id,
            "cat /home/gem/user-data/projects/a/in/from-api.txt; cat old/root.txt; \
             echo appended >> old/root.txt && echo appended-ok; \
             mkdir -p out && echo made inside > out/made.txt; \
             touch /home/gem/skills/x 2>&1; grep ' /home/gem/skills ' /proc/self/mounts",
        )
        .await;
    let text = output(&inside);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..3],
        ["written through the API", "from root", "appended-ok"],
        "{inside}"
    );
    assert!(
        lines[3].contains("Read-only file system"),
        "/home/gem/skills is read-only inside: {inside}"
    );
    assert!(lines[4].contains(" ro,"), "{inside}");

    let made = host_dir.join("out/made.txt");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "made inside\n");
    assert_eq!(
        std::fs::read_to_string(host_dir.join("old/root.txt")).unwrap(),
        "from root\nappended\n"
    );
    for path in [
        made,
        host_dir.join("out"),
        host_dir.join("old"),
        host_dir.join("old/root.txt"),
        host_dir.join("in/from-api.txt"),
    ] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{}", path.display());
    }
    assert!(
        subtree.join(".warren-owner-1000").exists(),
        "the migration left its marker beside the workspace"
    );
    // And back through the file API, the same bytes.
    let response = server
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=out/made.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "made inside\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_is_locked_down_and_the_sandbox_environment_stays_out_of_its_spec() {
    let server = server_with(
        "[sandbox_env]\nWARREN_TEST_PLAIN = \"plain-value-4711\"\n\
         [sandbox_secrets]\nWARREN_TEST_SECRET = \"secret-value-0815\"\n",
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server
        .exec(
            &id,
            "echo \"$WARREN_TEST_PLAIN\"; [ \"$WARREN_TEST_SECRET\" = secret-value-0815 ] && echo secret-ok; \
             env | grep -c WARREN_AGENT_KEY; cat /proc/1/environ >/dev/null 2>&1 || echo environ-closed",
        )
        .await;
    assert_eq!(
        output(&result),
        "plain-value-4711\nsecret-ok\n0\nenviron-closed\n",
        "{result}"
    );

    let pod = object(&server, Kind::Pod, &id)
        .await
        .expect("the sandbox's pod");
    let text = pod.to_string();
    for value in ["plain-value-4711", "secret-value-0815", "WARREN_TEST_"] {
        assert!(!text.contains(value), "{value} is in the pod: {text}");
    }
    let spec = &pod["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false, "{spec}");
    assert_eq!(spec["enableServiceLinks"], false, "{spec}");
    assert_eq!(
        spec["securityContext"],
        json!({"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
               "seccompProfile": {"type": "RuntimeDefault"}}),
        "{spec}"
    );
    for field in ["hostNetwork", "hostPID", "hostIPC", "serviceAccountName"] {
        assert!(spec.get(field).is_none(), "{field}: {spec}");
    }
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "no sidecar: {spec}");
    let sandbox = &containers[0];
    assert_eq!(sandbox["name"], "sandbox");
    assert_eq!(
        sandbox["securityContext"],
        json!({"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
               "privileged": false, "allowPrivilegeEscalation": false,
               "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]},
               "seccompProfile": {"type": "RuntimeDefault"}}),
        "{sandbox}"
    );
    // The key is the only variable of the spec.
    let env = sandbox["env"].as_array().unwrap();
    assert_eq!(env.len(), 1, "{sandbox}");
    assert_eq!(env[0]["name"], "WARREN_AGENT_KEY");
    // Requests equal limits, from the sandbox's limits.
    let resources = &sandbox["resources"];
    assert_eq!(resources["requests"], resources["limits"], "{resources}");
    for resource in ["cpu", "memory", "ephemeral-storage"] {
        assert!(
            resources["limits"][resource].is_string(),
            "{resource}: {resources}"
        );
    }

    let volumes: Vec<&Value> = spec["volumes"].as_array().unwrap().iter().collect();
    let claim_of = |volume: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == volume)
            .map(|v| v["persistentVolumeClaim"]["claimName"].clone())
    };
    assert!(
        volumes
            .iter()
            .all(|v| v.get("persistentVolumeClaim").is_some() || v.get("emptyDir").is_some()),
        "only claims and emptyDirs: {volumes:?}"
    );
    let persistent: Vec<Value> = sandbox["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| claim_of(m["name"].as_str().unwrap()).is_some_and(|claim| !claim.is_null()))
        .map(|m| {
            json!({
                "claim": claim_of(m["name"].as_str().unwrap()).unwrap(),
                "mountPath": m["mountPath"],
                "subPath": m["subPath"],
                "readOnly": m.get("readOnly").cloned().unwrap_or(json!(false)),
            })
        })
        .collect();
    assert_eq!(
        persistent,
        [
            json!({"claim": "warren-user-data", "mountPath": "/home/gem/user-data",
                   "subPath": "shared/alice/workspace", "readOnly": false}),
            json!({"claim": "warren-skills", "mountPath": "/home/gem/skills",
                   "subPath": "skill-projections/alice", "readOnly": true}),
        ],
        "exactly the two persistent mounts: {sandbox}"
    );
    // /home/gem and /tmp are size-limited emptyDirs.
    for (volume, path) in [("home", "/home/gem"), ("tmp", "/tmp")] {
        assert!(
            sandbox["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == volume && m["mountPath"] == path),
            "{sandbox}"
        );
        let source = volumes.iter().find(|v| v["name"] == volume).unwrap();
        assert!(
            source["emptyDir"]["sizeLimit"].is_string(),
            "{volume}: {source}"
        );
    }

    // Its Service and NetworkPolicy, of the same name, select exactly it; network `none`
    // allows no egress at all.
    let labels = &pod["metadata"]["labels"];
    let service = object(&server, Kind::Service, &id)
        .await
        .expect("the sandbox's Service");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    let policy = object(&server, Kind::NetworkPolicy, &id)
        .await
        .expect("the sandbox's NetworkPolicy");
    for selector in [
        &service["spec"]["selector"],
        &policy["spec"]["podSelector"]["matchLabels"],
    ] {
        let selector = selector.as_object().expect("a selector");
        assert!(!selector.is_empty());
        for (key, value) in selector {
            assert_eq!(&labels[key], value, "{key} selects the pod");
        }
        assert!(selector.values().any(|v| v == id.as_str()), "{selector:?}");
    }
    assert_eq!(
        policy["spec"]["policyTypes"],
        json!(["Ingress", "Egress"]),
        "{policy}"
    );
    assert!(
        policy["spec"]["egress"]
            .as_array()
            .is_none_or(|rules| rules.is_empty()),
        "{policy}"
    );
    // The environment is kept on warren's side, for this node alone.
    let state = server
        .data_dir()
        .join("kubernetes/state")
        .join(format!("{id}.json"));
    let mode = std::fs::metadata(&state).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", state.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_adopts_its_pod_and_replaces_one_tampered_with() {
    let mut server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let setup = server
        .exec(
            &id,
            "echo kept > /tmp/state; echo file > kept.txt; nohup sleep 307 >/dev/null 2>&1 &",
        )
        .await;
    assert_eq!(setup["exit_code"], 0, "{setup}");
    let first = pod_uid(&server, &id).await;

    server.restart_after_kill();
    let after = server
        .exec(&id, "cat /tmp/state kept.txt; ps -eo args")
        .await;
    let text = output(&after);
    assert!(text.starts_with("kept\nfile\n"), "{after}");
    assert!(
        text.contains("sleep 307"),
        "the background process lives on: {after}"
    );
    assert_eq!(pod_uid(&server, &id).await, first, "the same pod serves");
    assert!(host_processes("sleep 307").len() == 1);

    // Behind warren's back, while it is down: its pod's identity changes.
    server.kill();
    api(&server, Kind::Pod)
        .patch(
            &pod_name(&id),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"warren.dev/generation": "99"}}})),
        )
        .await
        .expect("patch the pod");
    server.start_again();
    assert!(
        object(&server, Kind::Pod, &id).await.is_none(),
        "the tampered pod is removed at start-up"
    );
    assert!(
        no_process_within("sleep 307", Duration::from_secs(10)).await,
        "the tampered pod's processes are gone"
    );
    let fresh = server
        .exec(
            &id,
            "cat kept.txt; cat /tmp/state 2>/dev/null || echo no-state",
        )
        .await;
    assert_eq!(output(&fresh), "file\nno-state\n", "{fresh}");
    let second = pod_uid(&server, &id).await;
    assert_ne!(second, first, "a fresh pod serves");
    let pod = object(&server, Kind::Pod, &id).await.unwrap();
    assert_eq!(pod["metadata"]["annotations"]["warren.dev/generation"], "1");
}

/// The E2B layout (I7) on Kubernetes: the pod's home is the workdir's subPath, its
/// `/etc/passwd` and `/etc/group` warren's, read-only (I11), and a restarted server adopts
/// exactly that pod. The layout's rules themselves run here too, as
/// `layouts::e2b::kubernetes::*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_e2b_sandbox_runs_in_a_pod_whose_home_is_its_workdir_and_is_adopted_after_a_restart() {
    let mut server = server();
    server.workdir("alice", "e2b/s1").await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "e2b", "workdir": "e2b/s1", "layout": "e2b",
        })))
        .await;
    assert!(status == 201 || status == 200, "{status} {body}");
    let id = body["sandbox_id"].as_str().unwrap().to_owned();
    let result = server
        .exec(
            &id,
            "whoami; echo $HOME; pwd; echo hi > /home/user/x; grep '^user:' /etc/passwd; \
             (echo x >> /etc/passwd) 2>/dev/null && echo writable || echo read-only; \
             ls -A /home/user",
        )
        .await;
    assert_eq!(
        output(&result),
        "user\n/home/user\n/home/user\nuser:x:1000:1000:user:/home/user:/bin/sh\nread-only\nx\n",
        "{result}\n{}",
        logs(&server, &id, "sandbox")
    );
    let response = server
        .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", "/home/user/x")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "hi\n");
    let on_claim = user_data(&server).join("alice/workspace/e2b/s1/x");
    assert_eq!(std::fs::metadata(&on_claim).unwrap().uid(), 1000, "I11");

    // The pod as the cluster holds it: no home emptyDir (I30), the accounts emptyDir.
    let pod = object(&server, Kind::Pod, &id).await.unwrap();
    let volumes: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(volumes, ["user-data", "skills", "tmp", "agent", "accounts"]);
    let mounts = pod["spec"]["containers"][0]["volumeMounts"].clone();
    for want in [
        json!({"name": "user-data", "mountPath": "/home/user", "subPath": "shared/alice/workspace/e2b/s1"}),
        json!({"name": "accounts", "mountPath": "/etc/passwd", "subPath": "passwd", "readOnly": true}),
        json!({"name": "accounts", "mountPath": "/etc/group", "subPath": "group", "readOnly": true}),
    ] {
        assert!(
            mounts.as_array().unwrap().contains(&want),
            "{want} in {mounts}"
        );
    }
    assert_eq!(pod["metadata"]["annotations"]["warren.dev/layout"], "e2b");

    // A restarted server adopts exactly this pod: the same one serves, as `user`.
    let first = pod_uid(&server, &id).await;
    server.restart_after_kill();
    let after = server.exec(&id, "cat ~/x; whoami; echo $HOME").await;
    assert_eq!(output(&after), "hi\nuser\n/home/user\n", "{after}");
    assert_eq!(pod_uid(&server, &id).await, first, "the E2B pod is adopted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_behind_warrens_back_is_replaced_by_a_fresh_one() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo kept > kept.txt").await;
    let first = pod_uid(&server, &id).await;
    let pods = api(&server, Kind::Pod);

    // Deleted under a running command (an eviction, `kubectl delete pod`): the command
    // ends with its pod, and the next exec gets a fresh pod at once.
    let running = tokio::spawn(
        server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .json(&json!({"command": "echo started; sleep 315", "timeout_s": 60}))
            .send(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while host_processes("sleep 315").is_empty() {
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pods.delete(&pod_name(&id), &DeleteParams::default())
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the command ends with its pod")
        .unwrap()
        .unwrap();
    assert_ne!(answer.status(), 200, "{:?}", answer.text().await);
    let started = Instant::now();
    let result = server.exec(&id, "cat kept.txt").await;
    assert_eq!(result["stdout"], "kept\n", "{result}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let second = pod_uid(&server, &id).await;
    assert_ne!(second, first);

    // Deleted while idle: once it is gone from the node, nothing answers at its address,
    // and connecting there times out (after the agent client's 10 s) rather than being
    // refused. That exec fails (or, should a refusal come first, runs in a fresh pod);
    // the cluster says the pod is gone, and the next one surely gets a fresh pod.
    server.exec(&id, "echo mine > /tmp/state").await;
    let netns = server
        .cluster()
        .unwrap()
        .kubelet
        .pod(NAMESPACE, &pod_name(&id))
        .and_then(|pod| pod.netns)
        .expect("the pod's network namespace");
    pods.delete(&pod_name(&id), &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::path::Path::new("/run/netns").join(&netns).exists() {
        assert!(Instant::now() < deadline, "the pod's network stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = exec_raw(
        &server,
        &id,
        json!({"command": "cat /tmp/state 2>/dev/null || echo fresh"}),
    )
    .await;
    assert!(
        status != 200 || body["stdout"] == "fresh\n",
        "{status} {body}"
    );
    let started = Instant::now();
    let result = server
        .exec(
            &id,
            "cat kept.txt; cat /tmp/state 2>/dev/null || echo fresh",
        )
        .await;
    assert_eq!(result["stdout"], "kept\nfresh\n", "{result}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let third = pod_uid(&server, &id).await;
    assert!(third != first && third != second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_layout_pod_is_removed_at_start_up_and_an_exact_one_adopted() {
    let mut server = server();
    let kept = server.sandbox("alice", "kept", "projects/a").await;
    let legacy = server.sandbox("alice", "legacy", "projects/a").await;
    for id in [&kept, &legacy] {
        assert_eq!(server.exec(id, "true").await["exit_code"], 0);
    }
    server.kill();
    // Both pods made again from their own manifests, as another warren of this instance
    // (a replica, an older version) would have made them: one exactly as warren makes it,
    // one with the old `/home/gem/projects` mount beside the two of its layout.
    let pods = api(&server, Kind::Pod);
    for (id, legacy) in [(&kept, false), (&legacy, true)] {
        let mut pod = object(&server, Kind::Pod, id).await.unwrap();
        pods.delete(&pod_name(id), &DeleteParams::default())
            .await
            .unwrap();
        let metadata = pod["metadata"].as_object_mut().unwrap();
        metadata.retain(|key, _| {
            ["name", "namespace", "labels", "annotations"].contains(&key.as_str())
        });
        pod.as_object_mut().unwrap().remove("status");
        if legacy {
            let projects = json!({
                "name": "user-data",
                "mountPath": "/home/gem/projects",
                "subPath": "shared/alice/workspace/projects",
            });
            let mounts = &mut pod["spec"]["containers"][0]["volumeMounts"];
            mounts.as_array_mut().unwrap().push(projects);
        }
        let pod: DynamicObject = serde_json::from_value(pod).unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for id in [&kept, &legacy] {
        wait_ready(&server, id).await;
    }
    let kept_uid = pod_uid(&server, &kept).await;
    let legacy_uid = pod_uid(&server, &legacy).await;

    server.start_again();
    assert!(
        object(&server, Kind::Pod, &legacy).await.is_none(),
        "the legacy layout's pod is removed"
    );
    for kind in [Kind::Service, Kind::NetworkPolicy] {
        assert!(
            object(&server, kind, &legacy).await.is_none(),
            "and its {kind:?}"
        );
    }
    assert_eq!(
        pod_uid(&server, &kept).await,
        kept_uid,
        "the exact pod is adopted"
    );
    let result = server.exec(&kept, "ls /home/gem").await;
    assert!(!output(&result).contains("projects"), "{result}");
    // The legacy sandbox starts again in a pod of its layout.
    let result = server
        .exec(&legacy, "ls -d /home/gem/projects 2>&1 || echo absent")
        .await;
    assert!(output(&result).ends_with("absent\n"), "{result}");
    assert_ne!(pod_uid(&server, &legacy).await, legacy_uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_image_cannot_be_pulled_is_named_and_removed() {
    let server = server();
    server.workdir("alice", "projects/a").await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "t", "workdir": "projects/a",
            "image": UNPULLABLE_IMAGE,
        })))
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["sandbox_id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let (status, body) = exec_raw(&server, &id, json!({"command": "true"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("runtime_not_ready")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ImagePullBackOff") || message.contains("ErrImagePull"),
        "{message}"
    );
    assert!(message.contains(UNPULLABLE_IMAGE), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "failed early, not at the ready timeout"
    );
    assert_gone(&server, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unschedulable_pod_is_named_and_removed() {
    // More CPU than the simulated node has (64 cores).
    let server = server_with("[limits]\ncpu_millis = 128000\n");
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, body) = exec_raw(&server, &id, json!({"command": "true"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("runtime_not_ready")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("Unschedulable") && message.contains("Insufficient cpu"),
        "{message}"
    );
    assert_gone(&server, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_errors_are_mapped_and_retried_where_kubernetes_allows() {
    let server = server();
    let cluster = server.cluster().unwrap();
    let pod_create = |status: u16, times: usize| Fault {
        method: Some(Method::POST),
        times,
        ..Fault::new(status, &format!("/api/v1/namespaces/{NAMESPACE}/pods"))
    };
    let pod_posts = || {
        cluster
            .api
            .requests()
            .into_iter()
            .filter(|(method, path)| {
                method == Method::POST
                    && path.starts_with(&format!("/api/v1/namespaces/{NAMESPACE}/pods"))
            })
            .count()
    };

    // 403: warren's service account may not: the operator's to fix, never retried.
    let id = server.sandbox("alice", "forbidden", "projects/a").await;
    cluster.api.clear_requests();
    cluster.api.inject(pod_create(403, 1));
    let (status, body) = exec_raw(&server, &id, json!({"command": "true"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("cluster_forbidden")),
        "{body}"
    );
    assert_eq!(pod_posts(), 1, "a 403 is not retried");
    // Granted again: the next start reuses the policy and Service it made.
    let result = server.exec(&id, "echo ok").await;
    assert_eq!(result["stdout"], "ok\n", "{result}");

    // 422: the cluster refuses the object; not retried either.
    let id = server.sandbox("alice", "invalid", "projects/a").await;
    cluster.api.clear_requests();
    cluster.api.inject(pod_create(422, 1));
    let (status, body) = exec_raw(&server, &id, json!({"command": "true"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("cluster_refused")),
        "{body}"
    );
    assert_eq!(pod_posts(), 1, "a 422 is not retried");

    // 429 twice, then the create lands: retried with backoff, the exec works.
    let id = server.sandbox("alice", "throttled", "projects/a").await;
    cluster.api.clear_requests();
    cluster.api.inject(Fault {
        retry_after: Some(1),
        ..pod_create(429, 2)
    });
    let result = server.exec(&id, "echo ok").await;
    assert_eq!(result["stdout"], "ok\n", "{result}");
    assert_eq!(pod_posts(), 3, "{:?}", cluster.api.requests());

    // 500 once: retried.
    let id = server.sandbox("alice", "outage", "projects/a").await;
    cluster.api.clear_requests();
    cluster.api.inject(pod_create(500, 1));
    let result = server.exec(&id, "echo ok").await;
    assert_eq!(result["stdout"], "ok\n", "{result}");
    assert_eq!(pod_posts(), 2, "{:?}", cluster.api.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_watch_that_expires_is_resumed_and_the_pod_still_ready() {
    let server = server();
    let cluster = server.cluster().unwrap();
    let watches = |id: &str| {
        let name = pod_name(id);
        cluster
            .api
            .requests()
            .into_iter()
            .filter(|(method, path)| {
                method == Method::GET && path.contains("watch=true") && path.contains(&name)
            })
            .count()
    };

    // The watch request itself answered 410 Gone.
    let id = server.sandbox("alice", "gone", "projects/a").await;
    cluster.api.inject(Fault {
        method: Some(Method::GET),
        ..Fault::new(410, "watch=true")
    });
    let result = server.exec(&id, "echo ok").await;
    assert_eq!(result["stdout"], "ok\n", "{result}");
    assert!(watches(&id) >= 2, "{:?}", cluster.api.requests());

    // Every open watch ended with a 410 Expired event while the pod starts.
    let id = server.sandbox("alice", "expired", "projects/a").await;
    let exec = server.exec(&id, "echo ok");
    // From the moment the backend watches the pod until it is ready.
    let expire = async {
        loop {
            if watches(&id) > 0 {
                cluster.api.expire_watches();
                tokio::time::sleep(Duration::from_millis(100)).await;
            } else {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let result = tokio::select! {
        result = exec => result,
        _ = expire => unreachable!(),
    };
    assert_eq!(result["stdout"], "ok\n", "{result}");
    assert!(watches(&id) >= 2, "{:?}", cluster.api.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_sandbox_removes_its_objects_and_the_next_start_gets_a_new_key() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo keep > kept.txt").await;
    let old = object(&server, Kind::Pod, &id).await.unwrap();
    for kind in [Kind::Service, Kind::NetworkPolicy] {
        assert!(object(&server, kind, &id).await.is_some(), "{kind:?}");
    }
    server.terminate(&id).await;
    assert_gone(&server, &id).await;
    let kept = user_data(&server).join("alice/workspace/projects/a/kept.txt");
    assert_eq!(std::fs::read_to_string(kept).unwrap(), "keep\n");

    // The same (uid, scope) again: a new generation, a new pod, a new key.
    assert_eq!(server.sandbox("alice", "t", "projects/a").await, id);
    let result = server.exec(&id, "cat kept.txt").await;
    assert_eq!(result["stdout"], "keep\n", "{result}");
    let new = object(&server, Kind::Pod, &id).await.unwrap();
    assert_ne!(new["metadata"]["uid"], old["metadata"]["uid"]);
    let generation = |pod: &Value| {
        pod["metadata"]["annotations"]["warren.dev/generation"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };
    assert!(generation(&new) > generation(&old), "{new}");
    let key = |pod: &Value| pod["spec"]["containers"][0]["env"][0]["value"].clone();
    assert!(key(&old).is_string());
    assert_ne!(
        key(&new),
        key(&old),
        "each generation has its own agent key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroying_mid_command_and_timeouts_leave_no_process_in_the_pod() {
    let server = server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // A timeout kills the whole tree, setsid grandchildren included.
    let started = Instant::now();
    let result = server
        .exec_with(&id, json!({"command": "setsid sh -c 'sleep 311' & sh -c 'sleep 312' & (setsid sh -c 'sleep 310 &' &); sleep 313", "timeout_s": 1}))
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        (&result["timed_out"], &result["signal"]),
        (&json!(true), &json!(9)),
        "{result}"
    );
    let ps = server.exec(&id, "ps -eo args").await;
    for sleeper in ["sleep 310", "sleep 311", "sleep 312", "sleep 313"] {
        assert!(!output(&ps).contains(sleeper), "{sleeper} survived: {ps}");
        assert!(host_processes(sleeper).is_empty(), "{sleeper} survived");
    }

    // Destroyed while a command runs: the command goes with its pod.
    let running = {
        let request = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .json(&json!({"command": "sleep 314", "timeout_s": 600}))
            .send();
        tokio::spawn(request)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while host_processes("sleep 314").is_empty() {
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.terminate(&id).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the running exec ends with its sandbox")
        .unwrap();
    let response = answer.expect("an answer");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or_default();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("sandbox_terminated")),
        "{body}"
    );
    assert!(no_process_within("sleep 314", Duration::from_secs(10)).await);
    assert_gone(&server, &id).await;
}

// ---- Reading the cluster back, as `kubectl` would. ----

#[derive(Debug, Clone, Copy)]
enum Kind {
    Pod,
    Service,
    NetworkPolicy,
}

/// The test cluster's API for `kind` in the sandboxes' namespace, on a client of the test's.
fn api(server: &TestServer, kind: Kind) -> Api<DynamicObject> {
    let cluster = server.cluster().expect("a Kubernetes server");
    let gvk = match kind {
        Kind::Pod => GroupVersionKind::gvk("", "v1", "Pod"),
        Kind::Service => GroupVersionKind::gvk("", "v1", "Service"),
        Kind::NetworkPolicy => GroupVersionKind::gvk("networking.k8s.io", "v1", "NetworkPolicy"),
    };
    Api::namespaced_with(
        cluster.api.client(),
        NAMESPACE,
        &ApiResource::from_gvk(&gvk),
    )
}

/// The name of a sandbox's Pod, Service and NetworkPolicy (instance `test`).
fn pod_name(id: &str) -> String {
    format!("warren-test-{id}")
}

/// A sandbox's object of `kind` as JSON, if there is one.
async fn object(server: &TestServer, kind: Kind, id: &str) -> Option<Value> {
    api(server, kind)
        .get_opt(&pod_name(id))
        .await
        .expect("the fake API server answers")
        .map(|object| serde_json::to_value(object).unwrap())
}

async fn pod_uid(server: &TestServer, id: &str) -> String {
    let pod = object(server, Kind::Pod, id).await.expect("a pod");
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// Waits until the sandbox's pod reports Ready.
async fn wait_ready(server: &TestServer, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod = object(server, Kind::Pod, id).await;
        let ready = pod.as_ref().is_some_and(|pod| {
            pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "not ready: {pod:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that nothing of the sandbox is left in the cluster: no Pod, Service or
/// NetworkPolicy in the API, nothing running on the simulated node.
async fn assert_gone(server: &TestServer, id: &str) {
    for kind in [Kind::Pod, Kind::Service, Kind::NetworkPolicy] {
        let found = object(server, kind, id).await;
        assert!(found.is_none(), "{kind:?} left: {found:?}");
    }
    let cluster = server.cluster().unwrap();
    assert!(
        cluster.kubelet.pod(NAMESPACE, &pod_name(id)).is_none(),
        "the kubelet still runs the pod"
    );
}

/// The USER_DATA claim's `shared/` directory, as warren sees it (on the fake cluster or
/// the real one).
fn user_data(server: &TestServer) -> PathBuf {
    let workspace = match (server.cluster(), server.real_cluster()) {
        (Some(cluster), _) => cluster.workspace.path(),
        (None, Some(cluster)) => cluster.workspace.path(),
        (None, None) => panic!("not a Kubernetes server"),
    };
    workspace.join("user-data/shared")
}

/// Runs an exec request; its status and JSON body, whatever they are.
async fn exec_raw(server: &TestServer, id: &str, body: Value) -> (u16, Value) {
    server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&body),
        )
        .await
}

/// Pids of this machine's processes whose command line is exactly `args` (the simulated
/// kubelet runs every pod's processes here).
fn host_processes(args: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let words: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        if words.join(" ") == args {
            found.push(pid);
        }
    }
    found
}

/// Whether every process `args` names is gone within `within` (a deleted pod's
/// containers are killed by the kubelet's thread, soon after the API forgets the pod).
async fn no_process_within(args: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !host_processes(args).is_empty() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// What a container of the sandbox's pod wrote, for a failure's message.
fn logs(server: &TestServer, id: &str, container: &str) -> String {
    let cluster = server.cluster().expect("a Kubernetes server");
    cluster
        .kubelet
        .logs(NAMESPACE, &pod_name(id), container)
        .unwrap_or_default()
}

/// A python fetch through the proxy the environment names (`NO_PROXY` emptied, so loopback
/// names go through it too); prints the body or `HTTP <status> <message>`.
fn fetch(url: &str) -> Value {
    json!({
        "command": format!(
            "python3 -c \"import urllib.request, urllib.error\ntry: print(urllib.request.urlopen('{url}', timeout=10).read().decode())\nexcept urllib.error.HTTPError as e: print('HTTP', e.code, e.read().decode())\nexcept Exception as e: print('FAILED', e)\""
        ),
        "env": {"NO_PROXY": "", "no_proxy": ""},
    })
}

/// An HTTP server on this machine's loopback answering `body`, and how many it answered.
async fn loopback_service(
    address: &str,
    body: &'static str,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    tokio::task::JoinHandle<()>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((address, 0)).await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = answered.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut head = [0u8; 4096];
            let _ = connection.read(&mut head).await;
            let reply = format!(
                "HTTP/1.0 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = connection.write_all(reply.as_bytes()).await;
        }
    });
    (url, answered, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_egress_goes_through_warrens_proxy_under_its_sandboxs_policy() {
    use std::sync::atomic::Ordering;
    let server = server();
    server.workdir("alice", "projects/a").await;
    let (listed, listed_answers, listed_task) =
        loopback_service("127.0.0.1", "listed-service").await;
    let (unlisted, unlisted_answers, unlisted_task) =
        loopback_service("127.0.0.2", "unlisted-service").await;
    let create = |scope: &'static str, network: Value| {
        let server = &server;
        async move {
            let (status, body) = server
                .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                    "uid": "alice", "runtime_scope_id": scope, "workdir": "projects/a", "network": network,
                })))
                .await;
            assert_eq!(status, 201, "{body}");
            body["sandbox_id"].as_str().unwrap().to_owned()
        }
    };
    // The listed destination is an address of this machine, which only an explicit
    // address in the allowlist reaches (as on every backend).
    let id = create(
        "allow",
        json!({"mode": "allowlist", "allow": ["127.0.0.1"]}),
    )
    .await;
    let env = server.exec(&id, "env | grep '^HTTP_PROXY='").await;
    assert!(
        output(&env).starts_with("HTTP_PROXY=http://10.232."),
        "the pod dials warren's proxy at its node's address: {env}"
    );
    let through = server.exec_with(&id, fetch(&listed)).await;
    assert_eq!(output(&through).trim(), "listed-service", "{through}");
    assert_eq!(listed_answers.load(Ordering::SeqCst), 1);
    let refused = server.exec_with(&id, fetch(&unlisted)).await;
    assert!(output(&refused).starts_with("HTTP 403"), "{refused}");
    assert_eq!(
        unlisted_answers.load(Ordering::SeqCst),
        0,
        "the unlisted service saw a connection"
    );

    // Open egress never reaches this machine or internal networks.
    let open = create("open", json!({"mode": "open"})).await;
    for target in [
        unlisted.clone(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
    ] {
        let result = server.exec_with(&open, fetch(&target)).await;
        assert!(
            output(&result).starts_with("HTTP 403"),
            "{target}: {result}"
        );
    }
    assert_eq!(unlisted_answers.load(Ordering::SeqCst), 0);

    // A pod without egress gets no proxy, and the proxy serves it nothing: a connection
    // from its address is closed unanswered.
    let none = server.sandbox("alice", "none", "projects/a").await;
    let env = server.exec(&none, "env | grep -ci proxy; true").await;
    assert_eq!(output(&env).trim(), "0", "{env}");
    let proxy_port = server
        .exec(&open, "env | sed -n 's/^HTTP_PROXY=.*://p'")
        .await;
    let port = output(&proxy_port).trim().to_owned();
    let node = server
        .cluster()
        .unwrap()
        .kubelet
        .pod(NAMESPACE, &format!("warren-test-{none}"))
        .and_then(|pod| pod.host_ip)
        .expect("the pod's node address");
    let sneaking = server
        .exec(
            &none,
            &format!(
                "python3 -c \"import socket\ntry:\n s=socket.create_connection(('{node}', {port}), timeout=5)\n s.sendall(b'GET {unlisted} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n print('ANSWER', s.recv(100))\nexcept Exception as e: print('NONE', e)\""
            ),
        )
        .await;
    let said = output(&sneaking);
    assert!(
        said.starts_with("ANSWER b''") || said.starts_with("NONE"),
        "the proxy answered a pod without egress: {sneaking}"
    );
    assert_eq!(unlisted_answers.load(Ordering::SeqCst), 0);

    // The NetworkPolicy lets the pod reach warren's proxy port and nothing else.
    let client = server.cluster().unwrap().api.client();
    let policies: Api<DynamicObject> = Api::namespaced_with(
        client,
        NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
        )),
    );
    let policy = policies.get(&format!("warren-test-{id}")).await.unwrap();
    let egress = &policy.data["spec"]["egress"];
    assert_eq!(egress.as_array().map(Vec::len), Some(1), "{egress}");
    assert_eq!(
        egress[0]["ports"][0]["port"],
        json!(port.parse::<u16>().unwrap()),
        "{egress}"
    );
    listed_task.abort();
    unlisted_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_sandbox_is_refused_a_pod_that_would_show_the_persistent_workspace() {
    let server = server();
    // The uid's persistent workdir exists: a pod mounting it by subPath would start.
    server.workdir("alice", "projects/a").await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "scratch", "workdir": "projects/a",
            "ephemeral": true,
        })))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "host_mounts_unsupported", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ephemeral")),
        "{body}"
    );
    let (status, listed) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes?uid=alice"))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["sandboxes"], json!([]), "nothing was recorded");
}
