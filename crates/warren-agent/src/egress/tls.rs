//! TLS for the bound HTTPS destinations only (issue 38): the proxy answers the sandbox with
//! a certificate for the destination signed by the sandbox's own authority, and speaks to
//! the destination as a client that checks the destination's certificate against the
//! host's roots (and the operator's extra ones). Every other destination stays a tunnel.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use tokio_rustls::rustls::{self, pki_types};
use warren_backend::Authority;
use warren_core::SandboxId;

/// Most leaf certificates kept per runtime; past it the cache starts over.
const LEAVES_KEPT: usize = 256;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The roots this host trusts, read once.
static HOST_ROOTS: LazyLock<Vec<pki_types::CertificateDer<'static>>> = LazyLock::new(|| {
    let loaded = rustls_native_certs::load_native_certs();
    for error in &loaded.errors {
        tracing::warn!(%error, "a root certificate of this host could not be read");
    }
    loaded.certs
});

/// The client side: what the proxy checks a bound destination against.
pub(super) fn upstream_config(
    extra_pem: Option<&str>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    use pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(HOST_ROOTS.iter().cloned());
    if unusable > 0 {
        tracing::debug!(unusable, "host root certificates rustls cannot use");
    }
    if let Some(pem) = extra_pem {
        for cert in pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("egress upstream roots: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("egress upstream roots: {e}"))?;
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server side: certificates for bound destinations, signed by one sandbox's authority.
pub(super) struct Interceptor {
    sandbox: SandboxId,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl Interceptor {
    pub fn new(sandbox: &SandboxId, authority: &Authority) -> Result<Self, String> {
        Ok(Self {
            sandbox: sandbox.clone(),
            issuer: authority.issuer(sandbox)?,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// What the proxy answers the sandbox with for `host` (as the client named it).
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(config.clone());
        }
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params =
            rcgen::CertificateParams::new(vec![host.to_owned()]).map_err(|e| e.to_string())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let now = std::time::SystemTime::now();
        params.not_before = (now - std::time::Duration::from_secs(3600)).into();
        params.not_after = (now + std::time::Duration::from_secs(30 * 24 * 3600)).into();
        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("sign a certificate for {host} ({}): {e}", self.sandbox))?;
        let key = pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .map_err(|e| e.to_string())?;
        // One HTTP/1 request per connection is what the proxy reads and rewrites.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= LEAVES_KEPT {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), config.clone());
        Ok(config)
    }
}

/// The name a bound destination is checked against: a DNS name or an IP address.
pub(super) fn server_name(host: &str) -> Result<pki_types::ServerName<'static>, String> {
    pki_types::ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))
}
