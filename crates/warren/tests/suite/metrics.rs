//! `GET /metrics`, read back with the reference OpenMetrics parser (Python's
//! `prometheus_client`), so the format is checked by a real scraper's rules.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use warren_test_support::TestServer;

use super::bin;

const PARSER: &str = r#"
import json, sys
try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError:
    sys.exit("python3-prometheus-client is missing: scripts/test installs it (apt-get install python3-prometheus-client)")
samples = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
        if "le" in s.labels:
            continue
        samples[s.name + "{" + labels + "}"] = s.value
print(json.dumps(samples))
"#;

/// Every sample but histogram buckets, as `name{label=value,...}` → value.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut parser = Command::new("python3")
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/test installs it)");
    parser
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = parser.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the OpenMetrics parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

pub(super) async fn scrape(server: &TestServer) -> BTreeMap<String, f64> {
    let response = server
        .request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse(&response.text().await.unwrap())
}

pub(super) fn value(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    *samples
        .get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {samples:#?}"))
}

#[tokio::test]
async fn metrics_count_runtimes_execs_reaps_fence_waits_and_failures() {
    let server = TestServer::start_with(bin(), &["--idle-timeout", "1", "--reap-interval", "1"]);
    let before = scrape(&server).await;
    assert_eq!(value(&before, "warren_exec_seconds_count{}"), 0.0);
    assert_eq!(value(&before, "warren_reaps_total{reason=idle}"), 0.0);
    assert_eq!(
        value(&before, "warren_failures_total{cause=runtime_start}"),
        0.0
    );

    let reaped = server.sandbox("alice", "a", "projects/a").await;
    let ended = server.sandbox("bob", "b", "projects/b").await;
    // Created, never run: no runtime.
    server.sandbox("carol", "c", "projects/c").await;
    server.exec(&reaped, "true").await;
    server.exec(&ended, "true").await;
    server.exec(&ended, "exit 3").await;
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, &format!("/v1/sandboxes/{ended}/terminate"))
                .json(&json!({"grace_s": 0})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let samples = scrape(&server).await;
        if value(&samples, "warren_reaps_total{reason=idle}") >= 1.0 || Instant::now() > deadline {
            break samples;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        value(&after, "warren_reaps_total{reason=idle}"),
        1.0,
        "{after:#?}"
    );
    assert_eq!(
        value(&after, "warren_reaps_total{reason=max_lifetime}"),
        0.0
    );
    assert_eq!(value(&after, "warren_exec_seconds_count{}"), 3.0);
    assert!(value(&after, "warren_exec_seconds_sum{}") > 0.0);
    assert_eq!(value(&after, "warren_runtime_start_seconds_count{}"), 2.0);
    assert_eq!(value(&after, "warren_fence_wait_seconds_count{}"), 1.0);
    assert_eq!(
        value(&after, "warren_sandboxes{state=stopped}"),
        1.0,
        "{after:#?}"
    );
    assert_eq!(value(&after, "warren_sandboxes{state=terminated}"), 1.0);
    assert_eq!(value(&after, "warren_sandboxes{state=created}"), 1.0);
    assert_eq!(value(&after, "warren_sandboxes{state=running}"), 0.0);
    assert_eq!(value(&after, "warren_failures_total{cause=exec}"), 0.0);
}

#[tokio::test]
async fn metrics_need_the_token() {
    let server = TestServer::start(bin());
    let (status, body) = server
        .send_json(server.anonymous(Method::GET, "/metrics"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{body}"
    );
}
