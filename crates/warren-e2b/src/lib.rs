//! E2B's API – the control plane (`/sandboxes`, `/v2/sandboxes`, `X-API-Key`) and each
//! sandbox's envd (the Connect services `process.Process` and `filesystem.Filesystem`,
//! `/files`, `/health`) – parsed and handed to the provisioner, where all rules live
//! (issue 17).
//!
//! The official E2B SDKs reach warren unchanged: a user sets `E2B_API_URL` and
//! `E2B_SANDBOX_URL` to the address of `warren serve --e2b-listen`. envd requests carry
//! the sandbox in their `E2b-Sandbox-Id` header, or in a host name
//! `49983-<id>.<domain>` for clients configured with `E2B_DOMAIN`.
//!
//! An API key maps to a uid: an E2B sandbox is a warren sandbox of that uid (runtime scope
//! `e2b-<sandboxID>`, workdir `e2b/<sandboxID>`, the E2B layout), so every command is one
//! of the provisioner's processes, with its run record, limits and secret masking, and
//! every file operation goes through the fd-safe file layer, exactly as the native API's do.

#![deny(missing_docs)]

mod code;
mod config;
mod control;
mod envd;
mod error;
mod keys;
mod serve;
mod state;

use std::sync::Arc;

use warren_provisioner::Provisioner;

pub use config::{E2bConfig, TemplateTarget, CODE_INTERPRETER_TEMPLATE};
pub use error::E2bError;
pub use keys::{create_key, ApiKey, KeyRing};
pub use serve::{serve, TlsConfig, TlsError};

/// The E2B API of one server: served on a listener of its own (`--e2b-listen`).
#[derive(Clone)]
pub struct E2b {
    shared: Shared,
}

/// What every E2B handler shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) provisioner: Arc<Provisioner>,
    pub(crate) config: Arc<E2bConfig>,
    pub(crate) keys: Arc<KeyRing>,
    /// Derives each sandbox's envd access token and checks signed file URLs.
    pub(crate) secrets: Arc<state::SandboxSecrets>,
}

impl E2b {
    /// The E2B API over a provisioner. `secret_digest` is the provisioner token's digest:
    /// envd access tokens are derived from it, so every replica agrees and a rotated token
    /// revokes them.
    pub fn new(provisioner: Arc<Provisioner>, config: E2bConfig, secret_digest: &[u8]) -> Self {
        let keys = KeyRing::new(provisioner.clone(), config.keys.clone());
        Self {
            shared: Shared {
                provisioner,
                config: Arc::new(config),
                keys: Arc::new(keys),
                secrets: Arc::new(state::SandboxSecrets::derive(secret_digest)),
            },
        }
    }

    /// Every route of the E2B listener: the control plane and every sandbox's envd.
    pub fn router(&self) -> axum::Router {
        control::routes(self.shared.clone())
            .merge(envd::routes(self.shared.clone()))
            .merge(code::routes(self.shared.clone()))
    }
}
