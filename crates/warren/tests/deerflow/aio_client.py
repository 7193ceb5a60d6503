#!/usr/bin/env python3
"""Drives warren the way DeerFlow does, with the official AIO client (PyPI `agent-sandbox`,
pinned to 0.0.30 by scripts/test): the provisioner API as DeerFlow's remote backend calls
it, then every AIO endpoint through the SDK with its results checked, then the path-attack
corpus through the AIO file endpoints.

Run by crates/warren/tests/suite/deerflow.rs, which starts the server and plants the attack
world (symlinks in the thread's workdir, bob's secret, a secret outside the data dir):

    aio_client.py --url URL --api-key KEY --user alice --thread t1 \
        --data-dir DIR --outside DIR

Prints `ALL CHECKS PASSED` at the end; any failed check raises.
"""

import argparse
import base64
import hashlib
import sys
import time

import httpx

try:
    from agent_sandbox import Sandbox
    from agent_sandbox.core.api_error import ApiError
except ImportError as error:  # pragma: no cover - the Rust test reports this
    sys.exit(f"the agent-sandbox SDK is missing (pip install agent-sandbox==0.0.30): {error}")

SECRET = "TOP-SECRET"


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def expect_api_error(call, statuses, what):
    """Runs `call`; it must raise the SDK's ApiError with one of `statuses`."""
    try:
        result = call()
    except ApiError as error:
        check(error.status_code in statuses, f"{what}: status {error.status_code}: {error.body}")
        return error
    raise AssertionError(f"{what}: succeeded with {result!r}")


# --- The provisioner API, as DeerFlow's RemoteSandboxBackend calls it --------------------


def provision(args):
    """POST /api/sandboxes twice (DeerFlow retries once on a transport error: it must be
    idempotent), then the readiness probe and the status check DeerFlow makes."""
    base = f"{args.url}/deerflow"
    headers = {"X-API-Key": args.api_key}
    sandbox_id = hashlib.sha256(f"{args.user}:{args.thread}".encode()).hexdigest()[:8]
    body = {
        "sandbox_id": sandbox_id,
        "thread_id": args.thread,
        "user_id": args.user,
        "include_legacy_skills": False,
        "provision_lark_cli_runtime": False,
        "provision_lark_cli_broker": False,
    }
    with httpx.Client(timeout=30) as http:
        caps = http.get(f"{base}/api/capabilities", headers=headers, timeout=5)
        check(caps.status_code == 200, f"capabilities: {caps.status_code} {caps.text}")
        check(caps.json()["mount_contract_version"] == 2, f"capabilities: {caps.text}")
        first = http.post(f"{base}/api/sandboxes", json=body, headers=headers)
        check(first.status_code == 200, f"create: {first.status_code} {first.text}")
        again = http.post(f"{base}/api/sandboxes", json=body, headers=headers)
        check(again.status_code == 200, f"create again: {again.status_code} {again.text}")
        created = first.json()
        check(again.json() == created, f"a second create answers the same: {again.text}")
        for key, value in [
            ("sandbox_id", sandbox_id),
            ("user_id", args.user),
            ("thread_id", args.thread),
            ("mount_contract_version", 2),
            ("status", "Running"),
        ]:
            check(created[key] == value, f"create answers {key}={value!r}: {created}")
        url = created["sandbox_url"]
        check(not url.endswith("/"), f"no trailing slash: {url}")
        # backend.wait_for_sandbox_ready: any 200 within 60 s.
        deadline = time.monotonic() + 60
        while True:
            probe = http.get(f"{url}/v1/sandbox", timeout=5)
            if probe.status_code == 200:
                break
            check(time.monotonic() < deadline, f"readiness: {probe.status_code} {probe.text}")
            time.sleep(1)
        status = http.get(f"{base}/api/sandboxes/{sandbox_id}", headers=headers, timeout=10)
        check(status.status_code == 200, f"status: {status.status_code} {status.text}")
        check(status.json()["status"] == "Running", f"status: {status.text}")
        check(status.json()["sandbox_url"] == url, f"status answers the same URL: {status.text}")
        listed = http.get(f"{base}/api/sandboxes", headers=headers, timeout=10).json()
        check(
            any(s["sandbox_id"] == sandbox_id and s["sandbox_url"] == url for s in listed["sandboxes"]),
            f"list: {listed}",
        )
        check(listed["count"] == len(listed["sandboxes"]), f"list count: {listed}")
    return url


