//! The egress proxy: the only way out of a runtime with network `open` or `allowlist`
//! (I23: network opened only to the targets a task needs), and where its secrets are
//! presented and its connections recorded (issue 38, I13, I22).
//!
//! A runtime has no route anywhere; its init listens on `127.0.0.1:3128` inside the
//! runtime and passes every connection's socket to the provisioner over the control
//! socket. Here, in the provisioner's network namespace, each connection is read as an HTTP
//! proxy request (`CONNECT host:port` for HTTPS and any TCP, or an absolute-form HTTP
//! request), checked against the sandbox's [`NetworkPolicy`] *after* name resolution (so
//! no name can lead to the host, a private network, cloud metadata or any other address
//! the IANA special-purpose registries mark not globally reachable unless listed as an
//! address), checked not to be an address of the host itself, and only then connected and
//! spliced. Commands get `HTTP(S)_PROXY` pointing at the port.
//!
//! A sandbox's egress secrets never enter it: it holds placeholders
//! ([`warren_core::placeholder`]). On a request to a destination a secret is bound to, the
//! proxy presents the value ([`head::Head::present`]); for HTTPS it terminates TLS for
//! those destinations only, with a certificate signed by the sandbox's own authority, and
//! checks the destination's own certificate as any client would ([`tls`]). A placeholder
//! sent anywhere else ends the request, before it is connected when seen in the head. Every
//! connection, carried or refused, is handed to the broker for the audit.

mod head;
mod splice;
mod tls;

use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use warren_backend::SharedBroker;
use warren_core::{
    embedded_ipv4, placeholder, EgressEvent, EgressSecret, EgressVerdict, NetworkPolicy, SandboxId,
};

use crate::protocol::{self, Reply, Request};
use head::{read_head, Head, ProxyRequest};

/// Most proxy connections one runtime may hold open at once.
const CONNECTIONS_PER_RUNTIME: usize = 128;
/// Most proxy connections all runtimes together may hold open.
static ALL_CONNECTIONS: std::sync::LazyLock<Arc<Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(Semaphore::new(4096)));

/// How long resolving and connecting a destination, or a TLS handshake, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a proxied connection may carry no byte either way before it is closed.
const TUNNEL_IDLE: Duration = Duration::from_secs(600);

/// One runtime's egress: its policy, its caps, and what its broker gives it.
pub struct RuntimeEgress {
    sandbox: SandboxId,
    policy: NetworkPolicy,
    broker: Option<SharedBroker>,
    permits: Arc<Semaphore>,
    /// Made at the first intercepted connection (the authority asked of the broker).
    tls: tokio::sync::Mutex<Option<Arc<Tls>>>,
}

struct Tls {
    interceptor: tls::Interceptor,
    upstream: Arc<tokio_rustls::rustls::ClientConfig>,
}

impl RuntimeEgress {
    /// The egress of `sandbox`'s runtime under `policy`; with no broker it presents no
    /// secret and records nothing.
    pub fn new(
        sandbox: SandboxId,
        policy: NetworkPolicy,
        broker: Option<SharedBroker>,
    ) -> Arc<Self> {
        Arc::new(Self {
            sandbox,
            policy,
            broker,
            permits: Arc::new(Semaphore::new(CONNECTIONS_PER_RUNTIME)),
            tls: tokio::sync::Mutex::new(None),
        })
    }

    fn event(&self) -> EgressEvent {
        let mut id = [0u8; 8];
        // A connection id that cannot be had is still unique enough from the clock.
        if getrandom::fill(&mut id).is_err() {
            id = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                .to_be_bytes();
        }
        EgressEvent {
            at: now_ms(),
            connection: id.iter().map(|b| format!("{b:02x}")).collect(),
            ended_at: None,
            sandbox: self.sandbox.clone(),
            host: String::new(),
            port: 0,
            address: None,
            verdict: EgressVerdict::Refused,
            rule: "malformed".to_owned(),
            secrets: Vec::new(),
            intercepted: false,
            bytes_out: 0,
            bytes_in: 0,
            reason: None,
        }
    }

    /// Records the end of a connection (or its refusal).
    fn record(&self, mut event: EgressEvent) {
        event.ended_at = Some(now_ms());
        if let Some(broker) = &self.broker {
            broker.record(event);
        }
    }

