//! The migration journal's statements (I36): every write runs in a transaction that keeps
//! other writers out, so a begin that finds no migration cannot race another begin of the
//! same id, and a step's compare-and-set and its workdir record commit together or not at
//! all.

use crate::migrations::{check_migration, count_column, resume_or_conflict, sql};
use crate::sql::{Dialect, Query, Record, Tx};
use crate::{
    ItemState, ItemUpdate, MigrationItem, MigrationRecord, MigrationState, NewMigration,
    NewMigrationItem, StoreError,
};

fn migration_from_row(row: &impl Record) -> Result<crate::MigrationRecord, StoreError> {
    let columns = crate::rows::Columns {
        row,
        table: "migrations",
    };
    Ok(crate::MigrationRecord {
        id: columns.get("id")?,
        kind: columns.get("kind")?,
        source: columns.get("source")?,
        plan_digest: columns.get("plan_digest")?,
        plan: columns.get("plan")?,
        state: columns.parse("state", |state| state.parse::<crate::MigrationState>())?,
        created_at: columns.time("created_at")?,
        updated_at: columns.time("updated_at")?,
    })
}

fn item_from_row(row: &impl Record) -> Result<crate::MigrationItem, StoreError> {
    let columns = crate::rows::Columns {
        row,
        table: "migration_items",
    };
    let count = |column: &'static str| -> Result<u64, StoreError> {
        let value: i64 = columns.get(column)?;
        u64::try_from(value).map_err(|e| columns.corrupt(column, e))
    };
    let uid: Option<String> = columns.get("uid")?;
    Ok(crate::MigrationItem {
        migration_id: columns.get("migration_id")?,
        key: columns.get("key")?,
        kind: columns.get("kind")?,
        source: columns.get("source")?,
        uid: uid
            .map(warren_core::Uid::new)
            .transpose()
            .map_err(|e| columns.corrupt("uid", e))?,
        target: columns.get("target")?,
        state: columns.parse("state", |state| state.parse::<crate::ItemState>())?,
        manifest: columns.get("manifest")?,
        files: count("files")?,
        bytes: count("bytes")?,
        updated_at: columns.time("updated_at")?,
    })
}

pub(crate) async fn begin<D: Dialect>(
    db: &D,
    migration: &NewMigration,
    items: &[NewMigrationItem],
) -> Result<MigrationRecord, StoreError> {
    const OPERATION: &str = "begin a migration";
    check_migration(migration, items)?;
    let now = crate::now_millis();
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    let created = Query::new(sql::CREATE)
        .bind(&migration.id)
        .bind(&migration.kind)
        .bind(&migration.source)
        .bind(&migration.plan_digest)
        .bind(&migration.plan)
        .bind(now)
        .fetch_optional_in(&mut tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
    let Some(created) = created else {
        // Recorded before: a rerun. Nothing is written either way.
        let existing = Query::new(sql::GET)
            .bind(&migration.id)
            .fetch_one_in(&mut tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
        let existing = migration_from_row(&existing)?;
        tx.rollback().await.map_err(StoreError::query(OPERATION))?;
        return resume_or_conflict(existing, migration);
    };
    let record = migration_from_row(&created)?;
    for item in items {
        Query::new(sql::CREATE_ITEM)
            .bind(&migration.id)
            .bind(&item.key)
            .bind(&item.kind)
            .bind(&item.source)
            .bind(item.uid.as_ref().map(|uid| uid.as_str()))
            .bind(&item.target)
            .bind(now)
            .execute_in(&mut tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(record)
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    id: &str,
) -> Result<Option<MigrationRecord>, StoreError> {
    let row = Query::new(sql::GET)
        .bind(id)
        .fetch_optional(db)
        .await
        .map_err(StoreError::query("read a migration"))?;
    row.as_ref().map(migration_from_row).transpose()
}

pub(crate) async fn list<D: Dialect>(db: &D) -> Result<Vec<MigrationRecord>, StoreError> {
    let rows = Query::new(sql::LIST)
        .fetch_all(db)
        .await
        .map_err(StoreError::query("list migrations"))?;
    rows.iter().map(migration_from_row).collect()
}

pub(crate) async fn items<D: Dialect>(db: &D, id: &str) -> Result<Vec<MigrationItem>, StoreError> {
    let rows = Query::new(sql::ITEMS)
        .bind(id)
        .fetch_all(db)
        .await
        .map_err(StoreError::query("list the items of a migration"))?;
    rows.iter().map(item_from_row).collect()
}

pub(crate) async fn advance_item<D: Dialect>(
    db: &D,
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
    let now = crate::now_millis();
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    let done = Query::new(sql::ADVANCE_ITEM)
        .bind(id)
        .bind(key)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(update.manifest)
        .bind(files)
        .bind(bytes)
        .bind(now)
        .execute_in(&mut tx)
        .await
        .map_err(StoreError::query(OPERATION))?;
    if done != 1 {
        tx.rollback().await.map_err(StoreError::query(OPERATION))?;
        return Ok(false);
    }
    if let Some((uid, workdir)) = update.workdir {
        Query::new(sql::RECORD_WORKDIR)
            .bind(uid.as_str())
            .bind(workdir.as_str())
            .bind(now)
            .execute_in(&mut tx)
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(true)
}

pub(crate) async fn set_state<D: Dialect>(
    db: &D,
    id: &str,
    from: MigrationState,
    to: MigrationState,
) -> Result<bool, StoreError> {
    let done = Query::new(sql::SET_STATE)
        .bind(id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(crate::now_millis())
        .execute(db)
        .await
        .map_err(StoreError::query("set the state of a migration"))?;
    Ok(done == 1)
}
