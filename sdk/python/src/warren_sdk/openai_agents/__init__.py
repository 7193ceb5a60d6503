"""The OpenAI Agents SDK's sandbox (`agents.sandbox`, openai-agents 0.24) on warren.

    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from warren_sdk.openai_agents import WarrenSandboxClient, WarrenSandboxClientOptions

    client = WarrenSandboxClient()     # WARREN_URL, WARREN_TOKEN
    session = await client.create(options=WarrenSandboxClientOptions(uid="alice", workdir="projects/x"))
    async with session:
        result = await session.exec("ls -la")

Or hand `client` and the options to `SandboxRunConfig(client=..., options=...)` and let
`Runner.run` make the session. Needs the `openai-agents` package.
"""

from ._client import WarrenSandboxClient, workdir_of_root
from ._persistence import CheckpointRef
from ._session import WarrenSandboxSession
from ._state import WarrenSandboxClientOptions, WarrenSandboxSessionState

__all__ = [
    "CheckpointRef",
    "WarrenSandboxClient",
    "WarrenSandboxClientOptions",
    "WarrenSandboxSession",
    "WarrenSandboxSessionState",
    "workdir_of_root",
]
