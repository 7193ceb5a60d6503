"""Every endpoint family of `/v1` through the SDK, against a real warren server."""

from __future__ import annotations

import base64
import threading
import time

import pytest

from warren_sdk import AsyncWarren, Body, Warren, WarrenError


@pytest.fixture
def sandbox(warren: Warren, uid: str) -> str:
    info = warren.sandboxes.create(uid=uid, runtime_scope_id="thread-1", labels={"suite": "sdk"})
    return info["sandbox_id"]


def test_workdirs_are_created_listed_and_counted_in_usage(warren: Warren, uid: str):
    made = warren.workdirs.create(uid, path="projects/a", init={"files": {"README.md": "hello"}})
    assert made["workdir"] == "projects/a"
    assert [w["workdir"] for w in warren.workdirs.list(uid)["workdirs"]] == ["projects/a"]
    usage = warren.users.usage(uid)
    assert (usage["uid"], usage["enforcement"]) == (uid, "off"), usage


def test_a_sandbox_is_created_once_per_identity_found_by_label_and_updated(warren: Warren, uid: str):
    first = warren.sandboxes.create(uid=uid, runtime_scope_id="t", labels={"team": "x"})
    again = warren.sandboxes.create(uid=uid, runtime_scope_id="t")
    assert first["sandbox_id"] == again["sandbox_id"]
    assert first["state"] == "created", "the runtime starts on first use (I12)"
    found = warren.sandboxes.list(uid=uid, label=["team=x"])["sandboxes"]
    assert [s["sandbox_id"] for s in found] == [first["sandbox_id"]]
    updated = warren.sandboxes.update(first["sandbox_id"], labels={"team": "y"})
    assert updated["labels"] == {"team": "y"}
    assert warren.sandboxes.get(first["sandbox_id"])["labels"] == {"team": "y"}


def test_exec_answers_whole_and_streams_as_output_arrives(warren: Warren, sandbox: str):
    result = warren.sandboxes.exec(sandbox, command="echo out; echo err >&2; exit 3")
    assert (result["stdout"], result["stderr"], result["exit_code"]) == ("out\n", "err\n", 3)
    assert warren.sandboxes.exec(sandbox, argv=["printf", "%s", "a b"])["stdout"] == "a b"
    events = list(warren.exec_stream(sandbox, command="echo one; echo two"))
    data = b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == "stdout")
    assert data == b"one\ntwo\n"
    assert events[-1]["type"] == "exit" and events[-1]["result"]["exit_code"] == 0
    runs = warren.runs.of_sandbox(sandbox)["runs"]
    assert len(runs) >= 3
    assert any(r["sandbox_id"] == sandbox for r in warren.runs.of_user(warren.sandboxes.get(sandbox)["uid"])["runs"])


def test_files_carry_etags_that_guard_writes(warren: Warren, sandbox: str):
    written = warren.files.write(sandbox, b"v1", path="notes/a.txt", if_none_match="*")
    assert written["created"] is True
    body = warren.files.read(sandbox, path="notes/a.txt")
    assert isinstance(body, Body) and body == b"v1" and body.etag == written["etag"]
    with pytest.raises(WarrenError) as refused:
        warren.files.write(sandbox, b"again", path="notes/a.txt", if_none_match="*")
    assert refused.value.status == 412
    warren.files.write(sandbox, b"v2", path="notes/a.txt", if_match=body.etag)
    with pytest.raises(WarrenError) as stale:
        warren.files.write(sandbox, b"v3", path="notes/a.txt", if_match=body.etag)
    assert stale.value.status == 412 and stale.value.code
    assert warren.files.read(sandbox, path="notes/a.txt") == b"v2"


