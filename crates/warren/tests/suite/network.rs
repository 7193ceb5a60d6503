//! Network policies (I23): loopback only by default; `open` and `allowlist` egress only
//! through warren's filtering proxy, never to the host or internal networks.
//!
//! Destinations are test hosts this test makes itself: network namespaces with addresses
//! from TEST-NET-1 (192.0.2.0/24, RFC 5737) behind a veth pair, serving HTTP.

use std::sync::atomic::{AtomicU32, Ordering};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::conformance::Host;
use super::output as out;
use super::runtime::local;

/// A test host in its own network namespace, reached over a veth pair: TEST-NET-1
/// addresses (RFC 5737), an HTTP server answering with a fixed body. Not an address of this
/// machine's namespace, so the proxy treats it as a remote host. Removed on drop.
struct TestHost {
    namespace: String,
    /// The host side of the link: an address of this machine (for the local-address attack).
    local_address: String,
    address: String,
    port: u16,
    server: std::process::Child,
    _root: tempfile::TempDir,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) {
    let status = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("ip(8) runs");
    assert!(
        status.success(),
        "ip {args:?} failed: the network tests need root and iproute2"
    );
}

impl TestHost {
    async fn start(body: &'static str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}n{n}", std::process::id() % 10_000);
        let namespace = format!("wt{tag}");
        let (outer, inner) = (format!("wt{tag}a"), format!("wt{tag}b"));
        let base = 10 + (std::process::id() % 20) * 10 + n * 2;
        let local_address = format!("192.0.2.{base}");
        let address = format!("192.0.2.{}", base + 1);
        ip(&["netns", "add", &namespace]);
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ]);
        ip(&["link", "set", &inner, "netns", &namespace]);
        ip(&["addr", "add", &format!("{local_address}/31"), "dev", &outer]);
        ip(&["link", "set", &outer, "up"]);
        ip(&[
            "-n",
            &namespace,
            "addr",
            "add",
            &format!("{address}/31"),
            "dev",
            &inner,
        ]);
        ip(&["-n", &namespace, "link", "set", &inner, "up"]);
        ip(&["-n", &namespace, "link", "set", "lo", "up"]);
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("index.html"), body).unwrap();
        let port = 8000 + (base as u16);
        let server = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &namespace,
                "python3",
                "-m",
                "http.server",
                "--bind",
                &address,
            ])
            .arg(port.to_string())
            .current_dir(root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect((address.as_str(), port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the test host did not start"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Self {
            namespace,
            local_address,
            address,
            port,
            server,
            _root: root,
        }
    }

    fn url(&self) -> String {
        format!("http://{}:{}/", self.address, self.port)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        // Deleting the namespace deletes its end of the veth, and with it the pair.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

async fn sandbox_with(server: &TestServer, scope: &str, network: serde_json::Value) -> String {
    server.workdir("alice", "projects/a").await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": scope, "workdir": "projects/a", "network": network,
        })))
        .await;
    assert_eq!(status, 201, "{body}");
    body["sandbox_id"].as_str().unwrap().to_owned()
}

/// A python fetch through the proxy; prints the body or `HTTP <status> <message>`.
fn fetch(url: &str) -> String {
    format!(
        "python3 -c \"import urllib.request, urllib.error, os\ntry: print(urllib.request.urlopen('{url}', timeout=10).read().decode())\nexcept urllib.error.HTTPError as e: print('HTTP', e.code, e.read().decode())\nexcept Exception as e: print('FAILED', e)\""
    )
}

pub(crate) async fn an_allowlist_lets_through_exactly_the_listed_destinations(host: Host) {
    let allowed = TestHost::start("allowed-host").await;
    let other = TestHost::start("other-host").await;
    let server = host.start();
    let id = sandbox_with(
        &server,
        "t",
        json!({"mode": "allowlist", "allow": [allowed.address]}),
    )
    .await;
    let result = server.exec(&id, &fetch(&allowed.url())).await;
    assert_eq!(out(&result).trim(), "allowed-host", "{result}");
    let refused = server.exec(&id, &fetch(&other.url())).await;
    assert!(out(&refused).starts_with("HTTP 403"), "{refused}");
    assert!(out(&refused).contains("not allowed by this sandbox's network policy"));
    // CONNECT tunnels (HTTPS and any TCP) obey the same list.
    let tunnel = format!(
        "python3 -c \"import socket\ns=socket.create_connection(('127.0.0.1', 3128))\ns.sendall(b'CONNECT {a}:{p} HTTP/1.1\\r\\nHost: {a}\\r\\n\\r\\n')\nprint(s.recv(100).split(b'\\r\\n')[0].decode())\ns.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\nimport time; time.sleep(0.5); print(s.recv(1000).decode().split('\\r\\n\\r\\n')[-1])\"",
        a = allowed.address,
        p = allowed.port
    );
    let tunneled = server.exec(&id, &tunnel).await;
    assert_eq!(
        out(&tunneled),
        "HTTP/1.1 200 Connection established\nallowed-host\n",
        "{tunneled}"
    );
}

pub(crate) async fn open_egress_never_reaches_the_host_or_internal_networks(host: Host) {
    let public = TestHost::start("public-host").await;
    let server = host.start();
    let id = sandbox_with(&server, "t", json!({"mode": "open"})).await;
    assert_eq!(
        out(&server.exec(&id, &fetch(&public.url())).await).trim(),
        "public-host"
    );
    let api_port = server.url.rsplit(':').next().unwrap().to_owned();
    // A service on a non-loopback address of the host itself: still the host.
    let on_host = tokio::net::TcpListener::bind((public.local_address.as_str(), 0))
        .await
        .unwrap();
    let on_host_port = on_host.local_addr().unwrap().port();
    for target in [
        format!("http://{}:{on_host_port}/", public.local_address),
        format!("http://127.0.0.1:{api_port}/health"),
        format!("http://localhost:{api_port}/health"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "http://192.168.1.1/".to_owned(),
    ] {
        // NO_PROXY emptied so even loopback names go through the proxy (a direct
        // connection stays inside the runtime's own loopback anyway).
        let result = server
            .exec_with(
                &id,
                json!({"command": fetch(&target), "env": {"NO_PROXY": "", "no_proxy": ""}}),
            )
            .await;
        assert!(out(&result).starts_with("HTTP 403"), "{target}: {result}");
    }
}

pub(crate) async fn without_a_network_policy_there_is_no_way_out(host: Host) {
    let server = host.start();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let env = server.exec(&id, "env | grep -i proxy; true").await;
    assert_eq!(out(&env), "", "no proxy variables");
    let direct = server
        .exec(&id, "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 3128), timeout=2)\"")
        .await;
    assert_ne!(direct["exit_code"], 0, "nothing listens on the proxy port");
}

#[tokio::test]
async fn the_network_policy_is_part_of_the_binding() {
    let server = local();
    sandbox_with(&server, "t", json!({"mode": "none"})).await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "t", "workdir": "projects/a", "network": {"mode": "open"},
        })))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("network_conflict")),
        "{body}"
    );
    for network in [
        json!({"mode": "everything"}),
        json!({"mode": "allowlist", "allow": []}),
        json!({"mode": "allowlist", "allow": ["not a host"]}),
        json!({"mode": "open", "allow": ["pypi.org"]}),
    ] {
        let (status, body) = server
            .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                "uid": "alice", "runtime_scope_id": "u", "workdir": "projects/a", "network": network,
            })))
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_network")),
            "{network}: {body}"
        );
    }
    let (_, listed) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes?uid=alice"))
        .await;
    assert_eq!(listed["sandboxes"][0]["network"], json!({"mode": "none"}));
}
