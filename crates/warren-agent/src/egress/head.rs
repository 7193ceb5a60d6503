//! Request heads through the egress proxy: reading one, parsing the proxy's own request
//! (`CONNECT` or an absolute-form HTTP request) and an origin-form request inside an
//! intercepted tunnel, and presenting secrets in one (issue 38).

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt};
use warren_core::{EgressSecret, Presentation};

/// Largest request head accepted, bytes.
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// Reads up to the end of the request head; returns the head and any bytes after it.
pub(super) async fn read_head<R: AsyncRead + Unpin>(
    client: &mut R,
    deadline: std::time::Duration,
) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    // One deadline for the whole head: a byte now and then must not keep a connection.
    tokio::time::timeout(deadline, read_head_unbounded(client))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

async fn read_head_unbounded<R: AsyncRead + Unpin>(
    client: &mut R,
) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
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
pub(super) struct ProxyRequest {
    pub host: String,
    pub port: u16,
    /// `CONNECT`: a tunnel; otherwise `head`, an HTTP request to forward.
    pub tunnel: bool,
    /// For plain HTTP: the request in origin form.
    pub head: Option<Head>,
}

impl ProxyRequest {
    pub fn parse(head: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, target, version) = (first.next()?, first.next()?, first.next()?);
        if !version.starts_with("HTTP/1.") || first.next().is_some() {
            return None;
        }
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = split_authority(target, None)?;
            return Some(Self {
                host,
                port,
                tunnel: true,
                head: None,
            });
        }
        let rest = target.strip_prefix("http://")?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        let (host, port) = split_authority(authority, Some(80))?;
        let head = Head::from_parts(method, &path, version, lines)?;
        Some(Self {
            host,
            port,
            tunnel: false,
            head: Some(head),
        })
    }
}

/// An HTTP/1 request head in origin form, as forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    pub method: String,
    /// Path and query.
    pub target: String,
    pub version: String,
    /// `(name, value)` pairs, hop-by-hop ones removed.
    pub headers: Vec<(String, String)>,
    /// Whether the client asked to switch protocols (`Upgrade`): its `Connection` kept.
    upgrade: bool,
}

