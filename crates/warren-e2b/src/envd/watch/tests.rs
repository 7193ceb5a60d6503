//! Unit tests of envd's side of a watch.

use super::*;

#[test]
fn the_keepalive_interval_is_the_clients_within_bounds() {
    use crate::envd::connect::keepalive_of;
    let interval =
        |headers: &axum::http::HeaderMap| keepalive_of(headers, DEFAULT_KEEPALIVE, MAX_KEEPALIVE);
    let mut headers = axum::http::HeaderMap::new();
    assert_eq!(interval(&headers), DEFAULT_KEEPALIVE);
    headers.insert("keepalive-ping-interval", "50".parse().unwrap());
    assert_eq!(interval(&headers), Duration::from_secs(50));
    headers.insert("keepalive-ping-interval", "0".parse().unwrap());
    assert_eq!(interval(&headers), Duration::from_secs(1));
    headers.insert("keepalive-ping-interval", "99999".parse().unwrap());
    assert_eq!(interval(&headers), Duration::from_secs(300));
    headers.insert("keepalive-ping-interval", "soon".parse().unwrap());
    assert_eq!(interval(&headers), DEFAULT_KEEPALIVE);
}
