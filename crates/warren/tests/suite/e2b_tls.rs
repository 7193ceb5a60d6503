//! E2B's listener over TLS with host-name routing, and its transports (issue 17): the
//! official Python SDK 2.63.0 configured with only `E2B_DOMAIN` (it then calls
//! `https://api.<domain>` and `https://49983-<id>.<domain>`, port 443), envd driven by the
//! official Connect client in binary protobuf, and HTTP/2 both ways (h2 by ALPN, h2c with
//! prior knowledge).
//!
//! Name resolution is a real wildcard DNS zone: the test answers `*.e2b.test` with the
//! listener's loopback address from a DNS server of its own, and runs the SDK in a private
//! mount namespace whose `/etc/resolv.conf` names that server. (The SDK's resolver, hickory
//! inside pyqwest, reads `/etc/hosts` once when it starts, before any sandbox id is known,
//! so a hosts file cannot name the sandboxes; a wildcard record is also what an operator
//! sets up.) The listener is `127.x.y.z:443` on an address of the loopback network no other
//! test uses, as the SDK always dials port 443.
//!
//! The SDK's interpreter comes from `WARREN_TEST_E2B_PY_CURRENT` (scripts/test installs
//! it); the tests fail, saying so, without it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_test_support::TestServer;

use super::bin;

/// The domain of the TLS tests: `api.e2b.test` and `49983-<id>.e2b.test`.
const DOMAIN: &str = "e2b.test";

/// The venv interpreter with the current e2b SDK, from `WARREN_TEST_E2B_PY_CURRENT`.
fn python() -> PathBuf {
    let python = std::env::var_os("WARREN_TEST_E2B_PY_CURRENT").map(PathBuf::from).expect(
        "WARREN_TEST_E2B_PY_CURRENT is not set: run the tests through scripts/test (it installs \
         the e2b Python SDK 2.63.0 and names its venv's bin/python there), or set it yourself, \
         e.g. to /var/cache/warren-test/e2b-py-2.63.0/bin/python",
    );
    assert!(
        python.exists(),
        "WARREN_TEST_E2B_PY_CURRENT names {}, which does not exist",
        python.display()
    );
    python
}

/// A scenario program of `crates/warren/tests/e2b/`.
fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2b")
        .join(name)
}

/// `e2b_` and 40 hex digits, as `warren e2b key create` makes them.
fn generate_key() -> String {
    let bytes: [u8; 20] = rand::random();
    format!("e2b_{}", hex::encode(bytes))
}

/// A throwaway CA and a server certificate it signed for `api.<domain>` and `*.<domain>`.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn generate() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::tempdir().expect("a temporary dir");
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "warren e2b_tls test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("a server key");
        let mut server =
            CertificateParams::new(vec![format!("api.{DOMAIN}"), format!("*.{DOMAIN}")])
                .expect("server parameters");
        server
            .distinguished_name
            .push(DnType::CommonName, format!("*.{DOMAIN}"));
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = server
            .signed_by(&key, &issuer)
            .expect("the server certificate");
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        // The chain as an operator gives it: the server's certificate, then the CA's.
        std::fs::write(
            dir.path().join("cert.pem"),
            format!("{}{}", cert.pem(), ca_cert.pem()),
        )
        .unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// An address of the loopback network (`127.0.0.0/8` is all loopback on Linux) whose TCP
/// port 443 and UDP port 53 are free: the TLS listener's and the DNS server's.
fn free_loopback_address() -> Ipv4Addr {
    let seed = std::process::id();
    for attempt in 0..64u32 {
        let n = seed
            .wrapping_mul(2_654_435_761)
            .wrapping_add(attempt * 7919);
        let address = Ipv4Addr::new(
            127,
            100 + (n % 100) as u8,
            (n >> 8) as u8,
            1 + (n >> 16) as u8 % 250,
        );
        let tcp = TcpListener::bind((address, 443));
        let udp = UdpSocket::bind((address, 53));
        if tcp.is_ok() && udp.is_ok() {
            return address;
        }
    }
    panic!("no loopback address with TCP 443 and UDP 53 free (is the test root?)");
}

