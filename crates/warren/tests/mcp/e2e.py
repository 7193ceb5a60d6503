#!/usr/bin/env python3
"""End-to-end test of warren's MCP server, driven by the official MCP Python SDK.

Connects over streamable HTTP (`{url}/v1/sandboxes/{sandbox}/mcp`, Bearer token) or
over stdio (`{warren_bin} mcp --sandbox {sandbox}` with WARREN_URL/WARREN_TOKEN), runs
every check below in order and stops at the first failure:

    FAIL: <check name>: <what was expected> / <what came back>     (exit 1)
    ALL CHECKS PASSED (<transport>)                                 (exit 0)

Only dependency besides the standard library: `pip install mcp` (2.3.0), which brings
`httpx2`, used here for the artifact REST checks.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import struct
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ImageContent, TextContent

RUN_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 60.0
VIRTUAL_ROOT = "/home/gem/user-data/"
WORKDIR_PREFIX = "/home/gem/user-data/projects/"
EXPECTED_TOOLS = frozenset(
    {
        "bash",
        "ls",
        "read_file",
        "write_file",
        "edit_file",
        "glob",
        "grep",
        "present_files",
        "view_image",
        "start_process",
        "process_output",
        "write_stdin",
        "kill_process",
        "list_processes",
        "sandbox_status",
        "set_deadline",
        "pause_sandbox",
        "resume_sandbox",
        "watch_files",
        "run_code",
        "branch_diff",
    }
)
FIXED_FORBIDDEN = ("/var/lib/warren", "user-data/shared")


class CheckFailed(Exception):
    """One failed check: printed as `FAIL: <check>: <expected> / <got>`."""

    def __init__(self, check: str, expected: str, got: str) -> None:
        super().__init__(check, expected, got)
        self.check = check
        self.expected = expected
        self.got = got


def shorten(value: object, limit: int = 600) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


@dataclass
class ToolReply:
    """A tools/call result reduced to what the checks look at."""

    is_error: bool
    text: str
    result: CallToolResult

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


@dataclass
class Ctx:
    """State shared by the checks of one run."""

    args: argparse.Namespace
    session: ClientSession
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    texts: list[str] = field(default_factory=list)  # every text received, scanned by the last check
    workdir: str = ""  # virtual workdir, learnt from `pwd` in check 2
    check: str = "connect"  # name of the check now running

    # Per-run unique names (the workdir is fresh anyway).
    @property
    def notes(self) -> str:
        return f"notes-{self.tag}"

    @property
    def notes_file(self) -> str:
        return f"notes-{self.tag}/a.txt"

    def expect(self, condition: bool, expected: str, got: object) -> None:
        if not condition:
            raise CheckFailed(self.check, expected, shorten(got))

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float | None = None) -> ToolReply:
        """Call a tool; a JSON-RPC error instead of a CallToolResult fails the check."""
        try:
            result = await self.session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            self.texts.append(exc.message)
            raise CheckFailed(
                self.check,
                f"a CallToolResult from {tool}({shorten(arguments, 200)})",
                f"protocol error {exc.code}: {shorten(exc.message)}",
            ) from exc
        text = "\n".join(item.text for item in result.content if isinstance(item, TextContent))
        self.texts.append(text)
        return ToolReply(is_error=result.is_error, text=text, result=result)

    async def ok(self, tool: str, arguments: dict[str, Any], timeout_s: float | None = None) -> ToolReply:
        reply = await self.call(tool, arguments, timeout_s)
        self.expect(not reply.is_error, f"{tool}({shorten(arguments, 200)}) to succeed", f"isError: {reply.text}")
        return reply

    async def err(self, tool: str, arguments: dict[str, Any], *needles: str) -> ToolReply:
        reply = await self.call(tool, arguments)
        what = f"{tool}({shorten(arguments, 200)})"
        self.expect(reply.is_error, f"{what} to be a tool error (isError true)", f"isError false: {reply.text}")
        self.expect(reply.text.strip() != "", f"{what} to explain the error in text", reply.result.content)
        for needle in needles:
            self.expect(needle in reply.text, f"{what} error text containing {needle!r}", reply.text)
        return reply


# ---------------------------------------------------------------------------
# Checks, in the order the spec lists them.
# ---------------------------------------------------------------------------


async def check_list_tools(ctx: Ctx) -> None:
    listing = await ctx.session.list_tools()
    for tool in listing.tools:
        ctx.texts.append(tool.description or "")
        ctx.texts.append(json.dumps(tool.input_schema))
    names = [tool.name for tool in listing.tools]
    ctx.expect(
        len(names) == len(EXPECTED_TOOLS) and set(names) == EXPECTED_TOOLS,
        f"exactly the tools {sorted(EXPECTED_TOOLS)}",
        sorted(names),
    )
    for tool in listing.tools:
        ctx.expect(bool((tool.description or "").strip()), f"tool {tool.name} to have a description", tool.description)
        ctx.expect(
            tool.input_schema.get("type") == "object",
            f"tool {tool.name} inputSchema of type object",
            tool.input_schema,
        )


async def check_bash_basics(ctx: Ctx) -> None:
    reply = await ctx.err("bash", {"command": "echo hello; echo oops >&2; exit 3"}, "hello", "[stderr]", "oops")
    ctx.expect(reply.lines[-1:] == ["[exit code: 3]"], "last line '[exit code: 3]'", reply.text)
    ctx.expect(
        reply.text.index("hello") < reply.text.index("[stderr]") < reply.text.index("oops"),
        "stdout, then '[stderr]', then the stderr",
        reply.text,
    )

    reply = await ctx.ok("bash", {"command": "pwd"})
    ctx.expect(reply.text.startswith(WORKDIR_PREFIX), f"pwd starting with {WORKDIR_PREFIX}", reply.text)
    ctx.expect(reply.lines[-1:] == ["[exit code: 0]"], "last line '[exit code: 0]'", reply.text)
    ctx.workdir = reply.lines[0].rstrip("/")

    reply = await ctx.ok("bash", {"command": "id -u"})
    ctx.expect(reply.lines[:1] == ["1000"], "id -u printing 1000", reply.text)


async def check_bash_timeout(ctx: Ctx) -> None:
    started = time.monotonic()
    reply = await ctx.call("bash", {"command": "sleep 30", "timeout_s": 1}, timeout_s=20)
    elapsed = time.monotonic() - started
    ctx.expect(reply.is_error, "isError true for a timed-out command", reply.text)
    ctx.expect("timed out" in reply.text, "text containing 'timed out'", reply.text)
    ctx.expect(elapsed < 15, "the call to return in < 15 s", f"{elapsed:.1f} s")


def numbered(number: int, line: str) -> str:
    """`cat -n` style: line number right-aligned in 6 columns, a tab, the line."""
    return f"{number:>6}\t{line}"


def numbered_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^ *\d+\t", line)]


async def check_write_and_read(ctx: Ctx) -> None:
    path = ctx.notes_file
    reply = await ctx.ok("write_file", {"path": path, "content": "line1\nline2\nline3\n"})
    ctx.expect(VIRTUAL_ROOT in reply.text, f"write_file text naming a path under {VIRTUAL_ROOT}", reply.text)
    ctx.expect(f"{ctx.workdir}/{path}" in reply.text, f"write_file text naming {ctx.workdir}/{path}", reply.text)
    await ctx.ok("write_file", {"path": path, "content": "line4\n", "append": True})

    reply = await ctx.ok("read_file", {"path": path})
    want = [numbered(n, f"line{n}") for n in range(1, 5)]
    ctx.expect(numbered(1, "line1") in reply.lines, "a line '     1\\tline1'", reply.text)
    ctx.expect(numbered_lines(reply.text) == want, f"exactly the numbered lines {want}", reply.text)
    ctx.expect("offset=" not in reply.text, "no continuation note when the whole file was read", reply.text)

    reply = await ctx.ok("read_file", {"path": path, "offset": 2, "limit": 2})
    want = [numbered(2, "line2"), numbered(3, "line3")]
    ctx.expect(numbered_lines(reply.text) == want, f"exactly the numbered lines {want}", reply.text)
    ctx.expect("offset=4" in reply.text, "a continuation note containing 'offset=4'", reply.text)


async def check_edit_file(ctx: Ctx) -> None:
    await ctx.err(
        "edit_file",
        {"path": ctx.notes_file, "old_string": f"absent-{ctx.tag}", "new_string": "z"},
        "not found",
    )
    path = f"edit-{ctx.tag}.txt"
    await ctx.ok("write_file", {"path": path, "content": "x x"})
    await ctx.err("edit_file", {"path": path, "old_string": "x", "new_string": "y"}, "replace_all")
    reply = await ctx.ok("read_file", {"path": path})
    ctx.expect(numbered_lines(reply.text) == [numbered(1, "x x")], "a refused edit leaving 'x x' unchanged", reply.text)

    await ctx.ok("edit_file", {"path": path, "old_string": "x", "new_string": "y", "replace_all": True})
    reply = await ctx.ok("read_file", {"path": path})
    ctx.expect(numbered_lines(reply.text) == [numbered(1, "y y")], "the file reading back 'y y'", reply.text)


async def check_ls_glob_grep(ctx: Ctx) -> None:
    reply = await ctx.ok("ls", {"path": "."})
    ctx.expect(f"{ctx.notes}/" in reply.lines, f"ls . listing '{ctx.notes}/'", reply.text)
    reply = await ctx.ok("ls", {})
    ctx.expect(f"{ctx.notes}/" in reply.lines, f"ls (default path) listing '{ctx.notes}/'", reply.text)
    reply = await ctx.ok("ls", {"path": ".", "depth": 2})
    ctx.expect(ctx.notes_file in reply.lines, f"ls depth 2 listing '{ctx.notes_file}'", reply.text)

    reply = await ctx.ok("glob", {"pattern": "**/*.txt"})
    ctx.expect(ctx.notes_file in reply.lines, f"glob **/*.txt listing '{ctx.notes_file}'", reply.text)

    reply = await ctx.ok("grep", {"pattern": "line[23]"})
    for want in (f"{ctx.notes_file}:2:line2", f"{ctx.notes_file}:3:line3"):
        ctx.expect(any(line.endswith(want) for line in reply.lines), f"a grep line '{want}'", reply.text)
    ctx.expect(
        not any(line.endswith((":1:line1", ":4:line4")) for line in reply.lines),
        "grep line[23] not matching line1/line4",
        reply.text,
    )


async def check_bad_input(ctx: Ctx) -> None:
    await ctx.err("read_file", {})  # missing required `path`
    await ctx.err("read_file", {"path": f"missing-{ctx.tag}.txt"})
    await ctx.err("bash", {"command": "echo hi", "timeout_s": "abc"})
    await ctx.err("bash", {"command": {"not": "a string"}})  # argument of the wrong JSON type


def forbidden_substrings(ctx: Ctx) -> list[str]:
    found: list[str] = list(FIXED_FORBIDDEN)
    data_dir = ctx.args.data_dir.rstrip("/")
    if data_dir:
        found.append(data_dir)
        real = os.path.realpath(data_dir)
        if real != data_dir:
            found.append(real)
    return found


def expect_no_leak(ctx: Ctx, text: str) -> None:
    for needle in forbidden_substrings(ctx):
        ctx.expect(needle not in text, f"no {needle!r} in any text", text)


async def check_escapes(ctx: Ctx) -> None:
    replies = [
        await ctx.err("read_file", {"path": "../../../../etc/passwd"}),
        # Outside the mounts the runtime's own: what uid 1000 may not read, and procfs.
        await ctx.err("read_file", {"path": "/etc/shadow"}),
        await ctx.err("read_file", {"path": "/proc/self/environ"}),
        await ctx.err("read_file", {"path": "/home/gem/user-data/../../../etc/shadow"}),
    ]
    link = f"link-{ctx.tag}"
    await ctx.ok("bash", {"command": f"ln -s /etc/passwd {link}"})
    replies.append(await ctx.err("read_file", {"path": link}))
    replies.append(await ctx.err("write_file", {"path": f"/home/gem/skills/e2e-{ctx.tag}", "content": "x"}))
    for reply in replies:
        ctx.expect("root:x:0:0" not in reply.text, "no /etc/passwd content in the reply", reply.text)
        expect_no_leak(ctx, reply.text)


def artifact_id(text: str) -> str | None:
    match = re.search(r"art-[A-Za-z0-9_-]+", text)
    return match.group(0) if match else None


async def present_one(ctx: Ctx, path: str, content: str) -> str:
    """Write `path` under outputs/, present it, return its artifact id."""
    await ctx.ok("write_file", {"path": path, "content": content})
    reply = await ctx.ok("present_files", {"paths": [path]})
    art = artifact_id(reply.text)
    ctx.expect(art is not None, f"present_files text with an art- id for {path}", reply.text)
    assert art is not None
    return art


async def check_present_files(ctx: Ctx) -> None:
    await ctx.err("present_files", {"paths": [ctx.notes_file]}, "outputs/")
    await ctx.err("present_files", {"paths": ["../outputs/x"]})
    await ctx.err("present_files", {"paths": [f"outputs/../{ctx.notes_file}"]})

    report_path = f"outputs/report-{ctx.tag}.md"
    report = f"# Report {ctx.tag}\n\nwritten by the MCP e2e test\n"
    report_id = await present_one(ctx, report_path, report)
    if ctx.args.transport != "http":
        return

    async with rest_client(ctx) as http:
        listing = await rest_get(ctx, http, "/artifacts")
        try:
            document = listing.json()
        except ValueError:
            document = None
        entry = find_artifact(document, report_id)
        ctx.expect(entry is not None, f"GET /artifacts listing artifact_id {report_id}", listing.text)
        assert entry is not None
        virtual = f"{ctx.workdir}/{report_path}"
        ctx.expect(entry.get("path") == virtual, f"artifact {report_id} with path {virtual}", entry)
        data = report.encode()
        ctx.expect(entry.get("size") == len(data), f"artifact {report_id} with size {len(data)}", entry)
        sha = hashlib.sha256(data).hexdigest()
        ctx.expect(entry.get("sha256") == sha, f"artifact {report_id} with sha256 {sha}", entry)

        body = await rest_get(ctx, http, f"/artifacts/{report_id}")
        ctx.expect(body.content == data, f"GET /artifacts/{report_id} returning the file", body.content)

        page_id = await present_one(ctx, f"outputs/page-{ctx.tag}.html", "<html><script>alert(1)</script></html>\n")
        page = await rest_get(ctx, http, f"/artifacts/{page_id}")
        disposition = page.headers.get("content-disposition", "")
        ctx.expect(
            disposition.lower().startswith("attachment"),
            "HTML artifact with Content-Disposition: attachment",
            dict(page.headers),
        )
        ctx.expect(
            page.headers.get("x-content-type-options", "").lower() == "nosniff",
            "HTML artifact with X-Content-Type-Options: nosniff",
            dict(page.headers),
        )


@asynccontextmanager
async def rest_client(ctx: Ctx) -> AsyncIterator[httpx2.AsyncClient]:
    base = f"{ctx.args.url.rstrip('/')}/v1/sandboxes/{ctx.args.sandbox}"
    headers = {"Authorization": f"Bearer {ctx.args.token}"}
    async with httpx2.AsyncClient(base_url=base, headers=headers, timeout=30.0) as http:
        yield http


async def rest_get(ctx: Ctx, http: httpx2.AsyncClient, path: str) -> httpx2.Response:
    response = await http.get(path)
    ctx.texts.append(response.text)
    ctx.expect(response.status_code == 200, f"GET {path} answering 200", f"{response.status_code}: {response.text}")
    return response


def find_artifact(document: Any, art_id: str) -> dict[str, Any] | None:
    """The entry of `{"artifacts": [{"artifact_id", "path", "size", "sha256", ...}]}` for `art_id`."""
    entries = document.get("artifacts") if isinstance(document, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("artifact_id") == art_id:
            return entry
    return None


def tiny_png() -> bytes:
    """A valid 1x1 red RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # width, height, bit depth 8, RGB, defaults
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte 0, then one RGB pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


