# warren's code-interpreter driver: one per execution context, run inside the sandbox's
# runtime as the sandbox user by the processes primitive (issue 36).
#
# It reaches its kernel (ipykernel, started on the first execution) with jupyter_client,
# the Jupyter messaging protocol's own client, over IPC sockets in a private directory.
# Requests come on stdin, one JSON object per line; events go to stdout, one JSON object
# per line, each with the id of the request it answers:
#
#   {"op": "execute", "id": ..., "code": ..., "env": {...}, "cwd": null}
#       -> "started" once its kernel runs it, stdout / stderr / result / error events,
#          then one "end"
#   {"op": "interrupt", "id": ...}
#       -> SIGINT to the kernel, at once (a reader thread serves it), when it runs that
#          request (or anything, without an id); a request still waiting is dropped
#
# The driver itself is delivered as the first line of stdin (a JSON string), so the
# process's command line stays short.

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# The kernel this context runs: `python3` (ipykernel) or `bash` (bash_kernel).
KERNEL = os.environ.pop("WARREN_CODE_KERNEL", "python3")
# Longest text of one stream event: longer output arrives as several events.
STREAM_CHUNK = 64 * 1024
# How long a kernel has to answer its first request.
READY_TIMEOUT = 60

_out = sys.stdout
_out_lock = threading.Lock()


def emit(event):
    # Compact, and the request's "id" first: the server passes over another request's line
    # from its first bytes, without holding it.
    line = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    with _out_lock:
        _out.write(line + "\n")
        _out.flush()


def now_ns():
    return time.time_ns()


class Kernel:
    def __init__(self):
        self.manager = None
        self.client = None
        self.dir = None
        self.lock = threading.Lock()

    def alive(self):
        return self.manager is not None and self.manager.is_alive()

    def start(self):
        from jupyter_client import KernelManager

        self.stop()
        self.dir = tempfile.mkdtemp(prefix="warren-kernel-")
        manager = KernelManager(
            kernel_name=KERNEL,
            transport="ipc",
            ip=os.path.join(self.dir, "k"),
            connection_file=os.path.join(self.dir, "kernel.json"),
        )
        # The kernel's own stdout is not the driver's: what bypasses ipykernel's capture
        # must never land between the event lines. Its stderr (logs) is the driver's.
        manager.start_kernel(cwd=os.getcwd(), stdout=subprocess.DEVNULL)
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=READY_TIMEOUT)
        with self.lock:
            self.manager, self.client = manager, client

    def stop(self):
        with self.lock:
            manager, client = self.manager, self.client
            self.manager = self.client = None
        if client is not None:
            try:
                client.stop_channels()
            except Exception:
                pass
        if manager is not None:
            try:
                manager.shutdown_kernel(now=True)
            except Exception:
                pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def interrupt(self):
        with self.lock:
            manager = self.manager
        if manager is not None and manager.is_alive():
            try:
                manager.interrupt_kernel()
            except Exception:
                pass


kernel = Kernel()
requests = queue.Queue()
# The request the kernel runs now, and those cancelled before they ran.
state_lock = threading.Lock()
current = {"id": None, "interrupted": False}
cancelled = set()


def interrupt(rid):
    with state_lock:
        if rid is not None and rid != current["id"]:
            # Not running (yet): it never will, and its caller hears so now.
            if rid not in cancelled:
                cancelled.add(rid)
                emit({"id": rid, "t": "end", "status": "error", "count": None})
            return
        # Remembered for a kernel still starting, which no signal reaches yet.
        current["interrupted"] = True
    kernel.interrupt()


def interrupted_before_it_ran(rid):
    """Whether the request was interrupted while its kernel started; if so, says so."""
    with state_lock:
        if not current["interrupted"]:
            return False
    emit({"id": rid, "t": "error", "name": "KeyboardInterrupt",
          "value": "interrupted before it ran (its kernel was starting)", "traceback": []})
    emit({"id": rid, "t": "end", "status": "error", "count": None})
    return True


