//! Network policies (I23): loopback only by default; `open` and `allowlist` egress only
//! through warren's filtering proxy, never to the host or internal networks.
//!
//! Destinations are test hosts this test makes itself: network namespaces behind a veth
//! pair, serving HTTP and counting the connections they accept. No test sends a packet
//! anywhere else: every address used is on loopback or on a link the test made.

use std::sync::atomic::{AtomicU32, Ordering};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::conformance::Host;
use super::output as out;
use super::runtime::local;

/// Which addresses a [`TestHost`] link gets.
#[derive(Clone, Copy)]
pub(crate) enum Subnet {
    /// 192.52.193.0/24 (AMT, RFC 7450): globally reachable by IANA's special-purpose
    /// registry, so `open` egress may reach it; nothing on a test machine uses it, and the
    /// link's /31 route keeps every packet on this machine.
    Global,
    /// 192.0.2.0/24 (TEST-NET-1, RFC 5737): not globally reachable. A host whose own
    /// network is one of these ranges must not give sandboxes its neighbours.
    Documentation,
}

/// A test host in its own network namespace, reached over a veth pair, with an HTTP
/// server answering with a fixed body and counting the connections it accepts. Not an
/// address of this machine's namespace, so the proxy treats it as a remote host. Removed
/// on drop.
pub(crate) struct TestHost {
    namespace: String,
    /// The host side of the link: an address of this machine (for the local-address attack).
    pub(crate) local_address: String,
    pub(crate) address: String,
    pub(crate) port: u16,
    server: std::process::Child,
    root: tempfile::TempDir,
}

/// The test host's server: one connection at a time, the count of accepted connections
/// written to `accepts` (`0` once listening), a fixed HTTP answer to each request.
const COUNTING_SERVER: &str = r#"
import socket, sys
address, port, body, accepts = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[-1]
def count(n):
    with open(accepts + ".new", "w") as f:
        f.write(str(n))
    import os; os.replace(accepts + ".new", accepts)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((address, port))
