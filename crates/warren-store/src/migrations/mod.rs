//! The migration journal (I36): what a storage migrator (`warren migrate deerflow`) records
//! before and after every step of importing another system's files, so a rerun after a
//! crash (`kill -9` included) resumes from the journal instead of starting over.
//!
//! A migration is planned once ([`begin_migration`]): its plan and every item it moves are
//! written in one transaction, under the digest of the plan. Beginning it again with the
//! same digest resumes it unchanged; with another digest it is refused
//! ([`StoreError::MigrationConflict`]): the source changed since it was planned. Each item
//! then moves through [`ItemState`] by compare-and-set ([`advance_migration_item`]), so of
//! two migrators racing on one item only one takes each step; the step that switches an
//! item into place records its workdir in the same transaction. Both stores share the SQL:
//! only the placeholder syntax differs.
//!
//! [`begin_migration`]: crate::StateStore::begin_migration
//! [`advance_migration_item`]: crate::StateStore::advance_migration_item

mod journal;

pub(crate) use journal::{advance_item, begin, get, items, list, set_state};

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use warren_core::{Uid, Workdir};

use crate::{ParseEnumError, StoreError};

/// Where a migration as a whole is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationState {
    /// Planned, and its items on their way; a rerun resumes it.
    Planned,
    /// Every item is in place and recorded; the migration is done.
    Committed,
    /// Done, and the source's files were removed.
    Cleaned,
}

impl MigrationState {
    /// Every state, in life order.
    pub const ALL: [Self; 3] = [Self::Planned, Self::Committed, Self::Cleaned];

    /// The snake_case name, as stored and serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planned => "planned",
            Self::Committed => "committed",
            Self::Cleaned => "cleaned",
        }
    }
}

impl fmt::Display for MigrationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MigrationState {
    type Err = ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseEnumError::new("migration state", s))
    }
}

/// Where one item of a migration is. The order is the order of the steps.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Recorded in the plan; nothing was copied yet.
    Planned,
    /// Copied into staging; its manifest is recorded.
    Copied,
    /// The staged copy's hashes were checked against the source.
    Verified,
    /// Renamed into place, its workdir recorded in the same transaction.
    Switched,
    /// Read back from its place and committed.
    Committed,
    /// Its source was removed.
    Cleaned,
}

impl ItemState {
    /// Every state, in step order.
    pub const ALL: [Self; 6] = [
        Self::Planned,
        Self::Copied,
        Self::Verified,
        Self::Switched,
        Self::Committed,
        Self::Cleaned,
    ];

    /// The snake_case name, as stored and serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planned => "planned",
            Self::Copied => "copied",
            Self::Verified => "verified",
            Self::Switched => "switched",
            Self::Committed => "committed",
            Self::Cleaned => "cleaned",
        }
    }
}

impl fmt::Display for ItemState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ItemState {
    type Err = ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseEnumError::new("migration item state", s))
    }
}

/// A migration as planned, before it is begun.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NewMigration {
    /// The migration's id, chosen by the migrator (the same on every rerun).
    pub id: String,
    /// What is migrated, e.g. `deerflow`.
    pub kind: String,
    /// Where from (the source's root, as the migrator names it).
    pub source: String,
    /// The digest of the plan: a rerun whose plan has another digest is refused.
    pub plan_digest: String,
    /// The plan itself, JSON text, kept as written.
    pub plan: String,
}

/// One item of a migration as planned: one tree moved from the source to its target.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NewMigrationItem {
    /// The item's key, unique within its migration; items are listed by it.
    pub key: String,
    /// What the item is, e.g. `workdir`, `uploads`.
    pub kind: String,
    /// Where from, within the source.
    pub source: String,
    /// The uid the item is moved to, if it belongs to one.
    pub uid: Option<Uid>,
    /// Where to, as the migrator names it.
    pub target: String,
}

