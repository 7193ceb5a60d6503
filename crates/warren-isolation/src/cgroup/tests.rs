//! Tests of detection (the layouts hosts mount) and of what every cgroup version shares.

use super::*;

/// This machine: v1 controllers mounted one per hierarchy, a named systemd hierarchy,
/// and a controller-less cgroup2 at `unified`.
const MIXED: &str = "\
22 1 0:20 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

/// A systemd host booted into the unified hierarchy.
const PURE_V2: &str = "\
24 1 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 24 0:29 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

/// An older systemd hybrid: cpu and cpuacct co-mounted, optional fields present.
const COMOUNTED: &str = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
";

const NO_CGROUPS: &str = "\
21 1 0:19 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
22 1 0:20 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
";

fn plan_summary(support: &CgroupSupport) -> Vec<(String, Controllers, bool)> {
    support
        .plans()
        .into_iter()
        .map(|p| (p.hierarchy, p.controllers, p.leafy))
        .collect()
}

#[test]
fn mixed_layout_takes_limits_from_v1_and_tracking_from_the_controllerless_v2() {
    let support = CgroupSupport::from_mountinfo(MIXED, "hugetlb\n");
    assert_eq!(
        support.unified_mount(),
        Some(Path::new("/sys/fs/cgroup/unified"))
    );
    assert_eq!(
        support.v1_mount("memory"),
        Some(Path::new("/sys/fs/cgroup/memory"))
    );
    assert_eq!(
        support.v1_mount("cpuacct"),
        Some(Path::new("/sys/fs/cgroup/cpuacct"))
    );
    assert_eq!(
        support.v1_mount("freezer"),
        Some(Path::new("/sys/fs/cgroup/freezer"))
    );
    assert_eq!(support.v1_mount("name=systemd"), None);
    assert_eq!(
        support.enforceable(),
        Enforceable {
            memory: true,
            pids: true,
            cpu: true,
            tree_kill: true
        }
    );
    let memory = Controllers {
        memory: true,
        ..Controllers::default()
    };
    let pids = Controllers {
        pids: true,
        ..Controllers::default()
    };
    let cpu = Controllers {
        cpu: true,
        ..Controllers::default()
    };
    // cpuacct is left out: the v2 hierarchy's cpu.stat reports usage already; v1 pids
    // holds only the sandbox-wide limit, commands are told apart by the v2 leafs.
    assert_eq!(
        plan_summary(&support),
        vec![
            ("unified".to_owned(), Controllers::default(), true),
            ("cpu".to_owned(), cpu, false),
            ("memory".to_owned(), memory, false),
            ("pids".to_owned(), pids, false),
        ]
    );
    let description = support.describe();
    assert!(description.contains(&"memory limit: enforced with cgroup v1 memory".to_owned()));
    assert!(description.contains(&"process tree kill: cgroup.kill (v2)".to_owned()));
    assert!(description
        .contains(&"cgroup v2 at /sys/fs/cgroup/unified (controllers: hugetlb)".to_owned()));
}

#[test]
fn pure_v2_with_controllers_puts_everything_in_the_unified_hierarchy() {
    let support =
        CgroupSupport::from_mountinfo(PURE_V2, "cpuset cpu io memory hugetlb pids rdma misc\n");
    assert_eq!(support.unified_mount(), Some(Path::new("/sys/fs/cgroup")));
    assert_eq!(support.v1_mount("memory"), None);
    assert_eq!(
        support.enforceable(),
        Enforceable {
            memory: true,
            pids: true,
            cpu: true,
            tree_kill: true
        }
    );
    let all = Controllers {
        memory: true,
        pids: true,
        cpu: true,
        cpuacct: false,
        freezer: false,
    };
    assert_eq!(
        plan_summary(&support),
        vec![("unified".to_owned(), all, true)]
    );
    let description = support.describe();
    assert!(description.contains(&"cpu limit: enforced with cgroup v2".to_owned()));
    assert!(description.contains(&"cgroup v1: no controller hierarchies mounted".to_owned()));
}

#[test]
fn pure_v2_without_the_memory_controller_cannot_enforce_memory() {
    let support = CgroupSupport::from_mountinfo(PURE_V2, "cpu pids\n");
    let enforceable = support.enforceable();
    assert!(!enforceable.memory);
    assert!(enforceable.pids && enforceable.cpu && enforceable.tree_kill);
    assert!(support
        .describe()
        .contains(&"memory limit: not enforceable (no controller)".to_owned()));
}

#[test]
fn comounted_cpu_and_cpuacct_form_one_hierarchy_that_also_reports_usage() {
    let support = CgroupSupport::from_mountinfo(COMOUNTED, "");
    assert_eq!(support.unified_mount(), None);
    assert_eq!(
        support.v1_mount("cpu"),
        Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
    );
    assert_eq!(support.v1_mount("cpu"), support.v1_mount("cpuacct"));
    let plans = plan_summary(&support);
    assert_eq!(plans[0].0, "cpu,cpuacct");
    assert!(plans[0].1.cpu && plans[0].1.cpuacct && !plans[0].2);
    assert_eq!(plans[2].0, "pids");
    assert!(plans[2].2, "pids carries the leafs without v2");
    assert!(support
        .describe()
        .contains(&"process tree kill: v1 pids listing".to_owned()));
}

