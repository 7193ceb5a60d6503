"""An interactive process of a session: a warren process (on a terminal when `tty`) whose
output a background task follows into the queue the Agents SDK's `collect_pty_output`
drains.

warren keeps a process's output (the newest 1 MiB) and serves it from any offset, so the
follower reconnects from the offset after the last byte it got when a stream breaks, and
loses nothing still kept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from .._transport import WarrenError

_RECONNECTS = 5


def exit_code_of(process: dict[str, Any]) -> int | None:
    """A process's exit status the shell's way: its code, or 128 + the signal that ended
    it; None when it has none (still running, or `lost` with its runtime)."""
    code = process.get("exit_code")
    if code is not None:
        return int(code)
    signal = process.get("signal")
    if signal is not None:
        return 128 + int(signal)
    return None


@dataclass
class PtyEntry:
    """One process the session started for `pty_exec_start`."""

    pid: int
    tty: bool
    output_chunks: deque[bytes] = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    follower: asyncio.Task[None] | None = None

    async def _push(self, data: bytes) -> None:
        if data:
            async with self.output_lock:
                self.output_chunks.append(data)
            self.output_notify.set()

    async def follow(self, warren: Any, sandbox_id: str) -> None:
        """Copies the process's output into the queue until it ended, then records its
        exit status and closes the queue (always, even when following fails)."""
        offset = 0
        try:
            for _attempt in range(_RECONNECTS):
                try:
                    async for event in warren.follow(sandbox_id, self.pid, from_=offset):
                        kind = event.get("type")
                        if kind in ("stdout", "stderr"):
                            data = base64.b64decode(event.get("data", ""))
                            offset = int(event.get("offset", offset)) + len(data)
                            await self._push(data)
                        elif kind == "lost":
                            offset = int(event.get("to", offset))
                        elif kind == "end":
                            self.exit_code = exit_code_of(event.get("process") or {})
                            return
                        elif kind == "error":
                            break
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
                    continue
                except WarrenError:
                    break
            # The stream ended without `end`: ask once what became of the process.
            with contextlib.suppress(WarrenError, httpx.HTTPError):
                info = await warren.processes.get(sandbox_id, self.pid)
                self.exit_code = exit_code_of(info)
        finally:
            self.output_closed.set()
            self.output_notify.set()

    async def stop_following(self) -> None:
        task, self.follower = self.follower, None
        if task is not None and task is not asyncio.current_task():
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