def test_file_operations_list_search_edit_move_and_remove(warren: Warren, sandbox: str):
    warren.files.mkdir(sandbox, path="src/pkg")
    warren.files.write(sandbox, b"def main():\n    return 1\n", path="src/pkg/app.py")
    warren.files.write(sandbox, b"print('x')\n", path="src/run.py")
    listed = warren.files.list(sandbox, path="src")
    assert {e["path"].rsplit("/", 1)[1] for e in listed["entries"]} == {"pkg", "run.py"}
    assert warren.files.stat(sandbox, path="src/run.py")["size"] == 11
    globbed = warren.files.glob(sandbox, pattern="**/*.py", path="src")
    assert sorted(e["path"].rsplit("/", 1)[1] for e in globbed["entries"]) == ["app.py", "run.py"]
    grepped = warren.files.grep(sandbox, pattern=r"return \d", path="src")
    assert [(m["line_number"], m["line"].strip()) for m in grepped["matches"]] == [(2, "return 1")]
    edited = warren.files.edit(sandbox, path="src/pkg/app.py", old="return 1", new="return 2")
    assert edited["replacements"] == 1
    warren.files.rename(sandbox, from_="src/run.py", to="src/main.py")
    assert warren.files.read(sandbox, path="src/main.py") == b"print('x')\n"
    warren.files.remove(sandbox, path="src", recursive=True)
    with pytest.raises(WarrenError) as gone:
        warren.files.stat(sandbox, path="src")
    assert gone.value.status == 404


def test_files_anywhere_in_the_runtime_are_served(warren: Warren, sandbox: str):
    warren.files.write(sandbox, b"scratch", path="/tmp/sdk/x.txt")
    assert warren.sandboxes.exec(sandbox, command="cat /tmp/sdk/x.txt")["stdout"] == "scratch"


def test_a_watch_reports_a_file_written_in_the_directory(warren: Warren, sandbox: str):
    warren.files.mkdir(sandbox, path="watched")
    events = warren.watch(sandbox, "watched")
    assert next(events)["type"] == "start"
    warren.files.write(sandbox, b"x", path="watched/new.txt")
    for event in events:
        if event["type"] in {"create", "write"}:
            assert event["name"] == "new.txt"
            break
    events.close()


def test_a_process_with_a_terminal_takes_stdin_and_is_followed_to_its_end(warren: Warren, sandbox: str):
    started = warren.processes.start(sandbox, command="read line; echo got:$line; stty size",
                                     pty={"cols": 100, "rows": 30}, stdin=True, tag="sdk")
    pid = started["pid"]
    assert [p["pid"] for p in warren.processes.list(sandbox)["processes"]].count(pid) == 1
    warren.processes.resize(sandbox, pid, cols=120, rows=40)
    warren.processes.stdin(sandbox, pid, b"hello\n")
    output = b""
    for event in warren.follow(sandbox, pid):
        if event["type"] == "stdout":
            output += base64.b64decode(event["data"])
        if event["type"] == "end":
            break
    assert b"got:hello" in output and b"40 120" in output
    assert warren.processes.get(sandbox, pid)["status"] == "exited"
    polled = warren.processes.output(sandbox, pid, from_=0)
    assert polled["process"]["pid"] == pid and polled["next"] > 0