    /// Records a connection as it opens, before a byte is carried: one still open, or cut
    /// by a server that stops, is in the audit too.
    fn opened(&self, event: &EgressEvent) {
        if let Some(broker) = &self.broker {
            broker.record(EgressEvent {
                ended_at: None,
                ..event.clone()
            });
        }
    }

    /// The secrets the sandbox may present now on a connection to `host:port`, each with
    /// its placeholder. A broker that cannot answer leaves none: nothing is presented, and
    /// nothing the sandbox holds is worth anything.
    async fn secrets(&self, host: &str, port: u16) -> Vec<(EgressSecret, String)> {
        let Some(broker) = &self.broker else {
            return Vec::new();
        };
        match broker.secrets(&self.sandbox, host, port).await {
            Ok(secrets) => secrets
                .into_iter()
                .map(|secret| {
                    let placeholder = placeholder(&self.sandbox, &secret.name);
                    (secret, placeholder)
                })
                .collect(),
            Err(error) => {
                tracing::warn!(sandbox = %self.sandbox, %error, "egress secrets unavailable");
                Vec::new()
            }
        }
    }

    async fn tls(&self) -> Result<Arc<Tls>, String> {
        let mut made = self.tls.lock().await;
        if let Some(tls) = &*made {
            return Ok(tls.clone());
        }
        let broker = self.broker.as_ref().ok_or("no broker")?;
        let authority = broker.authority(&self.sandbox).await?;
        let tls = Arc::new(Tls {
            interceptor: tls::Interceptor::new(&self.sandbox, &authority)?,
            upstream: tls::upstream_config(broker.upstream_roots().as_deref())?,
        });
        *made = Some(tls.clone());
        Ok(tls)
    }

    /// Takes a permit for one more connection, or records its refusal.
    fn admit(
        &self,
    ) -> Option<(
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
    )> {
        match (
            self.permits.clone().try_acquire_owned(),
            ALL_CONNECTIONS.clone().try_acquire_owned(),
        ) {
            (Ok(mine), Ok(all)) => Some((mine, all)),
            _ => {
                tracing::warn!(sandbox = %self.sandbox, "egress connection refused: too many open connections");
                let mut event = self.event();
                event.rule = "limit".to_owned();
                event.reason = Some("too many open connections".to_owned());
                self.record(event);
                None
            }
        }
    }
}

/// Serves a runtime's egress for as long as its init answers: connects to its control
/// socket, registers as the egress connection and proxies every connection init hands
/// over. Runs on its own thread (the receive loop blocks); proxying runs on `runtime`.
pub fn spawn_egress(
    socket_dir: PathBuf,
    egress: Arc<RuntimeEgress>,
    runtime: tokio::runtime::Handle,
) -> std::io::Result<()> {
    let stream = crate::client::connect(&socket_dir)?;
    protocol::send_frame(stream.as_fd(), &Request::Egress, &[])?;
    std::thread::Builder::new()
        .name("warren-egress".into())
        .spawn(move || {
            // Ends when init dies (EOF) or the runtime is destroyed.
            loop {
                let fds = match protocol::recv_frame::<Reply>(stream.as_fd()) {
                    Ok(Some((Reply::Connection, fds))) => fds,
                    // The socket stays in the runtime (gVisor): send one of ours in for the
                    // runtime to relay to, and proxy our end like any connection.
                    Ok(Some((Reply::ConnectionWanted { id }, _))) => {
                        match relay_end(&socket_dir, id) {
                            Ok(ours) => vec![ours],
                            Err(error) => {
                                tracing::debug!(%error, "egress relay not set up");
                                continue;
                            }
                        }
                    }
                    _ => break,
                };
                for fd in fds {
                    // One sandbox cannot take the provisioner's descriptors: its open proxy
                    // connections are capped, and so are all sandboxes' together. Dropping
                    // `fd` closes a refused one.
                    let Some(permits) = egress.admit() else {
                        continue;
                    };
                    let egress = egress.clone();
                    runtime.spawn(async move {
                        let _permits = permits;
                        proxy(fd, &egress).await;
                    });
                }
            }
        })?;
    Ok(())
}

/// Makes a socket pair for the runtime's waiting proxy connection `id`, sends one end in
/// on a new control connection ([`Request::Relay`]) and returns the other. A refused
/// connection (the caps) gets its end too, dropped at once: the runtime's relay then ends
/// and closes it, as the kernel tier closes a refused socket.
fn relay_end(socket_dir: &std::path::Path, id: u64) -> std::io::Result<OwnedFd> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let control = crate::client::connect(socket_dir)?;
    protocol::send_frame(control.as_fd(), &Request::Relay { id }, &[theirs.as_fd()])?;
    Ok(OwnedFd::from(ours))
}

