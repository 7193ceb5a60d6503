#!/usr/bin/env python3
"""End-to-end scenarios of warren's E2B API, driven by the official `e2b` Python SDK.

Run by crates/warren/tests/suite/e2b.rs, one scenario per process:

    python scenarios.py <scenario>

with the SDK's own environment (`E2B_API_KEY`, `E2B_API_URL`, `E2B_SANDBOX_URL`) and the
test's (`WARREN_E2B_*`, below). Every scenario asserts results, not just "no exception",
works on every pinned SDK version (2.50.0, from before 2.51, and a current one), creates
sandboxes of its own (tagged with the run's metadata, so parallel runs never see each
other's) and kills them at the end. It prints `SCENARIO PASSED: <name>` when every check
held; any failed check raises, with what was asked and what came back.
"""

import asyncio
import faulthandler
import json
import os
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone
from importlib.metadata import version

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b.sandbox.signature import get_signature

SDK = version("e2b")
API_URL = os.environ["E2B_API_URL"].rstrip("/")
SANDBOX_URL = os.environ["E2B_SANDBOX_URL"].rstrip("/")
API_KEY = os.environ["E2B_API_KEY"]
# A key of another uid (bob): it must see nothing of alice's.
BOB_KEY = os.environ["WARREN_E2B_BOB_KEY"]
# Unique to this run: every sandbox carries it as metadata `run`, every list filters on it.
RUN = os.environ["WARREN_E2B_RUN"]
# Host paths no answer may ever contain (the server's data dir, the planted outside dir).
HOST_PATHS = [p for p in os.environ.get("WARREN_E2B_HOST_PATHS", "").split(os.pathsep) if p]
# A host directory outside every sandbox holding `secret.txt` (and `dir/secret.txt`).
OUTSIDE = os.environ.get("WARREN_E2B_OUTSIDE", "/nonexistent-outside")
SECRET = os.environ.get("WARREN_E2B_SECRET", "TOP-SECRET-E2B")
HOME = "/home/user"

_created = []


# ---------------------------------------------------------------------------------------
# Helpers


def check(condition, what, *context):
    if not condition:
        detail = "".join(f"\n    {c!r}" for c in context)
        raise AssertionError(f"[e2b {SDK}] {what}{detail}")


def check_eq(got, want, what):
    check(got == want, f"{what}: got {got!r}, want {want!r}")


def no_leak(text, what):
    """No secret byte and no host path in anything the server said."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    text = str(text)
    check(SECRET not in text, f"{what} leaked the secret", text[:500])
    for path in HOST_PATHS:
        check(path not in text, f"{what} leaked the host path {path}", text[:500])


def raises(kinds, what, call, *args, **kwargs):
    """Calls `call`, which must raise one of `kinds`; returns the exception."""
    try:
        result = call(*args, **kwargs)
    except AssertionError:
        raise
    except kinds as error:
        no_leak(f"{type(error).__name__}: {error}", what)
        return error
    except Exception as error:  # noqa: BLE001 - named in the failure
        raise AssertionError(
            f"[e2b {SDK}] {what}: raised {type(error).__name__}: {error}, want one of "
            f"{[k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,))]}"
        ) from error
    raise AssertionError(f"[e2b {SDK}] {what}: no exception, returned {result!r}")


def create(scenario, **kwargs):
    metadata = {"run": RUN, "scenario": scenario, **kwargs.pop("metadata", {})}
    kwargs.setdefault("timeout", 180)
    sandbox = Sandbox.create(metadata=metadata, **kwargs)
    _created.append((sandbox.sandbox_id, kwargs.get("api_key")))
    return sandbox


def cleanup():
    for sandbox_id, key in _created:
        try:
            Sandbox.kill(sandbox_id, **({"api_key": key} if key else {}))
        except Exception:  # noqa: BLE001 - best effort
            pass


def listed(query=None, **opts):
    """Every sandbox a list returns, across pages."""
    pager = Sandbox.list(query=query, **opts)
    out = []
    for _ in range(100):
        out.extend(pager.next_items())
        if not pager.has_next:
            break
    return out


def listed_ids(**metadata):
    return {s.sandbox_id for s in listed(SandboxQuery(metadata={"run": RUN, **metadata}))}


def wait_until(condition, within, what, interval=0.25):
    """Polls `condition` until it holds; `what` may be a callable, read when it did not."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"[e2b {SDK}] {what() if callable(what) else what}: not within {within} s")


