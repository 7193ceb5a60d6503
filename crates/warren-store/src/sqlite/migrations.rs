//! The migration journal on SQLite (I36).
//!
//! Every write runs in a `BEGIN IMMEDIATE` transaction: the write lock is taken first, so
//! a begin that finds no migration cannot race another begin of the same id, and a step's
//! compare-and-set and its workdir record commit together or not at all.

use sqlx::sqlite::{SqlitePool, SqliteRow};

use crate::migrations::{check_migration, count_column, resume_or_conflict, sql};
use crate::{
    ItemState, ItemUpdate, MigrationItem, MigrationRecord, MigrationState, NewMigration,
    NewMigrationItem, StoreError,
};

crate::migrations::migration_decoders!(SqliteRow);

pub(super) async fn begin(
    pool: &SqlitePool,
    now: i64,
    migration: &NewMigration,
    items: &[NewMigrationItem],
) -> Result<MigrationRecord, StoreError> {
    const OPERATION: &str = "begin a migration";
    check_migration(migration, items)?;
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(StoreError::query(OPERATION))?;
    let created = sqlx::query(sql::CREATE)
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
        // Recorded before: a rerun. Nothing is written either way.
        let existing = sqlx::query(sql::GET)
            .bind(&migration.id)
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        let existing = migration_from_row(&existing)?;
        tx.rollback().await.map_err(StoreError::query(OPERATION))?;
        return resume_or_conflict(existing, migration);
    };
    let record = migration_from_row(&created)?;
    for item in items {
        sqlx::query(sql::CREATE_ITEM)
            .bind(&migration.id)
            .bind(&item.key)
            .bind(&item.kind)
            .bind(&item.source)
            .bind(item.uid.as_ref().map(|uid| uid.as_str()))
            .bind(&item.target)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(record)
}

pub(super) async fn get(
    pool: &SqlitePool,
    id: &str,
) -> Result<Option<MigrationRecord>, StoreError> {
    let row = sqlx::query(sql::GET)
        .bind(id)
        .fetch_optional(pool)
        .await
        .map_err(StoreError::query("read a migration"))?;
    row.as_ref().map(migration_from_row).transpose()
}

pub(super) async fn list(pool: &SqlitePool) -> Result<Vec<MigrationRecord>, StoreError> {
    let rows = sqlx::query(sql::LIST)
        .fetch_all(pool)
        .await
        .map_err(StoreError::query("list migrations"))?;
    rows.iter().map(migration_from_row).collect()
}

pub(super) async fn items(pool: &SqlitePool, id: &str) -> Result<Vec<MigrationItem>, StoreError> {
    let rows = sqlx::query(sql::ITEMS)
        .bind(id)
        .fetch_all(pool)
        .await
        .map_err(StoreError::query("list the items of a migration"))?;
    rows.iter().map(item_from_row).collect()
}

pub(super) async fn advance_item(
    pool: &SqlitePool,
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
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(StoreError::query(OPERATION))?;
    let done = sqlx::query(sql::ADVANCE_ITEM)
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
        sqlx::query(sql::RECORD_WORKDIR)
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
    pool: &SqlitePool,
    now: i64,
    id: &str,
    from: MigrationState,
    to: MigrationState,
) -> Result<bool, StoreError> {
    let done = sqlx::query(sql::SET_STATE)
        .bind(id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(now)
        .execute(pool)
        .await
        .map_err(StoreError::query("set the state of a migration"))?;
    Ok(done.rows_affected() == 1)
}
