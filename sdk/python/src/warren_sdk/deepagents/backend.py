"""`WarrenBackend`: one backend object for every run of a deepagents agent.

deepagents 0.7 takes a backend *instance* (factories were removed), so the routing
happens inside it: every call reads the LangGraph config of the run that makes it
(`langgraph.config.get_config()`) and goes to that run's warren sandbox:

- the user is `configurable["user_id"]` (or LangGraph Platform's `langgraph_auth_user_id`);
- the runtime scope is the ROOT run's thread: `configurable["root_thread_id"]` when a
  caller sets it (a sub-agent run on a thread of its own), else `configurable["thread_id"]`.
  deepagents' `task` tool runs a sub-agent with its parent's configurable, so a sub-agent
  shares its root's runtime, and two top-level threads get two runtimes;
- the workdir is `configurable["workdir"]`, else the backend's `workdir`.

The file tools' writes are kept inside the run's workdir (and deepagents' artifacts root in
the home) unless `permissions=` says otherwise (I10, see `permissions.py`): a default for
the model's tools, not a boundary; `execute` is not checked, warren is the boundary.

The sandbox of an identity is made on its first call, once (a lock per identity; warren's
create is idempotent per identity too), and kept. Making it starts no runtime (I12).

`WarrenRunMiddleware` adds what a backend cannot see: a run's start and end. It holds a
warren lease on the sandbox while the run lives (I25), tells the model its workdir, and
gives it `present_files` (warren artifacts, I26).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)
from deepagents.backends.sandbox import BaseSandbox
from deepagents.middleware.filesystem import FilesystemPermission
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_config

from warren_sdk import Warren, WarrenError
from warren_sdk._generated import ArtifactInfo

from .permissions import check_rules, workdir_permissions, write_denied
from .sandbox import WarrenSandbox

# What `WarrenBackend(permissions=...)` takes: rules for every run, or a function of the
# run's sandbox giving its rules.
Permissions = Sequence[FilesystemPermission] | Callable[[WarrenSandbox], Sequence[FilesystemPermission]]


@dataclass(frozen=True)
class RunIdentity:
    """What picks a run's sandbox: warren's identity `(uid, runtime_scope_id)` and the
    workdir it is bound to."""

    uid: str
    runtime_scope_id: str
    workdir: str | None = None


def identity_from_config(config: RunnableConfig, *, workdir: str | None = None) -> RunIdentity:
    """The `RunIdentity` of a LangGraph run's config (see the module's docstring)."""
    configurable = config.get("configurable") or {}
    uid = configurable.get("user_id") or configurable.get("langgraph_auth_user_id")
    scope = configurable.get("root_thread_id") or configurable.get("thread_id")
    if not uid or not scope:
        missing = " and ".join(name for name, value in (("user_id", uid), ("thread_id", scope)) if not value)
        raise ValueError(f"WarrenBackend needs the run's {missing} in config['configurable'] to pick its sandbox")
    return RunIdentity(str(uid), str(scope), configurable.get("workdir") or workdir)


@dataclass
class _Lease:
    sandbox_id: str
    lease_id: str
    renewed_at: float


class WarrenBackend(BaseSandbox):
    """The deepagents backend of a whole agent on warren: each call goes to the sandbox
    of the run making it (`identity` reads it from the LangGraph config; replace it to
    map your own configurable keys). `sandbox_options` go to `sandboxes.create` (image,
    network, labels...).

    `permissions` rules where the file operations (write, edit, delete, upload) may write:
    by default (`None`) `workdir_permissions` of each run's own workdir, so only under the
    workdir and `HOME_ARTIFACTS_ROOT`; a list of write rules applies to every run (`[]`
    allows writing anywhere warren lets the sandbox); a function of the run's
    `WarrenSandbox` gives each run its rules. A denied write is deepagents' tool error
    `Error: permission denied for write on <path>`, and nothing reaches warren.

    Outside a run (no LangGraph config), use `sandbox_for(RunIdentity(...))` directly.
    """

    def __init__(self, client: Warren | None = None, *, workdir: str | None = None,
                 identity: Callable[[RunnableConfig], RunIdentity] | None = None,
                 sandbox_options: dict[str, Any] | None = None, permissions: Permissions | None = None) -> None:
        self.client = client or Warren()
        self.workdir = workdir
        self.permissions: Permissions | None = permissions if callable(permissions) or permissions is None else check_rules(permissions)
        self._identity = identity or (lambda config: identity_from_config(config, workdir=self.workdir))
        self._options = dict(sandbox_options or {})
        self._sandboxes: dict[RunIdentity, WarrenSandbox] = {}
        self._locks: dict[RunIdentity, threading.Lock] = {}
        self._guard = threading.Lock()
        self._leases: dict[RunIdentity, _Lease] = {}

    # ---- which sandbox -------------------------------------------------------------

    def identity(self, config: RunnableConfig | None = None) -> RunIdentity:
        """The identity of the run whose config is `config` (default: the current run's)."""
        if config is None:
            try:
                config = get_config()
            except RuntimeError as exc:
                raise RuntimeError("WarrenBackend was called outside a LangGraph run; use sandbox_for(RunIdentity(...))") from exc
        return self._identity(config)

    def sandbox_for(self, identity: RunIdentity) -> WarrenSandbox:
        """The sandbox of `identity`, made on first use; concurrent first calls make it once."""
        sandbox = self._sandboxes.get(identity)
        if sandbox is not None:
            return sandbox
        with self._guard:
            lock = self._locks.setdefault(identity, threading.Lock())
        with lock:
            sandbox = self._sandboxes.get(identity)
            if sandbox is None:
                if identity.workdir:
                    # A workdir must exist before a sandbox is bound to it (I4); this is
                    # idempotent (200 when it existed).
                    self.client.workdirs.create(identity.uid, path=identity.workdir)
                sandbox = WarrenSandbox.create(self.client, uid=identity.uid, runtime_scope_id=identity.runtime_scope_id,
                                               workdir=identity.workdir, **self._options)
                self._sandboxes[identity] = sandbox
        return sandbox

    def current(self) -> WarrenSandbox:
        """The current run's sandbox."""
        return self.sandbox_for(self.identity())

    async def acurrent(self) -> WarrenSandbox:
        """The current run's sandbox, from async code (a first use is made off the loop)."""
        identity = self.identity()
        known = self._sandboxes.get(identity)
        return known if known is not None else await asyncio.to_thread(self.sandbox_for, identity)

    @property
    def id(self) -> str:
        """The current run's sandbox id."""
        return self.current().id

    # ---- where the file tools may write (I10) --------------------------------------

    def rules_for(self, sandbox: WarrenSandbox) -> list[FilesystemPermission]:
        """The write rules of the run whose sandbox is `sandbox`."""
        if self.permissions is None:
            if not sandbox.workdir_path:
                raise RuntimeError(f"sandbox {sandbox.id} has no workdir_path, so its writes cannot be kept in it; "
                                   "pass WarrenBackend(permissions=...)")
            return workdir_permissions(sandbox.workdir_path)
        if callable(self.permissions):
            return check_rules(self.permissions(sandbox))
        return list(self.permissions)

    def write_denied(self, sandbox: WarrenSandbox, path: str, *, recursive: bool = False) -> str | None:
        """deepagents' permission-denied error for writing `path` in `sandbox`, or None."""
        return write_denied(self.rules_for(sandbox), path, workdir_path=sandbox.workdir_path, recursive=recursive)

    def _split_uploads(self, sandbox: WarrenSandbox,
                       files: list[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], set[int]]:
        denied = {i for i, (path, _) in enumerate(files) if self.write_denied(sandbox, path)}
        return [f for i, f in enumerate(files) if i not in denied], denied

    @staticmethod
    def _merge_uploads(files: list[tuple[str, bytes]], uploaded: list[FileUploadResponse],
                       denied: set[int]) -> list[FileUploadResponse]:
        done = iter(uploaded)
        return [FileUploadResponse(path=path, error="permission_denied") if i in denied else next(done)
                for i, (path, _) in enumerate(files)]

    # ---- the protocol, on the current run's sandbox --------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self.current().execute(command, timeout=timeout)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        return await (await self.acurrent()).aexecute(command, timeout=timeout)

    def ls(self, path: str) -> LsResult:
        return self.current().ls(path)

    async def als(self, path: str) -> LsResult:
        return await (await self.acurrent()).als(path)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return self.current().read(file_path, offset, limit)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await (await self.acurrent()).aread(file_path, offset, limit)

    def write(self, file_path: str, content: str) -> WriteResult:
        sandbox = self.current()
        if denied := self.write_denied(sandbox, file_path):
            return WriteResult(error=denied)
        return sandbox.write(file_path, content)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        sandbox = await self.acurrent()
        if denied := self.write_denied(sandbox, file_path):
            return WriteResult(error=denied)
        return await sandbox.awrite(file_path, content)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        sandbox = self.current()
        if denied := self.write_denied(sandbox, file_path):
            return EditResult(error=denied)
        return sandbox.edit(file_path, old_string, new_string, replace_all)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        sandbox = await self.acurrent()
        if denied := self.write_denied(sandbox, file_path):
            return EditResult(error=denied)
        return await sandbox.aedit(file_path, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        sandbox = self.current()
        if denied := self.write_denied(sandbox, file_path, recursive=True):
            return DeleteResult(error=denied)
        return sandbox.delete(file_path)

    async def adelete(self, file_path: str) -> DeleteResult:
        sandbox = await self.acurrent()
        if denied := self.write_denied(sandbox, file_path, recursive=True):
            return DeleteResult(error=denied)
        return await sandbox.adelete(file_path)

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
             max_count: int | None = None) -> GrepResult:
        return self.current().grep(pattern, path, glob, max_count=max_count)

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                    max_count: int | None = None) -> GrepResult:
        return await (await self.acurrent()).agrep(pattern, path, glob, max_count=max_count)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        return self.current().glob(pattern, path)

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await (await self.acurrent()).aglob(pattern, path)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        sandbox = self.current()
        allowed, denied = self._split_uploads(sandbox, files)
        return self._merge_uploads(files, sandbox.upload_files(allowed) if allowed else [], denied)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        sandbox = await self.acurrent()
        allowed, denied = self._split_uploads(sandbox, files)
        return self._merge_uploads(files, await sandbox.aupload_files(allowed) if allowed else [], denied)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self.current().download_files(paths)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await (await self.acurrent()).adownload_files(paths)

    # ---- artifacts -----------------------------------------------------------------

    def present_files(self, paths: list[str]) -> list[ArtifactInfo]:
        """Hands files under the workdir's `outputs/` to the user as warren artifacts
        (I26); returns their `ArtifactInfo`s (id, path, size, sha256, download_url)."""
        return self.client.artifacts.present(self.current().id, paths=paths)["artifacts"]

    def present_files_tool(self) -> BaseTool:
        """`present_files` as a tool for the model."""

        def present_files(paths: list[str]) -> str:
            try:
                artifacts = self.present_files(paths)
            except WarrenError as err:
                return f"Error: {err.code}: {err.message}"
            return "Presented to the user:\n" + "\n".join(f"- {a['path']} ({a['size']} bytes)" for a in artifacts)

        async def apresent_files(paths: list[str]) -> str:
            return await asyncio.to_thread(present_files, paths)

        return StructuredTool.from_function(
            func=present_files, coroutine=apresent_files, name="present_files",
            description=("Hand finished files to the user. The paths must be under the workdir's outputs/ "
                         "directory (write them there first); the user gets each one as a download."))

    # ---- leases --------------------------------------------------------------------

    def acquire_lease(self, identity: RunIdentity, *, ttl_s: int = 600) -> str:
        """Takes (or renews) the lease that keeps `identity`'s runtime while a run lives."""
        sandbox = self.sandbox_for(identity)
        with self._guard:
            held = self._leases.get(identity)
        if held is not None:
            self.renew_lease(identity, ttl_s=ttl_s, force=True)
            return self._leases[identity].lease_id
        info = self.client.leases.create(sandbox.id, holder=f"deepagents:{identity.uid}:{identity.runtime_scope_id}", ttl_s=ttl_s)
        with self._guard:
            self._leases[identity] = _Lease(sandbox.id, info["lease_id"], time.monotonic())
        return info["lease_id"]

    def renew_lease(self, identity: RunIdentity, *, ttl_s: int = 600, force: bool = False) -> None:
        """Renews `identity`'s lease once a third of its TTL has passed (or `force`); a
        lease that lapsed meanwhile is taken again."""
        held = self._leases.get(identity)
        if held is None or (not force and time.monotonic() - held.renewed_at < ttl_s / 3):
            return
        try:
            self.client.leases.renew(held.sandbox_id, held.lease_id, ttl_s=ttl_s)
            held.renewed_at = time.monotonic()
        except WarrenError as err:
            if err.code != "lease_not_found":
                raise
            with self._guard:
                self._leases.pop(identity, None)
            self.acquire_lease(identity, ttl_s=ttl_s)

    def release_lease(self, identity: RunIdentity) -> None:
        """Gives `identity`'s lease back (a lease that already lapsed is fine)."""
        with self._guard:
            held = self._leases.pop(identity, None)
        if held is None:
            return
        try:
            self.client.leases.release(held.sandbox_id, held.lease_id)
        except WarrenError as err:
            if err.code != "lease_not_found":
                raise

    def lease_of(self, identity: RunIdentity) -> str | None:
        """The id of the lease held for `identity`, if any."""
        held = self._leases.get(identity)
        return held.lease_id if held else None

    @contextmanager
    def hold(self, config: RunnableConfig, *, ttl_s: int = 600) -> Iterator[WarrenSandbox]:
        """Holds the lease of the run `config` names for the `with` block, released even
        when the run fails or is interrupted (the middleware's release runs only at a
        run's normal end; otherwise the lease lapses after `ttl_s`)."""
        identity = self.identity(config)
        self.acquire_lease(identity, ttl_s=ttl_s)
        try:
            yield self.sandbox_for(identity)
        finally:
            self.release_lease(identity)


