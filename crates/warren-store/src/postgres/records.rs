//! Transport records on PostgreSQL.

use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;

use crate::records::{check_record, prefix_end, sql};
use crate::{RecordWrite, StoreError, TransportRecord};

fn record_from_row(row: &PgRow) -> Result<TransportRecord, StoreError> {
    let read = || StoreError::query("read a transport record");
    Ok(TransportRecord {
        key: row.try_get("key").map_err(read())?,
        value: row.try_get("value").map_err(read())?,
        version: row.try_get("version").map_err(read())?,
    })
}

pub(super) async fn get(
    pool: &PgPool,
    namespace: &str,
    key: &str,
) -> Result<Option<TransportRecord>, StoreError> {
    let text = sql::postgres(sql::GET);
    let row = sqlx::query(&text)
        .bind(namespace)
        .bind(key)
        .fetch_optional(pool)
        .await
        .map_err(StoreError::query("read a transport record"))?;
    row.as_ref().map(record_from_row).transpose()
}

pub(super) async fn put(
    pool: &PgPool,
    now: i64,
    namespace: &str,
    key: &str,
    value: &[u8],
    expected: RecordWrite,
) -> Result<i64, StoreError> {
    check_record(namespace, key, value)?;
    let (text, version) = match expected {
        RecordWrite::Create => (sql::postgres(sql::CREATE), 1),
        RecordWrite::Replace(version) => (sql::postgres(sql::REPLACE), version + 1),
    };
    let query = sqlx::query(&text);
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
    pool: &PgPool,
    namespace: &str,
    key: &str,
    expected: Option<i64>,
) -> Result<bool, StoreError> {
    let text = sql::postgres(match expected {
        Some(_) => sql::DELETE_AT,
        None => sql::DELETE,
    });
    let query = match expected {
        Some(version) => sqlx::query(&text).bind(namespace).bind(key).bind(version),
        None => sqlx::query(&text).bind(namespace).bind(key),
    };
    let done = query
        .execute(pool)
        .await
        .map_err(StoreError::query("delete a transport record"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn list(
    pool: &PgPool,
    namespace: &str,
    prefix: &str,
) -> Result<Vec<TransportRecord>, StoreError> {
    let end = prefix_end(prefix)?;
    let text = sql::postgres(if end.is_some() {
        sql::LIST
    } else {
        sql::LIST_ALL
    });
    let rows = match end {
        Some(end) => {
            sqlx::query(&text)
                .bind(namespace)
                .bind(prefix)
                .bind(end)
                .fetch_all(pool)
                .await
        }
        None => sqlx::query(&text).bind(namespace).fetch_all(pool).await,
    }
    .map_err(StoreError::query("list transport records"))?;
    rows.iter().map(record_from_row).collect()
}
