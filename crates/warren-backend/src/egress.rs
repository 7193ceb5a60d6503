//! What a runtime's egress proxy asks of the provisioner (issue 38, I13, I22, I23): the
//! secrets it may inject, the certificate authority it intercepts with, and where each
//! connection is recorded. Backends serve egress; the provisioner holds the store.

use std::sync::Arc;

use warren_core::{EgressEvent, EgressSecret, SandboxId};

/// A sandbox's certificate authority for the bound HTTPS destinations its proxy
/// terminates: trusted inside that runtime only, its key never leaving warren's host.
#[derive(Clone, PartialEq, Eq)]
pub struct Authority {
    /// The CA certificate, PEM: what the runtime's trust store gets.
    pub cert_pem: String,
    /// Its private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    /// A new authority for `sandbox`: an ECDSA P-256 CA valid for ten years, constrained
    /// to sign server certificates.
    pub fn generate(sandbox: &SandboxId) -> Result<Self, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let cert = authority_params(sandbox)
            .self_signed(&key)
            .map_err(|e| e.to_string())?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The issuer that signs the proxy's certificates for bound destinations: the same
    /// name as the stored certificate (rebuilt from the sandbox id) and its key.
    pub fn issuer(
        &self,
        sandbox: &SandboxId,
    ) -> Result<rcgen::Issuer<'static, rcgen::KeyPair>, String> {
        let key = rcgen::KeyPair::from_pem(&self.key_pem).map_err(|e| e.to_string())?;
        Ok(rcgen::Issuer::new(authority_params(sandbox), key))
    }
}

/// The one description of a sandbox's CA: its name and what it may sign.
fn authority_params(sandbox: &SandboxId) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "warren");
    name.push(
        rcgen::DnType::CommonName,
        format!("warren egress {sandbox}"),
    );
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    params
}

/// What the egress proxy of a runtime asks the provisioner. Every call is cheap enough to
/// make per connection: secrets are read per connection, so a rotation takes effect on the
/// next one.
#[async_trait::async_trait]
pub trait EgressBroker: Send + Sync + 'static {
    /// The secrets `sandbox` may present now, its uid's and its own, for a connection to
    /// `host:port`: one bound there carries its value (a sourced one minted now, or left
    /// out when its source fails); the others may carry none, and serve only to refuse
    /// their placeholders.
    async fn secrets(
        &self,
        sandbox: &SandboxId,
        host: &str,
        port: u16,
    ) -> Result<Vec<EgressSecret>, String>;
    /// The sandbox's authority, made the first time it is asked for.
    async fn authority(&self, sandbox: &SandboxId) -> Result<Authority, String>;
    /// Records one connection; never blocks.
    fn record(&self, event: EgressEvent);
    /// Extra roots the proxy trusts for upstream servers (PEM), beside the host's own.
    fn upstream_roots(&self) -> Option<String> {
        None
    }
}

/// A broker shared by the backends of one provisioner.
pub type SharedBroker = Arc<dyn EgressBroker>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_signs_with_the_name_it_was_made_with() {
        let sandbox = SandboxId::parse("sbx-aaaaaaaaaaaaaaaaaaaaaaaa").unwrap();
        let authority = Authority::generate(&sandbox).unwrap();
        assert!(authority
            .cert_pem
            .starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!format!("{authority:?}").contains("PRIVATE"));
        let issuer = authority.issuer(&sandbox).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["api.example.com".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        assert!(!leaf.der().is_empty());
    }
}
