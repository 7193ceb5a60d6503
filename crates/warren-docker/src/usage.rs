//! A runtime's usage from the engine's stats.

use warren_backend::RuntimeUsage;

/// A runtime's usage from one engine stats sample; `None` when the sample has no CPU or
/// memory figures (a container that is not running). `memory_limited`: whether the
/// sample's memory limit is one warren set (the engine reports the host's memory
/// otherwise). `cpu_limit_millis` is the `NanoCpus` limit warren created the container
/// with (I23): the engine's stats carry no quota.
pub(crate) fn usage_of(
    sample: &bollard::models::ContainerStatsResponse,
    memory_limited: bool,
    cpu_limit_millis: Option<u64>,
) -> Option<RuntimeUsage> {
    let cpu = sample.cpu_stats.as_ref()?.cpu_usage.as_ref()?.total_usage?;
    let memory = sample.memory_stats.as_ref()?;
    let current = memory.usage?;
    // cgroup v2 names the page cache `file`; v1 `total_cache` (the whole subtree) or
    // `cache`.
    let file = memory.stats.as_ref().and_then(|stats| {
        ["file", "total_cache", "cache"]
            .iter()
            .find_map(|key| stats.get(*key).copied())
    });
    Some(RuntimeUsage {
        // The engine reports nanoseconds on both cgroup versions.
        cpu_usage_usec: cpu / 1000,
        memory_current: current,
        memory_max: memory.limit.filter(|&limit| memory_limited && limit > 0),
        memory_file: file,
        cpu_limit_millis,
    })
}

#[cfg(test)]
mod usage_tests {
    use std::collections::HashMap;

    use bollard::models::{
        ContainerCpuStats, ContainerCpuUsage, ContainerMemoryStats, ContainerStatsResponse,
    };

    use super::usage_of;

    fn sample(stats: &[(&str, u64)], limit: u64) -> ContainerStatsResponse {
        ContainerStatsResponse {
            cpu_stats: Some(ContainerCpuStats {
                cpu_usage: Some(ContainerCpuUsage {
                    total_usage: Some(2_500_000_000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(300 << 20),
                limit: Some(limit),
                stats: Some(
                    stats
                        .iter()
                        .map(|(key, value)| ((*key).to_owned(), *value))
                        .collect::<HashMap<_, _>>(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn engine_stats_become_the_runtimes_usage_on_either_cgroup_version() {
        let v2 = usage_of(&sample(&[("file", 100 << 20)], 2 << 30), true, Some(1000)).unwrap();
        assert_eq!(v2.cpu_usage_usec, 2_500_000);
        assert_eq!(v2.memory_current, 300 << 20);
        assert_eq!(v2.memory_file, Some(100 << 20));
        assert_eq!(v2.memory_used(), 200 << 20);
        assert_eq!(v2.memory_max, Some(2 << 30));
        assert_eq!(v2.cpu_limit_millis, Some(1000));
        let v1 = usage_of(
            &sample(&[("cache", 1), ("total_cache", 50 << 20)], 2 << 30),
            true,
            None,
        )
        .unwrap();
        assert_eq!(v1.memory_file, Some(50 << 20));
        assert_eq!(v1.cpu_limit_millis, None);
    }

    #[test]
    fn the_hosts_memory_is_no_limit_and_a_stopped_container_has_no_usage() {
        // Without a limit of warren's the engine reports the host's memory.
        let unlimited = usage_of(&sample(&[], 64 << 30), false, None).unwrap();
        assert_eq!(unlimited.memory_max, None);
        assert_eq!(unlimited.memory_file, None);
        // A container that is not running answers a sample without figures.
        assert_eq!(
            usage_of(&ContainerStatsResponse::default(), true, None),
            None
        );
    }
}