# --- The AIO sandbox API through the SDK -------------------------------------------------


def check_context(client):
    context = client.sandbox.get_context()
    check(context.home_dir == "/home/gem", f"home_dir: {context.home_dir}")
    check(context.version, "a version")
    check(context.detail.system.user == "gem", f"user: {context.detail.system}")
    check(isinstance(context.detail.runtime.python, list), "runtime.python is a list")


def check_files(client):
    f = client.file
    ws = "/mnt/user-data/workspace"

    # Write and read text; parents are created.
    written = f.write_file(file=f"{ws}/deep/er/notes.md", content="one\ntwo\nthree\n")
    check(written.data.file == f"{ws}/deep/er/notes.md", f"write answers the file: {written}")
    check(written.data.bytes_written == 14, f"bytes_written: {written}")
    read = f.read_file(file=f"{ws}/deep/er/notes.md")
    check(read.data.content == "one\ntwo\nthree\n", f"read: {read.data.content!r}")
    check(read.data.file == f"{ws}/deep/er/notes.md", f"read answers the file: {read}")
    # Lines [start, end), 0-based, as DeerFlow asks for them.
    part = f.read_file(file=f"{ws}/deep/er/notes.md", start_line=1, end_line=2)
    check(part.data.content == "two\n", f"line range: {part.data.content!r}")
    tail = f.read_file(file=f"{ws}/deep/er/notes.md", start_line=2)
    check(tail.data.content == "three\n", f"from a line: {tail.data.content!r}")

    # Append (DeerFlow's write_file(append=True)) and the newline options.
    f.write_file(file=f"{ws}/deep/er/notes.md", content="four", append=True, trailing_newline=True)
    check(
        f.read_file(file=f"{ws}/deep/er/notes.md").data.content == "one\ntwo\nthree\nfour\n",
        "append",
    )

    # Binary through base64 (DeerFlow's update_file and its upload sync).
    blob = bytes(range(256)) * 4
    f.write_file(
        file="/mnt/user-data/uploads/blob.bin",
        content=base64.b64encode(blob).decode(),
        encoding="base64",
    )
    downloaded = b"".join(f.download_file(path="/mnt/user-data/uploads/blob.bin"))
    check(downloaded == blob, "a base64 write downloads byte for byte")

    # Download of a name the query must form-encode (a space arrives as '+').
    f.write_file(file="/mnt/user-data/outputs/a b&c.txt", content="odd name")
    odd = b"".join(f.download_file(path="/mnt/user-data/outputs/a b&c.txt"))
    check(odd == b"odd name", f"download of an odd name: {odd!r}")

    # Find: a pattern without '/' matches the name at any depth, one with '/' is anchored.
    f.write_file(file=f"{ws}/src/app.py", content="import os\nprint('hello')\n")
    f.write_file(file=f"{ws}/src/pkg/util.py", content="def hello():\n    return 'HELLO'\n")
    f.write_file(file=f"{ws}/.hidden/secret.py", content="hidden = True\n")
    found = f.find_files(path=ws, glob="*.py")
    check(found.data.path == ws, f"find answers the path: {found}")
    check(
        {f"{ws}/src/app.py", f"{ws}/src/pkg/util.py"} <= set(found.data.files),
        f"find at any depth: {found.data.files}",
    )
    anchored = f.find_files(path=ws, glob="src/*.py")
    check(anchored.data.files == [f"{ws}/src/app.py"], f"anchored find: {anchored.data.files}")
    deep = f.find_files(path=ws, glob="**/util.py")
    check(deep.data.files == [f"{ws}/src/pkg/util.py"], f"** find: {deep.data.files}")

    # List: absolute paths under the requested prefix, hidden entries only when asked.
    listed = f.list_path(path=ws, recursive=True, show_hidden=False)
    paths = {entry.path for entry in listed.data.files}
    check(all(p.startswith(ws + "/") for p in paths), f"list paths keep the prefix: {paths}")
    check({f"{ws}/src", f"{ws}/src/app.py", f"{ws}/src/pkg/util.py"} <= paths, f"list: {paths}")
    check(not any("/.hidden" in p for p in paths), f"hidden entries are hidden: {paths}")
    src = next(e for e in listed.data.files if e.path == f"{ws}/src")
    check(src.is_directory and src.name == "src", f"a directory entry: {src}")
    app = next(e for e in listed.data.files if e.path == f"{ws}/src/app.py")
    check(not app.is_directory and app.size == 25, f"a file entry: {app}")
    check(listed.data.total_count == len(listed.data.files), f"total_count: {listed.data}")
    shown = f.list_path(path=ws, recursive=True, show_hidden=True)
    check(
        f"{ws}/.hidden/secret.py" in {e.path for e in shown.data.files},
        "show_hidden shows them",
    )
    flat = f.list_path(path=ws)
    check(
        {e.path for e in flat.data.files} == {f"{ws}/deep", f"{ws}/src"},
        f"a flat list: {[e.path for e in flat.data.files]}",
    )

    # Grep as DeerFlow calls it, then the options.
    grep = f.grep_files(
        path=ws,
        pattern="hello",
        case_insensitive=False,
        fixed_strings=False,
        max_results=250,
        max_file_size="1M",
        recursive=True,
    )
    hits = sorted((m.file, m.line_number, m.line_content) for m in grep.data.matches)
    check(
        hits == [(f"{ws}/src/app.py", 2, "print('hello')"), (f"{ws}/src/pkg/util.py", 1, "def hello():")],
        f"grep: {hits}",
    )
    check(grep.data.truncated is False, f"not truncated: {grep.data}")
    loud = f.grep_files(path=ws, pattern="HELLO", case_insensitive=True, recursive=True)
    check(len(loud.data.matches) == 3, f"case-insensitive grep: {loud.data.matches}")
    literal = f.grep_files(path=ws, pattern="print('", fixed_strings=True)
    check([m.line_number for m in literal.data.matches] == [2], f"fixed strings: {literal.data}")
    capped = f.grep_files(path=ws, pattern="hello", case_insensitive=True, max_results=1)
    check(len(capped.data.matches) == 1 and capped.data.truncated, f"max_results: {capped.data}")
    one_file = f.grep_files(path=f"{ws}/src/app.py", pattern="import")
    check(
        [(m.file, m.line_number) for m in one_file.data.matches] == [(f"{ws}/src/app.py", 1)],
        f"grep in one file: {one_file.data}",
    )
    shallow = f.grep_files(path=f"{ws}/src", pattern="hello", recursive=False)
    check(
        [m.file for m in shallow.data.matches] == [f"{ws}/src/app.py"],
        f"non-recursive grep: {shallow.data}",
    )

    # The skill mounts are read-only; personal skills are readable.
    skill = f.read_file(file="/mnt/skills/custom/mine/SKILL.md")
    check(skill.data.content == "# my skill\n", f"a personal skill: {skill.data.content!r}")
    for path in ["/mnt/skills/public/x.md", "/mnt/skills/custom/mine/SKILL.md"]:
        expect_api_error(lambda: f.write_file(file=path, content="x"), {403}, f"write {path}")

    # Failures are non-2xx, never 422, and say what went wrong without a host path.
    missing = expect_api_error(
        lambda: f.read_file(file=f"{ws}/missing.txt"), {404}, "read of a missing file"
    )
    check("/mnt/user-data/workspace/missing.txt" in str(missing.body), f"names the path: {missing.body}")
    expect_api_error(lambda: f.read_file(file="relative.txt"), {400}, "a relative path")
    expect_api_error(lambda: f.read_file(file=ws), {400}, "reading a directory")
    expect_api_error(
        lambda: b"".join(f.download_file(path=f"{ws}/missing.bin")), {404}, "download of a missing file"
    )
    expect_api_error(
        lambda: f.write_file(file=f"{ws}/x.bin", content="***", encoding="base64"),
        {400},
        "bad base64",
    )
    expect_api_error(lambda: f.grep_files(path=ws, pattern="("), {400}, "a bad regex")
    expect_api_error(lambda: f.list_path(path=f"{ws}/nowhere"), {404}, "listing a missing directory")


