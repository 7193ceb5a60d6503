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
