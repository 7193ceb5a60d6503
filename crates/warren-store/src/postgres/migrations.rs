//! The migration journal on PostgreSQL (I36).
//!
//! A begin inserts with `ON CONFLICT DO NOTHING`: of two processes beginning one migration,
//! the second waits for the first's transaction and then finds its row, so exactly one
//! writes the plan. A step's compare-and-set is one `UPDATE ... WHERE state = from`, which
//! PostgreSQL re-checks on the locked row, and its workdir record commits with it.

use sqlx::postgres::{PgPool, PgRow};

use crate::migrations::{check_migration, count_column, resume_or_conflict, sql};
use crate::{
    ItemState, ItemUpdate, MigrationItem, MigrationRecord, MigrationState, NewMigration,
    NewMigrationItem, StoreError,
};

crate::migrations::migration_decoders!(PgRow);

/// Records every planned item of a migration in one statement.
const CREATE_ITEMS: &str = "INSERT INTO migration_items \
     (migration_id, key, kind, source, uid, target, state, manifest, files, bytes, updated_at) \
     SELECT $1, item.key, item.kind, item.source, item.uid, item.target, 'planned', NULL, 0, \
     0, $7 \
     FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) \
     AS item (key, kind, source, uid, target)";

pub(super) async fn begin(
    pool: &PgPool,
    now: i64,
    migration: &NewMigration,
    items: &[NewMigrationItem],
) -> Result<MigrationRecord, StoreError> {
    const OPERATION: &str = "begin a migration";
    check_migration(migration, items)?;
    let mut tx = pool.begin().await.map_err(StoreError::query(OPERATION))?;
    let created = sqlx::query(&sql::postgres(sql::CREATE))
        .bind(&migration.id)
        .bind(&migration.kind)
        .bind(&migration.source)
        .bind(&migration.plan_digest)
        .bind(&migration.plan)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
    let Some(created) = created else {
        // Recorded before (or by a begin that committed while this one waited): a rerun.
        let existing = sqlx::query(&sql::postgres(sql::GET))
            .bind(&migration.id)
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        let existing = migration_from_row(&existing)?;
        tx.rollback().await.map_err(StoreError::query(OPERATION))?;
        return resume_or_conflict(existing, migration);
    };
    let record = migration_from_row(&created)?;
    if !items.is_empty() {
        let column = |field: fn(&NewMigrationItem) -> &str| -> Vec<&str> {
            items.iter().map(field).collect()
        };
        let uids: Vec<Option<&str>> = items
            .iter()
            .map(|item| item.uid.as_ref().map(|uid| uid.as_str()))
            .collect();
        sqlx::query(CREATE_ITEMS)
            .bind(&migration.id)
            .bind(column(|item| &item.key))
            .bind(column(|item| &item.kind))
            .bind(column(|item| &item.source))
            .bind(uids)
            .bind(column(|item| &item.target))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(record)
}

pub(super) async fn get(pool: &PgPool, id: &str) -> Result<Option<MigrationRecord>, StoreError> {
    let row = sqlx::query(&sql::postgres(sql::GET))
        .bind(id)
        .fetch_optional(pool)
        .await
        .map_err(StoreError::query("read a migration"))?;
    row.as_ref().map(migration_from_row).transpose()
}

pub(super) async fn list(pool: &PgPool) -> Result<Vec<MigrationRecord>, StoreError> {
    let rows = sqlx::query(sql::LIST)
        .fetch_all(pool)
        .await
        .map_err(StoreError::query("list migrations"))?;
    rows.iter().map(migration_from_row).collect()
}

pub(super) async fn items(pool: &PgPool, id: &str) -> Result<Vec<MigrationItem>, StoreError> {
    let rows = sqlx::query(&sql::postgres(sql::ITEMS))
        .bind(id)
        .fetch_all(pool)
        .await
        .map_err(StoreError::query("list the items of a migration"))?;
    rows.iter().map(item_from_row).collect()
}

pub(super) async fn advance_item(
    pool: &PgPool,
    now: i64,
    id: &str,
    key: &str,
    from: ItemState,
    to: ItemState,
    update: ItemUpdate<'_>,
) -> Result<bool, StoreError> {
    const OPERATION: &str = "advance a migration item";
    let files = update
        .files
        .map(|files| count_column("files", files))
        .transpose()?;
    let bytes = update
        .bytes
        .map(|bytes| count_column("bytes", bytes))
        .transpose()?;
    let mut tx = pool.begin().await.map_err(StoreError::query(OPERATION))?;
    let done = sqlx::query(&sql::postgres(sql::ADVANCE_ITEM))
        .bind(id)
        .bind(key)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(update.manifest)
        .bind(files)
        .bind(bytes)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
    if done.rows_affected() != 1 {
        tx.rollback().await.map_err(StoreError::query(OPERATION))?;
        return Ok(false);
    }
    if let Some((uid, workdir)) = update.workdir {
        sqlx::query(&sql::postgres(sql::RECORD_WORKDIR))
            .bind(uid.as_str())
            .bind(workdir.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(true)
}

pub(super) async fn set_state(
    pool: &PgPool,
    now: i64,
    id: &str,
    from: MigrationState,
    to: MigrationState,
) -> Result<bool, StoreError> {
    let done = sqlx::query(&sql::postgres(sql::SET_STATE))
        .bind(id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(now)
        .execute(pool)
        .await
        .map_err(StoreError::query("set the state of a migration"))?;
    Ok(done.rows_affected() == 1)
}
