#!/usr/bin/env python3
"""warren's E2B code interpreter (issue 36), driven by the official `e2b-code-interpreter`
Python SDK (`from e2b_code_interpreter import Sandbox`), unchanged.

Run by crates/warren/tests/suite/e2b_code.rs:

    python scenarios.py

with the SDK's own environment (`E2B_API_KEY`, `E2B_API_URL`, `E2B_SANDBOX_URL`), as
crates/warren/tests/e2b/scenarios.py takes it. The sandbox comes from the SDK's default
template (`code-interpreter-v1`, which warren maps to its default runtime). Every check
asserts what came back exactly, prints one line when it held, and the first that does not
hold ends the run non-zero with what was asked and what came back. The sandbox is killed at
the end, whatever happened.
"""

import base64
import faulthandler
import os
import sys
import time
import traceback
import uuid
from importlib.metadata import version

from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

SDK = f"e2b-code-interpreter {version('e2b-code-interpreter')}, e2b {version('e2b')}"
API_URL = os.environ["E2B_API_URL"].rstrip("/")
# The SDK reads these itself; a missing one fails here, named.
os.environ["E2B_SANDBOX_URL"]
os.environ["E2B_API_KEY"]
# Every sandbox of this run carries it as metadata `run`.
RUN = os.environ.get("WARREN_E2B_RUN") or f"code-interpreter-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------------------------------
# Helpers


def check(condition, what, *context):
    if not condition:
        detail = "".join(f"\n    {c!r}" for c in context)
        raise AssertionError(f"[{SDK}] {what}{detail}")


def check_eq(got, want, what):
    check(got == want, f"{what}: got {got!r}, want {want!r}")


def raises(kinds, what, call, *args, **kwargs):
    """Calls `call`, which must raise one of `kinds`; returns the exception."""
    try:
        result = call(*args, **kwargs)
    except AssertionError:
        raise
    except kinds as error:
        return error
    except Exception as error:  # noqa: BLE001 - named in the failure
        names = [k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,))]
        raise AssertionError(
            f"[{SDK}] {what}: raised {type(error).__name__}: {error}, want one of {names}"
        ) from error
    raise AssertionError(f"[{SDK}] {what}: no exception, returned {result!r}")


def ran(execution, what):
    """`execution` ended without an error; returns it."""
    check(execution.error is None, f"{what}: the code raised", execution.error and (
        execution.error.name, execution.error.value, execution.error.traceback), execution)
    return execution


def text_of(sandbox, code, what, **kwargs):
    """The main result's text of running `code`, which must not raise."""
    return ran(sandbox.run_code(code, **kwargs), what).text


def passed(name):
    print(f"ok: {name}", flush=True)


# ---------------------------------------------------------------------------------------
# The checks, in order, on one sandbox.


def state_is_kept(sandbox):
    execution = ran(sandbox.run_code("x = 1"), "x = 1")
    check_eq(execution.results, [], "the results of an assignment")
    check_eq(text_of(sandbox, "x+1", "x+1"), "2", "x+1 after x = 1")
    passed("state is kept across run_code calls")


STREAMING = """\
import sys
from IPython.display import display
print('a', flush=True)
print('b', file=sys.stderr, flush=True)
print('c', flush=True)
display(42)
print('d', flush=True)
'e'
"""


def callbacks_stream_in_order(sandbox):
    seen = []
    errors = []
    execution = sandbox.run_code(
        STREAMING,
        on_stdout=lambda m: seen.append(("stdout", m.line, m.error)),
        on_stderr=lambda m: seen.append(("stderr", m.line, m.error)),
        on_result=lambda r: seen.append(("result", r.text, r.is_main_result)),
        on_error=errors.append,
    )
    ran(execution, "the streaming cell")
    check_eq(errors, [], "on_error's calls")
    check_eq(seen, [
        ("stdout", "a\n", False),
        ("stderr", "b\n", True),
        ("stdout", "c\n", False),
        ("result", "42", False),
        ("stdout", "d\n", False),
        ("result", "'e'", True),
    ], "the callbacks, in order")
    # The execution holds the same, by kind.
    check_eq(execution.logs.stdout, ["a\n", "c\n", "d\n"], "execution.logs.stdout")
    check_eq(execution.logs.stderr, ["b\n"], "execution.logs.stderr")
    check_eq([(r.text, r.is_main_result) for r in execution.results],
             [("42", False), ("'e'", True)], "execution.results (text, is_main_result)")
    check_eq(execution.text, "'e'", "execution.text")
    passed("on_stdout, on_stderr and on_result stream in the order the code produced them")


