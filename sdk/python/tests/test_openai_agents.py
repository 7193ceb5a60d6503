"""The OpenAI Agents SDK's sandbox (openai-agents 0.24, `agents.sandbox`) on warren, driven
through the SDK's own public session API (`SandboxSession`: start, exec, read, write,
running, persist_workspace, hydrate_workspace, PTY, aclose) and the client's lifecycle
(create, serialize/deserialize state, resume, delete), against the live server named by
WARREN_URL / WARREN_TOKEN. No model is involved: these are the calls a SandboxAgent's
tools make."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agents import Model
from agents.sandbox import LocalSnapshotSpec, Manifest
from agents.sandbox.entries import File
from agents.sandbox.errors import (
    ExecTimeoutError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Environment
from agents.sandbox.session import SandboxSession

from warren_sdk import AsyncWarren, Warren
from warren_sdk.openai_agents import (
    CheckpointRef,
    WarrenSandboxClient,
    WarrenSandboxClientOptions,
    WarrenSandboxSessionState,
)


@pytest.fixture
async def client(awarren: AsyncWarren) -> AsyncIterator[WarrenSandboxClient]:
    yield WarrenSandboxClient(awarren)


def _options(uid: str, workdir: str = "projects/agents", **extra: object) -> WarrenSandboxClientOptions:
    return WarrenSandboxClientOptions(uid=uid, workdir=workdir, runtime_scope_id=f"t-{uuid.uuid4().hex[:8]}", **extra)


async def _read_text(session: SandboxSession, path: str) -> str:
    return (await session.read(Path(path))).read().decode()


async def test_a_created_session_runs_commands_in_its_warren_workdir(client, uid, warren: Warren):
    session = await client.create(options=_options(uid))
    async with session:
        assert session.state.manifest.root == "/home/gem/user-data/projects/agents"
        result = await session.exec("pwd; echo out; echo err >&2")
        assert result.exit_code == 0
        assert result.stdout == b"/home/gem/user-data/projects/agents\nout\n"
        assert result.stderr == b"err\n"
        failed = await session.exec("exit 7")
        assert failed.exit_code == 7 and not failed.ok()
        assert await session.running() is True
        sandbox = warren.sandboxes.get(session.state.sandbox_id)
        assert (sandbox["uid"], sandbox["runtime_scope_id"]) == (uid, session.state.runtime_scope_id)
    await client.delete(session)


async def test_the_manifest_is_materialized_and_its_environment_reaches_commands(client, uid):
    manifest = Manifest(entries={"README.md": File(content=b"# from the manifest\n")}, environment=Environment(value={"GREETING": "hej"}))
    session = await client.create(manifest=manifest, options=_options(uid, env={"BASE": "b"}))
    async with session:
        assert await _read_text(session, "README.md") == "# from the manifest\n"
        result = await session.exec('printf "%s %s" "$GREETING" "$BASE"')
        assert result.stdout == b"hej b"
    await client.delete(session)


async def test_files_written_through_the_session_are_read_back_and_a_missing_one_is_not_found(client, uid, warren):
    session = await client.create(options=_options(uid))
    async with session:
        await session.write(Path("src/app.py"), io.BytesIO(b"print('hi')\n"))
        assert await _read_text(session, "src/app.py") == "print('hi')\n"
        assert (await session.exec("python3 src/app.py || cat src/app.py")).exit_code == 0
        # The same file, seen through warren's own API: the workdir is the uid's.
        assert warren.files.read(session.state.sandbox_id, path="src/app.py") == b"print('hi')\n"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("no/such/file"))
    await client.delete(session)


async def test_a_command_over_its_timeout_raises_exec_timeout(client, uid):
    session = await client.create(options=_options(uid))
    async with session:
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 30", timeout=1.5)
        assert (await session.exec("echo after")).stdout == b"after\n"
    await client.delete(session)


async def test_persist_then_hydrate_restores_the_checkpoint_into_a_new_session(client, uid, warren):
    first = await client.create(options=_options(uid))
    async with first:
        await first.write(Path("notes.md"), io.BytesIO(b"v1"))
        archive = await first.persist_workspace()
        payload = archive.read()
        ref = CheckpointRef.decode(payload)
        assert ref is not None and ref.sandbox_id == first.state.sandbox_id
        assert ref.checkpoint_id in [c["checkpoint_id"] for c in warren.checkpoints.list(ref.sandbox_id)["checkpoints"]]
        await first.write(Path("notes.md"), io.BytesIO(b"v2"))
        await first.write(Path("later.md"), io.BytesIO(b"made after the checkpoint"))

    # Another SDK session, on another warren sandbox (runtime scope) of the same workdir.
    second = await client.create(options=_options(uid))
    assert second.state.sandbox_id != first.state.sandbox_id
    async with second:
        await second.hydrate_workspace(io.BytesIO(payload))
        assert await _read_text(second, "notes.md") == "v1"
        with pytest.raises(WorkspaceReadNotFoundError):
            await second.read(Path("later.md"))
    await client.delete(first)
    await client.delete(second)


async def test_a_checkpoint_of_another_workdir_is_refused_with_a_clear_error(client, uid):
    first = await client.create(options=_options(uid, workdir="projects/one"))
    async with first:
        payload = (await first.persist_workspace()).read()
    second = await client.create(options=_options(uid, workdir="projects/two"))
    async with second:
        with pytest.raises(WorkspaceArchiveWriteError, match="workspace_persistence='tar'"):
            await second.hydrate_workspace(io.BytesIO(payload))
    await client.delete(first)
    await client.delete(second)


async def test_tar_persistence_moves_a_workspace_into_another_workdir(client, uid):
    first = await client.create(options=_options(uid, workdir="projects/src", workspace_persistence="tar"))
    async with first:
        await first.write(Path("a/b.txt"), io.BytesIO(b"carried"))
        payload = (await first.persist_workspace()).read()
        assert CheckpointRef.decode(payload) is None  # a tar archive, portable
    second = await client.create(options=_options(uid, workdir="projects/dst"))
    async with second:
        await second.hydrate_workspace(io.BytesIO(payload))
        assert await _read_text(second, "a/b.txt") == "carried"
    await client.delete(first)
    await client.delete(second)


async def test_resume_reattaches_the_same_sandbox_and_restores_a_drifted_workspace(client, uid, warren, tmp_path):
    options = _options(uid)
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=options)
    await session.start()
    await session.write(Path("state.txt"), io.BytesIO(b"persisted"))
    await session.aclose()  # stop() persists (a checkpoint reference in the local snapshot), then terminates
    assert warren.sandboxes.get(session.state.sandbox_id)["state"] == "terminated"

    payload = client.serialize_session_state(session.state)
    # The workspace drifts while no session holds it.
    warren.files.write(session.state.sandbox_id, b"changed behind the session's back", path="state.txt")

    state = client.deserialize_session_state(payload)
    assert isinstance(state, WarrenSandboxSessionState)
    resumed = await client.resume(state)
    assert resumed.state.sandbox_id == session.state.sandbox_id
    async with resumed:
        assert await _read_text(resumed, "state.txt") == "persisted"
        assert (await resumed.exec("cat state.txt")).stdout == b"persisted"
    await client.delete(resumed)


async def test_delete_terminates_the_sandbox_and_the_files_stay(client, uid, warren):
    session = await client.create(options=_options(uid, on_exit="keep"))
    async with session:
        await session.write(Path("kept.txt"), io.BytesIO(b"kept"))
        await session.exec("true")
    assert warren.sandboxes.get(session.state.sandbox_id)["state"] == "running"  # on_exit="keep"
    await client.delete(session)
    assert warren.sandboxes.get(session.state.sandbox_id)["state"] == "terminated"
    assert warren.files.read(session.state.sandbox_id, path="kept.txt") == b"kept"


async def test_a_pty_process_takes_input_on_a_terminal_and_reports_its_exit(client, uid):
    session = await client.create(options=_options(uid))
    async with session:
        assert session.supports_pty()
        started = await session.pty_exec_start(
            "test -t 0 && echo on-a-tty; read name; echo hello $name; exit 3", tty=True, yield_time_s=1
        )
        assert started.process_id is not None
        assert b"on-a-tty" in started.output
        update = await session.pty_write_stdin(session_id=started.process_id, chars="warren\n", yield_time_s=5)
        output = started.output + update.output
        assert b"hello warren" in output
        assert update.process_id is None and update.exit_code == 3


async def test_a_pty_process_without_tty_streams_output_until_it_ends(client, uid):
    session = await client.create(options=_options(uid))
    async with session:
        update = await session.pty_exec_start("for i in 1 2 3; do echo line$i; done", yield_time_s=5)
        assert update.output.replace(b"\r", b"") == b"line1\nline2\nline3\n"
        assert update.exit_code == 0 and update.process_id is None


async def test_pty_processes_still_running_are_killed_when_the_session_closes(client, uid, warren):
    session = await client.create(options=_options(uid))
    await session.start()
    started = await session.pty_exec_start("sleep 300", tty=True, yield_time_s=0.3)
    assert started.process_id is not None and started.exit_code is None
    running = [p for p in warren.processes.list(session.state.sandbox_id)["processes"] if p["status"] == "running"]
    assert len(running) == 1
    await session.pty_terminate_all()
    after = [p for p in warren.processes.list(session.state.sandbox_id)["processes"] if p["status"] == "running"]
    assert after == []
    await session.aclose()
    await client.delete(session)


async def test_a_manifest_root_outside_the_uid_workspace_is_refused(client, uid):
    with pytest.raises(ValueError, match="/home/gem/user-data"):
        await client.create(manifest=Manifest(root="/workspace"), options=_options(uid))


class _ScriptedModel(Model):
    """A `Model` that needs no network: it asks for one `exec_command` call, then answers
    with the tool's output it was given back. What a real model does, minus the guessing."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.calls = 0

    async def get_response(self, system_instructions, input, model_settings, tools, *args, **kwargs):
        from agents.items import ModelResponse
        from agents.usage import Usage
        from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

        self.calls += 1
        if self.calls == 1:
            assert "exec_command" in [tool.name for tool in tools]
            call = ResponseFunctionToolCall(
                id="fc_1", call_id="call_1", type="function_call", name="exec_command",
                arguments=json.dumps({"cmd": self.command, "yield_time_ms": 5000}),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        outputs = [item["output"] for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"]
        text = ResponseOutputText(type="output_text", text=f"tool said: {outputs[-1]}", annotations=[])
        message = ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model answers get_response only")


async def test_a_sandbox_agent_run_executes_its_tool_calls_in_the_warren_sandbox(client, uid, warren):
    from agents import RunConfig, Runner
    from agents.sandbox import SandboxAgent, SandboxRunConfig

    model = _ScriptedModel("echo from-the-agent > agent.txt && cat agent.txt && pwd")
    agent = SandboxAgent(name="worker", instructions="Use the shell.", model=model)
    options = _options(uid, workdir="projects/run", on_exit="keep")
    result = await Runner.run(
        agent, "write agent.txt",
        run_config=RunConfig(sandbox=SandboxRunConfig(client=client, options=options), tracing_disabled=True),
    )
    assert model.calls == 2
    assert "from-the-agent" in result.final_output
    assert "/home/gem/user-data/projects/run" in result.final_output
    # The tool ran in warren: the file is in the uid's workdir.
    [sandbox] = [s for s in warren.sandboxes.list(uid=uid)["sandboxes"] if s["runtime_scope_id"] == options.runtime_scope_id]
    assert warren.files.read(sandbox["sandbox_id"], path="agent.txt") == b"from-the-agent\n"
    warren.sandboxes.delete(sandbox["sandbox_id"])
