//! Skill grants: which shared skills a uid's runtimes see.

use warren_core::Uid;

use crate::rows::Columns;
use crate::sql::{Dialect, Query};
use crate::StoreError;

pub(crate) async fn grant<D: Dialect>(db: &D, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
    let added = Query::new(
        "INSERT INTO skill_grants (uid, slug, granted_at) VALUES ($1, $2, $3) \
         ON CONFLICT (uid, slug) DO NOTHING",
    )
    .bind(uid.as_str())
    .bind(slug)
    .bind(crate::now_millis())
    .execute(db)
    .await
    .map_err(StoreError::query("grant a skill"))?;
    Ok(added == 1)
}

pub(crate) async fn revoke<D: Dialect>(db: &D, uid: &Uid, slug: &str) -> Result<bool, StoreError> {
    let removed = Query::new("DELETE FROM skill_grants WHERE uid = $1 AND slug = $2")
        .bind(uid.as_str())
        .bind(slug)
        .execute(db)
        .await
        .map_err(StoreError::query("revoke a skill"))?;
    Ok(removed == 1)
}

pub(crate) async fn granted<D: Dialect>(db: &D, uid: &Uid) -> Result<Vec<String>, StoreError> {
    let rows = Query::new("SELECT slug FROM skill_grants WHERE uid = $1 ORDER BY slug")
        .bind(uid.as_str())
        .fetch_all(db)
        .await
        .map_err(StoreError::query("list granted skills"))?;
    rows.iter()
        .map(|row| {
            Columns {
                row,
                table: "skill_grants",
            }
            .get("slug")
        })
        .collect()
}
