//! E2B's sandbox metrics (issue 17) through the official Python SDK (2.63.0, from
//! `WARREN_TEST_E2B_PY_CURRENT`): `Sandbox.get_metrics()` reports the runtime's own cgroup
//! figures (I22), on each backend that measures them (local and Docker). A busy loop shows
//! as CPU use, 200 MiB a process holds as memory used, and the memory goes when the
//! process does; a paused sandbox answers no sample, another key's or a killed one 404.
//! `GET /sandboxes/metrics` is read with the SDK's own models.

use std::time::Duration;

use warren_test_support::{E2bServer, TestServer};

use super::bin;

/// The scenario, run by the SDK's interpreter; prints `METRICS PASSED` when every check
/// held, and raises with what it saw otherwise.
const SCENARIO: &str = r#"
import json, os, time, urllib.error, urllib.request
from datetime import datetime, timedelta, timezone
from e2b import Sandbox, SandboxException
from e2b.api.client.models.sandbox_metric import SandboxMetric
from e2b.api.client.models.sandboxes_with_metrics import SandboxesWithMetrics

MIB = 1024 * 1024
API_URL = os.environ["E2B_API_URL"].rstrip("/")
API_KEY = os.environ["E2B_API_KEY"]
BOB_KEY = os.environ["WARREN_E2B_BOB_KEY"]

def check(holds, what, seen):
    if not holds:
        raise AssertionError(f"{what}; saw {seen!r}")

def sample(sbx):
    metrics = sbx.get_metrics()
    check(len(metrics) == 1, "get_metrics answers the sample taken now", metrics)
    m = metrics[0]
    check(m.cpu_count >= 1, "cpuCount is at least one", m)
    check(0 <= m.cpu_used_pct <= 100, "cpuUsedPct is a percentage", m)
    check(0 < m.mem_used <= m.mem_total, "memUsed is within memTotal", m)
    check(m.mem_cache >= 0, "memCache is a byte count", m)
    check(0 < m.disk_used <= m.disk_total, "diskUsed is within diskTotal", m)
    check(abs(m.timestamp.timestamp() - time.time()) < 30, "the sample is from now", m)
    return m

def until(sbx, holds, within, what):
    deadline = time.monotonic() + within
    seen = []
    while True:
        m = sample(sbx)
        seen.append(m)
        if holds(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {within}s; samples {seen!r}")
        time.sleep(0.2)

def get(path, key):
    request = urllib.request.Request(API_URL + path, headers={"X-API-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())

sbx = Sandbox.create(timeout=300)
try:
    idle = sample(sbx)
    print("idle:", idle, flush=True)

    # A busy loop: CPU used while it runs.
    # The loop runs until it is seen: on a loaded machine it gets only a share of a core,
    # and each sample (the delta since the one before) lags it, so the check is that CPU
    # use is clearly above idle, for as long as it takes a few samples to show it.
    loop = sbx.commands.run("sh -c 'while :; do :; done'", background=True)
    time.sleep(0.5)
    busy = until(sbx, lambda m: m.cpu_used_pct >= idle.cpu_used_pct + 5, 8, "cpuUsedPct clearly above idle while a busy loop runs")
    print("busy:", busy, flush=True)
    loop.kill()

    # 200 MiB held by a process: memory used while it holds them, gone after.
    time.sleep(3)
    before = sample(sbx)
    sbx.commands.run(
        "python3 -c \"b=bytearray(200*1024*1024); import time; time.sleep(3)\"",
        background=True,
    )
    held = until(sbx, lambda m: m.mem_used >= 200 * MIB, 3, "memUsed at least 200 MiB while a process holds them")
    print("holding:", held, flush=True)
    freed = until(sbx, lambda m: m.mem_used < held.mem_used - 150 * MIB, 8, "memUsed drops once the process ends")
    print("freed:", freed, "(before:", before, ")", flush=True)

    # The asked window must reach now; the SDK's own start/end are Unix seconds.
    now = datetime.now(timezone.utc)
    check(len(sbx.get_metrics(start=now - timedelta(minutes=5), end=now)) == 1, "a window ending now holds the sample", now)
    check(sbx.get_metrics(end=now - timedelta(hours=1)) == [], "a window that ended an hour ago holds none", now)
    check(sbx.get_metrics(start=now + timedelta(hours=1)) == [], "a window starting in an hour holds none", now)
    status, body = get(f"/sandboxes/{sbx.sandbox_id}/metrics?start=later", API_KEY)
    check(status == 400 and body["code"] == 400 and body["message"], "a malformed start is 400 in E2B's shape", (status, body))

    # Several sandboxes at once, read with the SDK's own models: only the caller's.
    status, body = get(f"/sandboxes/metrics?sandbox_ids={sbx.sandbox_id},aaaaaaaaaaaaaaaaaaaa", API_KEY)
    check(status == 200, "GET /sandboxes/metrics answers 200", (status, body))
    listed = SandboxesWithMetrics.from_dict(body).sandboxes
    check(list(listed) == [sbx.sandbox_id], "only the caller's running sandbox is listed", body)
    one = SandboxMetric.from_dict(listed[sbx.sandbox_id])
    check(one.mem_total >= one.mem_used > 0, "the listed sample is the SDK's SandboxMetric", body)
    status, body = get(f"/sandboxes/metrics?sandbox_ids={sbx.sandbox_id}", BOB_KEY)
    check(status == 200 and body == {"sandboxes": {}}, "another key's sandbox is not listed", (status, body))
    status, body = get("/sandboxes/metrics", API_KEY)
    check(status == 400 and body["code"] == 400, "sandbox_ids is required", (status, body))

    # Another key's sandbox is unknown to it.
    status, body = get(f"/sandboxes/{sbx.sandbox_id}/metrics", BOB_KEY)
    check(status == 404 and body["code"] == 404, "another key's sandbox is 404", (status, body))

    # Paused: no runtime, no sample.
    sbx.pause()
    check(Sandbox.get_metrics(sbx.sandbox_id) == [], "a paused sandbox has no sample", None)
finally:
    Sandbox.kill(sbx.sandbox_id)

try:
    Sandbox.get_metrics(sbx.sandbox_id)
    raise AssertionError("a killed sandbox's metrics must be 404")
except SandboxException as error:
    check("not found" in str(error).lower(), "a killed sandbox is not found", error)
print("METRICS PASSED", flush=True)
"#;

/// Runs the scenario against `server` and asserts it passed.
fn scenario_on(server: &E2bServer, backend: &str) {
    let stdout = server.run_python_sdk(
        &format!("the metrics scenario on {backend}"),
        SCENARIO,
        "METRICS PASSED",
        Duration::from_secs(180),
    );
    // The samples seen, for `--nocapture` (the harness keeps them otherwise).
    println!("{stdout}");
}

#[test]
fn e2b_metrics_are_the_local_runtimes_cgroup_figures() {
    let server = TestServer::start_e2b(bin(), &[], "");
    scenario_on(&server, "local");
}

#[test]
fn e2b_metrics_are_the_docker_containers_cgroup_figures() {
    let server = TestServer::start_e2b_docker(bin(), "");
    scenario_on(&server, "docker");
}