def http(method, url, headers=None, body=None):
    """A plain HTTP request (no SDK): its status and body."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def multipart(data, name="upload.bin"):
    boundary = uuid.uuid4().hex
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def files_url(path, **query):
    return f"{SANDBOX_URL}/files?" + urllib.parse.urlencode({"path": path, **query})


def envd_headers(sandbox_id, token):
    headers = {"E2b-Sandbox-Id": sandbox_id}
    if token is not None:
        headers["X-Access-Token"] = token
    return headers


def token_of(sandbox):
    token = getattr(sandbox, "_envd_access_token", None)
    check(token, "the sandbox was given an envd access token (envdAccessToken at create)")
    return token


def pids(sandbox):
    return {p.pid for p in sandbox.commands.list()}


def check_error_shape(status, body, want_status, what):
    check_eq(status, want_status, f"{what}: status")
    try:
        parsed = json.loads(body)
    except ValueError:
        raise AssertionError(f"[e2b {SDK}] {what}: body is not JSON: {body[:300]!r}")
    check(
        isinstance(parsed, dict)
        and parsed.get("code") == want_status
        and isinstance(parsed.get("message"), str),
        f"{what}: the body is E2B's error shape {{code: {want_status}, message}}",
        parsed,
    )
    no_leak(body, what)


# ---------------------------------------------------------------------------------------
# Lifecycle: create, connect, list, kill, timeouts, pause and resume


def lifecycle():
    sbx = create("lifecycle", metadata={"role": "main"}, timeout=120)
    sid = sbx.sandbox_id
    check(sid and sid.isalnum(), "a sandbox id of letters and digits", sid)

    info = sbx.get_info()
    check_eq(info.sandbox_id, sid, "get_info's sandbox_id")
    check_eq(info.metadata.get("role"), "main", "get_info's metadata")
    check_eq(info.metadata.get("run"), RUN, "get_info's metadata")
    check_eq(info.state, SandboxState.RUNNING, "get_info's state")
    lifetime = (info.end_at - info.started_at).total_seconds()
    check(110 <= lifetime <= 130, "end_at is started_at + the 120 s timeout", lifetime)
    check(sbx.is_running(), "is_running() of a new sandbox")

    # Connect: the same sandbox, its files and all.
    sbx.files.write(f"{HOME}/marker.txt", f"marker-{sid}")
    again = Sandbox.connect(sid)
    check_eq(again.sandbox_id, sid, "connect's sandbox_id")
    check_eq(again.files.read(f"{HOME}/marker.txt"), f"marker-{sid}", "a file read after connect")
    check_eq(again.commands.run("cat marker.txt").stdout, f"marker-{sid}", "a command after connect")

    # List, filtered by metadata.
    other = create("lifecycle", metadata={"role": "other"}, timeout=120)
    check_eq(listed_ids(scenario="lifecycle", role="main"), {sid}, "list filtered on role=main")
    check_eq(listed_ids(scenario="lifecycle", role="other"), {other.sandbox_id}, "list filtered on role=other")
    check_eq(listed_ids(scenario="lifecycle"), {sid, other.sandbox_id}, "list filtered on the run")
    check_eq(listed_ids(scenario="lifecycle", role="nobody"), set(), "list filtered on an unknown value")
    entry = [s for s in listed(SandboxQuery(metadata={"run": RUN, "role": "main"}))][0]
    check_eq(entry.metadata.get("role"), "main", "a listed sandbox's metadata")
    check_eq(entry.state, SandboxState.RUNNING, "a listed sandbox's state")
    running = listed(SandboxQuery(metadata={"run": RUN}, state=[SandboxState.RUNNING]))
    check_eq({s.sandbox_id for s in running}, {sid, other.sandbox_id}, "list filtered on state running")

    # Kill: True once, then False (404); gone from the list; connect fails.
    check_eq(Sandbox.kill(sid), True, "kill of a live sandbox")
    check_eq(Sandbox.kill(sid), False, "a second kill of the same sandbox")
    check_eq(listed_ids(scenario="lifecycle"), {other.sandbox_id}, "list after kill")
    raises(NotFoundException, "connect to a killed sandbox", Sandbox.connect, sid)
    raises(NotFoundException, "get_info of a killed sandbox", Sandbox.get_info, sid)
    check_eq(Sandbox.kill("idofnosandbox0000000"), False, "kill of an unknown id")
    other.kill()
    check_eq(listed_ids(scenario="lifecycle"), set(), "list after the instance kill")


def listing():
    first = create("listing", metadata={"n": "1"})
    time.sleep(1.2)
    mark = datetime.now(timezone.utc)
    second = create("listing", metadata={"n": "2"})
    ours = SandboxQuery(metadata={"run": RUN, "scenario": "listing"})
    check_eq([s.sandbox_id for s in listed(ours)], [second.sandbox_id, first.sandbox_id],
             "a list is newest first")
    # The server's order, start-time and template filters, as any SDK sends them.
    base = f"{API_URL}/v2/sandboxes?metadata=run%3D{RUN}%26scenario%3Dlisting"
    for query, want in [
        ("&order=asc", [first.sandbox_id, second.sandbox_id]),
        ("&order=desc", [second.sandbox_id, first.sandbox_id]),
        (f"&startedAfter={urllib.parse.quote(mark.isoformat())}", [second.sandbox_id]),
        ("&template=base", [second.sandbox_id, first.sandbox_id]),
        ("&template=no-such-template", []),
    ]:
        status, body = http("GET", base + query, {"X-API-Key": API_KEY})
        check_eq(status, 200, f"GET /v2/sandboxes{query}")
        check_eq([s["sandboxID"] for s in json.loads(body)], want, f"GET /v2/sandboxes{query}")
    status, body = http("GET", base + "&order=sideways", {"X-API-Key": API_KEY})
    check_error_shape(status, body, 400, "an order that is not asc or desc")
    if "started_after" in getattr(SandboxQuery, "__dataclass_fields__", {}):
        after = SandboxQuery(metadata={"run": RUN, "scenario": "listing"}, started_after=mark)
        check_eq([s.sandbox_id for s in listed(after)], [second.sandbox_id],
                 "the SDK's started_after filter")
        check_eq([s.sandbox_id for s in listed(ours, order="asc")],
                 [first.sandbox_id, second.sandbox_id], "the SDK's ascending order")
        of_template = SandboxQuery(metadata={"run": RUN, "scenario": "listing"}, template="nope")
        check_eq(listed(of_template), [], "the SDK's template filter")
    else:
        print(f"e2b {SDK} has no started_after, order or template in its list: checked over HTTP",
              flush=True)


def errors():
    # An unknown template: 404 in E2B's error shape, which the SDK turns into an exception.
    error = raises(SandboxException, "create from an unknown template", Sandbox.create,
                   "no-such-template-warren", metadata={"run": RUN})
    check("404" in str(error) or getattr(error, "status_code", None) == 404,
          "the unknown template is a 404", str(error))
    status, body = http("POST", f"{API_URL}/sandboxes",
                        {"X-API-Key": API_KEY, "Content-Type": "application/json"},
                        json.dumps({"templateID": "no-such-template-warren"}).encode())
    check_error_shape(status, body, 404, "POST /sandboxes with an unknown template")
    check_eq(listed_ids(), set(), "no sandbox was made by the failed creates")

    # A wrong key: 401, AuthenticationException; a malformed one too.
    for bad in ["e2b_" + "0" * 40, "not-a-key"]:
        raises(AuthenticationException, f"create with the key {bad!r}", Sandbox.create,
               api_key=bad, metadata={"run": RUN})
        raises(AuthenticationException, f"list with the key {bad!r}", listed, api_key=bad)
        status, body = http("GET", f"{API_URL}/v2/sandboxes", {"X-API-Key": bad})
        check_error_shape(status, body, 401, f"GET /v2/sandboxes with the key {bad!r}")
    status, body = http("GET", f"{API_URL}/v2/sandboxes")
    check_error_shape(status, body, 401, "GET /v2/sandboxes without a key")
    status, body = http("GET", f"{API_URL}/sandboxes/idofnosandbox0000000", {"X-API-Key": API_KEY})
    check_error_shape(status, body, 404, "GET /sandboxes/<unknown>")
    status, body = http("DELETE", f"{API_URL}/sandboxes/idofnosandbox0000000", {"X-API-Key": API_KEY})
    check_error_shape(status, body, 404, "DELETE /sandboxes/<unknown>")


def timeout_expiry():
    started = time.monotonic()
    sbx = create("timeout", timeout=3)
    sid = sbx.sandbox_id
    check_eq(listed_ids(scenario="timeout"), {sid}, "a sandbox created with timeout=3 is listed")
    check_eq(sbx.commands.run("echo alive").stdout, "alive\n", "a command before the deadline")
    wait_until(lambda: sid not in listed_ids(scenario="timeout"), 30,
               "the sandbox leaves the list once its 3 s timeout expired")
    check(time.monotonic() - started >= 2.5, "the sandbox lived until its deadline",
          time.monotonic() - started)
    raises(NotFoundException, "connect after the timeout expired", Sandbox.connect, sid)
    raises(Exception, "a command in an expired sandbox", sbx.commands.run, "true", timeout=10)
    check_eq(Sandbox.kill(sid), False, "kill after the timeout expired")


def set_timeout():
    sbx = create("set-timeout", timeout=4)
    sid = sbx.sandbox_id
    sbx.set_timeout(120)
    end_at = sbx.get_info().end_at
    left = (end_at - datetime.now(timezone.utc)).total_seconds()
    check(100 <= left <= 125, "set_timeout(120) moves end_at 120 s ahead", left)
    time.sleep(6)
    check_eq(listed_ids(scenario="set-timeout"), {sid}, "the sandbox outlives its first 4 s timeout")
    check_eq(sbx.commands.run("echo still-here").stdout, "still-here\n", "a command after 6 s")
    # The class-method variant, shortening it: a real deadline, the sandbox goes.
    Sandbox.set_timeout(sid, 2)
    wait_until(lambda: sid not in listed_ids(scenario="set-timeout"), 30,
               "the sandbox is gone once the shortened 2 s timeout expired")
    raises(NotFoundException, "connect after the shortened timeout", Sandbox.connect, sid)
    raises(NotFoundException, "set_timeout of a gone sandbox", Sandbox.set_timeout, sid, 30)


def pause_resume():
    sbx = create("pause", timeout=180)
    sid = sbx.sandbox_id
    sbx.files.write(f"{HOME}/kept/before-pause.txt", "written before pause")
    sbx.commands.run("mkdir -p ~/.local/bin && printf '#!/bin/sh\\necho tool-ok\\n' > ~/.local/bin/mytool "
                     "&& chmod +x ~/.local/bin/mytool")
    sleeper = sbx.commands.run("sleep 300", background=True)
    check(sleeper.pid in pids(sbx), "the background sleep runs before pause")

    check_eq(sbx.pause(), True, "pause of a running sandbox")
    paused = listed(SandboxQuery(metadata={"run": RUN, "scenario": "pause"}))
    check_eq([(s.sandbox_id, s.state) for s in paused], [(sid, SandboxState.PAUSED)],
             "the paused sandbox is listed as paused")
    only_running = listed(SandboxQuery(metadata={"run": RUN, "scenario": "pause"},
                                       state=[SandboxState.RUNNING]))
    check_eq(only_running, [], "a paused sandbox is not in the list of running ones")
    check_eq(Sandbox.pause(sid), False, "pause of a paused sandbox (409)")

    resumed = Sandbox.connect(sid)
    check_eq(resumed.sandbox_id, sid, "connect resumes the same sandbox")
    check(resumed.is_running(), "is_running() after connect resumed the sandbox")
    check_eq(resumed.get_info().state, SandboxState.RUNNING, "the state after resume")
    check_eq(resumed.files.read(f"{HOME}/kept/before-pause.txt"), "written before pause",
             "a file written before pause, read after resume")
    check_eq(resumed.commands.run("~/.local/bin/mytool").stdout, "tool-ok\n",
             "an installed program in the home survives pause")
    check(sleeper.pid not in pids(resumed), "the process running at pause is gone after resume",
          [(p.pid, p.cmd, p.args) for p in resumed.commands.list()])
    probe = resumed.commands.run("pgrep -f 'slee[p] 300' || echo none")
    check_eq(probe.stdout.strip(), "none", "no 'sleep 300' runs after resume")
    check_eq(resumed.commands.run("echo resumed").stdout, "resumed\n", "a command after resume")


def snapshots():
    src = create("snapshots", timeout=180)
    src.files.write(f"{HOME}/kept/in-home.txt", "kept by the snapshot")
    # Outside the home, where the sandbox user may write (commands never run as root).
    outside = src.commands.run(
        "for d in /usr/local/share /usr/local /opt /var/tmp; do "
        "if mkdir -p $d/warren-snap 2>/dev/null && echo pkg > $d/warren-snap/f; then "
        "echo $d/warren-snap/f; break; fi; done").stdout.strip()
    check(outside.startswith("/") and not outside.startswith(HOME),
          "a file written outside the home", outside)
    name = f"snap-{RUN}"[:100].lower()
    info = src.create_snapshot(name=name)
    check(info.snapshot_id, "create_snapshot gives a snapshot id", info)
    check_eq(list(info.names), [name], "create_snapshot gives the names it was asked for")
    raises(Exception, "a second snapshot with a taken name (409)", src.create_snapshot, name=name)
    src.kill()

    for template in [info.snapshot_id, name]:
        made = create("snapshots", template=template, timeout=120)
        print(f"installed outside the home: {outside}")
        check_eq(made.files.read(f"{HOME}/kept/in-home.txt"), "kept by the snapshot",
                 f"the home's file in a sandbox made from the snapshot ({template})")
        check_eq(made.commands.run(f"cat {outside}").stdout, "pkg\n",
                 f"a file installed outside the home comes back ({template})")
        made.kill()

    ids = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
    check(info.snapshot_id in ids, "list_snapshots shows the snapshot", ids)
    by_source = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items()]
    check_eq(by_source, [info.snapshot_id], "list_snapshots filtered by the source sandbox")
    bob_ids = [s.snapshot_id for s in Sandbox.list_snapshots(api_key=BOB_KEY).next_items()]
    check(info.snapshot_id not in bob_ids, "bob does not list alice's snapshot", bob_ids)
    for template in [info.snapshot_id, name]:
        error = raises(SandboxException, f"bob creates a sandbox from alice's snapshot ({template})",
                       create, "snapshots", template=template, api_key=BOB_KEY)
        check("404" in str(error), "another uid's snapshot is a 404 like an unknown template",
              str(error))
    check_eq(Sandbox.delete_snapshot(info.snapshot_id, api_key=BOB_KEY), False,
             "bob deletes alice's snapshot")

    check_eq(Sandbox.delete_snapshot(info.snapshot_id), True, "delete_snapshot")
    check_eq(Sandbox.delete_snapshot(info.snapshot_id), False, "delete_snapshot again (404)")
    error = raises(SandboxException, "a sandbox from a deleted snapshot", create, "snapshots",
                   template=info.snapshot_id)
    check("404" in str(error), "a deleted snapshot is a 404 like an unknown template", str(error))
    ids = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
    check(info.snapshot_id not in ids, "a deleted snapshot is not listed", ids)


# ---------------------------------------------------------------------------------------
# Commands


def foreground():
    sbx = create("foreground")
    result = sbx.commands.run("echo out; echo err >&2")
    check_eq((result.stdout, result.stderr, result.exit_code), ("out\n", "err\n", 0),
             "stdout, stderr and exit code of a command")
    chunks = []
    sbx.commands.run("echo a; sleep 0.2; echo b", on_stdout=chunks.append)
    check_eq("".join(chunks), "a\nb\n", "on_stdout receives the output")

    error = raises(CommandExitException, "a command exiting 3", sbx.commands.run,
                   "echo partial; echo bad >&2; exit 3")
    check_eq((error.exit_code, error.stdout, error.stderr), (3, "partial\n", "bad\n"),
             "CommandExitException carries the exit code and output")

    who = sbx.commands.run("id -u; id -un; echo $HOME; pwd").stdout.split()
    check_eq(who, ["1000", "user", HOME, HOME], "commands run as user (1000) in /home/user")
    big = sbx.commands.run("seq 1 20000").stdout.splitlines()
    check_eq((len(big), big[0], big[-1]), (20000, "1", "20000"), "a long output arrives whole")
    text = sbx.commands.run("printf 'h\\303\\251llo \\342\\234\\223'").stdout
    check_eq(text, "héllo ✓", "UTF-8 output")
    check_eq(sbx.commands.run("exit 0").exit_code, 0, "an empty command's exit code")

    error = raises(Exception, "a command as root", sbx.commands.run, "id -u", user="root")
    check(not isinstance(error, AssertionError), "root is refused", error)


def background():
    sbx = create("background")
    handle = sbx.commands.run("echo one; sleep 1; echo two", background=True)
    check(isinstance(handle.pid, int) and handle.pid > 0, "a background command has a pid", handle.pid)
    result = handle.wait()
    check_eq((result.stdout, result.exit_code), ("one\ntwo\n", 0), "wait() of a background command")

    sleeper = sbx.commands.run("sleep 30", background=True)
    listing = sbx.commands.list()
    mine = [p for p in listing if p.pid == sleeper.pid]
    check(mine, "commands.list() shows the running command",
          [(p.pid, p.cmd, p.args) for p in listing])
    check("sleep 30" in " ".join([mine[0].cmd, *mine[0].args]), "its command line", mine[0])
    check_eq(sleeper.kill(), True, "kill() of a running command")
    error = raises(CommandExitException, "wait() of a killed command", sleeper.wait)
    check(error.exit_code != 0, "a killed command does not exit 0", error.exit_code)
    wait_until(lambda: sleeper.pid not in pids(sbx), 10, "the killed command leaves commands.list()")

    other = sbx.commands.run("sleep 30", background=True)
    check_eq(sbx.commands.kill(other.pid), True, "commands.kill(pid)")
    wait_until(lambda: other.pid not in pids(sbx), 10, "commands.kill'ed command leaves the list")
    check_eq(sbx.commands.kill(other.pid), False, "commands.kill of a gone pid")
    check_eq(sbx.commands.kill(999999), False, "commands.kill of an unknown pid")


def stdin():
    sbx = create("stdin")
    handle = sbx.commands.run("cat; echo done-$((6*7))", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "hello ")
    sbx.commands.send_stdin(handle.pid, "world\n")
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    check_eq(result.stdout, "hello world\ndone-42\n", "stdin reaches the command, close ends it")

    wc = sbx.commands.run("wc -c", background=True, stdin=True)
    wc.send_stdin("12345")
    wc.close_stdin()
    check_eq(wc.wait().stdout.strip(), "5", "send_stdin/close_stdin on the handle")


def connect_running():
    sbx = create("connect")
    handle = sbx.commands.run("for i in 1 2 3 4; do echo tick$i; sleep 1; done; exit 7",
                              background=True)
    pid = handle.pid
    time.sleep(1.2)
    handle.disconnect()
    check(pid in pids(sbx), "the command still runs after disconnect")
    attached = sbx.commands.connect(pid)
    error = raises(CommandExitException, "wait() of the connected command", attached.wait)
    check_eq(error.exit_code, 7, "the connected command's exit code")
    check("tick4" in error.stdout, "output after connect reaches the new handle", error.stdout)
    raises(Exception, "connect to an unknown pid", lambda: sbx.commands.connect(999999).wait())


def envs():
    sbx = create("envs", envs={"SBX_VAR": "from-create", "SHARED": "sandbox"})
    check_eq(sbx.commands.run("echo $SBX_VAR $SHARED").stdout, "from-create sandbox\n",
             "sandbox envs reach every command")
    out = sbx.commands.run("echo $SBX_VAR $SHARED $CMD_VAR",
                           envs={"CMD_VAR": "from-cmd", "SHARED": "command"}).stdout
    check_eq(out, "from-create command from-cmd\n", "command envs add to and override the sandbox's")
    check_eq(sbx.commands.run("echo ${CMD_VAR:-unset}").stdout, "unset\n",
             "a command's envs do not stick")
    again = Sandbox.connect(sbx.sandbox_id)
    check_eq(again.commands.run("echo $SBX_VAR").stdout, "from-create\n", "sandbox envs after connect")


def cwd():
    sbx = create("cwd")
    check_eq(sbx.files.make_dir(f"{HOME}/sub/dir"), True, "make_dir of nested dirs")
    check_eq(sbx.commands.run("pwd", cwd=f"{HOME}/sub/dir").stdout, f"{HOME}/sub/dir\n", "pwd in cwd")
    sbx.commands.run("echo here > made-here", cwd=f"{HOME}/sub/dir")
    check_eq(sbx.files.read(f"{HOME}/sub/dir/made-here"), "here\n", "a file made in the cwd")
    check_eq(sbx.commands.run("pwd").stdout, f"{HOME}\n", "the default cwd is the home")
    # A process may start anywhere in its runtime; only the file API is bounded.
    for anywhere in ["/", "/tmp", "/usr/bin"]:
        check_eq(sbx.commands.run("pwd", cwd=anywhere).stdout, f"{anywhere}\n", f"pwd in {anywhere}")
    check_eq(sbx.commands.run("ls -d bin", cwd="/").stdout, "bin\n", "a relative path from /")
    raises(Exception, "a cwd that does not exist", sbx.commands.run, "pwd", cwd=f"{HOME}/nope")


def command_timeout():
    sbx = create("cmd-timeout")
    started = time.monotonic()
    raises(TimeoutException, "a command exceeding timeout=2", sbx.commands.run, "sleep 30", timeout=2)
    elapsed = time.monotonic() - started
    check(1.5 <= elapsed <= 15, "the timeout fired after about 2 s", elapsed)
    check_eq(sbx.commands.run("echo after").stdout, "after\n", "the sandbox works after a timeout")
    handle = sbx.commands.run("sleep 30", background=True, timeout=2)
    raises(TimeoutException, "wait() of a background command past its timeout", handle.wait)


# ---------------------------------------------------------------------------------------
# Files


def files():
    sbx = create("files")
    info = sbx.files.write(f"{HOME}/a.txt", "hello")
    check_eq((info.path, info.name), (f"{HOME}/a.txt", "a.txt"), "write's WriteInfo")
    check_eq(sbx.files.read(f"{HOME}/a.txt"), "hello", "read as text")
    binary = bytes(range(256)) * 4
    sbx.files.write(f"{HOME}/bin.dat", binary)
    check_eq(bytes(sbx.files.read(f"{HOME}/bin.dat", format="bytes")), binary, "read as bytes")
    sbx.files.write("relative.txt", "rel")
    check_eq(sbx.files.read(f"{HOME}/relative.txt"), "rel", "a relative path is relative to the home")
    sbx.files.write(f"{HOME}/deep/er/file.txt", "deep")
    check_eq(sbx.files.read(f"{HOME}/deep/er/file.txt"), "deep", "write makes the parent dirs")
    check_eq(sbx.commands.run("cat a.txt").stdout, "hello", "a written file, seen by a command")
    sbx.commands.run("echo from-cmd > cmd.txt")
    check_eq(sbx.files.read(f"{HOME}/cmd.txt"), "from-cmd\n", "a command's file, read")
    sbx.files.write(f"{HOME}/a.txt", "replaced")
    check_eq(sbx.files.read(f"{HOME}/a.txt"), "replaced", "write replaces a file")

    stat = sbx.files.get_info(f"{HOME}/a.txt")
    check_eq((stat.name, stat.path, stat.type, stat.size), ("a.txt", f"{HOME}/a.txt", FileType.FILE, 8),
             "get_info of a file")
    check_eq(stat.owner, "user", "the owner of a written file")
    dir_stat = sbx.files.get_info(f"{HOME}/deep")
    check_eq(dir_stat.type, FileType.DIR, "get_info of a dir")
    check(isinstance(stat.modified_time, datetime), "modified_time", stat.modified_time)
    # A link is described, never followed: not even to a file outside the home.
    sbx.commands.run("ln -s /etc/passwd outside-link && ln -s a.txt inside-link")
    for name, target in [("outside-link", "/etc/passwd"), ("inside-link", "a.txt")]:
        link = sbx.files.get_info(f"{HOME}/{name}")
        check_eq((link.type, link.symlink_target), (FileType.SYMLINK, target), f"get_info of {name}")
    raises(Exception, "a read through a link", sbx.files.read, f"{HOME}/outside-link")
    sbx.commands.run("rm outside-link inside-link")

    names = {e.name: e.type for e in sbx.files.list(HOME)}
    for name, kind in [("a.txt", FileType.FILE), ("bin.dat", FileType.FILE), ("deep", FileType.DIR)]:
        check_eq(names.get(name), kind, f"list shows {name}")
    check("file.txt" not in names, "list at depth 1 stays at one level", names)
    deep = {e.path for e in sbx.files.list(f"{HOME}/deep", depth=2)}
    check_eq(deep, {f"{HOME}/deep/er", f"{HOME}/deep/er/file.txt"}, "list at depth 2")

    check_eq(sbx.files.exists(f"{HOME}/a.txt"), True, "exists of a file")
    check_eq(sbx.files.exists(f"{HOME}/nope.txt"), False, "exists of a missing file")
    raises(NotFoundException, "read of a missing file", sbx.files.read, f"{HOME}/nope.txt")
    raises(NotFoundException, "get_info of a missing file", sbx.files.get_info, f"{HOME}/nope.txt")

    moved = sbx.files.rename(f"{HOME}/a.txt", f"{HOME}/deep/b.txt")
    check_eq((moved.path, moved.name), (f"{HOME}/deep/b.txt", "b.txt"), "rename's EntryInfo")
    check_eq(sbx.files.exists(f"{HOME}/a.txt"), False, "the old name after rename")
    check_eq(sbx.files.read(f"{HOME}/deep/b.txt"), "replaced", "the new name after rename")

    sbx.files.remove(f"{HOME}/deep/b.txt")
    check_eq(sbx.files.exists(f"{HOME}/deep/b.txt"), False, "a removed file")
    sbx.files.remove(f"{HOME}/deep")
    check_eq(sbx.files.exists(f"{HOME}/deep/er/file.txt"), False, "a removed dir, recursively")

    check_eq(sbx.files.make_dir(f"{HOME}/newdir"), True, "make_dir of a new dir")
    check_eq(sbx.files.make_dir(f"{HOME}/newdir"), False, "make_dir of an existing dir")
    check_eq(sbx.files.get_info(f"{HOME}/newdir").type, FileType.DIR, "the made dir")


def watch():
    sbx = create("watch")

    # The streaming variant (filesystem.WatchDir) through the async SDK.
    async def streaming():
        async_sbx = await AsyncSandbox.connect(sbx.sandbox_id)
        await async_sbx.files.make_dir(f"{HOME}/streamed")
        events = []
        stream = await async_sbx.files.watch_dir(f"{HOME}/streamed", on_event=events.append)
        await async_sbx.files.write(f"{HOME}/streamed/s.txt", "y")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e.name == "s.txt" for e in events):
            await asyncio.sleep(0.1)
        await stream.stop()
        return events

    events = asyncio.run(streaming())
    check(any(e.name == "s.txt" and e.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE)
              for e in events), "the streaming watch_dir reports s.txt", events)

    # The watcher trio (CreateWatcher, GetWatcherEvents, RemoveWatcher), polled.
    sbx.files.make_dir(f"{HOME}/watched")
    handle = sbx.files.watch_dir(f"{HOME}/watched")
    seen = []

    def saw(name, *kinds):
        def condition():
            seen.extend(handle.get_new_events())
            return set(kinds) <= {e.type for e in seen if e.name == name}
        wait_until(condition, 10, lambda: f"watch_dir reports {[k.value for k in kinds]} of {name} "
                   f"(get_new_events gave {[(e.name, e.type.value) for e in seen]})")

    sbx.files.write(f"{HOME}/watched/new.txt", "x")
    saw("new.txt", FilesystemEventType.WRITE)
    # A write of a new file is what envd shows for it, in its order (E2B's own SDK tests
    # count these three): made, owner and mode set, written.
    check_eq([(e.name, e.type) for e in seen if e.name == "new.txt"],
             [("new.txt", FilesystemEventType.CREATE), ("new.txt", FilesystemEventType.CHMOD),
              ("new.txt", FilesystemEventType.WRITE)], "the events of a write of a new file")
    sbx.commands.run(f"echo more >> {HOME}/watched/new.txt; rm {HOME}/watched/new.txt")
    saw("new.txt", FilesystemEventType.REMOVE)
    # A file made and removed between two polls: both events are still reported.
    sbx.commands.run(f"echo brief > {HOME}/watched/brief.txt; rm {HOME}/watched/brief.txt")
    saw("brief.txt", FilesystemEventType.CREATE, FilesystemEventType.REMOVE)
    try:
        handle.stop(request_timeout=10)
    except TimeoutException as error:
        raise AssertionError(f"[e2b {SDK}] WatchHandle.stop (RemoveWatcher) got no answer within 10 s") from error
    raises(Exception, "get_new_events after stop", handle.get_new_events)


def write_files():
    sbx = create("write-files")
    infos = sbx.files.write_files([
        {"path": f"{HOME}/multi/one.txt", "data": "first"},
        {"path": f"{HOME}/multi/two.bin", "data": b"\x00\x01\x02second"},
        {"path": f"{HOME}/multi/nested/three.txt", "data": "third"},
    ])
    check_eq(sorted(i.path for i in infos),
             sorted([f"{HOME}/multi/one.txt", f"{HOME}/multi/two.bin", f"{HOME}/multi/nested/three.txt"]),
             "write_files returns one WriteInfo per file")
    check_eq(sbx.files.read(f"{HOME}/multi/one.txt"), "first", "the first file")
    check_eq(bytes(sbx.files.read(f"{HOME}/multi/two.bin", format="bytes")), b"\x00\x01\x02second",
             "the second file")
    check_eq(sbx.files.read(f"{HOME}/multi/nested/three.txt"), "third", "the third file")


def signed_urls():
    sbx = create("signed")
    token_of(sbx)
    sbx.files.write(f"{HOME}/dl.txt", "download me")
    for expiration in (60, None):
        url = sbx.download_url(f"{HOME}/dl.txt", use_signature_expiration=expiration)
        check(url.startswith(SANDBOX_URL + "/files?") and "signature=" in url,
              "a signed download URL on the sandbox URL", url)
        check(sbx.sandbox_id not in url, "the signed URL names no sandbox", url)
        status, body = http("GET", url)
        check_eq((status, body), (200, b"download me"), f"GET of the signed URL (expiration {expiration})")

    url = sbx.upload_url(f"{HOME}/up/uploaded.bin", use_signature_expiration=60)
    payload = b"uploaded\x00bytes"
    body, headers = multipart(payload)
    status, answer = http("POST", url, headers, body)
    check(200 <= status < 300, "POST to the signed upload URL", status, answer)
    check_eq(bytes(sbx.files.read(f"{HOME}/up/uploaded.bin", format="bytes")), payload, "the uploaded file")


# ---------------------------------------------------------------------------------------
# PTY


class PtyReader:
    def __init__(self, handle):
        self.handle = handle
        self.output = bytearray()
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.error = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            for _stdout, _stderr, pty in self.handle:
                if pty:
                    with self.lock:
                        self.output.extend(pty)
        except Exception as error:  # noqa: BLE001 - reported by the check that needs it
            self.error = error
        finally:
            self.finished.set()

    def text(self):
        with self.lock:
            return bytes(self.output).decode("utf-8", "replace")

    def wait_for(self, needle, within=10):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            time.sleep(0.05)
        raise AssertionError(f"[e2b {SDK}] the PTY did not show {needle!r} within {within} s; "
                             f"it showed: {self.text()[-800:]!r} (error: {self.error!r})")


def pty():
    sbx = create("pty")
    handle = sbx.pty.create(PtySize(rows=24, cols=80), envs={"PTY_VAR": "pty-env"})
    check(isinstance(handle.pid, int) and handle.pid > 0, "a PTY has a pid", handle.pid)
    reader = PtyReader(handle)
    send = lambda text: sbx.pty.send_stdin(handle.pid, text.encode())  # noqa: E731

    send("echo hi-$((40+2)) $PTY_VAR\n")
    reader.wait_for("hi-42 pty-env")
    send("stty size\n")
    reader.wait_for("24 80")
    sbx.pty.resize(handle.pid, PtySize(rows=40, cols=100))
    send("stty size\n")
    reader.wait_for("40 100")
    send("tty; id -un\n")
    reader.wait_for("/dev/pts/")

    send("sleep 100\n")
    time.sleep(1)
    send("\x03")
    send("echo after-$((2+3))\n")
    reader.wait_for("after-5", within=8)

    check(handle.pid in pids(sbx), "the PTY's shell is in commands.list()")
    check_eq(sbx.pty.kill(handle.pid), True, "pty.kill of the running PTY")
    check(reader.finished.wait(10), "the PTY's stream ends once it is killed")
    wait_until(lambda: handle.pid not in pids(sbx), 10, "the killed PTY leaves commands.list()")


def replicas():
    """A sandbox made through one replica of a cluster, its commands and terminal driven
    through another: the runtime's owner runs them, the other replica forwards every call
    (run with `WARREN_E2B_OTHER_URL` and `WARREN_E2B_OTHER_KEY`, the other replica's E2B
    listener and alice's key there)."""
    other = {
        "api_key": os.environ["WARREN_E2B_OTHER_KEY"],
        "api_url": os.environ["WARREN_E2B_OTHER_URL"],
        "sandbox_url": os.environ["WARREN_E2B_OTHER_URL"],
    }
    here = create("replicas")
    check_eq(here.commands.run("echo claimed").stdout, "claimed\n", "a command through the first replica")
    sbx = Sandbox.connect(here.sandbox_id, **other)
    check_eq(sbx.commands.run("echo $((6*7))").stdout, "42\n", "a command through the other replica")

    handle = sbx.commands.run("cat; echo done-$((6*7))", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "through the other replica\n")
    sbx.commands.close_stdin(handle.pid)
    check_eq(handle.wait().stdout, "through the other replica\ndone-42\n",
             "stdin and output of a background command through the other replica")

    sleeper = sbx.commands.run("sleep 300", background=True)
    check(sleeper.pid in pids(sbx), "the other replica lists the owner's command")
    check(sleeper.pid in pids(here), "the first replica lists it too")
    check_eq(sbx.commands.kill(sleeper.pid), True, "commands.kill through the other replica")
    wait_until(lambda: sleeper.pid not in pids(here), 10, "the killed command leaves the list")

    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    reader = PtyReader(terminal)
    sbx.pty.send_stdin(terminal.pid, b"echo hi-$((40+2))\n")
    reader.wait_for("hi-42")
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"stty size\n")
    reader.wait_for("40 100")
    check_eq(sbx.pty.kill(terminal.pid), True, "pty.kill through the other replica")
    check(reader.finished.wait(10), "the PTY's stream ends once it is killed")


