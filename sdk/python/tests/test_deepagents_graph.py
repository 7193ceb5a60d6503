"""A real deepagents graph (`create_deep_agent`) on `WarrenBackend`, driven by a scripted
fake chat model (no network but warren's): the main agent and a sub-agent (deepagents'
`task` tool) work in one runtime; a second thread of the same user on the same workdir
sees the files but gets a runtime of its own; an output is presented as an artifact and
downloaded through the SDK; a lease is held while the run lives and released at its end.
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
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_config

from warren_sdk import Warren, WarrenError
from warren_sdk.deepagents import RunIdentity, WarrenBackend, WarrenRunMiddleware
from warren_sdk.deepagents.backend import identity_from_config


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
