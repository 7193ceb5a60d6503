"""The measuring side of `cargo bench -p warren --bench code` (issue 36).

Run by crates/warren/benches/code.rs with /usr/bin/python3 (Debian's python3-ipykernel and
python3-jupyter-client), WARREN_URL and WARREN_TOKEN naming a warren server on the local
backend; argv: [warm iterations (default 200), cold iterations (default 5)]. Stdlib only,
beside jupyter_client for the floor. It times with time.perf_counter() and prints the table.

Measured, in one run, on this machine:

- cold, warren: `POST /v1/sandboxes` (its answer: "create"), then the first
  `POST /v1/sandboxes/{id}/code/execute` of "1+1" (its answer: "first run_code"; the runtime,
  the context's driver and its kernel all start inside it), each on a fresh sandbox,
  terminated after its timing.
- cold, the floor: what warren's driver does in the sandbox, on the host, without warren: a
  jupyter_client KernelManager (ipc transport, as the driver's) start_kernel, a
  BlockingKernelClient's start_channels + wait_for_ready, and one execute of "1+1" waited
  for as the driver waits (iopub to `idle`, then the shell's execute_reply). Floor A does it
  in this running process (its imports done); floor B in a fresh python3 process, timed from
  its spawn to its line after the execute, so its interpreter start and its imports of
  jupyter_client and ipykernel count, as they count for the driver warren starts in a new
  sandbox.
- warm: the same execute of "1+1" N times, in one warren sandbox (its default context) and on
  one host kernel, after WARM_UP untimed ones each.

The ways interleave (each cold iteration runs warren, floor A and floor B, starting with the
next one; each warm iteration runs both sides, the first alternating), so a slow spell of this
shared two-core machine lands on all of them alike. Every answer is checked: status
ok and the result "2".

E2B's figures are printed beside ours, labelled: they are E2B's own published measurements,
NOT measured here (their cloud, the SDK over the internet, Firecracker microVMs):
- https://github.com/e2b-dev/code-interpreter/pull/145 (opened 2025-08-28, merged; "Added performance
  benchmarks for Code Interpreter CI/CD"): the example report of python/tests/performance.py
  (template code-interpreter-v1; `Sandbox.create()`, a health check, then `run_code(
  "print('Hello, world!')")` twice, each timed with time.time()). The PR shows iterations 1
  to 6 of 20; their values are below, and the median of those six is what is printed.
- https://github.com/e2b-dev/code-interpreter/pull/139 ("Pre-load JavaScript kernel into
  memory", opened 2025-08-20): "Python kernel time taken: 64.61 milliseconds" (execution time, before the
  change; the PR does not say exactly what is timed).
E2B's often quoted "~150 ms" sandbox start was not found on a page of E2B's own by this
bench's author, so it is not printed here (benches/e2b.rs prints it as a claim).
"""

import contextlib
import http.client
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

from jupyter_client import KernelManager
import jupyter_client

CODE = "1+1"
EXPECTED = "2"
# Untimed executions before the warm timings, and untimed cold iterations before the cold ones.
WARM_UP = 20
COLD_WARM_UP = 1
# A pause after each terminate / kernel shutdown, outside the timing.
SETTLE_S = 0.2
READY_TIMEOUT = 60

E2B_PR145 = "https://github.com/e2b-dev/code-interpreter/pull/145"
E2B_PR139 = "https://github.com/e2b-dev/code-interpreter/pull/139"
# Iterations 1-6 of the example report in E2B_PR145 (ms), as published.
E2B_CREATE_MS = [3703.90, 3589.60, 3950.90, 4179.79, 3493.78, 5898.87]
E2B_FIRST_RUN_MS = [2012.40, 1328.35, 1861.35, 2308.52, 2136.84, 1508.56]
E2B_SECOND_RUN_MS = [83.36, 78.94, 256.31, 90.12, 83.56, 99.18]
# E2B_PR139, "Python kernel time taken" before the change (ms).
E2B_PYTHON_KERNEL_MS = 64.61