# ---------------------------------------------------------------------------------------
# Boundaries: other users, envd credentials, and the path-attack corpus


def other_users():
    alice = create("users", timeout=120)
    alice.files.write(f"{HOME}/mine.txt", SECRET)
    bob = create("users", api_key=BOB_KEY, timeout=120)
    sid = alice.sandbox_id

    raises(NotFoundException, "bob connects to alice's sandbox", Sandbox.connect, sid, api_key=BOB_KEY)
    raises(NotFoundException, "bob's get_info of alice's sandbox", Sandbox.get_info, sid, api_key=BOB_KEY)
    raises(NotFoundException, "bob's set_timeout of alice's sandbox",
           Sandbox.set_timeout, sid, 1, api_key=BOB_KEY)
    raises(NotFoundException, "bob pauses alice's sandbox", Sandbox.pause, sid, api_key=BOB_KEY)
    check_eq(Sandbox.kill(sid, api_key=BOB_KEY), False, "bob kills alice's sandbox")
    check_eq(listed_ids(scenario="users"), {sid}, "alice lists only her own sandbox")
    check_eq({s.sandbox_id for s in listed(SandboxQuery(metadata={"run": RUN}), api_key=BOB_KEY)},
             {bob.sandbox_id}, "bob lists only his own sandbox")
    check_eq(alice.commands.run("echo unharmed").stdout, "unharmed\n", "alice's sandbox still runs")
    left = (alice.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    check(left > 60, "bob's set_timeout did not shorten alice's sandbox", left)

    # envd: bob's own token does not open alice's sandbox.
    for headers in [envd_headers(sid, token_of(bob)), envd_headers(sid, None)]:
        status, body = http("GET", files_url(f"{HOME}/mine.txt", username="user"), headers)
        check(status in (401, 403, 404), "alice's file with bob's token (or none)", status, body[:200])
        no_leak(body, "alice's file with bob's token")
    for path in ["/sandboxes", f"/sandboxes/{sid}", "/v2/sandboxes"]:
        status, body = http("GET", API_URL + path, {"X-API-Key": BOB_KEY})
        check(sid not in body.decode("utf-8", "replace") or status == 404,
              f"bob's GET {path} does not show alice's sandbox", status, body[:300])
    status, body = http("GET", f"{API_URL}/sandboxes/{sid}", {"X-API-Key": BOB_KEY})
    check_error_shape(status, body, 404, "bob's GET /sandboxes/<alice's>")


def envd_credentials():
    sbx = create("credentials")
    token = token_of(sbx)
    sid = sbx.sandbox_id
    sbx.files.write(f"{HOME}/public.txt", "public")
    sbx.files.write(f"{HOME}/private.txt", "PRIVATE " + SECRET)
    sibling = create("credentials")
    sibling.files.write(f"{HOME}/sibling-only.txt", "SIBLING " + SECRET)

    # The right token works (the control), a wrong or missing one is 401.
    status, body = http("GET", files_url(f"{HOME}/public.txt", username="user"), envd_headers(sid, token))
    check_eq((status, body), (200, b"public"), "GET /files with the right token")
    for bad in ["0" * 64, "", token[:-1] + ("0" if token[-1] != "0" else "1"), token_of(sibling)]:
        headers = envd_headers(sid, bad if bad else None)
        status, body = http("GET", files_url(f"{HOME}/private.txt", username="user"), headers)
        check_eq(status, 401, f"GET /files with the token {bad[:8]!r}…")
        no_leak(body, "GET /files with a wrong token")
        for service, message in [("filesystem.Filesystem/Stat", {"path": f"{HOME}/private.txt"}),
                                 ("process.Process/List", {})]:
            status, body = http("POST", f"{SANDBOX_URL}/{service}",
                                {**headers, "Content-Type": "application/json",
                                 "Connect-Protocol-Version": "1"},
                                json.dumps(message).encode())
            check_eq(status, 401, f"{service} with a wrong token")
            no_leak(body, f"{service} with a wrong token")
        body_, ctype = multipart(b"PWNED")
        status, body = http("POST", files_url(f"{HOME}/private.txt", username="user"),
                            {**headers, **ctype}, body_)
        check_eq(status, 401, "POST /files with a wrong token")
    check_eq(sbx.files.read(f"{HOME}/private.txt"), "PRIVATE " + SECRET, "no wrong-token upload landed")

    # A signature for one path does not open another, nor another operation, nor after expiry.
    url = sbx.download_url(f"{HOME}/public.txt", use_signature_expiration=60)
    check_eq(http("GET", url), (200, b"public"), "the signed URL itself (the control)")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    swapped = files_url(f"{HOME}/private.txt", **{k: v for k, v in query.items() if k != "path"})
    status, body = http("GET", swapped)
    check(status in (401, 403), "a signature of public.txt used for private.txt", status, body[:200])
    no_leak(body, "a signature of another path")
    upload = multipart(b"PWNED")
    status, body = http("POST", url, upload[1], upload[0])
    check(status in (401, 403), "a read signature used to upload", status, body[:200])
    expired = get_signature(f"{HOME}/public.txt", "read", None, token, -30)
    status, body = http("GET", files_url(f"{HOME}/public.txt", signature=expired["signature"],
                                         signature_expiration=str(expired["expiration"])))
    # envd's answers, word for word: E2B's SDK tests and users match on them.
    check_eq((status, json.loads(body)), (401, {"code": 401, "message": "signature is already expired"}),
             "an expired signature")
    forged = files_url(f"{HOME}/public.txt", signature="v1_" + "A" * 43)
    status, body = http("GET", forged)
    check_eq((status, json.loads(body)), (401, {"code": 401, "message": "invalid signature"}),
             "a made-up signature")
    up_url = sbx.upload_url(f"{HOME}/upload-here.txt", use_signature_expiration=60)
    up_query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(up_url).query))
    moved = files_url(f"{HOME}/private.txt", **{k: v for k, v in up_query.items() if k != "path"})
    status, body = http("POST", moved, upload[1], upload[0])
    check(status in (401, 403), "an upload signature used for another path", status, body[:200])
    check_eq(sbx.files.read(f"{HOME}/private.txt"), "PRIVATE " + SECRET, "private.txt unchanged")

    # A signature of one sandbox does not open another: alice's sibling sandbox.
    mine = get_signature(f"{HOME}/sibling-only.txt", "read", None, token, 60)
    signed = files_url(f"{HOME}/sibling-only.txt", signature=mine["signature"],
                       signature_expiration=str(mine["expiration"]))
    status, body = http("GET", signed, {"E2b-Sandbox-Id": sibling.sandbox_id})
    check(status in (401, 403), "a signature of one sandbox sent to another", status, body[:200])
    no_leak(body, "a signature of another sandbox")
    status, body = http("GET", signed)
    check(status != 200 and b"SIBLING" not in body, "the signature resolves to its own sandbox only",
          status, body[:200])
    no_leak(body, "a signature of another sandbox")


