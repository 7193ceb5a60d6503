"""envd in binary protobuf, and HTTP/2 without TLS (issue 17).

Run by crates/warren/tests/suite/e2b_tls.rs against a plain (no TLS) E2B listener. The
SDK's own generated Connect clients (`ProcessClientSync`, `FilesystemClientSync`, from the
installed connectrpc) are driven with connectrpc's binary protobuf codec
(`application/proto`, `application/connect+proto`; the SDK itself uses JSON, AgentScope
uses protobuf), the sandbox named by the `E2b-Sandbox-Id` header, the create answer's envd
access token in `X-Access-Token`: Start (start, data and end events), ListDir and Stat,
each over HTTP/1.1 and over h2c (HTTP/2 with prior knowledge). Then a JSON streaming Start
through httpx's HTTP/2 client proves the answer really came over HTTP/2. Prints
SCENARIO PASSED when every check held.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, WARREN_E2B_RUN.
"""

import base64
import json
import os
import struct

import httpx
from connectrpc.codec import proto_binary_codec
from e2b import Sandbox
from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof
from pyqwest import HTTPVersion, SyncClient, SyncHTTPTransport

URL = os.environ["E2B_SANDBOX_URL"]
RUN = os.environ["WARREN_E2B_RUN"]


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what.split("\n")[0][:160], flush=True)


sbx = Sandbox.create(timeout=120, metadata={"run": RUN})
token = sbx._envd_access_token
check(bool(token), "the create answer carries an envd access token")
headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": token}
sbx.files.write("/home/user/proto/a.txt", "12345")
sbx.files.make_dir("/home/user/proto/sub")

# Compression off as the SDK has it (connectrpc would gzip request bodies by default).
plain = {"send_compression": None, "accept_compression": ()}

for label, version in (("HTTP/1.1", HTTPVersion.HTTP1), ("h2c", HTTPVersion.HTTP2)):
    http = SyncClient(SyncHTTPTransport(http_version=version, timeout=60))
    process = process_connect.ProcessClientSync(
        URL, codec=proto_binary_codec(), http_client=http, **plain
    )
    filesystem = filesystem_connect.FilesystemClientSync(
        URL, codec=proto_binary_codec(), http_client=http, **plain
    )
    check(process._codec.name() == "proto", f"{label}: the client's codec is binary protobuf")

    # Start (server streaming): start, data, end.
    request = process_pb.StartRequest(
        process=process_pb.ProcessConfig(
            cmd="/bin/sh",
            args=["-c", "echo out-$V; echo err >&2; exit 3"],
            envs={"V": label},
        )
    )
    kinds, stdout, stderr, pid, end = [], b"", b"", None, None
    for response in process.start(request, headers=headers, timeout_ms=60_000):
        match response.event.event:
            case Oneof(field="start", value=start):
                kinds.append("start")
                pid = start.pid
            case Oneof(field="data", value=data):
                kinds.append("data")
                match data.output:
                    case Oneof(field="stdout", value=chunk):
                        stdout += chunk
                    case Oneof(field="stderr", value=chunk):
                        stderr += chunk
            case Oneof(field="end", value=value):
                kinds.append("end")
                end = value
            case Oneof(field="keepalive"):
                pass
    check(kinds[0] == "start" and pid, f"{label}: Start opens with start{{pid}}: {kinds}, pid {pid}")
    check(kinds[-1] == "end", f"{label}: Start closes with end: {kinds}")
    check(stdout == f"out-{label}\n".encode(), f"{label}: stdout in data events: {stdout!r}")
    check(stderr == b"err\n", f"{label}: stderr in data events: {stderr!r}")
    check(end.exit_code == 3 and end.exited, f"{label}: end carries the exit code: {end}")

    # ListDir and Stat (unary).
    listing = filesystem.list_dir(
        filesystem_pb.ListDirRequest(path="/home/user/proto", depth=1),
        headers=headers,
        timeout_ms=30_000,
    )
    entries = {entry.name: entry for entry in listing.entries}
    check(set(entries) == {"a.txt", "sub"}, f"{label}: ListDir lists the directory: {sorted(entries)}")
    check(
        entries["a.txt"].type == filesystem_pb.FileType.FILE and entries["a.txt"].size == 5,
        f"{label}: ListDir's file entry: {entries['a.txt']}",
    )
    check(
        entries["sub"].type == filesystem_pb.FileType.DIRECTORY,
        f"{label}: ListDir's directory entry: {entries['sub']}",
    )
    stat = filesystem.stat(
        filesystem_pb.StatRequest(path="/home/user/proto/a.txt"), headers=headers, timeout_ms=30_000
    )
    check(
        stat.entry.name == "a.txt"
        and stat.entry.path == "/home/user/proto/a.txt"
        and stat.entry.size == 5
        and stat.entry.owner == "user",
        f"{label}: Stat describes the file: {stat.entry}",
    )

    # A wrong token is refused in protobuf too.
    try:
        filesystem.stat(
            filesystem_pb.StatRequest(path="/home/user/proto/a.txt"),
            headers={**headers, "X-Access-Token": "wrong"},
            timeout_ms=30_000,
        )
    except Exception as error:  # connectrpc.errors.ConnectError
        check("unauthenticated" in str(getattr(error, "code", "")).lower(), f"{label}: a wrong token: {error!r}")
    else:
        raise AssertionError(f"{label}: Stat with a wrong token succeeded")

# h2c, observed: httpx's HTTP/2 client with prior knowledge, a streaming Start in JSON.
body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "echo h2c"]}}).encode()
with httpx.Client(http1=False, http2=True, timeout=60) as client:
    with client.stream(
        "POST",
        f"{URL}/process.Process/Start",
        content=struct.pack(">BI", 0, len(body)) + body,
        headers={
            **headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
        },
    ) as response:
        check(response.http_version == "HTTP/2", f"the plain listener speaks h2c: {response.http_version}")
        check(response.status_code == 200, f"Start over h2c answers 200: {response.status_code}")
        data = response.read()
messages, trailer = [], None
while data:
    flags, length = struct.unpack(">BI", data[:5])
    message = json.loads(data[5 : 5 + length])
    data = data[5 + length :]
    if flags & 0x02:
        trailer = message
    else:
        messages.append(message["event"])
stdout = "".join(
    base64.b64decode(m["data"]["stdout"]).decode() for m in messages if "stdout" in m.get("data", {})
)
check("start" in messages[0] and "end" in messages[-1], f"h2c Start: start ... end: {messages}")
check(stdout == "h2c\n", f"h2c Start's stdout: {stdout!r}")
check(trailer is not None and "error" not in trailer, f"h2c Start ends cleanly: {trailer}")

sbx.kill()
print("SCENARIO PASSED", flush=True)
