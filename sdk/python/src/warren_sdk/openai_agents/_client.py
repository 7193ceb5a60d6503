"""`WarrenSandboxClient`: the OpenAI Agents SDK's `BaseSandboxClient` on warren.

`create()` makes (or finds) the warren sandbox of (uid, runtime scope) working in a
workdir of the uid's workspace; that workdir is the SDK's workspace root (the manifest's
`root`). `resume()` finds the same sandbox again from a persisted state: warren keeps the
identity, and the workspace files outlive any runtime (I15), so the workspace is reported
preserved and the SDK restores its snapshot only when the files drifted from it.
`delete()` terminates the sandbox; the uid's files stay.
"""

from __future__ import annotations

import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot

from .._generated import SandboxInfo
from .._transport import WarrenError
from ..client import AsyncWarren
from ._errors import start_error
from ._session import WarrenSandboxSession
from ._state import USER_DATA_ROOT, WarrenSandboxClientOptions, WarrenSandboxSessionState

# Sandbox states whose runtime (installed packages, OS users) is still there or kept by a
# pause snapshot; `created` and `terminated` start a fresh one.
_SYSTEM_KEPT_STATES = frozenset({"running", "stopped", "pausing", "paused"})


def workdir_of_root(root: str) -> str:
    """The workdir a workspace root names: `/home/gem/user-data/projects/x` → `projects/x`.

    Raises ValueError for a root outside the uid's workspace, where warren keeps nothing."""
    path = PurePosixPath(root)
    try:
        rel = path.relative_to(USER_DATA_ROOT)
    except ValueError:
        rel = None
    if rel is None or str(rel) in ("", ".") or ".." in rel.parts:
        raise ValueError(
            f"a warren workspace root must be a directory under {USER_DATA_ROOT} "
            f"(the uid's persistent workspace), not {root!r}; leave Manifest.root unset to "
            "use the sandbox's workdir"
        )
    return rel.as_posix()


class WarrenSandboxClient(BaseSandboxClient[WarrenSandboxClientOptions]):
    """Creates, resumes and deletes Agents SDK sandbox sessions on a warren server.

        client = WarrenSandboxClient()        # WARREN_URL, WARREN_TOKEN
        session = await client.create(options=WarrenSandboxClientOptions(uid="alice"))
        async with session:
            print((await session.exec("echo hi")).stdout)
    """

    backend_id = "warren"
    supports_default_options = False

    def __init__(
        self,
        warren: AsyncWarren | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._owns_warren = warren is None
        self._warren = warren if warren is not None else AsyncWarren(url=url, token=token)
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    @property
    def warren(self) -> AsyncWarren:
        """The warren client the sessions use."""
        return self._warren

    async def close(self) -> None:
        """Closes the warren client when this client made it."""
        if self._owns_warren:
            await self._warren.close()

    async def __aenter__(self) -> WarrenSandboxClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _find_or_create(self, state: WarrenSandboxSessionState) -> SandboxInfo:
        """The sandbox of the state's identity, its workdir made when missing (both calls
        are idempotent: the same identity is the same sandbox, I5/I6)."""
        await self._warren.workdirs.create(state.uid, path=state.workdir)
        return await self._warren.sandboxes.create(
            uid=state.uid,
            runtime_scope_id=state.runtime_scope_id,
            workdir=state.workdir,
            labels=state.labels,
            timeout_s=state.timeout_s,
            inherit_env=state.inherit_env,
        )

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: WarrenSandboxClientOptions,
    ) -> SandboxSession:
        root_given = manifest is not None and "root" in manifest.model_fields_set
        workdir = options.workdir
        if root_given:
            assert manifest is not None
            root_workdir = workdir_of_root(manifest.root)
            if workdir is not None and workdir.strip("/") != root_workdir:
                raise ValueError(
                    f"options.workdir {workdir!r} and Manifest.root {manifest.root!r} name "
                    "different directories; give one of them"
                )
            workdir = root_workdir
        if manifest is None:
            manifest = Manifest()
        self._validate_manifest_for_create(manifest)

        session_id = uuid.uuid4()
        scope = options.runtime_scope_id or f"openai-agents-{session_id.hex}"
        try:
            if workdir is not None:
                await self._warren.workdirs.create(options.uid, path=workdir)
            info = await self._warren.sandboxes.create(
                uid=options.uid,
                runtime_scope_id=scope,
                workdir=workdir,
                labels=options.labels,
                timeout_s=options.timeout_s,
                inherit_env=options.inherit_env,
            )
        except (WarrenError, httpx.HTTPError) as error:
            raise start_error(Path(manifest.root), error, reason="sandbox_create_failed") from error
        if not root_given:
            manifest = manifest.model_copy(update={"root": info["workdir_path"]})

        state = WarrenSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=info["sandbox_id"],
            uid=options.uid,
            runtime_scope_id=scope,
            workdir=info["workdir"],
            base_env_vars=dict(options.env or {}),
            labels=options.labels,
            timeout_s=options.timeout_s,
            inherit_env=options.inherit_env,
            on_exit=options.on_exit,
            workspace_persistence=options.workspace_persistence,
        )
        inner = WarrenSandboxSession(state=state, warren=self._warren)
        # A workdir that already held files (the uid's, from earlier sessions) is kept.
        inner._set_start_state_preserved(False)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, WarrenSandboxSessionState):
            raise TypeError("WarrenSandboxClient.resume expects a WarrenSandboxSessionState")
        state.assert_path_grants_rebound()
        try:
            before: SandboxInfo | None = await self._warren.sandboxes.get(state.sandbox_id)
        except WarrenError as error:
            if error.code != "sandbox_not_found":
                raise start_error(Path(state.manifest.root), error, reason="sandbox_lookup_failed") from error
            before = None
        try:
            info = await self._find_or_create(state)
        except (WarrenError, httpx.HTTPError) as error:
            raise start_error(Path(state.manifest.root), error, reason="sandbox_create_failed") from error
        state.sandbox_id = info["sandbox_id"]
        system_kept = before is not None and before.get("state") in _SYSTEM_KEPT_STATES
        inner = WarrenSandboxSession(state=state, warren=self._warren)
        # The workdir lives in the uid's workspace, outside any runtime: it is preserved.
        inner._set_start_state_preserved(True, system=system_kept)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Ends the session's processes and terminates its warren sandbox; the workspace
        files stay in the uid's workspace (I15)."""
        inner = session._inner
        if not isinstance(inner, WarrenSandboxSession):
            raise TypeError("WarrenSandboxClient.delete expects a session this client made")
        await inner.pty_terminate_all()
        try:
            await self._warren.sandboxes.delete(inner.sandbox_id)
        except WarrenError as error:
            if error.code not in ("sandbox_not_found", "sandbox_terminated", "sandbox_terminating"):
                raise
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, WarrenSandboxSessionState)
