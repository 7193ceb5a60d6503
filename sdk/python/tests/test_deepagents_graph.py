"""A real deepagents graph (`create_deep_agent`) on `WarrenBackend`, driven by a scripted
fake chat model (no network but warren's): the main agent and a sub-agent (deepagents'
`task` tool) work in one runtime; a second thread of the same user on the same workdir
sees the files but gets a runtime of its own; an output is presented as an artifact and
downloaded through the SDK; a lease is held while the run lives and released at its end;
the file tools of the main agent and of its sub-agents write only inside the run's workdir
(I10), the run's own when its config names one.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Any

import pytest
from deepagents import create_deep_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_config

from warren_sdk import Warren, WarrenError
from deepagents.middleware.filesystem import FilesystemPermission
from warren_sdk.deepagents import (RunIdentity, WarrenBackend, WarrenRunMiddleware, create_warren_deep_agent,
                                   workdir_permissions)
from warren_sdk.deepagents.backend import identity_from_config
from warren_sdk.deepagents.permissions import check_rules, write_denied


class ScriptedModel(GenericFakeChatModel):
    """`GenericFakeChatModel` answering from its script whatever tools it is bound to."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def call(name: str, call_id: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def calls(*items: tuple[str, str, dict[str, Any]]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, i, a in items])


def tool_results(result: dict[str, Any]) -> dict[str, str]:
    return {m.tool_call_id: str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)}


class ToolResults(BaseCallbackHandler):
    """Every `ToolMessage` of a run, its sub-agents' included (they are not in its messages)."""

    def __init__(self) -> None:
        self.seen: dict[str, ToolMessage] = {}

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        if isinstance(output, ToolMessage):
            self.seen[output.tool_call_id] = output


def missing(client: Warren, sandbox_id: str, path: str) -> bool:
    try:
        client.files.stat(sandbox_id, path=path)
    except WarrenError as err:
        return err.code == "not_found"
    return False


@pytest.fixture
def client() -> Iterator[Warren]:
    url, token = os.environ.get("WARREN_URL"), os.environ.get("WARREN_TOKEN")
    if not url or not token:
        raise RuntimeError("set WARREN_URL and WARREN_TOKEN to the warren server under test")
    with Warren(url, token) as w:
        yield w


def test_a_sub_agent_runs_in_its_root_runs_sandbox_and_a_caller_may_name_the_root() -> None:
    parent = {"configurable": {"user_id": "u", "thread_id": "t-1", "ls_agent_type": "subagent"}}
    own_thread = {"configurable": {"user_id": "u", "thread_id": "sub-9", "root_thread_id": "t-1", "workdir": "p/x"}}
    assert identity_from_config(parent, workdir="p/x") == RunIdentity("u", "t-1", "p/x")
    assert identity_from_config(own_thread) == RunIdentity("u", "t-1", "p/x")
    with pytest.raises(ValueError, match="user_id"):
        identity_from_config({"configurable": {"thread_id": "t-1"}})