/// A migration as the journal records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigrationRecord {
    /// The migration's id.
    pub id: String,
    /// What is migrated.
    pub kind: String,
    /// Where from.
    pub source: String,
    /// The digest of its plan.
    pub plan_digest: String,
    /// The plan, JSON text.
    pub plan: String,
    /// Where it is.
    pub state: MigrationState,
    /// When it was begun.
    pub created_at: DateTime<Utc>,
    /// When its state last changed.
    pub updated_at: DateTime<Utc>,
}

/// One item of a migration as the journal records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigrationItem {
    /// The migration it belongs to.
    pub migration_id: String,
    /// The item's key.
    pub key: String,
    /// What the item is.
    pub kind: String,
    /// Where from.
    pub source: String,
    /// The uid it is moved to, if any.
    pub uid: Option<Uid>,
    /// Where to.
    pub target: String,
    /// The last step it took.
    pub state: ItemState,
    /// The SHA-256 (lowercase hex) of its tree manifest, recorded from
    /// [`ItemState::Copied`] on.
    pub manifest: Option<String>,
    /// Regular files in the tree (0 until a step records it).
    pub files: u64,
    /// Bytes in the tree (0 until a step records it).
    pub bytes: u64,
    /// When it last took a step.
    pub updated_at: DateTime<Utc>,
}

/// What an item step writes besides its state. A field left `None` keeps what the item
/// holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemUpdate<'a> {
    /// The item's manifest digest.
    pub manifest: Option<&'a str>,
    /// Regular files in the tree.
    pub files: Option<u64>,
    /// Bytes in the tree.
    pub bytes: Option<u64>,
    /// A workdir recorded in the same transaction (the workdirs table, as
    /// [`StateStore::record_workdir`](crate::StateStore::record_workdir) does; idempotent):
    /// the step that switches an item into place and the record of the workdir it makes
    /// are one write, so a crash leaves neither or both.
    pub workdir: Option<(&'a Uid, &'a Workdir)>,
}

/// Checks a migration and its items before either store writes them.
pub(crate) fn check_migration(
    migration: &NewMigration,
    items: &[NewMigrationItem],
) -> Result<(), StoreError> {
    let invalid = |reason: String| StoreError::MigrationInvalid {
        id: migration.id.clone(),
        reason,
    };
    if migration.id.is_empty() {
        return Err(invalid("a migration needs an id".to_owned()));
    }
    if migration.plan_digest.is_empty() {
        return Err(invalid("a migration needs a plan digest".to_owned()));
    }
    if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(&migration.plan) {
        return Err(invalid(format!("its plan is not JSON: {error}")));
    }
    let mut keys = std::collections::HashSet::with_capacity(items.len());
    for item in items {
        if item.key.is_empty() {
            return Err(invalid("every item needs a key".to_owned()));
        }
        if !keys.insert(item.key.as_str()) {
            return Err(invalid(format!("item key {:?} is planned twice", item.key)));
        }
    }
    Ok(())
}

/// The answer to beginning a migration that is already recorded: resumed when its plan is
/// the same, refused when the source changed since it was planned.
pub(crate) fn resume_or_conflict(
    existing: MigrationRecord,
    migration: &NewMigration,
) -> Result<MigrationRecord, StoreError> {
    if existing.plan_digest == migration.plan_digest {
        Ok(existing)
    } else {
        Err(StoreError::MigrationConflict {
            id: existing.id,
            planned: existing.plan_digest,
            requested: migration.plan_digest.clone(),
        })
    }
}

/// A count as stored (a signed 64-bit integer).
pub(crate) fn count_column(column: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Corrupt {
        table: "migration_items",
        column,
        detail: format!("{value} is out of range"),
    })
}

/// The SQL of both stores, with `?N` placeholders; PostgreSQL's text swaps them for `$N`.
pub(crate) mod sql {
    /// The columns of a migration row.
    macro_rules! migration_columns {
        () => {
            "id, kind, source, plan_digest, plan, state, created_at, updated_at"
        };
    }

    /// The columns of an item row.
    macro_rules! item_columns {
        () => {
            "migration_id, key, kind, source, uid, target, state, manifest, files, bytes, \
             updated_at"
        };
    }

