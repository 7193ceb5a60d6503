//! The egress proxy: the only way out of a runtime with network `open` or `allowlist`
//! (I23: network opened only to the targets a task needs).
//!
//! A runtime has no route anywhere; its init listens on `127.0.0.1:3128` inside the
//! runtime and passes every connection's socket to the provisioner over the control
//! socket. Here, in the provisioner's network namespace, each connection is read as an HTTP
//! proxy request (`CONNECT host:port` for HTTPS and any TCP, or an absolute-form HTTP
//! request), checked against the sandbox's [`NetworkPolicy`] *after* name resolution (so
//! no name can lead to the host, a private network, cloud metadata or any other address
//! the IANA special-purpose registries mark not globally reachable unless listed as an
//! address), checked not to be an address of the host itself, and only then connected and
//! spliced. Commands get `HTTP(S)_PROXY` pointing
//! at the port.

use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use warren_core::{embedded_ipv4, NetworkPolicy};

use crate::protocol::{self, Reply, Request};

/// Most proxy connections one runtime may hold open at once.
const CONNECTIONS_PER_RUNTIME: usize = 128;
/// Most proxy connections all runtimes together may hold open.
static ALL_CONNECTIONS: std::sync::LazyLock<Arc<Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(Semaphore::new(4096)));

/// Largest request head accepted, bytes.
const MAX_HEAD: usize = 16 * 1024;
/// How long resolving and connecting a destination may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Serves a runtime's egress for as long as its init answers: connects to its control
/// socket, registers as the egress connection and proxies every connection init hands
/// over. Runs on its own thread (the receive loop blocks); proxying runs on `runtime`.
pub fn spawn_egress(
    socket_dir: PathBuf,
    policy: NetworkPolicy,
    runtime: tokio::runtime::Handle,
) -> std::io::Result<()> {
    let stream = crate::client::connect(&socket_dir)?;
    protocol::send_frame(stream.as_fd(), &Request::Egress, &[])?;
    // One sandbox cannot take the provisioner's descriptors: its open proxy connections
    // are capped, and so are all sandboxes' together.
    let mine = Arc::new(Semaphore::new(CONNECTIONS_PER_RUNTIME));
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
                    let permits = (
                        mine.clone().try_acquire_owned(),
                        ALL_CONNECTIONS.clone().try_acquire_owned(),
                    );
                    let (Ok(mine_permit), Ok(all_permit)) = permits else {
                        tracing::warn!("egress connection refused: too many open connections");
                        continue; // dropping `fd` closes the connection
                    };
                    let policy = policy.clone();
                    runtime.spawn(async move {
                        let _permits = (mine_permit, all_permit);
                        if let Err(error) = proxy(fd, &policy).await {
                            tracing::debug!(%error, "egress connection ended");
                        }
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

/// The proxy connections one runtime may hold open at once: give each runtime one, and
/// pass it to [`spawn_connection`] with each of its connections.
pub fn runtime_permits() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(CONNECTIONS_PER_RUNTIME))
}

/// Proxies one connection of a runtime whose egress reaches warren over the network (a
/// pod dialling warren's proxy port): the same request parsing, policy check on the
/// resolved address, refusal of the host's own addresses and splice as for a connection
/// init hands over, under the same caps (`permits` is the runtime's own). False when a
/// cap refused it (the connection is closed).
pub fn spawn_connection(
    stream: std::net::TcpStream,
    policy: NetworkPolicy,
    permits: &Arc<Semaphore>,
    runtime: &tokio::runtime::Handle,
) -> bool {
    let (Ok(mine), Ok(all)) = (
        permits.clone().try_acquire_owned(),
        ALL_CONNECTIONS.clone().try_acquire_owned(),
    ) else {
        tracing::warn!("egress connection refused: too many open connections");
        return false;
    };
    runtime.spawn(async move {
        let _permits = (mine, all);
        if let Err(error) = proxy(OwnedFd::from(stream), &policy).await {
            tracing::debug!(%error, "egress connection ended");
        }
    });
    true
}

async fn proxy(fd: OwnedFd, policy: &NetworkPolicy) -> std::io::Result<()> {
    let std_stream = std::net::TcpStream::from(fd);
    std_stream.set_nonblocking(true)?;
    let mut client = TcpStream::from_std(std_stream)?;
    let (head, rest) = read_head(&mut client).await?;
    let Some(request) = ProxyRequest::parse(&head) else {
        return refuse(&mut client, 400, "warren: not an HTTP proxy request").await;
    };
    let target = match connect(&request.host, request.port, policy).await {
        Ok(target) => target,
        Err(Refusal::Policy) => {
            let message = format!(
                "warren: {}:{} is not allowed by this sandbox's network policy ({})",
                request.host,
                request.port,
                policy.mode()
            );
            return refuse(&mut client, 403, &message).await;
        }
        Err(Refusal::Unreachable(error)) => {
            let message = format!(
                "warren: cannot reach {}:{}: {error}",
                request.host, request.port
            );
            return refuse(&mut client, 502, &message).await;
        }
    };
    let mut target = target;
    if request.tunnel {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        target.write_all(&rest).await?;
    } else {
        target.write_all(&request.forwarded_head).await?;
        target.write_all(&rest).await?;
    }
    splice(&mut client, &mut target, TUNNEL_IDLE).await
}

/// How long a proxied connection may carry no byte either way before it is closed.
const TUNNEL_IDLE: Duration = Duration::from_secs(600);

/// Copies both ways until both sides are done, or nothing moved for `idle`: an idle tunnel
/// would otherwise hold one of the runtime's few connection permits for ever.
async fn splice(a: &mut TcpStream, b: &mut TcpStream, idle: Duration) -> std::io::Result<()> {
    let (mut a_read, mut a_write) = a.split();
    let (mut b_read, mut b_write) = b.split();
    let (mut a_buf, mut b_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            read = a_read.read(&mut a_buf), if a_open => match read? {
                0 => {
                    a_open = false;
                    let _ = b_write.shutdown().await;
                }
                n => b_write.write_all(&a_buf[..n]).await?,
            },
            read = b_read.read(&mut b_buf), if b_open => match read? {
                0 => {
                    b_open = false;
                    let _ = a_write.shutdown().await;
                }
                n => a_write.write_all(&b_buf[..n]).await?,
            },
            () = tokio::time::sleep(idle) => return Ok(()),
        }
    }
    Ok(())
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

async fn refuse(client: &mut TcpStream, status: u16, message: &str) -> std::io::Result<()> {
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

/// Reads up to the end of the request head; returns the head and any bytes after it.
async fn read_head(client: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    // One deadline for the whole head: a byte now and then must not keep a connection.
    tokio::time::timeout(CONNECT_TIMEOUT, read_head_unbounded(client))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

async fn read_head_unbounded(client: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok((buffer, rest));
        }
        if buffer.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too large"));
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// A parsed proxy request.
#[derive(Debug, PartialEq, Eq)]
struct ProxyRequest {
    host: String,
    port: u16,
    /// `CONNECT`: a tunnel; otherwise an HTTP request to forward.
    tunnel: bool,
    /// For plain HTTP: the head rewritten to origin form, with `Connection: close` so one
    /// connection carries one request (each is checked on its own).
    forwarded_head: Vec<u8>,
}

impl ProxyRequest {
    fn parse(head: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, target, version) = (first.next()?, first.next()?, first.next()?);
        if !version.starts_with("HTTP/1.") {
            return None;
        }
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = split_authority(target, None)?;
            return Some(Self {
                host,
                port,
                tunnel: true,
                forwarded_head: Vec::new(),
            });
        }
        let rest = target.strip_prefix("http://")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = split_authority(authority, Some(80))?;
        let mut forwarded = format!("{method} {path} {version}\r\n");
        for line in lines.filter(|l| !l.is_empty()) {
            let name = line
                .split(':')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            if matches!(
                name.as_str(),
                "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
            ) {
                continue;
            }
            forwarded.push_str(line);
            forwarded.push_str("\r\n");
        }
        forwarded.push_str("Connection: close\r\n\r\n");
        Some(Self {
            host,
            port,
            tunnel: false,
            forwarded_head: forwarded.into_bytes(),
        })
    }
}

fn split_authority(authority: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    if authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port.parse().ok()?)),
            None if after.is_empty() => (host, None),
            None => return None,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port.parse().ok()?)),
            None => (authority, None),
        }
    };
    let port = port.or(default_port)?;
    (!host.is_empty() && port != 0).then(|| (host.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_requests_become_tunnels() {
        let request =
            ProxyRequest::parse(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n")
                .unwrap();
        assert_eq!(
            (request.host.as_str(), request.port, request.tunnel),
            ("pypi.org", 443, true)
        );
        let v6 = ProxyRequest::parse(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 8080));
    }

    #[test]
    fn plain_requests_are_rewritten_to_origin_form_with_one_request_per_connection() {
        let request = ProxyRequest::parse(
            b"GET http://Example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (request.host.as_str(), request.port, request.tunnel),
            ("example.com", 80, false)
        );
        assert_eq!(
            String::from_utf8(request.forwarded_head).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn a_tunnel_carries_both_ways_and_closes_when_idle() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (mut near, accepted) = tokio::join!(
            async { TcpStream::connect(address).await.unwrap() },
            async { listener.accept().await.unwrap().0 }
        );
        let far_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let far_address = far_listener.local_addr().unwrap();
        let (mut far, far_accepted) = tokio::join!(
            async { TcpStream::connect(far_address).await.unwrap() },
            async { far_listener.accept().await.unwrap().0 }
        );
        let splicer = tokio::spawn(async move {
            let (mut a, mut b) = (accepted, far_accepted);
            let started = std::time::Instant::now();
            splice(&mut a, &mut b, Duration::from_millis(300))
                .await
                .unwrap();
            started.elapsed()
        });
        near.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        far.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        far.write_all(b"pong").await.unwrap();
        near.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // Then silence: the splice ends by itself after the idle time.
        let lasted = tokio::time::timeout(Duration::from_secs(5), splicer)
            .await
            .unwrap()
            .unwrap();
        assert!(lasted >= Duration::from_millis(300), "{lasted:?}");
    }

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
        };
        assert!(connect("127.0.0.1", port, &listed).await.is_ok());
    }

    #[test]
    fn malformed_requests_are_refused() {
        for head in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"CONNECT pypi.org HTTP/1.1\r\n\r\n",
            b"CONNECT user@host:443 HTTP/1.1\r\n\r\n",
            b"CONNECT host:0 HTTP/1.1\r\n\r\n",
            b"GET http://h/ SPDY/3\r\n\r\n",
            b"\xff\xfe",
        ] {
            assert!(ProxyRequest::parse(head).is_none(), "{head:?}");
        }
    }
}
