"""warren as the sandbox of deepagents (0.7) agents.

- `WarrenSandbox`: one warren sandbox as a deepagents sandbox backend, its file tools on
  warren's file API (no shell scripts in the image).
- `WarrenBackend`: the backend to give `create_deep_agent(backend=...)`: each call is
  routed to the sandbox of the run that makes it (user, root thread, workdir), made
  lazily, once; its file tools write only inside the run's workdir unless `permissions=`
  says otherwise (I10).
- `WarrenRunMiddleware`: holds a warren lease while a run lives, tells the model its
  workdir, and gives it a `present_files` tool (warren artifacts).
- `create_warren_deep_agent`: `create_deep_agent` on a `WarrenBackend` with the above wired.
- `workdir_permissions`: the default write rules, as deepagents `FilesystemPermission`s.
"""

from .agent import create_warren_deep_agent
from .backend import RunIdentity, WarrenBackend, WarrenRunMiddleware
from .permissions import HOME_ARTIFACTS_ROOT, workdir_permissions
from .sandbox import WarrenSandbox

__all__ = ["HOME_ARTIFACTS_ROOT", "RunIdentity", "WarrenBackend", "WarrenRunMiddleware", "WarrenSandbox",
           "create_warren_deep_agent", "workdir_permissions"]