def read_requests():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
        except ValueError:
            emit({"t": "bad_request", "message": "not JSON"})
            continue
        if request.get("op") == "interrupt":
            interrupt(request.get("id"))
        else:
            requests.put(request)
    requests.put(None)


def run_silently(code):
    """Runs code the user does not see (no count, no history); the error it raised, if any."""
    client = kernel.client
    msg_id = client.execute(code, silent=True, store_history=False, stop_on_error=False)
    failure = None
    while True:
        message = client.get_iopub_msg(timeout=READY_TIMEOUT)
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "error":
            failure = message["content"]
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return failure


def shell_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def bash_settings_code(env, cwd):
    """The same for bash: exported variables and the directory, put back after."""
    doing, undoing = [], []
    for index, (name, value) in enumerate(env.items()):
        saved = "_warren_env_%d" % index
        doing.append('%s_set="${%s+1}"; %s="${%s-}"; export %s=%s'
                     % (saved, name, saved, name, name, shell_quote(value)))
        undoing.append('if [ -n "$%s_set" ]; then export %s="$%s"; else unset %s; fi; unset %s %s_set'
                       % (saved, name, saved, name, saved, saved))
    if cwd:
        doing.append('_warren_cwd="$PWD"; cd -- %s' % shell_quote(cwd))
        undoing.append('cd -- "$_warren_cwd"; unset _warren_cwd')
    return "\n".join(doing), "\n".join(undoing)


def settings_code(env, cwd):
    """Code that sets env vars and the working directory, and code that undoes it."""
    if not env and not cwd:
        return None, None
    if KERNEL == "bash":
        return bash_settings_code(env, cwd)
    doing = ["import os as _warren_os"]
    undoing = ["import os as _warren_os"]
    if env:
        doing.append("_warren_saved_env = {k: _warren_os.environ.get(k) for k in %r}" % list(env))
        doing.append("_warren_os.environ.update(%r)" % dict(env))
        undoing.append(
            "for _k, _v in _warren_saved_env.items():\n"
            "    _warren_os.environ.pop(_k, None) if _v is None else _warren_os.environ.__setitem__(_k, _v)"
        )
    if cwd:
        doing.append("_warren_saved_cwd = _warren_os.getcwd()")
        doing.append("_warren_os.chdir(%r)" % cwd)
        undoing.append("_warren_os.chdir(_warren_saved_cwd)")
    return "\n".join(doing), "\n".join(undoing)


def stream_events(rid, name, text):
    for start in range(0, len(text), STREAM_CHUNK) or [0]:
        emit({"id": rid, "t": name, "text": text[start : start + STREAM_CHUNK], "ts": now_ns()})