async def check_view_image(ctx: Ctx) -> None:
    png = tiny_png()
    path = f"img-{ctx.tag}.png"
    await ctx.ok("bash", {"command": f"echo {base64.b64encode(png).decode()} | base64 -d > {path}"})
    reply = await ctx.ok("view_image", {"path": path})
    images = [item for item in reply.result.content if isinstance(item, ImageContent)]
    ctx.expect(len(images) == 1, "exactly one image content item", reply.result.content)
    image = images[0]
    ctx.expect(image.mime_type == "image/png", "mimeType image/png", image.mime_type)
    try:
        decoded = base64.b64decode(image.data, validate=True)
    except ValueError:
        decoded = b"<invalid base64>"
    ctx.expect(decoded == png, f"image data decoding to the {len(png)} PNG bytes written", decoded)
    await ctx.err("view_image", {"path": ctx.notes_file})


async def check_background_processes(ctx: Ctx) -> None:
    # A background process that reads its stdin: it answers each line, then ends on EOF.
    reply = await ctx.ok(
        "start_process",
        {"command": "while read line; do echo \"got $line\"; done; echo bye", "stdin": True, "tag": f"echo-{ctx.tag}"},
    )
    match = re.search(r"Started process (\d+)", reply.text)
    ctx.expect(match is not None, "'Started process <pid>'", reply.text)
    pid = int(match.group(1)) if match else 0
    reply = await ctx.ok("list_processes", {})
    ctx.expect(f"echo-{ctx.tag}" in reply.text and "running" in reply.text, "the process listed as running", reply.text)
    await ctx.ok("write_stdin", {"pid": pid, "input": "one\n"})
    reply = await ctx.ok("process_output", {"pid": pid, "wait_s": 10})
    ctx.expect("got one" in reply.text, "its answer to the first line", reply.text)
    offset = re.search(r"next offset: (\d+)", reply.text)
    ctx.expect(offset is not None, "'next offset: N'", reply.text)
    await ctx.ok("write_stdin", {"pid": pid, "input": "two\n", "close": True})
    # From the offset on: only what is new, then (each call from the offset it named last,
    # so `wait_s` waits for the end once the output is all read) the end.
    start = int(offset.group(1)) if offset else 0
    text = ""
    for _ in range(20):
        reply = await ctx.ok("process_output", {"pid": pid, "from": start, "wait_s": 5})
        text += reply.text + "\n"
        if "exited with code 0" in reply.text:
            break
        nxt = re.search(r"next offset: (\d+)", reply.text)
        start = int(nxt.group(1)) if nxt else start
    ctx.expect("got two" in text and "bye" in text and "got one" not in text, "only what is new since the offset", text)
    ctx.expect("exited with code 0" in text, "the process ended with code 0", text)

    # A long one is stopped by kill_process, with everything it started.
    reply = await ctx.ok("start_process", {"command": "sleep 300 & sleep 301"})
    match = re.search(r"Started process (\d+)", reply.text)
    pid = int(match.group(1)) if match else 0
    reply = await ctx.ok("kill_process", {"pid": pid})
    ctx.expect("killed by signal 9" in reply.text, "'killed by signal 9'", reply.text)
    reply = await ctx.ok("bash", {"command": "ps -eo args | grep -c '^sleep 30[01]' || true"})
    ctx.expect(reply.lines[:1] == ["0"], "nothing of its tree left", reply.text)
    await ctx.err("process_output", {"pid": 999999})