def attack_corpus(sibling_id, bob_id):
    """Paths that must never reach outside the sandbox's own home (/home/user)."""
    up = lambda n: "../" * n  # noqa: E731
    paths = [
        "..", "../", f"{HOME}/..", f"{HOME}/../..",
        "../../../../../../etc/passwd", f"{HOME}/../../etc/shadow", f"{HOME}/../../../etc/passwd",
        f"{HOME}/etc-link/shadow", f"{HOME}/etc-link/passwd", f"{HOME}/etc-link",
        f"{HOME}/abs_link/secret.txt", f"{HOME}/abs_link", f"{HOME}/last_link",
        f"{HOME}/rel_link/etc/passwd", f"{HOME}/proc_root/etc/shadow", f"{HOME}/proc_cwd",
        f"{HOME}/real/mid_link/secret.txt", "abs_link/secret.txt", "etc-link/passwd",
        f"{HOME}/nul\0byte",
        f"{HOME}/" + "a" * 300,
        "/".join(["abcdefgh"] * 600),
    ]
    for depth in range(1, 6):
        paths.append(f"{HOME}/{up(depth)}{sibling_id}/secret.txt")
        paths.append(f"{HOME}/{up(depth)}e2b/{sibling_id}/secret.txt")
        paths.append(f"{HOME}/{up(depth)}{bob_id}/secret.txt")
        paths.append(f"{HOME}/{up(depth)}bob/workspace/e2b/{bob_id}/secret.txt")
    return paths


