//! Egress secrets and the egress audit (issue 38, I13, I22, I23): the credentials warren's
//! egress proxy presents for a uid (every sandbox of theirs) or for one sandbox, each
//! sandbox's certificate authority, and the connections its sandboxes made.
//!
//! A write that first counts runs in a transaction that keeps the other writers of the
//! same secrets out ([`crate::sql::Tx::lock`]), so two setters can never both pass the
//! limit. Events of one sandbox are appended under its lock too, so on PostgreSQL their
//! ids become visible in order and a reader's cursor never skips one committed late.

use warren_core::{EgressEvent, EgressSecret, SandboxId, SecretName, SecretRule, Uid};

use crate::rows::{json_column, Columns};
use crate::sql::{Dialect, Query, Tx};
use crate::{EgressRecord, EgressSecretRecord, StoreError};

const SECRETS: &str = "egress_secrets";
const AUTHORITIES: &str = "egress_authorities";
const EVENTS: &str = "egress_events";

/// The `sandbox` column of a secret: '' for the uid's own.
fn scope(sandbox: Option<&SandboxId>) -> &str {
    sandbox.map_or("", SandboxId::as_str)
}

fn secrets_lock(uid: &Uid, sandbox: Option<&SandboxId>) -> String {
    format!("egress_secrets:{uid}:{}", scope(sandbox))
}

fn authority_lock(sandbox: &SandboxId) -> String {
    format!("egress_authority:{sandbox}")
}

fn events_lock(sandbox: &SandboxId) -> String {
    format!("egress_events:{sandbox}")
}

/// A count or limit as a statement takes it.
fn count(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) async fn secrets<D: Dialect>(
    db: &D,
    uid: &Uid,
    sandbox: Option<&SandboxId>,
) -> Result<Vec<EgressSecretRecord>, StoreError> {
    let rows = Query::new(
        "SELECT name, rule, value, updated_at FROM egress_secrets \
         WHERE uid = $1 AND sandbox = $2 ORDER BY name",
    )
    .bind(uid.as_str())
    .bind(scope(sandbox))
    .fetch_all(db)
    .await
    .map_err(StoreError::query("read egress secrets"))?;
    rows.iter()
        .map(|row| {
            let columns = Columns {
                row,
                table: SECRETS,
            };
            let name = columns.parse("name", SecretName::new)?;
            let rule = columns.parse("rule", |json: String| {
                let rule = serde_json::from_str::<SecretRule>(&json).map_err(|e| e.to_string())?;
                rule.validate().map_err(|e| e.to_string())?;
                Ok::<_, String>(rule)
            })?;
            let secret = EgressSecret::new(name, rule, columns.get("value")?)
                .map_err(|error| columns.corrupt("value", error))?;
            Ok(EgressSecretRecord {
                uid: uid.clone(),
                sandbox: sandbox.cloned(),
                secret,
                updated_at: columns.time("updated_at")?,
            })
        })
        .collect()
}

pub(crate) async fn set_secret<D: Dialect>(
    db: &D,
    uid: &Uid,
    sandbox: Option<&SandboxId>,
    secret: &EgressSecret,
    max: usize,
) -> Result<bool, StoreError> {
    const OPERATION: &str = "set an egress secret";
    let rule = json_column(SECRETS, "rule", &secret.rule)?;
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    tx.lock(&secrets_lock(uid, sandbox))
        .await
        .map_err(StoreError::query(OPERATION))?;
    let row = tx
        .fetch_one(
            Query::new(
                "SELECT EXISTS (SELECT 1 FROM egress_secrets \
                 WHERE uid = $1 AND sandbox = $2 AND name = $3) AS found, \
                 (SELECT COUNT(*) FROM egress_secrets WHERE uid = $1 AND sandbox = $2) AS count",
            )
            .bind(uid.as_str())
            .bind(scope(sandbox))
            .bind(secret.name.as_str()),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    let columns = Columns {
        row: &row,
        table: SECRETS,
    };
    let exists: bool = columns.get("found")?;
    let stored: i64 = columns.get("count")?;
    if !exists && stored >= count(max) {
        tx.rollback().await.map_err(StoreError::query(OPERATION))?;
        return Err(StoreError::EgressSecretsFull { max });
    }
    tx.execute(
        Query::new(
            "INSERT INTO egress_secrets (uid, sandbox, name, rule, value, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (uid, sandbox, name) DO UPDATE SET \
             rule = excluded.rule, value = excluded.value, updated_at = excluded.updated_at",
        )
        .bind(uid.as_str())
        .bind(scope(sandbox))
        .bind(secret.name.as_str())
        .bind(rule)
        .bind(&secret.value)
        .bind(crate::now_millis()),
    )
    .await
    .map_err(StoreError::query(OPERATION))?;
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(!exists)
}

pub(crate) async fn remove_secret<D: Dialect>(
    db: &D,
    uid: &Uid,
    sandbox: Option<&SandboxId>,
    name: &SecretName,
) -> Result<bool, StoreError> {
    let removed =
        Query::new("DELETE FROM egress_secrets WHERE uid = $1 AND sandbox = $2 AND name = $3")
            .bind(uid.as_str())
            .bind(scope(sandbox))
            .bind(name.as_str())
            .execute(db)
            .await
            .map_err(StoreError::query("remove an egress secret"))?;
    Ok(removed == 1)
}

pub(crate) async fn remove_sandbox<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
) -> Result<(), StoreError> {
    const OPERATION: &str = "remove a sandbox's egress secrets";
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    tx.lock(&authority_lock(sandbox))
        .await
        .map_err(StoreError::query(OPERATION))?;
    for sql in [
        "DELETE FROM egress_secrets WHERE sandbox = $1",
        "DELETE FROM egress_authorities WHERE sandbox = $1",
    ] {
        tx.execute(Query::new(sql).bind(sandbox.as_str()))
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))
}

