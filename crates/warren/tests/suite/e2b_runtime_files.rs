//! E2B's official Python SDK on files outside the home (issue 42): `/tmp` and the image's
//! own tree are the runtime's, served by its agent as the sandbox user, so what the SDK
//! writes a command reads, and what uid 1000 may not do the SDK may not do either.

use std::time::Duration;

use warren_test_support::TestServer;

use super::bin;

const SCENARIO: &str = r#"
import time

from e2b import FilesystemEventType, Sandbox

def check(ok, what, seen):
    if not ok:
        raise AssertionError(f"{what}: {seen!r}")

sbx = Sandbox.create(timeout=120)
try:
    info = sbx.files.write("/tmp/e2b/a.txt", "hello /tmp\n")
    check(info.path == "/tmp/e2b/a.txt", "the written path is the runtime's", info)
    check(sbx.files.read("/tmp/e2b/a.txt") == "hello /tmp\n", "it reads back", None)
    seen = sbx.commands.run("cat /tmp/e2b/a.txt; find /tmp/e2b/a.txt -printf ' %U:%G %m'")
    check(seen.stdout == "hello /tmp\n 1000:1000 644", "a command reads it, the user's", seen.stdout)
    sbx.commands.run("echo from-a-command > /tmp/e2b/b.txt")
    check(sbx.files.read("/tmp/e2b/b.txt") == "from-a-command\n", "what a command wrote reads", None)
    names = sorted(entry.name for entry in sbx.files.list("/tmp/e2b"))
    check(names == ["a.txt", "b.txt"], "the listing", names)
    check(sbx.files.exists("/tmp/e2b/b.txt"), "exists", None)
    check(not sbx.files.exists("/tmp/e2b/none"), "a missing file does not", None)
    moved = sbx.files.rename("/tmp/e2b/b.txt", "/tmp/e2b/c.txt")
    check(moved.path == "/tmp/e2b/c.txt", "renamed", moved)
    check(sbx.files.make_dir("/tmp/e2b/d"), "a new directory", None)
    sbx.files.remove("/tmp/e2b/c.txt")
    names = sorted(entry.name for entry in sbx.files.list("/tmp/e2b"))
    check(names == ["a.txt", "d"], "after rename, mkdir and remove", names)
    # Bytes, whole: a binary megabyte.
    data = bytes(range(256)) * 4096
    sbx.files.write("/tmp/e2b/bin.dat", data)
    check(sbx.files.read("/tmp/e2b/bin.dat", format="bytes") == data, "binary round trip", None)
    # The image's tree is readable as a command reads it, and refuses what uid 1000 may not.
    passwd = sbx.commands.run("cat /etc/passwd").stdout
    check(sbx.files.read("/etc/passwd") == passwd, "/etc/passwd as a command reads it", None)
    try:
        sbx.files.write("/etc/passwd", "root::0:0::/:/bin/sh\n")
        raise AssertionError("uid 1000 wrote /etc/passwd")
    except AssertionError:
        raise
    except Exception as error:
        check("permission denied" in str(error) or "read-only" in str(error), "refused", str(error))
    check(sbx.commands.run("cat /etc/passwd").stdout == passwd, "unchanged", None)
    # A watch of /tmp (the watcher trio, polled): what a command does there and what the
    # SDK writes both show.
    sbx.files.make_dir("/tmp/e2b/w")
    handle = sbx.files.watch_dir("/tmp/e2b/w", recursive=True)
    sbx.commands.run("mkdir /tmp/e2b/w/sub && echo x > /tmp/e2b/w/sub/made.txt")
    sbx.files.write("/tmp/e2b/w/sdk.txt", "y")
    want = {("sub", FilesystemEventType.CREATE), ("sub/made.txt", FilesystemEventType.CREATE),
            ("sdk.txt", FilesystemEventType.WRITE)}
    seen = []
    deadline = time.monotonic() + 15
    while not want <= {(e.name, e.type) for e in seen} and time.monotonic() < deadline:
        seen.extend(handle.get_new_events())
        time.sleep(0.2)
    check(want <= {(e.name, e.type) for e in seen}, "watch_dir of /tmp",
          [(e.name, e.type.value) for e in seen])
    handle.stop()
finally:
    sbx.kill()
print("RUNTIME FILES PASSED", flush=True)
"#;

#[test]
fn the_e2b_sdk_writes_reads_lists_removes_and_watches_files_under_tmp() {
    let server = TestServer::start_e2b(bin(), &[], "");
    server.run_python_sdk(
        "the /tmp scenario",
        SCENARIO,
        "RUNTIME FILES PASSED",
        Duration::from_secs(180),
    );
}