/// A DNS server answering `A` queries for `<domain>` and every name below it with one
/// address (a wildcard zone), and nothing for any other name; it records the names asked.
struct WildcardDns {
    stop: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WildcardDns {
    fn start(address: Ipv4Addr, domain: &str) -> Self {
        let socket = UdpSocket::bind((address, 53)).expect("bind the DNS server");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let domain = domain.to_ascii_lowercase();
        let thread = {
            let (stop, asked) = (stop.clone(), asked.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    if let Some((answer, name)) = dns_answer(&buf[..n], &domain, address) {
                        asked.lock().unwrap().push(name);
                        let _ = socket.send_to(&answer, from);
                    }
                }
            })
        };
        Self {
            stop,
            asked,
            thread: Some(thread),
        }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl Drop for WildcardDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer to one DNS query (RFC 1035 wire format) and the name it asked: `address` for
/// an `A` query of a name in `domain`, no record (NOERROR) for its other types, NXDOMAIN
/// outside it. `None` for what is not a one-question query.
fn dns_answer(query: &[u8], domain: &str, address: Ipv4Addr) -> Option<(Vec<u8>, String)> {
    if query.len() < 12 || query[2] & 0x80 != 0 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let question_end = at + 4;
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let name = labels.join(".");
    let in_zone = name == domain || name.ends_with(&format!(".{domain}"));
    let answers = u16::from(in_zone && qtype == 1);
    let mut answer = Vec::with_capacity(question_end + 16);
    answer.extend_from_slice(&query[..2]);
    // QR, AA, the client's RD, RA; NXDOMAIN outside the zone.
    answer.push(0x84 | (query[2] & 0x01));
    answer.push(0x80 | if in_zone { 0 } else { 3 });
    answer.extend_from_slice(&[0, 1]);
    answer.extend_from_slice(&answers.to_be_bytes());
    answer.extend_from_slice(&[0, 0, 0, 0]);
    answer.extend_from_slice(query.get(12..question_end)?);
    if answers == 1 {
        // The question's name (a pointer to offset 12), A, IN, TTL 5 s, 4 bytes.
        answer.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        answer.extend_from_slice(&address.octets());
    }
    Some((answer, name))
}

/// Runs `command` (its stdout and stderr captured) for at most `within`.
fn run_for(mut command: Command, within: Duration) -> Output {
    command.stdin(Stdio::null());
    warren_test_support::output_within(&mut command, within)
        .unwrap_or_else(|| panic!("{command:?} did not end within {within:?}"))
}

/// `python` with nothing of the test's own `E2B_*`, proxy or TLS settings.
fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy().to_ascii_uppercase();
        if key_text.starts_with("E2B_")
            || key_text.ends_with("_PROXY")
            || key_text.starts_with("SSL_CERT")
            || key_text == "REQUESTS_CA_BUNDLE"
        {
            command.env_remove(key);
        }
    }
    command
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    command
}

/// Asserts the program printed `SCENARIO PASSED`, else shows its output and the server's log.
fn assert_passed(output: &Output, what: &str, server: &TestServer) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("SCENARIO PASSED"),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- the server's log (last 60 lines)\n{}",
        output.status,
        log_tail(server, 60)
    );
}

