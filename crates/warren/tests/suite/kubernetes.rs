//! The Kubernetes backend end to end (issue 15): the real `warren serve --backend
//! kubernetes` on the real `kube::Client`, against the fake API server of the test support
//! crate (there is no kube-apiserver here), whose simulated kubelet runs each pod on this
//! machine: the root init container, the agent-bundle init container, and the sandbox
//! container running the real agent from that bundle, reached over its TCP transport.
//! Admission, scheduling, kube-proxy, NetworkPolicy enforcement and a real kubelet are
//! not exercised.

use serde_json::json;
use warren_test_support::TestServer;

use super::{bin, output};

fn server() -> TestServer {
    assert!(
        super::running_as_root(),
        "the Kubernetes tests need root: the simulated kubelet makes namespaces"
    );
    TestServer::start_kubernetes(bin(), "")
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

/// What a container of the sandbox's pod wrote, for a failure's message.
fn logs(server: &TestServer, id: &str, container: &str) -> String {
    let cluster = server.cluster().expect("a Kubernetes server");
    cluster
        .kubelet
        .logs(
            warren_test_support::kube::NAMESPACE,
            &format!("warren-test-{id}"),
            container,
        )
        .unwrap_or_default()
}
