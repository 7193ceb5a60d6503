//! Sandbox aliases: names other systems give warren's sandboxes (DeerFlow's sandbox ids),
//! kept in the state store so every replica resolves them alike.

use warren_core::SandboxId;
use warren_store::SandboxAlias;

use crate::{Provisioner, ProvisionerError};

impl Provisioner {
    /// Records that `alias` in `namespace` names `sandbox` (idempotent). An alias naming
    /// another sandbox already is refused (`StoreError::AliasConflict`): aliases never move.
    pub async fn put_sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
        sandbox: &SandboxId,
    ) -> Result<SandboxAlias, ProvisionerError> {
        Ok(self
            .store
            .put_sandbox_alias(namespace, alias, sandbox)
            .await?)
    }

    /// The sandbox `alias` names in `namespace`, if any.
    pub async fn sandbox_alias(
        &self,
        namespace: &str,
        alias: &str,
    ) -> Result<Option<SandboxId>, ProvisionerError> {
        Ok(self
            .store
            .get_sandbox_alias(namespace, alias)
            .await?
            .map(|found| found.sandbox_id))
    }

    /// Every alias of `namespace`, oldest first.
    pub async fn list_sandbox_aliases(
        &self,
        namespace: &str,
    ) -> Result<Vec<SandboxAlias>, ProvisionerError> {
        Ok(self.store.list_sandbox_aliases(namespace).await?)
    }
}