async def test_main_and_sub_agent_share_a_runtime_a_second_thread_shares_only_the_workdir(client: Warren) -> None:
    uid = f"sdk-da-{uuid.uuid4().hex[:12]}"
    workdir = "projects/deep"
    wd = f"/home/gem/user-data/{workdir}"
    backend = WarrenBackend(client, workdir=workdir)
    middleware = WarrenRunMiddleware(backend)

    @tool
    def lease_probe() -> str:
        """The lease this run holds on its sandbox."""
        return backend.lease_of(backend.identity(get_config())) or "no lease"

    thread_a = {"configurable": {"user_id": uid, "thread_id": "thread-a"}}
    thread_b = {"configurable": {"user_id": uid, "thread_id": "thread-b"}}
    identity_a, identity_b = RunIdentity(uid, "thread-a", workdir), RunIdentity(uid, "thread-b", workdir)

    script_a = ScriptedModel(messages=iter([
        calls(("write_file", "main-write", {"file_path": f"{wd}/notes/main.txt", "content": "written by the main agent\n"}),
              ("execute", "main-exec", {"command": "echo thread-a > /tmp/marker-a && (nohup sleep 613 >/dev/null 2>&1 &) && echo started"}),
              ("lease_probe", "probe", {})),
        call("task", "delegate", description="Write the report into outputs/.", subagent_type="general-purpose"),
        # the sub-agent's turns
        calls(("execute", "sub-exec", {"command": f"cat /tmp/marker-a > {wd}/notes/seen-by-sub.txt"}),
              ("write_file", "sub-write", {"file_path": f"{wd}/outputs/report.md", "content": "# Report\nby the sub-agent\n"})),
        AIMessage(content="report written"),
        # back in the main agent
        call("present_files", "present", paths=[f"{wd}/outputs/report.md"]),
        AIMessage(content="done"),
    ]))
    script_b = ScriptedModel(messages=iter([
        calls(("read_file", "b-read-workdir", {"file_path": f"{wd}/notes/main.txt"}),
              ("read_file", "b-read-tmp", {"file_path": "/tmp/marker-a"}),
              ("execute", "b-ps", {"command": "pgrep -f '^sleep 613$' || echo no-such-process"})),
        AIMessage(content="seen"),
    ]))
    agent_a = create_deep_agent(model=script_a, backend=backend, tools=[lease_probe], middleware=[middleware])
    agent_b = create_deep_agent(model=script_b, backend=backend, middleware=[middleware])

    try:
        # Thread A runs sync (in a worker thread), thread B async: both paths of the backend.
        result_a = await asyncio.to_thread(agent_a.invoke, {"messages": [{"role": "user", "content": "go"}]}, thread_a)
        seen_a = tool_results(result_a)
        sandbox_a = backend.sandbox_for(identity_a)

        # The sub-agent ran in the main agent's runtime: it read the main agent's /tmp.
        assert seen_a["delegate"] == "report written"
        assert client.files.read(sandbox_a.id, path=f"{wd}/notes/seen-by-sub.txt") == b"thread-a\n"
        assert "started" in seen_a["main-exec"]
        assert client.files.read(sandbox_a.id, path=f"{wd}/notes/main.txt") == b"written by the main agent\n"
        assert client.files.read(sandbox_a.id, path=f"{wd}/outputs/report.md") == b"# Report\nby the sub-agent\n"

        # A lease was held while the run lived, and released at its end.
        lease_id = seen_a["probe"]
        assert lease_id.startswith("lease-"), lease_id
        assert backend.lease_of(identity_a) is None
        with pytest.raises(WarrenError) as released:
            client.leases.release(sandbox_a.id, lease_id)
        assert released.value.code == "lease_not_found"

        # The report was presented and downloads through the SDK.
        assert "outputs/report.md" in seen_a["present"]
        (artifact,) = client.artifacts.list(sandbox_a.id)["artifacts"]
        assert artifact["path"].endswith("outputs/report.md")
        assert client.artifacts.download(sandbox_a.id, artifact["artifact_id"]) == b"# Report\nby the sub-agent\n"

        result_b = await agent_b.ainvoke({"messages": [{"role": "user", "content": "look"}]}, thread_b)
        seen_b = tool_results(result_b)
        sandbox_b = backend.sandbox_for(identity_b)

        # Another thread: another runtime on the same workdir.
        assert sandbox_b.id != sandbox_a.id
        assert "written by the main agent" in seen_b["b-read-workdir"]
        assert "not_found" in seen_b["b-read-tmp"] or "not found" in seen_b["b-read-tmp"], seen_b["b-read-tmp"]
        assert "no-such-process" in seen_b["b-ps"], seen_b["b-ps"]
        # ... while thread A's process still runs in thread A's runtime.
        assert sandbox_a.execute("pgrep -f '^sleep 613$'").exit_code == 0

        # One sandbox per thread, none for the sub-agent.
        scopes = sorted(s["runtime_scope_id"] for s in client.sandboxes.list(uid=uid)["sandboxes"])
        assert scopes == ["thread-a", "thread-b"]
    finally:
        for s in client.sandboxes.list(uid=uid)["sandboxes"]:
            client.sandboxes.delete(s["sandbox_id"])


def test_hold_releases_the_runs_lease_even_when_the_run_fails(client: Warren) -> None:
    uid = f"sdk-da-{uuid.uuid4().hex[:12]}"
    backend = WarrenBackend(client)
    config = {"configurable": {"user_id": uid, "thread_id": "failing-run"}}
    held: list[tuple[str, str]] = []
    try:
        with pytest.raises(RuntimeError, match="the run failed"), backend.hold(config) as sandbox:
            held.append((sandbox.id, backend.lease_of(backend.identity(config)) or ""))
            raise RuntimeError("the run failed")
        ((sandbox_id, lease_id),) = held
        assert lease_id.startswith("lease-")
        assert backend.lease_of(backend.identity(config)) is None
        with pytest.raises(WarrenError) as released:
            client.leases.release(sandbox_id, lease_id)
        assert released.value.code == "lease_not_found"
    finally:
        for s in client.sandboxes.list(uid=uid)["sandboxes"]:
            client.sandboxes.delete(s["sandbox_id"])


