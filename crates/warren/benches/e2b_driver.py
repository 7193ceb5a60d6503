"""The Python SDK side of `cargo bench -p warren --bench e2b` (issue 17).

Run by crates/warren/benches/e2b.rs with the interpreter of a venv holding the official
`e2b` SDK, and E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointed at a warren server.
The bench interleaves its ways of doing the same work, so it steps this driver: for each
line read on stdin, one iteration, timed with time.perf_counter(): `Sandbox.create()`,
then the first `sbx.commands.run("true")` (the SDK sends `/bin/bash -l -c true`). The
sandbox is killed after its timing, outside the timed part, and the iteration answers one
JSON line on stdout: {"create_ms": .., "run_ms": .., "total_ms": ..}. The first line
out, before any step, is {"sdk": <e2b version>, "python": <version>}. It exits at EOF.
"""

import json
import sys
import time
from importlib.metadata import version

from e2b import Sandbox


def step() -> dict:
    started = time.perf_counter()
    sbx = Sandbox.create()
    created = time.perf_counter()
    try:
        result = sbx.commands.run("true")
        ran = time.perf_counter()
        if result.exit_code != 0:
            raise SystemExit(f"commands.run('true') exited {result.exit_code}: {result!r}")
    finally:
        sbx.kill()
    return {
        "create_ms": (created - started) * 1000.0,
        "run_ms": (ran - created) * 1000.0,
        "total_ms": (ran - started) * 1000.0,
    }


def main() -> int:
    print(json.dumps({"sdk": version("e2b"), "python": sys.version.split()[0]}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(step()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
