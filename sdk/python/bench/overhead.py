"""The SDK's own overhead, measured in one run against one server: the same calls through
deepagents' backend on warren (`WarrenSandbox`, over `warren_sdk.Warren`) and as raw HTTP
(httpx, one kept-alive connection, the bytes warren's API takes), interleaved so a slow
spell of a shared machine lands on both alike. Not a test: it prints.

    WARREN_URL=... WARREN_TOKEN=... PYTHONPATH=sdk/python/src python sdk/python/bench/overhead.py [iterations]

`cargo bench -p warren --bench sdk` starts a server and runs it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid

import httpx

from warren_sdk import Warren
from warren_sdk.deepagents import WarrenSandbox

MIB = 1024 * 1024


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    url, token = os.environ["WARREN_URL"], os.environ["WARREN_TOKEN"]
    client = Warren(url, token)
    backend = WarrenSandbox.create(client, uid=f"bench-{uuid.uuid4().hex[:8]}", runtime_scope_id="bench")
    sid = backend.id
    raw = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    payload = os.urandom(MIB)
    path = "/tmp/bench/blob.bin"

    def raw_exec() -> None:
        answer = raw.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"})
        assert answer.status_code == 200 and answer.json()["exit_code"] == 0, answer.text

    def sdk_exec() -> None:
        assert backend.execute("true").exit_code == 0

    def raw_upload_download() -> None:
        put = raw.put(f"/v1/sandboxes/{sid}/files", params={"path": path}, content=payload)
        assert put.status_code in (200, 201), put.text
        got = raw.get(f"/v1/sandboxes/{sid}/files", params={"path": path})
        assert got.content == payload

    def sdk_upload_download() -> None:
        assert backend.upload_files([(path, payload)])[0].error is None
        assert backend.download_files([path])[0].content == payload

    cases = [
        ('execute("true") round trip', raw_exec, sdk_exec),
        ("1 MiB upload_files + download_files", raw_upload_download, sdk_upload_download),
    ]
    print(f"warren-sdk overhead, {iterations} iterations each after 10 warm-ups, one server, loopback")
    print(f"{'':40} {'raw HTTP p50 / p99':>22} {'deepagents backend p50 / p99':>30} {'ratio p50':>10}")
    for name, anchor, ours in cases:
        for _ in range(10):
            anchor()
            ours()
        times: dict[str, list[float]] = {"anchor": [], "ours": []}
        for i in range(iterations):
            order = [("anchor", anchor), ("ours", ours)]
            for label, call in order if i % 2 == 0 else reversed(order):
                start = time.perf_counter()
                call()
                times[label].append((time.perf_counter() - start) * 1000)
        a50, a99 = percentile(times["anchor"], 0.5), percentile(times["anchor"], 0.99)
        o50, o99 = percentile(times["ours"], 0.5), percentile(times["ours"], 0.99)
        print(f"{name:40} {a50:>9.2f} / {a99:>6.2f} ms {o50:>15.2f} / {o99:>6.2f} ms {o50 / a50:>9.2f}x")
        print(f"{'':40} (mean {statistics.mean(times['anchor']):.2f} ms vs {statistics.mean(times['ours']):.2f} ms)")
    client.sandboxes.terminate(sid)


if __name__ == "__main__":
    main()
