//! E2B's sandbox metrics: `GET /sandboxes/{id}/metrics` (a list of `SandboxMetric`) and
//! `GET /sandboxes/metrics?sandbox_ids=a,b` (`{"sandboxes": {id: SandboxMetric}}`), from
//! the runtime's own cgroup figures (`Provisioner::runtime_usage`, I22), never estimated.
//!
//! E2B samples each sandbox every few seconds and keeps a history; warren measures when
//! asked, so a list holds at most one entry: the sample taken now, when the asked window
//! reaches now. A sandbox without a running runtime (paused, or on a backend that cannot
//! measure) answers an empty list, as E2B does for a sandbox it has no samples of yet.
//!
//! `cpuUsedPct` is the CPU time the runtime used over the sampling interval
//! (`Provisioner::sample_usage`) as a percentage of the CPU it may use (its CPU limit,
//! I23; the reported `cpuCount` where it has none).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use warren_provisioner::ProvisionerError;

use super::{caller, owned, Found};
use crate::error::{shorten, ApiFailure};
use crate::Shared;

/// Most sandboxes one `GET /sandboxes/metrics` may name (E2B's own bound).
const MAX_LISTED: usize = 100;

/// How far before the sample's time an asked window may end and still include it: the
/// SDK sends its own clock's `now`, truncated to the second, as `end`.
const CLOCK_SLACK_SECONDS: i64 = 5;

/// `SandboxMetric`, as the SDKs read it (every field required).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxMetric {
    /// When the sample was taken, RFC 3339.
    timestamp: String,
    /// The same, in Unix seconds.
    timestamp_unix: i64,
    /// The CPUs the sandbox may use: its CPU limit rounded up, else the reported count.
    cpu_count: u32,
    /// CPU used over the sampling interval, percent of `cpu_count`'s capacity.
    cpu_used_pct: f64,
    /// Memory the runtime holds less page cache, bytes.
    mem_used: u64,
    /// The memory limit (I23), else the sandbox's reported memory, bytes.
    mem_total: u64,
    /// Page cache (tmpfs included) charged to the runtime, bytes.
    mem_cache: u64,
    /// Bytes used on the filesystem the workdir lives on (the uid's quota volume, or the
    /// shared data filesystem).
    disk_used: u64,
    /// That filesystem's size.
    disk_total: u64,
}