def test_concurrent_first_calls_of_one_identity_create_its_sandbox_once(client: Warren, monkeypatch: pytest.MonkeyPatch) -> None:
    uid = f"sdk-da-{uuid.uuid4().hex[:12]}"
    backend = WarrenBackend(client, workdir="projects/race")
    creates: list[str] = []
    real_create = client.sandboxes.create

    def counting_create(**kwargs: Any) -> Any:
        creates.append(kwargs["runtime_scope_id"])
        time.sleep(0.2)  # widen the window in which a second caller could slip through
        return real_create(**kwargs)

    monkeypatch.setattr(client.sandboxes, "create", counting_create)
    identity = RunIdentity(uid, "thread-1", "projects/race")
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            ids = set(pool.map(lambda _: backend.sandbox_for(identity).id, range(8)))
        assert len(ids) == 1
        assert creates == ["thread-1"]
    finally:
        for s in client.sandboxes.list(uid=uid)["sandboxes"]:
            client.sandboxes.delete(s["sandbox_id"])


def test_the_default_rules_allow_writes_only_under_the_workdir_and_the_artifacts_root() -> None:
    wd = "/home/gem/user-data/projects/x"
    rules = workdir_permissions("projects/x")
    assert rules == workdir_permissions(wd)
    allowed = [f"{wd}/a.txt", f"{wd}/.hidden/b", "notes/c.txt", "/home/gem/.deepagents/large_tool_results/1"]
    denied = {
        "/etc/x": "/etc/x",
        "/home/gem/.profile": "/home/gem/.profile",  # a dot-name is matched by the deny rule too
        "/home/gem/user-data/projects/xy/f": "/home/gem/user-data/projects/xy/f",
        f"{wd}/../other/f": "/home/gem/user-data/projects/other/f",
        "../other/f": "/home/gem/user-data/projects/other/f",
        wd: wd,  # the workdir itself stays
    }
    for path in allowed:
        assert write_denied(rules, path, workdir_path=wd) is None, path
    for path, judged in denied.items():
        assert write_denied(rules, path, workdir_path=wd) == f"Error: permission denied for write on {judged}", path

    # A recursive delete is denied when a deny rule is anchored inside it, whatever the order.
    keep = [FilesystemPermission(operations=["write"], paths=[f"{wd}/**"]),
            FilesystemPermission(operations=["write"], paths=[f"{wd}/keep/**"], mode="deny")]
    assert write_denied(keep, f"{wd}/keep", workdir_path=wd) is None
    assert "deny rule" in (write_denied(keep, f"{wd}/keep", workdir_path=wd, recursive=True) or "")

    # What a backend cannot apply is refused, not ignored.
    with pytest.raises(ValueError, match="write rules only"):
        check_rules([FilesystemPermission(operations=["read"], paths=["/etc/**"], mode="deny")])
    with pytest.raises(ValueError, match="'allow' and 'deny'"):
        check_rules([FilesystemPermission(operations=["write"], paths=["/**"], mode="interrupt")])
    with pytest.raises(ValueError, match="write rules only"):
        WarrenBackend(Warren("http://127.0.0.1:9", "t" * 40),
                      permissions=[FilesystemPermission(operations=["read", "write"], paths=["/**"])])