class Warren:
    """warren's /v1 over one persistent HTTP/1.1 connection (loopback, TCP_NODELAY)."""

    def __init__(self, url, token):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self.conn = None

    def _connect(self):
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, method, path, body=None):
        """One request; (status, JSON answer). Reconnects once if the server closed the connection."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            if self.conn is None:
                self._connect()
            try:
                self.conn.request(method, path, body=data, headers=self.headers)
                response = self.conn.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode(errors="replace")
        return response.status, answer

    def create(self, scope):
        status, body = self.call("POST", "/v1/sandboxes", {"uid": "bench", "runtime_scope_id": scope})
        if status not in (200, 201):
            raise SystemExit(f"create sandbox: {status} {body}")
        return body["sandbox_id"]

    def run_code(self, sandbox):
        status, body = self.call("POST", f"/v1/sandboxes/{sandbox}/code/execute", {"code": CODE})
        if status != 200 or body.get("status") != "ok":
            raise SystemExit(f"run_code in {sandbox}: {status} {body}")
        texts = [r.get("data", {}).get("text/plain") for r in body.get("results", [])]
        if texts != [EXPECTED]:
            raise SystemExit(f"run_code in {sandbox}: results {body.get('results')}, want [{EXPECTED!r}]")

    def terminate(self, sandbox):
        status, body = self.call("DELETE", f"/v1/sandboxes/{sandbox}")
        if status != 200 or body.get("state") != "terminated":
            raise SystemExit(f"terminate {sandbox}: {status} {body}")


class HostKernel:
    """An ipykernel on the host through jupyter_client, started as warren's driver starts it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="warren-bench-kernel-")
        self.manager = KernelManager(
            kernel_name="python3",
            transport="ipc",
            ip=os.path.join(self.dir, "k"),
            connection_file=os.path.join(self.dir, "kernel.json"),
        )
        # Its stderr (debugpy's frozen-modules warning) would only clutter the table.
        self.manager.start_kernel(cwd=self.dir, stderr=subprocess.DEVNULL)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=READY_TIMEOUT)

    def execute(self):
        """execute("1+1"), waited for as warren's driver waits: iopub to idle, then the reply."""
        client = self.client
        msg_id = client.execute(CODE, store_history=True, allow_stdin=False, stop_on_error=False)
        result = None
        while True:
            message = client.get_iopub_msg(timeout=READY_TIMEOUT)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if kind == "execute_result":
                result = message["content"]["data"].get("text/plain")
            elif kind == "error":
                raise SystemExit(f"the host kernel: {message['content']}")
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                break
        reply = client.get_shell_msg(timeout=READY_TIMEOUT)
        while reply.get("parent_header", {}).get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=READY_TIMEOUT)
        if reply["content"].get("status") != "ok" or result != EXPECTED:
            raise SystemExit(f"the host kernel answered {result!r}: {reply['content']}")

    def stop(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def now():
    return time.perf_counter()


def warren_cold(warren, i):
    """(create, first run_code) in seconds, on a fresh sandbox, terminated after the timing."""
    started = now()
    sandbox = warren.create(f"code-cold-{i}")
    created = now()
    warren.run_code(sandbox)
    ran = now()
    warren.terminate(sandbox)
    time.sleep(SETTLE_S)
    return created - started, ran - created


def floor_cold():
    """A host kernel's start to ready plus its first execute, in this (running) process, in
    seconds; the kernel is stopped after the timing."""
    started = now()
    kernel = HostKernel()
    kernel.execute()
    ran = now()
    kernel.stop()
    time.sleep(SETTLE_S)
    return ran - started


def floor_cold_fresh():
    """The same in a fresh python3 process (its interpreter start and its imports of
    jupyter_client and, through the kernelspec, ipykernel, as warren's driver pays them in a
    new sandbox), from the spawn to the child's line after its execute, in seconds."""
    started = now()
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--cold-child"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    line = child.stdout.readline()
    ran = now()
    if line.strip() != b"ran" or child.wait(timeout=READY_TIMEOUT) != 0:
        raise SystemExit(f"the fresh floor process said {line!r} and exited {child.wait()}")
    time.sleep(SETTLE_S)
    return ran - started


def cold_child():
    """The child of floor_cold_fresh: one kernel, one execute, a line, then the kernel stopped."""
    kernel = HostKernel()
    kernel.execute()
    print("ran", flush=True)
    kernel.stop()
    return 0


def percentile(samples, p):
    """Nearest rank, as warren_test_support::latency::percentile."""
    ordered = sorted(samples)
    return ordered[round((len(ordered) - 1) * p)]


def ms(seconds):
    return seconds * 1000.0


def main():
    if sys.argv[1:] == ["--cold-child"]:
        return cold_child()
    # Resolving the python3 kernelspec imports ipykernel (and debugpy, which warns about frozen
    # modules on stderr) into this process: done once here, quietly, so the table stays clean.
    with contextlib.redirect_stderr(io.StringIO()):
        KernelManager(kernel_name="python3").kernel_spec
    warm_n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    cold_n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    warren = Warren(os.environ["WARREN_URL"], os.environ["WARREN_TOKEN"])

    # Cold: the three ways interleaved, each iteration starting with the next one; untimed
    # warm-up iterations first (this process's own imports of ipykernel, the page cache).
    create, first, floor_first, floor_fresh = [], [], [], []
    for i in range(COLD_WARM_UP + cold_n):
        for k in range(3):
            way = (i + k) % 3
            timed = i >= COLD_WARM_UP
            if way == 0:
                c, f = warren_cold(warren, i)
                if timed:
                    create.append(c)
                    first.append(f)
            elif way == 1:
                f = floor_cold()
                if timed:
                    floor_first.append(f)
            else:
                f = floor_cold_fresh()
                if timed:
                    floor_fresh.append(f)
    total = [c + f for c, f in zip(create, first)]

    # Warm: one sandbox and one host kernel, interleaved the same way.
    sandbox = warren.create("code-warm")
    kernel = HostKernel()
    for _ in range(WARM_UP):
        warren.run_code(sandbox)
        kernel.execute()
    warm, floor_warm = [], []
    for i in range(warm_n):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            started = now()
            if side == 0:
                warren.run_code(sandbox)
                warm.append(now() - started)
            else:
                kernel.execute()
                floor_warm.append(now() - started)
    kernel.stop()
    warren.terminate(sandbox)

    print(
        f'run_code("{CODE}"): warren /v1 code/execute (local backend, release build, loopback HTTP/1.1 keep-alive) '
        f"beside jupyter_client {jupyter_client.__version__} to an ipykernel on the host (the floor, ipc transport "
        f"as warren's driver uses), python {sys.version.split()[0]}, measured in this run, interleaved\n"
        f"cold: {cold_n} fresh sandboxes / host kernels / host processes after {COLD_WARM_UP} untimed each; "
        f"warm: {warm_n} executions each after {WARM_UP} untimed (with {cold_n} cold samples, p99 is their maximum)\n"
    )
    header = f"{'':<52} {'ours p50':>10} {'p99':>10} {'mean':>10} {'floor p50':>10} {'p99':>10} {'mean':>10} {'p50 ratio':>10} {'p99 ratio':>10}"
    print(header)

    def row(name, ours, floor=None):
        o50, o99, omean = ms(percentile(ours, 0.5)), ms(percentile(ours, 0.99)), ms(statistics.mean(ours))
        if floor is None:
            print(f"{name:<52} {o50:>7.2f} ms {o99:>7.2f} ms {omean:>7.2f} ms {'(none)':>10} {'':>10} {'':>10} {'':>10} {'':>10}")
            return
        f50, f99, fmean = ms(percentile(floor, 0.5)), ms(percentile(floor, 0.99)), ms(statistics.mean(floor))
        print(
            f"{name:<52} {o50:>7.2f} ms {o99:>7.2f} ms {omean:>7.2f} ms {f50:>7.2f} ms {f99:>7.2f} ms {fmean:>7.2f} ms "
            f"{o50 / f50:>9.2f}x {o99 / f99:>9.2f}x"
        )

    row("sandbox create (POST /v1/sandboxes; lazy runtime)", create)
    row("cold: first run_code after create   vs floor A", first, floor_first)
    row("cold: first run_code after create   vs floor B", first, floor_fresh)
    row("cold: create + first run_code       vs floor A", total, floor_first)
    row("warm run_code                       vs floor W", warm, floor_warm)
    print(
        "floor A: KernelManager.start_kernel + wait_for_ready + execute, in a running python3; floor B: the same in a "
        "fresh python3 process (spawn, imports, kernel, execute), as warren's driver starts in a new sandbox;\n"
        "floor W: execute on a BlockingKernelClient (iopub to idle, then execute_reply); ratio = ours / floor"
    )
    print(
        f"warren over the floor at p50: warm {ms(percentile(warm, 0.5) - percentile(floor_warm, 0.5)):+.2f} ms; "
        f"cold {ms(percentile(first, 0.5) - percentile(floor_first, 0.5)):+.2f} ms over floor A, "
        f"{ms(percentile(first, 0.5) - percentile(floor_fresh, 0.5)):+.2f} ms over floor B"
    )

    print(
        "\nE2B (published, not measured here): E2B's cloud, Firecracker microVMs, the e2b-code-interpreter SDK over the "
        "internet, template code-interpreter-v1; ratio = our p50 / E2B's figure"
    )
    print(f"  {E2B_PR145} (median of the 6 iterations shown of 20; code run = run_code(\"print('Hello, world!')\"))")
    print(f"  {E2B_PR139} (\"Python kernel time taken\", execution time; what it times is not stated)")
    print(f"{'':<58} {'E2B':>10} {'ours p50':>10} {'ratio':>8}")
    for name, figure, ours in [
        ("Sandbox.create() [PR 145]", statistics.median(E2B_CREATE_MS), create),
        ("first run_code after create + health check [PR 145]", statistics.median(E2B_FIRST_RUN_MS), first),
        ("second run_code [PR 145]  vs our warm run_code", statistics.median(E2B_SECOND_RUN_MS), warm),
        ("Python kernel time taken [PR 139]  vs our warm run_code", E2B_PYTHON_KERNEL_MS, warm),
    ]:
        o50 = ms(percentile(ours, 0.5))
        print(f"{name:<58} {figure:>7.2f} ms {o50:>7.2f} ms {o50 / figure:>7.3f}x")
    print(
        "(E2B's first run_code follows a create and a health check, on a sandbox resumed from its template's snapshot, "
        "taken with the template's start command, its Jupyter server, running (https://e2b.dev/docs/template/quickstart); "
        "ours starts the runtime, the context's driver and its kernel)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