def path_attacks():
    attacker = create("attacks")
    sibling = create("attacks")
    bob = create("attacks", api_key=BOB_KEY)
    for victim in (sibling, bob):
        victim.files.write(f"{HOME}/secret.txt", SECRET)
    # Symlinks made inside the sandbox, pointing outside it.
    attacker.commands.run(
        f"set -e; cd {HOME}; ln -s /etc etc-link; ln -s {OUTSIDE} abs_link; "
        f"ln -s ../../../../../../../.. rel_link; ln -s {OUTSIDE}/secret.txt last_link; "
        f"ln -s /proc/self/root proc_root; ln -s /proc/self/cwd proc_cwd; "
        f"mkdir real; echo fine > real/ok.txt; ln -s {OUTSIDE}/dir real/mid_link")
    token = token_of(attacker)
    headers = envd_headers(attacker.sandbox_id, token)
    probe = f"/etc/warren-e2b-probe-{RUN}"
    fs = attacker.files
    checked = 0

    def refused(what, call, *args, **kwargs):
        nonlocal checked
        checked += 1
        try:
            result = call(*args, **kwargs)
        except AssertionError:
            raise
        except Exception as error:  # noqa: BLE001 - any refusal will do, if it leaks nothing
            no_leak(f"{type(error).__name__}: {error}", what)
            return
        no_leak(repr(result), what)
        raise AssertionError(f"[e2b {SDK}] {what}: not refused, returned {repr(result)[:300]}")

    # A link of the attacker's own home, named as itself, is described as E2B's envd does
    # (its type and target), never followed: nothing of what it points at shows.
    own_links = {f"{HOME}/etc-link": "/etc", f"{HOME}/abs_link": OUTSIDE,
                 f"{HOME}/last_link": f"{OUTSIDE}/secret.txt", f"{HOME}/proc_cwd": "/proc/self/cwd"}
    for path in attack_corpus(sibling.sandbox_id, bob.sandbox_id):
        shown = path[:70]
        refused(f"read {shown!r}", fs.read, path)
        refused(f"read bytes {shown!r}", fs.read, path, format="bytes")
        refused(f"list {shown!r}", fs.list, path, depth=3)
        checked += 1
        if path in own_links:
            link = fs.get_info(path)
            check_eq((link.type, link.symlink_target, link.size),
                     (FileType.SYMLINK, own_links[path], len(own_links[path])),
                     f"get_info {shown!r} describes the link itself")
            check_eq(fs.exists(path), True, f"exists {shown!r}: the link itself")
        else:
            refused(f"get_info {shown!r}", fs.get_info, path)
            try:
                exists = fs.exists(path)
                check(exists is False, f"exists {shown!r} says False", exists)
            except AssertionError:
                raise
            except Exception as error:  # noqa: BLE001
                no_leak(str(error), f"exists {shown!r}")
        refused(f"watch_dir {shown!r}", fs.watch_dir, path)
        # Raw /files, as a client without the SDK sends it.
        checked += 1
        status, body = http("GET", files_url(path, username="user"), headers)
        check(400 <= status < 500, f"GET /files {shown!r} is a 4xx", status, body[:200])
        no_leak(body, f"GET /files {shown!r}")
        # Writes, removes, renames and mkdirs only aim at planted files and harmless probes:
        # never at a real system file of the host, should a refusal ever fail.
        planted = path.endswith("secret.txt") or path.startswith(OUTSIDE)
        bare_link = path.rstrip("/").endswith(("abs_link", "last_link"))
        if planted or bare_link:
            refused(f"write {shown!r}", fs.write, path, "PWNED")
            refused(f"make_dir under {shown!r}", fs.make_dir, path.rstrip("/") + "/newdir")
            if not bare_link:
                # Removing, renaming or replacing a link itself acts inside the sandbox: allowed.
                refused(f"rename onto {shown!r}", fs.rename, f"{HOME}/real/ok.txt", path)
                refused(f"remove {shown!r}", fs.remove, path)
                refused(f"rename from {shown!r}", fs.rename, path, f"{HOME}/moved-in")
            body_, ctype = multipart(b"PWNED")
            checked += 1
            status, body = http("POST", files_url(path, username="user"), {**headers, **ctype}, body_)
            check(400 <= status < 500, f"POST /files {shown!r} is a 4xx", status, body[:200])
            no_leak(body, f"POST /files {shown!r}")
    # Outside the home a path is the runtime's own (issue 42), seen as its user sees it:
    # what uid 1000 may not read is refused, procfs is not served, and a host path is not
    # there (a link to one resolves inside the runtime).
    for path in ["/etc/shadow", "/root/.bashrc", "/proc/self/environ", "/proc/self/mem",
                 "/proc/1/root/etc/passwd", "/proc/self/root/etc/shadow", f"{OUTSIDE}/secret.txt",
                 f"{OUTSIDE}/dir/secret.txt", "/home/userX/secret.txt"]:
        refused(f"read {path!r}", fs.read, path)
        refused(f"read bytes {path!r}", fs.read, path, format="bytes")
        checked += 1
        status, body = http("GET", files_url(path, username="user"), headers)
        check(400 <= status < 500, f"GET /files {path!r} is a 4xx", status, body[:200])
        no_leak(body, f"GET /files {path!r}")
    refused("list /proc/self", fs.list, "/proc/self")
    passwd = attacker.commands.run("cat /etc/passwd").stdout
    check_eq(fs.read("/etc/passwd"), passwd, "the runtime's /etc/passwd, as a command reads it")
    for path in [probe, f"{HOME}/../../..{probe}", f"{HOME}/etc-link/warren-e2b-probe-{RUN}"]:
        refused(f"write {path!r}", fs.write, path, "PWNED")
        refused(f"make_dir {path!r}", fs.make_dir, path)
        refused(f"write_files {path!r}", fs.write_files, [{"path": path, "data": "PWNED"}])
    check(checked >= 350, "the whole corpus ran", checked)

    # Nothing outside changed: the victims' secrets are whole, the planted links still there.
    check_eq(sibling.files.read(f"{HOME}/secret.txt"), SECRET, "the sibling sandbox's secret")
    check_eq(Sandbox.connect(bob.sandbox_id, api_key=BOB_KEY).files.read(f"{HOME}/secret.txt"),
             SECRET, "bob's secret")
    links = attacker.commands.run(f"cd {HOME}; ls -1 | sort").stdout.split()
    for link in ["abs_link", "etc-link", "last_link", "proc_root", "rel_link"]:
        check(link in links, f"the planted {link} is still there", links)
    check(not os.path.exists(probe), "no probe file was made in the host's /etc")
    print(f"path attacks checked: {checked}")


