//! Serving the E2B listener: plain HTTP, or TLS with the operator's certificate (issue 17).
//!
//! Every accepted connection is served by hyper-util's auto builder, which speaks HTTP/1.1
//! and HTTP/2 on one socket: on plain TCP HTTP/2 with prior knowledge (h2c, what the SDKs'
//! HTTP/2 transports send to an `http://` URL), over TLS whichever ALPN chose (`h2` or
//! `http/1.1`). TLS is rustls on the `ring` provider, like the rest of the tree.
//!
//! Clients configured with a domain (`E2B_DOMAIN`) reach the control plane at
//! `https://api.<domain>` and each sandbox's envd at `https://49983-<id>.<domain>`: one
//! listener, one certificate (for `api.<domain>` and `*.<domain>`), the sandbox told by
//! the host name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header::HOST, HeaderValue, Request, Version};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its TLS handshake: a connection that never finishes one
/// would otherwise hold a task and a socket for good.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept loop rests after an error that is not one connection's (out of file
/// descriptors, typically), so it does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// The E2B listener's TLS: the operator's certificate chain and key, checked to belong
/// together, offering `h2` and `http/1.1` by ALPN.
#[derive(Clone)]
pub struct TlsConfig {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsConfig {
    // The rustls configuration holds the private key: nothing of it is printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

/// Why the E2B listener's certificate or key cannot be used. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be read.
    #[error("cannot read the E2B TLS certificate {}: {source}", path.display())]
    ReadCertificate {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file is not a PEM certificate chain.
    #[error(
        "the E2B TLS certificate {} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`){}",
        path.display(),
        detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
    )]
    NoCertificate {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said, when it said more than "nothing found".
        detail: Option<String>,
    },
    /// The key file cannot be read.
    #[error("cannot read the E2B TLS key {}: {source}", path.display())]
    ReadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The key file holds no PEM private key.
    #[error(
        "the E2B TLS key {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1){}",
        path.display(),
        detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
    )]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said, when it said more than "nothing found".
        detail: Option<String>,
    },
    /// The key is not the certificate's.
    #[error(
        "the E2B TLS key {} does not belong to the certificate {} (the first certificate of the \
         file must be the server's own, the one the key signs for)",
        key.display(),
        cert.display()
    )]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// rustls refused the pair for another reason (an unsupported key type, say).
    #[error(
        "cannot use the E2B TLS certificate {} with the key {}: {source}",
        cert.display(),
        key.display()
    )]
    Unusable {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

impl TlsConfig {
    /// Reads a PEM certificate chain (the server's certificate first, then any
    /// intermediates) and its PEM private key.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = std::fs::read(cert).map_err(|source| TlsError::ReadCertificate {
            path: cert.to_owned(),
            source,
        })?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| TlsError::NoCertificate {
                path: cert.to_owned(),
                detail: Some(error.to_string()),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert.to_owned(),
                detail: None,
            });
        }
        let key_pem = std::fs::read(key).map_err(|source| TlsError::ReadKey {
            path: key.to_owned(),
            source,
        })?;
        let private_key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| match error {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
                path: key.to_owned(),
                detail: None,
            },
            other => TlsError::NoKey {
                path: key.to_owned(),
                detail: Some(other.to_string()),
            },
        })?;
        let unusable = |source: rustls::Error| match source {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                TlsError::Mismatch {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                }
            }
            source => TlsError::Unusable {
                cert: cert.to_owned(),
                key: key.to_owned(),
                source,
            },
        };
        // The provider named, not the process default: nothing else has to install one, and
        // no build can end up on another.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(unusable)?
            .with_no_client_auth()
            // Also checks that the key is the end-entity certificate's.
            .with_single_cert(chain, private_key)
            .map_err(unusable)?;
        // h2 first: the SDKs multiplex their streams over one connection when offered it.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// Serves `router` on `listener`, over TLS when `tls` is given, until the future is dropped.
/// Dropping it also ends every connection it accepted (they live in its task set).
pub async fn serve(listener: TcpListener, router: Router, tls: Option<TlsConfig>) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Reaps finished connections so the set holds only live ones.
            Some(_) = connections.join_next() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                tracing::error!(%error, "the E2B listener cannot accept connections");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        // Connect streams are small messages each answered promptly; Nagle would hold them.
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            if let Err(error) = serve_connection(stream, router, tls).await {
                tracing::debug!(%peer, %error, "an E2B connection ended with an error");
            }
        });
    }
}