    /// Reads one migration.
    pub(crate) const GET: &str = concat!(
        "SELECT ",
        migration_columns!(),
        " FROM migrations WHERE id = $1"
    );
    /// Every migration, oldest first.
    pub(crate) const LIST: &str = concat!(
        "SELECT ",
        migration_columns!(),
        " FROM migrations ORDER BY created_at, id"
    );
    /// Records a new migration, planned, unless one with its id exists.
    pub(crate) const CREATE: &str = concat!(
        "INSERT INTO migrations (id, kind, source, plan_digest, plan, state, created_at, \
         updated_at) VALUES ($1, $2, $3, $4, $5, 'planned', $6, $6) \
         ON CONFLICT (id) DO NOTHING RETURNING ",
        migration_columns!()
    );
    /// Records one planned item.
    pub(crate) const CREATE_ITEM: &str = "INSERT INTO migration_items \
         (migration_id, key, kind, source, uid, target, state, manifest, files, bytes, \
         updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'planned', NULL, 0, 0, $7)";
    /// The items of a migration, by key.
    pub(crate) const ITEMS: &str = concat!(
        "SELECT ",
        item_columns!(),
        " FROM migration_items WHERE migration_id = $1 ORDER BY key"
    );
    /// Moves an item from one state to another, writing what the step gives (a NULL keeps
    /// the value held).
    pub(crate) const ADVANCE_ITEM: &str = "UPDATE migration_items \
         SET state = $4, manifest = COALESCE($5, manifest), files = COALESCE($6, files), \
         bytes = COALESCE($7, bytes), updated_at = $8 \
         WHERE migration_id = $1 AND key = $2 AND state = $3";
    /// Records a workdir, as `record_workdir` does.
    pub(crate) const RECORD_WORKDIR: &str = "INSERT INTO workdirs (uid, workdir, created_at) \
         VALUES ($1, $2, $3) ON CONFLICT (uid, workdir) DO NOTHING";
    /// Moves a migration from one state to another.
    pub(crate) const SET_STATE: &str = "UPDATE migrations SET state = $3, updated_at = $4 \
         WHERE id = $1 AND state = $2";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(id: &str, plan: &str) -> NewMigration {
        NewMigration {
            id: id.to_owned(),
            kind: "deerflow".to_owned(),
            source: "/srv/deerflow".to_owned(),
            plan_digest: "d1".to_owned(),
            plan: plan.to_owned(),
        }
    }

    fn item(key: &str) -> NewMigrationItem {
        NewMigrationItem {
            key: key.to_owned(),
            kind: "workdir".to_owned(),
            source: key.to_owned(),
            uid: None,
            target: key.to_owned(),
        }
    }

    #[test]
    fn states_are_named_as_stored_and_parsed_back() {
        for state in MigrationState::ALL {
            assert_eq!(state.as_str().parse::<MigrationState>(), Ok(state));
        }
        for state in ItemState::ALL {
            assert_eq!(state.as_str().parse::<ItemState>(), Ok(state));
        }
        assert!("paused".parse::<ItemState>().is_err());
        assert!("copied".parse::<MigrationState>().is_err());
    }

    #[test]
    fn item_states_are_ordered_as_the_steps_are_taken() {
        let mut sorted = ItemState::ALL;
        sorted.sort();
        assert_eq!(sorted, ItemState::ALL);
        assert!(ItemState::Copied < ItemState::Switched);
    }

    #[test]
    fn a_plan_that_is_not_json_or_names_an_item_twice_is_refused() {
        assert!(check_migration(&planned("m", "{}"), &[item("a"), item("b")]).is_ok());
        let err = check_migration(&planned("m", "not json"), &[]).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
        let err = check_migration(&planned("m", "{}"), &[item("a"), item("a")]).unwrap_err();
        assert!(err.to_string().contains("planned twice"), "{err}");
        assert!(check_migration(&planned("", "{}"), &[]).is_err());
    }
}