#[test]
fn no_cgroup_mounts_means_nothing_is_enforceable() {
    let support = CgroupSupport::from_mountinfo(NO_CGROUPS, "");
    assert_eq!(support.unified_mount(), None);
    assert_eq!(support.enforceable(), Enforceable::default());
    assert!(support.plans().is_empty());
    let description = support.describe();
    assert!(description.contains(&"cgroup v2: not mounted".to_owned()));
    assert!(description.contains(&"pids limit: not enforceable (no controller)".to_owned()));
    assert!(
        description.contains(&"process tree kill: unavailable (no cgroup hierarchy)".to_owned())
    );
}

#[test]
fn pure_v1_with_a_freezer_keeps_the_leafs_there_too_and_hybrid_hosts_do_not() {
    let v1 = "35 31 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
              37 31 0:34 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n";
    let support = CgroupSupport::from_mountinfo(v1, "");
    assert_eq!(
        plan_summary(&support),
        vec![
            (
                "pids".to_owned(),
                Controllers {
                    pids: true,
                    ..Controllers::default()
                },
                true
            ),
            (
                "freezer".to_owned(),
                Controllers {
                    freezer: true,
                    ..Controllers::default()
                },
                true
            ),
        ]
    );
    // With v2 mounted, cgroup.freeze does it: the v1 freezer is not used.
    let hybrid = format!("{v1}30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
    let support = CgroupSupport::from_mountinfo(&hybrid, "");
    assert!(plan_summary(&support)
        .iter()
        .all(|(hierarchy, controllers, _)| hierarchy != "freezer" && !controllers.freezer));
}

#[test]
fn v1_without_pids_puts_the_leafs_in_another_hierarchy() {
    let text = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    let support = CgroupSupport::from_mountinfo(text, "");
    assert_eq!(
        plan_summary(&support),
        vec![(
            "memory".to_owned(),
            Controllers {
                memory: true,
                ..Controllers::default()
            },
            true
        )]
    );
    assert!(support.enforceable().tree_kill);
}

#[test]
fn escaped_mount_points_are_decoded() {
    let text = "41 31 0:38 / /mnt/cgroup\\040two rw - cgroup2 cgroup2 rw\n";
    let support = CgroupSupport::from_mountinfo(text, "");
    assert_eq!(support.unified_mount(), Some(Path::new("/mnt/cgroup two")));
    assert_eq!(
        unescape_mount_path("a\\134b\\777"),
        PathBuf::from("a\\b\\777")
    );
}

#[test]
fn a_second_mount_of_the_same_hierarchy_is_ignored() {
    let text = "\
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
90 80 0:32 / /container/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
    let support = CgroupSupport::from_mountinfo(text, "");
    assert_eq!(
        support.v1_mount("memory"),
        Some(Path::new("/sys/fs/cgroup/memory"))
    );
    assert_eq!(support.plans().len(), 1);
}

#[test]
fn proc_self_cgroup_lines_name_their_hierarchy() {
    let own = parse_proc_cgroup("4:memory:/process_api/x\n1:cpu,cpuacct:/\n0::/init.scope\n");
    assert_eq!(
        own,
        vec![
            ("memory".to_owned(), "/process_api/x".to_owned()),
            ("cpu,cpuacct".to_owned(), "/".to_owned()),
            ("unified".to_owned(), "/init.scope".to_owned()),
        ]
    );
}

#[test]
fn cgroup_kill_needs_linux_5_14() {
    assert!(kernel_has_cgroup_kill("6.18.44-fc-v857"));
    assert!(kernel_has_cgroup_kill("5.14.0"));
    assert!(!kernel_has_cgroup_kill("5.13.19-generic"));
    assert!(!kernel_has_cgroup_kill("4.19.0"));
    assert!(!kernel_has_cgroup_kill("garbage"));
}

#[test]
fn cpu_millis_become_a_quota_per_100ms_with_a_1ms_floor() {
    assert_eq!(cpu_quota_usec(1000), 100_000);
    assert_eq!(cpu_quota_usec(500), 50_000);
    assert_eq!(cpu_quota_usec(2500), 250_000);
    assert_eq!(cpu_quota_usec(1), MIN_CPU_QUOTA_USEC);
    assert_eq!(cpu_quota_usec(u64::MAX), u64::MAX);
}

#[test]
fn sandbox_names_must_be_plain_directory_names() {
    assert!(validate_name("test-123_4").is_ok());
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "cgroup.procs",
        "a b",
        &"x".repeat(129),
    ] {
        assert!(
            matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn page_cache_is_read_from_memory_stat() {
    let v2 = "anon 104857600\nfile 52428800\nkernel 1024\nfile_mapped 0\n";
    assert_eq!(stat_field(v2, "file"), Some(52_428_800));
    assert_eq!(stat_field(v2, "anon"), Some(104_857_600));
    let v1 = "cache 4096\nrss 8192\ntotal_cache 12288\ntotal_rss 16384\n";
    assert_eq!(stat_field(v1, "total_cache"), Some(12_288));
    assert_eq!(stat_field(v1, "cache"), Some(4096));
}

#[test]
fn cpu_stat_fields_are_found_by_key() {
    let text = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
    assert_eq!(stat_field(text, "usage_usec"), Some(1234));
    assert_eq!(stat_field(text, "system_usec"), Some(234));
    assert_eq!(stat_field(text, "nr_periods"), None);
}