fn log_tail(server: &TestServer, n: usize) -> String {
    let lines = server.log_lines();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until `address` accepts TCP connections.
fn wait_for_listener(address: SocketAddr, server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(address).is_err() {
        assert!(
            Instant::now() < deadline,
            "the E2B listener {address} did not come up within 30 s; the server's log:\n{}",
            log_tail(server, 40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `warren serve` whose E2B listener serves TLS on `address:443` for [`DOMAIN`].
struct TlsServer {
    server: TestServer,
    key: String,
    _config: tempfile::NamedTempFile,
}

impl TlsServer {
    fn start(address: Ipv4Addr, pki: &Pki) -> Self {
        let key = generate_key();
        let toml = format!(
            "[e2b]\ndomain = {DOMAIN:?}\ntls_cert = {:?}\ntls_key = {:?}\n[e2b.keys]\n{key:?} = \"alice\"\n",
            pki.path("cert.pem"),
            pki.path("key.pem"),
        );
        let config = tempfile::NamedTempFile::new().expect("a config file");
        std::fs::write(config.path(), toml).unwrap();
        let listen = SocketAddr::from((address, 443));
        let listen_arg = listen.to_string();
        let config_arg = config.path().to_str().expect("a UTF-8 path").to_owned();
        let server = TestServer::start_logging(
            bin(),
            &[
                "--backend",
                "local",
                "--config",
                &config_arg,
                "--e2b-listen",
                &listen_arg,
            ],
        );
        wait_for_listener(listen, &server);
        Self {
            server,
            key,
            _config: config,
        }
    }
}

#[test]
fn the_python_sdk_with_only_a_domain_works_over_tls_routed_by_host_name() {
    let python = python();
    let pki = Pki::generate();
    let address = free_loopback_address();
    let dns = WildcardDns::start(address, DOMAIN);
    let tls = TlsServer::start(address, &pki);
    // The SDK's resolver and Python's read /etc/resolv.conf: in the SDK's own mount
    // namespace it names the wildcard server.
    let resolv = pki.path("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {address}\n")).unwrap();
    let mut command = clean_command("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" /etc/resolv.conf && shift && exec "$@""#)
        .arg("sh")
        .arg(&resolv)
        .arg(&python)
        .arg(script("tls_scenario.py"))
        .env("E2B_DOMAIN", DOMAIN)
        .env("E2B_API_KEY", &tls.key)
        .env("SSL_CERT_FILE", pki.path("ca.pem"))
        .env("WARREN_E2B_RUN", format!("tls-{}", std::process::id()));
    let started = Instant::now();
    let output = run_for(command, Duration::from_secs(200));
    assert_passed(&output, "the TLS scenario", &tls.server);
    // The SDK found the control plane and the sandboxes by name, through the zone.
    let asked = dns.asked();
    assert!(
        asked.iter().any(|name| name == &format!("api.{DOMAIN}")),
        "the SDK never resolved api.{DOMAIN}: {asked:?}"
    );
    assert!(
        asked
            .iter()
            .any(|name| name.starts_with("49983-") && name.ends_with(&format!(".{DOMAIN}"))),
        "the SDK never resolved a sandbox's host name: {asked:?}"
    );
    eprintln!("the TLS scenario took {:?}", started.elapsed());
}

/// The proto and h2c scenario against a plain (no TLS) E2B listener.
#[test]
fn envd_speaks_binary_protobuf_to_the_connect_client_over_http1_and_h2c() {
    let python = python();
    let e2b = TestServer::start_e2b(bin(), &[], "");
    let mut command = clean_command(&python);
    command
        .arg(script("proto_scenario.py"))
        .envs(e2b.sdk_env())
        .env("WARREN_E2B_RUN", format!("proto-{}", std::process::id()));
    let output = run_for(command, Duration::from_secs(200));
    assert_passed(&output, "the protobuf scenario", &e2b.server);
}

#[test]
fn a_bad_tls_setting_stops_the_server_naming_the_file() {
    let pki = Pki::generate();
    let other = Pki::generate();
    let missing = pki.path("missing.pem");
    let cases: [(String, &str); 4] = [
        (
            format!("tls_cert = {:?}\n", pki.path("cert.pem")),
            "without e2b.tls_key",
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\n",
                missing,
                pki.path("key.pem")
            ),
            "missing.pem",
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\n",
                pki.path("key.pem"),
                pki.path("key.pem")
            ),
            "holds no PEM certificate",
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\n",
                pki.path("cert.pem"),
                other.path("key.pem")
            ),
            "does not belong to the certificate",
        ),
    ];
    for (settings, expected) in cases {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            config.path(),
            format!("[e2b]\nlisten = \"127.0.0.1:0\"\n{settings}"),
        )
        .unwrap();
        let data = tempfile::tempdir().unwrap();
        let output = warren_test_support::run_to_exit(
            bin(),
            &[
                "serve",
                "--data-dir",
                data.path().to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--backend",
                "memory",
                "--config",
                config.path().to_str().unwrap(),
            ],
            &[("WARREN_TOKEN", warren_test_support::TEST_TOKEN)],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(expected),
            "{settings}: expected a failure mentioning {expected:?}; got {}:\n{stderr}",
            output.status
        );
    }
}

#[test]
fn the_dns_answer_is_a_wildcard_a_record_of_the_zone_only() {
    // A query for 49983-abc.e2b.test, type A, class IN.
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["49983-abc", "e2b", "test"] {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let address = Ipv4Addr::new(127, 1, 2, 3);
    let (answer, name) = dns_answer(&query, DOMAIN, address).unwrap();
    assert_eq!(name, "49983-abc.e2b.test");
    assert_eq!(&answer[..2], &[0x12, 0x34]);
    assert_eq!(answer[3] & 0x0f, 0, "NOERROR");
    assert_eq!(&answer[6..8], &[0, 1], "one answer");
    assert_eq!(&answer[answer.len() - 4..], &address.octets());
    // Outside the zone: NXDOMAIN, no answer.
    let outside: Vec<u8> = query
        .iter()
        .map(|b| if *b == b'e' { b'f' } else { *b })
        .collect();
    let (answer, _) = dns_answer(&outside, DOMAIN, address).unwrap();
    assert_eq!(answer[3] & 0x0f, 3, "NXDOMAIN");
    assert_eq!(&answer[6..8], &[0, 0]);
}
