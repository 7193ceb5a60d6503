"""`WarrenSandbox`: deepagents' sandbox backend for ONE warren sandbox.

deepagents' `BaseSandbox` derives every file operation from `execute()` by running
`python3 -c` scripts in the sandbox. warren serves files itself (by descriptor on the
persistent mounts, through the runtime's agent elsewhere), so this backend maps each
operation onto warren's file API instead: it needs no Python in the image, never starts a
runtime for a workspace file (I17), and costs one request per operation.

Paths are warren's virtual paths: absolute anywhere in the runtime (`/tmp/x`,
`/home/gem/user-data/projects/demo/a.py`). `glob` and `grep` without a path search the
sandbox's workdir, and commands run there.
"""

from __future__ import annotations

import asyncio
import base64
import weakref
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)
from deepagents.backends.sandbox import MAX_BINARY_BYTES, MAX_OUTPUT_BYTES, TRUNCATION_MSG, BaseSandbox
from deepagents.backends.utils import (
    EMPTY_CONTENT_WARNING,
    EMPTY_OLD_STRING_ERROR,
    InvalidGlobPatternError,
    _get_backend_read_file_type,
    compile_grep_include_glob,
    normalize_read_bounds,
)

from warren_sdk import AsyncWarren, Warren, WarrenError
from warren_sdk import _generated as api

from . import _errors

# Rust `regex` metacharacters (regex_syntax::is_meta_character): escaping exactly these
# turns a literal into a pattern warren's grep accepts.
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def regex_literal(text: str) -> str:
    """The regular expression matching `text` literally. A newline separates
    alternatives, as in `grep -F` (deepagents' sandbox greps with it)."""
    return "|".join("".join("\\" + c if c in _REGEX_META else c for c in part) for part in text.split("\n"))


