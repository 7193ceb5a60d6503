//! Branches of a workdir (I27): which branches of which workdir a uid has.

use warren_core::{BranchName, Uid, Workdir};

use crate::rows::Columns;
use crate::sql::{Dialect, Query, Record};
use crate::{BranchRecord, StoreError};

const COLUMNS: &str = "uid, workdir, name, id, checkpoint, created_at, merged_at";

fn branch_from_row(row: &impl Record) -> Result<BranchRecord, StoreError> {
    let columns = Columns {
        row,
        table: "branches",
    };
    Ok(BranchRecord {
        uid: columns.parse("uid", Uid::new)?,
        workdir: columns.parse("workdir", Workdir::new)?,
        name: columns.parse("name", BranchName::new)?,
        id: columns.get("id")?,
        checkpoint: columns.get("checkpoint")?,
        created_at: columns.time("created_at")?,
        merged_at: columns.optional_time("merged_at")?,
    })
}

/// Records a branch; `false` when the workdir already has one of that name.
pub(crate) async fn record<D: Dialect>(db: &D, branch: &BranchRecord) -> Result<bool, StoreError> {
    let added = Query::new(format!(
        "INSERT INTO branches ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (uid, workdir, name) DO NOTHING"
    ))
    .bind(branch.uid.as_str())
    .bind(branch.workdir.as_str())
    .bind(branch.name.as_str())
    .bind(&branch.id)
    .bind(&branch.checkpoint)
    .bind(branch.created_at.timestamp_millis())
    .bind(branch.merged_at.map(|at| at.timestamp_millis()))
    .execute(db)
    .await
    .map_err(StoreError::query("record a branch"))?;
    Ok(added == 1)
}

/// The uid's branches, of one workdir or of all, oldest first.
pub(crate) async fn list<D: Dialect>(
    db: &D,
    uid: &Uid,
    workdir: Option<&Workdir>,
) -> Result<Vec<BranchRecord>, StoreError> {
    let query = match workdir {
        Some(workdir) => Query::new(format!(
            "SELECT {COLUMNS} FROM branches WHERE uid = $1 AND workdir = $2 \
             ORDER BY created_at, name"
        ))
        .bind(uid.as_str())
        .bind(workdir.as_str()),
        None => Query::new(format!(
            "SELECT {COLUMNS} FROM branches WHERE uid = $1 ORDER BY created_at, name"
        ))
        .bind(uid.as_str()),
    };
    let rows = query
        .fetch_all(db)
        .await
        .map_err(StoreError::query("list branches"))?;
    rows.iter().map(branch_from_row).collect()
}

/// Forgets a branch; `false` when it was not recorded.
pub(crate) async fn forget<D: Dialect>(
    db: &D,
    uid: &Uid,
    workdir: &Workdir,
    name: &BranchName,
) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM branches WHERE uid = $1 AND workdir = $2 AND name = $3")
        .bind(uid.as_str())
        .bind(workdir.as_str())
        .bind(name.as_str())
        .execute(db)
        .await
        .map_err(StoreError::query("forget a branch"))?;
    Ok(removed == 1)
}

/// Marks branches merged into their workdir; how many were not yet.
pub(crate) async fn mark_merged<D: Dialect>(
    db: &D,
    uid: &Uid,
    workdir: &Workdir,
    name: &BranchName,
) -> Result<bool, StoreError> {
    let marked = Query::new(
        "UPDATE branches SET merged_at = $4 WHERE uid = $1 AND workdir = $2 AND name = $3 \
         AND merged_at IS NULL",
    )
    .bind(uid.as_str())
    .bind(workdir.as_str())
    .bind(name.as_str())
    .bind(crate::now_millis())
    .execute(db)
    .await
    .map_err(StoreError::query("mark a branch merged"))?;
    Ok(marked == 1)
}
