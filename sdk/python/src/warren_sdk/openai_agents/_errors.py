"""warren's errors as the OpenAI Agents SDK's sandbox errors.

The Agents SDK decides what to retry and what to show the model from its own error types
(`ExecTransportError`, `WorkspaceReadNotFoundError`, ...) and their `retryable` flag; warren
answers with a `WarrenError` carrying a stable code (docs/errors.md). These helpers carry
that code and status into the SDK error's `context` so nothing is lost in translation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import httpx
from agents.sandbox.errors import (
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)

from .._transport import WarrenError

# Codes that mean "nothing was half-done, ask again shortly" (503s), or a limit that
# frees itself (429).
_RETRYABLE_STATUS = frozenset({429, 503})
# Codes that mean the path is not there.
_NOT_FOUND_CODES = frozenset({"not_found", "watched_dir_gone"})


def warren_context(error: BaseException) -> dict[str, object]:
    """What a failure tells: warren's status, code and message, or the transport error."""
    if isinstance(error, WarrenError):
        return {
            "backend": "warren",
            "http_status": error.status,
            "warren_code": error.code,
            "warren_message": error.message,
        }
    return {"backend": "warren", "provider_error": f"{type(error).__name__}: {error}"}


def is_retryable(error: BaseException) -> bool | None:
    """Whether asking again may succeed: a 503/429 or a broken connection yes, any other
    answer of warren no (it was refused for a reason that stays)."""
    if isinstance(error, WarrenError):
        return error.status in _RETRYABLE_STATUS
    if isinstance(error, httpx.TransportError):
        return True
    return None


def exec_transport_error(command: Sequence[str | Path], error: BaseException) -> ExecTransportError:
    """A command warren could not run (not one that ran and failed: that is an exit code)."""
    detail = f"{error.code}: {error.message}" if isinstance(error, WarrenError) else str(error)
    return ExecTransportError(
        command=command,
        context=warren_context(error),
        cause=error,
        message=f"warren exec failed: {detail}",
        retryable=is_retryable(error),
    )


def read_error(path: Path, error: BaseException) -> WorkspaceReadNotFoundError | WorkspaceArchiveReadError:
    """A failed file read: `not_found` is the SDK's not-found, the rest a read error."""
    if isinstance(error, WarrenError) and error.code in _NOT_FOUND_CODES:
        return WorkspaceReadNotFoundError(path=path, context=warren_context(error), cause=error)
    return WorkspaceArchiveReadError(
        path=path, context=warren_context(error), cause=error, retryable=is_retryable(error)
    )


def write_error(path: Path, error: BaseException, *, reason: str | None = None) -> WorkspaceArchiveWriteError:
    """A failed write, mkdir or workspace hydration."""
    context = warren_context(error)
    if reason is not None:
        context["reason"] = reason
    return WorkspaceArchiveWriteError(
        path=path, context=context, cause=error, retryable=is_retryable(error)
    )


def start_error(path: Path, error: BaseException, *, reason: str) -> WorkspaceStartError:
    """A session that could not start: its sandbox is gone, or refuses to run."""
    detail = f"{error.code}: {error.message}" if isinstance(error, WarrenError) else str(error)
    return WorkspaceStartError(
        path=path,
        context={**warren_context(error), "reason": reason},
        cause=error,
        message=f"failed to start session: {detail}",
        retryable=is_retryable(error),
    )
