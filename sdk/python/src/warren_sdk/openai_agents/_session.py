"""`WarrenSandboxSession`: one OpenAI Agents SDK sandbox session on one warren sandbox.

What the SDK asks of a backend (`BaseSandboxSession`) and what warren does for it:
- `exec`: `POST /v1/sandboxes/{id}/exec`, streamed, so a cancelled call disconnects and
  warren kills the command's tree; the workspace root is the cwd.
- `read` / `write`: warren's file API (symlinks in any component are refused by warren).
- `running`: the sandbox's state is `running`.
- `persist_workspace` / `hydrate_workspace`: a warren checkpoint of the workdir (a small
  reference travels, not the files) or, in `tar` mode, a portable tar archive.
- PTY: warren processes on a terminal, stdin written, output followed from an offset.
- `shutdown`: terminate (files stay, I15), pause, or keep the sandbox (`on_exit`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import math
import shlex
import time
from pathlib import Path
from typing import Any

import httpx
from agents.sandbox.errors import (
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    SandboxRuntimeError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.tar_workspace import shell_tar_exclude_args
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path, sandbox_path_str

from .._transport import WarrenError
from ._errors import (
    exec_transport_error,
    is_retryable,
    read_error,
    start_error,
    warren_context,
    write_error,
)
from ._persistence import CheckpointRef
from ._pty import PtyEntry, exit_code_of
from ._state import WarrenSandboxSessionState

logger = logging.getLogger(__name__)

# Terminal size of a `tty=True` process (what a plain terminal starts with).
_PTY_SIZE = {"cols": 80, "rows": 24}
# Answers that say the sandbox is already where shutdown wants it.
_ALREADY_DOWN = frozenset(
    {"sandbox_terminated", "sandbox_terminating", "sandbox_not_found", "sandbox_state_conflict", "sandbox_paused"}
)


class WarrenSandboxSession(BaseSandboxSession):
    """An Agents SDK sandbox session whose commands and files are a warren sandbox's."""

    state: WarrenSandboxSessionState

    def __init__(self, *, state: WarrenSandboxSessionState, warren: Any) -> None:
        self.state = state
        self._warren = warren
        self._pty_lock = asyncio.Lock()
        self._pty_processes: dict[int, PtyEntry] = {}
        self._reserved_pty_ids: set[int] = set()

    @property
    def sandbox_id(self) -> str:
        return self.state.sandbox_id

    def _root(self) -> str:
        return sandbox_path_str(self._workspace_root_path())

    async def _resolved_envs(self) -> dict[str, str]:
        manifest_envs = await self.state.manifest.environment.resolve()
        return {**self.state.base_env_vars, **manifest_envs}

    def _timeout_s(self, timeout: float | None) -> int:
        """warren's whole-second `timeout_s` (1 to 3600) for the SDK's optional float."""
        if timeout is None:
            return self.state.exec_timeout_unbounded_s
        return max(1, min(3600, math.ceil(timeout)))

    # -- lifecycle -------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        """Makes the sandbox usable: a terminated one gets a new generation (same id, same
        files), a paused one is resumed. Its runtime itself starts on first use (I12)."""
        root = self._workspace_root_path()
        try:
            info = await self._warren.sandboxes.get(self.sandbox_id)
            if info["state"] in ("terminated", "terminating"):
                info = await self._warren.sandboxes.create(
                    uid=self.state.uid,
                    runtime_scope_id=self.state.runtime_scope_id,
                    workdir=self.state.workdir,
                    labels=self.state.labels,
                    timeout_s=self.state.timeout_s,
                    inherit_env=self.state.inherit_env,
                )
                self.state.sandbox_id = info["sandbox_id"]
            if info["state"] in ("paused", "pausing"):
                await self._warren.sandboxes.resume(self.sandbox_id)
        except (WarrenError, httpx.HTTPError) as error:
            raise start_error(root, error, reason="sandbox_unavailable") from error

    async def _shutdown_backend(self) -> None:
        """What `on_exit` says: terminate (files stay), pause, or keep the sandbox."""
        action = self.state.on_exit
        try:
            if action == "terminate":
                await self._warren.sandboxes.delete(self.sandbox_id)
            elif action == "pause":
                await self._warren.sandboxes.pause(self.sandbox_id)
        except WarrenError as error:
            if error.code in _ALREADY_DOWN:
                return
            raise SandboxRuntimeError(
                message=f"warren could not {action} sandbox {self.sandbox_id}: {error.code}: {error.message}",
                error_code=ErrorCode.WORKSPACE_STOP_ERROR,
                op="shutdown",
                context=warren_context(error),
                cause=error,
                retryable=is_retryable(error),
            ) from error

    async def running(self) -> bool:
        try:
            info = await self._warren.sandboxes.get(self.sandbox_id)
        except (WarrenError, httpx.HTTPError):
            return False
        return bool(info["state"] == "running")

    # -- commands ------------------------------------------------------------------

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(part) for part in command]
        try:
            run = self._exec_stream(argv, timeout_s=self._timeout_s(timeout))
            if timeout is None:
                result, stdout, stderr = await run
            else:
                result, stdout, stderr = await asyncio.wait_for(run, timeout=max(timeout, 0.001))
        except asyncio.TimeoutError as error:
            raise ExecTimeoutError(command=command, timeout_s=timeout, cause=error) from error
        except (WarrenError, httpx.HTTPError) as error:
            raise exec_transport_error(command, error) from error
        if result.get("timed_out"):
            raise ExecTimeoutError(command=command, timeout_s=timeout, context={"backend": "warren"})
        exit_code = exit_code_of(result)
        if exit_code is None:
            raise ExecTransportError(
                command=command,
                context={"backend": "warren", "reason": "no_exit_status", "run_id": result.get("run_id")},
                message="warren exec ended without an exit status (its runtime went away)",
                retryable=True,
            )
        # The streamed bytes are exact; the result's text is the fallback.
        if not stdout and result.get("stdout"):
            stdout = bytearray(str(result["stdout"]).encode("utf-8"))
        if not stderr and result.get("stderr"):
            stderr = bytearray(str(result["stderr"]).encode("utf-8"))
        return ExecResult(stdout=bytes(stdout), stderr=bytes(stderr), exit_code=exit_code)

    async def _exec_stream(self, argv: list[str], *, timeout_s: int) -> tuple[dict[str, Any], bytearray, bytearray]:
        """Runs `argv` in the workspace root and gathers its output and result."""
        envs = await self._resolved_envs()
        stdout, stderr = bytearray(), bytearray()
        async for event in self._warren.exec_stream(
            self.sandbox_id, argv=argv, cwd=self._root(), env=envs or None, timeout_s=timeout_s
        ):
            kind = event.get("type")
            if kind == "stdout":
                stdout += base64.b64decode(event.get("data", ""))
            elif kind == "stderr":
                stderr += base64.b64decode(event.get("data", ""))
            elif kind == "exit":
                return event.get("result") or {}, stdout, stderr
            elif kind == "error":
                detail = event.get("error") or {}
                raise WarrenError(502, str(detail.get("code", "exec_stream_error")), str(detail.get("message", event)))
        raise WarrenError(502, "exec_stream_ended", "the exec stream ended without the command's exit")

    # -- files ---------------------------------------------------------------------

    async def read(self, path: Path | str, *, user: str | User | None = None) -> io.IOBase:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            workspace_path = await self._check_read_with_exec(path, user=user)
        else:
            workspace_path = await self._validate_path_access(path)
        try:
            body = await self._warren.files.read(self.sandbox_id, path=sandbox_path_str(workspace_path))
        except (WarrenError, httpx.HTTPError) as error:
            raise read_error(error_path, error) from error
        return io.BytesIO(bytes(body))

    async def write(self, path: Path | str, data: io.IOBase, *, user: str | User | None = None) -> None:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=error_path, actual_type=type(payload).__name__)
        workspace_path = await self._validate_path_access(path, for_write=True)
        try:
            await self._warren.files.write(self.sandbox_id, bytes(payload), path=sandbox_path_str(workspace_path))
        except (WarrenError, httpx.HTTPError) as error:
            raise write_error(workspace_path, error) from error

    # -- workspace persistence -----------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        if self.state.workspace_persistence == "tar":
            return io.BytesIO(await self._persist_tar())
        root = self._workspace_root_path()
        try:
            created = await self._warren.checkpoints.create(self.sandbox_id)
        except (WarrenError, httpx.HTTPError) as error:
            raise WorkspaceArchiveReadError(
                path=root, context={**warren_context(error), "reason": "checkpoint_failed"},
                cause=error, retryable=is_retryable(error),
            ) from error
        ref = CheckpointRef(
            sandbox_id=self.sandbox_id,
            uid=self.state.uid,
            workdir=self.state.workdir,
            checkpoint_id=created["checkpoint"]["checkpoint_id"],
        )
        return io.BytesIO(ref.encode())

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=root, actual_type=type(payload).__name__)
        try:
            ref = CheckpointRef.decode(bytes(payload))
        except ValueError as error:
            raise write_error(root, error, reason="damaged_checkpoint_reference") from error
        if ref is None:
            await self._hydrate_tar(bytes(payload))
        else:
            await self._restore_checkpoint(ref)

    async def _restore_checkpoint(self, ref: CheckpointRef) -> None:
        """Puts the workdir back as the checkpoint recorded it (one atomic swap), then
        drops what the SDK never persists (ephemeral manifest entries, skip paths)."""
        root = self._workspace_root_path()
        if (ref.uid, ref.workdir) != (self.state.uid, self.state.workdir):
            raise WorkspaceArchiveWriteError(
                path=root,
                context={
                    "backend": "warren",
                    "reason": "checkpoint_of_another_workdir",
                    "checkpoint_uid": ref.uid,
                    "checkpoint_workdir": ref.workdir,
                },
                message=(
                    f"a warren checkpoint restores only its own workdir ({ref.uid}:{ref.workdir}), "
                    f"not {self.state.uid}:{self.state.workdir}; persist with "
                    "workspace_persistence='tar' to move a workspace between workdirs"
                ),
            )
        try:
            await self._warren.checkpoints.restore(ref.sandbox_id, ref.checkpoint_id)
        except (WarrenError, httpx.HTTPError) as error:
            raise write_error(root, error, reason="checkpoint_restore_failed") from error
        for rel in sorted(self._persist_workspace_skip_relpaths(), key=lambda p: p.as_posix()):
            target = sandbox_path_str(root / rel)
            try:
                await self._warren.files.remove(self.sandbox_id, path=target, recursive=True)
            except WarrenError as error:
                if error.code != "not_found":
                    raise write_error(root / rel, error, reason="skip_path_cleanup_failed") from error

    async def _persist_tar(self) -> bytes:
        """A portable tar of the workspace root (workspace-relative members)."""
        root = self._workspace_root_path()
        tar_path = f"/tmp/openai-agents-persist-{self.state.session_id.hex}.tar"
        excludes = " ".join(shell_tar_exclude_args(self._persist_workspace_skip_relpaths()))
        command = f"tar {excludes} -C {shlex.quote(sandbox_path_str(root))} -cf {shlex.quote(tar_path)} ."
        try:
            result = await self.exec(command, shell=True)
            if not result.ok():
                raise WorkspaceArchiveReadError(
                    path=root,
                    context={"backend": "warren", "reason": "tar_failed", "exit_code": result.exit_code,
                             "stderr": result.stderr.decode("utf-8", errors="replace")[:4096]},
                )
            try:
                return bytes(await self._warren.files.read(self.sandbox_id, path=tar_path))
            except (WarrenError, httpx.HTTPError) as error:
                raise WorkspaceArchiveReadError(
                    path=root, context=warren_context(error), cause=error, retryable=is_retryable(error)
                ) from error
        finally:
            with contextlib.suppress(Exception):
                await self._warren.files.remove(self.sandbox_id, path=tar_path)

    async def _hydrate_tar(self, payload: bytes) -> None:
        """Extracts a tar archive under the workspace root, after the SDK's safety check."""
        root = self._workspace_root_path()
        try:
            validate_tar_bytes(payload, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as error:
            raise WorkspaceArchiveWriteError(
                path=root,
                context={"reason": "unsafe_or_invalid_tar", "member": error.member, "detail": str(error)},
                cause=error,
            ) from error
        tar_path = f"/tmp/openai-agents-hydrate-{self.state.session_id.hex}.tar"
        try:
            try:
                await self._warren.files.write(self.sandbox_id, payload, path=tar_path)
            except (WarrenError, httpx.HTTPError) as error:
                raise write_error(root, error, reason="tar_upload_failed") from error
            result = await self.exec(
                f"tar -C {shlex.quote(sandbox_path_str(root))} -xf {shlex.quote(tar_path)}", shell=True
            )
            if not result.ok():
                raise WorkspaceArchiveWriteError(
                    path=root,
                    context={"backend": "warren", "reason": "tar_extract_failed", "exit_code": result.exit_code,
                             "stderr": result.stderr.decode("utf-8", errors="replace")[:4096]},
                )
        finally:
            with contextlib.suppress(Exception):
                await self._warren.files.remove(self.sandbox_id, path=tar_path)

    # -- PTY -----------------------------------------------------------------------

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        envs = await self._resolved_envs()
        try:
            info = await self._warren.processes.start(
                self.sandbox_id,
                argv=argv,
                cwd=self._root(),
                env=envs or None,
                pty=dict(_PTY_SIZE) if tty else None,
                stdin=tty,
                timeout_s=None if timeout is None else self._timeout_s(timeout),
            )
        except (WarrenError, httpx.HTTPError) as error:
            raise exec_transport_error(command, error) from error

        entry = PtyEntry(pid=int(info["pid"]), tty=tty)
        entry.follower = asyncio.create_task(entry.follow(self._warren, self.sandbox_id))
        async with self._pty_lock:
            process_id = allocate_pty_process_id(self._reserved_pty_ids)
            self._reserved_pty_ids.add(process_id)
            pruned = self._prune_pty_processes_if_needed()
            self._pty_processes[process_id] = entry
        if pruned is not None:
            await self._terminate_pty_entry(pruned)

        yield_time_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._collect_update(
            process_id, entry, clamp_pty_yield_time_ms(yield_time_ms), max_output_tokens
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty_processes, session_id=session_id)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process (started without tty)")
            try:
                await self._warren.processes.stdin(self.sandbox_id, entry.pid, chars.encode("utf-8"))
            except WarrenError as error:
                # A process that already ended reports its last output and exit below.
                if error.code not in ("process_ended", "stdin_closed"):
                    raise exec_transport_error(("stdin", str(entry.pid)), error) from error
            except httpx.HTTPError as error:
                raise exec_transport_error(("stdin", str(entry.pid)), error) from error
            await asyncio.sleep(0.1)
        yield_time_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._collect_update(
            session_id,
            entry,
            resolve_pty_write_yield_time_ms(yield_time_ms=yield_time_ms, input_empty=chars == ""),
            max_output_tokens,
        )

    async def _collect_update(
        self, process_id: int, entry: PtyEntry, yield_time_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        output, original_token_count, closed = await collect_pty_output(
            output_chunks=entry.output_chunks,
            output_lock=entry.output_lock,
            output_notify=entry.output_notify,
            is_done=entry.output_closed.is_set,
            yield_time_ms=yield_time_ms,
            max_output_tokens=max_output_tokens,
        )
        live_id: int | None = process_id
        if closed:
            async with self._pty_lock:
                self._pty_processes.pop(process_id, None)
                self._reserved_pty_ids.discard(process_id)
            await entry.stop_following()
            live_id = None
        return PtyExecUpdate(
            process_id=live_id,
            output=output,
            exit_code=entry.exit_code if closed else None,
            original_token_count=original_token_count,
        )

    def _prune_pty_processes_if_needed(self) -> PtyEntry | None:
        if len(self._pty_processes) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, e.last_used, e.output_closed.is_set()) for pid, e in self._pty_processes.items()]
        victim = process_id_to_prune_from_meta(meta)
        if victim is None:
            return None
        self._reserved_pty_ids.discard(victim)
        return self._pty_processes.pop(victim, None)

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        if not entry.output_closed.is_set():
            try:
                await self._warren.processes.kill(self.sandbox_id, entry.pid)
            except (WarrenError, httpx.HTTPError) as error:
                # Already ended, or the runtime is gone: nothing is left to kill.
                logger.debug("warren: killing process %s failed: %s", entry.pid, error)
        await entry.stop_following()

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty_processes.values())
            self._pty_processes.clear()
            self._reserved_pty_ids.clear()
        for entry in entries:
            await self._terminate_pty_entry(entry)