# ---------------------------------------------------------------------------------------
# Egress rules: allow_internet_access, network allow_out / deny_out, ALL_TRAFFIC


class Destination:
    """An HTTP server on a loopback address of the host, answering its name and counting
    the requests it answered: what a sandbox reached, seen from the other side."""

    def __init__(self, address, name):
        import http.server

        destination = self
        self.name = name
        self.count = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                destination.count += 1
                body = destination.name.encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# Run inside a sandbox: fetches argv[1] through the proxy in HTTP_PROXY (loopback
# destinations included: NO_PROXY would send them to the sandbox's own loopback), prints
# the body, `HTTP <status>` (the proxy's refusal) or `FAILED` (no way out at all).
FETCH = """
import os, sys, urllib.error, urllib.request
os.environ.pop("NO_PROXY", None); os.environ.pop("no_proxy", None)
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())
except urllib.error.HTTPError as error:
    print("HTTP", error.code)
except Exception as error:
    print("FAILED", type(error).__name__, "proxy" if os.environ.get("HTTP_PROXY") else "no proxy")
"""


def network():
    """Run against a server whose e2b.internet is the allowlist 127.0.0.1 and 127.0.0.2
    (crates/warren/tests/suite/e2b.rs): 127.0.0.3 is outside it, so no rule reaches it."""
    from e2b import ALL_TRAFFIC

    check_eq(ALL_TRAFFIC, "0.0.0.0/0", "the SDK's ALL_TRAFFIC")
    one, two, three = (Destination(f"127.0.0.{n}", f"dest-{n}") for n in (1, 2, 3))
    reached = {one: 0, two: 0, three: 0}

    def sees(sbx, what, want):
        """What each destination answers `sbx`: its name where `want` has it, a refusal
        otherwise; each destination counts exactly the requests that reached it."""
        sbx.files.write("/tmp/fetch.py", FETCH)
        for destination in (one, two, three):
            got = sbx.commands.run(f"python3 /tmp/fetch.py {destination.url}", timeout=60).stdout.strip()
            if destination in want:
                reached[destination] += 1
                check_eq(got, destination.name, f"{what}: {destination.url} is reached")
            else:
                check(got == "HTTP 403" or got.startswith("FAILED"),
                      f"{what}: {destination.url} is refused", got)
            check_eq(destination.count, reached[destination],
                     f"{what}: requests {destination.name} answered")

    try:
        only_one = create("network", network={"deny_out": [ALL_TRAFFIC], "allow_out": ["127.0.0.1"]})
        sees(only_one, "deny_out ALL_TRAFFIC, allow_out 127.0.0.1", {one})
        shown = only_one.get_info().network or {}
        check_eq(shown.get("allow_out"), ["127.0.0.1"], "get_info's network allow_out")
        check_eq(shown.get("deny_out"), [ALL_TRAFFIC], "get_info's network deny_out")

        # The SDK's callable form, and the other address: not a first-entry accident.
        only_two = create("network", network={"deny_out": lambda ctx: [ctx.all_traffic],
                                               "allow_out": ["127.0.0.2/32"]})
        sees(only_two, "deny_out ctx.all_traffic, allow_out 127.0.0.2/32", {two})

        # allow_internet_access=False is deny_out ALL_TRAFFIC: allow_out still opens.
        offline_but_two = create("network", allow_internet_access=False,
                                 network={"allow_out": ["127.0.0.2"]})
        sees(offline_but_two, "allow_internet_access False, allow_out 127.0.0.2", {two})

        but_two = create("network", network={"deny_out": ["127.0.0.2"]})
        sees(but_two, "deny_out 127.0.0.2", {one})
        check_eq((but_two.get_info().network or {}).get("deny_out"), ["127.0.0.2"],
                 "get_info's network deny_out")

        # allow_out wins over deny_out, as on E2B.
        all_but_excepted = create("network", network={"deny_out": ["127.0.0.0/8"],
                                                      "allow_out": ["127.0.0.2"]})
        sees(all_but_excepted, "deny_out 127.0.0.0/8, allow_out 127.0.0.2", {two})

        unrestricted = create("network")
        sees(unrestricted, "no rules (e2b.internet)", {one, two})
        offline = create("network", allow_internet_access=False)
        sees(offline, "allow_internet_access False", set())

        # What warren cannot filter or do: 400 in E2B's shape, and no sandbox.
        error = raises(SandboxException, "allow_out with an entry warren cannot filter",
                       create, "network-refused",
                       network={"deny_out": [ALL_TRAFFIC], "allow_out": ["not a host"]})
        check("400" in str(error) and "allowOut" in str(error), "a 400 naming allowOut", str(error))
        for network, field in [
            ({"denyOut": ["10.0.0.0/33"]}, "denyOut"),
            ({"allowOut": ["http://127.0.0.1/"]}, "allowOut"),
            ({"egressProxy": {"address": "proxy.example:1080"}}, "egressProxy"),
            ({"maskRequestHost": "${PORT}-x.example"}, "maskRequestHost"),
        ]:
            status, body = http("POST", f"{API_URL}/sandboxes",
                                {"X-API-Key": API_KEY, "Content-Type": "application/json"},
                                json.dumps({"templateID": "base", "network": network,
                                            "metadata": {"run": RUN, "scenario": "network-refused"}}
                                           ).encode())
            check_error_shape(status, body, 400, f"network {network}")
            check(field in json.loads(body)["message"], f"the 400 names {field}", body)
        check_eq(listed_ids(scenario="network-refused"), set(), "no sandbox was made by refused creates")

        # Rules are fixed at create: an update is refused, and changes nothing.
        error = raises(SandboxException, "update_network", only_one.update_network,
                       {"deny_out": ["127.0.0.2"]})
        check("400" in str(error) and "fixed at create" in str(error),
              "update_network is a 400 saying why", str(error))
        sees(only_one, "deny_out ALL_TRAFFIC, allow_out 127.0.0.1, after a refused update", {one})
    finally:
        for destination in (one, two, three):
            destination.close()


SCENARIOS = {
    f.__name__: f
    for f in [
        lifecycle, listing, errors, timeout_expiry, set_timeout, pause_resume, snapshots, foreground,
        background, stdin, connect_running, envs, cwd, command_timeout, files, watch, write_files,
        signed_urls, pty, replicas, other_users, envd_credentials, path_attacks, network,
    ]
}


def main():
    name = sys.argv[1]
    # A hung call shows where it hangs, instead of the test's own timeout saying nothing.
    faulthandler.dump_traceback_later(int(os.environ.get("WARREN_E2B_HANG_S", "150")), exit=True)
    print(f"scenario {name} with e2b {SDK} against {API_URL}", flush=True)
    try:
        SCENARIOS[name]()
    except BaseException:
        traceback.print_exc()
        print(f"SCENARIO FAILED: {name} (e2b {SDK})", flush=True)
        sys.exit(1)
    finally:
        cleanup()
    print(f"SCENARIO PASSED: {name} (e2b {SDK})", flush=True)


if __name__ == "__main__":
    main()
