//! What every object store must do (I31), checked against each kind: the local directory
//! store and S3 through a real S3 server (s3s-fs). A new store joins by adding one
//! `stores!` line.

use std::time::Duration;

use warren_fs::WorkspaceRoot;
use warren_snapshot::{
    collect_garbage, restore, snapshot, LocalStore, ObjectStore, RedisStore, S3Config, S3Store,
    SnapshotError, SqlStore,
};
use warren_test_support::S3Server;

/// A store of one kind and what keeps it alive; `open(prefix)` gives a store per owner.
trait Kind {
    fn open(&self, owner: &str) -> Box<dyn ObjectStore>;
}

struct Local(tempfile::TempDir);

impl Kind for Local {
    fn open(&self, owner: &str) -> Box<dyn ObjectStore> {
        Box::new(LocalStore::open(self.0.path().join(owner)).unwrap())
    }
}

struct S3 {
    server: S3Server,
    runtime: tokio::runtime::Runtime,
}

impl Kind for S3 {
    fn open(&self, owner: &str) -> Box<dyn ObjectStore> {
        let config = S3Config {
            endpoint: self.server.endpoint.clone(),
            bucket: self.server.bucket.clone(),
            region: "us-east-1".into(),
            access_key_id: self.server.access_key.clone(),
            secret_access_key: self.server.secret_key.clone(),
        };
        Box::new(
            S3Store::open(
                &config,
                &format!("snapshots/{owner}"),
                self.runtime.handle().clone(),
            )
            .unwrap(),
        )
    }
}

struct Sql {
    state: std::sync::Arc<dyn warren_store::StateStore>,
    runtime: tokio::runtime::Runtime,
}

impl Kind for Sql {
    fn open(&self, owner: &str) -> Box<dyn ObjectStore> {
        Box::new(SqlStore::new(
            self.state.clone(),
            owner,
            self.runtime.handle().clone(),
        ))
    }
}

fn sql() -> Sql {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = runtime
        .block_on(warren_store::SqliteStore::open_in_memory())
        .unwrap();
    Sql {
        state: std::sync::Arc::new(state),
        runtime,
    }
}

struct Redis(warren_test_support::RedisServer);

impl Kind for Redis {
    fn open(&self, owner: &str) -> Box<dyn ObjectStore> {
        Box::new(RedisStore::open(&self.0.url, owner).unwrap())
    }
}

fn redis() -> Redis {
    Redis(warren_test_support::RedisServer::start())
}

fn local() -> Local {
    Local(tempfile::tempdir().unwrap())
}

fn s3() -> S3 {
    S3 {
        server: S3Server::start(),
        runtime: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    }
}

const HASH: &str = "aaaa0000bbbb1111cccc2222dddd3333eeee4444ffff5555aaaa0000bbbb1111";

fn objects_are_written_once_read_back_listed_and_deleted(kind: &dyn Kind) {
    let store = kind.open("alice");
    let key = format!("chunks/{HASH}");
    assert!(!store.contains(&key).unwrap());
    assert_eq!(store.get(&key).unwrap(), None);
    assert_eq!(store.age(&key).unwrap(), None);
    assert!(store.put(&key, b"bytes").unwrap());
    assert!(
        !store.put(&key, b"bytes").unwrap(),
        "a second put of one name writes nothing"
    );
    assert_eq!(store.get(&key).unwrap().as_deref(), Some(&b"bytes"[..]));
    // Range reads: a part, a part cut at the end, nothing of a missing object.
    assert_eq!(
        store.get_range(&key, 1, 3).unwrap().as_deref(),
        Some(&b"yte"[..])
    );
    assert_eq!(
        store.get_range(&key, 3, 100).unwrap().as_deref(),
        Some(&b"es"[..])
    );
    assert_eq!(
        store.get_range(&format!("packs/{HASH}"), 0, 4).unwrap(),
        None
    );
    assert!(store.contains(&key).unwrap());
    assert!(store.age(&key).unwrap().unwrap() < Duration::from_secs(60));
    store.put("manifests/0123abcd", b"m").unwrap();
    assert_eq!(store.list("chunks/").unwrap(), std::slice::from_ref(&key));
    assert_eq!(store.list("manifests/").unwrap(), ["manifests/0123abcd"]);
    store.delete(&key).unwrap();
    store.delete(&key).unwrap();
    assert!(!store.contains(&key).unwrap());
    store.sync().unwrap();
}