/// Proxies one connection of a runtime whose egress reaches warren over the network (a
/// pod dialling warren's proxy port): the same request parsing, policy check on the
/// resolved address, refusal of the host's own addresses, secrets and audit as for a
/// connection init hands over, under the same caps. False when a cap refused it (the
/// connection is closed).
pub fn spawn_connection(
    stream: std::net::TcpStream,
    egress: &Arc<RuntimeEgress>,
    runtime: &tokio::runtime::Handle,
) -> bool {
    let Some(permits) = egress.admit() else {
        return false;
    };
    let egress = egress.clone();
    runtime.spawn(async move {
        let _permits = permits;
        proxy(OwnedFd::from(stream), &egress).await;
    });
    true
}

/// Serves one connection and records what became of it.
async fn proxy(fd: OwnedFd, egress: &RuntimeEgress) {
    let mut event = egress.event();
    match serve(fd, egress, &mut event).await {
        // No request came at all: nothing to record.
        Err(error) if event.port == 0 && event.reason.is_none() => {
            tracing::debug!(%error, "egress connection ended before a request");
            return;
        }
        Err(error) => {
            tracing::debug!(%error, "egress connection ended");
            if event.verdict == EgressVerdict::Refused && event.reason.is_none() {
                event.reason = Some(error.to_string());
            }
        }
        Ok(()) => {}
    }
    egress.record(event);
}

async fn serve(
    fd: OwnedFd,
    egress: &RuntimeEgress,
    event: &mut EgressEvent,
) -> std::io::Result<()> {
    let std_stream = std::net::TcpStream::from(fd);
    std_stream.set_nonblocking(true)?;
    let mut client = TcpStream::from_std(std_stream)?;
    let (head, rest) = read_head(&mut client, CONNECT_TIMEOUT).await?;
    let Some(request) = ProxyRequest::parse(&head) else {
        let reason = "not an HTTP proxy request";
        event.reason = Some(reason.to_owned());
        return refuse(&mut client, 400, &format!("warren: {reason}")).await;
    };
    event.host.clone_from(&request.host);
    event.port = request.port;
    let secrets = egress.secrets(&request.host, request.port).await;
    // A placeholder in a plain request's head where it may not go: refused before any
    // connection is made.
    if let Some(head) = &request.head {
        let (_, foreign) = split_secrets(&secrets, &request.host, request.port, &head.target);
        if let Some((secret, _)) = foreign.iter().find(|(_, p)| head.contains(p)) {
            return refuse_placeholder(&mut client, event, secret, &request.host, request.port)
                .await;
        }
    }
    let target = match connect(&request.host, request.port, &egress.policy).await {
        Ok(target) => target,
        Err(Refusal::Policy) => {
            let message = format!(
                "warren: {}:{} is not allowed by this sandbox's network policy ({})",
                request.host,
                request.port,
                egress.policy.mode()
            );
            event.rule = "policy".to_owned();
            event.reason = Some(format!("not allowed by network {}", egress.policy.mode()));
            return refuse(&mut client, 403, &message).await;
        }
        Err(Refusal::Unreachable(error)) => {
            let message = format!(
                "warren: cannot reach {}:{}: {error}",
                request.host, request.port
            );
            event.rule = "unreachable".to_owned();
            event.reason = Some(error.to_string());
            return refuse(&mut client, 502, &message).await;
        }
    };
    event.address = target.peer_addr().ok().map(|a| a.ip().to_string());
    event.verdict = EgressVerdict::Allowed;
    event.rule = egress.policy.mode().to_owned();
    if let Some(mut head) = request.head {
        let (bound, foreign) = split_secrets(&secrets, &request.host, request.port, &head.target);
        for (secret, placeholder) in &bound {
            head.present(secret, placeholder);
            event.secrets.push(secret.name.clone());
        }
        let mut target = target;
        target.write_all(&head.to_bytes()).await?;
        egress.opened(event);
        let forbidden = placeholders(&foreign);
        let carried = splice::splice(client, target, TUNNEL_IDLE, &forbidden, rest).await?;
        note_carried(event, carried, &foreign);
        return Ok(());
    }
    let binds = secrets
        .iter()
        .any(|(secret, _)| secret.rule.covers(&request.host, request.port));
    if binds && egress.broker.is_some() {
        return intercept(client, target, &request, egress, &secrets, rest, event).await;
    }
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    // Not bound anywhere here: a placeholder sent in clear through a tunnel (plain TCP) is
    // still cut; inside TLS it is the destination's to see, and worth nothing there.
    let foreign: Vec<&(EgressSecret, String)> = secrets.iter().collect();
    egress.opened(event);
    let carried =
        splice::splice(client, target, TUNNEL_IDLE, &placeholders(&foreign), rest).await?;
    note_carried(event, carried, &foreign);
    Ok(())
}

