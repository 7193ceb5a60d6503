//! Unit tests of envd's side of a watch.

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
