//! Tests of cgroup v1: how its files' values are read.

use super::memory::v1_memory_limit;

#[test]
fn a_v1_memory_limit_of_the_page_counters_maximum_is_no_limit() {
    assert_eq!(v1_memory_limit(9_223_372_036_854_771_712), None);
    assert_eq!(v1_memory_limit(2 << 30), Some(2 << 30));
}
