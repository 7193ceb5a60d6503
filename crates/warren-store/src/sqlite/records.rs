//! Transport records on SQLite.

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;

use crate::records::{check_record, prefix_end, sql};
use crate::{RecordWrite, StoreError, TransportRecord};

fn record_from_row(row: &SqliteRow) -> Result<TransportRecord, StoreError> {
    let read = || StoreError::query("read a transport record");
    Ok(TransportRecord {
        key: row.try_get("key").map_err(read())?,
        value: row.try_get("value").map_err(read())?,
        version: row.try_get("version").map_err(read())?,
    })
}

pub(super) async fn get(
    pool: &SqlitePool,
    namespace: &str,
    key: &str,
) -> Result<Option<TransportRecord>, StoreError> {
    let row = sqlx::query(sql::GET)
        .bind(namespace)
        .bind(key)
        .fetch_optional(pool)
        .await
        .map_err(StoreError::query("read a transport record"))?;
    row.as_ref().map(record_from_row).transpose()
}

pub(super) async fn put(
    pool: &SqlitePool,
    now: i64,
    namespace: &str,
    key: &str,
    value: &[u8],
    expected: RecordWrite,
) -> Result<i64, StoreError> {
    check_record(namespace, key, value)?;
    let (query, version) = match expected {
        RecordWrite::Create => (sqlx::query(sql::CREATE), 1),
        RecordWrite::Replace(version) => (sqlx::query(sql::REPLACE), version + 1),
    };
    let mut query = query.bind(namespace).bind(key).bind(value).bind(now);
    if let RecordWrite::Replace(read) = expected {
        query = query.bind(read);
    }
    let done = query
        .execute(pool)
        .await
        .map_err(StoreError::query("write a transport record"))?;
    if done.rows_affected() == 1 {
        Ok(version)
    } else {
        Err(StoreError::RecordConflict {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
        })
    }
}

pub(super) async fn delete(
    pool: &SqlitePool,
    namespace: &str,
    key: &str,
    expected: Option<i64>,
) -> Result<bool, StoreError> {
    let query = match expected {
        Some(version) => sqlx::query(sql::DELETE_AT)
            .bind(namespace)
            .bind(key)
            .bind(version),
        None => sqlx::query(sql::DELETE).bind(namespace).bind(key),
    };
    let done = query
        .execute(pool)
        .await
        .map_err(StoreError::query("delete a transport record"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn list(
    pool: &SqlitePool,
    namespace: &str,
    prefix: &str,
) -> Result<Vec<TransportRecord>, StoreError> {
    let rows = match prefix_end(prefix)? {
        Some(end) => {
            sqlx::query(sql::LIST)
                .bind(namespace)
                .bind(prefix)
                .bind(end)
                .fetch_all(pool)
                .await
        }
        None => {
            sqlx::query(sql::LIST_ALL)
                .bind(namespace)
                .fetch_all(pool)
                .await
        }
    }
    .map_err(StoreError::query("list transport records"))?;
    rows.iter().map(record_from_row).collect()
}
