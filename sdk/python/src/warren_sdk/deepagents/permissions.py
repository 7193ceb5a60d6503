"""Where a deepagents agent's file tools may write (I10): by default, only inside the run's
workdir and deepagents' own artifacts root in the home.

The rules are deepagents' `FilesystemPermission`s, but `WarrenBackend` applies them, not
deepagents: deepagents 0.7 refuses `create_deep_agent(permissions=...)` with a backend
that runs commands unless every rule is scoped to a `CompositeBackend` route
(`NotImplementedError`: its `execute` tool is not checked), so a rule on the sandbox
itself ("deny writes outside the workdir") cannot be given to it. Applied in the backend,
the rules also follow each run's own workdir (from its LangGraph config) and bind every
sub-agent, which shares the backend.

This is a default that keeps the model's file tools where they belong, not a boundary:
`execute` runs commands that can write wherever the sandbox user can. The boundary is
warren's: a sandbox reaches only its runtime's own files and its user's `user-data`.

Semantics (deepagents' documented ones): rules are read in order, the first rule naming
the operation with a matching pattern decides, and no match allows. Patterns are
`wcmatch` globs with brace expansion and `**`; unlike deepagents' matcher, `*` and `**`
also match names that start with a dot, so "deny `/**`" covers `/home/gem/.profile` too.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence

from deepagents.middleware.filesystem import FilesystemPermission
from wcmatch import glob as wcglob

# deepagents' offloaded tool results, conversation history and blobs: give this as
# `CompositeBackend(..., artifacts_root=...)`; the sandbox user cannot write deepagents'
# default root `/`.
HOME_ARTIFACTS_ROOT = "/home/gem/.deepagents"

# Where a relative workdir (`projects/x`) lives in the sandbox's virtual paths.
USER_DATA = "/home/gem/user-data"

_FLAGS = wcglob.BRACE | wcglob.GLOBSTAR | wcglob.DOTGLOB
_WILDCARDS = frozenset("*?[{")
_SPECIAL = frozenset("\\*?[]{}")


def workdir_permissions(workdir: str, *, writable: Iterable[str] = (HOME_ARTIFACTS_ROOT,)) -> list[FilesystemPermission]:
    """The default rules of a run whose workdir is `workdir`: writes (write, edit, delete,
    upload) are allowed under the workdir and each `writable` root, denied everywhere else;
    reads are not ruled, so allowed everywhere.

    `workdir` is the workdir's virtual path (`/home/gem/user-data/projects/x`, a sandbox's
    `workdir_path`) or its name under the user's data (`projects/x`). The workdir itself
    and each root stay (deleting them is denied); only what is under them may change.
    """
    roots = [_absolute(workdir), *(_absolute(root) for root in writable)]
    return [
        FilesystemPermission(operations=["write"], paths=[f"{_escape(root)}/**" for root in roots], mode="allow"),
        FilesystemPermission(operations=["write"], paths=["/**"], mode="deny"),
    ]


def check_rules(rules: Sequence[FilesystemPermission]) -> list[FilesystemPermission]:
    """`rules` as a list, refusing what `WarrenBackend` cannot apply: read rules (reads
    are not filtered; a read rule would be silently ignored) and `interrupt` rules (a
    backend cannot pause a run for approval)."""
    for rule in rules:
        if not isinstance(rule, FilesystemPermission):
            raise TypeError(f"expected FilesystemPermission rules, got {rule!r}")
        if rule.operations != ["write"]:
            raise ValueError(f"WarrenBackend applies write rules only (operations=['write']), got {rule.operations!r}")
        if rule.mode not in ("allow", "deny"):
            raise ValueError(f"WarrenBackend applies 'allow' and 'deny' rules only, got mode={rule.mode!r}")
    return list(rules)


def write_denied(rules: Sequence[FilesystemPermission], path: str, *, workdir_path: str | None,
                 recursive: bool = False) -> str | None:
    """deepagents' permission-denied error for a write to `path`, or None when allowed.

    A relative `path` is under `workdir_path` (as warren resolves it), and `.`/`..` are
    resolved before matching, so `<workdir>/../other` is judged as `other`. A `recursive`
    write (a delete) is also denied when a deny rule is anchored inside what it removes.
    """
    target = _normalize(path, workdir_path)
    if _decision(rules, target) == "deny":
        return f"Error: permission denied for write on {target}"
    if recursive:
        inside = [p for rule in rules if rule.mode == "deny" for p in rule.paths if _within(_anchor(p), target)]
        if inside:
            return f"Error: permission denied for write on {target} (matches deny rule(s): {', '.join(inside)})"
    return None


def _decision(rules: Sequence[FilesystemPermission], path: str) -> str:
    for rule in rules:
        if "write" in rule.operations and any(wcglob.globmatch(path, p, flags=_FLAGS) for p in rule.paths):
            return rule.mode
    return "allow"


def _absolute(workdir: str) -> str:
    path = workdir if workdir.startswith("/") else f"{USER_DATA}/{workdir}"
    return _normalize(path, None)


def _normalize(path: str, workdir_path: str | None) -> str:
    if not path.startswith("/"):
        path = f"{workdir_path or USER_DATA}/{path}"
    return "/" + posixpath.normpath(path).lstrip("/")


def _escape(path: str) -> str:
    """`path` as a pattern matching itself (only the metacharacters of our flags)."""
    return "".join(f"\\{c}" if c in _SPECIAL else c for c in path)


def _anchor(pattern: str) -> str:
    """The literal directory a pattern starts with (`/a/b/*.log` -> `/a/b`)."""
    parts: list[str] = []
    for part in pattern.split("/")[1:]:
        if any(c in _WILDCARDS for c in part):
            break
        parts.append(part)
    return "/" + "/".join(parts)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
