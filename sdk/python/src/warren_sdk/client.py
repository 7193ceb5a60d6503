"""`Warren` and `AsyncWarren`: every group of warren's `/v1` API (generated from its
OpenAPI document) on one transport, and the streams the generated methods do not cover:
an exec's output as it arrives, code's events as its kernel sends them, a process followed
to its end, a directory watched."""

from __future__ import annotations

import os
from typing import Any, AsyncIterator, Iterator

import httpx

from ._generated import AsyncGroups, Groups
from ._transport import AsyncTransport, SyncTransport, _seg


def _settings(url: str | None, token: str | None) -> tuple[str, str]:
    url = url or os.environ.get("WARREN_URL") or "http://127.0.0.1:7878"
    token = token if token is not None else os.environ.get("WARREN_TOKEN", "")
    return url, token


class Warren(Groups):
    """A blocking client of one warren server.

    `url` and `token` default to `WARREN_URL` and `WARREN_TOKEN`. Calls answered 503
    (warren's "nothing was half-done, try again") are retried `retries` times with
    exponential backoff; every other error raises `WarrenError` with warren's stable
    code. The token is never shown (not in `repr`, not in errors).
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 300.0,
                 retries: int = 4, backoff: float = 0.25, requested_by: str | None = None,
                 http_client: httpx.Client | None = None) -> None:
        url, token = _settings(url, token)
        self.transport = SyncTransport(url, token, timeout=timeout, retries=retries, backoff=backoff,
                                       requested_by=requested_by, client=http_client)
        super().__init__(self.transport)

    def __repr__(self) -> str:
        return f"Warren(url={self.transport.url!r})"

    def __enter__(self) -> "Warren":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def to_async(self) -> "AsyncWarren":
        """An `AsyncWarren` for the same server, token and settings (its own connections:
        an asyncio client belongs to one event loop)."""
        t = self.transport
        return AsyncWarren(t.url, t._token, timeout=t.timeout, retries=t.retries,  # noqa: SLF001
                           backoff=t.backoff, requested_by=t.requested_by)

    def exec_stream(self, sandbox_id: str, *, command: str | None = None, argv: list[str] | None = None,
                    cwd: str | None = None, env: dict[str, str] | None = None, stdin: str | None = None,
                    timeout_s: int | None = None, shell: str | None = None,
                    fence: str | int | None = None) -> Iterator[dict[str, Any]]:
        """Runs a command and yields its `ExecEvent`s (`stdout`, `stderr`, then `exit`) as
        output arrives. Leaving the loop early disconnects, which kills the command's tree."""
        return self.transport.stream_lines(
            "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/exec",
            json={"command": command, "argv": argv, "cwd": cwd, "env": env, "stdin": stdin,
                  "timeout_s": timeout_s, "shell": shell},
            headers={"X-Warren-Fence": fence})

    def run_code_stream(self, sandbox_id: str, code: str, *, context: str | None = None,
                        language: str | None = None, env: dict[str, str] | None = None,
                        cwd: str | None = None, timeout_s: int | None = None,
                        fence: str | int | None = None) -> Iterator[dict[str, Any]]:
        """Runs code in a context's kernel (default: the language's `default` context) and
        yields its `CodeEvent`s (`stdout`, `stderr`, `result`, `error`, `restarted`, then
        `end`) as the kernel sends them. `code.execute` is the gathered form. Leaving the
        loop early disconnects, which interrupts the execution."""
        return self.transport.stream_lines(
            "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/code/execute",
            json={"code": code, "context": context, "language": language, "env": env, "cwd": cwd,
                  "timeout_s": timeout_s},
            headers={"X-Warren-Fence": fence})

    def follow(self, sandbox_id: str, pid: int, *, from_: int = 0) -> Iterator[dict[str, Any]]:
        """Yields a process's `ProcessEvent`s from offset `from_` until it ended and its
        output is complete (`end`). Reconnect with the offset after the last byte seen to
        lose nothing still kept."""
        return self.transport.stream_lines(
            "GET", f"/v1/sandboxes/{_seg(sandbox_id)}/processes/{int(pid)}/output",
            params={"from": from_})

    def watch(self, sandbox_id: str, path: str, *, recursive: bool = False) -> Iterator[dict[str, Any]]:
        """Yields the `WatchEvent`s of a directory (`start`, then `create`, `write`,
        `remove`, `rename`, `chmod`, `keepalive`) until the caller stops reading."""
        return self.transport.stream_lines(
            "GET", f"/v1/sandboxes/{_seg(sandbox_id)}/watch",
            params={"path": path, "recursive": recursive})


class AsyncWarren(AsyncGroups):
    """The `Warren` client for asyncio: the same groups and methods, awaited."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 300.0,
                 retries: int = 4, backoff: float = 0.25, requested_by: str | None = None,
                 http_client: httpx.AsyncClient | None = None) -> None:
        url, token = _settings(url, token)
        self.transport = AsyncTransport(url, token, timeout=timeout, retries=retries, backoff=backoff,
                                        requested_by=requested_by, client=http_client)
        super().__init__(self.transport)

    def __repr__(self) -> str:
        return f"AsyncWarren(url={self.transport.url!r})"

    async def __aenter__(self) -> "AsyncWarren":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.transport.close()

    def exec_stream(self, sandbox_id: str, *, command: str | None = None, argv: list[str] | None = None,
                    cwd: str | None = None, env: dict[str, str] | None = None, stdin: str | None = None,
                    timeout_s: int | None = None, shell: str | None = None,
                    fence: str | int | None = None) -> AsyncIterator[dict[str, Any]]:
        """`Warren.exec_stream`, as an async iterator."""
        return self.transport.stream_lines(
            "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/exec",
            json={"command": command, "argv": argv, "cwd": cwd, "env": env, "stdin": stdin,
                  "timeout_s": timeout_s, "shell": shell},
            headers={"X-Warren-Fence": fence})

    def run_code_stream(self, sandbox_id: str, code: str, *, context: str | None = None,
                        language: str | None = None, env: dict[str, str] | None = None,
                        cwd: str | None = None, timeout_s: int | None = None,
                        fence: str | int | None = None) -> AsyncIterator[dict[str, Any]]:
        """`Warren.run_code_stream`, as an async iterator."""
        return self.transport.stream_lines(
            "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/code/execute",
            json={"code": code, "context": context, "language": language, "env": env, "cwd": cwd,
                  "timeout_s": timeout_s},
            headers={"X-Warren-Fence": fence})

    def follow(self, sandbox_id: str, pid: int, *, from_: int = 0) -> AsyncIterator[dict[str, Any]]:
        """`Warren.follow`, as an async iterator."""
        return self.transport.stream_lines(
            "GET", f"/v1/sandboxes/{_seg(sandbox_id)}/processes/{int(pid)}/output",
            params={"from": from_})

    def watch(self, sandbox_id: str, path: str, *, recursive: bool = False) -> AsyncIterator[dict[str, Any]]:
        """`Warren.watch`, as an async iterator."""
        return self.transport.stream_lines(
            "GET", f"/v1/sandboxes/{_seg(sandbox_id)}/watch",
            params={"path": path, "recursive": recursive})