/// Whether an accept error is one connection's (gone before it was taken), not the
/// listener's.
fn is_connection_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// One connection: the TLS handshake (when configured), then HTTP/1.1 or HTTP/2 until the
/// client closes it.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    tls: Option<TlsConfig>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        host_from_authority(&mut request);
        tower::ServiceExt::oneshot(router.clone(), request)
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    match tls {
        None => {
            builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
        }
        Some(tls) => {
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream))
                .await
                .map_err(|_| "the TLS handshake timed out")??;
            builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
        }
    }
}

/// HTTP/2 names the host in the `:authority` pseudo-header, which hyper keeps in the URI,
/// and sends no `Host`; envd's routing by host name (`49983-<id>.<domain>`) reads `Host`,
/// so it is filled in from the authority, as an HTTP/1.1 client would have sent it.
fn host_from_authority<B>(request: &mut Request<B>) {
    if request.version() != Version::HTTP_2 || request.headers().contains_key(HOST) {
        return;
    }
    let Some(authority) = request.uri().authority() else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
        request.headers_mut().insert(HOST, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory of PEM files, removed on drop.
    struct Files {
        dir: PathBuf,
    }

    impl Files {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!(
                "warren-e2b-tls-{}-{}",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self { dir }
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A self-signed certificate for `a.test` and its key, both PEM.
    fn pair() -> (String, String) {
        let certified = rcgen::generate_simple_self_signed(vec!["a.test".to_owned()]).unwrap();
        (certified.cert.pem(), certified.signing_key.serialize_pem())
    }

    #[test]
    fn a_matching_pair_is_accepted() {
        let files = Files::new();
        let (cert, key) = pair();
        let cert = files.write("cert.pem", &cert);
        let key = files.write("key.pem", &key);
        TlsConfig::from_pem_files(&cert, &key).unwrap();
    }

    #[test]
    fn unreadable_files_are_named() {
        let files = Files::new();
        let (cert, key) = pair();
        let missing = files.dir.join("missing.pem");
        let cert = files.write("cert.pem", &cert);
        let key = files.write("key.pem", &key);
        let error = TlsConfig::from_pem_files(&missing, &key).unwrap_err();
        assert!(matches!(error, TlsError::ReadCertificate { .. }), "{error}");
        assert!(error.to_string().contains("missing.pem"), "{error}");
        let error = TlsConfig::from_pem_files(&cert, &missing).unwrap_err();
        assert!(matches!(error, TlsError::ReadKey { .. }), "{error}");
        assert!(error.to_string().contains("missing.pem"), "{error}");
    }

    #[test]
    fn files_without_pem_are_refused() {
        let files = Files::new();
        let (cert, key) = pair();
        let cert = files.write("cert.pem", &cert);
        let key_path = files.write("key.pem", &key);
        let junk = files.write("junk.pem", "not a certificate\n");
        let error = TlsConfig::from_pem_files(&junk, &key_path).unwrap_err();
        assert!(matches!(error, TlsError::NoCertificate { .. }), "{error}");
        assert!(error.to_string().contains("junk.pem"), "{error}");
        // A key where the certificate belongs, and the certificate where the key does.
        let swapped = TlsConfig::from_pem_files(&key_path, &cert).unwrap_err();
        assert!(
            matches!(swapped, TlsError::NoCertificate { .. }),
            "{swapped}"
        );
        let error = TlsConfig::from_pem_files(&cert, &cert).unwrap_err();
        assert!(matches!(error, TlsError::NoKey { .. }), "{error}");
    }

    #[test]
    fn a_key_of_another_certificate_is_a_mismatch() {
        let files = Files::new();
        let (cert, _) = pair();
        let (_, other_key) = pair();
        let cert = files.write("cert.pem", &cert);
        let key = files.write("other-key.pem", &other_key);
        let error = TlsConfig::from_pem_files(&cert, &key).unwrap_err();
        assert!(matches!(error, TlsError::Mismatch { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains("other-key.pem") && message.contains("cert.pem"),
            "{message}"
        );
    }

    #[test]
    fn http2_requests_get_a_host_from_their_authority() {
        let mut request = Request::builder()
            .version(Version::HTTP_2)
            .uri("https://49983-abc.e2b.test/process.Process/Start")
            .body(())
            .unwrap();
        host_from_authority(&mut request);
        assert_eq!(request.headers()[HOST], "49983-abc.e2b.test");
        // An HTTP/1.1 request keeps the Host it sent, whatever its URI says.
        let mut request = Request::builder()
            .uri("http://elsewhere.test/")
            .header(HOST, "49983-abc.e2b.test")
            .body(())
            .unwrap();
        host_from_authority(&mut request);
        assert_eq!(request.headers()[HOST], "49983-abc.e2b.test");
    }
}
