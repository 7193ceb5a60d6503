//! What only the SQLite store can be asked: file permissions and schema versions.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use warren_store::{ItemState, ItemUpdate, SqliteStore, StateStore, StoreError};

use super::fixtures::{claim, migration, migration_item, uid, workdir};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// Runs `sql` on the database file behind warren's back.
async fn execute_raw(path: &Path, sql: &str) {
    let mut connection = SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connection");
    sqlx::query(sql)
        .execute(&mut connection)
        .await
        .expect("raw statement");
    connection.close().await.expect("close raw connection");
}

async fn count_raw(path: &Path, sql: &str) -> i64 {
    let mut connection = SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connection");
    let count = sqlx::query_scalar(sql)
        .fetch_one(&mut connection)
        .await
        .expect("raw count");
    connection.close().await.expect("close raw connection");
    count
}

#[tokio::test]
async fn the_database_file_is_created_readable_by_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");

    let store = SqliteStore::open(&path).await.unwrap();
    store
        .record_workdir(&uid("alice"), &workdir("projects/a"))
        .await
        .unwrap();

    assert_eq!(mode(&path), 0o600);
    // SQLite creates its write-ahead log with the mode of the database file.
    let wal = dir.path().join("state.db-wal");
    if wal.exists() {
        assert_eq!(mode(&wal), 0o600);
    }
    store.close().await;
}

#[tokio::test]
async fn the_database_runs_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    SqliteStore::open(&path).await.unwrap().close().await;

    let mut connection = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn reopening_a_store_applies_each_migration_only_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    for _ in 0..3 {
        let store = SqliteStore::open(&path).await.unwrap();
        store
            .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
            .await
            .unwrap();
        store.close().await;
    }

    let migrations = count_raw(&path, "SELECT COUNT(*) FROM _sqlx_migrations").await;
    let known = count_raw(
        &path,
        "SELECT COUNT(*) FROM _sqlx_migrations WHERE success = 1",
    )
    .await;
    assert_eq!(migrations, known);
    assert_eq!(
        count_raw(&path, "SELECT MAX(version) FROM _sqlx_migrations").await,
        SqliteStore::schema_version()
    );
    assert_eq!(count_raw(&path, "SELECT COUNT(*) FROM sandboxes").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_stores_opening_a_fresh_file_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");

    let opens: Vec<_> = (0..8)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { SqliteStore::open(&path).await })
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }

    assert_eq!(
        count_raw(&path, "SELECT COUNT(*) FROM _sqlx_migrations").await,
        migration_files(),
        "each migration applied exactly once"
    );
}

/// How many migrations this binary ships.
fn migration_files() -> i64 {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    std::fs::read_dir(dir).unwrap().count() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reopened_file_store_keeps_its_data() {
    let backend = crate::suite::backends::SqliteFile::new();
    crate::suite::behaviour::a_reopened_store_keeps_its_data(&backend).await;
}

#[tokio::test]
async fn a_database_from_a_newer_warren_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap();
    store.close().await;
    let future = SqliteStore::schema_version() + 1000;
    execute_raw(
        &path,
        &format!(
            "INSERT INTO _sqlx_migrations \
             (version, description, success, checksum, execution_time) \
             VALUES ({future}, 'from the future', TRUE, x'00', 0)"
        ),
    )
    .await;

    let err = SqliteStore::open(&path).await.unwrap_err();

    assert!(
        matches!(err, StoreError::SchemaTooNew { found, known }
            if found == future && known == SqliteStore::schema_version()),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("schema version {future}")),
        "{message}"
    );
    assert!(message.contains("upgrade warren"), "{message}");
    // Refusing must not touch the database.
    assert_eq!(count_raw(&path, "SELECT COUNT(*) FROM sandboxes").await, 1);
}

#[tokio::test]
async fn a_store_in_a_missing_directory_cannot_be_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("state.db");

    let err = SqliteStore::open(&path).await.unwrap_err();

    assert!(matches!(err, StoreError::CreateFile(_)), "{err:?}");
    assert_eq!(err.to_string(), "could not create the state store file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_file_store_handles_racing_to_claim_create_exactly_one_sandbox() {
    let backend = crate::suite::backends::SqliteFile::new();
    crate::suite::behaviour::two_store_handles_racing_to_claim_create_exactly_one_sandbox(&backend)
        .await;
}

#[tokio::test]
async fn a_step_whose_workdir_cannot_be_recorded_leaves_its_item_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[migration_item("a", Some("alice"))],
        )
        .await
        .unwrap();
    // The workdir insert fails after the item's compare-and-set succeeded.
    execute_raw(
        &path,
        "CREATE TRIGGER refuse_workdirs BEFORE INSERT ON workdirs \
         BEGIN SELECT RAISE(ABORT, 'refused'); END",
    )
    .await;
    let alice = uid("alice");
    let a = workdir("projects/a");
    let step = || {
        store.advance_migration_item(
            "m-1",
            "a",
            ItemState::Planned,
            ItemState::Copied,
            ItemUpdate {
                manifest: Some("m"),
                files: Some(1),
                bytes: Some(2),
                workdir: Some((&alice, &a)),
            },
        )
    };

    step().await.expect_err("the workdir cannot be recorded");

    let items = store.migration_items("m-1").await.unwrap();
    assert_eq!(
        (items[0].state, items[0].manifest.as_deref(), items[0].files),
        (ItemState::Planned, None, 0),
        "the step was rolled back with its workdir"
    );
    execute_raw(&path, "DROP TRIGGER refuse_workdirs").await;
    assert!(step().await.unwrap());
    assert_eq!(store.list_workdirs(&alice).await.unwrap().len(), 1);
    store.close().await;
}

#[tokio::test]
async fn an_egress_secret_row_whose_rule_or_name_does_not_parse_is_reported_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let alice = uid("alice");
    execute_raw(
        &path,
        "INSERT INTO egress_secrets (uid, sandbox, name, rule, value, updated_at) \
         VALUES ('alice', '', 'TOKEN', '{\"targets\":[]', 'some-value', 0)",
    )
    .await;
    let err = store.egress_secrets(&alice, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                table: "egress_secrets",
                column: "rule",
                ..
            }
        ),
        "{err:?}"
    );
    execute_raw(
        &path,
        "UPDATE egress_secrets SET name = 'lower', \
         rule = '{\"targets\":[{\"host\":\"a.example\"}],\"present\":{\"type\":\"bearer\"}}'",
    )
    .await;
    let err = store.egress_secrets(&alice, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                table: "egress_secrets",
                column: "name",
                ..
            }
        ),
        "{err:?}"
    );
    execute_raw(&path, "UPDATE egress_secrets SET name = 'TOKEN'").await;
    assert_eq!(store.egress_secrets(&alice, None).await.unwrap().len(), 1);
    store.close().await;
}