fn keys_the_engine_never_makes_are_refused(kind: &dyn Kind) {
    let store = kind.open("alice");
    for key in [
        "../x",
        "chunks/../x",
        "chunks/a/b",
        "chunks/",
        "/chunks/a",
        "chunks/a b",
    ] {
        assert!(
            matches!(store.put(key, b"x"), Err(SnapshotError::InvalidKey(_))),
            "{key:?} was accepted"
        );
    }
}

fn two_owners_never_see_each_others_objects(kind: &dyn Kind) {
    let alice = kind.open("alice");
    let bob = kind.open("bob");
    let key = format!("chunks/{HASH}");
    alice.put(&key, b"alice's").unwrap();
    assert!(!bob.contains(&key).unwrap());
    assert!(bob.list("chunks/").unwrap().is_empty());
    assert!(
        bob.put(&key, b"bob's").unwrap(),
        "bob's store writes its own copy"
    );
    assert_eq!(alice.get(&key).unwrap().as_deref(), Some(&b"alice's"[..]));
}

fn a_tree_snapshots_restores_and_collects_through_the_store(kind: &dyn Kind) {
    let store = kind.open("alice");
    let dir = tempfile::tempdir().unwrap();
    let wd = dir.path().join("projects/a");
    std::fs::create_dir_all(wd.join("sub")).unwrap();
    std::fs::write(
        wd.join("sub/big.bin"),
        (0..1_500_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(wd.join("small.txt"), "small").unwrap();
    std::os::unix::fs::symlink("small.txt", wd.join("link")).unwrap();
    let root = WorkspaceRoot::open(dir.path()).unwrap();
    let (first, stats) = snapshot(&root, "projects/a", store.as_ref(), None).unwrap();
    assert!(stats.chunks_new >= 2, "{stats:?}");
    std::fs::write(wd.join("small.txt"), "changed").unwrap();
    let (second, again) = snapshot(&root, "projects/a", store.as_ref(), Some(&first)).unwrap();
    assert_eq!(again.files_unchanged, 1, "{again:?}");
    std::fs::remove_dir_all(wd.join("sub")).unwrap();
    restore(&root, "projects/a", store.as_ref(), &first).unwrap();
    assert_eq!(
        std::fs::read_to_string(wd.join("small.txt")).unwrap(),
        "small"
    );
    assert_eq!(
        std::fs::metadata(wd.join("sub/big.bin")).unwrap().len(),
        1_500_000
    );
    let swept = collect_garbage(
        store.as_ref(),
        std::slice::from_ref(&second),
        Duration::ZERO,
    )
    .unwrap();
    // The first snapshot's pack is mostly big.bin, still needed: it stays, and the one
    // dead chunk in it ("small") with it.
    assert_eq!(
        (
            swept.manifests_removed,
            swept.packs_removed,
            swept.packs_kept
        ),
        (1, 0, 2),
        "{swept:?}"
    );
    assert_eq!(store.list("indexes/").unwrap().len(), 1, "{swept:?}");
    restore(&root, "projects/a", store.as_ref(), &second).unwrap();
    assert_eq!(
        std::fs::read_to_string(wd.join("small.txt")).unwrap(),
        "changed"
    );
}

macro_rules! stores {
    ($($module:ident => $kind:expr),+ $(,)?) => {
        $(
            mod $module {
                stores!(@checks $kind;
                    objects_are_written_once_read_back_listed_and_deleted,
                    keys_the_engine_never_makes_are_refused,
                    two_owners_never_see_each_others_objects,
                    a_tree_snapshots_restores_and_collects_through_the_store,
                );
            }
        )+
    };
    (@checks $kind:expr; $($check:ident),+ $(,)?) => {
        $(
            #[test]
            fn $check() {
                let kind = $kind;
                super::$check(&kind);
            }
        )+
    };
}

stores!(
    local_directory => super::local(),
    s3_compatible => super::s3(),
    sql_state_store => super::sql(),
    redis => super::redis(),
);
