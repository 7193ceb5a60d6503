//! Sandbox aliases: names other systems give a sandbox, per namespace (DeerFlow's 8-hex
//! sandbox ids in `deerflow`). Stored, not derived, because the foreign name carries no
//! information warren could derive the sandbox from; stored in the state store, so every
//! replica resolves it the same way.

use crate::rows::Columns;
use crate::sql::{Dialect, Query, Record};
use crate::StoreError;
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

const COLUMNS: &str = "namespace, alias, sandbox_id, created_at";

fn alias_from_row(row: &impl Record) -> Result<SandboxAlias, StoreError> {
    let columns = Columns {
        row,
        table: "sandbox_aliases",
    };
    Ok(SandboxAlias {
        namespace: columns.get("namespace")?,
        alias: columns.get("alias")?,
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        created_at: columns.time("created_at")?,
    })
}

pub(crate) async fn put<D: Dialect>(
    db: &D,
    namespace: &str,
    alias: &str,
    sandbox: &SandboxId,
) -> Result<SandboxAlias, StoreError> {
    const OPERATION: &str = "record a sandbox alias";
    // An existing row is never changed: the read below tells whether it names this sandbox.
    Query::new(
        "INSERT INTO sandbox_aliases (namespace, alias, sandbox_id, created_at) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (namespace, alias) DO NOTHING",
    )
    .bind(namespace)
    .bind(alias)
    .bind(sandbox.as_str())
    .bind(crate::now_millis())
    .execute(db)
    .await
    .map_err(StoreError::on_sandbox(OPERATION, sandbox))?;
    let found = get(db, namespace, alias)
        .await?
        .ok_or_else(|| StoreError::query(OPERATION)(sqlx::Error::RowNotFound))?;
    check_put(found, sandbox)
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    namespace: &str,
    alias: &str,
) -> Result<Option<SandboxAlias>, StoreError> {
    let row = Query::new(format!(
        "SELECT {COLUMNS} FROM sandbox_aliases WHERE namespace = $1 AND alias = $2"
    ))
    .bind(namespace)
    .bind(alias)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("read a sandbox alias"))?;
    row.as_ref().map(alias_from_row).transpose()
}

pub(crate) async fn list<D: Dialect>(
    db: &D,
    namespace: &str,
) -> Result<Vec<SandboxAlias>, StoreError> {
    let rows = Query::new(format!(
        "SELECT {COLUMNS} FROM sandbox_aliases WHERE namespace = $1 ORDER BY created_at, alias"
    ))
    .bind(namespace)
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list sandbox aliases"))?;
    rows.iter().map(alias_from_row).collect()
}