impl Head {
    /// An origin-form request head (what a client sends inside a tunnel).
    pub fn parse_origin(head: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, target, version) = (first.next()?, first.next()?, first.next()?);
        if !version.starts_with("HTTP/1.") || first.next().is_some() || !target.starts_with('/') {
            return None;
        }
        Self::from_parts(method, target, version, lines)
    }

    fn from_parts<'a>(
        method: &str,
        target: &str,
        version: &str,
        lines: impl Iterator<Item = &'a str>,
    ) -> Option<Self> {
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        if !token(method) || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return None;
        }
        let mut headers = Vec::new();
        let mut upgrade = false;
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(':')?;
            if !token(name) {
                return None;
            }
            let lower = name.to_ascii_lowercase();
            upgrade |= lower == "upgrade";
            headers.push((name.to_owned(), value.trim().to_owned()));
        }
        headers.retain(|(name, _)| {
            let lower = name.to_ascii_lowercase();
            let hop = matches!(
                lower.as_str(),
                "proxy-connection" | "proxy-authorization" | "keep-alive"
            );
            !hop && (upgrade || lower != "connection")
        });
        Some(Self {
            method: method.to_owned(),
            target: target.to_owned(),
            version: version.to_owned(),
            headers,
            upgrade,
        })
    }

    /// The head as sent on: one request per connection (each is checked on its own), so
    /// `Connection: close` unless the client switches protocols.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} {}\r\n", self.method, self.target, self.version);
        for (name, value) in &self.headers {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
        if !self.upgrade {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    /// Whether `needle` appears anywhere in the head.
    pub fn contains(&self, needle: &str) -> bool {
        self.target.contains(needle)
            || self
                .headers
                .iter()
                .any(|(n, v)| n.contains(needle) || v.contains(needle))
    }

    /// Presents `secret` whose placeholder is `placeholder`: where the client put the
    /// placeholder, the value takes its place (percent-encoded in the target); where it put
    /// none, the secret's presentation is set, replacing any header or parameter of that
    /// name.
    pub fn present(&mut self, secret: &EgressSecret, placeholder: &str) {
        if self.contains(placeholder) {
            let encoded = percent_encode(&secret.value);
            self.target = self.target.replace(placeholder, &encoded);
            for (_, value) in &mut self.headers {
                *value = value.replace(placeholder, &secret.value);
            }
            return;
        }
        match &secret.rule.present {
            Presentation::Bearer => {
                self.set_header("Authorization", format!("Bearer {}", secret.value));
            }
            Presentation::Header { name, prefix } => {
                self.set_header(name, format!("{prefix}{}", secret.value));
            }
            Presentation::Basic { username } => {
                let pair = format!("{username}:{}", secret.value);
                let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
                self.set_header("Authorization", format!("Basic {encoded}"));
            }
            Presentation::Query { name } => {
                let (path, query) = match self.target.split_once('?') {
                    Some((path, query)) => (path.to_owned(), query.to_owned()),
                    None => (self.target.clone(), String::new()),
                };
                let mut pairs: Vec<&str> = query
                    .split('&')
                    .filter(|pair| !pair.is_empty())
                    .filter(|pair| pair.split('=').next() != Some(name.as_str()))
                    .collect();
                let ours = format!("{name}={}", percent_encode(&secret.value));
                pairs.push(&ours);
                self.target = format!("{path}?{}", pairs.join("&"));
            }
        }
    }

    fn set_header(&mut self, name: &str, value: String) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value));
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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
    use warren_core::{SecretName, SecretRule, SecretTarget};

    fn secret(present: Presentation) -> EgressSecret {
        EgressSecret::new(
            SecretName::new("TOKEN").unwrap(),
            SecretRule {
                targets: vec![SecretTarget {
                    host: "api.example.com".into(),
                    ports: vec![],
                    path_prefix: None,
                }],
                present,
                source: None,
            },
            "s3cr3t value&x".into(),
        )
        .unwrap()
    }

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
            String::from_utf8(request.head.unwrap().to_bytes()).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
        );
        let query_only = ProxyRequest::parse(b"GET http://h:8080?q=1 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(query_only.head.unwrap().target, "/?q=1");
    }

    #[test]
    fn malformed_requests_are_refused() {
        for head in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"CONNECT pypi.org HTTP/1.1\r\n\r\n",
            b"CONNECT user@host:443 HTTP/1.1\r\n\r\n",
            b"CONNECT host:0 HTTP/1.1\r\n\r\n",
            b"GET http://h/ SPDY/3\r\n\r\n",
            b"GET http://h/ HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET http://h/ HTTP/1.1 extra\r\n\r\n",
            b"\xff\xfe",
        ] {
            assert!(ProxyRequest::parse(head).is_none(), "{head:?}");
        }
        assert!(Head::parse_origin(b"GET http://h/ HTTP/1.1\r\n\r\n").is_none());
    }

    #[test]
    fn a_placeholder_the_client_placed_is_replaced_where_it_stands() {
        let s = secret(Presentation::Bearer);
        let mut head = Head::parse_origin(
            b"GET /x?k=PH HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: token PH\r\n\r\n",
        )
        .unwrap();
        head.present(&s, "PH");
        assert_eq!(head.target, "/x?k=s3cr3t%20value%26x");
        assert!(head
            .headers
            .contains(&("Authorization".into(), "token s3cr3t value&x".into())));
    }

    #[test]
    fn each_presentation_is_set_when_no_placeholder_was_sent() {
        let base = b"GET /x?a=1&key=old HTTP/1.1\r\nHost: h\r\nauthorization: mine\r\n\r\n";
        let mut bearer = Head::parse_origin(base).unwrap();
        bearer.present(&secret(Presentation::Bearer), "PH");
        assert_eq!(
            bearer
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
                .collect::<Vec<_>>(),
            vec![&(
                "Authorization".to_owned(),
                "Bearer s3cr3t value&x".to_owned()
            )]
        );
        let mut header = Head::parse_origin(base).unwrap();
        header.present(
            &secret(Presentation::Header {
                name: "X-Api-Key".into(),
                prefix: "key ".into(),
            }),
            "PH",
        );
        assert!(header
            .headers
            .contains(&("X-Api-Key".into(), "key s3cr3t value&x".into())));
        let mut query = Head::parse_origin(base).unwrap();
        query.present(&secret(Presentation::Query { name: "key".into() }), "PH");
        assert_eq!(query.target, "/x?a=1&key=s3cr3t%20value%26x");
        let mut basic = Head::parse_origin(base).unwrap();
        basic.present(
            &secret(Presentation::Basic {
                username: "bot".into(),
            }),
            "PH",
        );
        let expected = base64::engine::general_purpose::STANDARD.encode("bot:s3cr3t value&x");
        assert!(basic
            .headers
            .contains(&("Authorization".into(), format!("Basic {expected}"))));
    }

    #[test]
    fn an_upgrade_keeps_its_connection_header() {
        let head = Head::parse_origin(
            b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .unwrap();
        let text = String::from_utf8(head.to_bytes()).unwrap();
        assert!(text.contains("Connection: Upgrade") && !text.contains("close"));
    }
}
