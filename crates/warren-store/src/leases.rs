//! Leases on a sandbox generation (I25), judged by the store's expiry clock.

use std::time::Duration;

use warren_core::SandboxId;

use crate::guard::ttl_millis;
use crate::rows::Columns;
use crate::sql::{Dialect, Query};
use crate::{Lease, StoreError};

pub(crate) async fn create<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    generation: i64,
    holder: &str,
    ttl: Duration,
) -> Result<Lease, StoreError> {
    let id = format!("lease-{}", uuid::Uuid::new_v4().simple());
    let row = Query::new(
        "INSERT INTO leases (id, sandbox_id, generation, holder, created_at, expires_at) \
         SELECT $1, $2, $3, $4, now_ms, now_ms + $5 FROM (SELECT :now AS now_ms) AS clock \
         RETURNING created_at, expires_at",
    )
    .bind(id.as_str())
    .bind(sandbox.as_str())
    .bind(generation)
    .bind(holder)
    .bind(ttl_millis(ttl))
    .clock(db)
    .fetch_one(db)
    .await
    .map_err(StoreError::on_sandbox("create a lease", sandbox))?;
    let columns = Columns {
        row: &row,
        table: "leases",
    };
    Ok(Lease {
        sandbox_id: sandbox.clone(),
        generation,
        holder: holder.to_owned(),
        created_at: columns.time("created_at")?,
        expires_at: columns.time("expires_at")?,
        id,
    })
}

pub(crate) async fn renew<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    lease: &str,
    ttl: Duration,
) -> Result<Option<Lease>, StoreError> {
    let row = Query::new(
        "UPDATE leases SET expires_at = :now + $3 WHERE id = $1 AND sandbox_id = $2 \
         AND expires_at > :now RETURNING generation, holder, created_at, expires_at",
    )
    .bind(lease)
    .bind(sandbox.as_str())
    .bind(ttl_millis(ttl))
    .clock(db)
    .fetch_optional(db)
    .await
    .map_err(StoreError::query("renew a lease"))?;
    row.map(|row| {
        let columns = Columns {
            row: &row,
            table: "leases",
        };
        Ok(Lease {
            id: lease.to_owned(),
            sandbox_id: sandbox.clone(),
            generation: columns.get("generation")?,
            holder: columns.get("holder")?,
            created_at: columns.time("created_at")?,
            expires_at: columns.time("expires_at")?,
        })
    })
    .transpose()
}

pub(crate) async fn release<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    lease: &str,
) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM leases WHERE id = $1 AND sandbox_id = $2")
        .bind(lease)
        .bind(sandbox.as_str())
        .execute(db)
        .await
        .map_err(StoreError::query("release a lease"))?;
    Ok(removed > 0)
}

pub(crate) async fn live<D: Dialect>(
    db: &D,
    sandbox: &SandboxId,
    generation: i64,
) -> Result<u64, StoreError> {
    let row = Query::new(
        "SELECT COUNT(*) AS live FROM leases WHERE sandbox_id = $1 AND generation = $2 \
         AND expires_at > :now",
    )
    .bind(sandbox.as_str())
    .bind(generation)
    .clock(db)
    .fetch_one(db)
    .await
    .map_err(StoreError::query("count live leases"))?;
    let count: i64 = Columns {
        row: &row,
        table: "leases",
    }
    .get("live")?;
    Ok(u64::try_from(count).unwrap_or(0))
}
