"""`create_warren_deep_agent`: the common case of a deepagents agent on warren in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend
from langchain.agents.middleware import AgentMiddleware

from .backend import WarrenBackend, WarrenRunMiddleware
from .permissions import HOME_ARTIFACTS_ROOT


def create_warren_deep_agent(model: Any, backend: WarrenBackend, *, middleware: Sequence[AgentMiddleware] = (),
                             lease_ttl_s: int = 600, **kwargs: Any) -> Any:
    """`create_deep_agent` on `backend`, wired the way warren needs:

    - the backend behind a `CompositeBackend` whose artifacts root (offloaded tool results,
      conversation history) is `HOME_ARTIFACTS_ROOT`, which the sandbox user can write and
      the backend's default permissions allow;
    - `WarrenRunMiddleware(backend)` first in `middleware` (lease, workdir prompt,
      `present_files`).

    Where the file tools may write is the backend's (`WarrenBackend(permissions=...)`; by
    default only the run's workdir and the artifacts root). Other `kwargs` go to
    `create_deep_agent` unchanged; its own `permissions=` still refuses rules outside a
    route on a backend that runs commands (deepagents 0.7).
    """
    composite = CompositeBackend(default=backend, routes={}, artifacts_root=HOME_ARTIFACTS_ROOT)
    run = WarrenRunMiddleware(backend, lease_ttl_s=lease_ttl_s)
    return create_deep_agent(model=model, backend=composite, middleware=[run, *middleware], **kwargs)