def a_figure_is_a_png(sandbox):
    execution = ran(sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()"
    ), "a matplotlib figure")
    check_eq(len(execution.results), 1, f"the figure's results ({execution.results!r})")
    figure = execution.results[0]
    check_eq(figure.is_main_result, False, "a shown figure's is_main_result")
    check(isinstance(figure.png, str), "the figure has a png (base64 text)", figure.formats())
    # Base64 as Jupyter sends it: line breaks allowed, nothing else outside the alphabet.
    png = base64.b64decode("".join(figure.png.split()), validate=True)
    check_eq(png[:8], b"\x89PNG\r\n\x1a\n", "the png's signature")
    check(len(png) > 1000, "the png holds a picture", len(png))
    check_eq(execution.text, None, "the main result of a cell ending in plt.show()")
    passed(f"a matplotlib figure arrives as a Result with a PNG ({len(png)} bytes)")


def an_exception_is_an_error(sandbox):
    errors = []
    execution = sandbox.run_code("1/0", on_error=errors.append)
    error = execution.error
    check(error is not None, "1/0 ends in an error", execution)
    check_eq(error.name, "ZeroDivisionError", "the error's name")
    check("division by zero" in error.value, "the error's value says division by zero",
          error.value)
    check(isinstance(error.traceback, str) and "ZeroDivisionError" in error.traceback,
          "the traceback names ZeroDivisionError", error.traceback)
    check_eq(len(errors), 1, "on_error's calls")
    check(errors[0] is error, "on_error got the execution's error", errors[0], error)
    check_eq(execution.results, [], "the results of 1/0")
    # The kernel lives on.
    check_eq(text_of(sandbox, "x", "x after 1/0"), "1", "x after the error")
    passed("an exception arrives as the execution's error, once to on_error")


def contexts(sandbox):
    ctx = sandbox.create_code_context(cwd="/tmp")
    check(isinstance(ctx.id, str) and len(ctx.id) > 0, "the context has an id", ctx.id)
    check_eq(ctx.language, "python", "the new context's language")
    check_eq(ctx.cwd, "/tmp", "the new context's cwd")
    check_eq(text_of(sandbox, "import os; os.getcwd()", "getcwd in the context", context=ctx),
             "'/tmp'", "the context's working directory")

    # State is the context's own.
    ran(sandbox.run_code("only_here = 'ctx'", context=ctx), "a variable in the context")
    ran(sandbox.run_code("only_default = 'default'"), "a variable in the default context")
    check_eq(text_of(sandbox, "only_here", "the variable, in its context", context=ctx),
             "'ctx'", "the context's own variable")
    check_eq(text_of(sandbox, "'only_here' in globals()", "the context's variable, by default"),
             "False", "the context's variable seen from the default context")
    check_eq(text_of(sandbox, "'only_default' in globals()", "the default's variable, in ctx",
                     context=ctx),
             "False", "the default context's variable seen from the new one")
    check_eq(text_of(sandbox, "x", "x, by default"), "1", "the default context's x")

    listed = sandbox.list_code_contexts()
    ids = [c.id for c in listed]
    check(ctx.id in ids, "list_code_contexts has the new context", ctx.id, ids)
    mine = [c for c in listed if c.id == ctx.id][0]
    check_eq((mine.language, mine.cwd), ("python", "/tmp"), "the listed context")

    sandbox.restart_code_context(ctx)
    execution = sandbox.run_code("only_here", context=ctx)
    check(execution.error is not None, "the variable is gone after a restart", execution)
    check_eq(execution.error.name, "NameError", "reading the variable after a restart")
    check_eq(text_of(sandbox, "import os; os.getcwd()", "getcwd after the restart", context=ctx),
             "'/tmp'", "the context's working directory after a restart")
    check_eq(text_of(sandbox, "only_default", "the default's variable after ctx restarted"),
             "'default'", "the default context after the other restarted")

    sandbox.remove_code_context(ctx)
    ids = [c.id for c in sandbox.list_code_contexts()]
    check(ctx.id not in ids, "a removed context is not listed", ctx.id, ids)
    raises(NotFoundException, "run_code in a removed context", sandbox.run_code, "1", context=ctx)
    passed("contexts: created with a cwd, isolated, listed, restarted and removed")