def _is_subagent(config: RunnableConfig) -> bool:
    return (config.get("configurable") or {}).get("ls_agent_type") == "subagent"


class WarrenRunMiddleware(AgentMiddleware):
    """The run-level half of `WarrenBackend`; give it to `create_deep_agent(middleware=[...])`.

    - `before_agent`/`after_agent`: the top-level run takes a lease on its sandbox at its
      start and releases it at its end (a sub-agent runs under its root's lease); model
      calls renew it. A failed or interrupted run's lease lapses after `lease_ttl_s`, or
      use `WarrenBackend.hold` around the run to release it in every case.
    - the system prompt gains the run's workdir (a virtual path), where outputs go, and,
      under the backend's default permissions, that the file tools write only there;
    - `present_files` is offered to the model.
    """

    def __init__(self, backend: WarrenBackend, *, lease_ttl_s: int = 600, present_files: bool = True,
                 workdir_prompt: bool = True) -> None:
        super().__init__()
        self.backend = backend
        self.lease_ttl_s = lease_ttl_s
        self.workdir_prompt = workdir_prompt
        self.tools = [backend.present_files_tool()] if present_files else []

    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        config = get_config()
        if not _is_subagent(config):
            self.backend.acquire_lease(self.backend.identity(config), ttl_s=self.lease_ttl_s)
        return None

    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        config = get_config()
        if not _is_subagent(config):
            await asyncio.to_thread(self.backend.acquire_lease, self.backend.identity(config), ttl_s=self.lease_ttl_s)
        return None

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        config = get_config()
        if not _is_subagent(config):
            self.backend.release_lease(self.backend.identity(config))
        return None

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        config = get_config()
        if not _is_subagent(config):
            await asyncio.to_thread(self.backend.release_lease, self.backend.identity(config))
        return None

    def _prepare(self, request: ModelRequest) -> ModelRequest:
        identity = self.backend.identity()
        self.backend.renew_lease(identity, ttl_s=self.lease_ttl_s)
        if not self.workdir_prompt:
            return request
        workdir = self.backend.sandbox_for(identity).workdir_path
        note = (f"\n\nYour working directory is {workdir}: commands run there, and files you make for the "
                f"user belong in {workdir}/outputs/ (hand them over with present_files).")
        if self.backend.permissions is None:
            note += f" The file tools (write_file, edit_file, delete) may write only inside {workdir}."
        current = request.system_message.content if request.system_message else ""
        # deepagents may send the prompt as content blocks (cache control): keep them.
        content = current + note if isinstance(current, str) else [*current, {"type": "text", "text": note}]
        return request.override(system_message=SystemMessage(content=content))

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        return handler(self._prepare(request))

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> ModelResponse:
        prepared = await asyncio.to_thread(self._prepare, request)
        return await handler(prepared)
