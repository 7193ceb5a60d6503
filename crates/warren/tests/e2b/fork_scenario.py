#!/usr/bin/env python3
"""`Sandbox.fork()` of the official `e2b` Python SDK (2.63.0) against warren's E2B API.

Run by crates/warren/tests/suite/e2b_fork.rs with the SDK's own environment
(`E2B_API_KEY`, `E2B_API_URL`, `E2B_SANDBOX_URL`), bob's key in `WARREN_E2B_BOB_KEY` and a
metadata value of this run in `WARREN_E2B_RUN`. A sandbox installs something outside its
home (what a runtime snapshot keeps) and writes a file in its home (the workdir), then
forks into three: each fork sees both, what one fork writes no other fork nor the source
sees, and the source still runs commands. A count beyond 20 and another uid's key are
refused. Prints `SCENARIO PASSED` when every check held; a failed check raises, with what
was asked and what came back.
"""

import os

import e2b.sandbox_sync.sandbox_api as sandbox_api
from e2b import (
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
)

RUN = os.environ["WARREN_E2B_RUN"]
BOB_KEY = os.environ["WARREN_E2B_BOB_KEY"]
HOME = "/home/user"

_made = []


def check(condition, what, *context):
    if not condition:
        detail = "".join(f"\n    {c!r}" for c in context)
        raise AssertionError(f"{what}{detail}")
    print("ok:", what, flush=True)


def check_eq(got, want, what):
    check(got == want, f"{what}: got {got!r}, want {want!r}")


def raises(kinds, what, call, *args, **kwargs):
    """Calls `call`, which must raise one of `kinds`; returns the exception."""
    try:
        result = call(*args, **kwargs)
    except kinds as error:
        print(f"ok: {what} ({type(error).__name__}: {error})", flush=True)
        return error
    except Exception as error:  # noqa: BLE001 - named in the failure
        raise AssertionError(f"{what}: raised {type(error).__name__}: {error}") from error
    for made in result if isinstance(result, list) else []:
        if isinstance(made, Sandbox):
            _made.append(made)
    raise AssertionError(f"{what}: no exception, returned {result!r}")


def absent(sandbox, path):
    """Whether `path` is absent in `sandbox`, to the file API and to a command alike."""
    by_files = not sandbox.files.exists(path)
    by_command = sandbox.commands.run(f"test -e {path} && echo present || echo absent").stdout
    return by_files and by_command == "absent\n"


def main():
    metadata = {"run": RUN, "scenario": "fork"}
    src = Sandbox.create(timeout=300, metadata=metadata)
    _made.append(src)

    # "Install a package": outside the home, where the sandbox user may write (commands
    # never run as root), as the snapshots scenario of scenarios.py does.
    installed = src.commands.run(
        "for d in /usr/local/share /usr/local /opt /var/tmp; do "
        "if mkdir -p $d/warren-fork-pkg 2>/dev/null && echo v1 > $d/warren-fork-pkg/VERSION; "
        "then echo $d/warren-fork-pkg/VERSION; break; fi; done"
    ).stdout.strip()
    check(installed.startswith("/") and not installed.startswith(HOME),
          f"a file installed outside the home ({installed})")
    src.files.write(f"{HOME}/work.txt", "work of the source\n")

    forks = src.fork(count=3, timeout=120)
    _made.extend(f for f in forks if isinstance(f, Sandbox))
    check_eq(len(forks), 3, "fork(count=3) answers three entries")
    for fork in forks:
        check(isinstance(fork, Sandbox), "every fork started", fork)
    ids = [fork.sandbox_id for fork in forks]
    check_eq(len(set(ids + [src.sandbox_id])), 4, f"the forks are new sandboxes ({ids})")

    source_info = src.get_info()
    for n, fork in enumerate(forks, 1):
        info = fork.get_info()
        check_eq(info.template_id, source_info.template_id, f"fork {n} has the source's template")
        check_eq(info.metadata, metadata, f"fork {n} has the source's metadata")
        lives = (info.end_at - info.started_at).total_seconds()
        check(90 <= lives <= 150, f"fork {n} lives the fork's timeout, 120 s ({lives} s)")
        check_eq(fork.commands.run(f"cat {installed}").stdout, "v1\n",
                 f"fork {n} sees what was installed outside the home")
        check_eq(fork.files.read(f"{HOME}/work.txt"), "work of the source\n",
                 f"fork {n} reads the source's work.txt")
        check_eq(fork.commands.run("cat ~/work.txt; id -un").stdout,
                 "work of the source\nuser\n", f"a command of fork {n} reads it, as user")

    forks[0].files.write(f"{HOME}/only-one.txt", "fork 1 only\n")
    check_eq(forks[0].commands.run(f"cat {HOME}/only-one.txt").stdout, "fork 1 only\n",
             "fork 1 reads what it wrote")
    for n, other in [(2, forks[1]), (3, forks[2])]:
        check(absent(other, f"{HOME}/only-one.txt"), f"fork 1's file is absent in fork {n}")
    check(absent(src, f"{HOME}/only-one.txt"), "fork 1's file is absent in the source")

    # The source runs on, its own work as it was, and writes no fork.
    check_eq(src.commands.run("cat ~/work.txt").stdout, "work of the source\n",
             "the source runs commands after the fork and reads its work.txt")
    src.files.write(f"{HOME}/after.txt", "after the fork\n")
    for n, fork in enumerate(forks, 1):
        check(absent(fork, f"{HOME}/after.txt"), f"the source's later file is absent in fork {n}")
    check(src.is_running(), "the source still runs")

    # Out of bounds: the SDK refuses 21 itself; sent anyway, warren answers a 4xx that the
    # SDK raises.
    raises(InvalidArgumentException, "the SDK refuses count=21 itself", src.fork, count=21)
    own_check = sandbox_api.validate_fork_count
    sandbox_api.validate_fork_count = lambda count: None
    try:
        error = raises(SandboxException, "warren refuses count=21", src.fork, count=21)
        status = getattr(error, "status_code", None)
        check(status is not None and 400 <= status < 500, f"a 4xx for count=21 ({status})")
        check("count" in str(error), f"the refusal names the count ({error})")
    finally:
        sandbox_api.validate_fork_count = own_check

    # Another uid's key finds no such sandbox; nor does anyone find one that never was.
    raises(SandboxNotFoundException, "bob forks alice's sandbox (404)", Sandbox.fork,
           src.sandbox_id, api_key=BOB_KEY)
    raises(SandboxNotFoundException, "a fork of a sandbox that does not exist (404)",
           Sandbox.fork, "a" * 20)

    for fork in forks:
        fork.kill()
    check_eq(src.commands.run("cat ~/work.txt").stdout, "work of the source\n",
             "the source runs on once its forks are killed")


try:
    main()
finally:
    for sandbox in _made:
        try:
            sandbox.kill()
        except Exception:  # noqa: BLE001 - best effort
            pass
print("SCENARIO PASSED", flush=True)