def a_timeout_interrupts(sandbox):
    ran(sandbox.run_code("before_timeout = 'kept'"), "a variable before the timeout")
    started = time.monotonic()
    error = raises(TimeoutException, "a cell that runs past its timeout", sandbox.run_code,
                   "import time\nwhile True: time.sleep(0.1)", timeout=2)
    waited = time.monotonic() - started
    check(1.5 <= waited < 10, "the timeout came after about 2 s", waited, str(error))
    started = time.monotonic()
    check_eq(text_of(sandbox, "1+1", "1+1 after the timeout", timeout=30), "2",
             "1+1 after the timeout")
    after = time.monotonic() - started
    check(after < 5, "the kernel answers within a few seconds of the timeout", after)
    check_eq(text_of(sandbox, "before_timeout", "the variable after the timeout"), "'kept'",
             "a variable set before the timeout (interrupted, not restarted)")
    passed(f"a timeout interrupts the kernel, which keeps its state (next answer in {after:.2f} s)")


def envs_are_per_call(sandbox):
    code = "import os; os.environ.get('FOO', 'unset')"
    check_eq(text_of(sandbox, code, "FOO with envs", envs={"FOO": "bar"}), "'bar'",
             "FOO in a call with envs={'FOO': 'bar'}")
    check_eq(text_of(sandbox, code, "FOO without envs"), "'unset'",
             "FOO in the next call, without envs")
    passed("envs are the call's own and do not leak into the next")


def execution_count_and_main_results(sandbox):
    first = ran(sandbox.run_code("n = 1"), "n = 1")
    second = ran(sandbox.run_code("n += 1"), "n += 1")
    check(isinstance(first.execution_count, int), "an execution count", first.execution_count)
    check_eq(second.execution_count, first.execution_count + 1,
             "the next call's execution count")
    execution = ran(sandbox.run_code(
        "from IPython.display import display\ndisplay('shown')\ndisplay(7)\nn * 10"
    ), "two displays and a value")
    check_eq(execution.execution_count, second.execution_count + 1,
             "the third call's execution count")
    check_eq([(r.text, r.is_main_result) for r in execution.results],
             [("'shown'", False), ("7", False), ("20", True)],
             "the results (text, is_main_result)")
    check_eq(execution.text, "20", "execution.text")
    passed("execution_count counts up; displays are not the main result, the last value is")


def languages(sandbox):
    check_eq(text_of(sandbox, "x * 3", "language='python'", language="python"), "3",
             "x * 3 with language='python' (the default context)")
    error = raises(SandboxException, "language='cobol'", sandbox.run_code, "DISPLAY 'HI'",
                   language="cobol")
    check("cobol" in str(error), "the error names the language", f"{type(error).__name__}: {error}")
    passed(f"language='python' runs; language='cobol' is refused ({type(error).__name__}: {error})")


CHECKS = [
    state_is_kept,
    callbacks_stream_in_order,
    a_figure_is_a_png,
    an_exception_is_an_error,
    contexts,
    a_timeout_interrupts,
    envs_are_per_call,
    execution_count_and_main_results,
    languages,
]


def main():
    # A hung call shows where it hangs, instead of the test's own timeout saying nothing.
    faulthandler.dump_traceback_later(int(os.environ.get("WARREN_E2B_HANG_S", "150")), exit=True)
    print(f"code interpreter scenarios with {SDK} against {API_URL}", flush=True)
    sandbox = None
    try:
        sandbox = Sandbox.create(metadata={"run": RUN, "scenario": "code-interpreter"}, timeout=300)
        check_eq(Sandbox.default_template, "code-interpreter-v1", "the SDK's default template")
        for run_check in CHECKS:
            run_check(sandbox)
    except BaseException:
        traceback.print_exc()
        print("SCENARIO FAILED: code interpreter", flush=True)
        sys.exit(1)
    finally:
        if sandbox is not None:
            try:
                sandbox.kill()
            except Exception:  # noqa: BLE001 - best effort
                traceback.print_exc()
    print("SCENARIO PASSED: code interpreter", flush=True)


if __name__ == "__main__":
    main()
