//! Transport records: what a transport speaking another system's API keeps beside warren's
//! own rows (the E2B API's sandboxes and keys), as opaque bytes per namespace and key.
//!
//! Every write names the version it read ([`RecordWrite`]), so of two requests or replicas
//! changing one record only one wins; the other gets [`StoreError::RecordConflict`] and
//! reads again.

use crate::rows::Columns;
use crate::sql::{Dialect, Query, Record};
use crate::StoreError;

/// One transport record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportRecord {
    /// The record's key within its namespace.
    pub key: String,
    /// Its bytes, as the transport wrote them.
    pub value: Vec<u8>,
    /// Its version: 1 when created, one more at every write.
    pub version: i64,
}

/// What a write expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordWrite {
    /// No record under the key: the write creates it.
    Create,
    /// The record at this version: the write replaces it.
    Replace(i64),
}

/// The longest key a record may have, in bytes.
pub const MAX_RECORD_KEY: usize = 512;

/// The largest record value, in bytes: records describe, they do not carry payloads.
pub const MAX_RECORD_VALUE: usize = 256 * 1024;

/// Checks a record's key and value before either store writes it.
pub(crate) fn check_record(
    namespace: &str,
    key: &str,
    value: &[u8],
) -> Result<(), crate::StoreError> {
    if namespace.is_empty() || key.is_empty() || key.len() > MAX_RECORD_KEY {
        return Err(crate::StoreError::RecordInvalid {
            reason: "a record needs a namespace and a key of at most 512 bytes",
        });
    }
    if value.len() > MAX_RECORD_VALUE {
        return Err(crate::StoreError::RecordInvalid {
            reason: "a record's value is at most 256 KiB",
        });
    }
    Ok(())
}

/// The statements.
pub(crate) mod sql {
    /// Reads one record.
    pub(crate) const GET: &str =
        "SELECT key, value, version FROM transport_records WHERE namespace = $1 AND key = $2";
    /// Creates a record unless one exists.
    pub(crate) const CREATE: &str = "INSERT INTO transport_records \
         (namespace, key, value, version, updated_at) VALUES ($1, $2, $3, 1, $4) \
         ON CONFLICT (namespace, key) DO NOTHING";
    /// Replaces a record at the version read.
    pub(crate) const REPLACE: &str = "UPDATE transport_records \
         SET value = $3, version = version + 1, updated_at = $4 \
         WHERE namespace = $1 AND key = $2 AND version = $5";
    /// Deletes a record at the version read.
    pub(crate) const DELETE_AT: &str =
        "DELETE FROM transport_records WHERE namespace = $1 AND key = $2 AND version = $3";
    /// Deletes a record whatever its version.
    pub(crate) const DELETE: &str =
        "DELETE FROM transport_records WHERE namespace = $1 AND key = $2";
    /// Lists the records whose key starts with a prefix (a range, so no LIKE escaping).
    pub(crate) const LIST: &str = "SELECT key, value, version FROM transport_records \
         WHERE namespace = $1 AND key >= $2 AND key < $3 ORDER BY key";
    /// Lists every record of a namespace.
    pub(crate) const LIST_ALL: &str = "SELECT key, value, version FROM transport_records \
         WHERE namespace = $1 ORDER BY key";
}

/// The first key after every key starting with `prefix`, for range scans: the prefix with
/// its last character raised. `None` for an empty prefix (the whole namespace); prefixes are
/// ASCII (checked), so raising the last byte keeps the text valid.
pub(crate) fn prefix_end(prefix: &str) -> Result<Option<String>, crate::StoreError> {
    if !prefix.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(crate::StoreError::RecordInvalid {
            reason: "a record prefix is printable ASCII",
        });
    }
    let mut bytes = prefix.as_bytes().to_vec();
    match bytes.pop() {
        None => Ok(None),
        Some(last) => {
            bytes.push(last + 1);
            Ok(String::from_utf8(bytes).ok())
        }
    }
}

fn record_from_row(row: &impl Record) -> Result<TransportRecord, StoreError> {
    let columns = Columns {
        row,
        table: "transport_records",
    };
    Ok(TransportRecord {
        key: columns.get("key")?,
        value: columns.get("value")?,
        version: columns.get("version")?,
    })
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    namespace: &str,
    key: &str,
) -> Result<Option<TransportRecord>, StoreError> {
    let row = Query::new(sql::GET)
        .bind(namespace)
        .bind(key)
        .fetch_optional(db)
        .await
        .map_err(StoreError::query("read a transport record"))?;
    row.as_ref().map(record_from_row).transpose()
}

pub(crate) async fn put<D: Dialect>(
    db: &D,
    namespace: &str,
    key: &str,
    value: &[u8],
    expected: RecordWrite,
) -> Result<i64, StoreError> {
    check_record(namespace, key, value)?;
    let (text, version) = match expected {
        RecordWrite::Create => (sql::CREATE, 1),
        RecordWrite::Replace(version) => (sql::REPLACE, version + 1),
    };
    let mut query = Query::new(text)
        .bind(namespace)
        .bind(key)
        .bind(value)
        .bind(crate::now_millis());
    if let RecordWrite::Replace(read) = expected {
        query = query.bind(read);
    }
    let done = query
        .execute(db)
        .await
        .map_err(StoreError::query("write a transport record"))?;
    if done == 1 {
        Ok(version)
    } else {
        Err(StoreError::RecordConflict {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
        })
    }
}

pub(crate) async fn delete<D: Dialect>(
    db: &D,
    namespace: &str,
    key: &str,
    expected: Option<i64>,
) -> Result<bool, StoreError> {
    let query = match expected {
        Some(version) => Query::new(sql::DELETE_AT)
            .bind(namespace)
            .bind(key)
            .bind(version),
        None => Query::new(sql::DELETE).bind(namespace).bind(key),
    };
    let done = query
        .execute(db)
        .await
        .map_err(StoreError::query("delete a transport record"))?;
    Ok(done == 1)
}

pub(crate) async fn list<D: Dialect>(
    db: &D,
    namespace: &str,
    prefix: &str,
) -> Result<Vec<TransportRecord>, StoreError> {
    let query = match prefix_end(prefix)? {
        Some(end) => Query::new(sql::LIST).bind(namespace).bind(prefix).bind(end),
        None => Query::new(sql::LIST_ALL).bind(namespace),
    };
    let rows = query
        .fetch_all(db)
        .await
        .map_err(StoreError::query("list transport records"))?;
    rows.iter().map(record_from_row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_at_the_next_key_after_the_prefix() {
        assert_eq!(
            prefix_end("sandboxes/").unwrap().as_deref(),
            Some("sandboxes0")
        );
        assert_eq!(prefix_end("a").unwrap().as_deref(), Some("b"));
        assert_eq!(prefix_end("").unwrap(), None);
        assert!(prefix_end("é").is_err());
    }
}