/// `{"sandboxes": {id: SandboxMetric}}`.
#[derive(Debug, Serialize)]
pub(crate) struct SandboxesWithMetrics {
    /// The latest sample of each asked sandbox that runs and was measured.
    sandboxes: BTreeMap<String, SandboxMetric>,
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: the sample taken now, if the window (Unix
/// seconds, both optional) reaches now; 404 for an unknown sandbox or another key's.
pub(crate) async fn sandbox_metrics(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<SandboxMetric>>, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let window = Window::parse(query.as_deref())?;
    let found = owned(&shared, &uid, &id).await?;
    let now = Utc::now();
    if !window.includes(now) {
        return Ok(Json(Vec::new()));
    }
    Ok(Json(measure(&shared, &found).await?.into_iter().collect()))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the latest sample of each named sandbox of
/// the key's uid that runs; others (unknown, another key's, paused) are left out, as
/// E2B leaves out sandboxes it has no sample of.
pub(crate) async fn sandboxes_metrics(
    State(shared): State<Shared>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<SandboxesWithMetrics>, ApiFailure> {
    let uid = caller(&shared, &headers).await?;
    let ids = listed_ids(query.as_deref())?;
    let measured = futures::future::join_all(ids.iter().map(|id| {
        let shared = &shared;
        let uid = &uid;
        async move {
            let found = match super::find(shared, id).await? {
                Some(found) if &found.e2b.uid == uid => found,
                _ => return Ok(None),
            };
            Ok::<_, ApiFailure>(measure(shared, &found).await?.map(|m| (id.clone(), m)))
        }
    }))
    .await;
    let mut sandboxes = BTreeMap::new();
    for result in measured {
        if let Some((id, metric)) = result? {
            sandboxes.insert(id, metric);
        }
    }
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}

/// One sample of a sandbox, or `None` when nothing runs to measure: paused, no
/// runtime, or a backend without figures.
async fn measure(shared: &Shared, found: &Found) -> Result<Option<SandboxMetric>, ApiFailure> {
    if !found.is_running() {
        return Ok(None);
    }
    let sandbox = &found.e2b;
    let id = &found.sandbox.id;
    let Some(sample) = shared.provisioner.sample_usage(id).await.or_else(gone)? else {
        return Ok(None);
    };
    let (usage, cpu_used_usec, interval) = (sample.usage, sample.cpu_used_usec, sample.interval);
    let disk = shared.provisioner.sandbox_disk(id).await.or_else(gone)?;
    let capacity_millis = usage
        .cpu_limit_millis
        .unwrap_or(u64::from(sandbox.cpu_count) * 1000);
    let now = Utc::now();
    Ok(Some(SandboxMetric {
        timestamp: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        timestamp_unix: now.timestamp(),
        cpu_count: cpu_count(usage.cpu_limit_millis, sandbox.cpu_count),
        cpu_used_pct: cpu_percent(cpu_used_usec, interval, capacity_millis),
        mem_used: usage.memory_used(),
        mem_total: usage
            .memory_max
            .unwrap_or(sandbox.memory_mb.saturating_mul(1024 * 1024)),
        // Unknown page cache is reported as none: the charge is then all "used".
        mem_cache: usage.memory_file.unwrap_or(0),
        // An unreadable filesystem (logged by the provisioner) is reported as empty.
        disk_used: disk.map_or(0, |d| d.used_bytes),
        disk_total: disk.map_or(0, |d| d.total_bytes),
    }))
}

/// A sandbox removed while it was measured has nothing to report; other failures stand.
fn gone<T>(error: ProvisionerError) -> Result<Option<T>, ApiFailure> {
    match error {
        ProvisionerError::SandboxNotFound(_) => Ok(None),
        other => Err(other.into()),
    }
}

/// The CPUs a sandbox may use: its limit rounded up (1500 thousandths: 2), else the count
/// its record reports.
fn cpu_count(limit_millis: Option<u64>, reported: u32) -> u32 {
    match limit_millis {
        Some(millis) => u32::try_from(millis.div_ceil(1000).max(1)).unwrap_or(u32::MAX),
        None => reported.max(1),
    }
}

/// `used_usec` of CPU time over `interval` as a percentage of `capacity_millis`
/// thousandths of a CPU, within 0..=100 (a sample read a moment late may overshoot),
/// rounded to hundredths.
fn cpu_percent(used_usec: u64, interval: Duration, capacity_millis: u64) -> f64 {
    let capacity_usec = interval.as_secs_f64() * 1e6 * capacity_millis as f64 / 1000.0;
    if capacity_usec <= 0.0 {
        return 0.0;
    }
    let percent = (used_usec as f64 / capacity_usec * 100.0).clamp(0.0, 100.0);
    (percent * 100.0).round() / 100.0
}

/// The `start` and `end` of a metrics request, Unix seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Window {
    start: Option<i64>,
    end: Option<i64>,
}

impl Window {
    /// Reads `start` and `end` from a query; 400 in E2B's shape when either is not a
    /// non-negative integer or `start` comes after `end`.
    fn parse(query: Option<&str>) -> Result<Self, ApiFailure> {
        let mut window = Self::default();
        for (key, value) in query_pairs(query) {
            let slot = match key.as_str() {
                "start" => &mut window.start,
                "end" => &mut window.end,
                _ => continue,
            };
            let seconds = value
                .parse::<i64>()
                .ok()
                .filter(|s| *s >= 0)
                .ok_or_else(|| {
                    ApiFailure::bad_request(format!(
                        "{key} must be Unix seconds, not {:?}",
                        shorten(&value)
                    ))
                })?;
            *slot = Some(seconds);
        }
        if let (Some(start), Some(end)) = (window.start, window.end) {
            if start > end {
                return Err(ApiFailure::bad_request("start must not be after end"));
            }
        }
        Ok(window)
    }

    /// Whether a sample taken at `now` falls in the window (its end a little early by
    /// the caller's clock, see [`CLOCK_SLACK_SECONDS`]).
    fn includes(&self, now: DateTime<Utc>) -> bool {
        let now = now.timestamp();
        self.start.is_none_or(|start| start <= now)
            && self
                .end
                .is_none_or(|end| end.saturating_add(CLOCK_SLACK_SECONDS) >= now)
    }
}

/// The sandbox ids `sandbox_ids=a,b` names, each once, in order; 400 when it is missing,
/// empty or longer than [`MAX_LISTED`].
fn listed_ids(query: Option<&str>) -> Result<Vec<String>, ApiFailure> {
    let mut ids: Vec<String> = Vec::new();
    let mut named = false;
    for (key, value) in query_pairs(query) {
        if key != "sandbox_ids" {
            continue;
        }
        named = true;
        for id in value.split(',').map(str::trim).filter(|id| !id.is_empty()) {
            if !ids.iter().any(|known| known == id) {
                ids.push(id.to_owned());
            }
        }
    }
    if !named || ids.is_empty() {
        return Err(ApiFailure::bad_request(
            "sandbox_ids is required: the sandbox ids, comma-separated",
        ));
    }
    if ids.len() > MAX_LISTED {
        return Err(ApiFailure::bad_request(format!(
            "sandbox_ids names at most {MAX_LISTED} sandboxes"
        )));
    }
    Ok(ids)
}

/// The `key=value` pairs of a query string, form-decoded (`+` is a space); a pair that is
/// not UTF-8 is dropped.
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(&text.replace('+', " "))
            .decode_utf8()
            .ok()
            .map(|decoded| decoded.into_owned())
    };
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(key)?, decode(value)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_use_is_a_percentage_of_the_cpu_the_sandbox_may_use() {
        let second = Duration::from_secs(1);
        // Half a second of CPU in a second: half of one CPU, a quarter of two.
        assert_eq!(cpu_percent(500_000, second, 1000), 50.0);
        assert_eq!(cpu_percent(500_000, second, 2000), 25.0);
        // A busy loop over 100 ms of a one-CPU limit.
        assert_eq!(
            cpu_percent(100_000, Duration::from_millis(100), 1000),
            100.0
        );
        // Read a moment late: never above 100.
        assert_eq!(cpu_percent(1_200_000, second, 1000), 100.0);
        assert_eq!(cpu_percent(0, second, 1000), 0.0);
        // No interval or no capacity: nothing to divide by.
        assert_eq!(cpu_percent(1, Duration::ZERO, 1000), 0.0);
        assert_eq!(cpu_percent(1, second, 0), 0.0);
        assert_eq!(cpu_percent(123_456, second, 1000), 12.35);
    }

    #[test]
    fn the_cpu_count_is_the_limit_rounded_up() {
        assert_eq!(cpu_count(Some(1000), 8), 1);
        assert_eq!(cpu_count(Some(1500), 8), 2);
        assert_eq!(cpu_count(Some(100), 8), 1);
        assert_eq!(cpu_count(None, 2), 2);
        assert_eq!(cpu_count(None, 0), 1);
    }

    #[test]
    fn a_window_is_unix_seconds_and_includes_now_with_slack_for_the_callers_clock() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        assert!(Window::parse(None).unwrap().includes(now));
        let window = Window::parse(Some("start=1699999000&end=1699999998")).unwrap();
        assert_eq!(
            window,
            Window {
                start: Some(1_699_999_000),
                end: Some(1_699_999_998)
            }
        );
        assert!(window.includes(now));
        assert!(!Window::parse(Some("end=1699999000")).unwrap().includes(now));
        assert!(!Window::parse(Some("start=1700000100"))
            .unwrap()
            .includes(now));
        for bad in ["start=soon", "end=-1", "start=10&end=5", "start=1.5"] {
            let failure = Window::parse(Some(bad)).unwrap_err();
            assert_eq!(failure.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn listed_ids_are_read_once_each_and_bounded() {
        assert_eq!(
            listed_ids(Some("sandbox_ids=a%2Cb,c,a")).unwrap(),
            ["a", "b", "c"]
        );
        assert_eq!(
            listed_ids(Some("sandbox_ids=a&sandbox_ids=b")).unwrap(),
            ["a", "b"]
        );
        assert!(listed_ids(None).is_err());
        assert!(listed_ids(Some("sandbox_ids=")).is_err());
        let many: Vec<String> = (0..=MAX_LISTED).map(|n| format!("s{n}")).collect();
        assert!(listed_ids(Some(&format!("sandbox_ids={}", many.join(",")))).is_err());
    }
}
