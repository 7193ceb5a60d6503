//! Sandbox aliases on SQLite.

use sqlx::sqlite::{SqlitePool, SqliteRow};
use warren_core::SandboxId;

use super::Columns;
use crate::aliases::check_put;
use crate::{SandboxAlias, StoreError};

const COLUMNS: &str = "namespace, alias, sandbox_id, created_at";

fn alias_from_row(row: &SqliteRow) -> Result<SandboxAlias, StoreError> {
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

pub(super) async fn put(
    pool: &SqlitePool,
    now: i64,
    namespace: &str,
    alias: &str,
    sandbox: &SandboxId,
) -> Result<SandboxAlias, StoreError> {
    const OPERATION: &str = "record a sandbox alias";
    // An existing row is never changed: the read below tells whether it names this sandbox.
    sqlx::query(
        "INSERT INTO sandbox_aliases (namespace, alias, sandbox_id, created_at) \
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (namespace, alias) DO NOTHING",
    )
    .bind(namespace)
    .bind(alias)
    .bind(sandbox.as_str())
    .bind(now)
    .execute(pool)
    .await
    .map_err(StoreError::on_sandbox(OPERATION, sandbox))?;
    let found = get(pool, namespace, alias)
        .await?
        .ok_or_else(|| StoreError::query(OPERATION)(sqlx::Error::RowNotFound))?;
    check_put(found, sandbox)
}

pub(super) async fn get(
    pool: &SqlitePool,
    namespace: &str,
    alias: &str,
) -> Result<Option<SandboxAlias>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM sandbox_aliases WHERE namespace = ?1 AND alias = ?2"
    ))
    .bind(namespace)
    .bind(alias)
    .fetch_optional(pool)
    .await
    .map_err(StoreError::query("read a sandbox alias"))?;
    row.as_ref().map(alias_from_row).transpose()
}

pub(super) async fn list(
    pool: &SqlitePool,
    namespace: &str,
) -> Result<Vec<SandboxAlias>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM sandbox_aliases WHERE namespace = ?1 ORDER BY created_at, alias"
    ))
    .bind(namespace)
    .fetch_all(pool)
    .await
    .map_err(StoreError::query("list sandbox aliases"))?;
    rows.iter().map(alias_from_row).collect()
}
