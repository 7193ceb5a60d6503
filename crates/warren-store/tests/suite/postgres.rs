//! What only the PostgreSQL store can be asked: its migrations under concurrent openers,
//! a schema from the future, and a server that goes away and comes back.

use std::time::Duration;

use warren_store::{ItemState, ItemUpdate, PostgresOptions, PostgresStore, StateStore, StoreError};
use warren_test_support::PostgresServer;

use super::backends::{postgres_server, Postgres};
use super::fixtures::{claim, migration, migration_item, run, runs_of, uid, workdir};

async fn connect(url: &str) -> PostgresStore {
    PostgresStore::connect(url, &PostgresOptions::default())
        .await
        .expect("connect to the PostgreSQL store")
}

/// One number out of `psql`.
fn scalar(server: &PostgresServer, url: &str, sql: &str) -> i64 {
    server
        .psql_in(url, sql)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_stores_migrating_a_fresh_database_at_once_apply_each_migration_once() {
    let backend = Postgres::new();
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let url = backend.url().to_owned();
            tokio::spawn(
                async move { PostgresStore::connect(&url, &PostgresOptions::default()).await },
            )
        })
        .collect();
    for open in opens {
        open.await.unwrap().expect("every opener succeeds");
    }
    let applied = scalar(
        postgres_server(),
        backend.url(),
        "SELECT COUNT(*) FROM _sqlx_migrations WHERE success",
    );
    let shipped = std::fs::read_dir(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres"),
    )
    .unwrap()
    .count() as i64;
    assert_eq!(applied, shipped);
    assert_eq!(
        scalar(
            postgres_server(),
            backend.url(),
            "SELECT MAX(version) FROM _sqlx_migrations"
        ),
        PostgresStore::schema_version()
    );
}

#[tokio::test]
async fn a_database_from_a_newer_warren_is_refused_and_left_untouched() {
    let backend = Postgres::new();
    let store = connect(backend.url()).await;
    store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap();
    store.close().await;
    let future = PostgresStore::schema_version() + 1000;
    postgres_server().psql_in(
        backend.url(),
        &format!(
            "INSERT INTO _sqlx_migrations \
             (version, description, success, checksum, execution_time) \
             VALUES ({future}, 'from the future', TRUE, '\\x00', 0)"
        ),
    );

    let err = PostgresStore::connect(backend.url(), &PostgresOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, .. } if found == future),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade warren"), "{err}");
    assert_eq!(
        scalar(
            postgres_server(),
            backend.url(),
            "SELECT COUNT(*) FROM sandboxes"
        ),
        1
    );
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_is_reported_unavailable() {
    // A port nothing listens on: connecting fails at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = PostgresStore::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/none"),
        &PostgresOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

/// A server of its own, since this test stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_fails_requests_as_unavailable_and_then_serves_again() {
    let mut server = PostgresServer::start();
    let url = server.fresh_database();
    let store = connect(&url).await;
    let new = claim("alice", "thread-1", "projects/a");
    store.claim_sandbox(&new).await.unwrap();
    store.start_run(&run("run-1", &new.id, 1)).await.unwrap();

    server.stop();
    let err = store
        .start_run(&run("run-2", &new.id, 1))
        .await
        .expect_err("no database, no run");
    assert!(err.is_unavailable(), "{err:?}");
    let err = store.get_sandbox(&new.id).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    server.resume();
    // The pool reconnects by itself: no new store, no restart of warren.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let record = loop {
        match store.get_sandbox(&new.id).await {
            Ok(record) => break record,
            Err(err) if err.is_unavailable() && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("the store did not recover: {err:?}"),
        }
    };
    assert!(record.is_some());
    // The refused run was not half-written; the accepted one is there.
    let runs = runs_of(&store, &new.id, 10).await;
    assert_eq!(
        runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["run-1"]
    );
    store.start_run(&run("run-2", &new.id, 1)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reconnected_store_keeps_its_data() {
    crate::suite::behaviour::a_reopened_store_keeps_its_data(&Postgres::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_store_handles_racing_to_claim_create_exactly_one_sandbox() {
    crate::suite::behaviour::two_store_handles_racing_to_claim_create_exactly_one_sandbox(
        &Postgres::new(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_fencing_token_makes_acquisitions_in_other_processes_wait_until_it_is_dropped() {
    let backend = Postgres::new();
    let holder = connect(backend.url()).await;
    let acquirer = connect(backend.url()).await;
    let sandbox = holder
        .claim_sandbox(&claim("alice", "held-fence", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let ttl = Duration::from_millis(200);
    let first = match holder.acquire_guard(&sandbox.id, "one", ttl).await.unwrap() {
        warren_store::GuardAcquire::Acquired(guard) => guard,
        held => panic!("{held:?}"),
    };
    let (check, hold) = holder.hold_fence(&sandbox.id, first.token).await.unwrap();
    assert_eq!(check, warren_store::FenceCheck::Current);
    let hold = hold.expect("PostgreSQL holds the token's row");
    // The guard lapses; another store (another replica) acquires, and must wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = sandbox.id.clone();
    let acquiring = tokio::spawn(async move {
        acquirer
            .acquire_guard(&id, "two", Duration::from_secs(30))
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !acquiring.is_finished(),
        "no newer token while the hold is kept"
    );
    drop(hold);
    let second = tokio::time::timeout(Duration::from_secs(10), acquiring)
        .await
        .expect("the acquisition goes on once the hold is dropped")
        .unwrap()
        .unwrap();
    assert!(
        matches!(&second, warren_store::GuardAcquire::Acquired(g) if g.token == first.token + 1),
        "{second:?}"
    );
    // A stale token holds nothing.
    let (check, hold) = holder.hold_fence(&sandbox.id, first.token).await.unwrap();
    assert!(
        matches!(check, warren_store::FenceCheck::Stale { .. }),
        "{check:?}"
    );
    assert!(hold.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_whose_workdir_cannot_be_recorded_leaves_its_item_where_it_was() {
    let backend = Postgres::new();
    let store = connect(backend.url()).await;
    store
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[migration_item("a", Some("alice"))],
        )
        .await
        .unwrap();
    // The workdir insert fails after the item's compare-and-set succeeded.
    postgres_server().psql_in(
        backend.url(),
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
         CREATE TRIGGER refuse_workdirs BEFORE INSERT ON workdirs \
         FOR EACH ROW EXECUTE FUNCTION refuse();",
    );
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
    postgres_server().psql_in(backend.url(), "DROP TRIGGER refuse_workdirs ON workdirs");
    assert!(step().await.unwrap());
    assert_eq!(store.list_workdirs(&alice).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_beginning_one_migration_at_once_write_its_plan_once() {
    let backend = Postgres::new();
    let stores = [connect(backend.url()).await, connect(backend.url()).await];
    let items: Vec<_> = (0..200)
        .map(|n| migration_item(&format!("item-{n:03}"), Some("alice")))
        .collect();
    let begins: Vec<_> = stores
        .iter()
        .cycle()
        .take(8)
        .cloned()
        .map(|store| {
            let items = items.clone();
            tokio::spawn(async move {
                store
                    .begin_migration(&migration("m-1", "digest-1"), &items)
                    .await
            })
        })
        .collect();
    let mut records = Vec::new();
    for begin in begins {
        records.push(begin.await.unwrap().expect("every begin succeeds"));
    }
    assert!(records.windows(2).all(|pair| pair[0] == pair[1]));
    assert_eq!(stores[0].migration_items("m-1").await.unwrap().len(), 200);
}
