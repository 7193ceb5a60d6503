//! DeerFlow's two HTTP APIs – the provisioner API and the AIO sandbox API – parsed and
//! handed to the provisioner, where all rules live.
//!
//! - The provisioner API (`/deerflow/api/sandboxes`, `/deerflow/health`, ...) is what
//!   DeerFlow's remote sandbox backend calls; it is authenticated with `X-API-Key`.
//! - The AIO sandbox API (`{sandbox_url}/v1/...`) is what DeerFlow's `AioSandbox` calls
//!   through the `agent-sandbox` SDK. That client sends no credentials, so each sandbox's
//!   URL carries an unguessable capability instead (I12, I13).
//!
//! Nothing here decides anything about sandboxes or files: handlers translate DeerFlow's
//! requests into [`warren_provisioner::Provisioner`] calls and its answers back.

#![deny(missing_docs)]

mod aio;
mod capability;
mod error;

use std::sync::Arc;

use warren_provisioner::Provisioner;

pub use capability::{redact_path, CapabilityKey};
pub use error::DeerflowError;
pub(crate) use error::{public_message, status_of};

/// The DeerFlow routes of one server, merged into warren's router by `warren-api`.
#[derive(Clone)]
pub struct Deerflow {
    provisioner: Arc<Provisioner>,
    capabilities: Arc<CapabilityKey>,
}

impl Deerflow {
    /// The DeerFlow APIs over a provisioner guarded by `provisioner_token`.
    pub fn new(provisioner: Arc<Provisioner>, provisioner_token: &str) -> Self {
        Self {
            provisioner,
            capabilities: Arc::new(CapabilityKey::derive(provisioner_token)),
        }
    }

    /// Every `/deerflow` route, with its state applied.
    pub fn router(&self) -> axum::Router {
        aio::router(aio::AioState {
            provisioner: self.provisioner.clone(),
            capabilities: self.capabilities.clone(),
        })
    }
}