def execute(request):
    rid = request.get("id")
    restarted = False
    if not kernel.alive():
        restarted = kernel.manager is not None
        try:
            kernel.start()
        except Exception as error:
            emit({"id": rid, "t": "error", "name": "KernelNotStarted", "value": str(error), "traceback": []})
            emit({"id": rid, "t": "end", "status": "error", "count": None})
            kernel.stop()
            return
    if restarted:
        emit({"id": rid, "t": "restarted"})
    if interrupted_before_it_ran(rid):
        return
    client = kernel.client
    setup, undo = settings_code(request.get("env") or {}, request.get("cwd"))
    if setup:
        failure = run_silently(setup)
        if failure is not None:
            if undo:
                run_silently(undo)
            emit({"id": rid, "t": "error", "name": failure.get("ename", ""),
                  "value": "the execution's environment or working directory could not be set: %s"
                  % failure.get("evalue", ""), "traceback": []})
            emit({"id": rid, "t": "end", "status": "error", "count": None})
            return
    emit({"id": rid, "t": "started"})
    # Each request is a cell of its own: no queued request may be aborted by an error.
    msg_id = client.execute(request.get("code", ""), store_history=True, allow_stdin=False, stop_on_error=False)
    count = None
    status = "ok"
    errored = False
    # An interrupt that came after the check above, while the cell was on its way, found
    # no cell to stop (an idle kernel ignores SIGINT): sent again once the cell runs.
    # That signal can still land before the cell's code runs, in the kernel's own handler,
    # which swallows it: until the cell says it stopped, it is sent again each second.
    late_interrupt_sent = False
    late_interrupt_at = 0.0
    while True:
        try:
            message = client.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            if not kernel.alive():
                emit({
                    "id": rid, "t": "error", "name": "KernelDied",
                    "value": "the kernel died; its state is lost and a new kernel starts on the next execution",
                    "traceback": [],
                })
                emit({"id": rid, "t": "end", "status": "error", "count": count})
                return
            if late_interrupt_sent and not errored and time.monotonic() - late_interrupt_at >= 1.0:
                late_interrupt_at = time.monotonic()
                kernel.interrupt()
            continue
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = message["msg_type"]
        content = message["content"]
        if kind == "stream":
            stream_events(rid, "stderr" if content.get("name") == "stderr" else "stdout", content.get("text", ""))
        elif kind in ("execute_result", "display_data", "update_display_data"):
            emit({
                "id": rid, "t": "result", "main": kind == "execute_result",
                "data": content.get("data", {}), "metadata": content.get("metadata", {}),
                "count": content.get("execution_count"),
            })
        elif kind == "error":
            status = "error"
            errored = True
            emit({
                "id": rid, "t": "error", "name": content.get("ename") or "Error",
                "value": content.get("evalue", ""), "traceback": content.get("traceback", []),
            })
        elif kind == "execute_input":
            count = content.get("execution_count", count)
            with state_lock:
                late = current["interrupted"]
            if late and not late_interrupt_sent:
                late_interrupt_sent = True
                late_interrupt_at = time.monotonic()
                kernel.interrupt()
        elif kind == "status" and content.get("execution_state") == "idle":
            break
    reply_content = {}
    try:
        reply = client.get_shell_msg(timeout=5)
        while reply.get("parent_header", {}).get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=5)
        reply_content = reply["content"]
        count = reply_content.get("execution_count", count)
        status = reply_content.get("status", status)
    except queue.Empty:
        pass
    if status == "error" and not errored:
        # The cell failed but its error was never published: a second interrupt landed
        # while IPython was showing the first one's traceback (it then only prints
        # "KeyboardInterrupt" to stderr). The reply still names the error.
        emit({
            "id": rid, "t": "error", "name": reply_content.get("ename") or "Error",
            "value": reply_content.get("evalue", ""), "traceback": reply_content.get("traceback", []),
        })
    if status == "abort" and not errored:
        # A kernel that stopped on an interrupt without saying so (bash_kernel).
        emit({"id": rid, "t": "error", "name": "KeyboardInterrupt", "value": "interrupted", "traceback": []})
    if undo:
        run_silently(undo)
    emit({"id": rid, "t": "end", "status": status, "count": count})


def main():
    try:
        import jupyter_client  # noqa: F401
        import ipykernel  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError as error:
        emit({"t": "unavailable", "message": "%s: the image needs jupyter_client and ipykernel" % error})
        return
    if KERNEL != "python3":
        try:
            KernelSpecManager().get_kernel_spec(KERNEL)
        except NoSuchKernel:
            emit({"t": "unavailable", "message": "the image has no Jupyter kernel %r (for bash: "
                  "pip install bash_kernel && python3 -m bash_kernel.install)" % KERNEL})
            return
    threading.Thread(target=read_requests, daemon=True).start()
    emit({"t": "ready"})
    try:
        while True:
            request = requests.get()
            if request is None:
                break
            if request.get("op") == "execute":
                rid = request.get("id")
                with state_lock:
                    if rid in cancelled:
                        cancelled.discard(rid)
                        continue
                    current["id"] = rid
                    current["interrupted"] = False
                try:
                    execute(request)
                except Exception as error:
                    emit({"id": request.get("id"), "t": "error", "name": type(error).__name__, "value": str(error), "traceback": []})
                    emit({"id": request.get("id"), "t": "end", "status": "error", "count": None})
                finally:
                    with state_lock:
                        current["id"] = None
            else:
                emit({"id": request.get("id"), "t": "bad_request", "message": "unknown op"})
    finally:
        kernel.stop()


main()