# === SHELL / BASH (helper-11) ============================================================
# Checks of /v1/shell/* and /v1/bash/* through the SDK go here: exec, persistent sessions
# (cwd and exports survive, sessions never share a shell), view/wait/kill, bash with env,
# session-not-found answers. Called from main() with the SDK client and the sandbox URL.


def check_shell(client, sandbox_url):
    """The shell and bash endpoints as DeerFlow's AioSandbox calls them (contract §4.1),
    through the SDK, with every result checked."""
    quick = {"timeout_in_seconds": 5, "max_retries": 0}
    long = {"timeout_in_seconds": 65, "max_retries": 0}
    import uuid

    # A scoped session (create_session(id=uuid4)), then commands in it: a persistent shell.
    sid = str(uuid.uuid4())
    created = client.shell.create_session(id=sid, request_options=quick)
    check(created.data.session_id == sid, f"create_session: {created}")
    check(created.data.working_dir == "/mnt/user-data", f"create_session: {created}")
    first = client.shell.exec_command(
        command="cd /mnt/user-data/workspace && export DF_TOKEN=df-1 && echo $$",
        id=sid, no_change_timeout=600, hard_timeout=60.0, request_options=long)
    check(first.data.status == "completed" and first.data.exit_code == 0, f"exec: {first}")
    pid = first.data.output.strip()
    again = client.shell.exec_command(command="echo $$ $PWD $DF_TOKEN", id=sid,
                                      no_change_timeout=600, hard_timeout=60.0,
                                      request_options=long)
    check(again.data.output == f"{pid} /mnt/user-data/workspace df-1\n", f"persistent: {again}")
    # A second session never shares the first one's shell.
    other = str(uuid.uuid4())
    client.shell.create_session(id=other, request_options=quick)
    seen = client.shell.exec_command(command="echo $$ ${DF_TOKEN-unset}", id=other,
                                     request_options=long)
    check(seen.data.output != f"{pid} df-1\n" and seen.data.output.endswith(" unset\n"),
          f"second session: {seen}")
    # Exit codes, and stderr merged in order.
    failed = client.shell.exec_command(command="echo out; echo err >&2; exit_code() { return 4; }; exit_code",
                                       id=sid, request_options=long)
    check(failed.data.output == "out\nerr\n" and failed.data.exit_code == 4, f"exit code: {failed}")

    # Variant A: no id, sync, a hard timeout; the answer names the session it made.
    implicit = client.shell.exec_command(command="echo implicit", no_change_timeout=600,
                                         hard_timeout=60.0, request_options=long)
    check(implicit.data.output == "implicit\n" and implicit.data.session_id, f"implicit: {implicit}")

    # list_dir's command: its status trailer must come back as the last line.
    listing = client.shell.exec_command(
        command="find /mnt/user-data -maxdepth 1 2>/dev/null | head -500; printf '\\n__DF_FIND_STATUS__:%s\\n' $?",
        id=sid, no_change_timeout=600, hard_timeout=60.0, request_options=long)
    check(listing.data.output.endswith("\n__DF_FIND_STATUS__:0\n"), f"list_dir: {listing}")

    # Variant B: async, then wait (max 1 s, bounded) and view until done.
    started = client.shell.exec_command(command="echo one; sleep 1; echo two", id=sid,
                                        async_mode=True, hard_timeout=60.0,
                                        no_change_timeout=600, request_options=long)
    check(started.data.status == "running", f"async: {started}")
    deadline = time.monotonic() + 20
    while True:
        before = time.monotonic()
        waited = client.shell.wait_for_process(
            id=sid, max_wait_seconds=1, request_options={"timeout_in_seconds": 2, "max_retries": 0})
        check(time.monotonic() - before < 1.8, "wait returns within its bound")
        view = client.shell.view(id=sid, request_options={"timeout_in_seconds": 2, "max_retries": 0})
        if view.data.status != "running":
            break
        check(waited.data.status == "running", f"wait: {waited}")
        check(time.monotonic() < deadline, "the async command never ended")
    check(view.data.status == "completed" and view.data.exit_code == 0, f"view: {view}")
    check(view.data.console[-1].output == "one\ntwo\n", f"view console: {view}")

    # A hard timeout: the command's tree is killed, the session stays.
    timed = client.shell.exec_command(command="echo before; sleep 600", id=sid,
                                      hard_timeout=1.0, no_change_timeout=600,
                                      request_options=long)
    check(timed.data.status == "hard_timeout" and timed.data.output.startswith("before\n"),
          f"hard timeout: {timed}")
    # (bash may first report the jobs the kill ended, as an interactive shell does.)
    check(client.shell.exec_command(command="echo $$", id=sid, request_options=long)
          .data.output.strip().splitlines()[-1] == pid, "the shell outlives a hard timeout")

    # DeerFlow's abort: update_session(no_change_timeout=1) drains a waiting exec, a
    # helper session kills the shell by the pid it wrote, kill and cleanup.
    client.shell.exec_command(
        command="printf '%s\\n' $$ > /tmp/df-shell.pid; echo marked", id=sid, request_options=long)
    client.shell.exec_command(command="sleep 300", id=sid, async_mode=True, request_options=long)
    client.shell.update_session(id=sid, no_change_timeout=1,
                                request_options={"timeout_in_seconds": 20, "max_retries": 0})
    helper = str(uuid.uuid4())
    client.shell.create_session(id=helper, request_options=quick)
    client.shell.exec_command(command="kill -KILL $(cat /tmp/df-shell.pid)", id=helper,
                              no_change_timeout=20, request_options=long)
    killed = client.shell.kill_process(id=sid, request_options={"timeout_in_seconds": 20, "max_retries": 0})
    check(killed.data.status in ("terminated", "completed"), f"kill: {killed}")
    client.shell.cleanup_session(helper, request_options=quick)
    client.shell.cleanup_session(sid, request_options=quick)
    # The killed session is gone, in DeerFlow's words.
    error = expect_api_error(
        lambda: client.shell.exec_command(command="true", id=sid, request_options=long),
        (404,), "a killed session")
    check("session not found" in str(error.body.get("message", "")).lower(), f"{error.body}")

    # bash with env (skill secrets): stdout and stderr apart, env for this command only.
    bid = str(uuid.uuid4())
    info = client.bash.create_session(session_id=bid, request_options=quick)
    check(info.data.session_id == bid and info.data.status == "ready", f"bash create: {info}")
    ran = client.bash.exec(command="exec < /dev/null\necho \"$SKILL_KEY\"; echo warn >&2; false",
                           session_id=bid, env={"SKILL_KEY": "k-1", "DF_ABORT": "df-abc"},
                           hard_timeout=60.0, request_options=long)
    check((ran.data.stdout, ran.data.stderr, ran.data.exit_code, ran.data.status)
          == ("k-1\n", "warn\n", 1, "completed"), f"bash exec: {ran}")
    after = client.bash.exec(command="echo ${SKILL_KEY-gone}", session_id=bid, request_options=long)
    check(after.data.stdout == "gone\n", f"env for one command: {after}")
    timed = client.bash.exec(command="sleep 600", session_id=bid, hard_timeout=1.0,
                             request_options=long)
    check(timed.data.status == "timed_out", f"bash timeout: {timed}")
    listed = client.bash.sessions(request_options=quick)
    check(any(s.session_id == bid for s in listed.data), f"bash sessions: {listed}")
    client.bash.close_session(bid, request_options=quick)
    error = expect_api_error(
        lambda: client.bash.exec(command="true", session_id=bid, request_options=long),
        (404,), "a closed bash session")
    check("session not found" in str(error.body.get("message", "")).lower(), f"{error.body}")
    client.shell.cleanup_session(other, request_options=quick)