/// Terminates TLS for a destination a secret is bound to: answers the sandbox with a
/// certificate for it from the sandbox's authority, reads its one request, presents the
/// secrets bound to that path, and speaks TLS to the destination, checking its
/// certificate.
async fn intercept(
    mut client: TcpStream,
    target: TcpStream,
    request: &ProxyRequest,
    egress: &RuntimeEgress,
    secrets: &[(EgressSecret, String)],
    early: Vec<u8>,
    event: &mut EgressEvent,
) -> std::io::Result<()> {
    let (host, port) = (request.host.as_str(), request.port);
    if !early.is_empty() {
        event.verdict = EgressVerdict::Refused;
        event.rule = "malformed".to_owned();
        event.reason = Some("bytes sent before the tunnel was established".to_owned());
        return refuse(
            &mut client,
            400,
            "warren: bytes sent before the tunnel was established",
        )
        .await;
    }
    let server_config = match egress.tls().await.and_then(|tls| {
        let config = tls.interceptor.server_config(host)?;
        Ok((tls, config))
    }) {
        Ok(made) => made,
        Err(error) => {
            tracing::error!(sandbox = %egress.sandbox, %error, "cannot intercept a bound destination");
            event.verdict = EgressVerdict::Refused;
            event.rule = "authority".to_owned();
            event.reason = Some("the sandbox's egress authority is unavailable".to_owned());
            return refuse(
                &mut client,
                502,
                "warren: the sandbox's egress authority is unavailable",
            )
            .await;
        }
    };
    let (tls, server_config) = server_config;
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
    let mut inside = tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(client))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    event.intercepted = true;
    let (head, rest) = read_head(&mut inside, CONNECT_TIMEOUT).await?;
    let Some(mut head) = Head::parse_origin(&head) else {
        event.verdict = EgressVerdict::Refused;
        event.rule = "malformed".to_owned();
        event.reason = Some("not an HTTP/1 request".to_owned());
        return refuse(&mut inside, 400, "warren: not an HTTP/1 request").await;
    };
    let (bound, foreign) = split_secrets(secrets, host, port, &head.target);
    if let Some((secret, _)) = foreign.iter().find(|(_, p)| head.contains(p)) {
        event.verdict = EgressVerdict::Refused;
        return refuse_placeholder(&mut inside, event, secret, host, port).await;
    }
    let name = tls::server_name(host).map_err(std::io::Error::other)?;
    let connector = tokio_rustls::TlsConnector::from(tls.upstream.clone());
    let upstream =
        match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, target)).await {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(error)) => {
                event.verdict = EgressVerdict::Refused;
                event.rule = "upstream_tls".to_owned();
                event.reason = Some(error.to_string());
                let message = format!("warren: {host}:{port} did not prove who it is: {error}");
                return refuse(&mut inside, 502, &message).await;
            }
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        };
    for (secret, placeholder) in &bound {
        head.present(secret, placeholder);
        event.secrets.push(secret.name.clone());
    }
    let mut upstream = upstream;
    upstream.write_all(&head.to_bytes()).await?;
    egress.opened(event);
    let forbidden = placeholders(&foreign);
    let carried = splice::splice(inside, upstream, TUNNEL_IDLE, &forbidden, rest).await?;
    note_carried(event, carried, &foreign);
    Ok(())
}

/// The time now, Unix milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Secrets with their placeholders.
type Held<'a> = Vec<&'a (EgressSecret, String)>;

/// The secrets a request for `path` on `host:port` carries, and the others.
fn split_secrets<'a>(
    secrets: &'a [(EgressSecret, String)],
    host: &str,
    port: u16,
    path: &str,
) -> (Held<'a>, Held<'a>) {
    secrets
        .iter()
        .partition(|(secret, _)| secret.rule.covers_request(host, port, path))
}

