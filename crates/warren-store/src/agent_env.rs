//! Each uid's agent environment (I14): variables every runtime of the uid starts with.
//!
//! A write that first counts runs in a transaction that keeps the uid's other writers out
//! ([`crate::sql::Tx::lock`]), so two setters can never both pass the size limit.

use warren_core::{AgentEnvVar, Uid};

use crate::rows::Columns;
use crate::sql::{Dialect, Query, Tx};
use crate::{AgentEnvRecord, StoreError};

const TABLE: &str = "agent_env";

fn lock_key(uid: &Uid) -> String {
    format!("agent_env:{uid}")
}

pub(crate) async fn list<D: Dialect>(db: &D, uid: &Uid) -> Result<Vec<AgentEnvRecord>, StoreError> {
    let rows = Query::new(
        "SELECT name, value, secret, updated_at FROM agent_env WHERE uid = $1 ORDER BY name",
    )
    .bind(uid.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("read an agent environment"))?;
    rows.iter()
        .map(|row| {
            let columns = Columns { row, table: TABLE };
            let name: String = columns.get("name")?;
            let var = AgentEnvVar::new(
                name,
                columns.get::<String>("value")?,
                columns.get("secret")?,
            )
            .map_err(|error| columns.corrupt("name", error))?;
            Ok(AgentEnvRecord {
                var,
                updated_at: columns.time("updated_at")?,
            })
        })
        .collect()
}

pub(crate) async fn replace<D: Dialect>(
    db: &D,
    uid: &Uid,
    vars: &[AgentEnvVar],
) -> Result<(), StoreError> {
    const OPERATION: &str = "replace an agent environment";
    let now = crate::now_millis();
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    tx.lock(&lock_key(uid))
        .await
        .map_err(StoreError::query(OPERATION))?;
    tx.execute(Query::new("DELETE FROM agent_env WHERE uid = $1").bind(uid.as_str()))
        .await
        .map_err(StoreError::query(OPERATION))?;
    for var in vars {
        tx.execute(
            Query::new(
                "INSERT INTO agent_env (uid, name, value, secret, updated_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(uid.as_str())
            .bind(&var.name)
            .bind(&var.value)
            .bind(var.secret)
            .bind(now),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))
}

pub(crate) async fn set<D: Dialect>(
    db: &D,
    uid: &Uid,
    var: &AgentEnvVar,
    max: usize,
) -> Result<bool, StoreError> {
    const OPERATION: &str = "set an agent environment variable";
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    tx.lock(&lock_key(uid))
        .await
        .map_err(StoreError::query(OPERATION))?;
    let row = tx
        .fetch_one(
            Query::new(
                "SELECT EXISTS (SELECT 1 FROM agent_env WHERE uid = $1 AND name = $2) AS found, \
                 (SELECT COUNT(*) FROM agent_env WHERE uid = $1) AS count",
            )
            .bind(uid.as_str())
            .bind(&var.name),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    let columns = Columns {
        row: &row,
        table: TABLE,
    };
    let exists: bool = columns.get("found")?;
    let count: i64 = columns.get("count")?;
    if !exists && usize::try_from(count).unwrap_or(usize::MAX) >= max {
        return Err(StoreError::AgentEnvFull {
            uid: uid.clone(),
            max,
        });
    }
    tx.execute(
        Query::new(
            "INSERT INTO agent_env (uid, name, value, secret, updated_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (uid, name) DO UPDATE SET \
             value = excluded.value, secret = excluded.secret, updated_at = excluded.updated_at",
        )
        .bind(uid.as_str())
        .bind(&var.name)
        .bind(&var.value)
        .bind(var.secret)
        .bind(crate::now_millis()),
    )
    .await
    .map_err(StoreError::query(OPERATION))?;
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(!exists)
}

pub(crate) async fn remove<D: Dialect>(db: &D, uid: &Uid, name: &str) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM agent_env WHERE uid = $1 AND name = $2")
        .bind(uid.as_str())
        .bind(name)
        .execute(db)
        .await
        .map_err(StoreError::query("remove an agent environment variable"))?;
    Ok(removed == 1)
}