def test_the_main_agent_and_its_sub_agent_write_only_inside_the_workdir(client: Warren) -> None:
    uid = f"sdk-da-{uuid.uuid4().hex[:12]}"
    workdir = "projects/perm"
    wd = f"/home/gem/user-data/{workdir}"
    other = "/home/gem/user-data/other"
    backend = WarrenBackend(client, workdir=workdir)

    @tool
    def upload_probe() -> str:
        """Uploads one file inside the workdir and one outside, through the backend."""
        done = backend.upload_files([(f"{wd}/up.txt", b"up\n"), ("/etc/up", b"escaped\n")])
        return ",".join(str(r.error) for r in done)

    script = ScriptedModel(messages=iter([
        calls(("write_file", "in", {"file_path": f"{wd}/inside.txt", "content": "inside\n"}),
              ("upload_probe", "upload", {}),
              ("write_file", "other-dir", {"file_path": f"{other}/x.txt", "content": "escaped\n"}),
              ("write_file", "etc", {"file_path": "/etc/x", "content": "escaped\n"}),
              ("write_file", "dotfile", {"file_path": "/home/gem/.warren-probe", "content": "escaped\n"}),
              ("edit_file", "edit-other", {"file_path": f"{other}/keep.txt", "old_string": "keep", "new_string": "gone"})),
        calls(("delete", "delete-other", {"file_path": other}),
              ("edit_file", "edit-in", {"file_path": f"{wd}/inside.txt", "old_string": "inside", "new_string": "edited"})),
        call("task", "delegate", description="Write your notes.", subagent_type="general-purpose"),
        # the sub-agent's turns
        calls(("write_file", "sub-tmp", {"file_path": "/tmp/sub.txt", "content": "escaped\n"}),
              ("write_file", "sub-in", {"file_path": f"{wd}/sub.txt", "content": "by the sub-agent\n"})),
        AIMessage(content="sub-agent done"),
        AIMessage(content="done"),
    ]))
    agent = create_warren_deep_agent(script, backend, tools=[upload_probe])
    results = ToolResults()
    config = {"configurable": {"user_id": uid, "thread_id": "perm"}, "callbacks": [results]}
    try:
        sandbox = backend.sandbox_for(backend.identity(config))
        client.files.write(sandbox.id, b"keep\n", path=f"{other}/keep.txt")
        result = agent.invoke({"messages": [{"role": "user", "content": "go"}]}, config)
        seen = results.seen

        for call_id, path in [("other-dir", f"{other}/x.txt"), ("etc", "/etc/x"), ("dotfile", "/home/gem/.warren-probe"),
                              ("edit-other", f"{other}/keep.txt"), ("delete-other", other), ("sub-tmp", "/tmp/sub.txt")]:
            assert seen[call_id].status == "error", (call_id, seen[call_id].content)
            assert seen[call_id].content == f"Error: permission denied for write on {path}", call_id
        for call_id in ("in", "edit-in", "sub-in"):
            assert seen[call_id].status == "success", (call_id, seen[call_id].content)
        assert tool_results(result)["delegate"] == "sub-agent done"
        assert seen["upload"].content == "None,permission_denied"

        # Nothing denied reached warren; what was allowed did.
        for path in (f"{other}/x.txt", "/etc/x", "/etc/up", "/home/gem/.warren-probe", "/tmp/sub.txt"):
            assert missing(client, sandbox.id, path), path
        assert client.files.read(sandbox.id, path=f"{other}/keep.txt") == b"keep\n"
        assert client.files.read(sandbox.id, path=f"{wd}/inside.txt") == b"edited\n"
        assert client.files.read(sandbox.id, path=f"{wd}/sub.txt") == b"by the sub-agent\n"
        assert client.files.read(sandbox.id, path=f"{wd}/up.txt") == b"up\n"
    finally:
        for s in client.sandboxes.list(uid=uid)["sandboxes"]:
            client.sandboxes.delete(s["sandbox_id"])


async def test_a_run_naming_its_own_workdir_writes_there_and_not_in_the_backends_workdir(client: Warren) -> None:
    uid = f"sdk-da-{uuid.uuid4().hex[:12]}"
    backend = WarrenBackend(client, workdir="projects/default")
    own, default = "/home/gem/user-data/projects/own", "/home/gem/user-data/projects/default"
    script = ScriptedModel(messages=iter([
        calls(("write_file", "own", {"file_path": f"{own}/y.txt", "content": "mine\n"}),
              ("write_file", "default", {"file_path": f"{default}/z.txt", "content": "not mine\n"})),
        AIMessage(content="done"),
    ]))
    config = {"configurable": {"user_id": uid, "thread_id": "own", "workdir": "projects/own"}}
    try:
        # Async this time: the backend's async write path applies the rules too.
        agent = create_warren_deep_agent(script, backend)
        seen = tool_results(await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config))
        sandbox = backend.sandbox_for(backend.identity(config))
        assert sandbox.workdir_path == own
        assert seen["default"] == f"Error: permission denied for write on {default}/z.txt"
        assert client.files.read(sandbox.id, path=f"{own}/y.txt") == b"mine\n"
        assert missing(client, sandbox.id, f"{default}/z.txt")
    finally:
        for s in client.sandboxes.list(uid=uid)["sandboxes"]:
            client.sandboxes.delete(s["sandbox_id"])
