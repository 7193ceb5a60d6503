//! Workdirs recorded per uid: which of a user's workspaces exist.

use warren_core::{Uid, Workdir};

use crate::rows::workdir_from_row;
use crate::sql::{Dialect, Query};
use crate::{StoreError, WorkdirRecord};

pub(crate) async fn record<D: Dialect>(
    db: &D,
    uid: &Uid,
    workdir: &Workdir,
) -> Result<bool, StoreError> {
    let added = Query::new(
        "INSERT INTO workdirs (uid, workdir, created_at) VALUES ($1, $2, $3) \
         ON CONFLICT (uid, workdir) DO NOTHING",
    )
    .bind(uid.as_str())
    .bind(workdir.as_str())
    .bind(crate::now_millis())
    .execute(db)
    .await
    .map_err(StoreError::query("record a workdir"))?;
    Ok(added == 1)
}

pub(crate) async fn list<D: Dialect>(db: &D, uid: &Uid) -> Result<Vec<WorkdirRecord>, StoreError> {
    let rows = Query::new(
        "SELECT uid, workdir, created_at FROM workdirs WHERE uid = $1 \
         ORDER BY created_at, workdir",
    )
    .bind(uid.as_str())
    .fetch_all(db)
    .await
    .map_err(StoreError::query("list workdirs"))?;
    rows.iter().map(workdir_from_row).collect()
}

pub(crate) async fn get<D: Dialect>(
    db: &D,
    uid: &Uid,
    workdir: &Workdir,
) -> Result<Option<WorkdirRecord>, StoreError> {
    let row =
        Query::new("SELECT uid, workdir, created_at FROM workdirs WHERE uid = $1 AND workdir = $2")
            .bind(uid.as_str())
            .bind(workdir.as_str())
            .fetch_optional(db)
            .await
            .map_err(StoreError::query("read a workdir"))?;
    row.as_ref().map(workdir_from_row).transpose()
}

pub(crate) async fn forget<D: Dialect>(
    db: &D,
    uid: &Uid,
    workdir: &Workdir,
) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM workdirs WHERE uid = $1 AND workdir = $2")
        .bind(uid.as_str())
        .bind(workdir.as_str())
        .execute(db)
        .await
        .map_err(StoreError::query("forget a workdir"))?;
    Ok(removed == 1)
}
