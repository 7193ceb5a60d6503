"""E2B over TLS with host-name routing (issue 17), driven by the official Python SDK.

Run by crates/warren/tests/suite/e2b_tls.rs in a private mount namespace whose
/etc/resolv.conf names the test's DNS server, which answers every name of the domain
(a wildcard zone) with the listener's loopback address. The SDK is given only E2B_DOMAIN
(no E2B_API_URL, no E2B_SANDBOX_URL), so it reaches the control plane at
https://api.<domain> and each sandbox's envd at https://49983-<id>.<domain>, both on port
443, trusting the test's CA through SSL_CERT_FILE (pyqwest's system roots and Python's ssl
both read it). Prints SCENARIO PASSED when every check held.

Environment: E2B_DOMAIN, E2B_API_KEY, SSL_CERT_FILE, WARREN_E2B_RUN (a metadata value of
this run).
"""

import base64
import http.client
import json
import os
import ssl
import struct
import urllib.error
import urllib.parse
import urllib.request

import httpx
from e2b import Sandbox, SandboxQuery

DOMAIN = os.environ["E2B_DOMAIN"]
RUN = os.environ["WARREN_E2B_RUN"]
CA = os.environ["SSL_CERT_FILE"]

assert "E2B_API_URL" not in os.environ and "E2B_SANDBOX_URL" not in os.environ


def envd_host(sandbox_id):
    return f"49983-{sandbox_id}.{DOMAIN}"


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what.split("\n")[0][:120], flush=True)


def get(host, path, token=None, extra_headers=None):
    """A GET over TLS to the listener naming `host` (SNI and Host), with Python's own TLS
    (the CA from SSL_CERT_FILE): (status, body)."""
    context = ssl.create_default_context(cafile=CA)
    connection = http.client.HTTPSConnection(host, 443, context=context, timeout=30)
    headers = dict(extra_headers or {})
    if token is not None:
        headers["X-Access-Token"] = token
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


def connect_stream(client, url, token, request):
    """A Connect server-streaming call in JSON (envelopes of flag, length, message):
    (the response's HTTP version, the messages, the end-of-stream message)."""
    body = json.dumps(request).encode()
    envelope = struct.pack(">BI", 0, len(body)) + body
    headers = {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "X-Access-Token": token,
    }
    with client.stream("POST", url, content=envelope, headers=headers) as response:
        check(response.status_code == 200, f"Start answers 200 ({response.status_code})")
        data = response.read()
        version = response.http_version
    messages, end = [], None
    while data:
        flags, length = struct.unpack(">BI", data[:5])
        message = json.loads(data[5 : 5 + length])
        data = data[5 + length :]
        if flags & 0x02:
            end = message
        else:
            messages.append(message)
    return version, messages, end


# create: through https://api.<domain> only.
sbx = Sandbox.create(timeout=120, metadata={"run": RUN}, envs={"FOO": "bar"})
check(
    sbx.envd_api_url == f"https://{envd_host(sbx.sandbox_id)}",
    f"the SDK reaches envd by host name: {sbx.envd_api_url}",
)
check(sbx.sandbox_domain == DOMAIN, f"the sandbox's domain is {DOMAIN}: {sbx.sandbox_domain}")

# commands.run: process.Process/Start streamed over TLS, routed by the host name.
result = sbx.commands.run("echo hello $FOO; whoami; echo oops >&2")
check(result.exit_code == 0, f"the command exits 0 ({result.exit_code})")
check(result.stdout == "hello bar\nuser\n", f"stdout over TLS: {result.stdout!r}")
check(result.stderr == "oops\n", f"stderr over TLS: {result.stderr!r}")

# files: /files over TLS.
sbx.files.write("/home/user/tls.txt", "over tls\n")
check(sbx.files.read("/home/user/tls.txt") == "over tls\n", "files.read returns what files.write wrote")
names = [entry.name for entry in sbx.files.list("/home/user")]
check("tls.txt" in names, f"files.list shows the file: {names}")

# A signed download URL names the sandbox in its host name; plain urllib fetches it.
url = sbx.download_url("/home/user/tls.txt")
parsed = urllib.parse.urlsplit(url)
check(parsed.scheme == "https", f"the download URL is https: {url}")
check(parsed.hostname == envd_host(sbx.sandbox_id), f"the download URL names the sandbox: {url}")
with urllib.request.urlopen(url, timeout=30) as response:
    check(response.read() == b"over tls\n", "urllib fetches the file through the signed URL")

# A second sandbox: a host name routes to its sandbox only.
other = Sandbox.create(timeout=120, metadata={"run": RUN})
other.files.write("/home/user/only-other.txt", "the other one\n")
token = sbx._envd_access_token
other_token = other._envd_access_token
check(token and other_token and token != other_token, "each sandbox has an access token of its own")
path = "/files?" + urllib.parse.urlencode({"path": "/home/user/only-other.txt", "username": "user"})
status, body = get(envd_host(other.sandbox_id), path, other_token)
check(status == 200 and body == b"the other one\n", f"the other sandbox's host serves its file ({status})")
status, body = get(envd_host(sbx.sandbox_id), path, token)
check(status == 404, f"the first sandbox's host does not serve the other's file ({status}: {body[:200]!r})")
status, body = get(envd_host(other.sandbox_id), path, token)
check(
    status == 401 and b"the other one" not in body,
    f"the other sandbox's host refuses the first one's token ({status}: {body[:200]!r})",
)
status, body = get(envd_host("nosuchsandbox"), path, token)
check(status == 502 and b"was not found" in body and b"the other one" not in body,
      f"an unknown sandbox's host answers as E2B's proxy does, serving nothing ({status}: {body[:200]!r})")
# The sandbox named under another domain is not routed by host name (nor is the API's host).
for host in (f"49983-{other.sandbox_id}.elsewhere.test", f"api.{DOMAIN}"):
    status, body = get(f"api.{DOMAIN}", path, other_token, {"Host": host})
    check(
        status != 200 and b"the other one" not in body,
        f"Host {host} names no sandbox ({status}: {body[:200]!r})",
    )

# HTTP/2 by ALPN: a streaming Start on h2 (httpx, the SDK's own h2 stack).
with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=CA), timeout=30) as client:
    version, messages, end = connect_stream(
        client,
        f"https://{envd_host(sbx.sandbox_id)}/process.Process/Start",
        token,
        {"process": {"cmd": "/bin/sh", "args": ["-c", "echo h2"]}},
    )
check(version == "HTTP/2", f"TLS negotiates HTTP/2 by ALPN ({version})")
events = [m["event"] for m in messages]
check("start" in events[0], f"the first event is start: {events[:1]}")
stdout = "".join(
    base64.b64decode(e["data"]["stdout"]).decode() for e in events if "data" in e and "stdout" in e["data"]
)
check(stdout == "h2\n", f"stdout over h2: {stdout!r}")
check("end" in events[-1] and events[-1]["end"].get("exited", False), f"the last event is end: {events[-1]}")
check(end is not None and "error" not in end, f"the stream ends cleanly: {end}")

# kill: through https://api.<domain>.
sbx.kill()
other.kill()
alive = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"run": RUN})).next_items()]
check(alive == [], f"no sandbox of this run is left: {alive}")

print("SCENARIO PASSED", flush=True)