# === end of SHELL / BASH ==================================================================


# --- The path-attack corpus through the AIO file endpoints --------------------------------


def check_jupyter(client):
    long = {"timeout_in_seconds": 120, "max_retries": 0}
    jupyter = client.jupyter
    info = jupyter.get_info().data
    check(info.default_kernel == "python3" and info.available_kernels == ["python3"], f"info: {info}")

    made = jupyter.create_session(session_id="nb1", request_options=long)
    check(made.data.session_id == "nb1" and made.data.kernel_name == "python3", f"create: {made}")
    again = jupyter.create_session(session_id="nb1", request_options=long)
    check(again.data.message == "Session already exists", f"create is idempotent: {again}")

    first = jupyter.execute_code(code="x = 41\nprint('set')", session_id="nb1", request_options=long).data
    check(first.status == "ok" and first.session_id == "nb1", f"first cell: {first}")
    check([(o.output_type, o.name, o.text) for o in first.outputs] == [("stream", "stdout", "set\n")],
          f"first cell's outputs: {first.outputs}")
    second = jupyter.execute_code(code="x + 1", session_id="nb1", request_options=long).data
    results = [o for o in second.outputs if o.output_type == "execute_result"]
    check(len(results) == 1 and results[0].data["text/plain"] == "42", f"state kept: {second.outputs}")
    check(second.execution_count == first.execution_count + 1, f"counts: {first.execution_count}, {second.execution_count}")
    check(results[0].execution_count == second.execution_count, f"the result's count: {results[0]}")

    plot = jupyter.execute_code(
        code="import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        session_id="nb1", request_options=long).data
    shown = [o for o in plot.outputs if o.output_type == "display_data"]
    check(len(shown) == 1 and base64.b64decode(shown[0].data["image/png"]).startswith(b"\x89PNG"),
          f"a plot as a PNG: {[o.output_type for o in plot.outputs]}")

    failed = jupyter.execute_code(code="1/0", session_id="nb1", request_options=long).data
    errors = [o for o in failed.outputs if o.output_type == "error"]
    check(failed.status == "error" and len(errors) == 1 and errors[0].ename == "ZeroDivisionError"
          and any("ZeroDivisionError" in line for line in errors[0].traceback), f"an error: {failed}")

    slow = jupyter.execute_code(code="import time\nwhile True: time.sleep(0.1)", session_id="nb1",
                                timeout=1, request_options=long).data
    check(slow.status == "timeout", f"a timeout: {slow}")
    after = jupyter.execute_code(code="x", session_id="nb1", request_options=long).data
    check([o.data["text/plain"] for o in after.outputs if o.output_type == "execute_result"] == ["41"],
          f"the interrupted kernel kept its state: {after.outputs}")

    # Without a session id, the default session: stateful too.
    jupyter.execute_code(code="y = 'default'", request_options=long)
    plain = jupyter.execute_code(code="y", request_options=long).data
    check(plain.session_id == "default" and plain.outputs[0].data["text/plain"] == "'default'", f"default: {plain}")

    sessions = jupyter.list_sessions().data.sessions
    check(set(sessions) == {"nb1", "default"} and sessions["nb1"].kernel_name == "python3", f"sessions: {sessions}")
    jupyter.delete_session("nb1")
    check("nb1" not in jupyter.list_sessions().data.sessions, "nb1 removed")
    expect_api_error(lambda: jupyter.delete_session("nb1"), {404}, "removing a removed session")
    expect_api_error(lambda: jupyter.execute_code(code="1", kernel_name="ir"), {400}, "an unknown kernel")
    expect_api_error(lambda: jupyter.execute_code(code="1", session_id="../x"), {400}, "a session id with a path in it")
    jupyter.delete_sessions()
    check(jupyter.list_sessions().data.sessions == {}, "every session removed")


def corpus(outside):
    long_component = "a" * 256
    long_path = "/mnt/user-data/" + "/".join(["abcdefgh"] * 600)
    ud = "/mnt/user-data"
    return [
        f"{ud}/../../../etc/passwd",
        f"{ud}/..",
        f"{ud}/workspace/../../../../bob/threads/t/user-data/secret.txt",
        "/mnt/skills/custom/../../user-data",
        "/mnt/skills/custom/../../../etc/passwd",
        "/mnt/skills/../user-data",
        # Outside the mounts a path is the runtime's own (issue 42): what uid 1000 may not
        # touch, and procfs, which the file API never serves.
        "/etc/shadow",
        "/proc/self/environ",
        "/proc/self",
        f"{ud}X/secret.txt",
        f"{ud}/abs_link/secret.txt",
        f"{ud}/abs_link",
        f"{ud}/rel_link/etc/passwd",
        f"{ud}/last_link",
        f"{ud}/inside_link",
        f"{ud}/proc_root/etc/passwd",
        f"{ud}/proc_cwd/secret.txt",
        f"{ud}/bob_link/threads/t/user-data/secret.txt",
        f"{ud}/real/mid_link/secret.txt",
        "/mnt/skills/custom/evil_link/secret.txt",
        "/mnt/skills/custom/evil_link",
        "../secret.txt",
        f"{ud}/nul\0byte",
        f"{ud}/{long_component}",
        long_path,
    ]


def attacks(client, path):
    f = client.file
    return [
        ("read", lambda: f.read_file(file=path)),
        ("write", lambda: f.write_file(file=path, content="PWNED")),
        ("write-below", lambda: f.write_file(file=f"{path}/new.txt", content="PWNED")),
        ("append", lambda: f.write_file(file=path, content="PWNED", append=True)),
        ("write-base64", lambda: f.write_file(file=path, content="UFdORUQ=", encoding="base64")),
        ("download", lambda: b"".join(f.download_file(path=path))),
        ("list", lambda: f.list_path(path=path, recursive=True, show_hidden=True)),
        ("find", lambda: f.find_files(path=path, glob="*")),
        ("grep", lambda: f.grep_files(path=path, pattern="SECRET", recursive=True)),
    ]


def check_attacks(client, data_dir, outside):
    checked = 0
    for path in corpus(outside):
        for op, call in attacks(client, path):
            shown = path[:60]
            # Every answer is a refusal (non-2xx), never a 422 the SDK would misread.
            try:
                result = call()
            except ApiError as error:
                check(
                    400 <= (error.status_code or 0) < 500,
                    f"{op} {shown!r}: status {error.status_code}: {error.body}",
                )
                text = str(error.body)
            else:
                raise AssertionError(f"{op} {shown!r} succeeded: {result!r}"[:500])
            check(SECRET not in text, f"{op} {shown!r} leaked the secret: {text}")
            check(data_dir not in text, f"{op} {shown!r} leaked a host path: {text}")
            # An outside path may come back only as the caller's own input, echoed.
            if outside not in path:
                check(outside not in text, f"{op} {shown!r} leaked a host path: {text}")
            checked += 1
    check(checked >= 220, f"only {checked} attacks ran")
    return checked


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--outside", required=True)
    args = parser.parse_args()

    started = time.monotonic()
    sandbox_url = provision(args)
    # DeerFlow's AioSandbox: the SDK client on the URL, no credentials.
    client = Sandbox(base_url=sandbox_url, timeout=600)
    check_context(client)
    check_files(client)
    print("file endpoints: ok", flush=True)
    check_shell(client, sandbox_url)
    print("shell endpoints: ok", flush=True)
    check_jupyter(client)
    print("jupyter endpoints: ok", flush=True)
    attacked = check_attacks(client, args.data_dir, args.outside)
    print(f"path attacks: {attacked} refused", flush=True)
    print(f"ALL CHECKS PASSED in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
