//! Snapshot objects kept in the database itself (the store-backed object store).

use chrono::{DateTime, Utc};

use crate::rows::{millis_to_time, Columns};
use crate::sql::{Dialect, Query};
use crate::StoreError;

const TABLE: &str = "snapshot_objects";

pub(crate) async fn put<D: Dialect>(
    db: &D,
    owner: &str,
    key: &str,
    bytes: &[u8],
) -> Result<bool, StoreError> {
    let added = Query::new(
        "INSERT INTO snapshot_objects (owner, key, bytes, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (owner, key) DO NOTHING",
    )
    .bind(owner)
    .bind(key)
    .bind(bytes)
    .bind(crate::now_millis())
    .execute(db)
    .await
    .map_err(StoreError::query("write a snapshot object"))?;
    Ok(added == 1)
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    owner: &str,
    key: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let row = Query::new("SELECT bytes FROM snapshot_objects WHERE owner = $1 AND key = $2")
        .bind(owner)
        .bind(key)
        .fetch_optional(db)
        .await
        .map_err(StoreError::query("read a snapshot object"))?;
    row.map(|row| {
        Columns {
            row: &row,
            table: TABLE,
        }
        .get("bytes")
    })
    .transpose()
}

pub(crate) async fn created_at<D: Dialect>(
    db: &D,
    owner: &str,
    key: &str,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let row = Query::new("SELECT created_at FROM snapshot_objects WHERE owner = $1 AND key = $2")
        .bind(owner)
        .bind(key)
        .fetch_optional(db)
        .await
        .map_err(StoreError::query("read a snapshot object's age"))?;
    row.map(|row| {
        Columns {
            row: &row,
            table: TABLE,
        }
        .get::<i64>("created_at")
        .map(millis_to_time)
    })
    .transpose()
}

pub(crate) async fn list<D: Dialect>(
    db: &D,
    owner: &str,
    prefix: &str,
) -> Result<Vec<String>, StoreError> {
    // A range on the primary key (bytewise on both engines) instead of LIKE: keys never
    // need escaping.
    let mut upper = prefix.to_owned();
    upper.push(char::MAX);
    let rows = Query::new(
        "SELECT key FROM snapshot_objects WHERE owner = $1 AND key >= $2 AND key < $3 \
         ORDER BY key",
    )
    .bind(owner)
    .bind(prefix)
    .bind(upper)
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list snapshot objects"))?;
    rows.iter()
        .map(|row| Columns { row, table: TABLE }.get("key"))
        .collect()
}

pub(crate) async fn delete<D: Dialect>(db: &D, owner: &str, key: &str) -> Result<(), StoreError> {
    Query::new("DELETE FROM snapshot_objects WHERE owner = $1 AND key = $2")
        .bind(owner)
        .bind(key)
        .execute(db)
        .await
        .map_err(StoreError::query("delete a snapshot object"))?;
    Ok(())
}
