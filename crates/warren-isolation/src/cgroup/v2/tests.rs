//! Tests of cgroup v2: its cpu.max format and the controllers a directory carries.

use super::cpu::cpu_max_millis;
use super::*;

#[test]
fn cpu_limits_are_read_as_thousandths_of_a_cpu() {
    assert_eq!(cpu_max_millis("100000 100000\n"), Some(1000));
    assert_eq!(cpu_max_millis("50000 100000"), Some(500));
    assert_eq!(cpu_max_millis("250000 100000\n"), Some(2500));
    assert_eq!(cpu_max_millis("max 100000\n"), None);
    assert_eq!(cpu_max_millis(""), None);
    assert_eq!(cpu_max_millis("100000 0"), None);
    // v1: `cpu.cfs_quota_us` is -1 without a limit.
    assert_eq!(cpu_millis(-1, 100_000), None);
    assert_eq!(cpu_millis(200_000, 100_000), Some(2000));
}

#[test]
fn controllers_are_intersected_with_what_the_parent_enabled() {
    let wanted = Controllers {
        memory: true,
        pids: true,
        cpu: true,
        cpuacct: false,
        freezer: false,
    };
    let got = wanted.intersect_listed("cpuset memory pids\n");
    assert!(got.memory && got.pids && !got.cpu);
}
