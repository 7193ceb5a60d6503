//! Unit tests of the watch: the event mapping, temporary names, merging and bounds.

use super::*;

#[test]
fn the_keepalive_interval_is_the_clients_within_bounds() {
    let mut headers = axum::http::HeaderMap::new();
    assert_eq!(keepalive_interval(&headers), DEFAULT_KEEPALIVE);
    headers.insert(KEEPALIVE_HEADER, "50".parse().unwrap());
    assert_eq!(keepalive_interval(&headers), Duration::from_secs(50));
    headers.insert(KEEPALIVE_HEADER, "0".parse().unwrap());
    assert_eq!(keepalive_interval(&headers), Duration::from_secs(1));
    headers.insert(KEEPALIVE_HEADER, "99999".parse().unwrap());
    assert_eq!(keepalive_interval(&headers), Duration::from_secs(300));
}

#[test]
fn a_sandbox_holds_a_bounded_number_of_watches_and_gets_them_back() {
    static LOCAL: LazyLock<Watchers> = LazyLock::new(Watchers::new);
    let slots: Vec<Slot> = (0..MAX_WATCHES_PER_SANDBOX)
        .map(|_| LOCAL.acquire("sandbox-a").unwrap())
        .collect();
    let refused = LOCAL.acquire("sandbox-a").err().unwrap();
    assert_eq!(refused.code, Code::ResourceExhausted);
    // Another sandbox's slots are its own.
    assert!(LOCAL.acquire("sandbox-b").is_ok());
    drop(slots);
    assert!(LOCAL.acquire("sandbox-a").is_ok());
    assert!(LOCAL.registry().active.is_empty());
}

#[test]
fn inotify_events_map_to_envds_events() {
    use EventType::*;
    let table: &[(EventMask, &[EventType])] = &[
        (EventMask::CREATE, &[Create]),
        (EventMask::CREATE | EventMask::ISDIR, &[Create]),
        (EventMask::MOVED_TO, &[Create]),
        (EventMask::MODIFY, &[Write]),
        (EventMask::CLOSE_WRITE, &[Write]),
        (EventMask::DELETE, &[Remove]),
        (EventMask::DELETE | EventMask::ISDIR, &[Remove]),
        (EventMask::MOVED_FROM, &[Rename]),
        (EventMask::ATTRIB, &[Chmod]),
        // The watched directory's own events end the watch; they are no entry's.
        (EventMask::DELETE_SELF, &[]),
        (EventMask::MOVE_SELF, &[]),
        (EventMask::IGNORED, &[]),
        (EventMask::ACCESS, &[]),
        // fsnotify's order when one mask says several things.
        (
            EventMask::CREATE | EventMask::MODIFY | EventMask::ATTRIB,
            &[Create, Chmod, Write],
        ),
    ];
    for (mask, want) in table {
        assert_eq!(event_types(*mask), *want, "{mask:?}");
    }
}

#[test]
fn warrens_temporary_files_are_told_apart_and_bursts_merge() {
    assert!(is_temp(OsStr::new(".warren-tmp-12-3-456")));
    assert!(!is_temp(OsStr::new("warren-tmp-12")));
    assert!(!is_temp(OsStr::new("notes.txt")));
    let change = |name: &str, kind| Change {
        name: name.to_owned(),
        kind,
        entry: None,
    };
    let mut out = Vec::new();
    push_change(&mut out, change("a", EventType::Create));
    push_change(&mut out, change("a", EventType::Write));
    push_change(&mut out, change("a", EventType::Write));
    push_change(&mut out, change("b", EventType::Write));
    push_change(&mut out, change("a", EventType::Write));
    let got: Vec<(&str, EventType)> = out.iter().map(|c| (c.name.as_str(), c.kind)).collect();
    assert_eq!(
        got,
        [
            ("a", EventType::Create),
            ("a", EventType::Write),
            ("b", EventType::Write),
            ("a", EventType::Write)
        ]
    );
}

#[test]
fn subtrees_are_told_by_whole_components() {
    assert!(within(b"a", b"a"));
    assert!(within(b"a/b", b"a"));
    assert!(!within(b"ab", b"a"));
    assert!(!within(b"a-b/c", b"a"));
    assert_eq!(
        join_os(OsStr::new(""), OsStr::new("x")),
        OsString::from("x")
    );
    assert_eq!(
        join_os(OsStr::new("a/b"), OsStr::new("x")),
        OsString::from("a/b/x")
    );
}