fn placeholders(secrets: &[&(EgressSecret, String)]) -> Vec<String> {
    secrets.iter().map(|(_, p)| p.clone()).collect()
}

fn note_carried(
    event: &mut EgressEvent,
    carried: splice::Carried,
    foreign: &[&(EgressSecret, String)],
) {
    event.bytes_out = carried.out;
    event.bytes_in = carried.r#in;
    if let Some(index) = carried.forbidden {
        let name = &foreign[index].0.name;
        event.verdict = EgressVerdict::Refused;
        event.rule = "placeholder".to_owned();
        event.reason = Some(format!(
            "the placeholder of secret {name} was sent to {}:{}, where it may not go; the connection was cut",
            event.host, event.port
        ));
    }
}

async fn refuse_placeholder<W: AsyncWrite + Unpin>(
    client: &mut W,
    event: &mut EgressEvent,
    secret: &EgressSecret,
    host: &str,
    port: u16,
) -> std::io::Result<()> {
    let reason = format!(
        "the placeholder of secret {} may not be sent to {host}:{port}",
        secret.name
    );
    tracing::warn!(sandbox = %event.sandbox, secret = %secret.name, %host, port, "egress refused: a secret's placeholder sent where it may not go");
    event.rule = "placeholder".to_owned();
    event.reason = Some(reason.clone());
    refuse(client, 403, &format!("warren: {reason}")).await
}

enum Refusal {
    Policy,
    Unreachable(std::io::Error),
}

/// Resolves on the host and connects to the first address the policy permits.
///
/// Every candidate is checked before any connection is attempted: the policy on the
/// resolved address (the registries' table, I23), then, unless the allowlist names the
/// address itself, whether it is one of this host's own ([`is_host_address`]). A refused
/// destination never sees a SYN.
async fn connect(host: &str, port: u16, policy: &NetworkPolicy) -> Result<TcpStream, Refusal> {
    if !policy.may_resolve(host) {
        return Err(Refusal::Policy);
    }
    let lookup = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| Refusal::Unreachable(std::io::ErrorKind::TimedOut.into()))?
        .map_err(Refusal::Unreachable)?;
    let mut permitted = Vec::new();
    for address in lookup.filter(|a| policy.permits(host, a.ip())) {
        // An address of this very host (any interface, not just loopback) reaches the
        // host's own services: only an explicitly listed address may.
        if policy.lists_address(address.ip())
            || !is_host_address(address.ip()).map_err(Refusal::Unreachable)?
        {
            permitted.push(address);
        }
    }
    if permitted.is_empty() {
        return Err(Refusal::Policy);
    }
    let mut last = std::io::Error::from(std::io::ErrorKind::NotFound);
    for address in permitted {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                // The check above already refused the host's addresses; this catches one
                // the host gained between that check and the connection.
                let local = stream.local_addr().map(|a| a.ip()).ok();
                if local == Some(address.ip()) && !policy.lists_address(address.ip()) {
                    return Err(Refusal::Policy);
                }
                return Ok(stream);
            }
            Ok(Err(error)) => last = error,
            Err(_) => last = std::io::ErrorKind::TimedOut.into(),
        }
    }
    Err(Refusal::Unreachable(last))
}

/// The setting that lets a socket bind to any address of `address`'s family.
fn nonlocal_bind_sysctl(address: IpAddr) -> &'static str {
    match address {
        IpAddr::V4(_) => "/proc/sys/net/ipv4/ip_nonlocal_bind",
        IpAddr::V6(_) => "/proc/sys/net/ipv6/ip_nonlocal_bind",
    }
}

/// Whether a `ip_nonlocal_bind` setting is on in the calling thread's network namespace.
/// A missing file means the family's stack (and the setting) does not exist.
fn nonlocal_bind_is_set(sysctl: &str) -> bool {
    std::fs::read_to_string(sysctl).is_ok_and(|value| value.trim() != "0")
}

/// A start-up warning when egress would refuse every destination of a family because
/// `ip_nonlocal_bind` hides which addresses are the host's own ([`is_host_address`]).
pub fn nonlocal_bind_warning() -> Option<String> {
    let set: Vec<&str> = [
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    ]
    .into_iter()
    .map(nonlocal_bind_sysctl)
    .filter(|sysctl| nonlocal_bind_is_set(sysctl))
    .collect();
    (!set.is_empty()).then(|| {
        format!(
            "{} set: network open and allowlist refuse every destination of that family, as \
             warren cannot tell the host's own addresses from others",
            set.join(" and ")
        )
    })
}