s.listen(64)
count(0)
n = 0
while True:
    c, _ = s.accept()
    n += 1
    count(n)
    c.settimeout(5)
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = c.recv(4096)
            if not chunk:
                break
            head += chunk
        c.sendall(b"HTTP/1.0 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    c.close()
"#;

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
    /// A host on [`Subnet::Global`] addresses.
    async fn start(body: &'static str) -> Self {
        Self::start_on(Subnet::Global, body).await
    }

    async fn start_on(subnet: Subnet, body: &'static str) -> Self {
        Self::start_serving(subnet, COUNTING_SERVER, |_| vec![body.to_owned()]).await
    }

    /// A host on `subnet` running the python `script` with its address, its port, then
    /// what `args` gives for its address, then the file it writes its count of accepted
    /// connections to (`0` once it listens).
    pub(crate) async fn start_serving(
        subnet: Subnet,
        script: &str,
        args: impl FnOnce(&str) -> Vec<String>,
    ) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}n{n}", std::process::id() % 10_000);
        let namespace = format!("wt{tag}");
        let (outer, inner) = (format!("wt{tag}a"), format!("wt{tag}b"));
        let base = 10 + (std::process::id() % 20) * 10 + n * 2;
        let prefix = match subnet {
            Subnet::Global => "192.52.193",
            Subnet::Documentation => "192.0.2",
        };
        let local_address = format!("{prefix}.{base}");
        let address = format!("{prefix}.{}", base + 1);
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
        let accepts = root.path().join("accepts");
        let port = 8000 + (base as u16);
        let server = std::process::Command::new("ip")
            .args(["netns", "exec", &namespace, "python3", "-c", script])
            .args([&address, &port.to_string()])
            .args(args(&address))
            .arg(&accepts)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Ready once it has written its first count: connecting to find out would count.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !accepts.exists() {
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
            root,
        }
    }

    /// How many connections the host has accepted so far.
    pub(crate) fn accepts(&self) -> u64 {
        let text = std::fs::read_to_string(self.root.path().join("accepts")).unwrap();
        text.trim().parse().unwrap()
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

pub(crate) async fn sandbox_with(
    server: &TestServer,
    scope: &str,
    network: serde_json::Value,
) -> String {
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
pub(crate) fn fetch(url: &str) -> String {
    format!(
        "python3 -c \"import urllib.request, urllib.error, os\ntry: print(urllib.request.urlopen('{url}', timeout=10).read().decode())\nexcept urllib.error.HTTPError as e: print('HTTP', e.code, e.read().decode())\nexcept Exception as e: print('FAILED', e)\""
    )
}

pub(crate) async fn an_allowlist_lets_through_exactly_the_listed_destinations(host: Host) {
    let allowed = TestHost::start("allowed-host").await;
    let other = TestHost::start("other-host").await;
    let server = host.start();
    // A service on an address of the host itself, listed explicitly: the one way to it.
    let on_host = tokio::net::TcpListener::bind((allowed.local_address.as_str(), 0))
        .await
        .unwrap();
    let on_host_url = format!("http://{}/", on_host.local_addr().unwrap());
    let on_host_server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut connection, _)) = on_host.accept().await {
            let mut head = [0u8; 4096];
            let _ = connection.read(&mut head).await;
            let _ = connection
                .write_all(b"HTTP/1.0 200 OK\r\ncontent-length: 12\r\n\r\nhost-service")
                .await;
        }
    });
    let id = sandbox_with(
        &server,
        "t",
        json!({"mode": "allowlist", "allow": [allowed.address, allowed.local_address]}),
    )
    .await;
    let result = server.exec(&id, &fetch(&allowed.url())).await;
    assert_eq!(out(&result).trim(), "allowed-host", "{result}");
    let listed_host = server.exec(&id, &fetch(&on_host_url)).await;
    assert_eq!(out(&listed_host).trim(), "host-service", "{listed_host}");
    on_host_server.abort();
    let refused = server.exec(&id, &fetch(&other.url())).await;
    assert!(out(&refused).starts_with("HTTP 403"), "{refused}");
    assert!(out(&refused).contains("not allowed by this sandbox's network policy"));
    assert_eq!(other.accepts(), 0, "the unlisted host saw a connection");
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
    // A neighbour on a documentation network the host itself is on (TEST-NET-1).
    let neighbour = TestHost::start_on(Subnet::Documentation, "neighbour").await;
    let server = host.start();
    let id = sandbox_with(&server, "t", json!({"mode": "open"})).await;
    assert_eq!(
        out(&server.exec(&id, &fetch(&public.url())).await).trim(),
        "public-host"
    );
    assert_eq!(
        public.accepts(),
        1,
        "the public host counts what it accepts"
    );
    let api_port = server.url.rsplit(':').next().unwrap().to_owned();
    // A service on a globally reachable address of the host itself: still the host, and
    // refused before any connection is made, so it never accepts one.
    let on_host = tokio::net::TcpListener::bind((public.local_address.as_str(), 0))
        .await
        .unwrap();
    let on_host_port = on_host.local_addr().unwrap().port();
    let host_accepts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = host_accepts.clone();
    let listener = tokio::spawn(async move {
        while on_host.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    for target in [
        format!("http://{}:{on_host_port}/", public.local_address),
        format!("http://[::ffff:{}]:{on_host_port}/", public.local_address),
        neighbour.url(),
        format!("http://127.0.0.1:{api_port}/health"),
        format!("http://localhost:{api_port}/health"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "http://192.168.1.1/".to_owned(),
        "http://198.18.0.1/".to_owned(),
        "http://[2001:db8::1]/".to_owned(),
        "http://[fec0::1]/".to_owned(),
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
    // A tunnel to the host's own address is refused the same way.
    let tunnel = format!(
        "python3 -c \"import socket\ns=socket.create_connection(('127.0.0.1', 3128))\ns.sendall(b'CONNECT {a}:{p} HTTP/1.1\\r\\nHost: {a}\\r\\n\\r\\n')\nprint(s.recv(100).split(b'\\r\\n')[0].decode())\"",
        a = public.local_address,
        p = on_host_port
    );
    let tunneled = server.exec(&id, &tunnel).await;
    assert_eq!(out(&tunneled), "HTTP/1.1 403 Forbidden\n", "{tunneled}");
    listener.abort();
    assert_eq!(
        host_accepts.load(Ordering::SeqCst),
        0,
        "a connection to the host's own address was opened"
    );
    assert_eq!(neighbour.accepts(), 0, "the neighbour saw a connection");
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
