"""The options a `WarrenSandboxClient` takes and the session state it persists.

The state is what the Agents SDK serializes between runs (`RunState`, `serialize_session_state`)
and hands back to `resume()`: the warren sandbox's identity, (uid, runtime scope) and
workdir, is enough to find the same sandbox again (I5/I6), whatever became of its runtime.
"""

from __future__ import annotations

from typing import Literal

from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from pydantic import Field

# Where a uid's persistent workspace appears in the runtime (the default `ars` layout);
# every workdir, and so every workspace root, lies under it.
USER_DATA_ROOT = "/home/gem/user-data"

OnExit = Literal["terminate", "pause", "keep"]
WorkspacePersistence = Literal["checkpoint", "tar"]


class WarrenSandboxClientOptions(BaseSandboxClientOptions):
    """How `WarrenSandboxClient.create()` makes a sandbox.

    - `uid`: whose workspace the sandbox works in (required).
    - `runtime_scope_id`: the runtime scope, e.g. the conversation's thread id; the same
      (uid, scope) is the same sandbox. Default: a fresh scope per SDK session.
    - `workdir`: the workdir inside the uid's workspace (`projects/x`), made when missing;
      it is the SDK's workspace root. Default: the manifest's root when it lies under
      `/home/gem/user-data`, otherwise a new `projects/<uuid>` of warren's choosing.
    - `env`: environment for every command of the session (the manifest's comes on top).
    - `labels`, `timeout_s`, `inherit_env`: as warren's `POST /v1/sandboxes`.
    - `on_exit`: what closing the session does to the sandbox: `terminate` (the runtime
      goes, the workspace files stay, I15), `pause` (the runtime is snapshotted) or `keep`.
    - `workspace_persistence`: how `persist_workspace()` records the workspace:
      `checkpoint` (a warren checkpoint, cheap and deduplicated; hydrates into sessions of
      the same uid and workdir) or `tar` (a portable archive any backend can hydrate).
    """

    type: Literal["warren"] = "warren"
    uid: str
    runtime_scope_id: str | None = None
    workdir: str | None = None
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    timeout_s: int | None = None
    inherit_env: bool | None = None
    on_exit: OnExit = "terminate"
    workspace_persistence: WorkspacePersistence = "checkpoint"


class WarrenSandboxSessionState(SandboxSessionState):
    """What a warren-backed session persists: the sandbox's identity and settings."""

    type: Literal["warren"] = "warren"
    sandbox_id: str
    uid: str
    runtime_scope_id: str
    workdir: str
    base_env_vars: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] | None = None
    timeout_s: int | None = None
    inherit_env: bool | None = None
    on_exit: OnExit = "terminate"
    workspace_persistence: WorkspacePersistence = "checkpoint"
    # warren's own ceiling for one command (`timeout_s` at most 3600): what "no timeout"
    # becomes.
    exec_timeout_unbounded_s: int = Field(default=3600, ge=1, le=3600)