pub(crate) async fn authority<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    fresh: (String, String),
) -> Result<(String, String), StoreError> {
    const OPERATION: &str = "read a sandbox's egress authority";
    let (cert, key) = fresh;
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    // Kept out while the sandbox's egress is removed, so what was stored is still there.
    tx.lock(&authority_lock(sandbox))
        .await
        .map_err(StoreError::query(OPERATION))?;
    tx.execute(
        Query::new(
            "INSERT INTO egress_authorities (sandbox, cert, key, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (sandbox) DO NOTHING",
        )
        .bind(sandbox.as_str())
        .bind(cert)
        .bind(key)
        .bind(crate::now_millis()),
    )
    .await
    .map_err(StoreError::query(OPERATION))?;
    let row = tx
        .fetch_one(
            Query::new("SELECT cert, key FROM egress_authorities WHERE sandbox = $1")
                .bind(sandbox.as_str()),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    let columns = Columns {
        row: &row,
        table: AUTHORITIES,
    };
    let stored = (columns.get("cert")?, columns.get("key")?);
    tx.commit().await.map_err(StoreError::query(OPERATION))?;
    Ok(stored)
}

pub(crate) async fn record<D: Dialect>(
    db: &D,
    events: &[EgressEvent],
    keep: usize,
) -> Result<(), StoreError> {
    const OPERATION: &str = "record egress events";
    if events.is_empty() {
        return Ok(());
    }
    let rows = events
        .iter()
        .map(|event| Ok((event, json_column(EVENTS, "event", event)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let mut touched: Vec<&SandboxId> = events.iter().map(|event| &event.sandbox).collect();
    touched.sort();
    touched.dedup();
    let mut tx = Tx::begin(db).await.map_err(StoreError::query(OPERATION))?;
    // In one order, so two batches touching the same sandboxes never wait on each other.
    for sandbox in &touched {
        tx.lock(&events_lock(sandbox))
            .await
            .map_err(StoreError::query(OPERATION))?;
    }
    for (event, json) in rows {
        tx.execute(
            Query::new("INSERT INTO egress_events (sandbox, at, event) VALUES ($1, $2, $3)")
                .bind(event.sandbox.as_str())
                .bind(event.at)
                .bind(json),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    }
    for sandbox in touched {
        // Every event up to the newest one past the `keep` newest.
        tx.execute(
            Query::new(
                "DELETE FROM egress_events WHERE sandbox = $1 AND id <= \
                 (SELECT id FROM egress_events WHERE sandbox = $1 \
                 ORDER BY id DESC LIMIT 1 OFFSET $2)",
            )
            .bind(sandbox.as_str())
            .bind(count(keep)),
        )
        .await
        .map_err(StoreError::query(OPERATION))?;
    }
    tx.commit().await.map_err(StoreError::query(OPERATION))
}

pub(crate) async fn events<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    after: Option<i64>,
    limit: usize,
) -> Result<Vec<EgressRecord>, StoreError> {
    let rows = Query::new(
        "SELECT id, event FROM egress_events WHERE sandbox = $1 AND id > $2 \
         ORDER BY id LIMIT $3",
    )
    .bind(sandbox.as_str())
    .bind(after.unwrap_or(i64::MIN))
    .bind(count(limit))
    .fetch_all(db)
    .await
    .map_err(StoreError::query("read egress events"))?;
    rows.iter()
        .map(|row| {
            let columns = Columns { row, table: EVENTS };
            Ok(EgressRecord {
                id: columns.get("id")?,
                event: columns.parse("event", |json: String| {
                    serde_json::from_str::<EgressEvent>(&json)
                })?,
            })
        })
        .collect()
}
