//! The egress proxy's cost (issue 38), measured in one run on loopback: an HTTPS request
//! through the injecting proxy (TLS terminated with the sandbox's authority, the secret
//! presented, TLS again to the destination) beside the same request through the plain
//! tunnel (`CONNECT`, bytes spliced) and direct. Not a test: it asserts only that each
//! answer is right (and that the injected request carried the credential), and prints each
//! figure beside the direct one as a ratio.
//!
//! - Latency: a GET of a 2-byte body on a new connection each time (the proxy carries one
//!   request per connection), 300 requests per path after 20 warm-up ones, p50 and p99.
//! - Throughput: a GET of a 10 MiB body, 10 per path, the median's MiB/s.
//!
//! The proxy is warren's own ([`warren_agent::egress`]) with a broker standing in for the
//! provisioner's store (one secret, one authority); the destination is a tokio-rustls
//! server with a certificate from a throwaway CA, which the proxy trusts as an operator's
//! `network.upstream_ca`. Run: `cargo bench -p warren --bench egress`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::{self, pki_types};
use warren_agent::egress::RuntimeEgress;
use warren_backend::{Authority, EgressBroker};
use warren_core::{
    EgressEvent, EgressSecret, NetworkPolicy, Presentation, SandboxId, SecretName, SecretRule,
    SecretTarget,
};
use warren_test_support::latency::{ms, percentile};

const VALUE: &str = "bench-credential-0123456789";
const BIG: usize = 10 * 1024 * 1024;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA, and a server certificate for 127.0.0.1 it signed.
struct Pki {
    ca_pem: String,
    server: Arc<rustls::ServerConfig>,
}

fn pki() -> Pki {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "egress bench CA");
    let ca_cert = ca.self_signed(&key).unwrap();
    let issuer = rcgen::Issuer::new(ca, key);
    let server_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        server: Arc::new(server),
    }
}

