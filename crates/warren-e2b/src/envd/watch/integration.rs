use warren_fs::WorkspaceRoot;

use crate::envd::fixture::Fixture;

use super::*;

/// A sandbox of its own per test: watch slots are counted per sandbox, server-wide. Its
/// home holds `watched/`.
async fn fixture(sandbox_id: &str) -> Fixture {
    let fixture = crate::envd::fixture::fixture(sandbox_id).await;
    fixture.files.mkdir_p("watched").unwrap();
    fixture
}

async fn watcher(fixture: &Fixture, path: &str, recursive: bool) -> String {
    create_watcher(
        fixture.ctx.clone(),
        CreateWatcherRequest {
            path: path.to_owned(),
            recursive,
            include_entry: true,
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .watcher_id
}

async fn poll(fixture: &Fixture, id: &str) -> Vec<FilesystemEvent> {
    get_watcher_events(
        fixture.ctx.clone(),
        GetWatcherEventsRequest {
            watcher_id: id.to_owned(),
        },
    )
    .await
    .unwrap()
    .events
}

/// Polls until `done` holds of everything seen (at most 5 s); all that was seen.
async fn poll_until(
    fixture: &Fixture,
    id: &str,
    done: impl Fn(&[(String, EventType)]) -> bool,
) -> Vec<(String, EventType)> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for event in poll(fixture, id).await {
            let kind = EventType::try_from(event.r#type).unwrap();
            seen.push((event.name, kind));
        }
        if done(&seen) || Instant::now() >= deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn has(seen: &[(String, EventType)], name: &str, kind: EventType) -> bool {
    seen.iter().any(|(n, k)| n == name && *k == kind)
}

fn touch(files: &WorkspaceRoot, rel: &str, bytes: &[u8]) {
    use std::io::Write;
    files
        .create_file(rel, 0o644)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

#[tokio::test]
async fn a_file_made_and_removed_at_once_is_created_and_removed() {
    let f = fixture("watchbrief0000000001").await;
    let id = watcher(&f, "/home/user/watched", false).await;
    assert!(f
        .ctx
        .shared
        .provisioner
        .watcher_changes(&f.ctx.sandbox.warren_id, &id)
        .await
        .is_ok());
    // Made and gone long before any poll: only a watch that is told sees it.
    touch(&f.files, "watched/brief.txt", b"brief");
    f.files.remove("watched/brief.txt", false).unwrap();
    let seen = poll_until(&f, &id, |seen| has(seen, "brief.txt", EventType::Remove)).await;
    // In the kernel's order; the file layer's create also sets the mode (CHMOD).
    assert_eq!(
        seen.first(),
        Some(&("brief.txt".to_owned(), EventType::Create))
    );
    assert!(has(&seen, "brief.txt", EventType::Write), "{seen:?}");
    assert_eq!(
        seen.last(),
        Some(&("brief.txt".to_owned(), EventType::Remove))
    );

    // warren's own atomic write is what the client did, its temporary file unseen; the
    // entry is the runtime's.
    f.ctx
        .shared
        .provisioner
        .write(
            &f.ctx.sandbox.warren_id,
            "/home/user/watched/new.txt",
            b"x".to_vec(),
            Default::default(),
            false,
        )
        .await
        .unwrap();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !events
        .iter()
        .any(|e: &FilesystemEvent| e.r#type == EventType::Write as i32)
        && Instant::now() < deadline
    {
        events.extend(poll(&f, &id).await);
    }
    let names: Vec<(&str, i32)> = events.iter().map(|e| (e.name.as_str(), e.r#type)).collect();
    assert_eq!(
        names,
        [
            ("new.txt", EventType::Create as i32),
            ("new.txt", EventType::Chmod as i32),
            ("new.txt", EventType::Write as i32)
        ]
    );
    let entry = events[0].entry.as_ref().expect("the entry is included");
    assert_eq!(entry.path, "/home/user/watched/new.txt");
    assert_eq!(entry.size, 1);

    // A rename is RENAME of the old name then CREATE of the new; a chmod is CHMOD.
    f.files
        .rename("watched/new.txt", "watched/moved.txt", false)
        .unwrap();
    f.files
        .set_attributes("watched/moved.txt", Some(0o600), 0)
        .unwrap();
    let seen = poll_until(&f, &id, |seen| has(seen, "moved.txt", EventType::Chmod)).await;
    assert_eq!(
        seen[..2],
        [
            ("new.txt".to_owned(), EventType::Rename),
            ("moved.txt".to_owned(), EventType::Create)
        ]
    );

    // Removing the watched directory ends the watch, after its events.
    f.files.remove("watched", true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let ended = loop {
        let answer = get_watcher_events(
            f.ctx.clone(),
            GetWatcherEventsRequest {
                watcher_id: id.clone(),
            },
        )
        .await;
        match answer {
            Err(error) => break error,
            Ok(_) if Instant::now() < deadline => {}
            Ok(_) => panic!("the watch did not end with its directory"),
        }
    };
    assert_eq!(ended.code, Code::NotFound, "{}", ended.message);
    assert!(remove_watcher(
        f.ctx.clone(),
        RemoveWatcherRequest {
            watcher_id: id.clone()
        }
    )
    .await
    .is_ok());
    assert!(matches!(
        f.ctx
            .shared
            .provisioner
            .watcher_changes(&f.ctx.sandbox.warren_id, &id)
            .await,
        Err(warren_provisioner::ProvisionerError::WatcherNotFound { .. })
    ));
}

#[tokio::test]
async fn a_recursive_watch_sees_new_subdirectories_but_never_through_a_link() {
    let f = fixture("watchdeep00000000001").await;
    f.files.mkdir_p("outside").unwrap();
    f.files.mkdir_p("watched/old").unwrap();
    // A link planted before the watch, to a directory outside the watched tree.
    f.files
        .create_symlink("watched/early", "../outside")
        .unwrap();
    let id = watcher(&f, "watched", true).await;
    // One made after the watch started.
    f.files
        .create_symlink("watched/late", "../outside")
        .unwrap();
    touch(&f.files, "watched/old/a.txt", b"a");
    // A subdirectory made after the watch started, and at once a file in it (before its
    // own watch may exist), then another later.
    f.files.mkdir_p("watched/new/deeper").unwrap();
    touch(&f.files, "watched/new/deeper/first.txt", b"1");
    let seen = poll_until(&f, &id, |seen| {
        has(seen, "new/deeper/first.txt", EventType::Create)
    })
    .await;
    assert!(has(&seen, "late", EventType::Create), "{seen:?}");
    assert!(has(&seen, "old/a.txt", EventType::Create), "{seen:?}");
    assert!(has(&seen, "new", EventType::Create), "{seen:?}");
    assert!(has(&seen, "new/deeper", EventType::Create), "{seen:?}");
    touch(&f.files, "watched/new/deeper/second.txt", b"2");
    // Changes behind either link are not the watched tree's.
    touch(&f.files, "outside/secret.txt", b"s");
    f.files.mkdir_p("outside/sub").unwrap();
    touch(&f.files, "watched/marker.txt", b"m");
    let seen = poll_until(&f, &id, |seen| has(seen, "marker.txt", EventType::Create)).await;
    assert!(
        has(&seen, "new/deeper/second.txt", EventType::Create),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(name, _)| name.contains("secret") || name.contains("sub")),
        "{seen:?}"
    );
    // A subdirectory removed and made again is watched afresh.
    f.files.remove("watched/new", true).unwrap();
    f.files.mkdir_p("watched/new").unwrap();
    touch(&f.files, "watched/new/again.txt", b"3");
    let seen = poll_until(&f, &id, |seen| {
        has(seen, "new/again.txt", EventType::Create)
    })
    .await;
    assert!(has(&seen, "new/deeper", EventType::Remove), "{seen:?}");
    assert!(has(&seen, "new", EventType::Remove), "{seen:?}");
    assert!(has(&seen, "new/again.txt", EventType::Create), "{seen:?}");
    remove_watcher(f.ctx.clone(), RemoveWatcherRequest { watcher_id: id })
        .await
        .unwrap();
}

#[tokio::test]
async fn watching_a_link_or_outside_the_sandbox_is_refused() {
    let f = fixture("watchrefused00000001").await;
    f.files.mkdir_p("outside").unwrap();
    f.files.create_symlink("linked", "outside").unwrap();
    for path in [
        "/home/user/linked",
        "linked/",
        "../",
        "/etc",
        "/home/user/missing",
    ] {
        let refused = create_watcher(
            f.ctx.clone(),
            CreateWatcherRequest {
                path: path.to_owned(),
                ..Default::default()
            },
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{path} was watched"));
        assert!(
            !refused.message.contains(f.data_dir.to_str().unwrap()),
            "{path}: {}",
            refused.message
        );
    }
    // The refusals gave their slots back: every one of them can be taken.
    let mut kept = Vec::new();
    for _ in 0..warren_provisioner::MAX_WATCHES_PER_SANDBOX {
        kept.push(watcher(&f, "/home/user", false).await);
    }
}
