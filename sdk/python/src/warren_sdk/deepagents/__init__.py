"""warren as the sandbox of deepagents (0.7) agents.

- `WarrenSandbox`: one warren sandbox as a deepagents sandbox backend, its file tools on
  warren's file API (no shell scripts in the image).
- `WarrenBackend`: the backend to give `create_deep_agent(backend=...)`: each call is
  routed to the sandbox of the run that makes it (user, root thread, workdir), made
  lazily, once.
- `WarrenRunMiddleware`: holds a warren lease while a run lives, tells the model its
  workdir, and gives it a `present_files` tool (warren artifacts).
"""

from .backend import RunIdentity, WarrenBackend, WarrenRunMiddleware
from .sandbox import WarrenSandbox

__all__ = ["RunIdentity", "WarrenBackend", "WarrenRunMiddleware", "WarrenSandbox"]