/// Whether `address`, or an IPv4 address it carries (IPv4-mapped, NAT64, 6to4, Teredo),
/// is one of this host's own, in the provisioner's network namespace.
///
/// The kernel is asked, not a copy of its tables: it lets a socket bind only to an address
/// whose route is local (an interface's address, a local route such as AnyIP, or a
/// broadcast address), so binding a UDP socket to port 0 answers exactly "would a
/// connection land on this host". Nothing is sent and the socket is closed at once. With
/// `ip_nonlocal_bind` set every bind succeeds, so the question has no answer: egress is
/// refused with that reason rather than guessed.
fn is_host_address(address: IpAddr) -> std::io::Result<bool> {
    // The carried IPv4 addresses first: they need no IPv6 stack to be judged.
    let mut candidates: Vec<IpAddr> = embedded_ipv4(address).into_iter().map(IpAddr::V4).collect();
    candidates.push(address.to_canonical());
    for candidate in candidates {
        let sysctl = nonlocal_bind_sysctl(candidate);
        if nonlocal_bind_is_set(sysctl) {
            return Err(std::io::Error::other(format!(
                "{sysctl} is set, so warren cannot tell this host's own addresses from others"
            )));
        }
        match std::net::UdpSocket::bind((candidate, 0)) {
            Ok(_) => return Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AddrNotAvailable => {}
            Err(error) => return Err(error),
        }
    }
    Ok(false)
}

async fn refuse<W: AsyncWrite + Unpin>(
    client: &mut W,
    status: u16,
    message: &str,
) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{message}\n",
        message.len() + 1
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_addresses_are_recognised_without_connecting() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for own in [
            "127.0.0.1",
            "127.0.0.53",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            assert!(is_host_address(ip(own)).unwrap(), "{own}");
        }
        // TEST-NET-3: no test here or elsewhere in the suite puts it on an interface.
        for other in ["203.0.113.77", "::ffff:203.0.113.77"] {
            assert!(!is_host_address(ip(other)).unwrap(), "{other}");
        }
    }

    #[test]
    fn with_ip_nonlocal_bind_set_no_address_passes_for_a_remote_one() {
        // In a network namespace of this thread's own (root needed), where the setting
        // can be turned on without touching the host's.
        let answers = std::thread::spawn(|| {
            crate::sys::unshare(rustix::thread::UnshareFlags::NEWNET)
                .expect("unshare a network namespace (the test needs root)");
            // With no local route at all the kernel lets every bind through (fail-closed
            // here: everything looks local); a real host always has loopback up.
            crate::sys::loopback_up().expect("loopback up in the new namespace");
            let address: IpAddr = "203.0.113.77".parse().unwrap();
            let before = is_host_address(address).map_err(|e| e.to_string());
            let warning_before = nonlocal_bind_warning();
            // /proc/sys/net answers for the opening thread's network namespace.
            std::fs::write("/proc/sys/net/ipv4/ip_nonlocal_bind", "1")
                .expect("set ip_nonlocal_bind in the new namespace");
            let after = is_host_address(address).map_err(|e| e.to_string());
            (before, warning_before, after, nonlocal_bind_warning())
        })
        .join()
        .unwrap();
        let (before, warning_before, after, warning_after) = answers;
        assert_eq!(before, Ok(false));
        assert_eq!(warning_before, None);
        let error = after.expect_err("every bind succeeds, so no answer");
        assert!(error.contains("ip_nonlocal_bind is set"), "{error}");
        let warning = warning_after.expect("a start-up warning");
        assert!(
            warning.contains("/proc/sys/net/ipv4/ip_nonlocal_bind set"),
            "{warning}"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_the_host_is_refused_before_any_connection() {
        // A listener of the host on loopback, and an allowlist naming it by host name:
        // names never open internal or host addresses, and nothing is accepted.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy = NetworkPolicy::Allowlist {
            allow: vec!["localhost".into()],
            deny: vec![],
        };
        assert!(matches!(
            connect("localhost", port, &policy).await,
            Err(Refusal::Policy)
        ));
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "the listener saw a connection");
        // Listed as an address, the same listener is reachable.
        let listed = NetworkPolicy::Allowlist {
            allow: vec!["127.0.0.1".into()],
            deny: vec![],
        };
        assert!(connect("127.0.0.1", port, &listed).await.is_ok());
    }
}