def test_a_process_is_signalled_killed_and_its_stdin_closed(warren: Warren, sandbox: str):
    cat = warren.processes.start(sandbox, command="cat", stdin=True)
    warren.processes.close_stdin(sandbox, cat["pid"])
    sleeper = warren.processes.start(sandbox, command="sleep 300")
    warren.processes.signal(sandbox, sleeper["pid"], signal="SIGTERM")
    killed = warren.processes.start(sandbox, command="sleep 300")
    warren.processes.kill(sandbox, killed["pid"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {p: warren.processes.get(sandbox, p)["status"] for p in (cat["pid"], sleeper["pid"], killed["pid"])}
        if all(s != "running" for s in states.values()):
            break
        time.sleep(0.1)
    assert all(s == "exited" for s in states.values()), states


def test_checkpoints_record_compare_and_restore_the_workdir(warren: Warren, sandbox: str):
    warren.files.write(sandbox, b"one", path="doc.txt")
    made = warren.checkpoints.create(sandbox)
    cid = made["checkpoint"]["checkpoint_id"]
    warren.files.write(sandbox, b"two", path="doc.txt")
    assert any(c["checkpoint_id"] == cid for c in warren.checkpoints.list(sandbox)["checkpoints"])
    diff = warren.checkpoints.diff(sandbox, cid)
    assert "doc.txt" in str(diff)
    warren.checkpoints.restore(sandbox, cid)
    assert warren.files.read(sandbox, path="doc.txt") == b"one"


def test_runtime_snapshots_are_taken_listed_and_collected(warren: Warren, sandbox: str, uid: str):
    warren.sandboxes.exec(sandbox, command="echo kept > /home/gem/state")
    snapshot = warren.snapshots.create(sandbox)
    assert str(snapshot["snapshot_id"]).startswith("snap-")
    assert snapshot["snapshot_id"] in str(warren.snapshots.list(sandbox))
    assert warren.snapshots.gc(uid)["manifests_kept"] >= 1, "the snapshot just taken is kept"


def test_presented_files_are_artifacts_to_download(warren: Warren, sandbox: str):
    warren.files.write(sandbox, b"report", path="outputs/report.md")
    presented = warren.artifacts.present(sandbox, paths=["outputs/report.md"])
    artifact = presented["artifacts"][0]
    assert [a["artifact_id"] for a in warren.artifacts.list(sandbox)["artifacts"]] == [artifact["artifact_id"]]
    assert warren.artifacts.download(sandbox, artifact["artifact_id"]) == b"report"


def test_leases_are_taken_renewed_and_released(warren: Warren, sandbox: str):
    lease = warren.leases.create(sandbox, holder="run-1", ttl_s=60)
    renewed = warren.leases.renew(sandbox, lease["lease_id"], ttl_s=120)
    assert renewed["expires_at"] >= lease["expires_at"]
    warren.leases.release(sandbox, lease["lease_id"])


def test_the_guards_fence_token_refuses_a_stale_holder(warren: Warren, sandbox: str):
    first = warren.guard.acquire(sandbox, holder="a", ttl_s=60)
    assert warren.guard.get(sandbox)["holder"] == "a"
    warren.guard.renew(sandbox, token=first["token"], ttl_s=60)
    warren.guard.release(sandbox, token=first["token"])
    second = warren.guard.acquire(sandbox, holder="b", ttl_s=60)
    assert second["token"] > first["token"]
    with pytest.raises(WarrenError) as stale:
        warren.files.write(sandbox, b"late", path="fenced.txt", fence=first["token"])
    assert (stale.value.status, stale.value.code) == (409, "fence_stale")
    warren.files.write(sandbox, b"ok", path="fenced.txt", fence=second["token"])
    warren.guard.release(sandbox, token=second["token"])


def test_a_users_agent_environment_reaches_commands_and_is_never_read_back(warren: Warren, uid: str):
    warren.env.set(uid, "GREETING", value="hi", secret=False)
    warren.env.set(uid, "API_KEY", value="sk-very-secret")
    assert "GREETING" in str(warren.env.get(uid))
    assert "sk-very-secret" not in str(warren.env.get(uid)), "values are never read back (I13)"
    box = warren.sandboxes.create(uid=uid, runtime_scope_id="env")["sandbox_id"]
    out = warren.sandboxes.exec(box, command="echo $GREETING; echo $API_KEY")["stdout"]
    assert out.startswith("hi\n") and "sk-very-secret" not in out, "secrets are masked in output"
    warren.env.remove(uid, "GREETING")
    warren.env.replace(uid, env={"A": {"value": "1", "secret": False}})
    warren.env.clear(uid)
    assert "A" not in str(warren.env.get(uid))


def test_skills_of_a_user_are_listed_and_a_grant_of_no_catalog_skill_is_reported_missing(warren: Warren, uid: str):
    assert warren.skills.list(uid) == {"granted": []}
    assert warren.skills.grant(uid, "no-such-skill")["missing"] == ["no-such-skill"]
    assert warren.skills.revoke(uid, "no-such-skill") is not None
    assert warren.skills.sync(uid)["missing"] == []
    with pytest.raises(WarrenError) as refused:
        warren.skills.grant(uid, "../escape")
    assert refused.value.status == 400 and refused.value.code


def test_a_viewer_link_is_signed_for_a_workdir(warren: Warren, uid: str):
    warren.workdirs.create(uid, path="projects/v")
    link = warren.viewer.create_link(uid=uid, workdir="projects/v", ttl_s=60)
    assert link["url"].startswith("/viewer/open?t=")


def test_pause_resume_kill_terminate_and_delete_a_sandbox(warren: Warren, sandbox: str):
    warren.sandboxes.exec(sandbox, command="true")
    assert warren.sandboxes.kill(sandbox)["sandbox_id"] == sandbox
    paused = warren.sandboxes.pause(sandbox)
    assert paused["sandbox"]["state"] == "paused" and paused["runtime_snapshot"].startswith("snap-")
    assert warren.sandboxes.resume(sandbox)["state"] in {"created", "running"}
    assert warren.sandboxes.terminate(sandbox)["state"] in {"terminated", "terminating"}
    assert warren.sandboxes.delete(sandbox)["state"] == "terminated"
    assert warren.sandboxes.get(sandbox)["state"] == "terminated"


def test_the_server_reports_health_metrics_and_cluster(warren: Warren):
    assert warren.server.health()["status"] == "ok"
    assert b"warren_" in warren.server.metrics()
    assert "nodes" in warren.server.cluster()


def test_errors_carry_the_stable_code_and_never_the_token(warren: Warren):
    with pytest.raises(WarrenError) as missing:
        warren.sandboxes.get("sbx-000000000000000000000000")
    assert (missing.value.status, missing.value.code) == (404, "sandbox_not_found")
    token = warren.transport._token
    assert token not in repr(warren) and token not in str(missing.value)
    bad = Warren(warren.transport.url, "x" * 40)
    with pytest.raises(WarrenError) as unauthorized:
        bad.server.cluster()
    assert (unauthorized.value.status, unauthorized.value.code) == (401, "unauthorized")
    assert "x" * 40 not in repr(bad)


async def test_the_async_client_does_what_the_sync_one_does(awarren: AsyncWarren, uid: str):
    box = (await awarren.sandboxes.create(uid=uid, runtime_scope_id="async"))["sandbox_id"]
    assert (await awarren.sandboxes.exec(box, command="echo a"))["stdout"] == "a\n"
    await awarren.files.write(box, b"z", path="a.txt")
    assert await awarren.files.read(box, path="a.txt") == b"z"
    events = [e async for e in awarren.exec_stream(box, command="echo s")]
    assert events[-1]["result"]["stdout"] == "s\n"
    with pytest.raises(WarrenError) as missing:
        await awarren.files.read(box, path="nope.txt")
    assert missing.value.status == 404


def _main_results(execution: dict) -> list[str]:
    return [r["data"]["text/plain"] for r in execution["results"] if r["is_main_result"]]


def test_code_keeps_its_state_across_executions_in_the_default_context(warren: Warren, sandbox: str):
    first = warren.code.execute(sandbox, code="x = 6 * 7\nprint('set')")
    assert (first["context_id"], first["status"], first["stdout"], first["error"]) == ("default", "ok", "set\n", None)
    second = warren.code.execute(sandbox, code="x")
    assert (second["status"], _main_results(second)) == ("ok", ["42"])
    assert second["execution_count"] == first["execution_count"] + 1
    assert [c["id"] for c in warren.code.list(sandbox)["contexts"]] == ["default"]


def test_code_events_stream_in_the_order_the_kernel_sends_them_with_end_last(warren: Warren, sandbox: str):
    events = list(warren.run_code_stream(sandbox, "print('one')\n6 * 7"))
    assert [e["type"] for e in events] == ["stdout", "result", "end"], events
    stdout, result, end = events
    assert stdout["text"] == "one\n" and stdout["timestamp"] > 0
    assert (result["data"]["text/plain"], result["is_main_result"]) == ("42", True)
    assert (end["context_id"], end["status"], end["execution_count"]) == ("default", "ok", 1)


def test_a_matplotlib_plot_comes_back_as_a_png_result(warren: Warren, sandbox: str):
    execution = warren.code.execute(
        sandbox, code="import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()")
    assert execution["status"] == "ok", execution["error"]
    [plot] = [r for r in execution["results"] if "image/png" in r["data"]]
    assert plot["is_main_result"] is False, "a displayed figure is not the cell's value"
    assert base64.b64decode(plot["data"]["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")


def test_a_context_keeps_its_cwd_and_env_through_a_restart_that_loses_its_state_and_is_removed(
        warren: Warren, sandbox: str):
    warren.files.mkdir(sandbox, path="analysis")
    made = warren.code.create(sandbox, id="ctx-1", cwd="analysis", env={"DATASET": "sales"})
    assert (made["id"], made["language"], made["env"]) == ("ctx-1", "python", {"DATASET": "sales"})
    assert made["cwd"].endswith("/analysis"), made
    assert [c["id"] for c in warren.code.list(sandbox)["contexts"]] == ["ctx-1"]
    assert warren.code.get(sandbox, "ctx-1")["pid"] == made["pid"]
    seen = warren.code.execute(sandbox, context="ctx-1",
                               code="import os\ny = 1\nprint(os.getcwd(), os.environ['DATASET'])")
    assert seen["stdout"] == f"{made['cwd']} sales\n"
    restarted = warren.code.restart(sandbox, "ctx-1")
    assert (restarted["id"], restarted["cwd"], restarted["env"]) == ("ctx-1", made["cwd"], made["env"])
    assert restarted["pid"] != made["pid"]
    gone = warren.code.execute(sandbox, context="ctx-1", code="y")
    assert (gone["status"], gone["error"]["name"]) == ("error", "NameError"), gone
    kept = warren.code.execute(sandbox, context="ctx-1", code="import os\nprint(os.getcwd(), os.environ['DATASET'])")
    assert kept["stdout"] == f"{made['cwd']} sales\n"
    warren.code.remove(sandbox, "ctx-1")
    assert warren.code.list(sandbox)["contexts"] == []
    for call in (lambda: warren.code.get(sandbox, "ctx-1"),
                 lambda: warren.code.execute(sandbox, context="ctx-1", code="1")):
        with pytest.raises(WarrenError) as missing:
            call()
        assert (missing.value.status, missing.value.code) == (404, "code_context_not_found")


def test_an_interrupt_ends_the_running_execution_with_keyboard_interrupt_and_keeps_the_state(
        warren: Warren, sandbox: str):
    warren.code.create(sandbox, id="loop")
    warren.code.execute(sandbox, context="loop", code="kept = 'yes'")
    started = threading.Event()
    events: list[dict] = []

    def run() -> None:
        code = "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.1)"
        for event in warren.run_code_stream(sandbox, code, context="loop"):
            events.append(event)
            if event["type"] == "stdout":
                started.set()

    runner = threading.Thread(target=run)
    runner.start()
    assert started.wait(60), f"the loop did not start: {events}"
    warren.code.interrupt(sandbox, "loop")
    runner.join(60)
    assert not runner.is_alive(), "the stream did not end after the interrupt"
    assert [e["type"] for e in events[-2:]] == ["error", "end"], events
    assert (events[-2]["name"], events[-1]["status"]) == ("KeyboardInterrupt", "error")
    after = warren.code.execute(sandbox, context="loop", code="kept")
    assert _main_results(after) == ["'yes'"]


def test_an_execution_past_its_timeout_is_interrupted_and_ends_with_status_timeout(warren: Warren, sandbox: str):
    warren.code.execute(sandbox, code="kept = 1")
    began = time.monotonic()
    looped = warren.code.execute(sandbox, code="while True:\n    pass", timeout_s=1)
    assert looped["status"] == "timeout", looped
    assert time.monotonic() - began < 30
    assert _main_results(warren.code.execute(sandbox, code="kept + 1")) == ["2"], "the kernel's state stays"


def test_an_unknown_language_is_refused_as_unsupported_language(warren: Warren, sandbox: str):
    with pytest.raises(WarrenError) as refused:
        warren.code.execute(sandbox, code="1", language="cobol")
    assert (refused.value.status, refused.value.code) == (400, "unsupported_language")
    with pytest.raises(WarrenError) as refused_context:
        warren.code.create(sandbox, language="cobol")
    assert (refused_context.value.status, refused_context.value.code) == (400, "unsupported_language")


async def test_the_async_client_runs_code_gathered_and_streamed(awarren: AsyncWarren, uid: str):
    box = (await awarren.sandboxes.create(uid=uid, runtime_scope_id="async-code"))["sandbox_id"]
    gathered = await awarren.code.execute(box, code="z = 5\nz * 2")
    assert (gathered["status"], _main_results(gathered)) == ("ok", ["10"])
    code = "import os\nprint(z, os.environ['MODE'])"
    events = [e async for e in awarren.run_code_stream(box, code, env={"MODE": "async"})]
    assert [(e["type"], e.get("text")) for e in events] == [("stdout", "5 async\n"), ("end", None)]
    assert events[-1]["status"] == "ok"
    after = await awarren.code.execute(box, code="'MODE' in os.environ")
    assert _main_results(after) == ["False"], "an execution's env is its own"