/// The destination: answers `GET /small` with 2 bytes and `GET /big` with 10 MiB, and
/// notes whether the request carried the credential.
async fn destination(config: Arc<rustls::ServerConfig>, saw_credential: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let big = Arc::new(vec![b'x'; BIG]);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (acceptor, big, saw) = (acceptor.clone(), big.clone(), saw_credential.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let head = read_head(&mut tls).await;
                if head.contains(&format!("Authorization: Bearer {VALUE}")) {
                    saw.store(true, Ordering::SeqCst);
                }
                let body: &[u8] = if head.starts_with("GET /big") {
                    &big
                } else {
                    b"ok"
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.write_all(body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The provisioner's part, for one sandbox: its secret (bound to the destination when
/// `bind`), its authority, no audit store.
struct Broker {
    secret: Option<EgressSecret>,
    authority: Authority,
    upstream: String,
}

#[async_trait::async_trait]
impl EgressBroker for Broker {
    async fn secrets(&self, _: &SandboxId, _: &str, _: u16) -> Result<Vec<EgressSecret>, String> {
        Ok(self.secret.clone().into_iter().collect())
    }
    async fn authority(&self, _: &SandboxId) -> Result<Authority, String> {
        Ok(self.authority.clone())
    }
    fn record(&self, _: EgressEvent) {}
    fn upstream_roots(&self) -> Option<String> {
        Some(self.upstream.clone())
    }
}

/// A proxy listener serving one runtime's egress.
async fn proxy(egress: Arc<RuntimeEgress>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let runtime = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = stream.set_nodelay(true);
            warren_agent::egress::spawn_connection(stream, &egress, &runtime);
        }
    });
    address
}

/// One GET on a new connection, direct or through a proxy; the body's length.
async fn get(
    client: &tokio_rustls::TlsConnector,
    port: u16,
    proxy: Option<SocketAddr>,
    path: &str,
) -> usize {
    let tcp = match proxy {
        Some(proxy) => {
            let mut tcp = TcpStream::connect(proxy).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let connect = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            tcp.write_all(connect.as_bytes()).await.unwrap();
            let answer = read_head(&mut tcp).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            tcp
        }
        None => {
            let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            tcp
        }
    };
    tcp.set_nodelay(true).unwrap();
    let name = pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = client.connect(name, tcp).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // The destination closes after its answer; a peer gone without close_notify ends it too.
    let _ = tls.read_to_end(&mut answer).await;
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an answer head");
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", &answer[..end]);
    answer.len() - end - 4
}

fn client(roots: &[&str]) -> tokio_rustls::TlsConnector {
    use pki_types::pem::PemObject as _;
    let mut store = rustls::RootCertStore::empty();
    for pem in roots {
        for cert in pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
            store.add(cert.unwrap()).unwrap();
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

struct Figures {
    p50: Duration,
    p99: Duration,
    mib_s: f64,
}

async fn measure(
    client: &tokio_rustls::TlsConnector,
    port: u16,
    proxy: Option<SocketAddr>,
) -> Figures {
    for _ in 0..20 {
        get(client, port, proxy, "/small").await;
    }
    let mut latencies = Vec::new();
    for _ in 0..300 {
        let started = Instant::now();
        assert_eq!(get(client, port, proxy, "/small").await, 2);
        latencies.push(started.elapsed());
    }
    let mut transfers = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        assert_eq!(get(client, port, proxy, "/big").await, BIG);
        transfers.push(started.elapsed());
    }
    let median = percentile(&mut transfers, 0.5);
    Figures {
        p50: percentile(&mut latencies, 0.5),
        p99: percentile(&mut latencies, 0.99),
        mib_s: (BIG as f64 / (1024.0 * 1024.0)) / median.as_secs_f64(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pki = pki();
    let saw_credential = Arc::new(AtomicBool::new(false));
    let port = destination(pki.server.clone(), saw_credential.clone()).await;
    let sandbox = SandboxId::parse("sbx-0123456789abcdef01234567").unwrap();
    let authority = Authority::generate(&sandbox).unwrap();
    let policy = NetworkPolicy::Allowlist {
        allow: vec!["127.0.0.1".to_owned()],
        deny: Vec::new(),
    };
    let secret = EgressSecret::new(
        SecretName::new("BENCH").unwrap(),
        SecretRule {
            targets: vec![SecretTarget {
                host: "127.0.0.1".to_owned(),
                ports: vec![port],
                path_prefix: None,
            }],
            present: Presentation::Bearer,
            source: None,
        },
        VALUE.to_owned(),
    )
    .unwrap();
    let broker = |secret: Option<EgressSecret>| -> Arc<dyn EgressBroker> {
        Arc::new(Broker {
            secret,
            authority: authority.clone(),
            upstream: pki.ca_pem.clone(),
        })
    };
    let tunnel = proxy(RuntimeEgress::new(
        sandbox.clone(),
        policy.clone(),
        Some(broker(None)),
    ))
    .await;
    let injecting = proxy(RuntimeEgress::new(
        sandbox.clone(),
        policy,
        Some(broker(Some(secret))),
    ))
    .await;
    // A sandbox's client trusts the image's roots and the sandbox's authority.
    let sandbox_client = client(&[&pki.ca_pem, &authority.cert_pem]);

    let direct = measure(&sandbox_client, port, None).await;
    let tunneled = measure(&sandbox_client, port, Some(tunnel)).await;
    assert!(!saw_credential.load(Ordering::SeqCst), "a tunnel injected");
    let injected = measure(&sandbox_client, port, Some(injecting)).await;
    assert!(
        saw_credential.load(Ordering::SeqCst),
        "the destination never saw the credential"
    );

    println!("egress proxy, HTTPS on loopback (new connection per request)");
    println!(
        "{:<22} {:>10} {:>10} {:>12} {:>16}",
        "path", "p50", "p99", "10 MiB", "p50 vs direct"
    );
    for (name, figures) in [
        ("direct", &direct),
        ("plain tunnel", &tunneled),
        ("injecting proxy", &injected),
    ] {
        println!(
            "{:<22} {:>10} {:>10} {:>7.0} MiB/s {:>15.2}×",
            name,
            ms(figures.p50),
            ms(figures.p99),
            figures.mib_s,
            figures.p50.as_secs_f64() / direct.p50.as_secs_f64()
        );
    }
    println!(
        "throughput vs direct: tunnel {:.2}×, injecting {:.2}×",
        tunneled.mib_s / direct.mib_s,
        injected.mib_s / direct.mib_s
    );
}