async def check_lifecycle(ctx: Ctx) -> None:
    reply = await ctx.ok("set_deadline", {"timeout_s": 3600, "labels": {"by": ctx.tag}})
    ctx.expect(f"by={ctx.tag}" in reply.text and "deadline 20" in reply.text, "the deadline and label set", reply.text)
    reply = await ctx.ok("sandbox_status", {})
    live = any(f"is {state};" in reply.text for state in ("created", "running", "stopped"))
    ctx.expect(live, "a live state", reply.text)
    await ctx.err("set_deadline", {"on_deadline": "explode"})
    reply = await ctx.ok("set_deadline", {"timeout_s": None})
    ctx.expect("no deadline" in reply.text, "the deadline removed", reply.text)
    # Nothing changes in a second: the wait ends empty, not with an error.
    reply = await ctx.ok("watch_files", {"timeout_s": 1})
    ctx.expect("Nothing changed" in reply.text, "'Nothing changed'", reply.text)
    await ctx.err("watch_files", {"path": "../../etc"})


async def check_no_host_paths(ctx: Ctx) -> None:
    for text in ctx.texts:
        expect_no_leak(ctx, text)


async def check_run_code(ctx: Ctx) -> None:
    # State stays between calls of one context; a named context keeps its own.
    await ctx.ok("run_code", {"code": f"seen = '{ctx.tag}'"})
    reply = await ctx.ok("run_code", {"code": "seen + '!'"})
    ctx.expect(f"[result] '{ctx.tag}!'" in reply.text, f"[result] '{ctx.tag}!'", reply.text)
    await ctx.ok("run_code", {"code": "seen = 'other'", "context": f"ctx-{ctx.tag}"})
    reply = await ctx.ok("run_code", {"code": "seen"})
    ctx.expect(f"[result] '{ctx.tag}'" in reply.text, "the default context's own value", reply.text)
    # A plot comes back as an image the model can look at.
    reply = await ctx.ok(
        "run_code",
        {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"},
        timeout_s=RUN_TIMEOUT_S,
    )
    images = [item for item in reply.result.content if isinstance(item, ImageContent)]
    ctx.expect(len(images) == 1, "exactly one image content item for the plot", reply.result.content)
    ctx.expect(images[0].mime_type == "image/png", "mimeType image/png", images[0].mime_type)
    ctx.expect(base64.b64decode(images[0].data).startswith(b"\x89PNG"), "PNG bytes", images[0].data[:40])
    # An exception is a tool error with its traceback, without terminal colours.
    reply = await ctx.err("run_code", {"code": "def f():\n    return 1 / 0\nf()"}, "ZeroDivisionError", "return 1 / 0")
    ctx.expect("\x1b[" not in reply.text, "no ANSI colours in the traceback", reply.text)
    # A timeout interrupts the kernel; its state stays.
    reply = await ctx.err("run_code", {"code": "import time\nwhile True: time.sleep(0.1)", "timeout_s": 1}, "timed out", "KeyboardInterrupt")
    reply = await ctx.ok("run_code", {"code": "seen"})
    ctx.expect(f"[result] '{ctx.tag}'" in reply.text, "state kept after the interrupt", reply.text)


async def check_branch_diff(ctx: Ctx) -> None:
    # This sandbox writes its workdir itself: the tool says so, as a tool error.
    await ctx.err("branch_diff", {}, "not a branch")
    await ctx.err("branch_diff", {"path": "x"}, "takes no arguments")


CHECKS: list[tuple[str, Callable[[Ctx], Awaitable[None]]]] = [
    ("1 list_tools", check_list_tools),
    ("2 bash basics", check_bash_basics),
    ("3 bash timeout", check_bash_timeout),
    ("4 write_file/read_file", check_write_and_read),
    ("5 edit_file", check_edit_file),
    ("6 ls/glob/grep", check_ls_glob_grep),
    ("7 bad input is a tool error", check_bad_input),
    ("8 escapes refused", check_escapes),
    ("9 present_files/artifacts", check_present_files),
    ("10 view_image", check_view_image),
    ("11 background processes", check_background_processes),
    ("12 the sandbox's own life", check_lifecycle),
    ("13 run_code", check_run_code),
    ("14 branch_diff", check_branch_diff),
    ("15 no host paths in any text", check_no_host_paths),
]


# ---------------------------------------------------------------------------
# Transports and the run.
# ---------------------------------------------------------------------------


@asynccontextmanager
async def open_session(args: argparse.Namespace) -> AsyncIterator[ClientSession]:
    if args.transport == "http":
        endpoint = f"{args.url.rstrip('/')}/v1/sandboxes/{args.sandbox}/mcp"
        headers = {"Authorization": f"Bearer {args.token}"}
        timeout = httpx2.Timeout(30.0, read=REQUEST_TIMEOUT_S)
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            async with streamable_http_client(endpoint, http_client=http) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=REQUEST_TIMEOUT_S) as session:
                    await session.initialize()
                    yield session
    else:
        env = {"WARREN_URL": args.url, "WARREN_TOKEN": args.token}
        env.update({key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ})
        server = StdioServerParameters(command=args.warren_bin, args=["mcp", "--sandbox", args.sandbox], env=env)
        async with stdio_client(server) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=REQUEST_TIMEOUT_S) as session:
                await session.initialize()
                yield session


