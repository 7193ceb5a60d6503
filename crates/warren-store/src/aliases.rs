//! Sandbox aliases: names other systems give a sandbox, per namespace (DeerFlow's 8-hex
//! sandbox ids in `deerflow`). Stored, not derived, because the foreign name carries no
//! information warren could derive the sandbox from; stored in the state store, so every
//! replica resolves it the same way.

use chrono::{DateTime, Utc};
use warren_core::SandboxId;

/// One alias of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxAlias {
    /// Whose names these are (`deerflow`).
    pub namespace: String,
    /// The foreign name.
    pub alias: String,
    /// The sandbox it names, for good.
    pub sandbox_id: SandboxId,
    /// When it was first recorded.
    pub created_at: DateTime<Utc>,
}

/// The answer of a put: the alias recorded for (namespace, alias), new or found.
pub(crate) fn check_put(
    found: SandboxAlias,
    sandbox: &SandboxId,
) -> Result<SandboxAlias, crate::StoreError> {
    if &found.sandbox_id == sandbox {
        Ok(found)
    } else {
        Err(crate::StoreError::AliasConflict {
            namespace: found.namespace,
            alias: found.alias,
            bound: found.sandbox_id,
        })
    }
}
