//! `warren migrate status`: the journal's migrations and their items per state.

use warren_store::{ItemState, StateStore};

use crate::MigrateError;

/// Every migration in the journal, for `warren migrate status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusEntry {
    /// Its id.
    pub id: String,
    /// Its kind (`deerflow`).
    pub kind: String,
    /// The source it imports.
    pub source: String,
    /// `planned` (unfinished: rerun it), `committed` or `cleaned`.
    pub state: String,
    /// When planned.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// Items per state.
    pub items: std::collections::BTreeMap<String, u64>,
}

/// The journal's migrations, oldest first.
pub async fn status(store: &dyn StateStore) -> Result<Vec<StatusEntry>, MigrateError> {
    let mut entries = Vec::new();
    for record in store.list_migrations().await? {
        let mut items: std::collections::BTreeMap<String, u64> = [
            ItemState::Planned,
            ItemState::Copied,
            ItemState::Verified,
            ItemState::Switched,
            ItemState::Committed,
            ItemState::Cleaned,
        ]
        .into_iter()
        .map(|state| (state.as_str().to_owned(), 0))
        .collect();
        for item in store.migration_items(&record.id).await? {
            *items.entry(item.state.as_str().to_owned()).or_default() += 1;
        }
        entries.push(StatusEntry {
            id: record.id,
            kind: record.kind,
            source: record.source,
            state: record.state.as_str().to_owned(),
            created_at: record.created_at,
            updated_at: record.updated_at,
            items,
        });
    }
    Ok(entries)
}