async def run_checks(args: argparse.Namespace, progress: list[str]) -> CheckFailed | None:
    """Run every check; return the first failure instead of raising it through the SDK's task groups.

    `progress[-1]` is the check now running, for the overall-timeout message.
    """
    failure: CheckFailed | None = None
    ctx: Ctx | None = None
    try:
        async with open_session(args) as session:
            ctx = Ctx(args=args, session=session)
            try:
                for name, check in CHECKS:
                    ctx.check = name
                    progress.append(name)
                    await check(ctx)
                    print(f"ok: {name}", flush=True)
            except CheckFailed as exc:
                failure = exc
            except MCPError as exc:
                failure = CheckFailed(ctx.check, "no protocol error", f"{exc.code}: {exc.message}")
    except CheckFailed as exc:
        failure = exc
    except Exception as exc:  # noqa: BLE001 - connection problems, SDK errors, timeouts
        failure = CheckFailed(ctx.check if ctx else "connect", "the run to complete", describe(exc))
    return failure


def describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


async def main_async(args: argparse.Namespace) -> int:
    failure: CheckFailed | None = None
    progress = ["connect"]
    with anyio.move_on_after(RUN_TIMEOUT_S) as scope:
        failure = await run_checks(args, progress)
    if scope.cancelled_caught:
        failure = CheckFailed(progress[-1], f"the run to finish within {RUN_TIMEOUT_S:.0f} s", "timed out")
    if failure is not None:
        print(f"FAIL: {failure.check}: {failure.expected} / {failure.got}", flush=True)
        return 1
    print(f"ALL CHECKS PASSED ({args.transport})", flush=True)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="End-to-end checks of warren's MCP server (MCP Python SDK client).")
    parser.add_argument("--url", required=True, help="warren base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--token", required=True, help="API token (sent as Authorization: Bearer)")
    parser.add_argument("--sandbox", required=True, help="sandbox id, e.g. sbx-1234 (fresh, empty workdir)")
    parser.add_argument("--data-dir", required=True, help="host data directory; must never appear in any reply")
    parser.add_argument("--transport", required=True, choices=("http", "stdio"))
    parser.add_argument("--warren-bin", help="warren binary, launched as `warren mcp --sandbox ID` (stdio)")
    args = parser.parse_args(argv)
    if args.transport == "stdio" and not args.warren_bin:
        parser.error("--warren-bin is required with --transport stdio")
    return args


def main() -> int:
    return anyio.run(main_async, parse_args(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