class WarrenSandbox(BaseSandbox):
    """One warren sandbox as a deepagents `SandboxBackendProtocol`.

    Every file operation is one call of warren's file API; `execute` is warren's exec
    (stdout then stderr, as one output). The async methods use an `AsyncWarren` per
    event loop (an httpx async client belongs to the loop it was made on), made from the
    sync client's server and token unless `async_client` is given.
    """

    def __init__(self, client: Warren, sandbox_id: str, *, workdir_path: str | None = None,
                 async_client: AsyncWarren | None = None, default_timeout_s: int | None = None) -> None:
        self._w = client
        self._sandbox_id = sandbox_id
        self.workdir_path = workdir_path
        self._fixed_async = async_client
        self._loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncWarren] = weakref.WeakKeyDictionary()
        self.default_timeout_s = default_timeout_s

    @classmethod
    def create(cls, client: Warren, *, uid: str, runtime_scope_id: str, workdir: str | None = None,
               **create_args: Any) -> WarrenSandbox:
        """The sandbox of `(uid, runtime_scope_id)`, created if new (warren's create is
        idempotent per identity, I5/I6). Creating it starts no runtime (I12)."""
        info = client.sandboxes.create(uid=uid, runtime_scope_id=runtime_scope_id, workdir=workdir, **create_args)
        return cls(client, info["sandbox_id"], workdir_path=info.get("workdir_path"))

    @property
    def id(self) -> str:
        """warren's sandbox id."""
        return self._sandbox_id

    def __repr__(self) -> str:
        return f"WarrenSandbox({self._sandbox_id!r})"

    def _aw(self) -> AsyncWarren:
        if self._fixed_async is not None:
            return self._fixed_async
        loop = asyncio.get_running_loop()
        client = self._loop_clients.get(loop)
        if client is None:
            client = self._loop_clients[loop] = self._w.to_async()
        return client

    # ---- execute -------------------------------------------------------------------

    def _exec_args(self, command: str, timeout: int | None) -> dict[str, Any]:
        # deepagents: 0 may mean "no timeout"; warren's least is 1 s, so 0 takes the
        # server's default.
        timeout_s = timeout if timeout else self.default_timeout_s
        return {"command": command, "timeout_s": timeout_s}

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Runs `command` with `sh -c` in the sandbox (cwd: the workdir)."""
        try:
            result = self._w.sandboxes.exec(self._sandbox_id, **self._exec_args(command, timeout))
        except WarrenError as err:
            _errors.raise_unless(err, _errors.EXEC_CODES)
            return ExecuteResponse(output=f"Error: {err.code}: {err.message}", exit_code=None)
        return _execute_response(result, timeout)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        """Async `execute`."""
        try:
            result = await self._aw().sandboxes.exec(self._sandbox_id, **self._exec_args(command, timeout))
        except WarrenError as err:
            _errors.raise_unless(err, _errors.EXEC_CODES)
            return ExecuteResponse(output=f"Error: {err.code}: {err.message}", exit_code=None)
        return _execute_response(result, timeout)

    # ---- ls ------------------------------------------------------------------------

    def ls(self, path: str) -> LsResult:
        """The entries directly in `path`, with absolute paths."""
        try:
            listing = self._w.files.list(self._sandbox_id, path=path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return LsResult(error=f"Path '{path}': {_errors.reason(err)}")
        return LsResult(entries=[_file_info(e) for e in listing["entries"]])

    async def als(self, path: str) -> LsResult:
        """Async `ls`."""
        try:
            listing = await self._aw().files.list(self._sandbox_id, path=path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return LsResult(error=f"Path '{path}': {_errors.reason(err)}")
        return LsResult(entries=[_file_info(e) for e in listing["entries"]])

    # ---- read ----------------------------------------------------------------------

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """A page of `limit` lines from line `offset` (0-indexed) of a text file, or a
        binary file whole as base64 (up to deepagents' 500 KiB preview limit)."""
        try:
            body = self._w.files.read(self._sandbox_id, path=file_path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return ReadResult(error=f"File '{file_path}': {_errors.reason(err)}")
        return read_page(file_path, bytes(body), offset, limit)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Async `read`."""
        try:
            body = await self._aw().files.read(self._sandbox_id, path=file_path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return ReadResult(error=f"File '{file_path}': {_errors.reason(err)}")
        return read_page(file_path, bytes(body), offset, limit)

    # ---- write / edit / delete ----------------------------------------------------

    def write(self, file_path: str, content: str) -> WriteResult:
        """Creates or replaces the file (warren makes the parents; the write is atomic)."""
        try:
            self._w.files.write(self._sandbox_id, content.encode("utf-8"), path=file_path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return WriteResult(error=f"Failed to write file '{file_path}': {_errors.reason(err)}")
        return WriteResult(path=file_path)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        """Async `write`."""
        try:
            await self._aw().files.write(self._sandbox_id, content.encode("utf-8"), path=file_path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return WriteResult(error=f"Failed to write file '{file_path}': {_errors.reason(err)}")
        return WriteResult(path=file_path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        """Replaces `old_string` by warren's edit. As deepagents' sandbox does, an LF-only
        `old_string` also matches a CRLF file (the model reads CRLF as LF), and the
        replacement keeps the file's line endings."""
        if not old_string:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        err: WarrenError | None = None
        for old, new in _edit_variants(old_string, new_string):
            try:
                done = self._w.files.edit(self._sandbox_id, path=file_path, old=old, new=new, replace_all=replace_all)
            except WarrenError as caught:
                _errors.raise_unless(caught, _errors.FILE_CODES)
                err = caught
                if caught.code == "edit_no_match":
                    continue
                break
            return EditResult(path=file_path, occurrences=int(done["replacements"]))
        return _edit_error(err, file_path, old_string)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        """Async `edit`."""
        if not old_string:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        err: WarrenError | None = None
        for old, new in _edit_variants(old_string, new_string):
            try:
                done = await self._aw().files.edit(self._sandbox_id, path=file_path, old=old, new=new, replace_all=replace_all)
            except WarrenError as caught:
                _errors.raise_unless(caught, _errors.FILE_CODES)
                err = caught
                if caught.code == "edit_no_match":
                    continue
                break
            return EditResult(path=file_path, occurrences=int(done["replacements"]))
        return _edit_error(err, file_path, old_string)

    def delete(self, file_path: str) -> DeleteResult:
        """Removes a file, or a directory with everything in it."""
        try:
            self._w.files.remove(self._sandbox_id, path=file_path, recursive=True)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return _delete_error(err, file_path)
        return DeleteResult(path=file_path)

    async def adelete(self, file_path: str) -> DeleteResult:
        """Async `delete`."""
        try:
            await self._aw().files.remove(self._sandbox_id, path=file_path, recursive=True)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return _delete_error(err, file_path)
        return DeleteResult(path=file_path)

    # ---- grep ----------------------------------------------------------------------

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
             max_count: int | None = None) -> GrepResult:
        """Lines containing `pattern` literally, under `path` (default: the workdir) or in
        the file `path`; `glob` filters files as deepagents' sandbox does (no `/`: the
        name at any depth; with `/`: the path under `path`)."""
        query = _GrepQuery(pattern, path, glob, max_count, self.grep_exclude_dirs, self.workdir_path)
        if query.error:
            return GrepResult(error=query.error)
        try:
            found = self._w.files.grep(self._sandbox_id, **query.args())
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            if err.code != "not_a_directory" or path is None:
                return GrepResult(error=f"Path '{path or '.'}': {_errors.reason(err)}")
            return query.in_file(self.download_files([path])[0])
        return query.result(found)

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                    max_count: int | None = None) -> GrepResult:
        """Async `grep`."""
        query = _GrepQuery(pattern, path, glob, max_count, self.grep_exclude_dirs, self.workdir_path)
        if query.error:
            return GrepResult(error=query.error)
        try:
            found = await self._aw().files.grep(self._sandbox_id, **query.args())
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            if err.code != "not_a_directory" or path is None:
                return GrepResult(error=f"Path '{path or '.'}': {_errors.reason(err)}")
            return query.in_file((await self.adownload_files([path]))[0])
        return query.result(found)

    # ---- glob ----------------------------------------------------------------------

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Regular files matching `pattern` under `path` (default: the workdir), with
        absolute paths, by deepagents' glob rules (`compile_grep_include_glob`)."""
        query = _GlobQuery(pattern)
        if query.error:
            return GlobResult(error=query.error)
        try:
            try:
                listing = self._w.files.glob(self._sandbox_id, pattern=query.server_pattern, path=path)
            except WarrenError as err:
                if err.code != "invalid_glob":
                    raise
                listing = self._w.files.glob(self._sandbox_id, pattern="**/*", path=path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return GlobResult(error=f"Path '{path or '.'}': {_errors.reason(err)}")
        return query.result(listing)

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Async `glob`."""
        query = _GlobQuery(pattern)
        if query.error:
            return GlobResult(error=query.error)
        files = self._aw().files
        try:
            try:
                listing = await files.glob(self._sandbox_id, pattern=query.server_pattern, path=path)
            except WarrenError as err:
                if err.code != "invalid_glob":
                    raise
                listing = await files.glob(self._sandbox_id, pattern="**/*", path=path)
        except WarrenError as err:
            _errors.raise_unless(err, _errors.FILE_CODES)
            return GlobResult(error=f"Path '{path or '.'}': {_errors.reason(err)}")
        return query.result(listing)

    # ---- upload / download ---------------------------------------------------------

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Writes each file (parents made); one response per file, in order."""
        out = []
        for path, content in files:
            out.append(_upload(path, content, lambda p, c: self._w.files.write(self._sandbox_id, c, path=p)))
        return out

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Async `upload_files`: the files go concurrently."""
        client = self._aw()

        async def one(path: str, content: bytes) -> FileUploadResponse:
            if not path.startswith("/"):
                return FileUploadResponse(path=path, error="invalid_path")
            try:
                await client.files.write(self._sandbox_id, content, path=path)
            except WarrenError as err:
                return FileUploadResponse(path=path, error=_errors.file_operation_error(err))
            return FileUploadResponse(path=path)

        return list(await asyncio.gather(*(one(p, c) for p, c in files)))

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Reads each file; one response per path, in order."""
        return [_download(path, lambda p: self._w.files.read(self._sandbox_id, path=p)) for path in paths]

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Async `download_files`: the files come concurrently."""
        client = self._aw()

        async def one(path: str) -> FileDownloadResponse:
            if not path.startswith("/"):
                return FileDownloadResponse(path=path, error="invalid_path")
            try:
                body = await client.files.read(self._sandbox_id, path=path)
            except WarrenError as err:
                return FileDownloadResponse(path=path, error=_errors.file_operation_error(err))
            return FileDownloadResponse(path=path, content=bytes(body))

        return list(await asyncio.gather(*(one(p) for p in paths)))


# ---- the shared halves of each operation ---------------------------------------------


def _execute_response(result: api.ExecResult, timeout: int | None) -> ExecuteResponse:
    output = (result.get("stdout") or "") + (result.get("stderr") or "")
    exit_code = result.get("exit_code")
    if result.get("timed_out"):
        output += f"\nError: the command timed out{f' after {timeout} s' if timeout else ''} and was killed."
        exit_code = 124  # what `timeout(1)` answers
    elif exit_code is None and (signal := result.get("signal")) is not None:
        exit_code = 128 + signal  # the shell's convention
    return ExecuteResponse(output=output, exit_code=exit_code, truncated=bool(result.get("truncated")))


def _file_info(entry: api.FileEntry) -> FileInfo:
    return {"path": entry["path"], "is_dir": entry.get("kind") == "dir", "size": int(entry.get("size", 0)),
            "modified_at": entry.get("modified", "")}


def read_page(file_path: str, raw: bytes, offset: int, limit: int) -> ReadResult:
    """deepagents' sandbox read (`_READ_COMMAND_TEMPLATE`) on bytes already fetched: the
    empty-file reminder, base64 for binary files up to `MAX_BINARY_BYTES`, else a window
    of universal-newline lines capped at `MAX_OUTPUT_BYTES` with pagination fields."""
    if not raw:
        return ReadResult(file_data={"content": EMPTY_CONTENT_WARNING, "encoding": "utf-8"})
    text: str | None = None
    if _get_backend_read_file_type(file_path) == "text":
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    if text is None:
        if len(raw) > MAX_BINARY_BYTES:
            return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum preview size of {MAX_BINARY_BYTES} bytes")
        return ReadResult(file_data={"content": base64.b64encode(raw).decode("ascii"), "encoding": "base64"})
    offset, limit = normalize_read_bounds(offset, limit)
    if limit == 0:
        return ReadResult(file_data={"content": "", "encoding": "utf-8"}, no_lines_requested=True)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()  # the file's last newline ends its last line; it starts none
    total = len(lines)
    if offset >= total:
        return ReadResult(error=f"Line offset {offset} exceeds file length ({total} lines)")
    budget = MAX_OUTPUT_BYTES - len(TRUNCATION_MSG.encode("utf-8"))
    parts: list[str] = []
    used = 0
    returned = 0
    truncated = False
    for line in lines[offset:offset + limit]:
        piece = line if returned == 0 else "\n" + line
        size = len(piece.encode("utf-8"))
        if used + size > budget:
            truncated = True
            prefix = piece.encode("utf-8")[:max(budget - used, 0)].decode("utf-8", errors="ignore")
            parts.append(prefix)
            break
        parts.append(piece)
        used += size
        returned += 1
    content = "".join(parts) + (TRUNCATION_MSG if truncated else "")
    # A line cut by the cap is read again from its start on the next page; a first line
    # larger than the cap still moves the window on.
    returned = max(returned, 1)
    end = offset + returned
    return ReadResult(file_data={"content": content, "encoding": "utf-8"}, total_lines=total,
                      start_line=offset + 1, end_line=end, next_offset=end if end < total else None)


def _edit_variants(old: str, new: str) -> list[tuple[str, str]]:
    def crlf(s: str) -> str:
        return s.replace("\r\n", "\n").replace("\n", "\r\n")

    def lf(s: str) -> str:
        return s.replace("\r\n", "\n")

    variants: list[tuple[str, str]] = []
    for pair in ((old, new), (crlf(old), crlf(new)), (lf(old), lf(new))):
        if pair not in variants:
            variants.append(pair)
    return variants


def _edit_error(err: WarrenError | None, file_path: str, old_string: str) -> EditResult:
    code = err.code if err else "edit_no_match"
    messages = {
        "not_found": f"Error: File '{file_path}' not found",
        "permission_denied": f"Error: Permission denied editing file '{file_path}'",
        "read_only": f"Error: Permission denied editing file '{file_path}'",
        "is_a_directory": f"Error: '{file_path}' is not a regular file",
        "not_a_file": f"Error: '{file_path}' is not a regular file",
        "not_utf8": f"Error: File '{file_path}' is not a text file",
        "edit_no_match": f"Error: String not found in file: '{old_string}'",
        "edit_ambiguous": f"Error: String '{old_string}' appears multiple times. Use replace_all=True to replace all occurrences.",
    }
    if code in messages:
        return EditResult(error=messages[code])
    assert err is not None
    return EditResult(error=f"Error editing file '{file_path}': {err.code}: {err.message}")


def _delete_error(err: WarrenError, file_path: str) -> DeleteResult:
    if err.code == "not_found":
        return DeleteResult(error=f"Error: '{file_path}' not found")
    return DeleteResult(error=f"Error deleting file '{file_path}': {err.code}: {err.message}")


def _upload(path: str, content: bytes, write: Callable[[str, bytes], Any]) -> FileUploadResponse:
    if not path.startswith("/"):
        return FileUploadResponse(path=path, error="invalid_path")
    try:
        write(path, content)
    except WarrenError as err:
        return FileUploadResponse(path=path, error=_errors.file_operation_error(err))
    return FileUploadResponse(path=path)


def _download(path: str, read: Callable[[str], bytes]) -> FileDownloadResponse:
    if not path.startswith("/"):
        return FileDownloadResponse(path=path, error="invalid_path")
    try:
        body = read(path)
    except WarrenError as err:
        return FileDownloadResponse(path=path, error=_errors.file_operation_error(err))
    return FileDownloadResponse(path=path, content=bytes(body))


def _relative(path: str, root: str) -> str:
    root = root.rstrip("/") + "/"
    return path[len(root):] if path.startswith(root) else path.lstrip("/")


class _GlobQuery:
    """One `glob` call: the pattern warren is asked (a superset where the dialects
    differ) and deepagents' matcher that decides."""

    def __init__(self, pattern: str) -> None:
        self.error: str | None = None
        try:
            self.matcher = compile_grep_include_glob(pattern)
        except InvalidGlobPatternError as exc:
            self.error = f"Error: {exc}"
            return
        # warren matches a pattern against the path under the root; deepagents matches a
        # pattern without `/` against the name at any depth.
        self.server_pattern = pattern.lstrip("/") if "/" in pattern else f"**/{pattern}"

    def result(self, listing: api.FileList) -> GlobResult:
        root = listing.get("path") or "/"
        matches = [_file_info(e) for e in listing["entries"]
                   if e.get("kind") == "file" and self.matcher(_relative(e["path"], root))]
        matches.sort(key=lambda m: m["path"])
        truncated = bool(listing.get("truncated"))
        return GlobResult(matches=matches, truncated=truncated, truncation_reason="budget" if truncated else None)


class _GrepQuery:
    """One `grep` call: what warren is asked, and the filters deepagents' contract adds
    (a glob with `/`, the excluded directories, the match cap)."""

    def __init__(self, pattern: str, path: str | None, glob: str | None, max_count: int | None,
                 exclude_dirs: tuple[str, ...], workdir_path: str | None) -> None:
        self.pattern, self.path, self.glob, self.max_count = pattern, path, glob, max_count
        self.root = path or workdir_path or ""
        self.error: str | None = None
        root_name = PurePosixPath(path or ".").name
        self.excluded = {name for name in exclude_dirs if name != root_name}
        self.path_matcher = None
        if glob and "/" in glob:
            try:
                self.path_matcher = compile_grep_include_glob(glob)
            except InvalidGlobPatternError as exc:
                self.error = f"Error: {exc}"

    def args(self) -> dict[str, Any]:
        # A glob with `/` is applied here, so warren is asked for every file then.
        name_glob = self.glob if self.glob and "/" not in self.glob else None
        exact = self.path_matcher is None and not self.excluded
        return {"pattern": regex_literal(self.pattern), "path": self.path, "glob": name_glob,
                "max_matches": self.max_count + 1 if exact and self.max_count is not None else None}

    def result(self, found: api.GrepResult) -> GrepResult:
        matches: list[GrepMatch] = []
        for m in found["matches"]:
            rel = _relative(m["path"], self.root)
            if self.excluded and any(part in self.excluded for part in rel.split("/")[:-1]):
                continue
            if self.path_matcher is not None and not self.path_matcher(rel):
                continue
            matches.append({"path": m["path"], "line": int(m["line_number"]), "text": m["line"]})
        return self._capped(matches, bool(found.get("truncated")))

    def in_file(self, download: FileDownloadResponse) -> GrepResult:
        """The search of one file (warren's grep takes a directory)."""
        if download.content is None:
            return GrepResult(error=f"Path '{self.path}': {download.error}")
        needles = self.pattern.split("\n")
        text = download.content.decode("utf-8", errors="replace")
        lines = text.replace("\r\n", "\n").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        matches: list[GrepMatch] = [
            {"path": self.path or "", "line": n, "text": line}
            for n, line in enumerate(lines, 1) if any(needle in line for needle in needles)
        ]
        return self._capped(matches, False)

    def _capped(self, matches: list[GrepMatch], truncated: bool) -> GrepResult:
        if self.max_count is not None and len(matches) > self.max_count:
            return GrepResult(matches=matches[:self.max_count], truncated=True)
        return GrepResult(matches=matches, truncated=truncated)
