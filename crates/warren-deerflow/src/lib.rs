//! DeerFlow's two HTTP APIs – the provisioner API and the AIO sandbox API – parsed and
//! handed to the provisioner, where all rules live.
//!
//! - The provisioner API (`/deerflow/api/sandboxes`, `/deerflow/health`, ...) is what
//!   DeerFlow's remote sandbox backend calls (`provisioner_url: http://<warren>/deerflow`);
//!   it is authenticated with `X-API-Key` (`[deerflow] api_key`).
//! - The AIO sandbox API (`{sandbox_url}/v1/...`) is what DeerFlow's `AioSandbox` calls
//!   through the `agent-sandbox` SDK. That client sends no credentials, so each sandbox's
//!   URL carries an unguessable capability instead ([`CapabilityKey`]); it belongs on an
//!   internal network.
//!
//! Nothing here decides anything about sandboxes or files: handlers translate DeerFlow's
//! requests into [`warren_provisioner::Provisioner`] calls and its answers back. Sandboxes
//! made here use the DeerFlow layout (`/mnt/user-data`, `/mnt/skills/{public,custom}`, I7).

#![deny(missing_docs)]

mod aio;
mod api;
mod capability;
mod config;
mod error;

use std::sync::Arc;

use warren_core::SandboxId;
use warren_provisioner::{Provisioner, ProvisionerError};

pub use capability::{redact_path, CapabilityKey};
pub use config::{ApiKey, DeerflowConfig};
pub use error::DeerflowError;
pub(crate) use error::{public_message, status_of};

/// The namespace of DeerFlow's sandbox ids in the state store's alias table.
pub(crate) const ALIAS_NAMESPACE: &str = "deerflow";

/// The DeerFlow routes of one server, merged into warren's router by `warren-api`.
#[derive(Clone)]
pub struct Deerflow {
    shared: Shared,
}

/// What every DeerFlow handler shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) provisioner: Arc<Provisioner>,
    pub(crate) config: Arc<DeerflowConfig>,
    pub(crate) capabilities: Arc<CapabilityKey>,
}

impl Shared {
    /// warren's sandbox behind DeerFlow's `sandbox_id`.
    pub(crate) async fn aliases_get(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<SandboxId>, ProvisionerError> {
        self.provisioner
            .sandbox_alias(ALIAS_NAMESPACE, sandbox_id)
            .await
    }

    /// Records DeerFlow's `sandbox_id` for warren's sandbox; an id naming another sandbox
    /// already is a 409.
    pub(crate) async fn aliases_put(
        &self,
        sandbox_id: &str,
        sandbox: &SandboxId,
    ) -> Result<(), api::Failure> {
        match self
            .provisioner
            .put_sandbox_alias(ALIAS_NAMESPACE, sandbox_id, sandbox)
            .await
        {
            Ok(_) => Ok(()),
            Err(ProvisionerError::Store(warren_store::StoreError::AliasConflict { .. })) => {
                Err(api::alias_conflict(sandbox_id))
            }
            Err(other) => Err(other.into()),
        }
    }
}

impl Deerflow {
    /// The DeerFlow APIs over a provisioner. `capability_key` signs sandbox URLs; derive it
    /// from the provisioner token ([`CapabilityKey::derive`]) so every replica agrees.
    pub fn new(
        provisioner: Arc<Provisioner>,
        config: DeerflowConfig,
        capability_key: CapabilityKey,
    ) -> Self {
        Self {
            shared: Shared {
                provisioner,
                config: Arc::new(config),
                capabilities: Arc::new(capability_key),
            },
        }
    }

    /// Every `/deerflow` route, with its state applied: the provisioner API under
    /// `/deerflow` and each sandbox's AIO API under `/deerflow/sandboxes/{id}/{capability}`.
    pub fn router(&self) -> axum::Router {
        let aio = aio::router(aio::AioState {
            provisioner: self.shared.provisioner.clone(),
            capabilities: self.shared.capabilities.clone(),
        });
        axum::Router::new()
            .nest("/deerflow", api::routes(self.shared.clone()))
            .merge(aio)
    }
}
