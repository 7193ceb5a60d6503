//! A Redis store (I31), for small workspaces: every object is one Redis value under
//! `warren:snapshots:<owner>:<key>`, prefixed with its write time (8 bytes, little-endian
//! milliseconds) so the garbage collector can tell young objects. Durability is Redis's
//! own (AOF or RDB, as the server is configured).

use std::sync::Mutex;
use std::time::Duration;

use crate::store::check_key;
use crate::{ObjectStore, SnapshotError};

/// Objects of one owner in a Redis server.
pub struct RedisStore {
    connection: Mutex<redis::Connection>,
    prefix: String,
}

fn redis_error(operation: &'static str, error: redis::RedisError) -> SnapshotError {
    SnapshotError::store(operation, std::io::Error::other(error.to_string()))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/db`) for the objects of `owner`.
    pub fn open(url: &str, owner: &str) -> Result<Self, SnapshotError> {
        let connection = redis::Client::open(url)
            .and_then(|client| client.get_connection())
            .map_err(|e| redis_error("connect to Redis", e))?;
        Ok(Self {
            connection: Mutex::new(connection),
            prefix: format!("warren:snapshots:{owner}:"),
        })
    }

    fn name(&self, key: &str) -> Result<String, SnapshotError> {
        check_key(key)?;
        Ok(format!("{}{key}", self.prefix))
    }

    fn run<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        command: &redis::Cmd,
    ) -> Result<T, SnapshotError> {
        let mut connection = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        command
            .query(&mut *connection)
            .map_err(|e| redis_error(operation, e))
    }
}

impl ObjectStore for RedisStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<bool, SnapshotError> {
        let mut value = now_ms().to_le_bytes().to_vec();
        value.extend_from_slice(bytes);
        let written: Option<String> = self.run(
            "write an object",
            redis::cmd("SET").arg(self.name(key)?).arg(value).arg("NX"),
        )?;
        Ok(written.is_some())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        let value: Option<Vec<u8>> =
            self.run("read an object", redis::cmd("GET").arg(self.name(key)?))?;
        Ok(value.map(|value| value.get(8..).unwrap_or_default().to_vec()))
    }

    fn get_range(
        &self,
        key: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, SnapshotError> {
        if len == 0 {
            return Ok(self.contains(key)?.then(Vec::new));
        }
        // GETRANGE's end is inclusive, and the value starts with its 8-byte stamp.
        let start = offset.saturating_add(8);
        let end = start.saturating_add(len - 1);
        let bytes: Vec<u8> = self.run(
            "read an object",
            redis::cmd("GETRANGE")
                .arg(self.name(key)?)
                .arg(start)
                .arg(end),
        )?;
        // A missing key reads as empty too: only then is it worth asking.
        if bytes.is_empty() && !self.contains(key)? {
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    fn contains(&self, key: &str) -> Result<bool, SnapshotError> {
        self.run(
            "look up an object",
            redis::cmd("EXISTS").arg(self.name(key)?),
        )
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, SnapshotError> {
        // Owners and keys are plain ([A-Za-z0-9._/-]), so no glob character needs escaping.
        let pattern = format!("{}{prefix}*", self.prefix);
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = self.run(
                "list the store",
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000),
            )?;
            keys.extend(
                batch
                    .into_iter()
                    .filter_map(|name| name.strip_prefix(&self.prefix).map(str::to_owned)),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<(), SnapshotError> {
        let _: u64 = self.run("delete an object", redis::cmd("DEL").arg(self.name(key)?))?;
        Ok(())
    }

    fn age(&self, key: &str) -> Result<Option<Duration>, SnapshotError> {
        let head: Vec<u8> = self.run(
            "read an object's age",
            redis::cmd("GETRANGE").arg(self.name(key)?).arg(0).arg(7),
        )?;
        let Ok(stamp) = <[u8; 8]>::try_from(head.as_slice()) else {
            return Ok(None);
        };
        let written = u64::from_le_bytes(stamp);
        Ok(Some(Duration::from_millis(
            now_ms().saturating_sub(written),
        )))
    }

    fn sync(&self) -> Result<(), SnapshotError> {
        Ok(())
    }
}
